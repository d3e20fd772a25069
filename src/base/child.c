/* Child processes that dtrain starts and watches (a bridge's workers, IMPALA's actors): starting one, and how one
 * ended, in words, for the messages that name it (a rank too). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dtrain/base.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

dt_status dt_child_start(const char *exe, char *const argv[], int fd3, int fd4, int *pid) {
    pid_t p = fork();
    if (p == 0) { /* only async-signal-safe calls until exec: the parent may have threads */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGINT, SIG_IGN); /* Ctrl-C is the parent's to handle; the child ends when its socket does */
        int a = fcntl(fd3, F_DUPFD, 10), b = fcntl(fd4, F_DUPFD, 10);
        if (a < 0 || b < 0 || dup2(a, 3) != 3 || dup2(b, 4) != 4 || dup2(2, 1) != 1) _exit(127);
        close_range(5, ~0U, 0);
        execv(exe, argv);
        _exit(127);
    }
    if (p < 0) return dt_error(DT_ERR_SYS, "fork: %s", strerror(errno));
    *pid = (int)p;
    return DT_OK;
}

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
