/* dtrain train layer: the training loop that puts data, model, optimizer,
 * checkpoints and metrics together. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/model.h"
#include "dtrain/infer.h"
#include "dtrain/comm.h"
#include "dtrain/optim.h"
#include "dtrain/engine.h"
#include "dtrain/data.h"
#include "dtrain/context.h"
#include "dtrain/plan.h"
#include "dtrain/program.h"
#include "dtrain/kfac.h"
#include "dtrain/shampoo.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Group relative policy optimization (train/grpo.c; the run's side in train/grpo_run.c): --grpo PROMPTS rolls out
 * group completions of each prompt with the decoder over the trainer's weights, scores them by --reward, and trains
 * on them by TRL's GRPOTrainer's loss. */
typedef enum {
    DT_GRPO_LOSS_DAPO = 0, DT_GRPO_LOSS_GRPO, DT_GRPO_LOSS_DR_GRPO, DT_GRPO_LOSS_BNPO, DT_GRPO_LOSS_CISPO, DT_GRPO_LOSS_SAPO,
    DT_GRPO_LOSS_LUSPO, DT_GRPO_LOSS_VESPO, DT_GRPO_NLOSSES
} dt_grpo_loss;
typedef enum { DT_GRPO_SCALE_GROUP = 0, DT_GRPO_SCALE_BATCH, DT_GRPO_SCALE_NONE } dt_grpo_scale;
#define DT_GRPO_MAX_REWARDS 8
typedef struct {
    const char *prompts;      /* --grpo FILE: a .jsonl of {"prompt": text} or a text file of one prompt a line (NULL: no GRPO) */
    const char *reward[DT_GRPO_MAX_REWARDS]; /* --reward SPEC, once a reward function (dt_reward_create) */
    int nrewards;
    double reward_weight[DT_GRPO_MAX_REWARDS]; /* --reward-weights W,.. (TRL's reward_weights; 1 each) */
    int nweights;
    const char *chat_kwargs;  /* --chat-template-kwargs JSON: a conversational prompt's (TRL's chat_template_kwargs) */
    int group;                /* --grpo-group G: completions a prompt (TRL's num_generations, 8) */
    int iterations;           /* --grpo-iterations: steps a rollout trains (TRL's num_iterations, mu; 1) */
    int completion;           /* --completion-tokens N: a completion's most tokens (0: up to the row's end) */
    int top_k;                /* --top-k K: the sampling's (0: every token) */
    float top_p;              /* --top-p P: the sampling's nucleus (0: 1, every token) */
    float min_p;              /* --min-p P: the sampling's tokens at least P times as likely as the most likely (0: all) */
    float repetition_penalty; /* --repetition-penalty R: the sampling's, Hugging Face's (0: none) */
    double beta, epsilon;     /* the KL's coefficient (0.04, the paper's) and the ratio's clipping (0.2) */
    double epsilon_high;      /* --grpo-epsilon-high: the clipping's upper side (0: epsilon; DAPO's 0.28; cispo's cap) */
    double delta;             /* --grpo-delta: two-sided clipping, the unclipped ratio capped at delta (0: none) */
    int sequence;             /* --grpo-importance-sampling sequence: one ratio a completion (GSPO), not a token */
    dt_grpo_scale scale;      /* --grpo-scale-rewards group (TRL's default), batch or none */
    int decoupled;            /* --grpo-multi-objective normalize_then_sum (TRL's multi_objective_aggregation, GDPO's):
                               * each reward function normalized in its group before the weighted sum, which is then
                               * normalized over the whole batch (its mean and standard deviation) */
    int mask_truncated;       /* --grpo-mask-truncated: a completion that did not end is left out of the loss */
    double sapo_pos, sapo_neg; /* sapo's temperatures for positive and other advantages (0: TRL's 1 and 1.05) */
    float temperature;        /* the sampling's (1), the loss's log-probabilities' too (TRL's) */
    double top_entropy;       /* --grpo-top-entropy-quantile Q (TRL's top_entropy_quantile; 1: off): the policy term of
                               * only the micro-batch's (every rank's) tokens whose entropy is in its top Q (Wang et al.
                               * 2025, "80/20"): at or above the (1 - Q) quantile */
    double vespo[4];          /* --grpo-vespo K+,L+,K-,L-: vespo's gamma weights' shape for advantages >= 0 and below
                               * (0: TRL's 2, 3, 3, 2) */
    double off_policy;        /* --grpo-off-policy-mask D (TRL's off_policy_mask_threshold, DeepSeek-V3.2's; 0: off): a
                               * completion of negative advantage whose mean log pi_old - log pi over its tokens is
                               * above D leaves the policy term */
    int adaptive;             /* --grpo-adaptive-entropy H[,D[,MIN,MAX]] (TRL's use_adaptive_entropy, Skywork-OR1's): the
                               * bonus's coefficient (from entropy_coef) applied only while the last step's entropy over
                               * every rank's bonus tokens was at most H, and moved by D (0.005) toward it each step,
                               * within [MIN, MAX] ([0, 1]) */
    double ent_target, ent_delta, ent_min, ent_max;
    double entropy_coef;      /* --grpo-entropy-coef X (TRL's entropy_coef, 0): the loss less X times the micro-batch's
                               * mean entropy over the tokens its policy term reads (an exploration bonus) */
    dt_grpo_loss loss;        /* --grpo-loss (dapo, TRL's default) */
    int plain_kl;             /* --grpo-kl plain: the KL term not times the ratio (TRL's use_bias_correction_kl=False) */
    const char *tools;        /* --grpo-tools cmd:COMMAND: runs the tools a completion calls, which then goes on (NULL: none) */
    int tool_turns;           /* --grpo-tool-turns N: the most rounds of calls a completion makes (TRL's
                               * max_tool_calling_iterations; 0: as many as its row holds) */
} dt_grpo_config;

