/* Pipeline schedules as lists of actions per stage (see pipeline.h): built
 * in two passes, the computations in the schedule's order, then the
 * messages around them; a simulator that runs all the lists together
 * proves them deadlock-free and gives the table and the bubble. */
#include "dtrain/pipeline.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = { "gpipe", "1f1b", "zb1", "interleaved" };

int dt_pp_kind_parse(const char *name) {
    for (int k = 0; k < (int)(sizeof kind_names / sizeof kind_names[0]); k++)
        if (!strcmp(name, kind_names[k])) return k;
    return -1;
}

const char *dt_pp_kind_name(dt_pp_kind k) { return kind_names[k]; }

/* A computation: F, B or W of a micro-batch on one of the stage's chunks. */
typedef struct { int op, micro, chunk; } comp;
#define OP(k, o) ((comp){ (o), (k), 0 })

/* ZB-H1 on stage s: 1F1B's forwards and B's; a W first where a forward
 * would put more than min(p, m) micro-batches in flight (their slots are
 * freed by W), and before each B of the cool-down, where it fills the wait
 * for the next stage's gradient; the last W's at the end. */
static int zb1_order(int p, int m, int s, comp *ops) {
    int n = 0, cap = p < m ? p : m, warm = p - 1 - s < m ? p - 1 - s : m, f = 0, b = 0, w = 0;
    while (f < warm) ops[n++] = OP(f++, DT_PP_F);
    while (f < m) {
        if (f - w >= cap) ops[n++] = OP(w++, DT_PP_W);
        ops[n++] = OP(f++, DT_PP_F);
        ops[n++] = OP(b++, DT_PP_B);
    }
    while (b < m) {
        if (w < b) ops[n++] = OP(w++, DT_PP_W);
        ops[n++] = OP(b++, DT_PP_B);
    }
    while (w < m) ops[n++] = OP(w++, DT_PP_W);
    return n;
}

/* Megatron's interleaved order: the i-th forward of a stage is micro-batch
 * (i / pv) p + i % p on chunk (i % pv) / p (p micro-batches through each
 * chunk in turn), its i-th backward the same micro-batch on chunk v-1 minus
 * that; 2(p-1-s) + (v-1)p forwards first (all of them when m = p), then
 * one forward and one backward in turn. */
static comp virtual_op(int i, int p, int v, int op) {
    int chunk = (i % (p * v)) / p;
    return (comp){ op, (i / (p * v)) * p + i % p, op == DT_PP_F ? chunk : v - 1 - chunk };
}

static int interleaved_order(int p, int v, int m, int s, comp *ops) {
    int total = v * m, warm = m == p ? total : 2 * (p - 1 - s) + (v - 1) * p, n = 0, f = 0, b = 0;
    if (warm > total) warm = total;
    while (f < warm) ops[n++] = virtual_op(f++, p, v, DT_PP_F);
    while (f < total) {
        ops[n++] = virtual_op(f++, p, v, DT_PP_F);
        ops[n++] = virtual_op(b++, p, v, DT_PP_B);
    }
    while (b < total) ops[n++] = virtual_op(b++, p, v, DT_PP_B);
    return n;
}

/* Stage s's computations in order; returns how many. */
static int compute_order(dt_pp_kind kind, int p, int v, int m, int s, comp *ops) {
    int n = 0;
    if (kind == DT_PP_ZB1) return zb1_order(p, m, s, ops);
    if (kind == DT_PP_INTERLEAVED) return interleaved_order(p, v, m, s, ops);
    if (kind == DT_PP_GPIPE) {
        for (int k = 0; k < m; k++) ops[n++] = OP(k, DT_PP_F);
        for (int k = 0; k < m; k++) ops[n++] = OP(k, DT_PP_B);
        return n;
    }
    int warm = p - 1 - s < m ? p - 1 - s : m, f = 0, b = 0;
    while (f < warm) ops[n++] = OP(f++, DT_PP_F);
    while (f < m) { ops[n++] = OP(f++, DT_PP_F); ops[n++] = OP(b++, DT_PP_B); }
    while (b < m) ops[n++] = OP(b++, DT_PP_B);
    return n;
}

