/* dtrain model layer: GPT-2 family networks, MLPs and ResNets built from kernels.
 * Every model describes its parameters in a tensor table and keeps them in
 * one flat allocation, unit by unit in forward order (a unit: the
 * embeddings, one block, the final layer norm), gradients in a second of the
 * same layout; so a unit, a run of units (a pipeline stage, a bucket) or any
 * slice (a ZeRO shard) is one contiguous range. */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include "dtrain/base.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_family dt_family;

/* A transformer's shape (the model program's config; the family says which ops it runs): GPT-2's six sizes, then
 * the rest, which mean their default where zero (dt_lm_config_resolve), so that GPT-2's six alone make a GPT-2:
 * the gpt2 family, K/V heads = heads, a head of C / heads channels, an MLP 4 C wide, norms' epsilon 1e-5, rotary
 * base 10000 without scaling, the head tied to the token table. */
typedef struct {
    int max_seq_len;       /* T max: the learned positions' rows, or how long a sequence may be (rotary) */
    int vocab_size;        /* V */
    int padded_vocab_size; /* Vp >= V; rows V..Vp-1 of the token table (and an untied head) are zero */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C, the residual stream's width */
    const dt_family *family;
    int kv_heads, head_dim, ffn;
    float norm_eps;
    /* rotary positions: the base, and Llama 3.1's scaling (factor 0: none) */
    float rope_theta, rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max;
    int untied;            /* the head is its own tensor, not the token table's transpose */
    /* mixture of experts (a family whose block has one, Mixtral's): E experts of ffn hidden units, each token routed to
     * top_k of them by a softmax router, their weights renormalised to sum to 1 (norm_topk, Mixtral's) or not; the
     * Switch load-balancing loss (Hugging Face's load_balancing_loss_func over the layers) times aux_coef added to
     * the loss (0: none) */
    int experts, experts_top_k, norm_topk;
    float aux_coef;
    int shared_ffn;        /* a shared expert beside the routed ones (Qwen 2 MoE's, its output scaled by a sigmoid gate of
                            * the token): its hidden units (0: none) */
    /* the router: softmax (0, above) or DeepSeek-V3's sigmoid scores with a per-expert bias used only to choose
     * (auxiliary-loss-free balancing: after each step the bias of an expert loaded above the layer's mean falls by
     * bias_rate, below it rises); groups: the experts in expert_groups groups, a token's choice within its
     * group_top_k best groups (each scored by its two best); the chosen scores renormalised (norm_topk) and times
     * routed_scale */
    int router, expert_groups, group_top_k;
    float routed_scale, bias_rate;
    /* a capacity: each expert takes at most ceil(capacity_factor x B*T x k / E) of a micro-batch's choices on a rank
     * (Megatron's), the rest dropped (their outputs not added) by the router's weight (the lowest first) or by position
     * (the latest first); 0: dropless */
    float capacity_factor;
    int drop_policy;
    /* which layers are mixtures (the rest a dense MLP of dense_ffn hidden units, ffn by default): layer l (from 0) is
     * one when l >= first_dense and (l + 1) is a multiple of moe_every (1 by default: every layer), as Qwen 2 MoE's
     * decoder_sparse_step and DeepSeek's first_k_dense_replace place them */
    int moe_every, first_dense, dense_ffn;
} dt_lm_config;
enum { DT_DROP_PROBS = 0, DT_DROP_POSITION = 1 };
enum { DT_ROUTER_SOFTMAX = 0, DT_ROUTER_SIGMOID_BIAS = 1 };
typedef dt_lm_config dt_gpt2_config;

/* c with its zero fields at their defaults (above); whether two configs make the same model (field by field, their
 * defaults resolved: a struct's padding is not its value). */
dt_lm_config dt_lm_config_resolve(const dt_lm_config *c);
bool dt_lm_config_same(const dt_lm_config *a, const dt_lm_config *b);
/* Whether layer l of a (resolved) config is a mixture of experts; how many of its layers are. */
bool dt_lm_layer_moe(const dt_lm_config *c, int l);
int dt_lm_moe_layers(const dt_lm_config *c);
/* The family's name ("gpt2", "llama", "qwen2"); the family by name (NULL if unknown). */
const char *dt_family_name(const dt_family *f);
const dt_family *dt_family_find(const char *name);
/* f's place among the families dtrain knows (the same number on every build of this source), or -1 (NULL, unknown). */
int dt_family_index(const dt_family *f);
/* transformers' class for f (NULL: none, and *why, if asked, says why not); the family whose class is arch (NULL:
 * none); every family's class, "name (Class)" joined by ", ", into buf. */
const char *dt_family_hf_arch(const dt_family *f, const char **why);
const dt_family *dt_family_find_hf_arch(const char *arch);
void dt_family_hf_archs(char *buf, size_t n);
/* Every family's name, comma-separated, into buf of n bytes. */
void dt_family_names(char *buf, size_t n);
/* llama.cpp's architecture for the family ("gpt2", "llama", "qwen2"), and whether a GGUF reorders q and k rows (its
 * rope turns adjacent channel pairs where Hugging Face's turns halves). */
const char *dt_family_gguf_arch(const dt_family *f);
int dt_family_gguf_pairs(const dt_family *f);
/* The modules PEFT puts LoRA on for the family when not told ("c_attn"; "q_proj,v_proj"). */
const char *dt_family_lora_targets(const dt_family *f);
/* Whether the family's block routes tokens to experts (Mixtral's); whether its experts are SwiGLU MLPs (gate, up and
 * down) rather than GELU ones (up and down: gpt2_moe's). */
bool dt_family_moe(const dt_family *f);
bool dt_family_moe_gated(const dt_family *f);