/* DPO's loss as TRL's DPOConfig sets it (train/dpo_loss.c): loss_type's kinds, each a pair's loss from its chosen and
 * rejected log-ratios (the policy's log-probability of the completion less the reference's) but sft (the chosen
 * completions' cross-entropy, the mean over a micro-batch's scored tokens), summed by loss_weights; label_smoothing
 * (robust's flip probability, exo_pair's epsilon), discopop_tau, and the f-divergence whose derivative scores the
 * log-ratios (f_divergence_type, f_alpha_divergence_coef). */
typedef enum {
    DT_DPO_SIGMOID, DT_DPO_HINGE, DT_DPO_IPO, DT_DPO_EXO_PAIR, DT_DPO_NCA_PAIR, DT_DPO_ROBUST, DT_DPO_BCO_PAIR, DT_DPO_SPPO_HARD,
    DT_DPO_APO_ZERO, DT_DPO_APO_DOWN, DT_DPO_DISCOPOP, DT_DPO_SFT, DT_DPO_SIGMOID_NORM, DT_DPO_AOT, DT_DPO_AOT_UNPAIRED, DT_DPO_NKINDS
} dt_dpo_kind;
typedef enum { DT_DPO_REVERSE_KL, DT_DPO_FORWARD_KL, DT_DPO_JS_DIVERGENCE, DT_DPO_ALPHA_DIVERGENCE } dt_dpo_divergence;
#define DT_DPO_MAX_LOSSES 8
typedef struct {
    double beta;               /* --dpo-beta (0: TRL's 0.1) */
    int nloss;                 /* --dpo-loss KIND[,KIND..] (0: sigmoid alone) */
    dt_dpo_kind loss[DT_DPO_MAX_LOSSES];
    int nweights;              /* --dpo-loss-weights W[,W..] (0: 1 each) */
    double weight[DT_DPO_MAX_LOSSES];
    double label_smoothing;    /* --dpo-label-smoothing (0) */
    double discopop_tau;       /* --dpo-discopop-tau (0: TRL's 0.05) */
    dt_dpo_divergence divergence; /* --dpo-f-divergence */
    double f_alpha;            /* --dpo-f-alpha (0: TRL's 0.5) */
    int ld;                    /* --dpo-ld-alpha A given (TRL's ld_alpha not None): LD-DPO's log-probabilities, */
    double ld_alpha;           /* a completion's tokens beyond its pair's shorter completion weighted by A, in [0, 1] */
    int wpo;                   /* --dpo-wpo (TRL's use_weighting): each pair's loss weighted by WPO's (Zhou et al. 2024)
                                * exp(the mean of log p_t - log sum_v p_v^2 over the chosen completion's tokens)
                                * times the same of the rejected's, under the policy, without gradient */
} dt_dpo_config;
/* --dpo-loss's list and --dpo-f-divergence's name into c; an error naming what is read. */
dt_status dt_dpo_losses_parse(const char *list, dt_dpo_config *c);
dt_status dt_dpo_divergence_parse(const char *name, dt_dpo_config *c);
/* c's settings as TRL takes them (defaults filled), or an error naming the flag: a kind's label smoothing out of its
 * range, weights that do not match the kinds, an f-divergence with a kind it has no form for, an ld_alpha outside
 * [0, 1], WPO's weights with aot's sorted pairs. */
dt_status dt_dpo_config_resolve(dt_dpo_config *c);
/* c's loss as it reads ("sigmoid", "sigmoid x 0.8 + bco_pair x 0.2 + sft", with its settings). */
void dt_dpo_config_describe(const dt_dpo_config *c, char *buf, size_t cap);
const char *dt_dpo_kind_name(dt_dpo_kind k);
const char *dt_dpo_divergence_name(dt_dpo_divergence d);
/* A pair's loss by c (resolved) but its sft part, from its chosen and rejected log-ratios (nc, nr: their scored
 * tokens, ipo's and sigmoid_norm's lengths), and its derivatives by them (*dc, *dr). */
double dt_dpo_pair_loss(const dt_dpo_config *c, double chosen, double rejected, int nc, int nr, double *dc, double *dr);
/* sft's weight among c's kinds (0: not one). */
double dt_dpo_sft_weight(const dt_dpo_config *c);
/* The kinds of c that read a micro-batch's n pairs together (aot, aot_unpaired: the log-ratios sorted across them):
 * their losses summed over the pairs, and their derivatives by each pair's chosen and rejected log-ratios added to
 * gc[], gr[]; refd[i]: pair i's reference log-probability of chosen less rejected's. */
