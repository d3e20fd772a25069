/* ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
 * Trillion Parameter Models", 2020) as strategies of the engine.
 *
 * Stage 1: the optimizer state is sharded. The flat store is cut
 * into one contiguous shard per rank (sizes differ by at most one element,
 * so any number of ranks works). The gradients are averaged as DDP averages
 * them, bucket by bucket with allreduces overlapped with backward
 * (dt_ddp); each rank updates only its shard, with only its shard of the
 * optimizer state (Adam: 8 bytes per parameter / N instead of 8): like DDP,
 * inside backward bucket by bucket where it can (SGD, AdamW, no clipping),
 * else after it. Then the ranks allgather the updated parameters, so every
 * rank again holds the whole model for the next forward. The global gradient norm (clipping) is
 * the sum of the shards' squares, allreduced; so are LAMB's and LARS's
 * per-tensor sums of squares, since a shard boundary may cut a tensor and
 * its trust ratio must come from the whole tensor's norms.
 *
 * Model states per rank for fp32 Adam: 4 (parameters) + 4 (gradients) +
 * 8/N (optimizer) bytes per parameter; DDP holds 16.
 *
 * Stage 2: the gradients are sharded too. Each bucket is reduced to the
 * owners of the shards it crosses (the shards given to dt_ddp_create) instead of
 * allreduced, and once done, the rest of it goes back to the system: a rank
 * holds its shard of the gradient and the buckets in flight, 4/N bytes per
 * parameter instead of 4. The updated parameters are gathered as in stage 1.
 *
 * Stage 3: the parameters are sharded too. A rank's store keeps its own
 * shard; every other tensor is gathered (a broadcast from each owner of a
 * piece of it, into place) just before the unit that reads it runs forward,
 * and again before its backward, the next unit's gathers issued meanwhile
 * (prefetch), and it goes back to the system as soon as neither this unit
 * nor the next reads it. Forward of unit u reads u's tensors and those whose
 * gradient is final at u (GPT-2's head reads the tied wte); backward of u
 * reads those whose gradient is final at u (an embedding's backward reads
 * none of its values, so wte is not gathered again for unit 0, when its
 * owner may already be updating it inside backward). A model without unit
 * hooks (the MLP) gathers everything before a step's first forward. Gradients
 * as in stage 2; after the update nothing is gathered: the next forward does
 * it. Model states: 16/N bytes per parameter plus the units in flight.
 *
 * One machine: when every rank is local, they keep one copy of the
 * parameters in the shared arena instead (moved there at the first step,
 * each rank copying its shard). Each rank updates its shard in place and
 * after_update is a barrier: nothing is gathered at any stage, and the
 * machine holds the parameters once. The update inside backward may write
 * a bucket's part as soon as its reduction is done, since a reduction ends
 * only after every rank's backward of those units, and backward reads a
 * tensor only at its gradient's unit. DTRAIN_ZERO_PRIVATE_PARAMS=1 keeps a
 * copy per rank, as ranks on several machines do (the tests use it).
 *
 * With a 16-bit gradient store (dt_engine_config.grad_store, mixed
 * precision) stages 2 and 3 keep only their shard's average, in 16 bits:
 * 2/N bytes per parameter; stage 1 the whole average, 2 (dt_ddp_set_grad_store).
 *
 * Stages 1 and 2 with each rank's own parameters under mixed precision keep
 * the f32 master only in the shard: the updated shard goes into the model's
 * 16-bit copy, which is allgathered (2 bytes a parameter whole, 4/N of
 * f32), and the few tensors the model reads in f32 (f32_read: LayerNorms,
 * embedding tables) are gathered as their unit runs, with stage 3's
 * machinery. Model states: 2 + 2 (or 2/N) + 12/N.
 *
 * A pipeline's last stage ends its store with its copy of the tied wte,
 * whose gradient goes to the first stage and whose values come back from
 * there after the update (dt_model_tied_tail): the stages leave it out of
 * their shards (zero_shards.h), so no rank keeps state for it; stage 3
 * holds it whole on each rank (the head's forward and backward would
 * gather it whole; whole, it is never sent), and a sharded master, which
 * gathers its 16-bit copy, keeps it in.
 *
 * The three stages give the losses of DDP and of one process up to the
 * rounding of the reductions (tests/zero_equivalence.sh). */
#include "dtrain/parallel.h"
#include "dtrain/kernels.h"
#include "zero_shards.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK = 1 << 22 }; /* floats per rank per allgather of the parameters (16 MiB) */
enum { ABSENT = 0, IN_FLIGHT, RESIDENT }; /* stage 3: a tensor's other shards' pieces on this rank */

