/* dtrain plan layer: what a configuration will need before it runs. So far
 * memory: ZeRO's model states (Rajbhandari et al. 2020: parameters,
 * gradients, optimizer state, each whole or split over the N data-parallel
 * ranks by the stage) plus activations, communication buffers and the token
 * files each rank holds. */
#ifndef DTRAIN_PLAN_H
#define DTRAIN_PLAN_H

#include "dtrain/codec.h"
#include "dtrain/kfac.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"
#include "dtrain/shampoo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double params, lowp, grads, optim, comm, acts, data; /* bytes per rank; lowp: the parameters' 16-bit copy */
    double precond, precond_scratch;               /* a second-order optimizer's factors, roots, bases and their scratch
                                                    * (K-FAC, Shampoo: the rank holding most; SOAP); of it, the scratch */
    double runtime;                                /* the process itself: code, libraries, start-up state */
    double mapped;                                 /* pages the rank maps beside its own, which its resident size counts and
                                                    * the machine holds once: the rest of the machine's one parameter copy,
                                                    * the peers' gradients reduced in place, ZeRO 2 and 3's pool mapped again */
    double not_at_once;                            /* of lowp and mapped, what is not resident at once (per_rank leaves it out) */
    double per_rank, per_machine;                  /* sums; per_machine: x the ranks on one machine */
} dt_plan_memory;

typedef struct {
    dt_gpt2_config model;    /* any family of the model program (its family, K/V heads, MLP width, tied or not) */
    double params_override;  /* --params N: the model states of exactly N parameters (0: the shape's) */
    int paper_states;        /* ZeRO's anatomy (2 + 2 + K bytes: 16-bit parameters and gradients, K = 12 of f32 master weights and
                              * Adam, every part sharded by its stage), for devices dtrain does not run on; else dtrain's own */
    int paper_acts;          /* activations as Megatron-LM keeps them on a GPU (Korthikanti et al. 2022, dt_plan_paper_*), for
                              * devices dtrain does not run on; else the arenas dtrain allocates */
    dt_dtype grad_store, grad_comm; /* --grad-store: the averaged gradients' type; --grad-comm: their type in the reductions */
    int batch, seq, recompute, attention; /* attention: dt_attn_mode */
    dt_optim_config opt;
    int dp;                  /* data-parallel ranks */
    int ep;                  /* of them, the ranks that split a mixture's experts (0, 1: none): a rank holds E/ep of them, whose
                              * states shard over the dp/ep ranks holding the same; each layer's tokens go to their experts' ranks
                              * and back (4 all-to-alls a layer and micro-batch, 6 recomputing) */
    double expert_load;      /* with ep: each layer's busiest rank's routed rows over the mean, the layers' average (0, 1: balanced) */
    double expert_rows;      /* and the busiest rank's rows summed over its layers over the mean: the rows it keeps (0, 1: balanced) */
    int tp, sp;              /* tensor-parallel ranks (0, 1: none), sequence parallelism */
    int pp;                  /* pipeline stages (0, 1: none): the costliest stage's rank counts (dt_gpt2_split_stages) */
    int micro, gpipe, zb;    /* with pp: micro-batches per step; GPipe keeps all of them in flight, 1F1B at most p - stage,
                              * zb (ZB-H1) at most p on every stage, each with the split backward's output gradients */
    int virt;                /* interleaved: chunks per stage (0 or 1: one); up to min(2p, (v+1)p - 1 - 2 stage) micro-batches in flight */
    int pp_wire;             /* dt_pp_wire: the stages' messages in f32 (whatever the precision), bf16 or int8 (--pp-wire) */
    int cp, cp_ulysses;      /* context-parallel ranks (0, 1: none): each holds seq / cp positions, attention's log-sum-exp and
                              * the ring's (or all-to-all's, cp_ulysses) work space of 10 (14) floats a position and channel */
    int cp_wire;             /* dt_pp_wire: the ring's blocks and their gradients in f32, bf16 or int8 (--cp-wire) */
    int local_ranks;         /* ranks on one machine */
    int stage;               /* 0: DDP; 1, 2, 3: ZeRO */
    size_t bucket_bytes;     /* stages 2, 3: a gradient bucket (the pool holds two in flight) */
    size_t data_bytes;       /* token files each rank reads whole */
    int shared_params;       /* ZeRO's ranks all on one machine share one copy of the parameters */
    dt_dtype precision;      /* DT_F32; mixed precision adds the parameters' 16-bit copy, halves the blocks' activations */
    size_t process_bytes;    /* a rank's resident memory before the model (measured: code, libraries, the runtime) */
    size_t head_process_bytes; /* of it, what timing the head left (the BLAS's panel of its weight gradient): a rank
                                * without the head does not hold it */
    int threads;             /* a rank's threads (0: the machine's cores shared by its ranks) */
    int nodes;               /* machines the job spans (0, 1: one) */
    dt_lora_config lora;     /* LoRA (rank 0: none): the base frozen (its weights only), the adapters' gradients and state */
    dt_codec_config codec;   /* a gradient codec (DDP, ZeRO-1; kind DT_CODEC_NONE: none): what its exchanges send, its compression's time */
    /* --grad-clip, --skip-nonfinite, --step-at-end: with the rest of the job, whether data parallelism's ranks take turns
     * at the update inside backward (the engine's rule: dt_engine_updates_in_backward) */
    float grad_clip;
    int skip_nonfinite, step_at_end;
    int steps;               /* the run's steps (0: not known): 0/1 Adam's mix of whole, signed and silent steps over them */
    int kfac_on, shampoo_on; /* a second-order optimizer over opt (SOAP is opt.kind): its state and its time at its intervals */
    dt_kfac_config kfac;
    dt_shampoo_config shampoo;
} dt_plan_job;

