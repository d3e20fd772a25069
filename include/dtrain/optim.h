/* dtrain optim layer: SGD (momentum, Nesterov), AdamW (PyTorch semantics),
 * LAMB and LARS (per-tensor trust ratios), over a flat f32 slice, so that a
 * ZeRO shard is just a shorter slice; gradient clipping; learning-rate
 * schedules. */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_OPT_SGD = 0, DT_OPT_ADAMW, DT_OPT_LAMB, DT_OPT_LARS, DT_OPT_SOAP } dt_optim_kind;

typedef struct {
    dt_optim_kind kind;
    float beta1, beta2, eps;  /* AdamW, LAMB: 0.9, 0.999, 1e-8 */
    float weight_decay;       /* 0 */
    float momentum;           /* SGD, LARS: 0 */
    int nesterov;             /* SGD */
    float trust_coef;         /* LARS: 0.001 */
    /* SOAP's (soap.h: the engine's preconditioner, not a dt_optim, which runs SGD under it): its statistics' running
     * averages at shampoo_beta (< 0: beta2), the bases refreshed every precond_every steps, a side longer than
     * precond_max_dim left unrotated. */
    int precond_every;        /* 10 */
    int precond_max_dim;      /* 10000 */
    float shampoo_beta;       /* -1: beta2 */
    int soap_group;           /* the data-parallel ranks sharing SOAP's matrices: 0 all, g consecutive groups of g (each
                               * holding every matrix once), 1 every rank all */
} dt_optim_config;

/* A tensor, or the piece of one, within the slice, for the per-tensor trust
 * ratios of LAMB and LARS; tensor numbers the whole tensor (pieces of one
 * tensor held by several ranks share it). */
/* rows, cols: a matrix's shape (SOAP's, soap.h; 0: a vector); own: an expert-parallel rank's own expert (SOAP's: rotated
 * where it is held, not shared out) */
typedef struct { size_t offset, count; int tensor; int rows, cols; int own; } dt_tensor_span;

typedef struct dt_optim dt_optim;
typedef struct dt_comm dt_comm;

void dt_optim_defaults(dt_optim_kind kind, dt_optim_config *out);
dt_status dt_optim_parse_kind(const char *s, dt_optim_kind *out);
const char *dt_optim_kind_name(dt_optim_kind k);
/* Optimizer over n parameters; spans (may be NULL for SGD/AdamW) cover the slice. */
dt_status dt_optim_create(const dt_optim_config *cfg, size_t n, const dt_tensor_span *spans, int nspans, dt_optim **out);
void dt_optim_destroy(dt_optim *o);
/* One update of params[0..n) from grads at learning rate lr. With
 * zero_grads the gradients are zeroed in the same pass (saves one trip
 * through memory per step). Returns the L2 norm of the gradients it read,
 * summed in the same pass. */
double dt_optim_step(dt_optim *o, float *params, float *grads, float lr, int zero_grads);
/* The same step in pieces, for the elementwise optimizers (SGD, AdamW), so
 * that parts of the model can be updated as soon as their gradients are
 * final: dt_optim_begin starts a step, then dt_optim_update covers
 * [off, off+n) of the slice (params and grads point at the slice's start);
 * every element once per step, in any order, gives exactly dt_optim_step's
 * result. Returns the sum of squares of the gradients it read. */
int dt_optim_elementwise(const dt_optim *o);
void dt_optim_begin(dt_optim *o);
/* 1-bit Adam's second stage (AdamW only; on 0: off): the gradient's place holds the averaged momentum, which becomes
 * m as it is; v stays as it was, bias-corrected by the steps that updated it; m's correction goes on with the steps. */
void dt_optim_freeze_variance(dt_optim *o, int on);
/* 0/1 Adam's step (AdamW only; its plan is dt_codec_zeroone_at's), told before the step's updates: DT_ZO_VARIANCE
 * AdamW's step; DT_ZO_MOMENTUM the momentum from the gradient, the variance as it is; DT_ZO_LOCAL that on this rank's own
 * gradient, each step's lr/bc1 m added to the interval's accumulation (the weights at the interval's start kept).
 * The variance's bias correction counts the steps that updated it (a variance step the engine skips is not one);
 * mode 0: AdamW as ever. */
enum { DT_ZO_OFF = 0, DT_ZO_VARIANCE, DT_ZO_MOMENTUM, DT_ZO_LOCAL };
dt_status dt_optim_zeroone(dt_optim *o, int mode, float lr);
/* The interval's accumulation (n floats), NULL when no local step is pending. Once the ranks have averaged it in
 * place, dt_optim_zeroone_end closes the interval: params = its start's weights decayed, less the average over the
 * variance's denominator (as each rank's steps would have moved them, wd 0), the same on every rank; the momentum the
 * average over the interval's summed lr/bc1. */