/* A way of holding the parameters that is set up at the first step (the shared arena, the shards, the 16-bit copy
 * are ready only then): not used, waiting for the first step, in use. */
typedef enum { OFF, AT_FIRST_STEP, IN_USE } setup_state;

typedef struct {
    const dt_engine_config *c;
    int stage;
    dt_ddp *d;           /* the gradients' averaging */
    dt_codec *codec;     /* its gradient codec (NULL: none) */
    dt_zero_shards sh;   /* the ranks' shards; with one region (no experts spread over ranks) sh.r[0]'s order is the
                          * store's, and this rank's shard the one run [sh.r[0].off, + sh.r[0].n) */
    float *mine, *all;   /* stages 1, 2: a piece of the updated shard, and every rank's piece, for the allgather */
    size_t piece;        /* floats per rank per allgather: CHUNK, or the largest shard if smaller (region_piece's largest) */
    size_t all_n;        /* floats of all: the most a region's ranks gather at once */
    int in_backward;     /* the shard updated bucket by bucket inside backward */
    dt_optim *opt;       /* then: the optimizer it updates with */
    /* stage 3 */
    float *P;            /* the store: this rank's shard, and the tensors gathered for now */
    int nt;
    uint8_t *state, *keep; /* per tensor: ABSENT, IN_FLIGHT, RESIDENT; this visit's wish */
    dt_request **req;    /* per tensor, one per rank (a piece each) */
    size_t held, held_max; /* floats of other shards resident now, and at most */
    int whole;           /* no unit hooks: everything gathered for the step */
    /* every rank on one machine: one copy of the parameters in the shared arena */
    float *shared;
    setup_state shared_params; /* OFF: each rank its own copy; else one shared copy (from the first step) */
    /* stages 1, 2 with each rank's own parameters, mixed precision: the f32 master only in the shard, the
     * whole 16-bit copy allgathered after each update (from the first step) */
    setup_state sharded_master;
    uint16_t *lp;
    dt_dtype lpt;
    dt_status err;       /* from a hook, reported at finish */
} zero;

static void z_destroy(void *state) {
    zero *z = state;
    if (!z) return;
    if (z->req) {
        /* gathers in flight must end before their buffers go */
        for (int t = 0; t < z->nt; t++) (void)dt_waitall(z->req + (size_t)t * (size_t)dt_comm_size(z->c->comm), dt_comm_size(z->c->comm));
    }
    /* (as stage 3's, the model's f32 store then holds this rank's shard: materialize first to use it whole) */
    if (((z->stage == 3 && !z->whole) || z->sharded_master != OFF) && z->c->model.set_unit_hooks) z->c->model.set_unit_hooks(z->c->model.self, NULL, NULL, z);
    dt_ddp_destroy(z->d);
    dt_codec_destroy(z->codec);
    dt_zero_shards_destroy(&z->sh);
    free(z->mine);
    free(z->all);
    free(z->state);
    free(z->keep);
    free(z->req);
    free(z);
}

static void before_forward(int unit, void *ctx);
static void before_backward(int unit, void *ctx);
static dt_status release(zero *z, int t);
static dt_status gather_start(zero *z, int t);
static dt_status gather_wait(zero *z, int t);
static void nothing_to_gather(int unit, void *ctx) { (void)unit, (void)ctx; }

/* Region g's largest shard; floats per rank per allgather of it: CHUNK, or that shard if smaller. */
static size_t region_most(const dt_zero_region *g) {
    size_t most = 0;
    for (int r = 0; r < dt_zero_region_size(g); r++) most = g->counts[r] > most ? g->counts[r] : most;
    return most;
}

static size_t piece_of(size_t most) { return most < CHUNK ? most : CHUNK; }
static size_t region_piece(const dt_zero_region *g) { return piece_of(region_most(g)); }

/* Every rank's shard of store (elements of size bytes, type t) to every rank,
 * region by region, in pieces of at most z->piece elements of every shard at a
 * time through two small buffers (a whole shard's staging would cost 4/N bytes
 * per parameter). */
