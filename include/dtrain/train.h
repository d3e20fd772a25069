/* dtrain train layer: the training loop that puts data, model, optimizer,
 * checkpoints and metrics together. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/model.h"
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
    float lr, lr_min, grad_clip;
    dt_schedule_kind schedule;
    int warmup;
    const char *save, *metrics;
    int quiet;
} dt_train_config;

void dt_train_defaults(dt_train_config *c);
/* Runs the training described by c; prints progress; returns a process exit code. */
int dt_train_run(const dt_train_config *c);

/* Peak resident memory of this process, in bytes (VmHWM). */
size_t dt_peak_memory(void);

#ifdef __cplusplus
}
#endif
#endif
