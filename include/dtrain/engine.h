/* dtrain engine: one optimizer step of any model under any parallel
 * strategy. The engine runs the micro-batches (gradient accumulation), has
 * the strategy synchronise the gradients, agrees on the loss across the
 * ranks, clips, and updates this rank's share of the parameters. A strategy
 * (data parallelism, ZeRO, ...) is a table of callbacks (dt_strategy) that
 * the engine calls at those points; see docs/architecture.md, "How to add a
 * parallel strategy". */
#ifndef DTRAIN_ENGINE_H
#define DTRAIN_ENGINE_H

#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_engine dt_engine;
struct dt_micro_schedule;

/* What a strategy reports once a step's gradients are complete. */
typedef struct {
    double exposed_ms;          /* communication backward did not hide */
    double exposed_in_backward_ms; /* of which waited for inside backward (counted in its time) */
    int updated;                /* the update already happened (inside backward) */
    double norm;                /* then: the gradient norm it saw */
    double updated_in_backward; /* the share of the parameters updated inside backward (metrics) */
} dt_sync_result;

/* What the computation after a strategy's begin does with the gradients. */
typedef enum { DT_MICRO_ACCUMULATE = 0, DT_MICRO_SYNC = 1, DT_MICRO_FORWARD = 2 } dt_micro_sync;

/* A parallel strategy. Every callback but create may be NULL (nothing to do). */
typedef struct {
    const char *name;
    /* Takes over what it needs of the engine's model (gradient storage,
     * backward's hook) and says which slice [*off, *off + *n) of the flat
     * store this rank's optimizer owns (everything, unless it shards). */
    dt_status (*create)(dt_engine *e, void **state, size_t *off, size_t *n);
    void (*destroy)(void *state);
    /* The optimizer over that slice now exists (a strategy may update inside backward). */
    dt_status (*attach)(void *state, dt_optim *o);
    /* Before each micro-batch; sync: a dt_micro_sync, whether it is the step's last backward (the one to synchronise). */
    void (*begin)(void *state, int sync, float lr);
    /* After the last backward: this rank's slice holds the global average gradient. */
    dt_status (*finish)(void *state, dt_sync_result *r);
    /* Sums v[0..n) over the ranks whose slices make up the model (a sharded
     * strategy allreduces): the gradient's sum of squares for its global
     * norm, and LAMB/LARS's per-tensor sums of squares for their trust
     * ratios (a shard may cut a tensor). NULL: the slice is the whole model. */
    dt_status (*reduce_sum)(void *state, double *v, size_t n);
    /* After the update of this rank's slice (a sharded strategy gathers the parameters). */
    dt_status (*after_update)(void *state);
    /* At the end of a run: *hash of the parameters, checked equal across the
     * replicas that must agree (fails naming the first that differs). */
    dt_status (*check_replicas)(void *state, uint64_t *hash);
    /* Bytes of communication buffers it holds (memory accounting). */
    size_t (*buffer_bytes)(void *state);
    /* Bytes of parameters and gradients this rank holds, where it shards
     * them (each starts at the whole store's; left alone: whole). */
    void (*held)(void *state, size_t *params, size_t *grads);
    /* on: the whole model in the store (it shards the parameters: a save
     * reads them all); off: back to what a step needs. */
    dt_status (*materialize)(void *state, int on);
    /* Whether between steps this rank holds only its slice of the parameters
     * (a sharded checkpoint then saves them in pieces, as the optimizer's). */
    int (*params_sharded)(void *state);
    /* The gradients of this rank's slice in 16 bits, their type in *t, when
     * the strategy keeps them so (dt_engine_config.grad_store; the engine's
     * update then reads and zeroes them there); NULL: f32, in the model's store. */
    uint16_t *(*grads_lp)(void *state, dt_dtype *t);
} dt_strategy;

/* The registered strategies (engine.c lists them); NULL if no such name. */
const dt_strategy *dt_strategy_find(const char *name);
extern const dt_strategy dt_strategy_single, dt_strategy_ddp, dt_strategy_zero1, dt_strategy_zero2, dt_strategy_zero3;