static dt_status allgather_shards(zero *z, void *store, size_t size, dt_dtype t) {
    char *mine = (char *)z->mine, *all = (char *)z->all; /* room for floats, the widest */
    dt_status st = DT_OK;
    for (int k = 0; k < z->sh.nr && !st; k++) {
        const dt_zero_region *g = &z->sh.r[k];
        if (!g->comm) continue; /* this rank alone holds it */
        int np = dt_comm_size(g->comm);
        size_t most = region_most(g), counts[np], K = piece_of(most);
        for (size_t at = 0; at < most && !st; at += K) {
            size_t o = 0, n = g->n > at ? (g->n - at < K ? g->n - at : K) : 0;
            for (int r = 0; r < np; r++) counts[r] = g->counts[r] > at ? (g->counts[r] - at < K ? g->counts[r] - at : K) : 0;
            dt_zero_region_copy(g, store, mine, g->off + at, n, size, 1);
            if ((st = dt_comm_allgatherv(g->comm, mine, all, counts, t))) break;
            for (int r = 0; r < np; r++) {
                dt_zero_region_copy(g, store, all + o * size, g->offs[r] + at, counts[r], size, 0);
                o += counts[r];
            }
        }
    }
    return st;
}
static void f32_reads(int unit, void *ctx);
static size_t others(const zero *z, int t);

/* Stage 3's (and a sharded f32 master's) pieces of other shards, tensor by
 * tensor: every tensor is whole on every rank until the first gathers (the
 * model was built or loaded whole). */
static dt_status pieces_create(zero *z) {
    int p = dt_comm_size(z->c->comm);
    z->P = z->c->model.params(z->c->model.self);
    z->nt = z->c->model.ntensors;
    z->state = malloc((size_t)z->nt + 1);
    z->keep = calloc((size_t)z->nt + 1, 1);
    z->req = calloc((size_t)z->nt * (size_t)p + 1, sizeof *z->req);
    if (!z->state || !z->keep || !z->req) return dt_error(DT_ERR_NOMEM, "zero%d: out of memory", z->stage);
    memset(z->state, RESIDENT, (size_t)z->nt + 1);
    for (int t = 0; t < z->nt; t++) z->held += others(z, t);
    return DT_OK;
}
static size_t others(const zero *z, int t);

/* Where the parameters live between steps: one copy shared by the machine's ranks (each writes its shard of it, the
 * others read it there: nothing to gather); below stage 3 a copy per rank, gathered a piece at a time (and with a
 * 16-bit model, the f32 master sharded from the first step); stage 3 keeps its shard, gathered unit by unit. Chosen
 * before the shards are cut (a sharded master keeps a last stage's tied copy in them: its 16-bit copy is gathered). */
static void choose_copies(zero *z) {
    const dt_engine_config *c = z->c;
    dt_dtype t;
    /* (with experts spread over ranks each holds its own at the same places of the store: a copy per rank) */
    z->shared_params = dt_zero_shares_params(c->comm) && c->model.set_param_storage && c->ep <= 1 ? AT_FIRST_STEP : OFF;
    if (z->shared_params == OFF && z->stage < 3 && c->model.lp_copy && c->model.set_unit_hooks &&
        (z->lp = c->model.lp_copy(c->model.self, 0, &t))) {
        z->sharded_master = AT_FIRST_STEP;
        z->lpt = t;
    }
}

static dt_status copies_create(zero *z) {
    const dt_engine_config *c = z->c;
    int stage = z->stage;
    if (z->shared_params != OFF) return dt_comm_alloc_shared(c->comm, c->model.nparams * sizeof(float), (void **)&z->shared);
    if (stage == 3) {
        z->whole = !c->model.set_unit_hooks;
        return pieces_create(z);
    }
    for (int k = 0; k < z->sh.nr; k++) {
        size_t K = region_piece(&z->sh.r[k]), A = (K + 1) * (size_t)dt_zero_region_size(&z->sh.r[k]);
        z->piece = K > z->piece ? K : z->piece;
        z->all_n = A > z->all_n ? A : z->all_n;
    }
    z->mine = malloc(sizeof *z->mine * (z->piece + 1));
    z->all = malloc(sizeof *z->all * z->all_n);
    if (!z->mine || !z->all) return dt_error(DT_ERR_NOMEM, "zero%d: out of memory", stage);
    return z->sharded_master != OFF ? pieces_create(z) : DT_OK;
}

/* The model's unit hooks for where its parameters live: stage 3's pieces gathered before each unit's forward and
 * backward; a sharded master's 16-bit copy read from f32; one shared copy with a mixed-precision model made unit by
 * unit too, so that no rank holds the whole 16-bit model (16/N bytes a parameter, as stage 3 is). */
