/* dtrain launch: fork n local ranks wired over one shared segment, watch
 * them, and end the job cleanly however a rank ends.
 *
 * The segment is a memfd inherited across exec (its fd number travels in
 * DTRAIN_SHM_FD), so it has no name anywhere and vanishes with the last
 * process. Children die with the launcher (PR_SET_PDEATHSIG). When a rank
 * fails, the launcher marks the segment aborted, naming it; ranks waiting in
 * a collective see that within milliseconds and exit with the message; any
 * still running after a grace period are killed. */
#include "comm_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define GRACE_SECONDS 0.5

static volatile sig_atomic_t got_signal, signals;
/* signals counts requests: copies of one (the terminal's and a wrapper's) count once */
static void on_signal(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    int kind = dt_stop_request_classify(si);
    got_signal = sig;
    if (kind == 1 && signals == 0) signals = 1;
    else if (kind == 2) signals++;
}

/* Reaps every rank that has ended by now; the first of them a signal ended, or -1. */
static int reap_killed(pid_t *pids, int *status, int n, int *alive) {
    int killed = -1, st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int r = 0; r < n; r++) {
            if (pids[r] != pid) continue;
            pids[r] = -pid;
            status[r] = st;
            (*alive)--;
            if (WIFSIGNALED(st) && killed < 0) killed = r;
        }
    }
    return killed;
}

/* The job's segment and world control block, named to the ranks through the environment they inherit. */
static int make_world(int n, dt_segment **seg) {
    if (dt_segment_create(0, n, seg)) { dt_log(DT_LOG_ERROR, "launch: %s", dt_last_error()); return 1; }
    /* The world's control block, made here so every rank only attaches. */
    dt_comm tmp = { .size = n, .local_size = n, .seg = *seg };
    uint64_t off;
    if (dt_group_create(&tmp, &off)) { dt_log(DT_LOG_ERROR, "launch: %s", dt_last_error()); dt_segment_release(*seg); return 1; }
    (*seg)->hdr->launcher_pid = (int32_t)getpid();
    char buf[64];
    snprintf(buf, sizeof buf, "%d", (*seg)->fd);
    setenv("DTRAIN_SHM_FD", buf, 1);
    snprintf(buf, sizeof buf, "%d", n);
    setenv("DTRAIN_WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)off);
    setenv("DTRAIN_GROUP_OFF", buf, 1);
    return 0;
}

/* Each rank's share of the launcher's cores for OpenMP and BLAS, unless the environment names a count: ranks whose
 * thread teams each took every core would oversubscribe them, and libgomp's idle workers spin (about a millisecond
 * after each parallel loop) on the cores the other ranks need. On 2 cores, 2 ranks of a tensor-parallel decode
 * (`generate --nproc 2 --tp 2`) took 1.79 s against 0.05 with a thread each. torchrun sets 1; this sets cores / N. */
static void share_cores(int n) {
    if (getenv("OMP_NUM_THREADS")) return;
    int share = dt_cpu_allowed() / n;
    char buf[16];
    snprintf(buf, sizeof buf, "%d", share > 0 ? share : 1);
    setenv("OMP_NUM_THREADS", buf, 1);
}

/* Forks and execs the n ranks (pids[r]); how many run. A failed fork aborts the job, naming the rank. */
static int fork_ranks(int n, char *const argv[], dt_segment *seg, pid_t *pids) {
    pid_t self = getpid();
    int alive = 0;
    char buf[64];
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            dt_log(DT_LOG_ERROR, "launch: fork of rank %d failed: %s", r, strerror(errno));
            dt_segment_abort(seg, "the launcher could not start rank %d", r);
            break;
        }
        if (pid == 0) {
            /* the ranks form one process group of their own: the launcher alone
             * takes the terminal's Ctrl-C and passes it on once, and ending the
             * group ends whatever the ranks started too */
            setpgid(0, r == 0 ? 0 : pids[0]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != self) _exit(1); /* the launcher died before we got here */
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            snprintf(buf, sizeof buf, "%d", r);
            setenv("DTRAIN_RANK", buf, 1);
            execvp(argv[0], argv);
            dt_log(DT_LOG_ERROR, "launch: cannot run '%s': %s", argv[0], strerror(errno));
            _exit(127);
        }
        setpgid(pid, r == 0 ? pid : pids[0]); /* also here: whichever of the two runs first */
        pids[r] = pid;
        atomic_store(&seg->hdr->proc[r].pid, (int32_t)pid);
        atomic_store(&seg->hdr->proc[r].world_rank, r);
        alive++;
    }
    return alive;
}

/* The watch over running ranks: what has happened to the job so far. */
typedef struct {
    pid_t *pids;   /* a rank's pid, negated once reaped */
    int *status;
    int n, alive, code, first_bad, handled;
    double deadline;
    bool forwarded, killing; /* killing: the launcher's own SIGKILLs are under way */
} watch;

