/* One pipeline stage: runs its list of actions (pipeline_schedule.c) on its
 * part of the model program (any family), each micro-batch in its activation slot, activations and
 * their gradients to and from the neighbours. On one machine they go
 * through a mailbox in the shared arena per edge of the chain (of the
 * ring, when an interleaved stage's chunks wrap from the last stage to the
 * first) and direction: a send is a copy into it, a receive reads in place.
 * Across machines: with blocking sends and receives, a send and a receive
 * in one step together (dt_comm_sendrecv), or, for a schedule with
 * asynchronous sends (zb1, interleaved), sends posted from the slot itself
 * and left to progress while the stage computes, over a two-rank
 * communicator per edge and direction: a communicator's requests run in
 * order, so one that only sends and one that only receives never make a
 * receive wait behind this stage's own send. An interleaved stage runs each
 * action on one of its chunks and announces its gradients after its last
 * backward.
 * The tied embedding's two copies (first and last stage) are kept as one
 * process has them: the head's gradient goes to the first stage, which
 * owns wte; the updated values come back. */
#include "dtrain/pipeline.h"
#include "dtrain/program.h"

#include <stdlib.h>
#include <string.h>

struct dt_pipeline {
    dt_pipeline_config c;
    dt_pp_schedule *s;
    dt_micro_schedule ms;
    int stage, p, L;
    int v, ca[DT_GPT2_MAX_CHUNKS], cb[DT_GPT2_MAX_CHUNKS]; /* the stage's chunks: units [ca[j], cb[j]) */
    size_t stream;              /* floats of the residual stream between stages (B*T*C, /tp under SP) */
    size_t row, words;          /* the stream's rows (channels), and a message's 32-bit words on a coded wire (--pp-wire) */
    uint32_t *wout[2], *win;    /* a coded wire: the message out back (0) and on (1), and the one in */
    float *xin, *dout;          /* the received activations / gradient, until the computation copies them */
    /* the tied embedding: first and last stage over tied (NULL: one stage holds both, or neither) */
    dt_comm *tied;
    float *wte_send, *wte_recv; /* the head's gradient of wte on its way (last stage), on arrival (first) */
    size_t wte_off, wte_n;
    dt_request *wte_req;
    int last_b;                 /* inside the stage's last backward of the step */
    dt_status hook_err;
    double fwd, bwd, wgt, total; /* the last step: seconds in forwards, backwards (B), weight gradients (W), the schedule */
    double *took;               /* the last step: each of the stage's actions' seconds (communication 0) */
    /* asynchronous sends: link[side][kind] the two-rank communicator with the stage before (side 0) or after (1)
     * this one, around a ring when chunks wrap, for activations (kind 0, sent on) or gradients (1, sent back), this
     * stage rank 1 or 0 in it; the send in flight per direction (0: back, 1: on); where an interleaved stage's
     * gradients wait to leave (its slot's gradient is rewritten by the micro-batch's next chunk) */
    dt_comm *link[2][2];
    /* on one machine, every link's messages through a mailbox in the shared arena (box[side][kind], as link): a send
     * is a copy into it and never waits for the neighbour; what arrives is read where it lies (rx[kind]) and released
     * once the computation that reads it is done. NULL where any link of the pipeline spans machines. */
    dt_mailbox *box[2][2];
    const float *rx[2];
    dt_request *sending[2];
    float *gsend;
    int32_t *targets;           /* interleaved: each slot's micro-batch's targets, read at its first chunk, used at the head's */
};

/* Last stage, the head's backward done: its wte gradient leaves for the first stage (a copy: data parallelism is
 * about to reduce the store in place). */
static void after_backward(int unit, void *ctx) {
    dt_pipeline *p = ctx;
    if (!p->last_b || unit != p->L + 1 || p->hook_err) return;
    float *g = dt_program_grads(p->c.model) + p->wte_off;
    memcpy(p->wte_send, g, p->wte_n * sizeof(float));
    /* the copy's gradient has left: zero for the next step (an optimizer that leaves the copy out does not zero it) */
    memset(g, 0, p->wte_n * sizeof(float));
    p->hook_err = dt_comm_isend(p->tied, p->wte_send, p->wte_n, DT_F32, 0, &p->wte_req);
}