static dt_pp_action comm(dt_pp_msg send, dt_pp_msg recv) { return (dt_pp_action){ .op = DT_PP_COMM, .send = send, .recv = recv }; }
static const dt_pp_msg none = { -1, 0, 0, 0 };

/* Where chunk j's forward on stage s takes its input from (or, fwd 0, where its backward's gradient comes from):
 * the stage and its chunk; -1 for the model's first chunk (last, for a gradient). Chunks run through the stages in
 * turn: stage p-1's chunk j feeds stage 0's chunk j+1. */
static int before(int p, int v, int s, int j, int *chunk) {
    *chunk = s > 0 ? j : j - 1;
    return s > 0 ? s - 1 : j > 0 ? p - 1 : -1;
}
static int after(int p, int v, int s, int j, int *chunk) {
    *chunk = s < p - 1 ? j : j + 1;
    return s < p - 1 ? s + 1 : j < v - 1 ? 0 : -1;
}

/* The most micro-batches holding each chunk's activations at once (areas[j]): from the chunk's forward to its
 * backward (or W where it is split). */
static void chunk_areas(const comp *ops, int n, int v, int split, int *areas) {
    int grad_op = split ? DT_PP_W : DT_PP_B;
    for (int j = 0; j < v; j++) areas[j] = 0;
    /* a chunk's count in flight: forwards so far less its grad_ops so far, whose peak is areas[j] */
    for (int j = 0, held = 0; j < v; j++, held = 0)
        for (int i = 0; i < n; i++) {
            if (ops[i].chunk != j) continue;
            if (ops[i].op == DT_PP_F && ++held > areas[j]) areas[j] = held;
            if (ops[i].op == grad_op) held--;
        }
}

int dt_pp_chunk_areas(dt_pp_kind kind, int stages, int virt, int micro, int s, int *areas) {
    if (stages < 1 || micro < 1 || virt < 1 || s < 0 || s >= stages ||
        (kind == DT_PP_INTERLEAVED && (virt < 2 || micro < stages || micro % stages)) || (kind != DT_PP_INTERLEAVED && virt != 1))
        return -1;
    comp *ops = malloc(sizeof *ops * 3 * (size_t)micro * (size_t)virt);
    if (!ops) return -1;
    chunk_areas(ops, compute_order(kind, stages, virt, micro, s, ops), virt, kind == DT_PP_ZB1, areas);
    free(ops);
    return 0;
}

/* Stage s's actions: a receive before each computation that needs one, a
 * send after each that makes one, a send and the receive right after it
 * merged unless sends are asynchronous. Slots: the lowest free one at F,
 * freed by the micro-batch's last computation (B, or W where it is split). */