double dt_dpo_batch_loss(const dt_dpo_config *c, int n, const double *cr, const double *rr, const double *refd, double *gc, double *gr);

typedef struct {
    const char *model;        /* preset (d6, 124M, ...) or an llm.c model file */
    const char *init;         /* image models: start from this torchvision state dict (safetensors) */
    dt_gpt2_config shape;     /* overrides from flags; 0 = from the preset or file */
    const char *data, *val_data;
    int batch, seq, steps, grad_accum, eval_every, eval_batches, threads;
    uint64_t seed;            /* initialisation */
    uint64_t shuffle_seed;    /* 0: batches in file order */
    int shuffle_rows;         /* with a shuffle seed: each batch row from anywhere in the file, not whole batches */
    dt_optim_config opt;
    dt_schedule sched;        /* learning rate and its schedule */
    float grad_clip;
    int train_batch_size;     /* DeepSpeed's rule, checked once the ranks are known (0: not given) */
    long resume_batch;        /* --resume without --grad-accum: the saved global batch, kept on any ranks (0: none to keep) */
    const char *save, *metrics; /* --save DIR: full-state checkpoints; FILE.bin / FILE.safetensors: weights only */
    const char *resume;       /* a checkpoint directory to continue from */
    const char *trace;        /* Chrome trace-event JSON of steps [trace_first, trace_last] (1-based) */
    int trace_first, trace_last;
    const char *report;       /* a run directory: metrics, run.json, trace and report.html go there */
    const char *tensorboard;  /* a folder for TensorBoard's event files (the metrics line's scalars), or NULL */
    const char *strategy;     /* the parallel strategy by name (NULL: ddp over several ranks) */
    int save_every;           /* also save every N steps (0: only at the end) */
    int keep_last;            /* checkpoints a --save DIR keeps, newest first (1: the latest alone) */
    int stop_after;           /* end this process after N steps, saving as at the end (0: run to steps) */
    int quiet;
    int overwrite;            /* --save may replace a checkpoint of another run */
    int print_every;          /* a progress line every N steps where stdout is not a terminal (DeepSpeed's steps_per_print; 1) */
    int recompute;            /* activation checkpointing */
    int sp;                   /* sequence parallelism on the tensor-parallel group */
    int attention;            /* dt_attn_mode */
    int nproc;                /* local ranks to launch (data parallelism); 1 = this process */
    int dp, tp, pp, cp;       /* the mesh (0: dp = the ranks left over by tp x pp x cp, the others 1) */
    int ep;                   /* expert parallelism: the data-parallel ranks that split each mixture's experts (0, 1: none) */
    int cp_impl;              /* dt_cp_impl: context parallelism's attention, ring (0) or all-to-all; -1: auto */
    int pp_schedule;          /* dt_pp_kind: 1f1b unless --pp-schedule */
    int pp_wire;              /* dt_pp_wire: what crosses a stage boundary (--pp-wire; fp32) */
    int cp_wire;              /* dt_pp_wire: ring attention's blocks and their gradients (--cp-wire; fp32) */
    int pp_print;             /* --pp-schedule-print */
    int virtual_stages;       /* --virtual-stages: chunks per stage (interleaved; 0: its 2) */
    int epochs;               /* image classification (--model mlp, resnet...) trains in epochs */
    int sync_bn;              /* ResNets: BatchNorm's statistics over every rank's batch (torch.nn.SyncBatchNorm) */
    int synthetic;            /* image models: --steps on one random batch (Horovod's synthetic benchmark), no data */
    double bucket_mb;         /* DDP bucket cap (the first bucket is 1 MiB) */
    int step_at_end;          /* DDP: the optimizer after backward, not bucket by bucket inside it */
    dt_lora_config lora;      /* --lora-rank R (0: every weight trains), --lora-alpha, --lora-targets (NULL: the family's),
                               * --lora-dropout (below 0: not given, 0 or --lora DIR's) */
    const char *lora_from;    /* --lora DIR: PEFT's adapter folder to start from (its rank, alpha and targets) */
    const char *tokenizer;    /* --tokenizer tokenizer.json: --data FILE.jsonl's (NULL: the --model folder's) */
    const char *chat_template; /* --chat-template KIND|none (data/chat_template.c) (NULL: the tokenizer_config.json's) */
    int pack;                 /* --pack: a .jsonl's examples packed into rows (TRL's packing, best-fit decreasing) */
    dt_dpo_config dpo;        /* --dpo-beta, --dpo-loss and the rest: preference pairs in --data train by DPO */
    dt_grpo_config grpo;      /* --grpo PROMPTS and its flags */
    float moe_z_loss;         /* --moe-z-loss X: the router z-loss's coefficient (0: none) */
    float moe_seq_aux_loss;   /* --moe-seq-aux-loss X: the sequence-wise balancing loss's (0: none) */
    float moe_global_aux_loss; /* --moe-global-aux-loss X: the global-batch balancing loss's (0: none) */
    int shared_experts;       /* --shared-experts S: DeepSeek's S ungated shared experts of --ffn each beside the routed ones */
    double stall_timeout;     /* seconds a rank may wait for a live peer that never joins (warn; 2x: stop); 0 off */
    int skip_nonfinite;       /* a step whose loss or gradient norm is not finite is skipped (else the run stops) */
    dt_dtype precision;       /* DT_F32, or mixed precision: DT_BF16, DT_F16 (dt_gpt2_set_precision) */
    int cuda;                 /* --device cuda[:N]: the model on NVIDIA GPU cuda - 1 (0: the CPU) */
    int cuda_named;           /* N was given (else each rank takes its local rank's GPU) */
    int tf32;                 /* --tf32: the GPU's f32 matmuls in TF32 on its tensor cores */
    dt_loss_scale_config loss_scale; /* fp16's (DeepSpeed's fp16 section; its defaults) */
    dt_dtype grad_comm;       /* the gradients' type in data parallelism's allreduce (DT_F32 unless --grad-comm) */
    dt_dtype grad_store;      /* --grad-store: DT_F32, or the 16-bit type the averaged gradients are kept in (the precision's) */
    dt_codec_config codec;    /* --compress powersgd, --compress-rank R, --compress-start N (kind DT_CODEC_NONE: none) */
    int kfac_on;              /* --optimizer kfac: K-FAC's preconditioning (kfac) before opt's update (SGD, or --kfac-base adamw) */
    dt_kfac_config kfac;
    int shampoo_on;           /* --optimizer shampoo: Shampoo's directions (shampoo) before SGD's update (its momentum, weight decay) */
    dt_shampoo_config shampoo;
    int argc;                 /* the command line, re-executed for each rank */
    char **argv;
} dt_train_config;

