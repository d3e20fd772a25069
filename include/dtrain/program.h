/* dtrain model layer: the model program. A transformer family is data (a
 * spec: its tensors, the ops of a block, its checkpoint names) and one
 * interpreter runs any family's forward and backward from it. GPT-2 and
 * Llama (with Qwen 2's q/k/v biases) are the families today.
 The trainer (every
 * strategy's part of a model) and the decoder (infer/decoder.c) run the same
 * spec (docs/architecture.md, "the model program"). */
#ifndef DTRAIN_PROGRAM_H
#define DTRAIN_PROGRAM_H

#include "dtrain/base.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Presets: GPT-2's (the gpt2 family) and Llama shapes; dt_gpt2_preset is this. */
#define DT_LM_PRESETS "d6, 124M, 350M, 774M, 1558M, llama-tiny, smollm-135m, llama3.2-1b, qwen3-tiny, qwen3-0.6b, mixtral-tiny, qwen3-moe-tiny"
dt_status dt_lm_preset(const char *name, dt_lm_config *out);
/* Checks a config (its defaults resolved): positive sizes, K/V heads dividing the heads, an even head for rotary
 * positions. */
dt_status dt_lm_config_check(const dt_lm_config *c, const char *where);

typedef struct dt_program dt_program;

dt_status dt_program_create(const dt_lm_config *cfg, dt_program **out);
/* What one rank holds of the model: units [ua, ub) of 0..L+1 (0: the embedding; 1..L: the blocks; L+1: the
 * final norm and the head), or an interleaved stage's chunks, split by tensor parallelism or not (part's tp_rank,
 * tp_size, tp; Megatron's split: q by heads, K/V by K/V heads (each rank its share, or, with fewer K/V heads
 * than ranks, the one its heads read, kept by each rank that reads it, its gradient summed over them as backward makes it), the MLP by hidden units, the embedding
 * and head by vocabulary rows, the rest whole). A stage that holds a tied head but not the embedding keeps its
 * own copy of the token table in unit L+1 (tied_copy). With part's sp, sequence parallelism on the tensor-parallel
 * group; with cp_size > 1, context parallelism (attention through part's cp, rows in dt_gpt2_cp_position's order). */
dt_status dt_program_create_part(const dt_lm_config *cfg, const dt_model_part *part, dt_program **out);

/* A part's table and ops (NULL: the whole model's) without its parameters or activations (no forward, no store): what
 * a tool needs to name, count or place tensors, and to hold LoRA's adapters alone (io/peft.c, the planner). */
dt_status dt_program_create_table(const dt_lm_config *cfg, const dt_model_part *part, dt_program **out);
void dt_program_destroy(dt_program *p);
const dt_lm_config *dt_program_config(const dt_program *p);
/* Weights as a seed draws them (normal 0.02; the output projections 0.02 / sqrt(2 L); norms 1, biases 0). */
void dt_program_init_random(dt_program *p, uint64_t seed);

/* The same values for store elements [lo, hi) only (a rank's piece). */
void dt_program_init_random_range(dt_program *p, uint64_t seed, size_t lo, size_t hi);
size_t dt_program_num_params(const dt_program *p);
float *dt_program_params(dt_program *p);
float *dt_program_grads(dt_program *p);
void dt_program_zero_grad(dt_program *p);

/* A device the whole model runs on (the GPU's, dtrain/gpu.h): from dt_program_set_device on, dt_program_forward and
 * dt_program_backward run there (forward gets the count dt_program_set_loss_tokens gave, 0: its own), and the host
 * store is a mirror that whoever owns the device makes current (the engine's "gpu" strategy, for a save). NULL:
 * back to the host. */
typedef struct {
    dt_status (*forward)(void *ctx, const int32_t *inputs, const int32_t *targets, int B, int T, double loss_tokens, float *loss);
    dt_status (*backward)(void *ctx, float grad_scale);
    void *ctx;
} dt_program_device;
void dt_program_set_device(dt_program *p, const dt_program_device *d);
/* Unit u's name in a trace, for a pass ("forward", "backward") of a model of `layers` blocks: "forward embedding",
 * "backward block 3", "forward head" (a device's trace names them alike). */