static int lower(const comp *ops, int n, int p, int v, int s, int async, int split, dt_pp_action *out, int *slots) {
    /* on the heap: n = 3m or 2vm, and --grad-accum may be large */
    int k = 0, used = 0, *slot_of = malloc(sizeof *slot_of * (size_t)n), *busy = calloc((size_t)n, sizeof *busy);
    if (!slot_of || !busy) { free(slot_of); free(busy); return -1; }
    int grad_op = split ? DT_PP_W : DT_PP_B, last_g = -1;
    for (int i = 0; i < n; i++)
        if (ops[i].op == grad_op) last_g = i;
    for (int i = 0; i < n; i++) {
        int micro = ops[i].micro, op = ops[i].op, j = ops[i].chunk, bwd = op == DT_PP_B, tc, sender_chunk;
        /* a forward's input from the chunk before, its output to the one after; a backward the other way; a message
         * names its receiver's chunk (tc for what this computation sends; the sender's chunk is not needed) */
        int prev = before(p, v, s, j, bwd ? &tc : &sender_chunk), next = after(p, v, s, j, bwd ? &sender_chunk : &tc);
        int from = bwd ? next : prev, to = bwd ? prev : next;
        if (op == DT_PP_W) from = to = -1;
        if (from >= 0) {
            dt_pp_msg r = { from, bwd, micro, j };
            if (!async && k > 0 && out[k - 1].op == DT_PP_COMM && out[k - 1].recv.peer < 0) out[k - 1].recv = r;
            else out[k++] = comm(none, r);
        }
        dt_pp_action a = { .op = (dt_pp_op)op, .micro = micro, .chunk = j, .last = i == last_g };
        /* a micro-batch's slot: from its first chunk's forward to that chunk's backward (or W) */
        if (op == DT_PP_F && j == 0) {
            int z = 0;
            while (busy[z]) z++;
            busy[z] = 1;
            slot_of[micro] = z;
            if (z + 1 > used) used = z + 1;
        } else if (op == grad_op && j == 0) {
            busy[slot_of[micro]] = 0;
        }
        a.slot = slot_of[micro];
        out[k++] = a;
        if (to >= 0) out[k++] = comm((dt_pp_msg){ to, bwd, micro, tc }, none);
    }
    *slots = used;
    free(slot_of);
    free(busy);
    return k;
}

void dt_pp_schedule_destroy(dt_pp_schedule *s) {
    if (!s) return;
    for (int i = 0; s->act && i < s->stages; i++) free(s->act[i]);
    free(s->act);
    free(s->n);
    free(s->slots);
    free(s->areas);
    free(s);
}

dt_status dt_pp_schedule_create(dt_pp_kind kind, int stages, int virt, int micro, dt_pp_schedule **out) {
    *out = NULL;
    if (stages < 1 || micro < 1) return dt_error(DT_ERR_ARG, "pipeline: %d stages and %d micro-batches (both must be >= 1)", stages, micro);
    if (kind != DT_PP_INTERLEAVED && virt != 1)
        return dt_error(DT_ERR_ARG, "pipeline: %d virtual stages (chunks per stage) need the interleaved schedule, not %s", virt,
                        dt_pp_kind_name(kind));
    if (kind == DT_PP_INTERLEAVED && (virt < 2 || micro < stages || micro % stages))
        return dt_error(DT_ERR_ARG, "pipeline: the interleaved schedule takes at least 2 virtual stages (not %d) and a multiple of "
                        "the %d stages' count of micro-batches (not %d): p micro-batches go through each chunk in turn", virt, stages, micro);
    dt_pp_schedule *s = calloc(1, sizeof *s);
    comp *ops = malloc(sizeof *ops * 3 * (size_t)micro * (size_t)virt);
    if (s) {
        s->act = calloc((size_t)stages, sizeof *s->act);
        s->n = calloc((size_t)stages, sizeof *s->n);
        s->slots = calloc((size_t)stages, sizeof *s->slots);
        s->areas = calloc((size_t)stages * (size_t)virt, sizeof *s->areas);
    }
    if (!s || !ops || !s->act || !s->n || !s->slots || !s->areas) { free(ops); dt_pp_schedule_destroy(s); return dt_error(DT_ERR_NOMEM, "pipeline: out of memory"); }
    s->kind = kind;
    s->stages = stages;
    s->micro = micro;
    s->virt = virt;
    s->async = kind == DT_PP_ZB1 || kind == DT_PP_INTERLEAVED;
    for (int st = 0; st < stages; st++) {
        /* at most a receive, the computation and a send per computation */
        if (!(s->act[st] = malloc(sizeof **s->act * 9 * (size_t)micro * (size_t)virt))) {
            free(ops);
            dt_pp_schedule_destroy(s);
            return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        }
        int nops = compute_order(kind, stages, virt, micro, st, ops);
        s->n[st] = lower(ops, nops, stages, virt, st, s->async, kind == DT_PP_ZB1, s->act[st], &s->slots[st]);
        if (s->n[st] < 0) { free(ops); dt_pp_schedule_destroy(s); return dt_error(DT_ERR_NOMEM, "pipeline: out of memory"); }
        chunk_areas(ops, nops, virt, kind == DT_PP_ZB1, s->areas + (size_t)st * virt);
    }
    free(ops);
    dt_status e = dt_pp_schedule_check(s);
    if (e) { dt_pp_schedule_destroy(s); return e; }
    *out = s;
    return DT_OK;
}