/* First stage, before the embedding's last backward: the head's part added (to zeros with one micro-batch: the
 * sum one process makes, in its order). */
static void before_backward(int unit, void *ctx) {
    dt_pipeline *p = ctx;
    if (!p->last_b || unit != 0 || p->hook_err) return;
    p->hook_err = dt_comm_recv(p->tied, p->wte_recv, p->wte_n, DT_F32, 1);
    float *g = dt_program_grads(p->c.model) + p->wte_off;
    for (size_t i = 0; i < p->wte_n && !p->hook_err; i++) g[i] += p->wte_recv[i];
}

/* A posted send (if any) through; the request is gone either way. */
static dt_status sent(dt_request **req) {
    dt_status st = *req ? dt_wait(*req) : DT_OK;
    *req = NULL;
    return st;
}

/* ---- the wire: f32 as it is, or coded (pp_wire.c) into wout, received into win and decoded ---- */

/* The message carrying out on (1) or back (0): out itself, or its coding (in wout[on]: its last send is through). */
static const void *wire_msg(dt_pipeline *p, const float *out, int on, size_t *count, dt_dtype *t) {
    if (p->c.wire == DT_PP_WIRE_F32) { *count = p->stream, *t = DT_F32; return out; }
    dt_pp_wire_encode(p->c.wire, out, p->stream, p->row, p->wout[on]);
    *count = p->words, *t = DT_I32;
    return p->wout[on];
}

/* Where a message for in lands: in itself, or win (then wire_landed decodes it into in). */
static void *wire_land(dt_pipeline *p, float *in, size_t *count, dt_dtype *t) {
    if (p->c.wire == DT_PP_WIRE_F32) { *count = p->stream, *t = DT_F32; return in; }
    *count = p->words, *t = DT_I32;
    return p->win;
}

static void wire_landed(dt_pipeline *p, const void *msg, float *in) {
    if (p->c.wire != DT_PP_WIRE_F32) dt_pp_wire_decode(p->c.wire, msg, p->stream, p->row, in);
}

static dt_status wire_recv(dt_pipeline *p, dt_comm *c, float *in, int peer) {
    size_t n;
    dt_dtype t;
    void *land = wire_land(p, in, &n, &t);
    dt_status st = dt_comm_recv(c, land, n, t, peer);
    if (!st) wire_landed(p, land, in);
    return st;
}

static dt_status wire_send(dt_pipeline *p, dt_comm *c, const float *out, int on, int peer) {
    size_t n;
    dt_dtype t;
    const void *msg = wire_msg(p, out, on, &n, &t);
    return dt_comm_send(c, msg, n, t, peer);
}

/* A mailbox's message of kind (0 activations, 1 gradients): read where it lies (rx), or decoded into in and released. */
static dt_status mailbox_get(dt_pipeline *p, int kind, float *in) {
    dt_mailbox *b = p->box[kind][kind];
    dt_status st = dt_mailbox_get(b, (const void **)&p->rx[kind]);
    if (st || p->c.wire == DT_PP_WIRE_F32) return st;
    wire_landed(p, p->rx[kind], in);
    dt_mailbox_release(b);
    p->rx[kind] = NULL;
    return DT_OK;
}

/* Posts a send on to the next stage (on) or back, once the last one that way has been received; what it sends
 * stays in the slot until then (the slot is not reused before the neighbour's answer to it), or is copied out (a
 * coded wire's message is its own copy). */
static dt_status async_send(dt_pipeline *p, const float *out, int on) {
    dt_status st = sent(&p->sending[on]);
    if (st) return st;
    if (!on && p->gsend && p->c.wire == DT_PP_WIRE_F32) out = memcpy(p->gsend, out, p->stream * sizeof(float));
    size_t n;
    dt_dtype t;
    const void *msg = wire_msg(p, out, on, &n, &t);
    return dt_comm_isend(p->link[on][!on], msg, n, t, on, &p->sending[on]);
}

