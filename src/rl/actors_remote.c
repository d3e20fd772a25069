/* IMPALA's actors on other machines, the learner's side (see actors.h):
 * rank i + 1 of the MPI job is actor i. Nothing here waits on one actor:
 * every message is posted and tested, and an actor silent for the timeout
 * is counted gone, since a dead rank's messages never fail under Open MPI
 * (they stay pending). The learner writes to an actor only in reply to a
 * message of its (the actor sends a heartbeat as soon as it waits): Open
 * MPI 4.1's TCP transport, once a write to a dead rank fails (EPIPE), can
 * spin inside MPI_Test forever (measured: 3 of 7 runs with an actor killed
 * mid-run while the learner sent to it every update and each second), and
 * a reply goes out at most once after an actor's last word. That one reply
 * can still spin (1 in 8-20 runs on a loaded machine): the peers' guard ends
 * the rank stuck so, saying so, rather than hang (dt_peers_guard). */
#include "actors_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define READY_S 120.0 /* an actor's start: a bridged environment imports gymnasium first */

/* the bytes the learner says, where a forgotten send may read them until the process ends */
static const char free_byte = DT_ACTOR_FREE, beat = DT_ACTOR_HEARTBEAT, end_byte = DT_ACTOR_END, end_lost = DT_ACTOR_END_LOST;

static void answer(dt_rl_actors *a, int i);

void dt_actors_remote_tell(dt_rl_actors *a, int i, char c) {
    actor *x = &a->a[i];
    if (!x->alive) return;
    if (c == DT_ACTOR_FREE) { /* W is the weights' own message; H an answer */
        x->frees++;
        answer(a, i);
    } else if (c == DT_ACTOR_END || c == DT_ACTOR_END_LOST) {
        dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_CTL, c == DT_ACTOR_END ? &end_byte : &end_lost, 1);
    }
}

static dt_status post_slot(dt_rl_actors *a, int i, int s) {
    a->a[i].done[s] = 0;
    return dt_peers_recv(a->peers, i + 1, DT_ACTOR_TAG_SLOT + s, dt_actor_slot_at(a->h, i, s), a->h->slot_bytes,
                         &a->a[i].slot_in[s]);
}

void dt_actors_remote_release(dt_rl_actors *a, int i) {
    if (!a->a[i].alive) return;
    /* the slot given last: its receive posted again before the actor hears it is free (never freed where that fails:
     * the actor waits, falls silent and is counted gone) */
    if (!post_slot(a, i, (a->a[i].next + DT_ACTOR_SLOTS - 1) % DT_ACTOR_SLOTS)) dt_actors_remote_tell(a, i, DT_ACTOR_FREE);
}

static void send_weights(dt_rl_actors *a, int i) {
    actor *x = &a->a[i];
    dt_actor_shared *h = a->h;
    int64_t v = atomic_load_explicit(&h->version, memory_order_relaxed);
    memcpy(x->wbuf, &v, sizeof v);
    memcpy(x->wbuf + 2, (char *)h + h->weights_off, sizeof(float) * h->nparams);
    x->owed = 0;
    if (dt_peers_send(a->peers, i + 1, DT_ACTOR_TAG_WEIGHTS, x->wbuf, sizeof v + sizeof(float) * h->nparams, &x->w_out))
        x->owed = 1; /* tried again at the next hearing; a rank that is gone falls silent */
}

void dt_actors_remote_publish(dt_rl_actors *a) {
    for (int i = 0; i < a->na; i++) {
        a->a[i].owed = a->a[i].alive;
        answer(a, i); /* now, if it has spoken since the last reply; else at its next word */
    }
}

/* What actor i is owed, sent now that it has spoken (its credit spent); weights wait for the last ones to land. */
static void answer(dt_rl_actors *a, int i) {
    actor *x = &a->a[i];
    int weights = x->owed && (!x->w_out || dt_peers_done(&x->w_out));
    /* a heartbeat alone is answered only after half a second: the credit is kept for the weights or slots it waits for */
    int beat_due = x->answer && dt_time_now() - x->credit_at > 0.5;
    if (!x->credit || !(x->frees || weights || beat_due)) return;
    x->credit = 0;
    for (; x->frees > 0; x->frees--) dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_CTL, &free_byte, 1);
    if (weights) send_weights(a, i);
    if (x->answer) dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_CTL, &beat, 1);
    x->answer = 0;
}

