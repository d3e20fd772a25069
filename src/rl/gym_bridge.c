/* The bridge to Gymnasium: W Python workers (gym_worker.py), each holding a
 * share of the n environments, as Sample Factory and EnvPool feed learners.
 * A worker's actions, observations, rewards and flags lie in memory both
 * processes map (a memfd); a round is one byte each way on a socket pair,
 * all workers at once. A worker that dies closes its socket, which is how
 * its death is seen at once (its exit named), not by a timeout. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "gym_bridge.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef DT_GYM_WORKER_PY
#error "DT_GYM_WORKER_PY (the path of src/rl/gym_worker.py) is set by the build"
#endif

#define HELLO_MS 120000 /* importing gymnasium and making the environments: generous, a cold disk is slow */

typedef struct {
    pid_t pid;
    int fd;                  /* the socket to the worker */
    int first, k;            /* its environments: first .. first + k - 1 of the bridge's */
    void *mem;
    size_t bytes;
    int8_t *cmd;             /* the layout gym_worker.py reads: each array 8-byte aligned, in this order */
    int64_t *seed;
    float *act, *obs;
    double *rew;
    uint8_t *term, *trunc;
} worker;

struct dt_gym_bridge {
    char id[256];
    dt_env_info info;
    float *low, *high;
    int n, nw;
    worker *w;
};

/* The layout of k environments' arrays from base (NULL: only the size); its bytes. */
static size_t layout(worker *w, char *base, int k, int od, int ad) {
    size_t at = 0, sizes[7] = { (size_t)k, 8 * (size_t)k, 4 * (size_t)k * ad, 4 * (size_t)k * od, 8 * (size_t)k, (size_t)k, (size_t)k };
    void **to[7] = { (void **)&w->cmd, (void **)&w->seed, (void **)&w->act, (void **)&w->obs, (void **)&w->rew, (void **)&w->term,
                     (void **)&w->trunc };
    for (int i = 0; i < 7; i++) {
        at = (at + 7) / 8 * 8;
        if (base) *to[i] = base + at;
        at += sizes[i];
    }
    return at;
}

static dt_status gone(dt_gym_bridge *b, worker *w) {
    char how[96];
    pid_t pid = w->pid;
    if (dt_child_reap(pid, 1.0, how, sizeof how)) w->pid = 0; /* reaped: nothing for destroy to wait for */
    return dt_error(DT_ERR_PEER, "gym:%s: bridge worker %d (pid %d, environments %d-%d) %s", b->id, (int)(w - b->w), (int)pid, w->first,
                    w->first + w->k - 1, how);
}

/* One line from the worker (without its newline), waiting up to ms. 1: a line; 0: the worker is gone; -1: timed out. */
static int read_line(int fd, char *buf, size_t cap, int ms) {
    size_t n = 0;
    for (;;) {
        struct pollfd p = { fd, POLLIN, 0 };
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return -1;
        char c;
        ssize_t got = read(fd, &c, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        if (c == '\n') { buf[n] = 0; return 1; }
        if (n + 1 < cap) buf[n++] = c;
    }
}

/* The interpreter's path: python itself when it names a file, else the first match on PATH (found before fork:
 * execvp's search is not async-signal-safe); python as given when none matches (exec then fails, and is said). */
static void find_python(const char *python, char *out, size_t cap) {
    snprintf(out, cap, "%s", python);
    const char *path = getenv("PATH");
    if (strchr(python, '/') || !path) return;
    for (const char *d = path; *d;) {
        size_t n = strcspn(d, ":");
        char cand[4096];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? d : ".", python);
        if (!access(cand, X_OK)) { snprintf(out, cap, "%s", cand); return; }
        d += n + (d[n] == ':');
    }
}

/* Worker w's hello (line): its spaces; the first worker's set the bridge's, every other's must agree. Then its
 * action bounds, low and high. */
