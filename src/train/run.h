/* A GPT-2 training run's state, shared by the files that build it
 * (run_setup.c), save it (run_save.c), report it (run_output.c) and run its
 * loop (train.c). Internal to src/train. */
#ifndef DT_TRAIN_RUN_H
#define DT_TRAIN_RUN_H

#include "dtrain/context.h"
#include "dtrain/data.h"
#include "dtrain/engine.h"
#include "dtrain/obs.h"
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/train.h"
#include "device_setup.h"
#include "precond_setup.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct dt_grpo_run dt_grpo_run;

/* A GRPO step's figures over every rank: the rollout's rewards (mean, standard deviation over the completions),
 * the mean KL estimate and entropy (TRL's) a completion token, the mean completion's tokens, the share of tokens the clipping stopped,
 * the share of groups whose rewards were all equal (no signal: TRL's frac_reward_zero_std), the decoding's seconds
 * (a rank's mean) and generated tokens a second over the ranks, the tools' calls a completion and the share of calls that
 * failed (a result {"error": ...}, TRL's failure_frequency; both -1 without --grpo-tools); rank 0's first completion (text). */
typedef struct {
    double reward, reward_std, kl, entropy, entropy_coef, completion, clipped, flat, decode_s, rollout_tps, tool_calls, tool_failures;
    double cached; /* of the rollout's prompt tokens, the share a cache slot gave (a group's completions copy its prompt) */
    double each[DT_GRPO_MAX_REWARDS]; /* each reward function's mean (several: TRL's rewards/NAME/mean) */
    int nrewards;
    const char *sample;
} dt_grpo_step_stats;

/* TRL's DPO figures (rewards/accuracies, rewards/margins, rewards/chosen, rewards/rejected, logps/chosen,
 * logps/rejected): means over the pairs counted. */
enum { DT_TRAIN_DPO_ACCURACY, DT_TRAIN_DPO_MARGIN, DT_TRAIN_DPO_CHOSEN, DT_TRAIN_DPO_REJECTED, DT_TRAIN_DPO_LOGPS_CHOSEN,
       DT_TRAIN_DPO_LOGPS_REJECTED, DT_TRAIN_DPO_NFIGS };

/* Everything a run holds; torn down in one place. */
typedef struct {
    dt_train_config c;        /* this rank's copy (only rank 0 prints, saves, writes metrics) */
    dt_comm *w;
    dt_mesh *mesh;            /* the world as DP x TP x PP (several ranks) */
    int rank, nranks;
    int dp_rank, dp_size;     /* this rank's place among the data-parallel ranks: which slice of each batch it reads */
    dt_tp_ops tp_ops;         /* tensor parallelism's collectives, over the mesh's TP group */
    dt_cp *cp;                /* context parallelism's attention, over the mesh's CP group (--cp) */
    int T;                    /* this rank's positions a sequence: --seq, or --seq / --cp */
    dt_comm *mp;              /* the model-parallel group (the TP x PP ranks of one replica: DP x CP coordinates), with --pp */
    dt_comm *ep, *ep_replicas;/* --ep: the expert-parallel group (consecutive data-parallel ranks), and the ranks holding the
                               * same experts as this one (NULL: none other) */
    dt_ep_ops ep_ops;         /* expert parallelism's exchanges, over ep */
    dt_comm *moe_sums;        /* a mixture's balancing statistics over the stages and context-parallel ranks of one
                               * micro-batch (its TP and DP coordinates; NULL: none needed) */
    dt_part_sums moe_sums_ops;
    dt_comm *moe_glob;        /* and the global-batch loss's counts over every rank of one tensor-parallel place */
    dt_part_sums moe_glob_ops;
    dt_pipeline *pipe;        /* with --pp: the stage's runner, which the engine's step runs */
    double bubble;            /* the last step's idle share, the mean over the stages */
    double bubble_model;      /* the step replayed with its actions' measured durations (dt_pipeline_bubble) */
    bool tty;
    dt_gpt2 *m;
    dt_tokens *train, *val;
    dt_sft *sft, *sft_val;    /* --data FILE.jsonl: supervised fine-tuning's rows (sft_setup.c); train NULL then */
    dt_loader *tl, *vl;
    dt_loader *fl;            /* the loader forward-only passes read (evaluation's, the DPO reference's) */
    dt_dpo *dpo;              /* preference pairs in --data: DPO's loss (dpo_setup.c); its rows: the training file's, then --val-data's */
    double moe_worst, moe_mean; /* a mixture of experts' step: the most loaded expert over the mean, worst layer and average */
    double moe_val_worst, moe_val_mean; /* and over the last evaluation's batches */
    double moe_dropped;       /* and the share of its choices a capacity dropped (below 0: dropless) */
    double moe_ep_bytes;      /* and the bytes expert parallelism's exchanges sent between ranks, all ranks' */
    double moe_rank_load;     /* and the rows the busiest rank of an expert-parallel group ran over the group's mean */
    double moe_rank_rows;     /* and its rows summed over its layers first (what the experts' rank keeps for backward) */
    double moe_term[DT_MOE_TERMS]; /* and the balancing losses' means over its micro-batches (dt_program_moe_terms'; -1: off) */
    dt_grpo_run *grpo;        /* --grpo: the rollouts, the reward, the reference (grpo_run.c) */
    dt_grpo_step_stats grpo_step; /* the last step's (metrics, progress) */
    float dpo_step[DT_TRAIN_DPO_NFIGS], dpo_val[DT_TRAIN_DPO_NFIGS]; /* the last step's and evaluation's (metrics) */
    dt_engine *e;
    dt_train_precond pre;     /* --optimizer kfac or shampoo: the engine's preconditioner */
    dt_train_device dev;      /* --device cuda: the model on the GPU */
    dt_watchdog *wd;
    FILE *metrics;
    dt_tb_writer *tb;         /* --tensorboard (rank 0) */
    int32_t *in, *tg;
    int32_t *pos;             /* --pack: the batch's positions (each example's from 0), which the model reads */
    uint64_t *keys;           /* --lora-dropout: the training batch's row keys, which the model's dropout draws from */
    double fwd, bwd, data;    /* this step's forward, backward and batch-loading seconds */
    double wgt;               /* of backward, zb1's W (weight gradients) */
    double tp_comm;           /* of forward and backward, in tensor parallelism's collectives */
    int first_step;           /* 0, or where a resumed run goes on from */
    int model_step;           /* --model CHECKPOINT: the step of its weights (-1: not a checkpoint) */
    dt_trace_file *trace;
    double flops_per_step;    /* model FLOPs of one step, all ranks (dt_gpt2_flops_per_token) */
    double peak_gflops;       /* the run's peak: per-thread sgemm x peak_threads (0: unknown) */
    int peak_threads;         /* threads x ranks, at most the machines' cores */
    bool fresh;               /* the model starts from random weights, not a file */
    const char *peak_source;
    int peak_bf16;            /* the peak is the bf16 GEMM's */
    double t_start;
    bool refused_alike;       /* setup's refusal is one every rank makes alike (the memory check's): rank 0 says it */
    char metrics_path[4096], trace_path[4096]; /* under --report DIR unless given */
} run;