/* What a layout runs on. A device is a rank: a GPU, or on a CPU a rank with its share of the cores. */
typedef struct {
    char name[64];
    double memory;              /* bytes per device; shared_memory: per machine */
    double reserved;            /* of memory, what a job cannot have: a GPU's CUDA context, NCCL's buffers and the allocator's
                                 * fragmentation (1 GiB + 5% unless a file says reserved_gb); 0 on a CPU machine */
    int devices_per_node;       /* ranks per machine (a CPU: its cores) */
    int shared_memory;          /* the ranks of a machine share one memory (CPUs: ZeRO's one parameter copy a machine applies) */
    int cores_per_device;       /* a CPU's peak figures are per core: a rank's threads multiply them */
    double flops_f32, flops_lowp; /* peak FLOP/s of a device (a core): f32 (TF32 on GPUs), bf16/fp16 */
    double mem_bw;              /* bytes a second (a CPU: the machine's, shared by its ranks) */
    double intra_alpha, intra_beta, inter_alpha, inter_beta; /* links inside a machine and between machines: s, s a byte */
    double inter_slowdown;      /* a core's compute beside an exchange between machines, over alone, less 1 (this machine's
                                 * calibration; else 0: the link's processing takes nothing from the ranks' cores) */
    double gemm_efficiency;     /* of the peak, what large GEMMs reach (1 for measured rates) */
    double attention_efficiency; /* attention's FLOP/s against the GEMM peak (GPUs); 1 when attention_rate is measured */
    double attention_rate;      /* measured attention FLOP/s a core (this machine), else 0 */
    int attention_fixed;        /* $DTRAIN_ATTENTION_GFLOPS gave attention_rate: not timed at the job's sequences and heads */
    double linear_rate;         /* $DTRAIN_LINEAR_GFLOPS: every Linear's FLOP/s a core (this machine), else 0: timed at the job's shapes */
    double optim_bw_one, optim_bw_all; /* the optimizer's measured bytes a second (this machine): one core, all; else 0 (mem_bw) */
    double lp_fresh_bw;         /* a 16-bit copy made into pages just given back, a core's f32 bytes read a second (this machine), else 0 */
    double pool_lend_bw;        /* ZeRO 2 and 3's gradient pages lent by the pool and zeroed, a core's bytes a second (this machine), else 0 */
    double busy_slowdown;       /* a core's GEMM alone over beside every other core running one (this machine), else 0: not slowed */
    double powersgd_rate, topk_rate, onebit_rate; /* a codec's compression, gradient elements a second on a core (this machine:
                                      * PowerSGD at rank 4, top-k at density 0.01, 1-bit Adam frozen), else 0: its passes at mem_bw */
} dt_plan_hardware;

/* "this" (measured: the GEMM peaks' cache, bandwidth and attention now, the communication calibration), "a100-40g",
 * "h100-80g", or a JSON file of the fields (docs/planner.md); a missing or negative field is named. */
dt_status dt_plan_hardware_get(const char *name, dt_plan_hardware *h);

#define DT_PLAN_BUCKETS 64 /* buckets a plan describes (a model of more: this many equal ones; a search keeps each layout's) */