static dt_status hello(dt_gym_bridge *b, worker *w, const char *python, char *line, size_t cap) {
    int r = read_line(w->fd, line, cap, HELLO_MS);
    dt_status st = DT_OK;
    if (r < 0) st = dt_error(DT_ERR_SYS, "gym:%s: bridge worker %d said nothing in %d s", b->id, (int)(w - b->w), HELLO_MS / 1000);
    else if (r == 0) st = dt_error(DT_ERR_SYS, "gym:%s: the bridge's Python (%s) did not start (is it installed?)", b->id, python);
    else if (!strncmp(line, "error ", 6)) st = dt_error(DT_ERR_ARG, "gym:%s: %s", b->id, line + 6);
    int od, na, ad, ms;
    if (!st && sscanf(line, "ok %d %d %d %d", &od, &na, &ad, &ms) != 4) st = dt_error(DT_ERR_IO, "gym:%s: bridge worker said '%.80s'", b->id, line);
    if (!st && (od < 1 || ad < 1 || na < 0 || (na && ad != 1)))
        st = dt_error(DT_ERR_UNSUPPORTED, "gym:%s: spaces dtrain cannot take (%d observation floats, %d actions, %d action floats)", b->id, od, na, ad);
    if (!st && w == b->w) {
        b->info = (dt_env_info){ .id = b->id, .name = b->id, .obs_dim = od, .actions = na, .act_dim = ad, .max_steps = ms };
        b->low = calloc((size_t)ad, sizeof(float));
        b->high = calloc((size_t)ad, sizeof(float));
        if (!b->low || !b->high) st = dt_error(DT_ERR_NOMEM, "gym bridge: out of memory");
    } else if (!st && (od != b->info.obs_dim || na != b->info.actions || ad != b->info.act_dim))
        st = dt_error(DT_ERR_IO, "gym:%s: bridge worker %d's spaces differ from worker 0's", b->id, (int)(w - b->w));
    for (int side = 0; side < 2 && !st; side++) { /* the bounds: low, then high */
        float *to = side ? b->high : b->low;
        char *p = line, *e;
        if (read_line(w->fd, line, cap, HELLO_MS) != 1) st = dt_error(DT_ERR_IO, "gym:%s: bridge worker's bounds missing", b->id);
        for (int i = 0; i < ad && !st; i++, p = e) {
            to[i] = strtof(p, &e);
            if (e == p) st = dt_error(DT_ERR_IO, "gym:%s: bridge worker's bound %d unreadable", b->id, i);
        }
    }
    return st;
}

/* Start worker w on k environments: the process, its socket, its memory (sized once it has said its spaces). */
static dt_status start(dt_gym_bridge *b, worker *w, const char *python) {
    char exe[4096], k[16];
    find_python(python, exe, sizeof exe);
    snprintf(k, sizeof k, "%d", w->k);
    char *argv[] = { exe, "-u", DT_GYM_WORKER_PY, b->id, k, NULL };
    int sv[2], mfd = memfd_create("dtrain-gym", MFD_CLOEXEC);
    if (mfd < 0) return dt_error(DT_ERR_SYS, "gym:%s: memfd_create: %s", b->id, strerror(errno));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
        close(mfd);
        return dt_error(DT_ERR_SYS, "gym:%s: socketpair: %s", b->id, strerror(errno));
    }
    int pid = 0;
    dt_status started = dt_child_start(exe, argv, sv[1], mfd, &pid);
    close(sv[1]);
    w->fd = sv[0];
    if (started) {
        close(mfd);
        return dt_error(DT_ERR_SYS, "gym:%s: %s", b->id, dt_last_error());
    }
    w->pid = pid;
    char line[4096];
    dt_status st = hello(b, w, python, line, sizeof line);
    int od = b->info.obs_dim, ad = b->info.act_dim;
    if (!st) {
        w->bytes = layout(w, NULL, w->k, od, ad);
        if (ftruncate(mfd, (off_t)w->bytes)) st = dt_error(DT_ERR_SYS, "gym:%s: sizing the shared memory: %s", b->id, strerror(errno));
    }
    if (!st && (w->mem = mmap(NULL, w->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)) == MAP_FAILED) {
        w->mem = NULL;
        st = dt_error(DT_ERR_SYS, "gym:%s: mapping the shared memory: %s", b->id, strerror(errno));
    }
    close(mfd);
    if (!st) layout(w, w->mem, w->k, od, ad);
    if (!st && send(w->fd, "m", 1, MSG_NOSIGNAL) != 1) st = gone(b, w);
    return st;
}

dt_status dt_gym_bridge_create(const char *id, int n, const dt_env_bridge_config *c, dt_gym_bridge **out) {
    *out = NULL;
    if (!id || !*id || strlen(id) >= 256) return dt_error(DT_ERR_ARG, "gym bridge: no environment id after 'gym:'");
    int nw = c && c->workers > 0 ? c->workers : dt_cpu_allowed();
    if (nw > n) nw = n;
    if (n < 1) return dt_error(DT_ERR_ARG, "gym:%s: %d environments", id, n);
    dt_gym_bridge *b = calloc(1, sizeof *b);
    if (!b || !(b->w = calloc((size_t)nw, sizeof *b->w))) {
        free(b);
        return dt_error(DT_ERR_NOMEM, "gym bridge: out of memory");
    }
    snprintf(b->id, sizeof b->id, "%s", id);
    b->n = n;
    b->nw = nw;
    for (int i = 0; i < nw; i++) {
        b->w[i].fd = -1;
        b->w[i].first = (int)((long)n * i / nw);
        b->w[i].k = (int)((long)n * (i + 1) / nw) - b->w[i].first;
    }
    dt_status st = DT_OK;
    for (int i = 0; i < nw && !st; i++) st = start(b, &b->w[i], c && c->python ? c->python : "python3");
    if (st) { dt_gym_bridge_destroy(b); return st; }
    b->info.low = b->low;
    b->info.high = b->high;
    if (!b->info.actions) b->info.act_low = b->low[0], b->info.act_high = b->high[0];
    *out = b;
    return DT_OK;
}

