/* dtrain strategy: the interface a parallel strategy (data parallelism,
 * ZeRO) and a micro-batch schedule (a pipeline's) implement, below both
 * them and the engine that drives them (train/engine.c): what a step runs
 * with (dt_engine_config), what a strategy is told and reports, and what a
 * schedule may ask of the step. See docs/architecture.md, "How to add a
 * parallel strategy". */
#ifndef DTRAIN_STRATEGY_H
#define DTRAIN_STRATEGY_H

#include "dtrain/codec.h"
#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dt_step_result; /* engine.h's */

/* What a strategy reports once a step's gradients are complete. */
typedef struct {
    double exposed_ms;          /* communication backward did not hide */
    double exposed_in_backward_ms; /* of which waited for inside backward (counted in its time) */
    int updated;                /* the update already happened (inside backward) */
    double norm;                /* then: the gradient norm it saw */
    double updated_in_backward; /* the share of the parameters updated inside backward (metrics) */
    double grad_bytes;          /* a codec's step: the bytes a rank put on the wire for the gradients (0: no codec) */
    double compress_ratio;      /* and the elements the tensors hold over those that travelled (1 before its start) */
    double grad_recv_bytes;     /* a sparse codec's: the bytes of the other ranks' pairs a rank received (0: not counted) */
} dt_sync_result;

/* What the computation after a strategy's begin does with the gradients. */
typedef enum { DT_MICRO_ACCUMULATE = 0, DT_MICRO_SYNC = 1, DT_MICRO_FORWARD = 2 } dt_micro_sync;

/* What a schedule may ask of the step that runs it: the strategy's begin
 * before each computation (sync: a dt_micro_sync, as the engine's loop
 * says it); whether this rank holds only its slice of the parameters
 * between steps; the whole model in the store (on) or back to the slice. */
typedef struct {
    void (*begin_micro)(void *step, int sync);
    int (*params_sharded)(void *step);
    dt_status (*materialize)(void *step, int on);
    void *step;
} dt_step_control;

/* A schedule of the step's micro-batches other than the engine's loop (a
 * pipeline's): run does the step's accum forwards and backwards, calling
 * step->begin_micro before each computation; *loss_sum: the sum of the
 * micro-batches' mean losses it computed, *nloss how many (0 on a pipeline
 * stage without the head). after_update, if not NULL, runs after each
 * update that changed the parameters (the tied embedding's copies made equal). */
typedef struct dt_micro_schedule {
    dt_status (*run)(void *ctx, const dt_step_control *step, int accum, float grad_scale, double *loss_sum, int *nloss);
    dt_status (*after_update)(void *ctx, const dt_step_control *step);
    void *ctx;
} dt_micro_schedule;

/* A preconditioner of the step's gradients (K-FAC, Shampoo, SOAP): begin when a step of accum micro-batches starts,
 * whose backward carries loss_scale (fp16's loss scale; 0: none); apply on the whole store's averaged gradients after
 * the strategy's finish, divided by the scale, before the update, at the step's learning rate (*skip: the step changes
 * nothing, on every rank: 1 a failure it has said, 2 by design, SOAP's measuring first step). It needs every gradient
 * on every rank (strategies single, ddp and zero1) and the update after backward (the engine turns step_at_end on). */
typedef struct {
    const char *name; /* for its errors: "K-FAC", "Shampoo", "SOAP" */
    void (*begin)(void *ctx, int accum, double loss_scale);
    dt_status (*apply)(void *ctx, float *grads, float lr, int *skip);
    void *ctx;
    dt_state_units state; /* what checkpoints hold of it */
    /* Seconds its work took inside forward and backward since the last call (K-FAC's factors; NULL: none there). */
    void (*inside)(void *ctx, double *forward, double *backward);
    int slices; /* it takes tensor parallelism's slices (dt_tp_whole_preconditioner makes them whole for it) */
    /* The step's norm, its finiteness check and clipping are the gradients' before it (SOAP's, Shampoo's: an optimizer
     * whose input is the gradient); 0: the directions' after it (K-FAC's, whose KL clipping bounds them). */
    int raw_norm;
    int experts; /* it steps an expert-parallel rank's own experts where they are (SOAP); 0: it needs them whole */
    /* Collective: the step begun was skipped before apply (the loss scale overflowed): what it observed is let go and
     * the step not counted (NULL: it keeps nothing of a step before apply). */
    dt_status (*drop)(void *ctx);
} dt_preconditioner;

/* The first gradient bucket's bytes the runs ask for (small, so that the first allreduce starts early in backward). */
#define DT_DDP_FIRST_BUCKET (1u << 20)