static void set_hooks(zero *z) {
    const dt_model *m = &z->c->model;
    if (z->stage == 3 && !z->whole && z->shared_params == OFF) m->set_unit_hooks(m->self, before_forward, before_backward, z);
    if (z->sharded_master != OFF) m->set_unit_hooks(m->self, f32_reads, nothing_to_gather, z);
    if (z->stage == 3 && z->shared_params != OFF && m->set_unit_hooks) m->set_unit_hooks(m->self, nothing_to_gather, nothing_to_gather, z);
}

static dt_status z_create(const dt_engine_config *c, int stage, void **state, size_t *off, size_t *n) {
    if (!c->comm) return DT_OK; /* one process: its shard is everything (state NULL) */
    zero *z = calloc(1, sizeof *z);
    if (!z) return dt_error(DT_ERR_NOMEM, "zero%d: out of memory", stage);
    z->c = c;
    z->stage = stage;
    choose_copies(z);
    /* a last stage's tied copy is left out of the shards: no optimizer state, no update (its values come from the first
     * stage after each update); stage 3 keeps it whole, as the head's forward and backward would gather it whole anyway
     * (a sharded master keeps it in its shards: its 16-bit copy is gathered) */
    dt_status st = dt_zero_shards_create(c, z->sharded_master == OFF, &z->sh);
    const dt_zero_region *all = &z->sh.r[0]; /* the whole store (but the tail) when one region: its order is the store's */
    if (!st) st = copies_create(z);
    /* stages 2 and 3 reduce each bucket to its shards' owners: in the store's order, or by region (after the experts) */
    bool one = z->sh.nr == 1;
    if (!st) st = dt_ddp_create(c->comm, &c->model, c->bucket_first, c->bucket_bytes, stage >= 2 && one ? all->offs : NULL,
                                stage >= 2 && one ? all->counts : NULL, &z->d);
    if (!st) st = dt_ddp_set_wire(z->d, c->grad_comm); /* stage 1 allreduces like ddp; 2 and 3 reduce to each shard's owner in 16 bits */
    /* a codec: its exchange averages a whole bucket on every rank (as DDP's, and ZeRO-1's); stages 2 and 3 keep their shard
     * of it and give the rest back once decoded. DGC's weight decay reads a bucket's parameters when it is compressed,
     * after stage 3 with a copy per rank gave back the other shards' pieces of its earlier units (one shared copy is whole) */
    if (!st && c->codec && c->codec->kind == DT_CODEC_DGC && c->codec->weight_decay > 0 && stage == 3 && z->shared_params == OFF && !z->whole)
        st = dt_error(DT_ERR_UNSUPPORTED, "--compress dgc --weight-decay %g with zero3 and a copy of the parameters per rank (ranks on "
                      "several machines, or DTRAIN_ZERO_PRIVATE_PARAMS): DGC adds the decay to each bucket's gradient from its parameters, "
                      "which this rank holds only in part by then; --weight-decay 0 or --zero 2", (double)c->codec->weight_decay);
    if (!st && c->codec && c->codec->kind != DT_CODEC_NONE) st = dt_codec_create(c->codec, c->model.tensors, c->model.ntensors, &z->codec);
    if (!st && z->codec) st = dt_ddp_set_codec(z->d, z->codec);
    /* a 16-bit gradient store: stage 1 keeps the whole averaged gradient (only the optimizer state is sharded,
     * 2 + 2 + 12/N), stages 2 and 3 their shard's */
    if (!st && c->grad_store != DT_F32)
        st = dt_ddp_set_grad_store(z->d, c->grad_store, stage == 1 ? 0 : all->off, stage == 1 ? c->model.nparams : all->n);
    /* (after the gradients' store and codec, which it checks) */
    if (!st && c->ep > 1) st = dt_ddp_set_experts(z->d, c->expert_comm, c->ep);
    if (!st && stage >= 2 && !one) st = dt_ddp_set_region_shards(z->d, &z->sh);
    /* stage 1 allreduces whole buckets: the copy's gradient (gone to the first stage, zeros) left out of them too */
    if (!st && stage == 1 && z->sh.tail_n) st = dt_ddp_leave_out_tied_copy(z->d);
    if (!st) set_hooks(z);
    if (st) { z_destroy(z); return st; }
    *off = z->sh.nr == 1 ? all->off : 0;
    *n = z->sh.nr == 1 ? all->n : all->n + z->sh.r[1].n;
    *state = z;
    return DT_OK;
}