void dt_program_unit_name(int layers, const char *pass, int u, char *out, size_t cap);

/* Forward on B x T tokens through every unit; with targets, the mean cross-entropy into *loss: over the scored
 * targets (DT_IGNORE_INDEX, -100, marks one that is not: no loss, no gradient; a prompt's tokens in supervised
 * fine-tuning, padding), divided by their count in this micro-batch, or by n after dt_program_set_loss_tokens(p, n)
 * (n > 0; 0: back to the count): a step over several micro-batches and ranks gives each the global batch's count
 * divided by their number, so that every layout takes the mean over the global batch's scored tokens, as one
 * process with the whole batch does. */
void dt_program_set_loss_tokens(dt_program *p, double n);
/* Rows packing several documents (supervised fine-tuning's packing, TRL's padding-free position_ids): pos[B*T], each
 * row's position in its document (a document starts at a row of position 0 and counts up), read by every forward's
 * first range from then on (the caller refills the buffer per micro-batch); attention stays inside each document, the
 * positions (rotary, learned) restart. NULL: 0..T-1 again. Refused with context parallelism. */
dt_status dt_program_set_positions(dt_program *p, const int32_t *pos);
/* Training's randomness (LoRA's dropout): keys[b] names sequence b of each micro-batch in the data (a global row of
 * an epoch, with the run's seed: dt_loader_row_keys), read by every forward's first range from then on (the caller
 * refills the buffer per micro-batch). A value's mask is drawn from its sequence's key, its position in the whole
 * sequence, its adapter and its column, so every layout of the same global batch drops the same values, and backward
 * draws them again. NULL (the default): no dropout, as a model in evaluation. */
void dt_program_set_row_keys(dt_program *p, const uint64_t *keys);
/* A loss over a micro-batch's tokens in place of their mean cross-entropy (preference tuning's, a policy gradient's):
 * given a micro-batch's rows (dt_token_rows: ce[B*T], each row's cross-entropy, -log p of its target, 0 where not
 * scored), it returns the micro-batch's loss and writes dce[B*T], d(loss)/d(ce), which backward takes as each row's weight (with grad_scale). Called where
 * the head runs (a pipeline's last stage), once per forward with targets, in the order of the micro-batches (16-bit
 * logits too: their gradient takes the weights where the head's backward makes it). Refused with context parallelism
 * (a rank holds part of each sequence). fn NULL: the mean again. stats: the rows' entropies and log sum p^2 asked for
 * (dt_token_rows), and an entropy term in the gradient allowed. */
typedef struct {
    int B, T;
    const float *ce;          /* [B*T] */
    const int32_t *targets;   /* [B*T] (below 0: not scored) */
    /* stats asked: each scored position's next-token distribution p's entropy and log sum_v p_v^2 (WPO's weight, an
     * entropy mask's key), without gradient, 0 where not scored; NULL when not asked (they cost a pass over the logits) */
    const float *entropy, *lsq;
    float *dentropy;          /* stats asked: d(loss)/d(each position's entropy), zeros on entry, for the loss to write
                               * (an entropy bonus: backward adds its gradient through the whole distribution) */
} dt_token_rows;
typedef float (*dt_token_loss_fn)(void *ctx, const dt_token_rows *r, float *dce);
dt_status dt_program_set_token_loss(dt_program *p, dt_token_loss_fn fn, void *ctx, bool stats);
/* The logits divided by t before the loss (and its gradient through the division): the log-probabilities of sampling at
 * temperature t, which TRL's GRPOTrainer trains on; t 1 (the default): as they are. An error for t not above 0. */
dt_status dt_program_set_logit_temperature(dt_program *p, float t);
dt_status dt_program_forward(dt_program *p, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss);
/* Forward over units [a, b) of one held range: from the tokens (a == 0) or from x, the residual stream [B, T, C]
 * entering unit a; targets (and the loss) only when the range ends with the head. A range that ends before the
 * head leaves its output in dt_program_output; passing that as the next range's x copies nothing. */