/* What actor i sent since the last hearing; 0, or -1 once it is gone (*why). */
static int hear(dt_rl_actors *a, int i, double now, const char **why) {
    actor *x = &a->a[i];
    for (int s = 0; s < DT_ACTOR_SLOTS; s++) {
        int r = x->slot_in[s] ? dt_peers_done(&x->slot_in[s]) : 0;
        if (r < 0) { *why = "cannot be reached (MPI says its messages failed)"; return -1; }
        if (r) {
            x->done[s] = 1;
            x->heard = now;
            if (!x->credit) x->credit = 1, x->credit_at = now;
        }
    }
    x->full = 0; /* the slots arrived in the order take gives them (two tags: MPI may complete them out of order) */
    while (x->full < DT_ACTOR_SLOTS && x->done[(x->next + x->full) % DT_ACTOR_SLOTS]) x->full++;
    for (int r; x->ctl_in && (r = dt_peers_done(&x->ctl_in));) {
        if (r < 0) { *why = "cannot be reached (MPI says its messages failed)"; return -1; }
        x->heard = now;
        if (!x->credit) x->credit = 1, x->credit_at = now;
        x->answer |= x->ctl == DT_ACTOR_HEARTBEAT; /* it waits: that the learner lives is news to give */
        if (x->ctl == DT_ACTOR_FAILED) { *why = "failed (its error is in its own output)"; return -1; }
        if (dt_peers_recv(a->peers, i + 1, DT_ACTOR_TAG_CTL, &x->ctl, 1, &x->ctl_in)) { *why = "cannot be heard"; return -1; }
    }
    if (now - x->heard > a->timeout) { *why = "silent"; return -1; }
    answer(a, i);
    return 0;
}

void dt_actors_remote_wait(dt_rl_actors *a, void (*lost)(dt_rl_actors *, int, const char *)) {
    nanosleep(&(struct timespec){ 0, 100000 }, NULL);
    double now = dt_time_now();
    for (int i = 0; i < a->na; i++) {
        const char *why = NULL;
        if (a->a[i].alive && hear(a, i, now, &why) < 0) lost(a, i, why);
    }
}

/* Actor i's settings (its copy of the header, a resumed run's start) and its receives posted. */
static dt_status greet(dt_rl_actors *a, int i) {
    dt_actor_shared *h = a->h;
    actor *x = &a->a[i];
    if (!(x->wbuf = malloc(sizeof(int64_t) + sizeof(float) * h->nparams))) return dt_error(DT_ERR_NOMEM, "impala: out of memory");
    dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_HEADER, h, sizeof *h);
    if (h->start_off)
        dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_START, dt_actor_start_at(h, i),
                     2 * sizeof(int64_t) + (size_t)h->n * h->env_rec * sizeof(double));
    dt_status st = dt_peers_recv(a->peers, i + 1, DT_ACTOR_TAG_READY, x->host, sizeof x->host, &x->ready_in);
    if (!st) st = dt_peers_recv(a->peers, i + 1, DT_ACTOR_TAG_CTL, &x->ctl, 1, &x->ctl_in);
    for (int s = 0; !st && s < DT_ACTOR_SLOTS; s++) st = post_slot(a, i, s);
    x->alive = x->greeted = 1;
    a->live++;
    return st;
}