int dt_zero_shares_params(dt_comm *dp) {
    const char *priv = getenv("DTRAIN_ZERO_PRIVATE_PARAMS");
    return dp && dt_comm_size(dp) > 1 && dt_comm_local_size(dp) == dt_comm_size(dp) && strcmp(dt_comm_transport(dp), "self") &&
           !(priv && atoi(priv) > 0);
}

static dt_status z1_create(const dt_engine_config *c, void **state, size_t *off, size_t *n) { return z_create(c, 1, state, off, n); }
static dt_status z2_create(const dt_engine_config *c, void **state, size_t *off, size_t *n) { return z_create(c, 2, state, off, n); }
static dt_status z3_create(const dt_engine_config *c, void **state, size_t *off, size_t *n) { return z_create(c, 3, state, off, n); }

/* ---- stage 3: the parameters' pieces on demand ---- */

/* The region holding tensor t. */
static const dt_zero_region *region_of(const zero *z, int t) { return &z->sh.r[z->sh.region[t]]; }

/* Floats of tensor t in other ranks' shards (none of a last stage's tied copy, which no shard holds). */
static size_t others(const zero *z, int t) {
    if (z->c->model.tensors[t].offset >= z->sh.tail_off) return 0;
    size_t a, b;
    dt_zero_piece(&z->sh, z->c->model.tensors, t, dt_zero_region_rank(region_of(z, t)), &a, &b);
    return z->c->model.tensors[t].count - (b - a);
}

/* Every rank of t's region issues the same broadcasts in the same order: each owner of a piece sends it into place. */
static dt_status gather_start(zero *z, int t) {
    if (z->state[t] != ABSENT) return DT_OK;
    const dt_zero_region *g = region_of(z, t);
    int p = dt_zero_region_size(g), stride = dt_comm_size(z->c->comm);
    for (int r = 0; r < p && g->comm; r++) {
        size_t a, b;
        dt_zero_piece(&z->sh, z->c->model.tensors, t, r, &a, &b);
        if (a == b) continue;
        dt_status st = dt_comm_ibroadcast(g->comm, z->P + a, b - a, DT_F32, r, &z->req[(size_t)t * (size_t)stride + (size_t)r]);
        if (st) return st;
    }
    z->state[t] = IN_FLIGHT;
    z->held += others(z, t);
    /* the most gathered at once during the steps (the whole model the first unit finds at the start does not count) */
    if (z->held > z->held_max) z->held_max = z->held;
    return DT_OK;
}

static dt_status gather_wait(zero *z, int t) {
    if (z->state[t] != IN_FLIGHT) return DT_OK;
    int stride = dt_comm_size(z->c->comm);
    z->state[t] = RESIDENT;
    return dt_waitall(z->req + (size_t)t * (size_t)stride, dt_zero_region_size(region_of(z, t)));
}

/* The other shards' pieces of t go back to the system. */
static dt_status release(zero *z, int t) {
    if (z->state[t] == ABSENT) return DT_OK;
    dt_status st = gather_wait(z, t);
    const dt_zero_region *g = region_of(z, t);
    int p = dt_zero_region_size(g), me = dt_zero_region_rank(g);
    for (int r = 0; r < p; r++) {
        size_t a, b;
        dt_zero_piece(&z->sh, z->c->model.tensors, t, r, &a, &b);
        if (r != me && a < b) dt_mem_release(z->P + a, (b - a) * sizeof(float));
    }
    z->held -= others(z, t);
    z->state[t] = ABSENT;
    return st;
}

/* Whether unit u's forward (backward) reads tensor t. */
static int reads(const dt_tensor_info *t, int backward, int u) {
    return t->grad_unit == u || (!backward && t->unit == u);
}

/* Before unit u runs: what it reads is gathered (waited for), what the next
 * unit reads is issued, everything else of other ranks goes back. */
static dt_status visit(zero *z, int backward, int u) {
    const dt_model *m = &z->c->model;
    int last = m->nunits - 1, nb = backward || u == last, nu = backward ? u - 1 : u == last ? u : u + 1;
    for (int t = 0; t < z->nt; t++)
        z->keep[t] = reads(&m->tensors[t], backward, u) ? 2 : nu >= 0 && reads(&m->tensors[t], nb, nu) ? 1 : 0;
    dt_status st = DT_OK;
    for (int t = 0; t < z->nt && !st; t++)
        if (!z->keep[t]) st = release(z, t);
    for (int want = 2; want >= 1 && !st; want--)
        for (int t = 0; t < z->nt && !st; t++)
            if (z->keep[t] == want) st = gather_start(z, t);
    for (int t = 0; t < z->nt && !st; t++)
        if (z->keep[t] == 2) st = gather_wait(z, t);
    return st;
}