void dt_train_defaults(dt_train_config *c);
/* Whether a --data path is supervised fine-tuning's (.jsonl), not a token file. */
bool dt_train_is_sft(const char *path);
/* Runs the training described by c; prints progress; returns a process exit code. */
int dt_train_run(const dt_train_config *c);

/* dtrain plan's own flags beside train's. */
typedef struct {
    const char *hardware; /* "this", a preset or a JSON file */
    double params;        /* --params N (0: the model's shape) */
    int nodes;            /* machines the ranks span (0: this one; GPUs: devices_per_node a machine) */
    int json, search;
    int argc;             /* the command's train flags (argv[0] the command's name), for the train command a plan ends with */
    char **argv;
    double ties;          /* --search: layouts within this fraction of a group's fastest share its rank (--ties PCT) */
    double expert_load;   /* --expert-load X: with --ep, each layer's busiest rank's routed rows over the mean, averaged over the layers (0: 1, balanced) */
    double expert_rows;   /* --expert-load X,K: K, the busiest rank's rows summed over its layers over the mean (0: 1, balanced) */
} dt_plan_request;
/* Prints the plan of c's job (or with search every layout of its ranks); an exit code (2: refused, said). */
int dt_train_plan(const dt_train_config *c, const dt_plan_request *rq, FILE *out);

/* The layout rules (layout.c), one copy for train and plan. */
typedef struct {
    int dp, tp, pp, cp;  /* the mesh's axes (1: unused) */
    int ep;              /* of dp, the ranks that split the experts (0, 1: none) */
    int local_ranks;     /* ranks on one machine */
    int shared_params;   /* ZeRO's replicas share one parameter copy per machine */
} dt_train_dims;
/* The data-parallel ranks of a job of nranks: --dp, else what --tp x --pp x --cp leave (at least 1). */
int dt_train_dp(const dt_train_config *c, int nranks);
/* --dp x --tp x --pp x --cp against the job's ranks, and what each axis does not take yet (paper: only what no
 * implementation could run, for the planner's other hardware). */
dt_status dt_train_check_mesh(const dt_train_config *c, int nranks, int paper);
/* What the model's shape allows: --seq within its positions, stages and chunks within its units, heads over TP and CP. */
dt_status dt_train_check_model(const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d);
/* --experts, --experts-top-k, --moe-aux-loss over a model's config (a preset, or from_file: a file's, which keeps its
 * experts): a Llama made Mixtral's mixture; what contradicts the model refused. */
dt_status dt_train_take_experts(const dt_train_config *c, bool from_file, dt_gpt2_config *cfg);
/* dt_train_check_model before any rank starts, where the model is a preset (with the shape flags over it). */
dt_status dt_train_check_preset(const dt_train_config *c, int nranks);
/* Whether --model names an image model (mlp, mlp:H1,..., resnet:small, resnet18/34/50): the one place that reads the
 * spelling; a transformer's family comes from its preset's or file's config. */
int dt_train_is_image_model(const char *model);
/* Chunks per pipeline stage: --virtual-stages, 2 by default for the interleaved schedule, else 1. */
int dt_train_pp_virt(const dt_train_config *c);
/* Context parallelism's attention: --cp-impl, or auto's choice (dt_cp_choose). */
dt_cp_impl dt_train_cp_impl(const dt_train_config *c, const dt_gpt2_config *cfg, int tp, int cp);
/* The memory plan's description of the job, with the token files it reads (process_bytes left 0 for the caller). */
void dt_train_plan_job(const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d, dt_plan_job *job);

