/* dtrain train layer: the training loop that puts data, model, optimizer,
 * checkpoints and metrics together. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/model.h"
#include "dtrain/comm.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *model;        /* preset (d6, 124M, ...) or an llm.c model file */
    dt_gpt2_config shape;     /* overrides from flags; 0 = from the preset or file */
    const char *data, *val_data;
    int batch, seq, steps, grad_accum, eval_every, eval_batches, threads;
    uint64_t seed;            /* initialisation */
    uint64_t shuffle_seed;    /* 0: batches in file order */
    dt_optim_config opt;
    dt_schedule sched;        /* learning rate and its schedule */
    float grad_clip;
    int train_batch_size;     /* DeepSpeed's rule, checked once the ranks are known (0: not given) */
    const char *save, *metrics;
    int save_every;           /* also save every N steps (0: only at the end) */
    int quiet;
    int recompute;            /* activation checkpointing */
    int attention;            /* dt_attn_mode */
    int nproc;                /* local ranks to launch (data parallelism); 1 = this process */
    int dp, tp, pp;           /* the mesh (0: dp = the ranks left over by tp x pp, tp = pp = 1) */
    int epochs;               /* image classification (--model mlp) trains in epochs */
    double bucket_mb;         /* DDP bucket cap (the first bucket is 1 MiB) */
    int step_at_end;          /* DDP: the optimizer after backward, not bucket by bucket inside it */
    double stall_timeout;     /* seconds a rank may wait for a live peer that never joins (warn; 2x: stop); 0 off */
    int skip_nonfinite;       /* a step whose loss or gradient norm is not finite is skipped (else the run stops) */
    int argc;                 /* the command line, re-executed for each rank */
    char **argv;
} dt_train_config;

void dt_train_defaults(dt_train_config *c);
/* Runs the training described by c; prints progress; returns a process exit code. */
int dt_train_run(const dt_train_config *c);

/* Image classification: --model mlp[:H1,H2,...] on the IDX image set in
 * c->data (a directory; Fashion-MNIST's by default), over the job's ranks
 * (w may be NULL); returns a process exit code. */
int dt_classify_run(const dt_train_config *c, dt_comm *w);

/* Watches the job from a thread of its own: once another rank dies or the
 * job is aborted, logs why and ends this rank within ~20 ms, after any
 * checkpoint being written under dt_watchdog_hold(wd, 1) is finished.
 * NULL (and nothing started) for a single-rank job. */
typedef struct dt_watchdog dt_watchdog;
dt_status dt_watchdog_start(dt_comm *w, dt_watchdog **out);
void dt_watchdog_hold(dt_watchdog *wd, int on);
void dt_watchdog_stop(dt_watchdog *wd);

/* SIGINT/SIGTERM ask the loop to stop after the current step (a second
 * signal ends the process at once); dt_train_interrupted gives the signal
 * caught, 0 if none. */
void dt_train_catch_signals(void);
int dt_train_interrupted(void);

/* Sampling from a trained model: the prompt's tokens, then `count` tokens
 * drawn at `temperature` from the top_k most likely (0 = all); each new
 * token goes to emit(token, ctx) as soon as it is drawn. */
typedef void (*dt_emit_fn)(int token, void *ctx);
dt_status dt_generate(dt_gpt2 *m, const int32_t *prompt, int nprompt, int count, float temperature, int top_k,
                      uint64_t seed, dt_emit_fn emit, void *ctx);

/* Reads a DeepSpeed-style JSON config (a subset: train_micro_batch_size_per_gpu,
 * gradient_accumulation_steps, optimizer {type, params}, scheduler {type,
 * params}, gradient_clipping, steps) into c. Unknown keys warn; bad values fail
 * naming the key. */
dt_status dt_train_config_load(const char *path, dt_train_config *c);

/* Draws the loss (and validation loss) of a metrics file as an SVG, the y
 * axis linear or (log_y) logarithmic; null losses leave gaps. */
dt_status dt_plot_losses(const char *metrics_path, const char *svg_path, int log_y);
/* The same document in memory (*svg to be freed). */
dt_status dt_plot_svg(const char *metrics_path, int log_y, char **svg, size_t *len);

/* Peak resident memory of this process, in bytes (VmHWM). */
size_t dt_peak_memory(void);

#ifdef __cplusplus
}
#endif
#endif