/* ---- the simulator ---- */

typedef struct {
    int *at;              /* next action per stage */
    double *clock;        /* when the stage is free */
    double *busy;         /* how long it has computed */
    double *posted;       /* when its communication at the head was posted (-1: not yet) */
    double *done_s, *done_r; /* when its head's send / receive half matched (-1: not yet) */
    double **start;       /* per stage, per action: when it started (computations) */
    /* asynchronous sends: per stage, per direction (0 down, 1 up), the last message posted, when, and when received (-1: not yet) */
    int *has;
    dt_pp_msg *msg;
    double *sent, *recvd;
} sim;

static const char *msg_name(const dt_pp_msg *m, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s of micro-batch %d", m->grad ? "the gradient" : "the activations", m->micro);
    if (m->chunk && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " (chunk %d)", m->chunk);
    return buf;
}

/* Matches stage s's send half with its peer's receive half, if that is posted now. */
static dt_status match_send(const dt_pp_schedule *s, sim *x, int st) {
    const dt_pp_action *a = &s->act[st][x->at[st]];
    int d = a->send.peer;
    if (x->at[d] >= s->n[d] || x->posted[d] < 0 || x->done_r[d] >= 0) return DT_OK;
    const dt_pp_action *b = &s->act[d][x->at[d]];
    if (b->recv.peer != st) return DT_OK;
    if (b->recv.grad != a->send.grad || b->recv.micro != a->send.micro || b->recv.chunk != a->send.chunk) {
        char m1[64], m2[64];
        return dt_error(DT_ERR_ARG, "pipeline schedule: stage %d sends %s where stage %d receives %s", st,
                        msg_name(&a->send, m1, sizeof m1), d, msg_name(&b->recv, m2, sizeof m2));
    }
    double t = x->posted[st] > x->posted[d] ? x->posted[st] : x->posted[d];
    x->done_s[st] = x->done_r[d] = t;
    return DT_OK;
}

/* An asynchronous send: waits only for the previous message to the same
 * neighbour to have been received (0: blocked). */
static int async_send(sim *x, int st, const dt_pp_msg *m) {
    int ch = 2 * st + !m->grad; /* activations go on, gradients back (a ring's ends are neighbours) */
    if (x->has[ch] && x->recvd[ch] < 0) return 0;
    if (x->has[ch] && x->recvd[ch] > x->clock[st]) x->clock[st] = x->recvd[ch];
    x->has[ch] = 1, x->msg[ch] = *m, x->sent[ch] = x->clock[st], x->recvd[ch] = -1;
    return 1;
}

/* A receive from an asynchronous sender: the message its sender has posted (0: not yet). */
static dt_status async_recv(sim *x, int st, const dt_pp_msg *m, int *got) {
    int ch = 2 * m->peer + !m->grad;
    *got = 0;
    if (!x->has[ch] || x->recvd[ch] >= 0) return DT_OK;
    if (x->msg[ch].grad != m->grad || x->msg[ch].micro != m->micro || x->msg[ch].chunk != m->chunk) {
        char m1[64], m2[64];
        return dt_error(DT_ERR_ARG, "pipeline schedule: stage %d sends %s where stage %d receives %s", m->peer,
                        msg_name(&x->msg[ch], m1, sizeof m1), st, msg_name(m, m2, sizeof m2));
    }
    double t = x->sent[ch] > x->clock[st] ? x->sent[ch] : x->clock[st];
    x->recvd[ch] = x->clock[st] = t;
    *got = 1;
    return DT_OK;
}