/* The predicted step: seconds per step, by part (the largest stage's rank). */
typedef struct {
    double matmul, attention, elementwise, optimizer; /* compute on the rank */
    double dp_comm, dp_exposed;     /* gradient reduction (and ZeRO's gathers): all of it, and what backward does not hide */
    double link_compute;            /* across machines: the compute the link's processing takes from the ranks' cores while
                                     * the reduction overlaps backward (the hardware's inter_slowdown) */
    double tp_comm, cp_comm, pp_comm; /* per step, exposed */
    double ep_comm;                 /* expert parallelism's all-to-alls, exposed */
    double tp_waits;                /* of tp_comm: the ranks' waits for the slowest at each allreduce (measured here) */
    double dp_waits;                /* the data-parallel ranks' waits for the slowest at the step's reduction (measured here) */
    double lp_units;                /* mixed precision made unit by unit (ZeRO-3; ZeRO 1, 2 with private parameters): the 16-bit copies */
    double grad_pages;              /* ZeRO's f32 gradients outside the shard, each step: lent by the pool and zeroed (ZeRO 2, 3), or zeroed */
    double codec;                   /* a gradient codec's compression on the rank (backward waits for it: not hidden) */
    double precond, precond_comm;   /* a second-order optimizer's work on the busiest rank and its collectives (not hidden) */
    double codec_bytes;             /* and the bytes its exchanges send a step (the gradients' own, without a codec) */
    double bubble;                  /* the pipeline's idle time */
    double step, tok_per_s;
    int threads;                    /* a rank's threads */
    double oversubscribed;          /* the machine's ranks x threads over its cores (compute is that much slower), at least 1 */
    double beside;                  /* compute's slowdown from the other ranks' busy cores (busy_slowdown, by their share), at least 1 */
    size_t head_resident;           /* this process's resident growth while the head was timed here (0: not timed now) */
    /* the data-parallel reduction's buckets the overlap was priced by, in backward's order (0: none priced): each one's share
     * of the gradients and of backward run when it closes (the run's own layout where known, dt_plan_buckets; else equal) */
    int buckets;
    double bucket_share[DT_PLAN_BUCKETS], bucket_ready[DT_PLAN_BUCKETS];
} dt_plan_time;

/* The shape timings this process has asked for so far (a hash of them, in order), whether any was measured here and
 * whether any was read from the machine's cache: a plan whose timings were all read did not run the GEMMs whose
 * buffers a rank keeps resident, and takes that size from the cache too; one that read some and measured some grew
 * by part of it. */
uint64_t dt_plan_timings_asked(bool *measured, bool *read);
/* on: every timing measured here again, the cache and the process's copies passed by (not counted in the hash). */
void dt_plan_timings_fresh(bool on);
/* bytes as the run's reports give them, in binary units: "26.5 GiB", "1.53 GiB" (a refusal near the edge must not read
 * "needs 1.5 GiB, 1.5 GiB available"), "12.3 MiB" below a gibibyte. */
const char *dt_plan_bytes_text(double bytes, char *buf, size_t cap);
/* Units [a[k], b[k]) for k < n: a pipeline stage's chunks; n 0 (or NULL where one is taken): the whole model. */
typedef struct { int n, a[DT_GPT2_MAX_CHUNKS], b[DT_GPT2_MAX_CHUNKS]; } dt_plan_units;
/* Stage s's chunks of a pipeline of p stages, v chunks each, whose chunk i begins at unit first[i] (first[p v]: the
 * end); p 1: the whole model (n 0). */
dt_plan_units dt_plan_stage_units(const int *first, int p, int v, int s);
/* A gradient codec's exchanges (job->codec) on the rank of a stage holding units on (NULL: the whole model; a stage's
 * data-parallel group compresses its own tensors): the floats a rank sends a step, *approximated the gradient elements
 * PowerSGD's GEMMs cover (0 for top-k), *state the floats of state it keeps on every rank (residuals, Qs, velocities;
 * ZeRO's ranks too), *work the bytes of its buckets' buffers (dt_codec_work_bytes_for over the stage's tensors and
 * buckets); 0 without a codec. Any out may be NULL. */
double dt_plan_codec_floats(const dt_plan_job *j, const dt_plan_units *on, double *approximated, double *state, double *work);
/* The run's gradient buckets over the job's whole model (dt_ddp_bucket_lens: a codec's layout where coded, else dense
 * DDP's), in backward's order: each one's share of the gradient's entries and the share of backward's Linear work done
 * when it closes (its last unit's backward run); how many (at most cap), 0 if the table could not be made. */