/* How tensor parallelism splits a tensor (Megatron): a column-parallel
 * Linear splits its outputs (weight rows, bias), a row-parallel one its
 * inputs (weight columns; the bias stays whole); the embedding splits the
 * vocabulary; the rest is replicated. */
typedef enum { DT_SPLIT_NONE = 0, DT_SPLIT_COLUMN, DT_SPLIT_ROW, DT_SPLIT_VOCAB } dt_tp_split;

/* This rank's slice of a tensor a model-parallel part splits: along
 * dimension dim of the global shape, count entries from offset, in pieces
 * blocks stride apart (qkv's weight: one slice each of Q, K and V, stride C).
 * A whole tensor: dim 0, offset 0, count = global shape[0], pieces 1. */
typedef struct {
    int dim, offset, count, pieces, stride;
} dt_tensor_slice;

/* One parameter tensor: the table is the one place that sizes, offsets,
 * checkpoint names, gradient ranges, shards and stages come from. shape is
 * what this rank stores; gshape and slice say where it sits in the global
 * tensor (the same as shape unless a model-parallel part splits it). */
typedef struct {
    char name[48];          /* ours: "wte", "h.3.qkvw", "lnfw"; the MLP's "layer.0.weight" */
    char hf[96];            /* Hugging Face's (PyTorch's state_dict) name: "h.3.attn.c_attn.weight" */
    char gguf[40];          /* llama.cpp's in a GGUF file: "blk.3.attn_qkv.weight" (empty: none) */
    const char *llmc;       /* llm.c's tensor this is (a layer of): "qkvw"; NULL if not GPT-2 */
    int llmc_index, layer;  /* llm.c's file order: tensor index 0..15, then layer (0 if not per layer) */
    int unit;               /* the unit holding it */
    int grad_unit;          /* the unit after whose backward its gradient is final (a tied weight's earlier) */
    int ndim, shape[4];     /* as stored: weights [out, in], wte [Vp, C], convolutions [OC, C, KH, KW] */
    size_t offset, count;   /* in the flat store */
    int gshape[4];          /* the global tensor's shape */
    size_t goffset;         /* where the global tensor starts in the whole model's store (checkpoints are in that layout) */
    dt_tensor_slice slice;  /* this rank's part of it */
    dt_tp_split split;
    /* Its replica group within the model-parallel group (tensor- and expert-parallel ranks): how many ranks hold this
     * same piece (0 or 1: this rank's own; a tensor TP leaves whole: all of them; a K/V head kept by several ranks:
     * those; under expert parallelism every tensor but the experts, on every rank of the group too), and this rank's
     * place among them (the first counts it once: the gradient norm, a gathered model). */
    int replicas, replica;
    int input_rows;         /* an embedding: backward adds to only the rows of the input's tokens */
    int f32_read;           /* mixed precision reads its f32 values: 1 in forward only (embedding tables), 2 in both passes (LayerNorms) */
    int tied_copy;          /* a pipeline's last stage's copy of the tied wte: the first stage owns it (the norm and checkpoints skip the copy) */
    int hf_transposed;      /* Hugging Face stores it [in, out] (GPT-2's Conv1D) */
    int stacked;            /* [experts, rows, cols]: one tensor an expert in Hugging Face's files, hf naming each ("%d") */
    int group;              /* whose average its gradient is: DT_GROUP_DATA's (every data-parallel rank holds it) or
                             * DT_GROUP_EXPERT's (an expert-parallel rank's own experts: the ranks holding the same ones) */
} dt_tensor_info;
enum { DT_GROUP_DATA = 0, DT_GROUP_EXPERT = 1 };

/* A function a model calls at a unit: its gradients are final, or it is about to run forward or backward. */
typedef void (*dt_unit_hook)(int unit, void *ctx);

/* The events a hook list serves: a gradient list has one (a unit's gradients final); a unit list two (before a
 * unit's forward, before its backward). */
enum { DT_HOOK_GRADS_READY = 0, DT_HOOK_BEFORE_FORWARD = 0, DT_HOOK_BEFORE_BACKWARD = 1 };

/* Subscribers to a model's hooks (hooks.c): each its function for each
 * event (NULL: none) and its context, which names the subscriber. A
 * data-parallel strategy and a model-parallel one can both subscribe;
 * they are called in the order they subscribed. */
#define DT_HOOKS_MAX 4
typedef struct {
    dt_unit_hook fn[DT_HOOKS_MAX][2]; /* subscriber k's function for event 0 and event 1 */
    void *ctx[DT_HOOKS_MAX];
    int n;
} dt_hook_list;
/* A function for either event: ctx subscribes, or changes its functions; both NULL: ctx unsubscribes. Fails only
 * with more than DT_HOOKS_MAX subscribers. */
dt_status dt_hook_list_set(dt_hook_list *l, dt_unit_hook event0, dt_unit_hook event1, void *ctx);
/* Every subscriber's function for event, with unit. */
void dt_hook_list_call(const dt_hook_list *l, int event, int unit);

/* What a layer whose weight gradient is the sum over rows of output gradient x input (a Linear; a convolution over
 * its input's patches) shows its observer: its key (layer, op; dt_linear_layer's), and `rows` rows of `width` values:
 * in forward its input as it multiplies it, in backward its output's gradient (the loss's scale in it). A
 * convolution shows each image in turn (piece 0..pieces-1), by_column: the values are width x rows (its patches
 * [C KH KW, OH OW], its output's gradient [OC, OH OW]); spatial: the positions a weight meets per sample (OH OW; a
 * Linear's 1). What second-order optimizers (K-FAC's factors) need of each layer. */
typedef struct {
    int layer, op, backward;
    const dt_tensor_info *weight;
    size_t rows;
    int width;
    const float *values;
    int piece, pieces, by_column, spatial;
} dt_linear_event;
typedef void (*dt_linear_observer)(void *ctx, const dt_linear_event *e);