/* A blocking exchange of stage st at action a: posted, matched with its peers' (a receive completes when its sender's
 * send matches it); *done: it completed (the stage's clock moved to it), else the stage waits. */
static dt_status sync_comm(const dt_pp_schedule *s, sim *x, int st, const dt_pp_action *a, int *done) {
    dt_status e = DT_OK;
    *done = 0;
    if (x->posted[st] < 0) x->posted[st] = x->clock[st];
    if (a->send.peer >= 0 && x->done_s[st] < 0 && (e = match_send(s, x, st))) return e;
    if (a->recv.peer >= 0 && x->done_r[st] < 0) {
        int q = a->recv.peer;
        if (x->at[q] < s->n[q] && s->act[q][x->at[q]].op == DT_PP_COMM && s->act[q][x->at[q]].send.peer == st && x->posted[q] >= 0 &&
            x->done_s[q] < 0 && (e = match_send(s, x, q)))
            return e;
    }
    if ((a->send.peer >= 0 && x->done_s[st] < 0) || (a->recv.peer >= 0 && x->done_r[st] < 0)) return DT_OK;
    double t = x->done_s[st] > x->done_r[st] ? x->done_s[st] : x->done_r[st];
    if (t > x->clock[st]) x->clock[st] = t;
    x->posted[st] = x->done_s[st] = x->done_r[st] = -1;
    *done = 1;
    return DT_OK;
}

/* Stage st's action a, at its clock: computed, or its exchange (*done 0: it waits). */
static dt_status act(const dt_pp_schedule *s, const double *d, const size_t *off, sim *x, int st, const dt_pp_action *a, int *done) {
    *done = 1;
    if (a->op != DT_PP_COMM) {
        x->start[st][x->at[st]] = x->clock[st];
        double t = d[off[st] + (size_t)x->at[st]];
        x->clock[st] += t;
        x->busy[st] += t;
        return DT_OK;
    }
    if (!s->async) return sync_comm(s, x, st, a, done);
    if (a->send.peer >= 0) {
        *done = async_send(x, st, &a->send);
        return DT_OK;
    }
    return async_recv(x, st, &a->recv, done);
}

/* Where every stage waits, when none can move. */
static dt_status deadlock(const dt_pp_schedule *s, const sim *x) {
    char where[256];
    int k = 0;
    for (int st = 0; st < s->stages && k < (int)sizeof where - 40; st++)
        if (x->at[st] < s->n[st]) {
            const dt_pp_action *a = &s->act[st][x->at[st]];
            char h[2][40] = { "", "" };
            if (a->send.peer >= 0) snprintf(h[0], sizeof h[0], "sending to %d", a->send.peer);
            if (a->recv.peer >= 0) snprintf(h[1], sizeof h[1], "receiving from %d", a->recv.peer);
            k += snprintf(where + k, sizeof where - (size_t)k, "%sstage %d at action %d (%s%s%s)", k ? ", " : "", st, x->at[st], h[0],
                          h[0][0] && h[1][0] ? " and " : "", h[1]);
        }
    return dt_error(DT_ERR_ARG, "pipeline schedule %s (p=%d, m=%d) deadlocks: %s", dt_pp_kind_name(s->kind), s->stages, s->micro, where);
}

/* The step ends when every send has been received. */
static dt_status all_received(const dt_pp_schedule *s, sim *x) {
    for (int ch = 0; ch < 2 * s->stages; ch++) {
        if (!x->has[ch]) continue;
        if (x->recvd[ch] < 0) {
            char m1[64];
            return dt_error(DT_ERR_ARG, "pipeline schedule %s (p=%d, m=%d): stage %d sends %s that stage %d never receives",
                            dt_pp_kind_name(s->kind), s->stages, s->micro, ch / 2, msg_name(&x->msg[ch], m1, sizeof m1), x->msg[ch].peer);
        }
        if (x->recvd[ch] > x->clock[ch / 2]) x->clock[ch / 2] = x->recvd[ch];
    }
    return DT_OK;
}