typedef struct {
    dt_model model;
    dt_comm *comm;              /* the data-parallel ranks; NULL: this process alone */
    /* The model-parallel ranks whose slices make up the split tensors (the
     * tensor-parallel group); NULL: none. The engine's finalize step: the
     * global norm counts each piece once, on the first rank of the replica
     * group its table entry names (dt_tensor_info.replicas, replica: their
     * gradients are the same on every rank of it), and the update waits for
     * the end of backward (step_at_end), after the norm. */
    dt_comm *mp_comm;
    /* The ranks that agree on the loss and on stopping: all of them when a
     * pipeline has the loss on its last stage only (NULL: comm). */
    dt_comm *loss_comm;
    /* Who runs the micro-batches (a pipeline's schedule; NULL: the engine's loop). */
    const dt_micro_schedule *schedule;
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
    /* Expert parallelism (ep > 1): the table's DT_GROUP_EXPERT tensors are this rank's experts, which ep ranks of comm
     * split between them; they average over expert_comm, the ranks holding the same ones (NULL: none other does), and
     * the rest over comm. ep 0 or 1: every tensor over comm. */
    dt_comm *expert_comm;
    int ep;
    /* Gradient compression (DDP): NULL or DT_CODEC_NONE: the gradients are averaged as computed. */
    const dt_codec_config *codec;
    /* NULL: the update takes the averaged gradients as they are. */
    const dt_preconditioner *precond;
    /* A strategy not in the engine's registry (the GPU's, from its plugin: dt_gpu_api), and what it runs on;
     * NULL: the one named by strategy. */
    const struct dt_strategy *strategy_impl;
    void *device;
} dt_engine_config;

/* What decides whether data parallelism's update runs inside backward, each bucket's part as its reduction ends, the
 * ranks taking turns (ddp.c, zero.c), or after backward from the engine. The engine reads it to tell the strategies
 * (step_at_end) and the planner to price a rank's update by turns, so the two cannot drift apart. */
typedef struct {
    dt_optim_kind opt;        /* SGD and AdamW update elementwise; the others need whole tensors */
    dt_codec_kind codec;      /* DGC clips each rank's own gradient inside its codec: no global norm for clipping */
    float grad_clip;          /* > 0: the global norm before any update */
    int skip_nonfinite;       /* the same: a step is skipped on the norm's finiteness */
    int step_at_end;          /* asked for (--step-at-end) */
    int model_parallel;       /* the norm sums across a model-parallel group (TP, a pipeline's stages, EP's under DDP) */
    int loss_scaled;          /* fp16: the overflow check needs every gradient first */
    int lp_store;             /* 16-bit gradients, read after backward */
    int precond;              /* a preconditioner rewrites whole gradients first */
} dt_update_facts;

/* 1: the update may run inside backward (given an optimizer over several data-parallel ranks); 0: after it. */
int dt_engine_updates_in_backward(const dt_update_facts *f);

/* A run of the flat store, [off, off + n). */
typedef struct { size_t off, n; } dt_store_range;

/* A parallel strategy. Every callback but create may be NULL (nothing to do). */
typedef struct dt_strategy {
    const char *name;
    /* Takes over what it needs of the step's model (c->model: gradient
     * storage, backward's hook; c lives as long as the strategy) and says
     * which slice [*off, *off + *n) of the flat store this rank's optimizer
     * owns (everything, unless it shards). */
    dt_status (*create)(const dt_engine_config *c, void **state, size_t *off, size_t *n);
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
    /* Its gradient codec (dt_engine_config.codec), whose state checkpoints keep; NULL: none. */
    dt_codec *(*codec)(void *state);
    /* The update itself, where the parameters live on a device (the GPU's "gpu" strategy): the step's norm into
     * r->norm, clipped to the config's grad_clip, a non-finite one skipped (r->skipped) with skip_nonfinite; the
     * gradients zeroed after. The host store and the optimizer's buffers are then mirrors, made current by
     * materialize(on 1) and read back by materialize(on 0) (a save, a resume). NULL: the engine updates the host store. */
    dt_status (*update)(void *state, float lr, struct dt_step_result *r);
    /* A slice that is not one run of the store (ZeRO with experts spread over ranks: its shard of the shared tensors
     * and its shard of its own experts, runs between the layers' other tensors): its runs in *out, in the order the
     * optimizer's state keeps them, create's *n their floats in all; returns how many. 0 (or NULL): [off, off + n). */
    int (*ranges)(void *state, const dt_store_range **out);
} dt_strategy;

#ifdef __cplusplus
}
#endif
#endif