static dt_status exchange(dt_pipeline *p, const dt_pp_action *a) {
    const dt_program *m = p->c.model;
    const float *out = NULL;
    if (a->send.peer >= 0) {
        const int32_t *tok;
        int n;
        out = a->send.grad ? dt_program_input_grad(m, &tok, &n) : dt_program_output(m);
        if (!out) return dt_error(DT_ERR_ARG, "pipeline stage %d: nothing to send to stage %d", p->stage, a->send.peer);
    }
    float *in = a->recv.peer < 0 ? NULL : a->recv.grad ? p->dout : p->xin;
    DT_TRACE_BEGIN(DT_TRACK_COMM, "pipeline", "\"send\":%d,\"recv\":%d", a->send.peer, a->recv.peer);
    dt_status st;
    int on = !a->send.grad;
    if (dt_pipeline_mailboxes(p)) {
        /* activations go on (side 1) and come from before (side 0); gradients the other way */
        size_t n;
        dt_dtype t;
        st = out ? dt_mailbox_put(p->box[on][a->send.grad], wire_msg(p, out, on, &n, &t)) : DT_OK;
        if (!st && in) st = mailbox_get(p, a->recv.grad, in);
    } else if (p->s->async) {
        /* activations come from the stage before, gradients from the one after (its rank in the link: 0, 1) */
        st = out ? async_send(p, out, on) : wire_recv(p, p->link[a->recv.grad][a->recv.grad], in, a->recv.grad);
    } else if (out && in) {
        /* on this thread: a progress thread's wait beside this one's would spin on the core the next stage computes on */
        size_t n, m;
        dt_dtype t;
        const void *msg = wire_msg(p, out, on, &n, &t);
        void *land = wire_land(p, in, &m, &t);
        st = dt_comm_sendrecv(p->c.pp, msg, n, a->send.peer, land, m, a->recv.peer, t);
        if (!st) wire_landed(p, land, in);
    } else if (out) {
        st = wire_send(p, p->c.pp, out, on, a->send.peer);
    } else {
        st = wire_recv(p, p->c.pp, in, a->recv.peer);
    }
    DT_TRACE_END(DT_TRACK_COMM);
    if (st) {
        char what[192] = "";
        if (a->send.peer >= 0) snprintf(what, sizeof what, "sending micro-batch %d's %s to stage %d", a->send.micro,
                                        a->send.grad ? "gradient" : "activations", a->send.peer);
        if (a->recv.peer >= 0) snprintf(what + strlen(what), sizeof what - strlen(what), "%sreceiving micro-batch %d's %s from stage %d",
                                        what[0] ? " and " : "", a->recv.micro, a->recv.grad ? "gradient" : "activations", a->recv.peer);
        return dt_error(st, "pipeline stage %d, %s: %s", p->stage, what, dt_last_error());
    }
    return DT_OK;
}

static dt_status forward(dt_pipeline *p, const dt_pp_action *a, double *loss_sum, int *nloss) {
    const int32_t *tok = NULL, *tg = NULL;
    size_t BT = (size_t)p->c.B * p->c.T;
    /* a micro-batch is read once, at its first chunk (the loaders of all stages stay together) */
    dt_status st = a->chunk == 0 ? p->c.batch(p->c.batch_ctx, a->micro, &tok, &tg) : DT_OK;
    if (st) return st;
    if (p->targets && a->chunk == 0) memcpy(p->targets + (size_t)a->slot * BT, tg, BT * sizeof(int32_t));
    if (p->targets) tg = p->targets + (size_t)a->slot * BT;
    float loss = 0;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "F", "\"micro\":%d", a->micro);
    dt_program_use_slot(p->c.model, a->slot);
    int ua = p->ca[a->chunk], ub = p->cb[a->chunk];
    st = dt_program_forward_units(p->c.model, ua, ub, tok, ua > 0 ? (p->rx[0] ? p->rx[0] : p->xin) : NULL, tg, p->c.B, p->c.T, &loss);
    DT_TRACE_END(DT_TRACK_COMPUTE);
    p->fwd += dt_time_now() - t0;
    if (p->rx[0]) { dt_mailbox_release(p->box[0][0]); p->rx[0] = NULL; } /* the model has its own copy now */
    if (ub == p->L + 2) { *loss_sum += loss; ++*nloss; }
    return st;
}