dt_status dt_actors_remote_start(dt_rl_actors *a) {
    int ranks = dt_peers_size(a->peers);
    if (ranks - 1 != a->na)
        return dt_error(DT_ERR_ARG, "impala: --actors %d, but the job has %d rank%s besides the learner (each is one actor)", a->na,
                        ranks - 1, ranks == 2 ? "" : "s");
    dt_status st = DT_OK;
    for (int i = 0; i < a->na && !st; i++) st = greet(a, i);
    double t0 = dt_time_now();
    for (int i = 0; i < a->na && !st; i++) {
        actor *x = &a->a[i];
        int r;
        while (!st && !(r = dt_peers_done(&x->ready_in))) {
            double now = dt_time_now();
            if (x->ctl_in && dt_peers_done(&x->ctl_in) && x->ctl == DT_ACTOR_FAILED)
                st = dt_error(DT_ERR_PEER, "impala: actor %d (rank %d) could not start (its error is in its own output)", i, i + 1);
            else if (!x->ctl_in) st = dt_peers_recv(a->peers, i + 1, DT_ACTOR_TAG_CTL, &x->ctl, 1, &x->ctl_in);
            if (!st && now - t0 > READY_S)
                st = dt_error(DT_ERR_PEER, "impala: actor %d (rank %d) did not start within %.0f s", i, i + 1, READY_S);
            nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
        }
        if (!st && r < 0) st = dt_error(DT_ERR_PEER, "impala: actor %d (rank %d) cannot be reached (MPI says so)", i, i + 1);
        x->host[sizeof x->host - 1] = 0;
        x->heard = dt_time_now();
        x->credit = 1; /* its ready message: the first weights go at once */
        x->credit_at = x->heard;
    }
    char where[512] = "";
    for (int i = 0, k = 0; !st && i < a->na && k < (int)sizeof where; i++)
        k += snprintf(where + k, sizeof where - (size_t)k, "%s%d on %s", i ? ", " : "", i, a->a[i].host);
    if (!st) dt_log(DT_LOG_INFO, "impala: actors on the job's other ranks (actor i is rank i + 1): %s", where);
    return st;
}

void dt_actors_remote_forget(dt_rl_actors *a, int i) {
    actor *x = &a->a[i];
    for (int s = 0; s < DT_ACTOR_SLOTS; s++) dt_peers_drop(&x->slot_in[s]);
    dt_peers_drop(&x->ctl_in);
    dt_peers_drop(&x->ready_in);
    dt_peers_drop(&x->w_out); /* its buffer stays: a forgotten send may still read it */
    x->wbuf = NULL;
    dt_peers_lost(a->peers);
    a->lost_any = 1;
}

void dt_actors_remote_end(dt_rl_actors *a, void (*lost)(dt_rl_actors *, int, const char *)) {
    /* every live actor heard once more after the run's end (a slot, or its heartbeat as it waits for one the learner no
     * longer frees): one that died in the run's last seconds is counted lost within the timeout, so that nobody calls
     * MPI_Finalize, which would wait for it forever (measured: a kill 5 s before the end of a run with a 5 s timeout) */
    double t0 = dt_time_now();
    for (int waiting = 1; waiting;) {
        waiting = 0;
        for (int i = 0; i < a->na; i++) waiting |= a->a[i].alive && a->a[i].heard <= t0;
        if (waiting) dt_actors_remote_wait(a, lost);
    }
    char end = a->lost_any || a->live < a->na ? DT_ACTOR_END_LOST : DT_ACTOR_END;
    t0 = dt_time_now();
    for (int i = 0; i < a->na; i++) { /* what is in flight to a live actor lands before the end (MPI may not finalize past it) */
        actor *x = &a->a[i];
        while (x->alive && x->w_out && !dt_peers_done(&x->w_out) && dt_time_now() - t0 < 1.0)
            nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
        if (x->alive) dt_actors_remote_tell(a, i, end);
        else if (!x->greeted) dt_peers_say(a->peers, i + 1, DT_ACTOR_TAG_CTL, &end_lost, 1); /* it waits for settings */
    }
    for (int i = 0; i < a->na; i++) {
        actor *x = &a->a[i];
        for (int s = 0; s < DT_ACTOR_SLOTS; s++) dt_peers_drop(&x->slot_in[s]);
        dt_peers_drop(&x->ctl_in);
        dt_peers_drop(&x->ready_in);
        if (x->w_out) dt_peers_drop(&x->w_out);
        else free(x->wbuf);
    }
}

/* Before any actor was greeted (the learner's setup failed): one word to each, which nothing has written to yet. */
void dt_rl_actors_abandon(dt_peers *p) {
    int n = dt_peers_size(p);
    dt_peer_msg **m = calloc((size_t)n, sizeof *m);
    for (int r = 1; m && r < n; r++) dt_peers_send(p, r, DT_ACTOR_TAG_CTL, &end_lost, 1, &m[r]); /* whatever an actor waits for */
    for (int r = 1; m && r < n; r++) /* landed before this rank ends (a second at most) */
        for (double t0 = dt_time_now(); !dt_peers_done(&m[r]) && dt_time_now() - t0 < 1.0;)
            nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    for (int r = 1; m && r < n; r++) dt_peers_drop(&m[r]);
    free(m);
    dt_peers_lost(p);
}