void dt_gym_bridge_destroy(dt_gym_bridge *b) {
    if (!b) return;
    for (int i = 0; i < b->nw; i++) { /* the socket's end tells each worker to go */
        worker *w = &b->w[i];
        if (w->fd >= 0) close(w->fd);
        if (w->mem) munmap(w->mem, w->bytes);
    }
    for (int i = 0; i < b->nw; i++) {
        worker *w = &b->w[i];
        int status;
        for (int t = 0; w->pid > 0 && t < 200 && waitpid(w->pid, &status, WNOHANG) == 0; t++) nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        if (w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == 0) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, &status, 0);
        }
    }
    free(b->w);
    free(b->low);
    free(b->high);
    free(b);
}

const dt_env_info *dt_gym_bridge_info(const dt_gym_bridge *b) { return &b->info; }

/* A byte from fd: asked for without waiting for up to SPIN_NS first (an idle core's wakeup costs tens of
 * microseconds, more than a small environment's step), yielding the core meanwhile, then waited for. */
#define SPIN_NS 200000
static ssize_t read_byte(int fd, char *c) {
    double t0 = dt_time_now();
    ssize_t got;
    while ((got = recv(fd, c, 1, MSG_DONTWAIT)) < 0 && (errno == EAGAIN || errno == EINTR) && dt_time_now() - t0 < SPIN_NS * 1e-9)
        sched_yield(); /* a core shared with the worker (more processes than cores) goes to it */
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        while ((got = read(fd, c, 1)) < 0 && errno == EINTR) {}
    return got;
}

/* Worker w's answer to the round: 'd', or 'e' and the line saying what its environment raised. */
static dt_status answer(dt_gym_bridge *b, worker *w) {
    char c;
    ssize_t got = read_byte(w->fd, &c);
    if (got <= 0) return gone(b, w);
    if (c == 'd') return DT_OK;
    char line[1024] = "";
    if (c != 'e' || read_line(w->fd, line, sizeof line, HELLO_MS) != 1) return dt_error(DT_ERR_IO, "gym:%s: bridge worker %d answered '%c'", b->id, (int)(w - b->w), c);
    int i = -1;
    const char *what = sscanf(line, "environment %d", &i) == 1 && strchr(line, ':') ? strchr(line, ':') + 2 : line;
    return dt_error(DT_ERR_ARG, "gym:%s: environment %d raised %s", b->id, w->first + (i >= 0 ? i : 0), what);
}

dt_status dt_gym_bridge_round(dt_gym_bridge *b, const int8_t *cmd, const int64_t *seed, const float *act, float *obs, double *rew,
                              uint8_t *term, uint8_t *trunc) {
    const int od = b->info.obs_dim, ad = b->info.act_dim;
    for (int i = 0; i < b->nw; i++) {
        worker *w = &b->w[i];
        memcpy(w->cmd, cmd + w->first, (size_t)w->k);
        if (seed) memcpy(w->seed, seed + w->first, sizeof(int64_t) * (size_t)w->k);
        if (act) memcpy(w->act, act + (size_t)w->first * ad, sizeof(float) * (size_t)w->k * ad);
        if (send(w->fd, "g", 1, MSG_NOSIGNAL) != 1) return gone(b, w);
    }
    dt_status st = DT_OK;
    for (int i = 0; i < b->nw; i++) { /* every answer read, even after a failure: the next round starts clean */
        dt_status s = answer(b, &b->w[i]);
        if (!st) st = s;
    }
    if (st) return st;
    for (int i = 0; i < b->nw; i++) {
        worker *w = &b->w[i];
        for (int j = 0; j < w->k; j++) {
            int e = w->first + j;
            if (cmd[e] == DT_ROUND_IDLE) continue;
            memcpy(obs + (size_t)e * od, w->obs + (size_t)j * od, sizeof(float) * (size_t)od);
            rew[e] = w->rew[j];
            term[e] = w->term[j];
            trunc[e] = w->trunc[j];
        }
    }
    return DT_OK;
}