int dt_plan_buckets(const dt_plan_job *j, bool coded, double *share, double *ready, int cap);
/* 1: the job's data-parallel ranks update inside backward, taking turns (the engine's rule, dt_engine_updates_in_backward). */
int dt_plan_update_in_backward(const dt_plan_job *j);
/* The step time of job on hardware h (the largest stage's rank sets it). */
void dt_plan_step_time(const dt_plan_job *job, const dt_plan_hardware *h, dt_plan_time *out);

/* Bytes per rank and per machine (fp32 Adam: DDP 16 bytes per parameter;
 * stage 1: 8 + 8/N; 2: 4 + 12/N; 3: 16/N, plus what the rest needs; with
 * shared_params, stages 1 and 2 hold 4/N of the parameters per rank). */
void dt_plan_memory_estimate(const dt_plan_job *job, dt_plan_memory *out);
/* Models: a preset's shape (GPT-2's, Llama 3.1 8B and 70B, GPT-3 175B) or a refusal naming them; a GPT-style shape of
 * about n parameters (--params). */
dt_status dt_plan_model_preset(const char *name, dt_gpt2_config *c);
const char *dt_plan_model_names(void);
void dt_plan_shape_for_params(double n, dt_gpt2_config *c);
/* Units [a, b) on one TP rank: parameters, and the Linears' parameters a token multiplies through forward: the model
 * layer's own counts, for any family. A block's Linears on a TP rank ([outputs, inputs], at most max; their count);
 * whether a config is GPT-2's family (learned positions, LayerNorms, a GELU MLP, biases). */
double dt_plan_units_params(const dt_plan_job *j, int a, int b);
/* Of those, a mixture's experts on a rank (E/ep of each block's). */
double dt_plan_units_expert_params(const dt_plan_job *j, int a, int b);
double dt_plan_units_matmul_params(const dt_plan_job *j, int a, int b);
int dt_plan_block_linears(const dt_plan_job *j, int l, int (*shape)[2], int max); /* (layer l's; -1: any layer's) */
/* Under expert parallelism the busiest rank's routed rows over the mean (the job's expert_load; 1: balanced, or no EP):
 * its experts' work, which its group waits for, and the buffers that grow to the rows routed there. */
double dt_plan_ep_load(const dt_plan_job *j);
/* And its rows summed over its layers over the mean (the job's expert_rows; 1: balanced): the routed rows it keeps. */
double dt_plan_ep_rows(const dt_plan_job *j);
/* Whether the model has GPT-2's block (LayerNorms with biases, learned positions): gpt2, or gpt2_moe's experts in its MLP. */
bool dt_plan_gpt2_block(const dt_gpt2_config *c);
/* A stage holding the n unit ranges [a[k], b[k]) on one TP rank: the activation bytes of one micro-batch in flight (batch
 * x seq positions; one slot), and mixed precision's scratch, the stage model's once (head: it holds the head): the
 * model layer's own counts (dt_gpt2_chunks_activation_bytes). */
double dt_plan_slot_activations(const dt_plan_job *j, int n, const int *a, const int *b, int batch, int seq);
/* Stage s's activations with its micro-batches in flight: its slots (dt_plan_pp_slots) of the above, or with several
 * chunks (interleaved) each slot's own bytes and each chunk's kept ones as often as the schedule holds that chunk at
 * once (dt_pp_chunk_areas), as the model program keeps them. */
double dt_plan_stage_activations(const dt_plan_job *j, int s, int n, const int *a, const int *b);
/* What a rank holds once beside its slots: mixed precision's scratch (dtrain's; head: the stage holds the head), expert
 * parallelism's exchange buffers (mixtures: the stage holds a mixture), or under paper_acts with --recompute the layer
 * being recomputed. */
double dt_plan_rank_scratch(const dt_plan_job *j, int head, bool mixtures);
/* paper_acts: the bytes a token keeps in one transformer layer (recompute: the layer's input alone), Korthikanti et al.'s
 * Table 2 with attention's scores not kept: 16-bit, tensor-parallel t, sequence parallel or not, GPT's dropout masks. */
double dt_plan_paper_layer_bytes(const dt_plan_job *j, int recompute, bool moe); /* (a mixture's layer, or a dense one) */
/* The micro-batches stage s of the job's pipeline keeps in flight (its activation slots): what the schedule's lists
 * give (dt_pp_schedule.slots; tests/test_pipeline_schedule.c checks the two agree). */
int dt_plan_pp_slots(const dt_plan_job *j, int s);
/* The whole model's parameters (--params N: N). */
double dt_plan_model_params(const dt_plan_job *j);

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
