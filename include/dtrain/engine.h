/* dtrain engine: one optimizer step of any model under any parallel
 * strategy. The engine runs the micro-batches (gradient accumulation), has
 * the strategy synchronise the gradients, agrees on the loss across the
 * ranks, clips, and updates this rank's share of the parameters. A strategy
 * (data parallelism, ZeRO, ...) is a table of callbacks (dt_strategy, in
 * strategy.h, below both the strategies and this engine) that the engine
 * calls at those points; see docs/architecture.md, "How to add a parallel
 * strategy". */
#ifndef DTRAIN_ENGINE_H
#define DTRAIN_ENGINE_H

#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_engine dt_engine;

/* The registered strategies (engine.c lists them: its own single-process one, parallel/'s data parallelism and ZeRO
 * stages); NULL if no such name. */
const dt_strategy *dt_strategy_find(const char *name);
extern const dt_strategy dt_strategy_single;

dt_status dt_engine_create(const dt_engine_config *c, dt_engine **out);
void dt_engine_destroy(dt_engine *e);

/* The strategy's begin: sync, the backward that follows is this rank's
 * last of the step (data parallelism reduces during it); DT_MICRO_FORWARD:
 * a forward alone follows, whose begin sets up the step (ZeRO's parameters)
 * and says nothing of its gradients. */
void dt_engine_begin_micro(dt_engine *e, int sync);
/* One micro-batch: load it, forward, backward scaled by grad_scale; *loss gets its mean loss. */
typedef dt_status (*dt_micro_fn)(void *ctx, int micro, float grad_scale, float *loss);

typedef struct dt_step_result {
    float loss;                 /* mean over the global batch */
    double norm;                /* gradient norm before clipping */
    double exposed_ms, update_ms;
    double exposed_in_backward_ms; /* of exposed_ms, inside backward */
    /* a preconditioner's time (its own phase): all of it, of which inside forward and backward (K-FAC's factors); the
     * rest is in update_ms */
    double precondition_ms, precondition_in_forward_ms, precondition_in_backward_ms;
    double updated_in_backward;
    double grad_bytes, compress_ratio, grad_recv_bytes; /* a codec's (dt_sync_result's; 0: none) */
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
/* The strategy's gradient codec (NULL: none). */
dt_codec *dt_engine_codec(dt_engine *e);
/* The loss scaler's state (NULL without scaling): checkpoints save and restore it. */
dt_loss_scale *dt_engine_loss_scale(dt_engine *e);
/* The slice of the store this rank's optimizer owns. */
void dt_engine_share(const dt_engine *e, size_t *off, size_t *n);
/* The slice's runs of the store, in the optimizer's order (its buffers hold them side by side); returns how many
 * (one, [off, off + n), unless the strategy's slice is several: ZeRO with experts spread over ranks). */
int dt_engine_runs(const dt_engine *e, const dt_store_range **out);
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
/* Collective: 0/1 Adam's local interval ended early (a save, the run's end), so that every rank holds the same
 * weights; nothing for any other run, or where no local step is pending. */
dt_status dt_engine_sync_replicas(dt_engine *e);
/* Replicas that must hold the same weights do (*checked 0 when the strategy has none). */
dt_status dt_engine_check_replicas(dt_engine *e, int *checked, uint64_t *hash);

#ifdef __cplusplus
}
#endif
#endif
