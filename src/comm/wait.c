/* Waiting for peers on one machine.
 *
 * Spin first (a peer on another core answers in ~100 ns), then yield (a peer
 * that shares our core needs the CPU), then sleep on a futex doorbell that
 * whoever may unblock us rings. Sleeps time out every few milliseconds to
 * look for dead, departed or mismatched peers, so no wait can hang. */
#include "comm_internal.h"

#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_SECONDS 50e-6
#define YIELD_SECONDS 1e-3
#define SLEEP_NS 5000000 /* 5 ms between health checks while asleep */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void dt_shm_notify(dt_comm *c, int local_peer) {
    shm_slot *s = &c->slots[local_peer];
    /* Pairs with the sleeper's store to sleeping and re-check: one of the two
     * sides sees the other (both are seq_cst). */
    if (atomic_load(&s->sleeping)) {
        atomic_fetch_add(&s->ring, 1);
        futex(&s->ring, FUTEX_WAKE, 1, NULL);
    }
}

dt_status dt_shm_check_abort(dt_comm *c) {
#ifdef DT_HAVE_MPI
    if (c->mpi) {
        dt_status st = dt_mpi_check_abort(c);
        if (st) return st;
    }
#endif
    const char *msg = c->seg ? dt_segment_abort_message(c->seg) : NULL;
    if (!msg) return DT_OK;
    char d[256];
    dt_desc_format(&c->cur, d, sizeof d);
    return dt_error(DT_ERR_PEER, "%s [rank %d was in %s]", msg, c->world_rank, d);
}

_Thread_local _Atomic int *dt_wait_owner_blocked;

/* A peer that is alive but has not come for stall_timeout: said once, and at
 * twice that the job is stopped, naming it (its state tells a busy loop from
 * a deadlock or a stop). */
static dt_status check_stall(dt_comm *c, int j, double waited, bool *warned) {
    if (c->stall_timeout <= 0 || j < 0 || j >= c->local_size || waited < c->stall_timeout) return DT_OK;
    char who[160], d[256];
    dt_group_describe_peer(c, j, who, sizeof who);
    dt_desc_format(&c->cur, d, sizeof d);
    int me = atomic_load(&c->seg->hdr->proc[c->proc_of[c->local_rank]].world_rank);
    if (waited < 2 * c->stall_timeout) {
        if (!*warned) dt_log(DT_LOG_WARN, "rank %d has waited %.3g s in %s for %s; the job stops at %.3g s (--stall-timeout)", me,
                             waited, d, who, 2 * c->stall_timeout);
        *warned = true;
        return DT_OK;
    }
    dt_segment_abort(c->seg, "%s has made no progress for %.3g s while rank %d waited for it in %s (stuck in a loop, "
                     "deadlocked, or in a call the others never make?)", who, waited, me, d);
    return dt_shm_check_abort(c);
}

dt_status dt_shm_wait(dt_comm *c, wait_cond cond, void *arg, int waiting_for) {
    double t0 = 0;
    bool warned = false;
    if (dt_wait_owner_blocked && !atomic_load(dt_wait_owner_blocked)) goto sleep;
    /* A peer on another core is usually a few hundred nanoseconds away: poll
     * tight first, before paying for the clock or for pause's delay. */
    /* Oversubscribed, the peer we wait for may need this very core: yield at once. */
    for (int i = 0; i < (c->oversubscribed ? 1 : 200); i++)
        if (cond(arg)) return DT_OK;
    double spin = c->oversubscribed ? 0 : SPIN_SECONDS, t;
    t0 = t = dt_time_now();
    for (unsigned i = 1;; i++) {
        if (cond(arg)) return DT_OK;
        if (t - t0 < spin) {
            cpu_relax();
            if ((i & 63) == 0) t = dt_time_now();
            continue;
        }
        if (t - t0 < spin + YIELD_SECONDS) {
            sched_yield();
            t = dt_time_now();
            continue;
        }
        break;
    }
sleep:;
    if (t0 == 0) t0 = dt_time_now();
    shm_slot *me = &c->slots[c->local_rank];
    struct timespec ts = { 0, SLEEP_NS };
    for (;;) {
        atomic_store(&me->sleeping, 1);
        uint32_t r = atomic_load(&me->ring);
        if (cond(arg)) { atomic_store(&me->sleeping, 0); return DT_OK; }
        futex(&me->ring, FUTEX_WAIT, r, &ts);
        atomic_store(&me->sleeping, 0);
        if (cond(arg)) return DT_OK;
        dt_status st = dt_group_check_peers(c, waiting_for, cond, arg);
        if (!st) st = check_stall(c, waiting_for, dt_time_now() - t0, &warned);
        if (st) return st;
    }
}