/* Full-state checkpoints (checkpoint_write.c, _read.c, _describe.c): DIR/latest names DIR/step-N/ with
 * manifest.json, params.f32 and optim.f32; see the file for the format. */
typedef struct {
    int step;                 /* optimizer steps done */
    uint64_t epoch;           /* the data loader: pass over the file, */
    size_t next;              /* next global batch of it, */
    size_t tokens_per_batch;  /* tokens per global batch (ranks x batch x seq; an image model: images), */
    size_t data_tokens;       /* tokens in the training file (an image model: training images) */
} dt_checkpoint_position;
/* What a checkpoint holds of a model and checks on resume: its table and
 * stores, its kind's shape as named integers (GPT-2: max_seq_len, vocab
 * size, ...; Llama: those, K/V heads, head and MLP widths, ...; a ResNet:
 * depth, image channels, height, width, classes) and named numbers (Llama:
 * the norms' epsilon, the rotary settings; a mixture of experts: their count, top-k, renormalisation and the
 * balancing loss's coefficient), and state beside the parameters
 * (BatchNorm's running averages: buffers.f32). */
typedef struct {
    char key[48];     /* dt_state_units's, and on a pipeline stage "-stageSofP" (each stage's own state) */
    int units;
    size_t floats;
    long steps;       /* its own count */
    uint64_t sizes;   /* a hash of the units' sizes: a resume with others starts afresh */
    float *data;
} dt_checkpoint_units;
typedef struct {
    dt_model m;
    int nshape, nfshape;
    const char *shape_names[22], *fshape_names[9];
    int shape[22];
    double fshape[9];
    float *buffers;
    size_t nbuffers;
    const dt_lora_config *lora; /* the model is LoRA's adapters on a frozen base (NULL: the whole model trains) */
    /* A gradient codec's state to save (codec.f32, dt_checkpoint_codec_gather: rank 0's copy of every rank's, a pipeline
     * stage's first rank its stage's; NULL, 0: none), the last codec_shared of them the per-bucket state every rank shares (Ok-TopK's), and the ranks it came from */
    float *codec_state;
    size_t codec_floats, codec_shared;
    int codec_ranks;
    /* A second-order optimizer's state to save (KEY.f32, dt_checkpoint_units_gather: rank 0's copy, every unit in
     * order): the engine's preconditioner's; data NULL: none */
    dt_checkpoint_units units;
    int stage, stages; /* a pipeline's stage and stages (0, 0: none): its second-order state is its own */
    int chunks;        /* the interleaved schedule's chunks a stage (its layers not one run of the model's: 0 or 1, one) */
} dt_checkpoint_model;
void dt_checkpoint_gpt2(dt_gpt2 *g, dt_checkpoint_model *out);
void dt_checkpoint_resnet(dt_resnet *m, dt_checkpoint_model *out);
/* Whether --save names a checkpoint directory (not FILE.bin / FILE.safetensors). */
int dt_checkpoint_is_dir(const char *save);
/* Creates dir if needed and checks that it can be written (at start-up).
 * A dir holding another run's checkpoint is refused unless it is the one
 * resumed from or overwrite is set. */
dt_status dt_checkpoint_check_dir(const char *dir, const char *resume, int overwrite);
/* A path given to flag (--save, ckpt export) whose extension says something
 * dtrain does not write (model.pt) is refused; a directory has none. */
dt_status dt_checkpoint_check_path(const char *path, const char *flag);
/* Rank 0 writes the state (every data-parallel rank holds the same); when
 * the engine shards the optimizer, every rank of w (the data-parallel ranks)
 * calls it and writes its own slice (w NULL otherwise). */
dt_status dt_checkpoint_save(const char *dir, dt_comm *w, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm,
                             dt_engine *e, const dt_checkpoint_position *pos);
/* Collective over w (the data-parallel ranks; NULL: one): the engine's codec state, every rank's, into rank 0's
 * cm->codec_state (malloc'd: the caller frees it) where a step was compressed (else none). */
dt_status dt_checkpoint_codec_gather(dt_engine *e, dt_comm *w, dt_checkpoint_model *cm);
/* Collective over w (a stage's data-parallel ranks): the codec's state from step folder sub (rank 0 reads it; cm: the
 * stage's) where this run's codec, rank, ranks and stages are the saved ones (else it starts afresh, said); the codec's
 * step count set to step. */
dt_status dt_checkpoint_codec_resume(const char *sub, dt_comm *w, dt_engine *e, int step, const dt_checkpoint_model *cm);
/* Collective over w (the data-parallel ranks; NULL: one): the state units of the engine's preconditioner and
 * optimizer (optim.h) into rank 0's cm->units (their data malloc'd: dt_checkpoint_release frees them). */
dt_status dt_checkpoint_units_gather(dt_engine *e, dt_comm *w, dt_checkpoint_model *cm);
/* Collective over w and world (the job's ranks; NULL: one process): the saved state units from step folder sub into the
 * ranks that hold them now, and their counts of steps, where this run's units are the saved ones (else that state starts
 * afresh, said); cm: the stage's. State saved by another pipeline split (whole, or in other stages) is cut as this
 * run's stages hold the whole model's units, each piece's sizes checked. */
