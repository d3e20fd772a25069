/* A user's program kept running over a run: started once, each round its lines written while its answer's lines are
 * read (poll), so that a program that keeps state (a rollout's environment) keeps it in its own memory. */
#include "cmd_proc.h"
#include "cmd_exchange.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { QUIET_MS = 60000 };

struct dt_cmd_proc {
    const char *flag, *command;
    pid_t pid;
    int in, out; /* its standard input and output, ours to write and read; -1: closed */
};

dt_status dt_cmd_proc_create(const char *flag, const char *command, dt_cmd_proc **out) {
    dt_cmd_proc *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p) return dt_error(DT_ERR_NOMEM, "%s: out of memory", flag);
    *p = (dt_cmd_proc){ flag, command, -1, -1, -1 };
    dt_status st = dt_cmd_spawn(flag, "proc", command, &p->pid, &p->in, &p->out);
    if (st) free(p);
    else *out = p;
    return st;
}

/* The program has ended (or is made to): its status in words, into why. */
static void ended(dt_cmd_proc *p, char *why, size_t n) {
    int status = 0;
    if (p->in >= 0) close(p->in), p->in = -1;
    if (p->out >= 0) close(p->out), p->out = -1;
    if (p->pid <= 0) { snprintf(why, n, "stopped earlier"); return; }
    kill(p->pid, SIGKILL); /* (one that closed its output but runs on) */
    waitpid(p->pid, &status, 0);
    p->pid = -1;
    if (WIFEXITED(status)) snprintf(why, n, "exited with status %d", WEXITSTATUS(status));
    else snprintf(why, n, "killed by signal %d", WTERMSIG(status));
}

/* Fails the round (and the program with it): what happened after `got` of `lines` lines. */
static dt_status fail(dt_cmd_proc *p, const char *what, int got, int lines) {
    char why[64];
    ended(p, why, sizeof why);
    return dt_error(DT_ERR_IO, "%s proc:%s: %s after %d of %d result lines (%s)", p->flag, p->command, what, got, lines, why);
}

dt_status dt_cmd_proc_lines(dt_cmd_proc *p, const char *in, size_t n, int lines, char **out, size_t *len) {
    size_t sent = 0, got = 0, cap = 4096;
    int seen = 0;
    char *buf = malloc(cap);
    dt_status st = buf ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", p->flag);
    *out = NULL, *len = 0;
    if (!st && p->out < 0) st = fail(p, "not running", 0, lines);
    void (*was)(int) = signal(SIGPIPE, SIG_IGN); /* a program that stopped reading is found ending */
    while (!st && seen < lines) {
        struct pollfd f[2] = { { p->out, POLLIN, 0 }, { sent < n ? p->in : -1, POLLOUT, 0 } };
        int k = poll(f, 2, QUIET_MS);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { st = fail(p, "nothing from it for 60 s (does it write a line a call and flush it?)", seen, lines); break; }
        if (f[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = write(p->in, in + sent, n - sent);
            if (w > 0) sent += (size_t)w;
            else if (w < 0 && errno != EINTR && errno != EAGAIN) { st = fail(p, "it stopped reading", seen, lines); break; }
        }
        if (!(f[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (got + 2048 > cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) { st = dt_error(DT_ERR_NOMEM, "%s: out of memory", p->flag); break; }
            buf = b;
        }
        ssize_t rd = read(p->out, buf + got, cap - got - 1);
        if (rd < 0 && errno == EINTR) continue;
        if (rd <= 0) { st = fail(p, "it ended", seen, lines); break; }
        for (ssize_t i = 0; i < rd; i++) seen += buf[got + (size_t)i] == '\n';
        got += (size_t)rd;
        if (seen > lines || (seen == lines && buf[got - 1] != '\n')) st = fail(p, "more lines than calls", lines, lines);
    }
    signal(SIGPIPE, was);
    if (!st && sent < n) st = fail(p, "it answered before reading every call", lines, lines); /* (the rest would be the next round's) */
    if (st) { free(buf); return st; }
    buf[got] = 0;
    *out = buf, *len = got;
    return DT_OK;
}

void dt_cmd_proc_destroy(dt_cmd_proc *p) {
    if (!p) return;
    if (p->in >= 0) close(p->in), p->in = -1; /* its end of input: a program reading lines ends */
    for (int i = 0; p->pid > 0 && i < 40; i++) { /* up to 2 s */
        int status;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) { p->pid = -1; break; }
        struct timespec t = { 0, 50000000 };
        nanosleep(&t, NULL);
    }
    char why[64];
    if (p->pid > 0 || p->out >= 0) ended(p, why, sizeof why);
    free(p);
}