/* The mesh, model, data, engine, metrics file, watchdog and peak, and what the run says at its start (run_setup.c). */
dt_status dt_train_setup(run *r);
/* --report DIR: where the metrics and trace go unless named (run_setup.c). */
dt_status dt_train_observers(run *r);
/* Supervised fine-tuning (sft_setup.c; whether a --data path is one: dt_train_is_sft in train.h): its files opened and their loaders made;
 * the training data's tokens (a token file's, or the rows' T each); before a step or an evaluation of batches of l,
 * the count their losses divide by. */
dt_status dt_train_open_sft(run *r);
size_t dt_train_data_tokens(const run *r);
/* A pipeline stage's place in its checkpoint (run_save.c): its second-order state is its own. */
void dt_train_checkpoint_stage(const run *r, dt_checkpoint_model *cm);
void dt_train_loss_tokens(run *r, dt_loader *l, int batches);
/* Preference pairs (dpo_setup.c): DPO's loss on the program, its reference's log-probabilities recorded by forwards
 * of the base (LoRA's adapters off) over every row each rank reads; a loader's batch queued for the loss (rows of
 * --val-data follow the training file's); the pairs' DT_TRAIN_DPO_* figures since the last call, over every rank
 * (collective; NAN: none), said by rank 0 after an evaluation. */
dt_status dt_train_setup_dpo(run *r);
dt_status dt_train_dpo_queue(run *r, dt_loader *l);
dt_status dt_train_dpo_stats(run *r, bool say, float out[DT_TRAIN_DPO_NFIGS]);
/* GRPO (grpo_run.c): its prompts, reward, loss and reference set up (instead of --data); before each step the rollout
 * (every iterations steps; collective) and the forwards sent back to its first row; each micro-batch's rows into
 * r->in, r->tg; after the step its figures over every rank (collective). */
dt_status dt_train_setup_grpo(run *r);
dt_status dt_train_grpo_prepare(run *r, int step);
void dt_train_grpo_batch(run *r);
dt_status dt_train_grpo_stats(run *r, dt_grpo_step_stats *out);
void dt_train_grpo_destroy(run *r);
/* Forward-only over n batches of l (through the stages with a pipeline): the mean loss over the ranks that computed
 * losses (collective; train.c). A mixture of experts' counts of the passes are the caller's to read or drop. */
dt_status dt_train_forward_batches(run *r, dt_loader *l, int n, float *out);
/* A mixture of experts' load over the step just run, every rank's (collective): r->moe_worst, r->moe_mean. */
dt_status dt_train_moe_load(run *r);
/* The same over the forward passes since (an evaluation's), every rank's (collective): r->moe_val_worst, r->moe_val_mean. */
dt_status dt_train_moe_val_load(run *r);
/* The next training batch into r->in, r->tg: the engine's and the pipeline's callback (train.c). */
dt_status dt_train_next_batch(void *ctx, int k, const int32_t **in, const int32_t **tg);
/* --save: weights to a file, or the full state to a directory (run_save.c). */
dt_status dt_train_save(run *r, int steps_done);
/* One JSON line of the metrics file for a step (run_output.c). */
void dt_train_write_metrics(run *r, int step, float lr, const dt_step_result *s, double ms, double tps, bool eval, float val);
/* dtrain eval's line: the model's step (0: not a checkpoint), the loss and what it was measured on. */
void dt_train_write_eval_metrics(run *r, float val);
/* The same step's scalars as a TensorBoard event (--tensorboard). */
void dt_train_write_tensorboard(run *r, int step, float lr, const dt_step_result *s, double ms, double tps, bool eval, float val);
/* After the last step: the trace, every rank's memory and I/O, the report (run_output.c; collective). */
void dt_train_observe_end(run *r, int steps_done);
/* This rank's optimizer state: the optimizer's, and K-FAC's factors and decompositions. */
size_t dt_train_optim_bytes(const run *r);

#endif
