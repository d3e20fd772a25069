/* dtrain plan layer: what a configuration will need before it runs. So far
 * memory: ZeRO's model states (Rajbhandari et al. 2020: parameters,
 * gradients, optimizer state, each whole or split over the N data-parallel
 * ranks by the stage) plus activations, communication buffers and the token
 * files each rank holds. */
#ifndef DTRAIN_PLAN_H
#define DTRAIN_PLAN_H

#include "dtrain/model.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double params, grads, optim, comm, acts, data; /* bytes per rank */
    double runtime;                                /* the process itself: code, libraries, start-up state */
    double per_rank, per_machine;                  /* sums; per_machine: x the ranks on one machine */
} dt_plan_memory;

typedef struct {
    dt_gpt2_config model;
    int batch, seq, recompute, attention; /* attention: dt_attn_mode */
    dt_optim_config opt;
    int dp;                  /* data-parallel ranks */
    int tp, sp;              /* tensor-parallel ranks (0, 1: none), sequence parallelism */
    int pp;                  /* pipeline stages (0, 1: none): the costliest stage's rank counts (dt_gpt2_split_stages) */
    int micro, gpipe, zb;    /* with pp: micro-batches per step; GPipe keeps all of them in flight, 1F1B at most p - stage,
                              * zb (ZB-H1) at most p on every stage, each with the split backward's output gradients */
    int virt;                /* interleaved: chunks per stage (0 or 1: one); up to (v-1)p + 2(p-1) + 1 micro-batches in flight */
    int cp, cp_ulysses;      /* context-parallel ranks (0, 1: none): each holds seq / cp positions, attention's log-sum-exp and
                              * the ring's (or all-to-all's, cp_ulysses) work space of 10 (14) floats a position and channel */
    int local_ranks;         /* ranks on one machine */
    int stage;               /* 0: DDP; 1, 2, 3: ZeRO */
    size_t bucket_bytes;     /* stages 2, 3: a gradient bucket (the pool holds two in flight) */
    size_t data_bytes;       /* token files each rank reads whole */
    int shared_params;       /* ZeRO's ranks all on one machine share one copy of the parameters */
    dt_dtype precision;      /* DT_F32; mixed precision adds the parameters' 16-bit copy, halves the blocks' activations */
    size_t process_bytes;    /* a rank's resident memory before the model (measured: code, libraries, the runtime) */
} dt_plan_job;

/* Bytes per rank and per machine (fp32 Adam: DDP 16 bytes per parameter;
 * stage 1: 8 + 8/N; 2: 4 + 12/N; 3: 16/N, plus what the rest needs; with
 * shared_params, stages 1 and 2 hold 4/N of the parameters per rank). */
void dt_plan_memory_estimate(const dt_plan_job *job, dt_plan_memory *out);
/* The memory this machine can give: MemAvailable, or the cgroup's limit if lower. */
size_t dt_plan_available_memory(void);
/* Refuses (DT_ERR_ARG) a job whose machine would run out of memory, with the
 * figures and the stages that would fit ("ddp needs 26.1 GB on this machine,
 * 23.4 GB available; --zero 1 needs ..."). stage_built: the highest stage
 * dtrain has (higher ones are named as not built yet). */
dt_status dt_plan_check_memory(const dt_plan_job *job, int stage_built);

#ifdef __cplusplus
}
#endif
#endif