dt_status dt_program_forward_units(dt_program *p, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets, int B, int T,
                                   float *loss);
/* Backward of the last forward (of the current chunk and slot): from its loss times grad_scale, or, for a range
 * that ends before the head, from dout = d(its output). Adds to the gradients; d(the range's input) is left for
 * dt_program_input_grad. */
dt_status dt_program_backward_units(dt_program *p, const float *dout, float grad_scale);
dt_status dt_program_backward(dt_program *p, float grad_scale);
/* The last forward's logits [B, T, this rank's vocabulary rows] (NULL without the head); the residual stream
 * after a range that ends before the head; d(a range's input) after its backward, with the batch's tokens. */
const float *dt_program_logits(const dt_program *p);
/* A mixture of experts after a forward: held layer l's router probabilities [B*T, E], and the last held layer's
 * output [B*T, C] (NULL: no experts, l not held, or a dense layer among the mixtures); the balancing loss (load_balancing_loss_func's value, before its coefficient; 0 without
 * one); each held layer's choices of each expert since the last call ([held layers][E], then zeroed; NULL: zeroed). */
const float *dt_program_moe_probs(const dt_program *p, int l);
const float *dt_program_moe_output(const dt_program *p);
double dt_program_moe_balance_loss(const dt_program *p);
/* The router z-loss (ST-MoE's; transformers' router_z_loss_func over every layer's router logits): the mean over the
 * micro-batch's layers and rows of the squared log-sum-exp of a row's logits; coef times it joins the loss, its
 * gradient the routers'. A softmax router's; 0 turns it off. The last forward's value (before its coefficient). */
dt_status dt_program_set_z_loss(dt_program *p, float coef);
double dt_program_moe_z_loss(const dt_program *p);
/* The sequence-wise balancing loss (DeepSeek-V2's and V3's complementary one, Megatron's seq_aux_loss), summed over the
 * layers: a layer's is the mean over the micro-batch's sequences of sum_e f_e P_e, f_e = E / (K T) x the sequence's
 * tokens whose K most probable experts hold e (the routing's bias and groups aside), P_e the mean over its T tokens of
 * e's probability (a sigmoid router's scores normalised to sum to 1); coef times it joins the loss. Either router;
 * 0 turns it off. The last forward's value (before its coefficient). */
dt_status dt_program_set_seq_aux_loss(dt_program *p, float coef);
double dt_program_moe_seq_loss(const dt_program *p);
/* The global-batch balancing loss (Megatron's global_aux_loss; the Qwen team's global-batch balance): each layer's
 * E sum_e f_e P_e, f_e the share of the K most probable experts' choices that went to e, counted over the micro-batches
 * of the same index on every rank of the model's part.global_sums (data parallelism) and over the step's micro-batches
 * so far (Megatron's running average: dt_program_moe_new_step starts a step), P_e e's mean probability over the
 * global micro-batch; summed over the layers, coef times it joins the loss. Either router; 0 turns it off. The last
 * forward's value (before its coefficient). */
dt_status dt_program_set_global_aux_loss(dt_program *p, float coef);
double dt_program_moe_global_loss(const dt_program *p);
void dt_program_moe_new_step(dt_program *p);
/* The balancing losses' values (before their coefficients: Switch's, the z-loss, the sequence-wise, the global-batch)
 * summed over the micro-batches whose loss this rank made since the last call (a pipeline's last stage), then that
 * count: out[DT_MOE_TERMS + 1]; then zeroed. */
enum { DT_MOE_TERMS = 4 };
void dt_program_moe_terms(dt_program *p, double *out);
void dt_program_moe_load(dt_program *p, double *load);
/* The choices a capacity dropped, and all choices, since the last call (then zeroed). */
void dt_program_moe_drops(dt_program *p, double *dropped, double *pairs);
/* With expert parallelism, since the last call (then zeroed): the bytes the exchanges sent to other ranks (per routed
 * row that crossed, C + 1 floats there and C back in forward (the row and its weight, its output), C there and C + 1
 * back in backward (its gradient, d(input) and d(weight)); a recomputed forward's twice). */