dt_status dt_checkpoint_units_resume(const char *sub, dt_comm *w, dt_comm *world, dt_engine *e, const dt_checkpoint_model *cm);
/* Both gathers (codec, units), collective over the engine's data-parallel ranks; and what they allocated, freed. */
dt_status dt_checkpoint_gather(dt_engine *e, dt_checkpoint_model *cm);
void dt_checkpoint_release(dt_checkpoint_model *cm);
/* Collective over w (may be NULL): rank 0 reads dir's latest checkpoint,
 * checks it against this run (model shape, optimizer: a clear error naming
 * the field; damaged or partial files: naming the file), and every rank
 * gets the parameters, optimizer state and position. */
dt_status dt_checkpoint_resume(const char *dir, dt_comm *w, const dt_train_config *c, const dt_checkpoint_model *cm, dt_engine *e,
                               dt_checkpoint_position *pos);
/* The latest checkpoint's weights as a model of its shape (*step: its step):
 * dtrain ckpt export. dir may also be one step's folder (DIR/step-N). */
dt_status dt_checkpoint_load_model(const char *dir, dt_gpt2 **out, int *step);
/* The latest checkpoint's LoRA adapters (a LoRA run's) on a table-only program of its model's shape
 * (dt_program_create_table): what PEFT's folder is written from. */
dt_status dt_checkpoint_load_adapters(const char *dir, dt_program **out);
/* The run's settings that dir's latest checkpoint stores, into c (before the
 * flags, which override them): --resume DIR alone goes on as the run did,
 * saving into dir unless --save says otherwise. */
dt_status dt_checkpoint_read_settings(const char *dir, dt_train_config *c);
/* A resumed run keeps its saved global batch (c->resume_batch) on nranks: the accumulation set to match, said
 * once where say; an error naming flags that would keep it where no accumulation does. */
dt_status dt_train_keep_global_batch(dt_train_config *c, int nranks, int say);
/* Whether path is a checkpoint directory (DIR with latest, or DIR/step-N). */
int dt_checkpoint_is_checkpoint(const char *path);
/* A model from whatever path names: a checkpoint directory (its weights;
 * *step its step), or a weights file or HF folder (dt_model_load; *step -1). */
dt_status dt_checkpoint_load_weights(const char *path, int heads, dt_gpt2 **out, int *step);
/* What the latest checkpoint of dir holds, as text (dtrain ckpt info). */
dt_status dt_checkpoint_describe(const char *dir, FILE *out);
/* Every file of one step's folder against its manifest (sizes, hashes): a line to out (may be NULL) when whole,
 * else an error naming the file and what differs. */
dt_status dt_checkpoint_verify_step(const char *sub, FILE *out);
/* Each checkpoint dir keeps (or dir itself, one step's folder), newest first, a line each to out; an error
 * counting the damaged ones. */
dt_status dt_checkpoint_verify(const char *dir, FILE *out);
/* Puts the loader where the checkpoint's was (converting between layouts where the data order allows). */
dt_status dt_checkpoint_seek(const dt_checkpoint_position *pos, dt_loader *l, size_t tokens_per_batch, int shuffled);

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

/* Sampling from a trained model: the prompt's tokens, then count tokens
 * drawn as sampling says (random state from seed), or fewer where one of
 * ends is drawn (the text ends there, that token not emitted); each new token goes to
 * emit(token, ctx) as soon as it is drawn. On one process with cache, the
 * decoder's key/value cache (weights as quant says); when the context
 * fills, its last half is read again. Without the cache, each token's
 * window of the last max_seq_len tokens goes through forward. With pp of
 * several ranks, m is this rank's pipeline stage (units [ua, ub), the
 * stages in pp's rank order): each window goes through the stages, the last
 * draws the token, emits it and sends it to the others (collective over pp;
 * every rank gives the same arguments; no cache). With the cache it takes
 * *m (the decoder's, *m NULL after: the weights are held once); otherwise
 * the model stays the caller's. */
typedef void (*dt_emit_fn)(int token, void *ctx);
typedef struct {
    int count;
    dt_sampling sampling;
    uint64_t seed;
    int cache;
    dt_quant quant;
    int cuda; /* the cache's decoder on NVIDIA GPU cuda - 1 (0: the CPU) */
    const dt_token_ends *ends; /* tokens that end the text, not emitted (NULL: count tokens whatever they are) */
} dt_generate_options;
dt_status dt_generate(dt_gpt2 **m, dt_comm *pp, const int32_t *prompt, int nprompt, const dt_generate_options *o, dt_emit_fn emit,
                      void *ctx);

/* The model a rank of w runs from a weights file or checkpoint: the whole
 * one (w NULL or one rank), or its pipeline stage (stages split by cost at
 * the model's longest context), or with tp its tensor-parallel part (its
 * collectives *ops over w, which must outlive the model). */
dt_status dt_generate_load(const char *model, const char *lora, dt_comm *w, bool tp, dt_tp_ops *ops, dt_gpt2 **out);
/* The same from a model already in memory, which it takes (destroyed, or returned as *out on one rank). */
dt_status dt_generate_split(dt_gpt2 *whole, dt_comm *w, bool tp, dt_tp_ops *ops, dt_gpt2 **out);