/* B (the whole backward unless it is split) or W. */
static dt_status backward(dt_pipeline *p, const dt_pp_action *a, float grad_scale) {
    double t0 = dt_time_now();
    int w = a->op == DT_PP_W;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, w ? "W" : "B", "\"micro\":%d", a->micro);
    dt_program_use_slot(p->c.model, a->slot);
    p->last_b = a->last;
    dt_status st = dt_program_use_chunk(p->c.model, a->chunk);
    const float *dout = p->rx[1] ? p->rx[1] : p->dout;
    if (!st) st = w ? dt_program_backward_weights(p->c.model)
                    : dt_program_backward_units(p->c.model, p->cb[a->chunk] < p->L + 2 ? dout : NULL, grad_scale);
    if (!w && p->rx[1]) { dt_mailbox_release(p->box[1][1]); p->rx[1] = NULL; }
    p->last_b = 0;
    DT_TRACE_END(DT_TRACK_COMPUTE);
    *(w ? &p->wgt : &p->bwd) += dt_time_now() - t0;
    if (!st && p->hook_err) st = p->hook_err;
    p->hook_err = DT_OK;
    return st;
}

static dt_status run(void *ctx, const dt_step_control *step, int accum, float grad_scale, double *loss_sum, int *nloss) {
    dt_pipeline *p = ctx;
    if (accum != p->c.micro)
        return dt_error(DT_ERR_ARG, "pipeline: built for %d micro-batches a step, asked to run %d", p->c.micro, accum);
    double t0 = dt_time_now();
    p->fwd = p->bwd = p->wgt = 0;
    *loss_sum = 0;
    *nloss = 0;
    dt_status st = DT_OK;
    for (int i = 0; i < p->s->n[p->stage] && !st; i++) {
        const dt_pp_action *a = &p->s->act[p->stage][i];
        if (a->op != DT_PP_COMM) step->begin_micro(step->step, a->op == DT_PP_F ? DT_MICRO_FORWARD : a->last ? DT_MICRO_SYNC : DT_MICRO_ACCUMULATE);
        double busy = p->fwd + p->bwd + p->wgt;
        st = a->op == DT_PP_COMM ? exchange(p, a) : a->op == DT_PP_F ? forward(p, a, loss_sum, nloss) : backward(p, a, grad_scale);
        p->took[i] = p->fwd + p->bwd + p->wgt - busy;
    }
    /* chunks end their backwards at different times: their gradients are announced (data parallelism reduces them)
     * once the last is through, as part of the stage's last backward */
    if (p->v > 1 && !st) {
        p->last_b = 1;
        dt_program_announce_grads(p->c.model);
        p->last_b = 0;
        if (p->hook_err) st = p->hook_err;
        p->hook_err = DT_OK;
    }
    /* the step's sends have arrived (on: to the next stage around the ring, else the one before) */
    for (int on = 0; on < 2; on++) {
        dt_status s2 = sent(&p->sending[on]);
        if (!st && s2)
            st = dt_error(s2, "pipeline stage %d, sending to stage %d: %s", p->stage, (p->stage + (on ? 1 : p->p - 1)) % p->p, dt_last_error());
    }
    /* the head's gradient of wte has arrived once the first stage's last backward is through */
    dt_status s2 = sent(&p->wte_req);
    if (!st && s2) st = dt_error(s2, "pipeline stage %d, sending wte's head gradient to stage 0: %s", p->stage, dt_last_error());
    p->total = dt_time_now() - t0;
    return st;
}