static void hook(zero *z, int backward, int unit) {
    if (z->err) return;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "gather parameters", "\"unit\":%d,\"backward\":%d", unit, backward);
    z->err = visit(z, backward, unit);
    DT_TRACE_END(DT_TRACK_COMPUTE);
}

static void before_forward(int unit, void *ctx) { hook(ctx, 0, unit); }
static void before_backward(int unit, void *ctx) { hook(ctx, 1, unit); }

/* Every tensor whole on this rank (a model without unit hooks, a save). */
static dt_status gather_everything(zero *z) {
    dt_status st = DT_OK;
    for (int t = 0; t < z->nt && !st; t++) st = gather_start(z, t);
    for (int t = 0; t < z->nt && !st; t++) st = gather_wait(z, t);
    return st;
}

static dt_status release_everything(zero *z) {
    dt_status st = DT_OK;
    for (int t = 0; t < z->nt; t++) {
        dt_status s = release(z, t);
        if (!st) st = s;
    }
    return st;
}

/* ---- stages 1, 2 with a sharded f32 master (mixed precision, each rank its own parameters) ---- */

/* Before unit u's forward: the f32 values the model reads (its LayerNorms,
 * the embedding tables) gathered from their owners; the tables, read in
 * forward only, go back once the embedding has run. The LayerNorms stay
 * until the update (their backward reads them too). */
static void f32_reads(int unit, void *ctx) {
    zero *z = ctx;
    if (z->err || z->sharded_master != IN_USE) return;
    const dt_tensor_info *T = z->c->model.tensors;
    for (int t = 0; t < z->nt && !z->err; t++)
        if (T[t].f32_read && T[t].unit == unit) z->err = gather_start(z, t);
    for (int t = 0; t < z->nt && !z->err; t++)
        if (T[t].f32_read && T[t].unit == unit) z->err = gather_wait(z, t);
    for (int t = 0; t < z->nt && !z->err; t++)
        if (T[t].f32_read == 1 && T[t].unit < unit) z->err = release(z, t);
}

/* The first step: the 16-bit copy made from the whole f32 store (gathered
 * first: a resumed run may hold only its slice), which from now on this
 * strategy keeps current; then the other shards' f32 values go back. */
static dt_status shard_master(zero *z) {
    const dt_model *m = &z->c->model;
    dt_status st = gather_everything(z);
    if (st) return st;
    dt_lp_pack(z->lp, z->P, m->nparams, z->lpt);
    dt_dtype t;
    m->lp_copy(m->self, 1, &t);
    z->sharded_master = IN_USE;
    return release_everything(z);
}

/* After the update: this rank's shard in 16 bits to every rank (an
 * allgather of half the bytes of stage 1/2's f32 one), and what was gathered
 * of other shards in f32 goes back. */
static dt_status gather_lp(zero *z) {
    for (int k = 0; k < z->sh.nruns; k++) dt_lp_pack(z->lp + z->sh.runs[k].off, z->P + z->sh.runs[k].off, z->sh.runs[k].n, z->lpt);
    dt_status st = allgather_shards(z, z->lp, sizeof *z->lp, z->lpt), s = release_everything(z);
    return st ? st : s;
}

/* ---- every stage ---- */

/* As DDP: with an elementwise optimizer and nothing that needs the global
 * norm first, each bucket's part of this rank's shard is updated inside
 * backward as soon as its reduction is done (half the update on 2 ranks,
 * and overlapped); otherwise the engine updates the shard after backward. */
static dt_status z_attach(void *state, dt_optim *o) {
    zero *z = state;
    const dt_engine_config *c = z ? z->c : NULL;
    if (!z || c->step_at_end) return DT_OK; /* (the engine's rule: dt_engine_updates_in_backward) */
    z->in_backward = 1;
    z->opt = o;
    /* (this rank's runs with experts spread over ranks, in the order the engine's optimizer keeps them: z_ranges) */
    return dt_ddp_set_optimizer_runs(z->d, o, c->model.params(c->model.self), z->sh.runs, z->sh.nruns);
}

/* The first step moves the parameters into the one shared copy: each rank
 * its shard (a resumed run has loaded them whole into its own by now). */