/* Reads a DeepSpeed-style JSON config (a subset: train_micro_batch_size_per_gpu,
 * gradient_accumulation_steps, optimizer {type, params}, scheduler {type,
 * params}, gradient_clipping, steps) into c. Unknown keys warn; bad values fail
 * naming the key. */
dt_status dt_train_config_load(const char *path, dt_train_config *c);

/* Direct preference optimization (train/dpo.c), TRL's DPOTrainer's loss (c: resolved) over rows of preference pairs
 * (dt_sft_pairs: row 2i chosen, 2i + 1 rejected), nrows of them. dt_dpo_token_loss is a program's token loss (ctx: the
 * dt_dpo): before each forward with targets, the first of its rows is queued (dt_dpo_queue; dt_dpo_restart empties the
 * queue, each step). With dt_dpo_set_reference on, forwards record the rows' reference log-probabilities (loss 0);
 * off, they compute the loss from them (NAN for a row
 * whose reference is not recorded). Statistics since the last clear, summed over the pairs seen: count, reward
 * accuracy (chosen's reward above rejected's), chosen's and rejected's rewards (beta times the log-ratios), loss, and
 * chosen's and rejected's log-probabilities under the policy (LD-DPO's where it weighs them; TRL's logps/chosen,
 * logps/rejected). */
typedef struct dt_dpo dt_dpo;
enum { DT_DPO_PAIRS, DT_DPO_ACCURATE, DT_DPO_CHOSEN, DT_DPO_REJECTED, DT_DPO_LOSS, DT_DPO_LOGPS_CHOSEN, DT_DPO_LOGPS_REJECTED, DT_DPO_NSTATS };
dt_status dt_dpo_create(const dt_dpo_config *c, size_t nrows, dt_dpo **out);
void dt_dpo_destroy(dt_dpo *d);
dt_status dt_dpo_queue(dt_dpo *d, size_t row);
void dt_dpo_restart(dt_dpo *d);
void dt_dpo_set_reference(dt_dpo *d, bool on);
double dt_dpo_beta(const dt_dpo *d);
const dt_dpo_config *dt_dpo_config_of(const dt_dpo *d); /* its settings, resolved (defaults filled) */
double dt_dpo_reference(const dt_dpo *d, size_t row); /* NAN: not recorded */
void dt_dpo_stats(dt_dpo *d, double out[DT_DPO_NSTATS], bool clear);
float dt_dpo_token_loss(void *ctx, const dt_token_rows *r, float *dce);

/* GRPO's loss over one rank's rollout of rows rows of T tokens (whole groups), as a program's token loss (ctx: the
 * dt_grpo). dt_grpo_begin takes the rows' advantages (dt_grpo_advantages: TRL's scale_rewards "group") and dapo's
 * weight of a token (1 / the global batch's completion tokens, times the passes the engine and data parallelism
 * average over); dt_grpo_restart sends the next forwards back to row 0 in a mode: DT_GRPO_RECORD_REF records the
 * reference's log-probabilities (loss 0), DT_GRPO_RECORD_OLD trains and records pi_old (the rollout's first pass),
 * DT_GRPO_TRAIN trains against the recorded pi_old. Statistics since the last clear: completion tokens, the sum of
 * their KL estimates, the ratios the clipping stopped and how many ratios there were (tokens, or completions with
 * --grpo-importance-sampling sequence; TRL's clip_ratio counts so), the sum of their entropies; the entropy bonus's
 * tokens' entropies and count (its adaptive coefficient's window). */
typedef struct dt_grpo dt_grpo;
enum { DT_GRPO_TRAIN = 0, DT_GRPO_RECORD_OLD, DT_GRPO_RECORD_REF };
enum { DT_GRPO_TOKENS, DT_GRPO_KL, DT_GRPO_CLIPPED, DT_GRPO_CLIP_UNITS, DT_GRPO_ENTROPY, DT_GRPO_BONUS_ENTROPY, DT_GRPO_BONUS_TOKENS,
       DT_GRPO_NSTATS };
void dt_grpo_defaults(dt_grpo_config *c);
dt_status dt_grpo_loss_parse(const char *s, dt_grpo_loss *out);
const char *dt_grpo_loss_name(dt_grpo_loss k);
dt_status dt_grpo_create(const dt_grpo_config *c, int rows, int T, dt_grpo **out);
void dt_grpo_destroy(dt_grpo *g);
dt_status dt_grpo_scale_parse(const char *s, dt_grpo_scale *out);
/* n rewards' advantages, whole groups of group: each less its group's mean, over (scale) the group's standard deviation,
 * or batch_sd (the whole batch's, every rank's: dt_grpo_batch_sd), or nothing; + 1e-4 (TRL's). */
void dt_grpo_advantages(const float *rewards, int n, int group, dt_grpo_scale scale, double batch_sd, float *adv);
/* The standard deviation (Bessel's) of a batch of count rewards from their sum and sum of squares. */
double dt_grpo_batch_sd(double sum, double sumsq, double count);
/* GDPO's rewards (normalize_then_sum) of n completions in whole groups: each of nfun functions' rewards (each[k][i])
 * less its group's mean over its group's standard deviation (+ 1e-4), summed by weight; then the advantages: those
 * less the whole batch's mean (every rank's: mean) over its standard deviation (sd, + 1e-4). */