/* A layer its model's observer shows: its key, its input side (a convolution's C x KH x KW) and its parts (a Linear
 * made of several, Llama's q, k and v: weights [out, in] and biases, NULL: none) whose outputs are side by side. */
#define DT_LINEAR_PARTS 4
typedef struct {
    int layer, op, in, nparts;
    const dt_tensor_info *w[DT_LINEAR_PARTS], *b[DT_LINEAR_PARTS];
} dt_linear_layer;

/* Any model as the engine and the parallel strategies see it: the table,
 * the flat stores and the hooks. Models fill one in (dt_gpt2_model,
 * dt_mlp_model); NULL callbacks are features the model does not have. */
typedef struct {
    void *self;
    const char *kind;                  /* "gpt2", "mlp" */
    const dt_tensor_info *tensors;
    int ntensors, nunits;              /* units 0..nunits-1 in forward order; backward reports them in reverse */
    size_t nparams;
    float *(*params)(void *self);
    float *(*grads)(void *self);
    /* gradients in caller storage of nparams floats (a shared arena); NULL: the model's own */
    void (*set_grad_storage)(void *self, float *grads);
    /* backward calls hook(unit, ctx) once each unit's gradients are final;
     * hooks are lists: ctx subscribes (hook NULL: ctx unsubscribes) */
    void (*set_grad_hook)(void *self, dt_unit_hook hook, void *ctx);
    /* hooks before each unit's forward and before its backward (to gather sharded parameters); a list as well */
    void (*set_unit_hooks)(void *self, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx);
    /* the input_rows tensor: with on, backward leaves those rows out, and after
     * backward input_grad gives d loss / d row [n, row width] and the n tokens */
    void (*defer_input_rows)(void *self, int on);
    const float *(*input_grad)(const void *self, const int32_t **tokens, int *n);
    /* the parameters from now on in caller storage of nparams floats, which
     * the caller has filled (ranks on one machine sharing one copy); the
     * model's own buffer goes back to the system. NULL: back to its own,
     * copied from the caller's. */
    void (*set_param_storage)(void *self, float *params);
    /* Mixed precision's 16-bit copy of the parameters (whole, nparams), its
     * type in *t; NULL for an f32 model. caller_keeps 1: from now on the
     * caller keeps it current (a strategy that holds only a shard of the f32
     * master allgathers it) and the model no longer casts it; 0: back. */
    uint16_t *(*lp_copy)(void *self, int caller_keeps, dt_dtype *t);
    /* the parameters were written (an update, a load, a gather): mixed
     * precision's 16-bit copy is made again at the next forward. A model told
     * this once trusts it from then on and keeps the copy from one forward to
     * the next until told again (a step's micro-batches); NULL: nothing kept. */
    void (*params_changed)(void *self);
    size_t global_params;              /* the whole model's parameters (0: nparams, nothing is split) */
    /* how this rank's model is split: its pipeline units, tensor-, context- and expert-parallel place and their
     * collectives (NULL: a model that is never split) */
    const struct dt_model_part *part;
    /* The layers a linear observer sees (this rank's: *out malloc'd, the caller frees it; NULL callback: none), and
     * the one observer (fn NULL: none), called from inside forward and backward (its pointers valid during the call). */
    dt_status (*linears)(void *self, dt_linear_layer **out, int *n);
    void (*set_linear_observer)(void *self, dt_linear_observer fn, void *ctx);
} dt_model;

/* Element j of tensor t's local store: its index in the global tensor (row-major gshape). */
size_t dt_tensor_global_index(const dt_tensor_info *t, size_t j);
/* A tensor held whole: gshape = shape, goffset = offset, the slice all of
 * dimension 0 (models call it as they fill their tables, offset set). */
void dt_tensor_set_whole(dt_tensor_info *t);
/* The whole model's parameter count (the checkpoint files' layout). */
size_t dt_model_global_params(const dt_model *m);
/* This rank's store [off, off + count) as contiguous runs of the whole
 * model's store: fn(local offset, global offset, floats, ctx) for each, in
 * store order (a row-parallel weight's slice is one run per row). */
void dt_model_global_runs(const dt_model *m, size_t off, size_t count, void (*fn)(size_t lo, size_t go, size_t n, void *ctx),
                          void *ctx);
/* Each value of this rank's store (to, m's layout) taken from the whole model's store (whole): a part's slices. */
void dt_model_copy_slices(const dt_model *m, float *to, const float *whole);
/* Whether t is split among the ranks of a model-parallel group (its slice is not the whole). */
bool dt_tensor_is_sliced(const dt_tensor_info *t);
/* The tensors of Hugging Face's files that make t (as this rank stores it): one, or a stacked tensor's one an
 * expert; piece k's name, shape (dims[0..ndim)) and first value within t. */
int dt_tensor_hf_pieces(const dt_tensor_info *t);
void dt_tensor_hf_piece(const dt_tensor_info *t, int k, char *name, size_t cap, int *ndim, int *dims, size_t *at);

/* The table's tensor called name, or NULL. */
const dt_tensor_info *dt_model_find(const dt_model *m, const char *name);
/* A pipeline's last stage's copy of the tied wte, where it ends the store (the first stage owns wte: no optimizer
 * state or update is the copy's), or NULL. */
const dt_tensor_info *dt_model_tied_tail(const dt_model *m);
/* Parameters in units [a, b), which are contiguous: *off, *count. */
void dt_model_unit_range(const dt_model *m, int a, int b, size_t *off, size_t *count);
/* set_param_storage for a model whose own buffer is own: the n parameters
 * from now on at to (filled by the caller; own's pages go back), or back in
 * own (NULL: copied from now). Returns where they are. */
float *dt_model_param_storage(float *own, float *now, float *to, size_t n);
/* set_grad_storage's: the gradients from now on at to (zero, the caller's),
 * or back in own (NULL), zeroed; the gradients so far are not carried over. */