static dt_status share_params(zero *z) {
    const dt_model *m = &z->c->model;
    const dt_zero_region *g = &z->sh.r[0]; /* (one region: the whole store but the tail) */
    const float *P = m->params(m->self);
    memcpy(z->shared + g->off, P + g->off, g->n * sizeof(float));
    /* the tail no shard holds (a last stage's tied copy, which the head reads before the first stage's values come) */
    if (dt_comm_rank(z->c->comm) == 0) memcpy(z->shared + z->sh.tail_off, P + z->sh.tail_off, z->sh.tail_n * sizeof(float));
    dt_status st = dt_comm_barrier(z->c->comm);
    if (st) return st;
    m->set_param_storage(m->self, z->shared);
    z->P = z->shared;
    z->shared_params = IN_USE;
    /* the update inside backward writes there too */
    return z->in_backward ? dt_ddp_set_optimizer(z->d, z->opt, z->shared, g->off, g->n) : DT_OK;
}

static void z_begin(void *state, int sync, float lr) {
    zero *z = state;
    if (!z) return;
    if (z->shared_params == AT_FIRST_STEP && !z->err) z->err = share_params(z);
    if (z->stage == 3 && z->whole && z->shared_params == OFF && !z->err) z->err = gather_everything(z);
    if (z->sharded_master == AT_FIRST_STEP && !z->err) z->err = shard_master(z);
    dt_ddp_begin(z->d, sync, lr);
}

static dt_status z_after_update(void *state);

static dt_status z_finish(void *state, dt_sync_result *r) {
    zero *z = state;
    if (!z) return DT_OK;
    dt_status st = dt_ddp_finish(z->d, r);
    if (!st && z->err) st = z->err;
    z->err = DT_OK;
    r->updated = z->in_backward; /* else the engine updates this rank's shard */
    if (st || !z->in_backward) return st;
    r->updated_in_backward = dt_ddp_updated_in_backward(z->d);
    double ss = r->norm * r->norm; /* this shard's: the global norm is the shards' sum */
    if ((st = dt_comm_allreduce(z->c->comm, &ss, &ss, 1, DT_F64, DT_SUM))) return st;
    r->norm = sqrt(ss);
    return z_after_update(z);
}

static dt_codec *z_codec(void *state) { return ((zero *)state)->codec; }

static dt_status z_sum(void *state, double *v, size_t n) {
    zero *z = state;
    return z ? dt_comm_allreduce(z->c->comm, v, v, n, DT_F64, DT_SUM) : DT_OK;
}

static dt_status gather_params(zero *z);

/* Stage 1: the gradients outside this rank's shard, which its optimizer did
 * not zero (stages 2 and 3 gave them back already). */
static void clear_other_grads(zero *z) {
    const dt_model *m = &z->c->model;
    float *g = m->grads(m->self);
    if (z->sh.nruns > 1) { /* the update zeroed the slice's runs: everything (it is cheap beside the step) */
        memset(g, 0, m->nparams * sizeof *g);
        return;
    }
    size_t off = z->sh.r[0].off, n = z->sh.r[0].n;
    memset(g, 0, off * sizeof *g);
    memset(g + off + n, 0, (m->nparams - off - n) * sizeof *g);
}

/* Stages 1 and 2: every rank gets every shard's new parameters. Stage 3:
 * what this rank holds of other shards is out of date; it goes back. */
static dt_status z_after_update(void *state) {
    zero *z = state;
    if (!z) return DT_OK;
    dt_dtype t;
    if (z->stage == 1 && !dt_ddp_grad_store(z->d, &t)) clear_other_grads(z);
    /* the one copy: every shard is in place once every rank has written its own */
    if (z->shared_params == IN_USE) return dt_comm_barrier(z->c->comm);
    if (z->sharded_master == IN_USE) return gather_lp(z);
    return z->stage == 3 ? release_everything(z) : gather_params(z);
}

static dt_status gather_params(zero *z) {
    const dt_model *m = &z->c->model;
    return allgather_shards(z, m->params(m->self), sizeof(float), DT_F32);
}

/* This rank's slice of the 16-bit store (stage 1's holds everything). */
static uint16_t *z_grads_lp(void *state, dt_dtype *t) {
    zero *z = state;
    uint16_t *g = z ? dt_ddp_grad_store(z->d, t) : NULL;
    return g && z->stage == 1 ? g + z->sh.r[0].off : g; /* (not with experts spread over ranks: one region) */
}