/* A signal for the launcher: the first goes to the ranks (which may finish a step and save), a second stops the job. */
static void pass_signals(watch *w, dt_segment *seg, pid_t group) {
    if (signals > w->handled && w->handled == 0) {
        w->handled = 1;
        w->forwarded = true;
        if (group) kill(-group, got_signal);
        if (!w->code) w->code = 128 + got_signal;
    } else if (signals > w->handled) {
        w->handled = (int)signals;
        dt_segment_abort(seg, "the launcher got signal %d (%s) twice", (int)got_signal, strsignal(got_signal));
        if (group) kill(-group, got_signal);
        if (w->deadline == 0) w->deadline = dt_time_now() + GRACE_SECONDS;
    }
}

/* Rank pid ended with st: the first that ended badly stops the job, named (a rank a signal ended before it, if one
 * has, since the one that stops because a peer was killed can be reaped first). */
static void rank_ended(watch *w, dt_segment *seg, pid_t pid, int st) {
    int r = 0;
    while (r < w->n && w->pids[r] != pid) r++;
    if (r == w->n) return;
    w->pids[r] = -w->pids[r];
    w->status[r] = st;
    w->alive--;
    bool bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (bad && w->first_bad < 0 && !w->forwarded && !WIFSIGNALED(st)) {
        int k = reap_killed(w->pids, w->status, w->n, &w->alive);
        if (k >= 0) { r = k; pid = -w->pids[k]; st = w->status[k]; }
    }
    char what[128];
    if (bad && w->first_bad < 0 && !w->forwarded) {
        w->first_bad = r;
        dt_exit_describe(st, what, sizeof what);
        dt_segment_abort(seg, "rank %d (pid %d) %s", r, (int)pid, what);
        dt_log(DT_LOG_ERROR, "launch: rank %d (pid %d) %s; stopping the job", r, (int)pid, what);
        w->code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
        w->deadline = dt_time_now() + GRACE_SECONDS;
    } else if (bad && WIFSIGNALED(st) && !w->forwarded && !w->killing && r != w->first_bad) {
        /* a rank that crashes while it stops says nothing itself: said here, or its silence is a mystery */
        dt_exit_describe(st, what, sizeof what);
        dt_log(DT_LOG_ERROR, "launch: rank %d (pid %d) then %s", r, (int)pid, what);
    }
}

/* Ranks still running a grace period after the job was stopped are killed, and what they started with them. */
static void kill_stragglers(watch *w, pid_t group) {
    w->killing = true;
    for (int r = 0; r < w->n; r++)
        if (w->pids[r] > 0) {
            dt_log(DT_LOG_ERROR, "launch: rank %d (pid %d) still running after %.1f s; killing it", r, (int)w->pids[r], GRACE_SECONDS);
            kill(w->pids[r], SIGKILL);
        }
    if (group) kill(-group, SIGKILL);
    w->deadline = dt_time_now() + 10; /* reap what is left */
}

int dt_comm_launch(int n, char *const argv[]) {
    if (n < 1 || n > DT_MAX_LOCAL) {
        dt_log(DT_LOG_ERROR, "launch: -n %d is out of range (1..%d ranks on one machine)", n, DT_MAX_LOCAL);
        return 2;
    }
    int cores = dt_cpu_allowed();
    if (n > cores) dt_log(DT_LOG_WARN, "launch: %d ranks on %d cores: oversubscribed, ranks will yield while waiting", n, cores);
    dt_segment *seg;
    if (make_world(n, &seg)) return 1;
    struct sigaction sa = { 0 };
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    watch w = { .pids = calloc((size_t)n, sizeof(pid_t)), .status = calloc((size_t)n, sizeof(int)), .n = n, .first_bad = -1 };
    if (!w.pids || !w.status) { dt_log(DT_LOG_ERROR, "launch: out of memory"); return 1; }
    share_cores(n);
    w.alive = fork_ranks(n, argv, seg, w.pids);
    w.code = w.alive == n ? 0 : 1;
    pid_t group = w.pids[0] > 0 ? w.pids[0] : 0;
    while (w.alive > 0) {
        int st;
        /* never blocking: a signal that lands between the check below and a
         * blocking waitpid would not interrupt it and would never be passed on */
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno == EINTR) pid = 0;
        if (pid < 0) break;
        pass_signals(&w, seg, group);
        if (pid > 0) {
            rank_ended(&w, seg, pid, st);
            continue;
        }
        if (w.deadline > 0 && dt_time_now() > w.deadline) kill_stragglers(&w, group);
        usleep(w.deadline > 0 || got_signal ? 2000 : 5000);
    }
    /* a failed job leaves nothing behind: processes the ranks started die with it */
    if (w.code && group) kill(-group, SIGKILL);
    free(w.pids);
    free(w.status);
    dt_segment_release(seg);
    return w.code;
}