float *dt_optim_zeroone_accum(dt_optim *o);
void dt_optim_zeroone_end(dt_optim *o, float *params);
double dt_optim_update(dt_optim *o, float *params, float *grads, float lr, size_t off, size_t n, int zero_grads);
/* The same with params and grads at the piece's own first values (a slice whose runs lie apart in the store). */
double dt_optim_update_at(dt_optim *o, float *params, float *grads, float lr, size_t off, size_t n, int zero_grads);
/* LAMB and LARS in two halves, for a slice whose tensors are cut between
 * ranks (ZeRO): dt_optim_norms does the step up to the trust ratios and puts
 * each tensor's sums of squares from this slice in sums[0..dt_optim_nsums)
 * (zeroed first); the caller adds them over the ranks; dt_optim_apply ends
 * the step with the whole tensors' norms. dt_optim_step is the two with
 * nothing between. nsums is 0 for the elementwise optimizers. Returns the
 * gradients' sum of squares in this slice. */
size_t dt_optim_nsums(const dt_optim *o);
double dt_optim_norms(dt_optim *o, float *params, float *grads, double *sums);
void dt_optim_apply(dt_optim *o, float *params, float *grads, float lr, const double *sums, int zero_grads);
/* The state, for checkpoints: the steps taken (setting them sets the variance's updates alike), of them the steps
 * that updated AdamW's variance (fewer under 1-bit and 0/1 Adam), and the buffers of n floats
 * (0: the first moment or momentum; 1: the second moment, or NULL). */
long dt_optim_steps(const dt_optim *o);
void dt_optim_set_steps(dt_optim *o, long t);
long dt_optim_variance_steps(const dt_optim *o);
void dt_optim_set_variance_steps(dt_optim *o, long tv);
float *dt_optim_buffer(dt_optim *o, int i);
size_t dt_optim_size(const dt_optim *o);
/* Bytes of optimizer state. */
size_t dt_optim_state_bytes(const dt_optim *o);
/* State beyond the store's buffers that checkpoints hold (a second-order optimizer's factors, roots, bases), in
 * units whose sizes do not depend on the layout (a Shampoo block, a K-FAC Linear, a SOAP matrix): each held whole by
 * one data-parallel rank, which saves it, and wholly or in part by the ranks that load it; so a checkpoint of one
 * layout resumes on another (checkpoint_units.c). */
typedef struct {
    const char *key;                                /* its file (KEY.f32) and manifest section: "shampoo" */
    int units;                                      /* 0: nothing to save */
    size_t (*floats)(void *ctx, int u);
    int (*saver)(void *ctx, int u);                 /* the data-parallel rank holding all of unit u */
    int (*loads)(void *ctx, int u, int rank);       /* whether that rank holds (a part of) u */
    void (*io)(void *ctx, int u, float *buf, int load); /* u into buf, or buf into what this rank holds of u */
    long (*steps)(void *ctx);                       /* its own count of steps, saved beside */
    void (*set_steps)(void *ctx, long t);
    void *ctx;
    int copy;                                       /* another rank saves the same state (a tensor-parallel group's
                                                     * ranks after its first): loaded here, not written */
} dt_state_units;


/* The trainer's step: with max_norm > 0 the gradients are first clipped to
 * it (dt_grad_norm, dt_grad_clip), else the norm comes from the update's own
 * pass. Returns the norm before clipping. */
double dt_optim_step_clipped(dt_optim *o, float *params, float *grads, float lr, float max_norm);
/* Global L2 norm of g[0..n) (accumulated in double). */
double dt_grad_norm(const float *g, size_t n);
/* Scales g so that its norm is at most max_norm (PyTorch's clip_grad_norm_:
 * factor max_norm / (norm + 1e-6) when below 1). Returns the norm before. */
double dt_grad_clip(float *g, size_t n, double norm, float max_norm);
/* g *= f (unscaling and clipping in one pass). */
void dt_grad_scale(float *g, size_t n, float f);
/* dt_grad_norm of 16-bit gradients (t: DT_BF16 or DT_F16). */
double dt_grad_norm_lp(const uint16_t *g, size_t n, dt_dtype t);
/* dt_optim_step from 16-bit gradients (SGD, AdamW; else NaN and nothing
 * done): each chunk widened, times scale (unscaling and clipping), updated,
 * and its gradients zeroed. The same floats as dt_grad_scale then
 * dt_optim_step on the widened gradients. Returns the norm of the scaled gradients. */
double dt_optim_step_lp(dt_optim *o, float *params, uint16_t *grads, dt_dtype t, float scale, float lr);