void dt_program_moe_ep_traffic(dt_program *p, double *bytes);
/* Held layer l's choices after the last forward [B*T][k] (an expert, or -1 where its capacity dropped it): how many
 * dropped (-1: l not held or no experts). */
int dt_program_moe_choices(dt_program *p, int l, int32_t *idx);
/* r's top-k, balancing loss and capacity for a model made (a Hugging Face folder's, overridden). Before the first
 * forward. */
dt_status dt_program_set_routing(dt_program *p, const dt_lm_config *r);
/* DeepSeek-V3's router: every layer's bias [L][E] (n of them; NULL: another router), which only chooses; the step's
 * global load of every layer's experts [L][E] moves it (each rank keeps all layers' biases, and moves them alike). */
float *dt_program_moe_bias(dt_program *p, size_t *n);
void dt_program_moe_update_bias(dt_program *p, const double *load);
const float *dt_program_output(const dt_program *p);
const float *dt_program_input_grad(const dt_program *p, const int32_t **tokens, int *n);
/* An interleaved stage's chunks: their count, a[i], b[i] (arrays of DT_GPT2_MAX_CHUNKS); which one backward,
 * dt_program_output and dt_program_input_grad work on (a forward selects its own). */
int dt_program_chunks(const dt_program *p, int *a, int *b);
dt_status dt_program_use_chunk(dt_program *p, int chunk);
/* Activation slots (micro-batches in flight on a pipeline stage): n, each sized at its first forward; a backward
 * runs in the slot of its forward. A program of several chunks keeps each chunk's activations apart, held by the
 * slot from that chunk's forward to the end of its backward (its areas: as many as the schedule has in flight at
 * once); dt_program_release_activations gives back what the current slot holds after forwards that no backward
 * follows (an evaluation). */
dt_status dt_program_set_slots(dt_program *p, int n);
void dt_program_use_slot(dt_program *p, int k);
int dt_program_num_slots(const dt_program *p);
void dt_program_release_activations(dt_program *p);
/* Zero-bubble pipelines split backward in two: with on, backward (B) computes the input gradients (and the
 * norms' small weight gradients), keeping each block's Linear output gradients in the slot; W,
 * dt_program_backward_weights, adds the Linears', the head's and the embedding's weight gradients (the same
 * sums as one backward) and runs the gradient hooks. Not with recomputation. */
dt_status dt_program_set_split_backward(dt_program *p, int on);
dt_status dt_program_backward_weights(dt_program *p);
/* Activation checkpointing: keep each block's output only and redo the block's forward in backward (the same
 * bits). Attention's memory: DT_ATTN_AUTO keeps T x T scores below T = 256, the log-sum-exp from there. */
dt_status dt_program_set_recompute(dt_program *p, int on);
void dt_program_set_attention(dt_program *p, dt_attn_mode mode);
/* Whether attention at sequence length T keeps each row's log-sum-exp (and recomputes its probabilities in backward)
 * rather than T x T probabilities: context parallelism, DT_ATTN_BLOCKWISE, or DT_ATTN_AUTO from T 256. */
bool dt_program_attention_lse(const dt_program *p, int T);
dt_attn_mode dt_program_attention(const dt_program *p);
/* With on, backward leaves the token table's rows out of its gradient (data parallelism adds them from
 * dt_program_input_grad, the embedding's output gradient, after exchanging only those rows). */
void dt_program_set_defer_rows(dt_program *p, int on);
/* Mixed precision, set before the first forward: DT_F32 (the default), or DT_BF16 / DT_F16 as torch.autocast does
 * it on top of f32 parameters and gradients (program_lp.c). The 16-bit copy of the parameters: the caller keeps it
 * current from now on (caller_keeps 1: a strategy holding a shard of the f32 master allgathers it) or not; the
 * parameters were written (cast again at the next forward, and from the first call on only what was written); the
 * bytes of the copy held. */