void dt_grpo_decoupled_rewards(float *const *each, const double *weight, int nfun, int n, int group, float *out);
void dt_grpo_batch_advantages(const float *rewards, int n, double mean, double sd, float *adv);
/* A row of T inputs and targets: the prompt's P tokens, then the completion's C (P + C <= T + 1), the completion's
 * tokens scored (the target of position t is token t + 1) but those mask marks 0 (the tools' results in it, TRL's
 * tool_mask; mask NULL: every one), the rest padding (0, DT_IGNORE_INDEX). */
void dt_grpo_row(const int32_t *prompt, int P, const int32_t *completion, const unsigned char *mask, int C, int T, int32_t *in, int32_t *tg);
void dt_grpo_begin(dt_grpo *g, const float *adv, double token_scale);
void dt_grpo_restart(dt_grpo *g, int mode);
void dt_grpo_stats(dt_grpo *g, double out[DT_GRPO_NSTATS], bool clear);
const float *dt_grpo_reference(const dt_grpo *g); /* [rows * T]: each target's reference log-probability */
float dt_grpo_token_loss(void *ctx, const dt_token_rows *r, float *dce);
/* p's loss made g's (its token loss), over its logits at the sampling temperature (TRL's: its log-probabilities are
 * of the distribution the completions were drawn from); the policy's and the reference's programs alike, the policy's
 * forwards with the rows' entropies (reference false). */
dt_status dt_grpo_attach(dt_grpo *g, dt_program *p, bool reference);
/* The ranks whose micro-batches an entropy quantile reads together (TRL gathers them; NULL, the default: this one). */
void dt_grpo_set_comm(dt_grpo *g, dt_comm *c);
/* After a step with --grpo-adaptive-entropy: the coefficient moved by the step's entropy over the bonus's tokens (sum
 * and count over every rank: DT_GRPO_BONUS_ENTROPY, DT_GRPO_BONUS_TOKENS) and that entropy kept for the next step's
 * gate. dt_grpo_entropy_coef: the coefficient the bonus has now (entropy_coef's, or the adaptive one). */
void dt_grpo_adapt(dt_grpo *g, double entropy_sum, double tokens);
double dt_grpo_entropy_coef(const dt_grpo *g);

/* A completion's reward (train/reward.c), from --reward SPEC: contains:WORD (1 when the completion holds WORD, else
 * 0), count:WORD (how many times), or cmd:COMMAND, a program started once (sh -c) that reads one JSON line a
 * completion on its standard input and answers each with one number on a line of its standard output: {"prompt":
 * text, "completion": text}, or for a conversational prompt, as TRL's reward functions get them, {"prompt":
 * [messages], "completion": [{"role": "assistant", "content": text}]}. */
typedef struct dt_reward dt_reward;
dt_status dt_reward_create(const char *spec, dt_reward **out);
void dt_reward_destroy(dt_reward *r);
/* The rewards of n completions (texts with their lengths) of their prompts: a prompt's text, or (messages[i] not
 * NULL; messages NULL: none) its messages, a JSON array as written; a conversational completion that called tools
 * (turns[i] not NULL; turns NULL: none) is its messages, a JSON array (the answers with their tool_calls, the tools'
 * results), as TRL's reward functions get it. */
dt_status dt_reward_score(dt_reward *r, int n, const char *const *prompts, const char *const *messages, const char *const *completions,
                          const size_t *lens, const char *const *turns, float *out);

/* Draws the loss (and validation loss) of a metrics file as an SVG, the y
 * axis linear or (log_y) logarithmic; null losses leave gaps. */
dt_status dt_plot_losses(const char *metrics_path, const char *svg_path, int log_y);
/* The same document in memory (*svg to be freed). */
dt_status dt_plot_svg(const char *metrics_path, int log_y, char **svg, size_t *len);

/* What run.json records besides the config (see run_record.c). */
/* Per rank: data read bytes, s; checkpoint write bytes, s; read bytes, s; then bytes of parameters,
 * gradients, optimizer state, communication buffers, activations, and the peak resident size; then its place on the
 * mesh: data-parallel, tensor-parallel, pipeline-stage and context-parallel coordinates. */
#define DT_RUN_RANK_FIELDS 16
typedef struct {
    dt_gpt2_config model;
    size_t params;
    int nranks, steps_done;
    const char *strategy, *metrics, *trace, *peak_source;
    double peak_gflops, flops_per_step, wall_s;
    double memory[5];         /* bytes: parameters, gradients, activations, optimizer state, peak RSS (rank 0) */
    const double *ranks;      /* nranks x DT_RUN_RANK_FIELDS */
    /* --device cuda (rank 0's GPU; device NULL: the CPU): its name and ordinal, its memory in use at the end and in all
     * (bytes), and attention's form there (flash, or the T x T probabilities) */
    const char *device;
    int device_ordinal, device_flash;
    double device_used, device_total;
} dt_run_record;
dt_status dt_run_record_write(const char *path, const dt_train_config *c, const dt_run_record *r);


#ifdef __cplusplus
}
#endif
#endif