float *dt_model_grad_storage(float *own, float *now, float *to, size_t n);

#define DT_GPT2_NTENSORS 16 /* llm.c's tensors (each per-layer one is L entries of the table) */

typedef struct dt_gpt2 dt_gpt2;

/* "d6", "124M", "350M", "774M", "1558M". */
dt_status dt_gpt2_preset(const char *name, dt_gpt2_config *out);
/* Checks a config (positive sizes, C divisible by NH, V <= Vp). */
dt_status dt_gpt2_config_check(const dt_gpt2_config *cfg, const char *where);

/* Parameters a (checked) config holds, without building it: loaders compare
 * it with the file's size before allocating anything. */
size_t dt_gpt2_config_num_params(const dt_gpt2_config *cfg);
/* Model FLOPs of one training step (forward and backward, recomputation not
 * counted) per token at sequence length T: 6 N + 12 L T C, where N is the
 * parameters that take part in matmuls (all but the position table; the head
 * is the tied wte over the padded vocabulary) and 12 L T C is attention's
 * QK^T and AV over the full T x T (PaLM, appendix B; the causal kernel does
 * about half of that). Layernorm, GELU, softmax and the loss are left out. */
double dt_gpt2_flops_per_token(const dt_gpt2_config *cfg, int T);
/* The activations (and the batch's tokens) a whole model allocates for B x T
 * (attention: dt_attn_mode; precision: dt_gpt2_set_precision's, with its
 * packed 16-bit blocks and scratch), without building it: for estimates before a run. */
size_t dt_gpt2_activation_bytes(const dt_gpt2_config *cfg, int B, int T, int recompute, int attention, dt_dtype precision);
/* The same for tensor-parallel rank 0 of tp (with sp, sequence parallel):
 * what each rank of such a layout allocates. */
size_t dt_gpt2_part_activation_bytes(const dt_gpt2_config *cfg, int tp, int sp, int B, int T, int recompute, int attention,
                                     dt_dtype precision);
/* GPT-2's units 0..L+1 on p stages (gpt2_split.c): stage s holds
 * [first[s], first[s+1]) (first has p+1 entries), contiguous, the
 * costliest stage as cheap as a split can make it (a unit's cost: its
 * forward FLOPs per token at sequence length T). Fails if p > L+2. */
dt_status dt_gpt2_split_stages(const dt_gpt2_config *c, int T, int p, int *first);
/* The cost of units [a, b) by the same measure. */
double dt_gpt2_units_cost(const dt_gpt2_config *c, int T, int a, int b);

/* Parameters a pipeline stage holding units [a, b) stores as tensor-parallel
 * rank 0 of tp (a last stage without unit 0: its copy of wte too). */
size_t dt_gpt2_units_num_params(const dt_gpt2_config *cfg, int a, int b, int tp);
/* Floats of scratch the 16-bit Linears get (dt_matmul_*_lp, *_lp16): one
 * per model, whatever its slots (head: the model holds the head). */
size_t dt_gpt2_lp_work_floats(const dt_gpt2_config *c, bool head);
/* What a tensor-parallel rank of tp allocates for them (the model program's own count: its Linears' widths are
 * this rank's), with or without the head. */
size_t dt_gpt2_part_lp_work_bytes(const dt_gpt2_config *cfg, int tp, bool head);
/* The activations a stage holding the n unit ranges [a[k], b[k]) (an
 * interleaved stage's chunks) allocates per micro-batch in flight: one
 * slot, without the model's 16-bit scratch above, which is the model's
 * once; split: with a backward split in two (dt_gpt2_set_split_backward). */
size_t dt_gpt2_chunks_activation_bytes(const dt_gpt2_config *cfg, int n, const int *a, const int *b, int tp, int sp, int B, int T,
                                       int recompute, int attention, dt_dtype precision, int split);
/* The same slot with its chunks' activations apart (n > 1): the slot's own bytes, each chunk's area's in area[k]
 * (dt_program_activation_split_bytes). */
size_t dt_gpt2_chunks_activation_split(const dt_gpt2_config *cfg, int n, const int *a, const int *b, int tp, int sp, int B, int T,
                                        int recompute, int attention, dt_dtype precision, int split, size_t *area);
/* Parameters tensor-parallel rank 0 of tp holds (the split tensors' 1/tp, the vocabulary's ceil(Vp/tp) rows, the rest whole). */
size_t dt_gpt2_part_num_params(const dt_gpt2_config *cfg, int tp);
dt_status dt_gpt2_create(const dt_gpt2_config *cfg, dt_gpt2 **out);
/* A model holding only units [a, b) of 0..L+1 (0: wte and wpe; 1..L: the
 * blocks; L+1: the final LayerNorm and the head): a pipeline stage. One that
 * holds the head but not unit 0 keeps its own copy of the tied wte in unit
 * L+1 (the same name; a pipeline keeps the two copies equal). */
dt_status dt_gpt2_create_units(const dt_gpt2_config *cfg, int a, int b, dt_gpt2 **out);

/* Tensor parallelism's collectives as the model calls them (parallel/
 * tensor_parallel.c gives them over a communicator): sum (or, max != 0,
 * the maximum) of n floats in place across the tensor-parallel group. The
 * model layer stays free of communicators; its kernels free of both. */
typedef struct {
    void *ctx;
    dt_status (*allreduce)(void *ctx, float *buf, size_t n, int max);
    /* sequence parallelism's: all[n * tp] = every rank's n floats in rank order; mine[n] = rank r's block of the sum of all[n * tp] */
    dt_status (*allgather)(void *ctx, const float *mine, float *all, size_t n);
    dt_status (*reduce_scatter)(void *ctx, const float *all, float *mine, size_t n);
    /* inference's: n int32 from the group's rank 0 to the others (the rows a decoding step runs) */
    dt_status (*broadcast)(void *ctx, int32_t *buf, size_t n);
} dt_tp_ops;