dt_status dt_program_set_precision(dt_program *p, dt_dtype t);
dt_dtype dt_program_precision(const dt_program *p);
uint16_t *dt_program_lp_copy(dt_program *p, int caller_keeps, dt_dtype *t);
void dt_program_params_changed(dt_program *p);
size_t dt_program_lp_params_bytes(const dt_program *p);
/* Memory: activations sized for up to B x T now; the bytes held (parameters, gradients, the 16-bit copy,
 * activations); the activations' (every slot's, and the 16-bit matmuls' scratch); of one slot's, those kept from
 * forward for backward. Without a model: what a part's slot takes for B x T with these settings (the planner's
 * estimate is the allocation itself), and the 16-bit matmuls' scratch. */
dt_status dt_program_reserve(dt_program *p, int B, int T);
size_t dt_program_memory(const dt_program *p);
size_t dt_program_activation_memory(const dt_program *p);
size_t dt_program_activation_kept(const dt_program *p);
size_t dt_program_activation_bytes(const dt_lm_config *cfg, const dt_model_part *part, int B, int T, int recompute, dt_attn_mode attn,
                                   dt_dtype prec, int split);
/* The same part's slot with its chunks' activations apart (several chunks): the slot's own bytes, and in area[r]
 * (DT_GPT2_MAX_CHUNKS) what each chunk's area takes (0 where the part has one chunk: the slot holds all). */
size_t dt_program_activation_split_bytes(const dt_lm_config *cfg, const dt_model_part *part, int B, int T, int recompute, dt_attn_mode attn,
                                         dt_dtype prec, int split, size_t *area);
size_t dt_program_lp_work_bytes(const dt_lm_config *cfg, const dt_model_part *part);
/* Without a model: the parameters a part holds and the whole model's; model FLOPs of a training step a token at
 * sequence length T (6 N + 12 L T Q); block l's parameters in matmuls (l -1: the most a block has). */
dt_status dt_program_shape_params(const dt_lm_config *cfg, const dt_model_part *part, size_t *local, size_t *global);
double dt_program_flops_per_token(const dt_lm_config *cfg, int T);
double dt_program_block_matmul_params(const dt_lm_config *cfg, int l);
/* Without a model: layer l's Linears as a part's rank runs them (l -1: those any layer runs), [outputs, inputs] each (at
 * most max), in the spec's order; their count (0: a bad config). */
int dt_program_linear_shapes(const dt_lm_config *cfg, const dt_model_part *part, int l, int (*shape)[2], int max);
/* Seconds in tensor parallelism's collectives since the last call. */
double dt_program_tp_comm_seconds(dt_program *p);
/* With on, backward runs no gradient hook; dt_program_announce_grads runs them for every held unit, in
 * backward's order. */
void dt_program_hold_grad_hooks(dt_program *p, int on);
void dt_program_announce_grads(dt_program *p);

/* A block's ops, as the trainer and the decoder both run them. The values an op passes: DT_V_IN (the residual
 * stream entering the block), DT_V_OUT (leaving it), then the block's own. An op reads in (and in2, the add's
 * other input) and writes out; its weights are the block's tensors [w, w + nw): a Linear's parts side by side in
 * the store (Llama's q, k and v; GPT-2's fused c_attn is one part), its output their rows in that order; bias: the
 * tensors [b, b + nw), or -1. Attention reads q of its heads, then k and v of its K/V heads. A mixture of experts
 * (program_moe.c) reads the normed stream and writes its output: w its router [E, C], then the experts' stacked gate
 * [E, F, C], up [E, F, C] and down [E, C, F] projections (a SwiGLU MLP each; nw 4; nw 3: up and down alone, a GELU MLP
 * each, GPT-2's MLP made a mixture as Megatron's and the Switch Transformer's are). A head norm reads attention's
 * input and writes it with each query head and each K/V head RMS-normed on its own: w the queries' weight [head_dim],
 * w + 1 the keys' (nw 2; Qwen 3's q_norm and k_norm). layers: the layers an op runs in (a family with a mixture
 * declares both MLPs, each for its layers: dt_lm_layer_moe). */