typedef struct {
    dt_model model;
    dt_comm *comm;              /* the data-parallel ranks; NULL: this process alone */
    /* The model-parallel ranks whose slices make up the split tensors (the
     * tensor-parallel group); NULL: none. The engine's finalize step: the
     * global norm counts each slice once and each replicated tensor once
     * (their gradients are the same on every rank of the group), and the
     * update waits for the end of backward (step_at_end), after the norm. */
    dt_comm *mp_comm;
    /* This rank counts the tensors replicated across tensor parallelism in
     * the norm (TP rank 0 of each group; the other ranks' copies are the same). */
    int mp_counts_replicated;
    /* The ranks that agree on the loss and on stopping: all of them when a
     * pipeline has the loss on its last stage only (NULL: comm). */
    dt_comm *loss_comm;
    /* Who runs the micro-batches (a pipeline's schedule; NULL: the engine's loop). */
    const struct dt_micro_schedule *schedule;
    const char *strategy;       /* NULL: "ddp" over several ranks, "single" otherwise */
    dt_optim_config opt;
    float grad_clip;            /* max gradient norm (0: off) */
    int skip_nonfinite;         /* a step whose loss or norm is not finite changes nothing */
    int step_at_end;            /* no update inside backward */
    size_t bucket_first, bucket_bytes; /* gradient buckets (data parallelism) */
    /* Loss scaling (fp16), NULL: none. Backward gets the loss times the
     * scale; the step's global norm says whether the gradients overflowed:
     * then it is skipped (gradients zeroed, scale lowered), else they are
     * divided by the scale (folded into clipping) before the update. No
     * update can happen inside backward, before that check: the engine turns
     * step_at_end on. */
    const dt_loss_scale_config *loss_scale;
    dt_dtype grad_comm;         /* the gradients' type on the wire (DT_F32: as computed; DT_BF16, DT_F16: ddp halves the bytes) */
    /* DT_BF16, DT_F16: the averaged gradients are kept in 16 bits between
     * their reduction and the update (data parallelism and ZeRO; they then
     * travel in that type too, and the update waits for the end of
     * backward); DT_F32: in the f32 store. */
    dt_dtype grad_store;
} dt_engine_config;

dt_status dt_engine_create(const dt_engine_config *c, dt_engine **out);
void dt_engine_destroy(dt_engine *e);

/* A schedule of the step's micro-batches other than the engine's loop (a
 * pipeline's): run does the step's accum forwards and backwards, calling
 * dt_engine_begin_micro before each computation; *loss_sum: the sum of the
 * micro-batches' mean losses it computed, *nloss how many (0 on a pipeline
 * stage without the head). after_update, if not NULL, runs after each
 * update that changed the parameters (the tied embedding's copies made equal). */
typedef struct dt_micro_schedule {
    dt_status (*run)(void *ctx, dt_engine *e, int accum, float grad_scale, double *loss_sum, int *nloss);
    dt_status (*after_update)(void *ctx, dt_engine *e);
    void *ctx;
} dt_micro_schedule;
/* The strategy's begin: sync, the backward that follows is this rank's
 * last of the step (data parallelism reduces during it); DT_MICRO_FORWARD:
 * a forward alone follows, whose begin sets up the step (ZeRO's parameters)
 * and says nothing of its gradients. */
void dt_engine_begin_micro(dt_engine *e, int sync);
/* One micro-batch: load it, forward, backward scaled by grad_scale; *loss gets its mean loss. */
typedef dt_status (*dt_micro_fn)(void *ctx, int micro, float grad_scale, float *loss);

typedef struct {
    float loss;                 /* mean over the global batch */
    double norm;                /* gradient norm before clipping */
    double exposed_ms, update_ms;
    double exposed_in_backward_ms; /* of exposed_ms, inside backward */
    double updated_in_backward;
    int skipped;                /* not finite, and skip_nonfinite; or the loss scale overflowed */
    double loss_scale;          /* the scale this step's backward used (1 without scaling) */
    int stop;                   /* some rank passed stop != 0 */
} dt_step_result;

/* One optimizer step of accum micro-batches at learning rate lr. stop: this
 * rank wants the run to end (a signal); every rank learns it in r->stop, in
 * the same allreduce as the loss. */
dt_status dt_engine_step(dt_engine *e, int accum, float lr, dt_micro_fn micro, void *ctx, int stop, dt_step_result *r);

const dt_engine_config *dt_engine_get_config(const dt_engine *e);
const char *dt_engine_strategy_name(const dt_engine *e);
dt_optim *dt_engine_optim(dt_engine *e);
/* The loss scaler's state (NULL without scaling): checkpoints save and restore it. */
dt_loss_scale *dt_engine_loss_scale(dt_engine *e);
/* The slice of the store this rank's optimizer owns. */
void dt_engine_share(const dt_engine *e, size_t *off, size_t *n);
/* The strategy's communication buffers, in bytes. */
size_t dt_engine_buffer_bytes(const dt_engine *e);
/* Bytes of parameters and gradients this rank holds (ZeRO-2 and 3 shard them). */
void dt_engine_held(const dt_engine *e, size_t *params, size_t *grads);
/* Collective: on, the whole model in the store, whatever the strategy
 * shards (ZeRO-3), for reading all the parameters outside a step (a save);
 * off gives the memory back (the next step would anyway). */
dt_status dt_engine_materialize(dt_engine *e, int on);
/* Whether this rank holds only its slice [off, off + n) of the parameters between steps. */
int dt_engine_params_sharded(const dt_engine *e);
/* Replicas that must hold the same weights do (*checked 0 when the strategy has none). */
dt_status dt_engine_check_replicas(dt_engine *e, int *checked, uint64_t *hash);

#ifdef __cplusplus
}
#endif
#endif