dt_status dt_pipeline_forward_only(dt_pipeline *p, int n, dt_pp_batch_fn batch, void *ctx, double *loss_sum, int *nloss) {
    *loss_sum = 0;
    *nloss = 0;
    dt_program_use_slot(p->c.model, 0);
    dt_status st = DT_OK;
    for (int k = 0; k < n && !st; k++) {
        const int32_t *tok = NULL, *tg = NULL;
        st = batch(ctx, k, &tok, &tg);
        /* a chain: each stage receives micro-batch k, runs a chunk and passes it on, the last stage back to the first
         * for its next chunk (no cycle: no deadlock) */
        for (int j = 0; j < p->v && !st; j++) {
            int ua = p->ca[j], ub = p->cb[j], from = p->stage > 0 ? p->stage - 1 : p->p - 1, to = (p->stage + 1) % p->p;
            float loss = 0;
            if (ua > 0) st = wire_recv(p, p->c.pp, p->xin, from);
            if (!st) st = dt_program_forward_units(p->c.model, ua, ub, tok, ua > 0 ? p->xin : NULL, tg, p->c.B, p->c.T, &loss);
            if (!st && ub < p->L + 2) st = wire_send(p, p->c.pp, dt_program_output(p->c.model), 1, to);
            if (!st && ub == p->L + 2) { *loss_sum += loss; ++*nloss; }
        }
    }
    dt_program_release_activations(p->c.model); /* no backward follows: the chunks' areas are free for training's */
    if (st) return dt_error(st, "pipeline stage %d, forward only: %s", p->stage, dt_last_error());
    return DT_OK;
}

/* After the update: the owner's wte to the last stage's copy. A strategy
 * that keeps only its shard between steps (ZeRO-3 with a copy per rank)
 * has the whole store for the exchange (collective over the stage's
 * data-parallel ranks, which all come here). */
static dt_status after_update(void *ctx, const dt_step_control *step) {
    dt_pipeline *p = ctx;
    if (!p->tied) return DT_OK;
    int sharded = step->params_sharded(step->step);
    dt_status st = sharded ? step->materialize(step->step, 1) : DT_OK;
    float *w = dt_program_params(p->c.model) + p->wte_off;
    if (!st) st = p->stage == 0 ? dt_comm_send(p->tied, w, p->wte_n, DT_F32, 1) : dt_comm_recv(p->tied, w, p->wte_n, DT_F32, 0);
    if (st) return dt_error(st, "pipeline stage %d, %s wte %s stage %d: %s", p->stage, p->stage ? "receiving" : "sending",
                            p->stage ? "from" : "to", p->stage ? 0 : p->p - 1, dt_last_error());
    return sharded ? step->materialize(step->step, 0) : DT_OK;
}

static dt_status tie(dt_pipeline *p) {
    if (dt_program_config(p->c.model)->untied) return DT_OK; /* the head is its own tensor: nothing to keep equal */
    if (dt_program_lora_config(p->c.model)) return DT_OK; /* LoRA's base, the table with it, is frozen */
    /* collective over the stages: the first and last form the tied pair */
    int in = p->p > 1 && (p->stage == 0 || p->stage == p->p - 1);
    dt_comm *c;
    dt_status st = dt_comm_split(p->c.pp, in ? 0 : 1, p->stage, &c);
    if (st) return st;
    if (!in) { dt_comm_destroy(c); return DT_OK; }
    p->tied = c;
    dt_model v;
    dt_program_model(p->c.model, &v);
    const dt_tensor_info *t = dt_model_find(&v, "wte");
    if (!t) return dt_error(DT_ERR_ARG, "pipeline stage %d holds no wte", p->stage);
    p->wte_off = t->offset;
    p->wte_n = t->count;
    float **buf = p->stage == 0 ? &p->wte_recv : &p->wte_send;
    if (!(*buf = malloc(p->wte_n * sizeof(float)))) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory for wte's gradient");
    if (p->stage == 0) dt_program_set_unit_hooks(p->c.model, NULL, before_backward, p);
    else dt_program_set_grad_hook(p->c.model, after_backward, p);
    return DT_OK;
}

/* A mailbox on each link where every link of the pipeline is inside one machine (collective over the stages);
 * elsewhere none, and messages go through the links' point-to-point calls. */