typedef enum { DT_OP_NORM, DT_OP_LINEAR, DT_OP_ATTENTION, DT_OP_GELU, DT_OP_SWIGLU, DT_OP_ADD, DT_OP_MOE, DT_OP_HEADNORM } dt_op_kind;
enum { DT_V_IN = 0, DT_V_OUT = 1 };
typedef enum { DT_LAYERS_ALL = 0, DT_LAYERS_DENSE = 1, DT_LAYERS_MOE = 2 } dt_layers;
typedef struct {
    dt_op_kind kind;
    int in, in2, out;
    int w, nw, b;
    dt_layers layers;
} dt_op_spec;
/* Whether an op (or a tensor) of layers runs in a layer that is a mixture (moe) or not. */
static inline bool dt_layers_hold(dt_layers layers, bool moe) { return layers == DT_LAYERS_ALL || (layers == DT_LAYERS_MOE) == moe; }
/* An op as built on this rank: its spec, and the widths (this rank's) of what it reads and writes. */
typedef struct {
    dt_op_spec s;
    int width_in, width_out;
} dt_program_op;

/* What a program runs, as a decoder reads it: the block's ops and each value's width (this rank's); the norms
 * (RMSNorm, or LayerNorm with a bias) and positions (rotary, with head_dim / 2 frequencies, or a learned table);
 * this rank's query heads and K/V heads; the tensors outside the blocks (NULL: none, or not held; head NULL: tied
 * to embed). Pointers into p, valid while it lives. */
typedef struct {
    const dt_program_op *ops;
    int nops;
    const int *value_width;
    int nvalues;
    int rms, rotary;
    const float *inv_freq;
    int heads, kv_heads, head_dim;
    const dt_tensor_info *embed, *positions, *norm_w, *norm_b, *head;
    const bool *moe_layer;     /* [l]: layer l is a mixture (its ops those whose layers hold it) */
} dt_program_view;
void dt_program_get_view(const dt_program *p, dt_program_view *out);
/* Tensor k of layer l's block (NULL: not held). */
const dt_tensor_info *dt_program_block_tensor(const dt_program *p, int l, int k);
/* Which of this rank's K/V heads its query head h reads. */
int dt_program_kv_head(const dt_program *p, int h);

/* The program's Linear observer (model.h's dt_linear_event): in forward a Linear's input as it multiplies it (every
 * row, gathered under sequence parallelism; a tensor-parallel rank's share of a row-parallel Linear's input), in
 * backward its output's gradient (a rank's columns of a column-parallel Linear's output); key (layer, op: the op's
 * place in the block). A recomputed forward (--recompute) is not shown again. */
/* One observer (fn NULL: none), called from inside forward and backward (its pointers valid during the call only). */
void dt_program_set_linear_observer(dt_program *p, dt_linear_observer fn, void *ctx);
/* The blocks' Linears this rank holds (another pipeline stage's layers left out), for dt_model's linears: each whole
 * on this rank, else an error naming it. */
dt_status dt_program_linears(const dt_program *p, dt_linear_layer **out, int *n);

