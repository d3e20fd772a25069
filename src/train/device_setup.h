/* --device cuda for the language models' trainer: the GPU plugin, the model on the GPU, the engine's "gpu" strategy
 * over it (device_setup.c). */
#ifndef DTRAIN_DEVICE_SETUP_H
#define DTRAIN_DEVICE_SETUP_H

#include "dtrain/engine.h"
#include "dtrain/gpu_lm.h"
#include "dtrain/train.h"

typedef struct {
    const dt_gpu_api *api; /* NULL: the CPU */
    dt_gpu *gpu;
    dt_gpu_lm *lm;
    int ordinal;           /* the GPU this rank took */
} dt_train_device;

/* With c->cuda: what the GPU path cannot run refused by name, then p (its weights as initialised or loaded) made on
 * the GPU for c's batch x sequence, p's forward and backward routed there and ec given the "gpu" strategy over it.
 * The GPU: --device cuda:N's, or with plain cuda the rank's on its machine (local_rank) modulo the GPUs there.
 * Without: nothing. */
dt_status dt_train_device_attach(const dt_train_config *c, int nranks, int local_rank, dt_program *p, dt_engine_config *ec,
                                 dt_train_device *out);
void dt_train_device_detach(dt_train_device *d, dt_program *p);
/* What the GPU path cannot run, refused by name (attach's first step; the planner's too). */
dt_status dt_train_device_check(const dt_train_config *c, int nranks);
/* dtrain plan --device cuda (planner_gpu.c): one GPU's plan of cfg at c's batch, printed (or as JSON); 0, or 2 after
 * saying why not. */
int dt_train_plan_gpu(const dt_train_config *c, const dt_plan_request *rq, const dt_gpt2_config *cfg, int nranks, FILE *f);
/* The GPU's name and its memory in use, for the run's first lines (NULL: none). */
const char *dt_train_device_name(const dt_train_device *d, double *used_gib, double *total_gib);
/* Whether attention on the GPU keeps each row's log-sum-exp (flash), not T x T probabilities. */
int dt_train_device_flash(const dt_train_device *d);
/* The GPU's peak for MFU: its bf16 (bf16 runs) or f32 (or TF32) GEMM rate measured now (4096^3), in GFLOP/s. */
dt_status dt_train_device_peak(const dt_train_device *d, bool bf16, double *gflops);

#endif