static dt_status mailboxes(dt_pipeline *p) {
    int edges = p->v > 1 ? p->p : p->p - 1;
    bool mine = true, all = false;
    /* edge by edge, as links() made them (each creation is collective over its link) */
    for (int e = 0; e < edges; e++)
        for (int kind = 0; kind < 2; kind++) {
            int side = p->stage == e ? 1 : p->stage == (e + 1) % p->p ? 0 : -1;
            if (side < 0) continue;
            /* the first stage of an edge (rank 0 of its link) sends activations; the second sends gradients */
            size_t bytes = p->c.wire == DT_PP_WIRE_F32 ? p->stream * sizeof(float) : p->words * sizeof(uint32_t);
            dt_status st = dt_mailbox_create(p->link[side][kind], kind, bytes, 2, &p->box[side][kind]);
            if (st == DT_ERR_ARG || st == DT_ERR_NOMEM) mine = false; /* across machines, or no room: both ends see the same */
            else if (st) return st;
        }
    dt_status st = dt_comm_every(p->c.pp, mine, &all);
    if (st || all) return st;
    for (int i = 0; i < 4; i++) {
        dt_mailbox_destroy(p->box[i / 2][i % 2]);
        p->box[i / 2][i % 2] = NULL;
    }
    return DT_OK;
}

/* The two-rank links, one per edge of the chain of stages (of the ring, when chunks wrap from the last stage to the
 * first) and direction (collective over the stages): edge e joins stage e (rank 0 in it) to the next. */
static dt_status links(dt_pipeline *p) {
    int edges = p->v > 1 ? p->p : p->p - 1;
    for (int e = 0; e < edges; e++)
        for (int kind = 0; kind < 2; kind++) {
            int next = (e + 1) % p->p, in = p->stage == e || p->stage == next;
            dt_comm *c = NULL;
            dt_status st = dt_comm_split(p->c.pp, in ? 0 : -1, p->stage == e ? 0 : 1, &c);
            if (st) return st;
            if (c) p->link[p->stage == e][kind] = c; /* this stage first in the edge: the link to the stage after it */
        }
    return DT_OK;
}

dt_status dt_pipeline_create(const dt_pipeline_config *c, dt_pipeline **out) {
    *out = NULL;
    dt_pipeline *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    p->c = *c;
    p->stage = dt_comm_rank(c->pp);
    p->p = dt_comm_size(c->pp);
    p->L = dt_program_config(c->model)->num_layers;
    int v = c->virt > 1 ? c->virt : 1, held = dt_program_chunks(c->model, p->ca, p->cb);
    p->v = v;
    if (held != v) {
        free(p);
        return dt_error(DT_ERR_ARG, "pipeline: the stage's model holds %d chunks, the schedule runs %d", held, v);
    }
    dt_model view;
    dt_program_model(c->model, &view);
    const dt_model_part *part = view.part;
    p->stream = (size_t)c->B * c->T * (size_t)dt_program_config(c->model)->channels / (part->sp ? (size_t)part->tp_size : 1);
    if ((unsigned)c->wire > DT_PP_WIRE_INT8) {
        free(p);
        return dt_error(DT_ERR_ARG, "pipeline: unknown wire %d", (int)c->wire);
    }
    p->row = (size_t)dt_program_config(c->model)->channels;
    p->words = dt_pp_wire_words(c->wire, p->stream, p->row);
    p->ms = (dt_micro_schedule){ run, after_update, p };
    dt_status st = dt_pp_schedule_create(c->kind, p->p, c->virt > 1 ? c->virt : 1, c->micro, &p->s);
    for (int i = 0; i < 3 && !st && c->wire != DT_PP_WIRE_F32; i++) {
        uint32_t **w = i < 2 ? &p->wout[i] : &p->win;
        if (!(*w = calloc(p->words ? p->words : 1, sizeof **w))) st = dt_error(DT_ERR_NOMEM, "pipeline: out of memory for the wire's messages");
    }
    if (!st && p->p > 1) st = links(p);
    if (!st && p->p > 1) st = mailboxes(p);
    if (!st && p->v > 1 && (!(p->gsend = malloc(p->stream * sizeof(float))) ||
                            !(p->targets = malloc(sizeof(int32_t) * (size_t)c->B * c->T * (size_t)p->s->slots[p->stage]))))
        st = dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    if (!st) dt_program_hold_grad_hooks(c->model, p->v > 1);
    if (!st) st = dt_program_set_split_backward(c->model, c->kind == DT_PP_ZB1);
    if (!st) st = dt_program_set_slots(c->model, p->s->slots[p->stage]);
    if (!st) {
        p->xin = malloc(p->stream * sizeof(float));
        p->dout = malloc(p->stream * sizeof(float));
        p->took = calloc((size_t)p->s->n[p->stage], sizeof *p->took);
        if (!p->xin || !p->dout || !p->took) st = dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    }
    if (!st) st = tie(p);
    if (st) { dt_pipeline_destroy(p); return st; }
    *out = p;
    return DT_OK;
}