/* LoRA (Hu et al. 2021) on the Linears whose Hugging Face module names a target names, as PEFT's target_modules
 * list: a name matches a module equal to it or ending in "." and it ("c_proj": both of GPT-2's; "q_proj": a part of
 * Llama's q/k/v Linear, whose other parts stay as they are). Each targeted weight W [out, in] gets A [rank, in]
 * and B [out, rank]; the Linear computes x W^T + (alpha / rank) (x A^T) B^T. With LoRA on, the base weights are
 * frozen (backward makes no gradient for them: the Linears' and the head's weight gradients are skipped) and the
 * model the engine sees (dt_program_model) is the adapters alone: their table (names "h.3.qkvw.lora_A", PEFT's
 * "base_model.model.<module>.lora_A.weight"), stores and units (each block's adapters in its unit), so every
 * strategy (data parallelism, ZeRO's shards, a pipeline's stages) moves and updates the adapters only. Under tensor
 * parallelism an adapter splits as its Linear (a column-parallel one's B by output rows, a row-parallel one's A by
 * input columns; the other whole on each rank). Dropout p (PEFT's lora_dropout) drops the adapter's input, the
 * kept values scaled by 1 / (1 - p), while keys are given (dt_program_set_row_keys; the masks are dtrain's own draws,
 * PyTorch's generator cannot be matched). Set once, before the first forward; f32, no K/V Linear whose heads several
 * ranks keep (what this build does; each other case is refused naming it). A starts uniform in +-1/sqrt(in) (PEFT's
 * Kaiming-uniform), B at zero. */
typedef struct {
    int rank;
    float alpha;
    float dropout;
    const char *targets; /* comma-separated module names */
} dt_lora_config;
dt_status dt_lora_config_check(const dt_lora_config *c, const char *where);
dt_status dt_program_set_lora(dt_program *p, const dt_lora_config *c, uint64_t seed);
/* Without a model: the adapters a part holds (its tensor-parallel rank's share) and the floats a token's slot holds
 * more with them than without (their x A^T, less the inputs of the frozen Linears without adapters, which no backward
 * reads; recompute: blocks recomputed), the planner's count; may be below 0. */
dt_status dt_program_lora_sizes(const dt_lm_config *cfg, const dt_model_part *part, const dt_lora_config *c, int recompute, size_t *params,
                                double *floats_per_token);
/* Model FLOPs a token of a training step (dt_program_flops_per_token's count; with LoRA the frozen base's weight
 * gradients are not made, the adapters' forward and backward are). */
double dt_program_step_flops_per_token(const dt_program *p, int T);
/* The adapters merged into the base (each W += (alpha / rank) B A, PEFT's merge_and_unload) and dropped: a plain
 * model from then on (to serve, to export). Nothing without LoRA. */
void dt_program_lora_merge(dt_program *p);
/* Forward with the adapters (on, the default) or as the base alone (off: preference tuning's reference, as PEFT's
 * disable_adapter). Nothing without LoRA. */
void dt_program_set_lora_enabled(dt_program *p, bool on);
/* Another dropout for the adapters (a PEFT folder's own, overridden). Before the first forward. */
dt_status dt_program_set_lora_dropout(dt_program *p, float dropout);
/* The adapters' config (NULL: no LoRA); their table and count (NULL, 0: none). */
const dt_lora_config *dt_program_lora_config(const dt_program *p);
const dt_tensor_info *dt_program_lora_tensors(const dt_program *p, int *n);

/* The model program behind a dt_gpt2 (which wraps one with the gpt2 spec). */
dt_program *dt_gpt2_program(dt_gpt2 *m);

/* The program as the engine and the strategies see a model: the table, the stores, the hooks; with LoRA, the adapters
 * (what trains). The base model's whichever: its weights (a file's, a merge's). */
void dt_program_model(dt_program *p, dt_model *out);
void dt_program_base_model(dt_program *p, dt_model *out);
/* Its pieces one by one (dt_model's callbacks call these): the gradient hook list (hook NULL: ctx unsubscribes), the
 * hooks before each unit's forward and backward, gradients and parameters in caller storage (NULL: back to its
 * own), what this rank holds, the table. */
void dt_program_set_grad_hook(dt_program *p, dt_unit_hook hook, void *ctx);
void dt_program_set_unit_hooks(dt_program *p, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx);
void dt_program_set_grad_storage(dt_program *p, float *grads);
void dt_program_set_param_storage(dt_program *p, float *params);
bool dt_program_holds_block(const dt_program *p, int l); /* whether block l (unit l + 1) is this rank's */
const dt_tensor_info *dt_program_tensors(const dt_program *p, int *n);


#ifdef __cplusplus
}
#endif
#endif