/* d: each stage's actions' durations in list order, stage after stage (off[st]: where stage st's start). Each stage
 * runs its actions in turn until one waits; round after round until all are done. */
static dt_status simulate(const dt_pp_schedule *s, const double *d, const size_t *off, sim *x) {
    int p = s->stages, left = 0;
    for (int i = 0; i < p; i++) {
        x->at[i] = 0, x->clock[i] = x->busy[i] = 0, x->posted[i] = x->done_s[i] = x->done_r[i] = -1;
        left += s->n[i];
    }
    for (int i = 0; i < 2 * p; i++) x->has[i] = 0;
    while (left > 0) {
        int moved = 0;
        for (int st = 0; st < p; st++) {
            int done = 1;
            while (x->at[st] < s->n[st] && done) {
                dt_status e = act(s, d, off, x, st, &s->act[st][x->at[st]], &done);
                if (e) return e;
                if (done) x->at[st]++, left--, moved = 1;
            }
        }
        if (!moved) return deadlock(s, x);
    }
    return all_received(s, x);
}

/* Runs the simulator with d's durations (NULL: a forward 1, a backward 2, or B and W 1 each), then fn. */
static dt_status with_sim(const dt_pp_schedule *s, const double *d, dt_status (*fn)(const dt_pp_schedule *, sim *, void *), void *ctx) {
    int p = s->stages;
    sim x = { 0 };
    size_t *off = malloc(sizeof *off * (size_t)(p + 1));
    for (int i = 0; off && i <= p; i++) off[i] = i ? off[i - 1] + (size_t)s->n[i - 1] : 0;
    double *unit = d || !off ? NULL : malloc(sizeof *unit * (off[p] ? off[p] : 1));
    for (int i = 0; unit && i < p; i++)
        for (int k = 0; k < s->n[i]; k++) {
            dt_pp_op op = s->act[i][k].op;
            unit[off[i] + (size_t)k] = op == DT_PP_F || op == DT_PP_W ? 1 : op == DT_PP_B ? (s->kind == DT_PP_ZB1 ? 1 : 2) : 0;
        }
    x.at = calloc((size_t)p, sizeof *x.at);
    x.clock = calloc((size_t)p, sizeof *x.clock);
    x.busy = calloc((size_t)p, sizeof *x.busy);
    x.posted = calloc((size_t)p, sizeof *x.posted);
    x.done_s = calloc((size_t)p, sizeof *x.done_s);
    x.done_r = calloc((size_t)p, sizeof *x.done_r);
    x.start = calloc((size_t)p, sizeof *x.start);
    x.has = calloc(2 * (size_t)p, sizeof *x.has);
    x.msg = calloc(2 * (size_t)p, sizeof *x.msg);
    x.sent = calloc(2 * (size_t)p, sizeof *x.sent);
    x.recvd = calloc(2 * (size_t)p, sizeof *x.recvd);
    dt_status e = off && (d || unit) && x.at && x.clock && x.busy && x.posted && x.done_s && x.done_r && x.start && x.has && x.msg && x.sent &&
                          x.recvd ? DT_OK : dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int i = 0; i < p && !e; i++)
        if (!(x.start[i] = calloc((size_t)s->n[i], sizeof **x.start))) e = dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    if (!e) e = simulate(s, d ? d : unit, off, &x);
    if (!e && fn) e = fn(s, &x, ctx);
    for (int i = 0; x.start && i < p; i++) free(x.start[i]);
    free(x.start);
    free(x.at);
    free(x.clock);
    free(x.busy);
    free(x.posted);
    free(x.done_s);
    free(x.done_r);
    free(x.has);
    free(x.msg);
    free(x.sent);
    free(x.recvd);
    free(unit);
    free(off);
    return e;
}

dt_status dt_pp_schedule_check(const dt_pp_schedule *s) { return with_sim(s, NULL, NULL, NULL); }