void dt_pipeline_destroy(dt_pipeline *p) {
    if (!p) return;
    sent(&p->wte_req);
    for (int i = 0; i < 4; i++) {
        if (i < 2) sent(&p->sending[i]);
        dt_mailbox_destroy(p->box[i / 2][i % 2]);
        if (p->link[i / 2][i % 2]) dt_comm_destroy(p->link[i / 2][i % 2]);
    }
    dt_program_set_split_backward(p->c.model, 0);
    dt_program_hold_grad_hooks(p->c.model, 0);
    free(p->gsend);
    free(p->targets);
    free(p->wout[0]);
    free(p->wout[1]);
    free(p->win);
    if (p->tied) {
        if (p->stage == 0) dt_program_set_unit_hooks(p->c.model, NULL, NULL, p);
        else dt_program_set_grad_hook(p->c.model, NULL, p);
        dt_comm_destroy(p->tied);
    }
    dt_pp_schedule_destroy(p->s);
    free(p->xin);
    free(p->took);
    free(p->dout);
    free(p->wte_send);
    free(p->wte_recv);
    free(p);
}

const dt_micro_schedule *dt_pipeline_schedule(dt_pipeline *p) { return &p->ms; }
int dt_pipeline_mailboxes(const dt_pipeline *p) { return p->box[0][0] || p->box[1][0]; }
size_t dt_pipeline_buffer_bytes(const dt_pipeline *p) { return p && (p->wte_send || p->wte_recv) ? p->wte_n * sizeof(float) : 0; }
const dt_pp_schedule *dt_pipeline_actions(const dt_pipeline *p) { return p->s; }

void dt_pipeline_times(const dt_pipeline *p, double *fwd, double *bwd, double *wgt) { *fwd = p->fwd, *bwd = p->bwd, *wgt = p->wgt; }

dt_status dt_pipeline_bubble(dt_pipeline *p, double *bubble, double *model) {
    size_t *counts = malloc(sizeof *counts * (size_t)p->p), n = 0;
    for (int s = 0; counts && s < p->p; s++) n += counts[s] = (size_t)p->s->n[s];
    double mine[2] = { p->fwd + p->bwd + p->wgt, p->total }, *all = malloc(sizeof *all * 2 * (size_t)p->p), *took = malloc(sizeof *took * n);
    dt_status st = counts && all && took ? dt_comm_allgather(p->c.pp, mine, all, 2, DT_F64) : dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    /* every stage's actions' seconds, to replay the step */
    if (!st) st = dt_comm_allgatherv(p->c.pp, p->took, took, counts, DT_F64);
    double busy = 0, span = 0;
    for (int s = 0; s < p->p && !st; s++) {
        busy += all[2 * s];
        if (all[2 * s + 1] > span) span = all[2 * s + 1];
    }
    *bubble = st || span <= 0 ? 0 : 1 - busy / (span * p->p);
    *model = st ? 0 : dt_pp_schedule_bubble_replay(p->s, took);
    free(counts);
    free(all);
    free(took);
    return st;
}