static dt_status z_check(void *state, uint64_t *hash) {
    zero *z = state;
    if (!z) return DT_OK;
    const dt_model *m = &z->c->model;
    if (z->sh.nr == 2) /* the shared tensors over every rank, the experts over those holding the same ones */
        return z->sharded_master == IN_USE ? dt_ddp_check_groups(z->c->comm, z->c->expert_comm, m, z->lp, sizeof *z->lp, hash)
                                           : dt_ddp_check_groups(z->c->comm, z->c->expert_comm, m, m->params(m->self), sizeof(float), hash);
    if (z->sharded_master == IN_USE) {
        /* the f32 master is sharded: the replicas' working copies must agree (as 32-bit words, an odd last value alone) */
        uint32_t last = m->nparams % 2 ? z->lp[m->nparams - 1] : 0;
        uint64_t h = dt_hash_words(dt_hash_words(DT_HASH_INIT, z->lp, m->nparams / 2), &last, 1);
        return dt_ddp_check_replicas(z->c->comm, (const float *)&h, 2, hash);
    }
    return dt_ddp_check_replicas(z->c->comm, m->params(m->self), m->nparams, hash);
}

static size_t z_buffers(void *state) {
    zero *z = state;
    if (!z) return 0;
    size_t staging = z->mine ? (z->piece + 1 + z->all_n) * sizeof(float) : 0;
    /* stage 3: the other shards' tensors gathered at once, at most */
    return dt_ddp_buffer_bytes(z->d) + staging + z->held_max * sizeof(float);
}

/* What this rank holds of the stores it shards, measured: the pages the
 * system keeps for them (between steps: the shard, and the edges of the
 * pages it shares with its neighbours). */
static void z_held(void *state, size_t *params, size_t *grads) {
    zero *z = state;
    if (!z) return;
    const dt_model *m = &z->c->model;
    dt_dtype t;
    if (z->stage >= 2 || dt_ddp_grad_store(z->d, &t)) *grads = dt_ddp_grads_held(z->d);
    /* one shared copy: this rank's share of it is its shard */
    if (z->shared_params == IN_USE) *params = dt_mem_resident(z->shared + z->sh.r[0].off, z->sh.r[0].n * sizeof(float));
    else if (z->stage == 3 || z->sharded_master == IN_USE) *params = dt_mem_resident(z->P, m->nparams * sizeof(float));
}

/* Stage 3: the whole model on every rank (on), or back to this rank's shard. */
static dt_status z_materialize(void *state, int on) {
    zero *z = state;
    if (!z || (z->stage != 3 && z->sharded_master != IN_USE) || z->shared_params != OFF) return DT_OK; /* the shared copy is whole */
    return on ? gather_everything(z) : release_everything(z);
}

/* Stage 3 with a copy per rank: the other shards are not kept between steps. */
static int z_params_sharded(void *state) {
    zero *z = state;
    return z && (z->stage == 3 || z->sharded_master == IN_USE) && z->shared_params == OFF;
}

/* With experts spread over ranks: the slice's runs (zero_shards.h). */
static int z_ranges(void *state, const dt_store_range **out) {
    zero *z = state;
    if (!z || z->sh.nr == 1) return 0;
    *out = z->sh.runs;
    return z->sh.nruns;
}

const dt_strategy dt_strategy_zero1 = {
    .name = "zero1", .create = z1_create, .destroy = z_destroy, .attach = z_attach, .begin = z_begin, .finish = z_finish,
    .reduce_sum = z_sum, .after_update = z_after_update, .check_replicas = z_check,
    .buffer_bytes = z_buffers, .held = z_held, .materialize = z_materialize, .grads_lp = z_grads_lp, .params_sharded = z_params_sharded,
    .codec = z_codec, .ranges = z_ranges,
};

const dt_strategy dt_strategy_zero2 = {
    .name = "zero2", .create = z2_create, .destroy = z_destroy, .attach = z_attach, .begin = z_begin, .finish = z_finish,
    .reduce_sum = z_sum, .after_update = z_after_update, .check_replicas = z_check,
    .buffer_bytes = z_buffers, .held = z_held, .materialize = z_materialize, .grads_lp = z_grads_lp, .params_sharded = z_params_sharded,
    .codec = z_codec, .ranges = z_ranges,
};

/* No replicas to compare: each rank holds a different shard of the parameters. */
const dt_strategy dt_strategy_zero3 = {
    .name = "zero3", .create = z3_create, .destroy = z_destroy, .attach = z_attach, .begin = z_begin, .finish = z_finish,
    .reduce_sum = z_sum, .after_update = z_after_update,
    .buffer_bytes = z_buffers, .held = z_held, .materialize = z_materialize, .grads_lp = z_grads_lp, .params_sharded = z_params_sharded,
    .codec = z_codec, .ranges = z_ranges,
};