/* The idle share of the makespan, over all stages. */
static double bubble_of(const dt_pp_schedule *s, const sim *x) {
    double span = 0, busy = 0;
    for (int i = 0; i < s->stages; i++) {
        if (x->clock[i] > span) span = x->clock[i];
        busy += x->busy[i];
    }
    return span > 0 ? 1 - busy / (span * s->stages) : 0;
}

static dt_status get_bubble(const dt_pp_schedule *s, sim *x, void *ctx) {
    *(double *)ctx = bubble_of(s, x);
    return DT_OK;
}

double dt_pp_schedule_bubble(const dt_pp_schedule *s) {
    double b = 0;
    return with_sim(s, NULL, get_bubble, &b) ? -1 : b;
}

double dt_pp_schedule_bubble_replay(const dt_pp_schedule *s, const double *d) {
    double b = 0;
    return with_sim(s, d, get_bubble, &b) ? -1 : b;
}

static dt_status print_table(const dt_pp_schedule *s, sim *x, void *ctx) {
    FILE *out = ctx;
    int span = 0;
    for (int i = 0; i < s->stages; i++)
        if ((int)x->clock[i] > span) span = (int)x->clock[i];
    char cell[16];
    int w = s->virt > 1 ? 6 : 4; /* interleaved: F3.1 is micro-batch 3 on the stage's chunk 1 */
    for (int st = 0; st < s->stages; st++) {
        fprintf(out, "stage %-2d|", st);
        int t = 0;
        for (int i = 0; i < s->n[st]; i++) {
            const dt_pp_action *a = &s->act[st][i];
            if (a->op == DT_PP_COMM) continue;
            for (; t < (int)x->start[st][i]; t++) fprintf(out, "%*s", w, ".");
            if (s->virt > 1) snprintf(cell, sizeof cell, "%c%d.%d", "FBW"[a->op], a->micro, a->chunk);
            else snprintf(cell, sizeof cell, "%c%d", "FBW"[a->op], a->micro);
            int len = a->op == DT_PP_F || s->kind == DT_PP_ZB1 ? 1 : 2;
            fprintf(out, "%*s", w, cell);
            for (int k = 1; k < len; k++) fprintf(out, "%*s", w, a->op == DT_PP_F ? "" : "~");
            t += len;
        }
        for (; t < span; t++) fprintf(out, "%*s", w, ".");
        fprintf(out, "| %d slot%s\n", s->slots[st], s->slots[st] == 1 ? "" : "s");
    }
    int p = s->stages, m = s->micro, v = s->virt;
    if (s->kind == DT_PP_INTERLEAVED)
        fprintf(out, "bubble %.3f (theory (p-1)/(vm+p-1) = %.3f); a column is a chunk's forward time, its backward takes two\n",
                bubble_of(s, x), (double)(p - 1) / (v * m + p - 1));
    else if (s->async)
        fprintf(out, "bubble %.3f (ZB-H1's theory (p-1)/(3m+p-1) = %.3f%s); a column is a forward's time, B and W one each\n",
                bubble_of(s, x), (double)(p - 1) / (3 * m + p - 1), m < p ? ", for m >= p: fewer micro-batches wait longer" : "");
    else
        fprintf(out, "bubble %.3f (theory (p-1)/(m+p-1) = %.3f); a column is a forward's time, a backward takes two (B3 ~)\n",
                bubble_of(s, x), (double)(p - 1) / (m + p - 1));
    return DT_OK;
}

void dt_pp_schedule_print(const dt_pp_schedule *s, FILE *out) {
    fprintf(out, "schedule %s: %d stages, %d micro-batches", dt_pp_kind_name(s->kind), s->stages, s->micro);
    if (s->virt > 1) fprintf(out, ", %d chunks a stage", s->virt);
    fprintf(out, "\n");
    dt_status e = with_sim(s, NULL, print_table, out);
    if (e) fprintf(out, "(cannot be printed: %s)\n", dt_last_error());
}
