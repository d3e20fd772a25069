/* How a child process ended, in words, for the messages that name it (a rank, a bridge worker). */
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

void dt_exit_describe(int status, char *buf, size_t cap) {
    if (WIFSIGNALED(status)) snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
}