/* Learning-rate schedules. Ours: constant or cosine, each after a linear
 * warm-up of `warmup` steps from lr/warmup to lr (cosine then decays to
 * lr_min at `total`). DeepSpeed's, with its formulas (step s is its
 * last_batch_iteration s, warm-up at least 2 steps, "log" warm-up by default):
 *   WarmupLR        lr_min + (lr - lr_min) * g, g = ln(s+1)/ln(warmup) (log)
 *                   or s/warmup (linear) during warm-up, then 1
 *   WarmupDecayLR   the same warm-up, then g = max(0, (total - s) / (total - warmup))
 *   WarmupCosineLR  lr * r: r = warmup_min_ratio + (1 - warmup_min_ratio) * g during
 *                   warm-up, then max(0, cos_min_ratio + (1 - cos_min_ratio) *
 *                   (1 + cos(pi * (s - warmup + 1) / (total - warmup))) / 2)
 * Hugging Face's, with transformers' formulas (step s counts the optimizer steps before this one, so a warm-up
 * starts at 0):
 *   linear          s/warmup during warm-up, then lr_min + (lr - lr_min) * max(0, (total - s) / (total - warmup))
 *                   (get_linear_schedule_with_warmup: lr_min 0)
 *   wsd             get_wsd_schedule's warm-up, stable and decay (its linear warm-up, min_lr_ratio = lr_min / lr):
 *                   the last `decay` steps (a tenth of total when 0) fall to lr_min by decay_type */
typedef enum {
    DT_SCHED_CONSTANT = 0, DT_SCHED_COSINE, DT_SCHED_DS_WARMUP, DT_SCHED_DS_WARMUP_DECAY, DT_SCHED_DS_WARMUP_COSINE,
    DT_SCHED_LINEAR, DT_SCHED_WSD
} dt_schedule_kind;
#define DT_SCHED_LAST DT_SCHED_WSD
typedef enum { DT_DECAY_COSINE = 0, DT_DECAY_LINEAR, DT_DECAY_SQRT } dt_decay_type; /* WSD's: cosine, linear, 1-sqrt */
typedef struct {
    dt_schedule_kind kind;
    float lr;            /* peak rate (DeepSpeed's warmup_max_lr, or the optimizer's lr) */
    float lr_min;        /* cosine's end; DeepSpeed's warmup_min_lr */
    int warmup;          /* steps */
    int total;           /* steps the decay reaches its end at; 0: the run's length */
    int linear_warmup;   /* DeepSpeed's warmup_type "linear" (its default is "log") */
    float warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR (defaults 0 and 0.0001) */
    int decay;           /* WSD's decay steps; 0: a tenth of total */
    dt_decay_type decay_type;
} dt_schedule;
void dt_schedule_defaults(dt_schedule *s);
/* Learning rate at step (0-based) of a run of run_steps steps. */
float dt_lr_at(const dt_schedule *s, int run_steps, int step);
const char *dt_schedule_name(dt_schedule_kind k);
const char *dt_decay_type_name(dt_decay_type t);

/* Loss scaling (fp16), with DeepSpeed's semantics and defaults (its
 * DynamicLossScaler and config's fp16 section): loss_scale 0 is dynamic from
 * 2^initial_scale_power. */
typedef struct {
    double scale;               /* the static scale, or the dynamic one's start: 65536 */
    int dynamic;                /* 1 */
    int window;                 /* loss_scale_window: clean steps in a row that double it, 1000 */
    int hysteresis;             /* overflows absorbed before one halves it, 2 */
    double min_scale;           /* min_loss_scale: 1 */
    int consecutive_hysteresis; /* 0: a doubling refills the hysteresis; 1: every clean step does */
} dt_loss_scale_config;

/* The scaler's state: all of it goes into checkpoints. */
typedef struct {
    double scale;
    int64_t iter, last_overflow; /* steps seen; the last that overflowed (-1: none) */
    int hysteresis;              /* overflows it may still absorb */
} dt_loss_scale;

void dt_loss_scale_defaults(dt_loss_scale_config *c);
/* A configuration out of range: an error naming the key (where: its source). */
dt_status dt_loss_scale_check(const dt_loss_scale_config *c, const char *where);
void dt_loss_scale_init(dt_loss_scale *s, const dt_loss_scale_config *c);
/* After a step: overflow (its gradients had an inf or a NaN) means the step
 * is skipped and the scale may halve; msg gets DeepSpeed's words for it
 * ("OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing to
 * 32768"), empty for a clean step. An overflow at the minimum scale is
 * DT_ERR_NUMERIC naming the step: the run must stop. */
dt_status dt_loss_scale_update(dt_loss_scale *s, const dt_loss_scale_config *c, int overflow, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