/* Expert parallelism's exchanges as the mixture-of-experts op calls them (parallel/expert_parallel.c gives them over
 * the expert-parallel group: ranks that hold different experts and route to each other's): every rank's n int32
 * gathered in rank order (the routed rows' counts by expert); an all-to-all of rows of `row` floats, rows[j] of them
 * for rank j one after another, received into recv (room for cap rows) in rank order, got[j] from rank j. */
typedef struct {
    void *ctx;
    dt_status (*counts)(void *ctx, const int32_t *mine, int32_t *all, size_t n);
    dt_status (*exchange)(void *ctx, const float *send, const size_t *rows, float *recv, size_t cap, size_t *got, size_t row);
} dt_ep_ops;

/* Context parallelism's attention as the model calls it (parallel/
 * context_parallel.c gives it over a communicator): causal attention of
 * this rank's T rows a sequence over the whole sequence of T x cp_size
 * positions, the rows laid out as dt_gpt2_cp_position says; lse [B, NH, T]
 * kept for backward; backward adds to dqkv. Collective over the group. */
typedef struct {
    void *ctx;
    dt_status (*forward)(void *ctx, float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
    dt_status (*backward)(void *ctx, float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse, int B,
                          int T, int C, int NH);
} dt_cp_ops;
/* The load-balanced split of a sequence over n context-parallel ranks (Llama
 * 3's, Striped Attention's): 2n chunks of T/(2n) positions, rank r holding
 * chunks r and 2n-1-r, so each has the same causal work. The position of
 * row i of rank r's Tl = T/n rows. */
int dt_gpt2_cp_position(int r, int n, int Tl, int i);
/* x [B, T] (tokens of B sequences) becomes, in place, rank r of n's rows:
 * [B, T/n] in that order (what the loader hands a context-parallel rank). */
void dt_gpt2_cp_rows(int32_t *x, int B, int T, int r, int n);

/* A micro-batch's sums over the ranks that each hold a part of it (pipeline stages their layers, context-parallel ranks
 * their rows): a mixture's balancing statistics, which its loss takes whole. post starts the sum of n doubles in place
 * (every rank of the group posts its micro-batches in the same order) and gives a handle; wait ends it. */
typedef struct {
    void *ctx;
    dt_status (*post)(void *ctx, double *buf, size_t n, void **handle);
    dt_status (*wait)(void *ctx, void *handle);
} dt_part_sums;

/* What part of the model a rank builds: units [ua, ub) (a pipeline stage),
 * and tensor-parallel rank tp_rank of tp_size (Megatron: qkv and fc
 * column-parallel by heads and hidden units, the two projections
 * row-parallel, the tied embedding and LM head by vocabulary rows,
 * ceil(Vp / tp_size) a rank, the last rank the rest; the rest replicated).
 * tp_size > 1 needs tp and heads divisible by tp_size. */
#define DT_GPT2_MAX_CHUNKS 8
typedef struct dt_model_part {
    int ua, ub;
    int tp_rank, tp_size;
    const dt_tp_ops *tp;
    /* sequence parallelism (Korthikanti et al. 2022) on the TP group: the
     * LayerNorms and the residual stream hold B*T/tp rows; the sums become
     * reduce-scatters and allgathers. Whole models only; T divisible by tp. */
    int sp;
    /* an interleaved pipeline's stage: nchunks (> 0) ranges of units,
     * ascending and apart, in place of [ua, ub) */
    int nchunks, chunk_a[DT_GPT2_MAX_CHUNKS], chunk_b[DT_GPT2_MAX_CHUNKS];
    /* context parallelism: rank cp_rank of cp_size holds T rows of each
     * sequence (dt_gpt2_cp_position's); attention goes through cp; cp_size
     * 1 (or 0): whole sequences */
    int cp_rank, cp_size;
    const dt_cp_ops *cp;
    /* expert parallelism: rank ep_rank of ep_size holds experts [ep_rank E/ep_size, +E/ep_size) of each mixture, and
     * the tokens of every rank of the group that route there come to it through ep; ep_size 1 (or 0): every expert */
    int ep_rank, ep_size;
    const dt_ep_ops *ep;
    /* the ranks holding the other parts of each micro-batch (stages, context-parallel ranks; NULL: none): a mixture's
     * balancing loss and z-loss are over the whole micro-batch */
    const dt_part_sums *sums;
    /* the ranks whose micro-batches of the same index make a global one (data-parallel, expert-parallel, stages and
     * context-parallel ranks: all of one tensor-parallel place; NULL: none): the global-batch balancing loss's counts */
    const dt_part_sums *global_sums;
} dt_model_part;
/* The whole model as one part (no splitting). */
dt_model_part dt_gpt2_whole(const dt_gpt2_config *cfg);
dt_status dt_gpt2_create_part(const dt_gpt2_config *cfg, const dt_model_part *part, dt_gpt2 **out);
/* What pipeline stage s of p holds, split as dt_gpt2_split_stages does:
 * part's ua, ub, and with v > 1 chunks a stage (the interleaved schedule's)
 * its chunks s, s+p, .. of the p x v; the rest of part is left as it is. */
dt_status dt_gpt2_stage_part(const dt_gpt2_config *c, int T, int p, int v, int s, dt_model_part *part);
/* part's parameters from the whole model whole (the same config): each slice
 * copied from its place (a file's weights given to a tensor-parallel rank). */
dt_status dt_gpt2_copy_slices(const dt_gpt2 *whole, dt_gpt2 *part);
/* Seconds spent in tensor parallelism's collectives since the last call
 * (they block the pass: all of it is exposed communication). */
double dt_gpt2_tp_comm_seconds(dt_gpt2 *m);
void dt_gpt2_units(const dt_gpt2 *m, int *a, int *b);
/* The ranges of units held (one but for an interleaved stage): their count,
 * a[i], b[i] filled (arrays of DT_GPT2_MAX_CHUNKS). */
int dt_gpt2_chunks(const dt_gpt2 *m, int *a, int *b);
/* Which range backward, W, dt_gpt2_output and dt_gpt2_input_grad work on
 * (a forward selects its own); each slot keeps every range's state. */
dt_status dt_gpt2_use_chunk(dt_gpt2 *m, int chunk);
/* With on, backward runs no gradient hook; dt_gpt2_announce_grads runs
 * them for every unit held, in backward's order (an interleaved stage's
 * chunks finish their backwards at different times: data parallelism
 * reduces them all once the last is through). */
void dt_gpt2_hold_grad_hooks(dt_gpt2 *m, int on);
void dt_gpt2_announce_grads(dt_gpt2 *m);
/* Fails, naming what needs it, unless the model holds every unit (files hold whole models). */
dt_status dt_gpt2_check_whole(const dt_gpt2 *m, const char *what);
void dt_gpt2_destroy(dt_gpt2 *m);
/* GPT-2's initialisation (HF): weights N(0, 0.02), residual projections
 * scaled by 1/sqrt(2L), biases 0, LayerNorm weights 1, padded rows 0. */
void dt_gpt2_init_random(dt_gpt2 *m, uint64_t seed);
/* The same values for store elements [lo, hi) only (a rank's piece; threads share the work). */
void dt_gpt2_init_random_range(dt_gpt2 *m, uint64_t seed, size_t lo, size_t hi);

const dt_gpt2_config *dt_gpt2_get_config(const dt_gpt2 *m);
/* A mixture of experts' top-k, balancing loss and capacity, r's, on a model made (dt_program_set_routing). */
dt_status dt_gpt2_set_routing(dt_gpt2 *m, const dt_gpt2_config *r);
size_t dt_gpt2_num_params(const dt_gpt2 *m);
float *dt_gpt2_params(dt_gpt2 *m);
float *dt_gpt2_grads(dt_gpt2 *m);
/* The tensor table: wte, wpe (unit 0); per block ln1w, ln1b, qkvw, qkvb,
 * attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb (units 1..L);
 * lnfw, lnfb (unit L+1). The LM head is wte (tied). */
const dt_tensor_info *dt_gpt2_tensors(const dt_gpt2 *m, int *n);
/* How many layers llm.c's tensor i has: L for the per-block ones, else 1. */
int dt_gpt2_llmc_layers(const dt_gpt2 *m, int i);
/* The entry for llm.c's tensor i (0..15), layer l (0 when not per layer). */
const dt_tensor_info *dt_gpt2_llmc_tensor(const dt_gpt2 *m, int i, int l);
void dt_gpt2_model(dt_gpt2 *m, dt_model *out);

/* Forward over inputs[B*T] (token ids < V, T <= max_seq_len). With targets,
 * *loss gets the mean cross-entropy (else it is left alone). Activations
 * are sized on first use and grown when B*T grows. */
dt_status dt_gpt2_forward(dt_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss);
/* Forward over units [a, b) of those held: from the tokens (a == 0) or from
 * x, the residual stream [B, T, C] entering unit a; targets (and the loss)
 * only when the range ends with the head (b == L+2). A range that ends
 * before the head leaves its output in dt_gpt2_output. Ranges of one model
 * chain: passing dt_gpt2_output as x copies nothing. */
dt_status dt_gpt2_forward_units(dt_gpt2 *m, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets,
                                int B, int T, float *loss);
/* The residual stream [B, T, C] after the last forward's range (NULL if it ran the head). */
const float *dt_gpt2_output(const dt_gpt2 *m);
/* Backward over the last forward's range: from the loss (scaled by
 * grad_scale) when it ran the head, else from dout = d(its output)
 * [B, T, C]. A range that started after unit 0 leaves d(its input) in
 * dt_gpt2_input_grad. */
dt_status dt_gpt2_backward_units(dt_gpt2 *m, const float *dout, float grad_scale);
/* Zero-bubble pipelines split backward in two: with on, backward (B)
 * computes the input gradients only (and the LayerNorms' small weight
 * gradients), keeping each block's Linear output gradients in the slot;
 * dt_gpt2_backward_weights (W) later adds the Linears', the head's and the
 * embedding's weight gradients, the same sums as one backward, and runs
 * the gradient hooks (and the embedding's before-backward hook) as each
 * unit's gradients are whole. In f32 and 16 bits; not with recomputation. */
dt_status dt_gpt2_set_split_backward(dt_gpt2 *m, int on);
dt_status dt_gpt2_backward_weights(dt_gpt2 *m);
/* Before each unit's forward and each unit's backward: before_forward(unit,
 * ctx), before_backward(unit, ctx) (a sharded strategy gathers the unit's
 * parameters there; NULL: none). */
void dt_gpt2_set_unit_hooks(dt_gpt2 *m, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx);
/* Activation checkpointing: keep only each block's input and recompute the
 * block's activations during backward (one extra forward, L-1 fewer layers
 * of activations). Set before training; the results are the same bits. */
dt_status dt_gpt2_set_recompute(dt_gpt2 *m, int on);
/* Attention memory: DT_ATTN_AUTO keeps the T x T softmax rows for short
 * sequences and goes blockwise (only a log-sum-exp per row) from T >= 256;
 * the other two force one form. DT_ATTN_CUDNN is the GPU's (cuDNN's fused attention, bf16; --device cuda only): it
 * keeps each row's log-sum-exp, as blockwise does, wherever a program's memory is counted. */
typedef enum { DT_ATTN_AUTO = 0, DT_ATTN_FULL, DT_ATTN_BLOCKWISE, DT_ATTN_CUDNN } dt_attn_mode;
void dt_gpt2_set_attention(dt_gpt2 *m, dt_attn_mode mode);
/* Backward calls hook(unit, ctx) as each unit's gradients are final: unit
 * L+1 (the LM head and final LayerNorm: lnfw, lnfb, and wte's head part),
 * then each block L .. 1, then 0 for the embeddings (wpe, and wte's rows of
 * the input tokens, unless those are deferred: below). Data parallelism
 * starts a bucket's allreduce from here. */
void dt_gpt2_set_grad_hook(dt_gpt2 *m, dt_unit_hook hook, void *ctx);
/* With on, backward leaves the embedding's rows out of wte's gradient: the
 * caller adds them from dt_gpt2_input_grad (data parallelism averages wte
 * early and exchanges only these B x T rows at the end). */
void dt_gpt2_set_defer_wte_rows(dt_gpt2 *m, int on);
/* After backward: d loss / d (token + position embedding), [B*T, C] (or,
 * for a range that started after unit 0, d loss / d its input), and the
 * tokens of the micro-batch (*ntokens = B*T). */
const float *dt_gpt2_input_grad(const dt_gpt2 *m, const int32_t **tokens, int *ntokens);
/* Gradients in caller-provided storage of dt_gpt2_num_params floats (a
 * shared arena, say), which the model does not free; NULL goes back to its own. */
void dt_gpt2_set_grad_storage(dt_gpt2 *m, float *grads);
/* Parameters in caller storage (see dt_model.set_param_storage). */
void dt_gpt2_set_param_storage(dt_gpt2 *m, float *params);
/* See dt_model.params_changed: from the first call on, a forward casts a
 * tensor to 16 bits only if it was written since its last cast (the
 * caller says when); before it, at every forward. */
void dt_gpt2_params_changed(dt_gpt2 *m);
/* Activation slots (a pipeline stage with several micro-batches in
 * flight): n arenas, each sized on its first forward; dt_gpt2_use_slot(m, k)
 * makes slot k the one forward and backward work in (a backward runs in
 * the slot of its forward). Set before training; one slot by default. */
dt_status dt_gpt2_set_slots(dt_gpt2 *m, int n);
void dt_gpt2_use_slot(dt_gpt2 *m, int k);
int dt_gpt2_num_slots(const dt_gpt2 *m);
/* Sizes the activations for up to B x T, so later calls need not grow them. */
dt_status dt_gpt2_reserve(dt_gpt2 *m, int B, int T);
/* Logits [B, T, Vp] of the last forward (before backward); NULL under mixed
 * precision, which keeps them in 16 bits. */
const float *dt_gpt2_logits(const dt_gpt2 *m);
/* Backward of the last forward with targets: adds d(mean loss) to the
 * gradients, scaled by grad_scale (1/accumulation steps, say). */
dt_status dt_gpt2_backward(dt_gpt2 *m, float grad_scale);
void dt_gpt2_zero_grad(dt_gpt2 *m);
/* Bytes held: parameters (and their 16-bit copy), gradients, activations. */
size_t dt_gpt2_memory(const dt_gpt2 *m);
/* Bytes of activations (and mixed precision's scratch). */
size_t dt_gpt2_activation_memory(const dt_gpt2 *m);
/* Of those, the bytes kept from forward for backward (the rest: one block's
 * working set, the gradients in flight, the 16-bit matmuls' scratch). */
size_t dt_gpt2_activation_kept(const dt_gpt2 *m);
/* Bytes of the parameters' 16-bit copy held: the whole copy, or with unit
 * hooks (made unit by unit as they run) the most held at once. */
size_t dt_gpt2_lp_params_bytes(const dt_gpt2 *m);
/* Mixed precision, set before the first forward: DT_F32 (the default), or
 * DT_BF16 / DT_F16 as torch.autocast does it on top of f32 parameters and
 * gradients: the Linears (the LM head too) multiply 16-bit copies of their
 * inputs and weights with f32 sums and return 16-bit outputs; their input
 * and weight gradients are 16-bit values; attention and GELU take and give
 * 16-bit values and compute in f32; the embeddings, LayerNorms, residual
 * stream and loss stay f32. The blocks' 16-bit activations are kept in 16
 * bits (about half the memory). */
dt_status dt_gpt2_set_precision(dt_gpt2 *m, dt_dtype t);
dt_dtype dt_gpt2_precision(const dt_gpt2 *m);

/* ---- MLP: Linear layers, ReLU (or tanh) between them, softmax
 * cross-entropy on the last (image classification), or the outputs alone
 * with their gradient given back (an RL policy's heads); flat parameters,
 * each layer weight [out, in] then bias [out] (nn.Linear's layout). ---- */
typedef struct dt_mlp dt_mlp;
typedef enum { DT_MLP_RELU = 0, DT_MLP_TANH } dt_mlp_activation;
/* sizes[0] inputs, sizes[nsizes-1] classes (2 <= nsizes <= 17). */
dt_status dt_mlp_create(const int *sizes, int nsizes, dt_mlp **out);
void dt_mlp_destroy(dt_mlp *m);
/* nn.Linear's default initialisation: uniform in +-1/sqrt(fan_in). */
void dt_mlp_init_random(dt_mlp *m, uint64_t seed);
/* torch.nn.init.orthogonal_ on each weight, times gain[layer]; biases 0 (CleanRL's layer_init). */
dt_status dt_mlp_init_orthogonal(dt_mlp *m, uint64_t seed, const float *gain);
/* Between the layers (ReLU unless set). */
void dt_mlp_set_activation(dt_mlp *m, dt_mlp_activation a);
int dt_mlp_num_layers(const dt_mlp *m);
size_t dt_mlp_num_params(const dt_mlp *m);
float *dt_mlp_params(dt_mlp *m);
float *dt_mlp_grads(dt_mlp *m);
void dt_mlp_layer(const dt_mlp *m, int layer, size_t *w_off, size_t *b_off, int *in, int *out);
/* x[B, sizes[0]] (kept by pointer until backward); with labels, *loss gets the
 * mean cross-entropy and *correct (if not NULL) the number of right argmaxes. */
dt_status dt_mlp_forward(dt_mlp *m, const float *x, const int32_t *labels, int B, float *loss, int *correct);
const float *dt_mlp_logits(const dt_mlp *m);
/* Adds grad_scale * d(mean loss) to the gradients; calls the hook with each
 * layer's index (last to first) as that layer's gradients are final. */
dt_status dt_mlp_backward(dt_mlp *m, float grad_scale);
/* After a forward without labels: adds d(loss)/d(parameters) given dout = d(loss)/d(outputs) [B, sizes[n-1]], the
 * hook called as in dt_mlp_backward. */
dt_status dt_mlp_backward_outputs(dt_mlp *m, const float *dout);
void dt_mlp_zero_grad(dt_mlp *m);
void dt_mlp_set_grad_hook(dt_mlp *m, dt_unit_hook hook, void *ctx);
void dt_mlp_set_grad_storage(dt_mlp *m, float *grads);
void dt_mlp_set_param_storage(dt_mlp *m, float *params);
/* The table: layer.L.weight, layer.L.bias per Linear (unit L); column- then
 * row-parallel in turns, as Megatron pairs its Linears. */
const dt_tensor_info *dt_mlp_tensors(const dt_mlp *m, int *n);
/* Its layers as dt_linear_layers (key: the layer), and their observer (model.h). */
dt_status dt_mlp_linears(const dt_mlp *m, dt_linear_layer **out, int *n);
void dt_mlp_set_linear_observer(dt_mlp *m, dt_linear_observer fn, void *ctx);
void dt_mlp_model(dt_mlp *m, dt_model *out);

/* ResNets (resnet.c): torchvision's resnet18, resnet34, resnet50 (same
 * layer names, shapes and order as its state dict; BatchNorm's running
 * averages are buffers beside the parameters) and "resnet:small" for 28x28
 * images (a 3x3 stem, three stages of two basic blocks, 16/32/64
 * channels). Images NCHW. Units: the stem, each block, the head. */
typedef struct { int depth; /* 18, 34, 50; 0: small */ int channels, height, width, classes; } dt_resnet_config;
typedef struct dt_resnet dt_resnet;
/* Synchronised BatchNorm: sums[0..n) replaced by their sum over the ranks. */
typedef dt_status (*dt_bn_reduce)(double *sums, size_t n, void *ctx);

dt_status dt_resnet_config_parse(const char *spec, int channels, int height, int width, int classes, dt_resnet_config *out);
dt_status dt_resnet_create(const dt_resnet_config *cfg, dt_resnet **out);
void dt_resnet_destroy(dt_resnet *m);
/* torchvision's initialisation (kaiming normal convolutions, BatchNorm 1
 * and 0, nn.Linear's head) from dtrain's generator; running mean 0, variance 1. */
void dt_resnet_init_random(dt_resnet *m, uint64_t seed);
const dt_resnet_config *dt_resnet_get_config(const dt_resnet *m);
size_t dt_resnet_num_params(const dt_resnet *m);
float *dt_resnet_params(dt_resnet *m);
float *dt_resnet_grads(dt_resnet *m);
const dt_tensor_info *dt_resnet_tensors(const dt_resnet *m, int *n);
/* Memory for a batch of B: the activations kept from forward for backward
 * (and max pooling's indices), the gradient buffers backward shares among
 * them, the convolutions' scratch. */
void dt_resnet_batch_bytes(const dt_resnet *m, int B, size_t *kept, size_t *grads, size_t *work);
/* The running averages: per BatchNorm i (in forward order) its name, its
 * channels C and the offset of its running mean (C floats, then the
 * running variance) in the buffers. */
float *dt_resnet_buffers(dt_resnet *m, size_t *n);
int dt_resnet_num_batchnorms(const dt_resnet *m);
const char *dt_resnet_batchnorm_name(const dt_resnet *m, int i, int *channels, size_t *buffer_offset);
/* x [B, channels, height, width]; train: BatchNorm on the batch's
 * statistics (updating the running averages), else on the running ones.
 * With labels: *loss the mean cross-entropy and *correct the top-1 hits. */
dt_status dt_resnet_forward(dt_resnet *m, const float *x, const int32_t *labels, int B, bool train, float *loss, int *correct);
const float *dt_resnet_logits(const dt_resnet *m);
/* Adds grad_scale * d(mean loss) to the gradients; calls the hook with each
 * unit as its gradients are final (last unit first). */
dt_status dt_resnet_backward(dt_resnet *m, float grad_scale);
void dt_resnet_zero_grad(dt_resnet *m);
void dt_resnet_set_grad_hook(dt_resnet *m, dt_unit_hook hook, void *ctx);
/* With fn, BatchNorm's sums (forward's and backward's) go through it: synchronised BatchNorm. */
void dt_resnet_set_bn_reduce(dt_resnet *m, dt_bn_reduce fn, void *ctx);
void dt_resnet_set_grad_storage(dt_resnet *m, float *grads);
void dt_resnet_set_param_storage(dt_resnet *m, float *params);
/* Its convolutions and head as dt_linear_layers (key: the op's place on the tape), and their observer (model.h). */
dt_status dt_resnet_linears(const dt_resnet *m, dt_linear_layer **out, int *n);
void dt_resnet_set_linear_observer(dt_resnet *m, dt_linear_observer fn, void *ctx);
void dt_resnet_model(dt_resnet *m, dt_model *out);

#ifdef __cplusplus
}
#endif
#endif
