/* A user's program run once over a batch of lines: its input written and its output read together (poll), so that
 * neither side waits on a full pipe. */
#include "cmd_exchange.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { QUIET_MS = 60000 };

/* Writes in[0..n) to fd_in and reads fd_out to its end, whichever is ready; a minute of silence is an error. */
static dt_status exchange(const char *flag, const char *command, int fd_in, int fd_out, const char *in, size_t n, char **got,
                          size_t *got_len) {
    size_t sent = 0, len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory", flag);
    while (fd_out >= 0) {
        struct pollfd p[2] = { { fd_out, POLLIN, 0 }, { sent < n ? fd_in : -1, POLLOUT, 0 } };
        int k = poll(p, 2, QUIET_MS);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { free(buf); return dt_error(DT_ERR_IO, "%s cmd:%s: nothing from it for %d s", flag, command, QUIET_MS / 1000); }
        if (p[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = write(fd_in, in + sent, n - sent);
            if (w < 0 && errno != EINTR && errno != EAGAIN) sent = n; /* it stopped reading: its answers say the rest */
            else if (w > 0) sent += (size_t)w;
            if (sent == n) close(fd_in), fd_in = -1;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (len + 2048 > cap) {
                char *b = realloc(buf, cap *= 2);
                if (!b) { free(buf); return dt_error(DT_ERR_NOMEM, "%s: out of memory", flag); }
                buf = b;
            }
            ssize_t rd = read(fd_out, buf + len, cap - len - 1);
            if (rd > 0) len += (size_t)rd;
            else if (rd == 0 || errno != EINTR) fd_out = -1; /* its end */
        }
    }
    if (fd_in >= 0) close(fd_in);
    buf[len] = 0;
    *got = buf, *got_len = len;
    return DT_OK;
}

dt_status dt_cmd_spawn(const char *flag, const char *kind, const char *command, pid_t *pid, int *in, int *out) {
    int to[2] = { -1, -1 }, from[2] = { -1, -1 };
    *pid = -1, *in = *out = -1;
    if (pipe(to) || pipe(from)) {
        for (int i = 0; i < 2; i++) { if (to[i] >= 0) close(to[i]); if (from[i] >= 0) close(from[i]); }
        return dt_error(DT_ERR_IO, "%s %s:%s: %s", flag, kind, command, strerror(errno));
    }
    pid_t p = fork();
    if (p == 0) {
        dup2(to[0], 0), dup2(from[1], 1);
        close(to[0]), close(to[1]), close(from[0]), close(from[1]);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    close(to[0]), close(from[1]);
    if (p < 0) {
        close(to[1]), close(from[0]);
        return dt_error(DT_ERR_IO, "%s %s:%s: fork: %s", flag, kind, command, strerror(errno));
    }
    *pid = p, *in = to[1], *out = from[0];
    return DT_OK;
}

dt_status dt_cmd_exchange(const char *flag, const char *command, const char *in, size_t n, char **out, size_t *len) {
    pid_t pid;
    int fd_in, fd_out;
    *out = NULL, *len = 0;
    dt_status st = dt_cmd_spawn(flag, "cmd", command, &pid, &fd_in, &fd_out);
    if (st) return st;
    void (*was)(int) = signal(SIGPIPE, SIG_IGN); /* a program that stops reading is its answers' to explain */
    st = exchange(flag, command, fd_in, fd_out, in, n, out, len);
    close(fd_out);
    int status = 0;
    if (st) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    signal(SIGPIPE, was);
    if (!st && (!WIFEXITED(status) || WEXITSTATUS(status)))
        st = WIFEXITED(status) ? dt_error(DT_ERR_IO, "%s cmd:%s: exited with status %d%s", flag, command, WEXITSTATUS(status),
                                          WEXITSTATUS(status) == 127 ? " (not found?)" : "")
                               : dt_error(DT_ERR_IO, "%s cmd:%s: killed by signal %d", flag, command, WTERMSIG(status));
    if (st) free(*out), *out = NULL, *len = 0;
    return st;
}
