/* How a child process ended, in words, for the messages that name it (a rank, a bridge worker). */
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

void dt_exit_describe(int status, char *buf, size_t cap) {
    if (WIFSIGNALED(status)) snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
}

int dt_child_reap(int pid, double wait_s, char *buf, size_t cap) {
    int status = 0;
    pid_t got = 0;
    for (int i = 0; (got = waitpid((pid_t)pid, &status, WNOHANG)) == 0 && i < (int)(wait_s * 100); i++)
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    if (got == (pid_t)pid) dt_exit_describe(status, buf, cap);
    else snprintf(buf, cap, "closed its end");
    return got == (pid_t)pid;
}
