/* The model program's spec: what a family file declares and program.c interprets. */
#ifndef DTRAIN_PROGRAM_INTERNAL_H
#define DTRAIN_PROGRAM_INTERNAL_H

#include "dtrain/program.h"

/* The most values and ops a family's block has. */
enum { DT_BLOCK_MAX = 32 };

/* Widths a spec names, resolved from the config (program.c, width_of). */
typedef enum { W_NONE, W_C, W_Q, W_KV, W_QKV, W_FFN, W_FFN2, W_VOCAB, W_POS, W_EXPERTS, W_SFFN, W_ONE, W_DFFN, W_DFFN2, W_HD } dt_width;

/* One tensor: our name and Hugging Face's ("%d": the layer), its rows and columns (W_NONE: a vector), how
 * tensor parallelism splits it, and what mixed precision reads in f32 (dt_tensor_info's f32_read). hf_t: HF
 * stores it transposed (GPT-2's Conv1D); how a seed initialises it. */
typedef struct {
    const char *name, *hf;
    dt_width rows, cols;
    dt_tp_split split;
    int f32_read, hf_t;
    enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init; /* a weight, a norm's scale, a bias */
    const char *gguf;                                 /* llama.cpp's name in a GGUF file ("%d": the layer) */
    dt_width stack;                                   /* W_EXPERTS: one [rows, cols] an expert, stacked (hf's "%%d": the expert) */
    dt_layers layers;                                 /* the layers that hold it (a mixture's, a dense MLP's, all) */
} dt_tensor_spec;
/* A mixture's tensor (a router, an expert's stacked weights: stack W_EXPERTS) as a family's spec lists it (gguf: its
 * llama.cpp name, the experts stacked in one tensor; NULL: none). */
#define DT_SPEC_ROUTED(i, name, hf, rows, cols, stack, gguf) [i] = { name, hf, rows, cols, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, gguf, stack, DT_LAYERS_MOE }



struct dt_family {
    const char *name;
    int rms;                           /* the norms: RMSNorm (1) or LayerNorm with a bias (0) */
    int rotary;                        /* positions: rotary in attention (1) or a learned table beside the embedding (0) */
    const dt_tensor_spec *embed;       /* unit 0: the token table first (then the positions' where learned) */
    int nembed;
    const dt_tensor_spec *block;
    int nblock;
    const dt_tensor_spec *final;       /* unit L+1: the final norm's, then the untied head (its last entry, left out when tied) */
    int nfinal;
    const dt_op_spec *ops;
    int nops;
    const dt_width *values;            /* each value's width (DT_V_IN and DT_V_OUT: W_C) */
    int nvalues;
    const char *gguf_arch;             /* llama.cpp's architecture for it */
    int gguf_pairs;                    /* llama.cpp turns adjacent channel pairs (its "norm" rope) where HF turns halves:
                                        * a GGUF's q and k rows are reordered */
    const char *hf_arch;               /* transformers' class for it (a folder's config.json "architectures"; its
                                        * model_type is the family's name), NULL: none */
    const char *hf_none;               /* then why not, as an error says it */
    const char *hf_module_prefix;      /* what Hugging Face's CausalLM class puts before the tensors' names in its modules'
                                        * (GPT-2's "transformer."): PEFT's adapter names carry it */
    const char *lora_targets;          /* PEFT's default LoRA targets for it */
};

/* LoRA's adapters (program_lora.c): for each Linear op k and each of its parts j (op_part[k * DT_LORA_MAX_PARTS + j]:
 * the adapter's index within a block, -1: not targeted), A then B of each adapted part, block by block (each in its
 * unit) in a store of their own. A slot keeps each adapter's x A^T [B*T, rank] for backward; with dropout, the
 * dropped input is made again from the kept input and the rows' keys (dt_dropout) where backward needs it. */
#define DT_LORA_MAX_PARTS 4
typedef struct {
    dt_lora_config c;
    char targets[256];
    float scale;                       /* alpha / rank */
    int *op_part, per_block;           /* adapters a block */
    int max_in;                        /* the widest input of an adapted Linear (dropout's scratch a row) */
    dt_tensor_info *tab;
    int ntab;
    size_t nparams, global_params;
    float *params, *grads, *own_params, *own_grads;
} program_lora;

extern const dt_family dt_family_gpt2, dt_family_llama, dt_family_qwen2, dt_family_qwen3, dt_family_mixtral, dt_family_qwen2_moe, dt_family_qwen3_moe, dt_family_deepseek_moe,
    dt_family_gpt2_moe;


/* What a forward leaves for its range's backward: its units, whether the head ran with targets (or is not in the
 * range), and where backward left d(the range's input). */
typedef struct {
    int a, b;
    bool have_targets, w_pending;
    float *dinput;
} run_state;

/* One micro-batch in flight (a pipeline stage keeps several): everything a forward leaves for its backward, and
 * each range's run. The model works in one slot at a time. A program of one range lays it all in mem; one of several
 * (an interleaved pipeline stage's chunks) keeps in mem only what is not kept from a range's forward for its
 * backward, and each range's kept pieces in an area of the program's (program_area) held from that range's forward
 * to the end of its backward, so a micro-batch holds only the chunks it has in flight (as Megatron counts them). */
typedef struct {
    float *mem;
    size_t floats, kept;       /* mem's floats, and of all the slot's (areas too) those kept from forward for backward */
    int B, T, cap_BT, cap_T;
    int lay_B, lay_T;          /* the shape the layout was made for (each area is laid again for it) */
    float *area[DT_GPT2_MAX_CHUNKS]; /* ranges laid in areas: each one's area while held (NULL: none) */
    size_t area_floats[DT_GPT2_MAX_CHUNKS]; /* and the floats each range's needs */
    bool blockwise;
    float **val;               /* [held block * nvalues + v]: the block's values (DT_V_IN, DT_V_OUT: the residual stream's) */
    float **stats;             /* [held block * nops + k]: a norm's mean and rstd, attention's scores (or log-sum-exps) */
    float **packed;            /* [held block]: attention's q|k|v of all heads (NULL: the op's input is that already) */
    float **dval;              /* [v]: the gradients of a block's values, one set that every block's backward reuses */
    float *range_in[DT_GPT2_MAX_CHUNKS]; /* the residual stream entering each range */
    float *dpacked, *dstream[2], *lnf, *lnf_stats, *logits, *losses, *ce_stats, *dlnf, *scratch; /* scratch: 2 B*T */
    float *gather, *partial, *normgrad; /* sequence parallelism's: all rows [B*T, C] gathered; a split sum's all rows; a norm's weight gradient */
    float *headgrad;           /* tensor parallelism's: a head norm's weights' gradients [2 head_dim], this micro-batch's */
    float *moe_dx;             /* and a mixture's d(input) of all rows [B*T, C] (program_moe.c) */
    int32_t *inputs, *targets, *pos;
    int32_t *first;            /* packed documents: each row's document's first row (attention's keys start there) */
    bool docs;                 /* the positions are the caller's (dt_program_set_positions): first holds */
    run_state rs[DT_GPT2_MAX_CHUNKS];
    float **wgrad;             /* a split backward's: [held block * nops + k], a Linear's d(output), all rows, from B for W */
    uint16_t **lp_keep;        /* [held block]: mixed precision (not recomputing), its kept values in 16 bits */
    float *res1;               /* and a block's input widened again for its backward */
    float *lora_u, *lora_du;   /* LoRA: each held block's adapters' x A^T, kept; backward's d(u) of one */
    float *lora_x;             /* LoRA's dropout: an adapter's input dropped, or d(input) before its mask [B*T, max_in] */
    uint64_t *row_key, *lora_rk; /* dropout: each sequence's key (dt_program_set_row_keys), and each row's for one adapter */
    bool keyed;                /* the micro-batch trains with dropout (keys were given) */
    float *dce;                /* a token loss's d(loss)/d(each row's cross-entropy), from forward for backward */
    float *tok_stats;          /* a token loss's stats (asked): [B*T] entropies, [B*T] log sum p^2, [B*T] d(loss)/d(entropy) */
    bool ent_grad;             /* the token loss gave its entropies a gradient */
    float *moe_work;           /* a mixture of experts' scratch (program_moe.c), its ints, and over the micro-batch's */
    int32_t *moe_int;          /* layers each expert's choices and probabilities summed [2E] and the rows that made them */
    double *moe_acc, moe_rows; /* then, with a sequence-wise loss, each layer's counts and probabilities by sequence */
    size_t moe_seq;            /* and expert ([L][2][B][E]: moe_seq doubles, room for moe_seq_cap; moe_sum's likewise) */
    size_t moe_seq_cap;
    float *moe_daux;           /* a layer's d(loss)/d(probabilities) by sequence and expert [B][E], room for moe_daux_B */
    int moe_daux_B;
    /* the global-batch loss's: each layer's top-k counts, probabilities' sums and rows [L][2E + 1], this rank's then
     * (moe_glob_req) summed over part.global_sums; then (moe_glob_f) each layer's shares of the step's global choices so
     * far [L][E], made once the sum has landed (moe_glob_ready) */
    double *moe_glob, *moe_glob_f;
    void *moe_glob_req;
    const dt_part_sums *moe_glob_ops;
    bool moe_glob_ready;
    double moe_z;              /* the z-loss's sum of every layer's rows' lse^2 over the micro-batch */
    /* [2E + 2]: the micro-batch's choices and probabilities by expert, its rows and z-loss sum, as its losses take them:
     * summed over the ranks holding its other parts (part.sums), or this rank's (dt_program_moe_sums_post) */
    double *moe_sum;
    void *moe_req;             /* that sum under way (NULL: none) */
    const dt_part_sums *moe_ops; /* whose it is */
    struct moe_ep_keep *ep_keep; /* expert parallelism: each held block's rows kept by this rank's experts (program_moe_ep.c) */
    int ep_nkeep;
    float moe_gscale;          /* backward's grad_scale (the balancing loss's gradient is scaled with the loss's) */
    float w_dscale;            /* the loss gradient's scale B used (W recomputes the head's 16-bit gradient) */
    double loss_tokens;        /* what the forward's loss divided its sum by (the scored tokens' count), backward too */
    float loss;
} program_slot;

/* An area of a range's kept activations (see program_slot): free, or held by one slot's micro-batch. */
typedef struct {
    float *mem;
    size_t floats;
    int range;
    bool busy;
} program_area;

/* Units: 0 the embedding, 1..L the blocks, L+1 the final norm and the head. A program holds the units of its
 * ranges [ra[r], rb[r]) (one range, or an interleaved pipeline stage's chunks); one that holds the head of a tied
 * model but not unit 0 keeps its own copy of the token table there. */
struct dt_program {
    dt_lm_config cfg;
    const dt_family *f;
    dt_model_part part;         /* what this rank holds: its units, its tensor-parallel share */
    /* this rank's widths: Ql query channels (NHl heads), KVl key/value channels (its K/V heads from kv0; all ranks
     * sharing one when there are fewer K/V heads than ranks), Fl hidden units, vocabulary rows [v0, v0 + Vl) of
     * which Vv are real; one process: the whole model's */
    int NHl, Ql, KVl, kv0, Fl, Dl, Sl, v0, Vl, Vv; /* (Dl: a dense layer's MLP's hidden units among mixtures; Sl: a shared expert's) */
    int nr, ra[DT_GPT2_MAX_CHUNKS], rb[DT_GPT2_MAX_CHUNKS], ua, ub;
    int nl, *bk;               /* blocks held, and per block of the model its index among them (-1: not held) */
    int cur;                   /* the range forward last ran or use_chunk chose */
    dt_status comm_err;        /* the first failed collective of this pass (the pass runs on; the caller is told) */
    double tp_seconds;
    dt_tensor_info *tab;
    const dt_tensor_spec **spec; /* each table entry's */
    uint64_t *draw;            /* each table entry's first value in a seed's stream (dt_program_init_random) */
    int ntab;
    int *block_tab;            /* per held block (by bk) and spec entry: the tensor's index in the table (-1: not in that layer) */
    bool *moe_layer;           /* per layer of the model: a mixture (dt_lm_layer_moe) */
    int i_wte, i_wpe, i_lnf, i_head; /* table indices (-1: not held) */
    size_t nparams, global_params; /* this rank's, the whole model's */
    float *params, *grads, *own_params, *own_grads;
    dt_hook_list grad_hooks, unit_hooks;
    bool hold_hooks;           /* backward announces no unit: dt_program_announce_grads does, later */
    dt_linear_observer observer; /* shown each Linear's input and output gradient (NULL: none) */
    void *observer_ctx;
    bool recomputing;          /* backward is running a block's forward again (the observer is not shown it) */
    bool recompute;            /* keep each block's input only; redo its forward in backward */
    bool split_bwd;            /* backward in two passes: B (input gradients) and W (the Linears' weight gradients) */
    bool defer_rows;           /* backward leaves the token table's rows out (data parallelism adds them) */
    dt_attn_mode attn;
    /* Mixed precision (dt_program_set_precision): prec DT_BF16 or DT_F16 as torch.autocast does it; the parameters'
     * 16-bit copy (params_lp, each unit's cast as it runs), the 16-bit matmuls' scratch; with unit hooks (ZeRO-3)
     * the copy exists only while a unit runs (lp_cast: which tensors are cast now, lp_held of them, lp_held_max at
     * most); without, the whole copy is kept and, once told of writes (lp_told), a tensor is cast again only if
     * written since (lp_current[i] 0); lp_external: the caller keeps the copy (a sharded f32 master). */
    dt_dtype prec;
    uint16_t *params_lp;
    float *lp_work;
    float *moe_wide;           /* 16 bits with experts: one layer's mixture-of-experts weights widened from params_lp */
    size_t lp_work_floats, lp_held, lp_held_max;
    uint8_t *lp_cast, *lp_current;
    int lp_told, lp_external;
    bool *vkeep;               /* the values a block's backward reads (kept in 16 bits between its forward and backward) */
    bool *vused;               /* [moe * nvalues + v]: a dense layer's ops (moe 0) or a mixture's (1) read or write v */
    bool repack;               /* attention makes its own q|k|v of all heads (rotary positions, or fewer K/V heads) */
    dt_program_op *ops;
    int *vw;                   /* each value's width */
    bool *vsplit;              /* each value's rows: the residual stream's (split under sequence parallelism) or all */
    bool *vcopy;               /* each value's gradient is first written (in backward's order) by an add, which copies it:
                                * no zeroing first, no pass adding to zeros (the residual stream's and a branch's) */
    int *vborn, *vbuf;         /* a block value's gradient: the op whose backward writes it first (zeroed just before,
                                * unless copied; [moe * nvalues + v]: in a dense layer, in a mixture), and the buffer it
                                * shares with values whose gradients live apart (whichever layers) */
    int nvbuf;
    float *inv_freq;           /* rotary: head_dim / 2 frequencies */
    int *kv_of;                /* this rank's query head h reads its K/V head kv_of[h] (dt_program_kv_head) */
    program_slot *slots, *s;   /* the slots, and the current one */
    float *kv_keep, *kv_sum;   /* K/V heads kept by several ranks: their gradients set aside, and summed (program_run.c) */
    int nslots;
    program_area *areas;       /* the ranges' areas (several ranges only), grown to the most a range has in flight */
    int nareas;
    program_lora *lora;        /* LoRA's adapters (NULL: none); the base weights are then frozen */
    double loss_tokens;        /* dt_program_set_loss_tokens (0: each micro-batch's own count of scored tokens) */
    dt_token_loss_fn token_loss; /* dt_program_set_token_loss (NULL: the mean cross-entropy) */
    void *token_loss_ctx;
    bool token_stats;            /* the token loss asked for the rows' entropies and log sum p^2 */
    float logit_inv_temp;        /* dt_program_set_logit_temperature's 1 / t (0: none) */
    bool lora_off;             /* dt_program_set_lora_enabled(p, false): forward as the base alone */
    const int32_t *pos_src;    /* dt_program_set_positions: read by each micro-batch's forward (NULL: 0..T-1) */
    const uint64_t *key_src;   /* dt_program_set_row_keys: read likewise (NULL: no dropout, as in evaluation) */
    double *moe_load;          /* a mixture of experts: each held block's choices of each expert since last read */
    float *moe_bias;           /* DeepSeek-V3's router: every layer's bias [L][E] (held or not: each rank keeps all, alike) */
    double moe_drops[2];       /* a capacity's dropped choices and all choices since last read */
    double moe_terms[DT_MOE_TERMS + 1]; /* the balancing losses' values summed over the micro-batches whose loss this rank
                                         * made since last read (dt_program_moe_terms), and how many */
    struct moe_ep_work *ep_work; /* expert parallelism's exchange buffers, grown to the largest step (program_moe_ep.c) */
    double ep_bytes;           /* the rows' bytes this rank sent to other ranks of its expert-parallel group since last read */
    float z_coef;              /* the router z-loss's coefficient (dt_program_set_z_loss; 0: none) */
    float seq_coef;            /* the sequence-wise balancing loss's (dt_program_set_seq_aux_loss; 0: none) */
    float glob_coef;           /* the global-batch balancing loss's (dt_program_set_global_aux_loss; 0: none) */
    double *glob_run;          /* its counts and rows by layer [L][E + 1], summed over the step's micro-batches so far */
    dt_program_device device;  /* forward and backward on a device (dt_program_set_device; forward NULL: the host) */
};

/* Which values a block's backward reads (p->vkeep), from the ops and LoRA's adapters (program.c); whether op k's
 * Linear has an adapter (program_lora.c). */
void dt_program_mark_kept(dt_program *p);
bool dt_program_lora_adapts(const dt_program *p, int k);

/* The mixture-of-experts op (program_moe.c): a block's kept floats (its stats), the slot's scratch floats and ints
 * for B*T rows; forward and backward (dx added to). */
size_t dt_program_moe_kept(const dt_program *p, size_t BT);
size_t dt_program_moe_work(const dt_program *p, size_t BT);
/* 16 bits with experts (moe_wide): one layer's mixture-of-experts weights (this rank's) widened, then an expert's
 * F x C to round a weight gradient in (dt_program_moe_use; NULL in f32): its floats (0: no experts). */
size_t dt_program_moe_layer_floats(const dt_program *p);
size_t dt_program_moe_weight_floats(const dt_program *p);
float *dt_program_moe_use(const dt_program *p);
size_t dt_program_moe_ints(const dt_program *p, size_t BT);
void dt_program_moe_forward(dt_program *p, int l, int k, const float *x, float *out);
void dt_program_moe_backward(dt_program *p, int l, int k, const float *x, const float *dout, float *dx);

/* A block's routed rows with expert parallelism (program_moe_ep.c), rows sorted by expert (start: each expert's first of
 * the model's E): forward sends them with their weights w (each pair's, by order) to the ranks holding their experts,
 * which run them, and puts each row's output back in ys; backward sends dys (each row's d(output), unweighted) the
 * same way and puts back d(input) in dys and each pair's d(weight) in dw. Collective over the expert-parallel group.
 * wg, wu, wd: this rank's experts; grads: theirs. */
typedef struct {
    int l, E, C, F, rows;
    const int32_t *start, *order;
    const float *wg, *wu, *wd;
    float *grads[3];
} moe_ep_block;
void dt_program_moe_ep_forward(dt_program *p, const moe_ep_block *b, const float *xs, const float *w, float *ys);
void dt_program_moe_ep_backward(dt_program *p, const moe_ep_block *b, float *dys, float *dw);
void dt_program_moe_ep_free_keep(program_slot *s);
/* The balancing losses (program_moe_balance.c). A micro-batch of B sequences begins: its balance from nothing (room
 * made for its sequences' statistics); held layer l's probabilities [BT, E] counted for the sequence-wise and
 * global-batch losses; the rows a rank's balancing gradients divide by (the micro-batch's, every part's rows of every
 * layer, over the context-parallel ranks whose gradients are averaged); layer l's d(loss)/d(probabilities) by
 * sequence [B][E] from the Switch, sequence-wise and global-batch losses (rows: the layer's on this rank), scaled
 * with the loss's gradient (NULL: none). */
dt_status dt_program_moe_begin(dt_program *p, int B);
void dt_program_moe_count(dt_program *p, int l, const float *probs, int BT);
double dt_program_moe_grad_rows(const dt_program *p);
const float *dt_program_moe_daux(dt_program *p, int l, int rows);
/* The micro-batch's balance as its losses take it (slot's moe_sum): this rank's, its sum over part.sums started. */
dt_status dt_program_moe_sums_post(dt_program *p);
/* Those sums ended (nothing under way: nothing to wait for); land: and the global counts taken into the step's. */
dt_status dt_program_moe_sums_wait(program_slot *s);
dt_status dt_program_moe_sums_land(dt_program *p);
void dt_program_moe_ep_free_work(dt_program *p);
size_t dt_program_moe_ep_bytes(const dt_program *p);

/* A held block's values, stats and spec entry i's tensor (the layer holds it). */
static inline float *value(const dt_program *p, int l, int v) { return p->s->val[p->bk[l] * p->f->nvalues + v]; }
static inline float *op_stats(const dt_program *p, int l, int k) { return p->s->stats[p->bk[l] * p->f->nops + k]; }
static inline int tensor_at(const dt_program *p, int l, int i) { return p->block_tab[p->bk[l] * p->f->nblock + i]; }
/* Whether op k runs in layer l. */
static inline bool op_runs(const dt_program *p, int l, int k) { return dt_layers_hold(p->f->ops[k].layers, p->moe_layer[l]); }
/* Whether the program's family has an op of this kind. */
bool dt_program_has_op(const dt_program *p, dt_op_kind kind);

/* Mixed precision (program_lp.c): whether blocks are kept packed in 16 bits; the 16-bit copy of what unit u reads,
 * cast as it starts (forward or backward), and given back after (with unit hooks); block l's kept values packed
 * after its forward, or widened again before its backward (its input into res1); a block's packed floats. */
bool dt_program_packs(const dt_program *p);
void dt_program_lp_cast(dt_program *p, int u, bool backward);
void dt_program_lp_drop(dt_program *p);
void dt_program_pack_block(dt_program *p, int l, bool pack);
size_t dt_program_lp_block(const dt_program *p, size_t BT, bool moe); /* (a dense layer's, or a mixture's) */
size_t dt_program_lp_work_floats(const dt_program *p);
/* The bytes a slot of B x T takes (activations, their 16-bit pack, the tokens); of them, *kept (NULL: not asked) the
 * bytes kept from forward for backward. */
size_t dt_program_slot_bytes(const dt_program *p, int B, int T, size_t *kept);
/* The same with each range's kept pieces apart (several ranges): the slot's own bytes, each range's area's in area[r]. */
size_t dt_program_slot_split_bytes(const dt_program *p, int B, int T, size_t *area);
/* Every slot freed and the ranges' areas with them (the activations' layout changed, or the program ends). */
void dt_program_free_slots(dt_program *p);

/* LoRA (program_lora.c) inside a Linear, op k of block l: its forward adds each adapted part's (x A^T) B^T scaled
 * into y (the op's output, all rows); its backward, from dy, adds to the adapters' gradients and to dx (the input's). */
void dt_program_lora_forward(dt_program *p, int l, int k, const float *x, float *y);
void dt_program_lora_backward(dt_program *p, int l, int k, const float *x, const float *dy, float *dx);
void dt_program_lora_free(program_lora *a);
void dt_program_lora_model(dt_program *p, dt_model *out);

/* The batch's memory (program_run.c): a slot's freed. */
void dt_program_free_slot(program_slot *s);
/* The held range of unit u (-1: not held). */
int dt_program_range_of(const dt_program *p, int u);

/* Tensor parallelism's mappings (program_tp.c), as the ops call them; on one rank each is the plain kernel or
 * nothing. The group's sum in place; the token embedding (a vocabulary slice each: the sum of lookups, then the
 * learned positions where the family has them); the cross-entropy over vocabulary columns (max, then the sums of
 * exponentials and the target's logit) and its backward. The embedding's backward leaves the token table's rows
 * out with skip_rows (deferred: data parallelism adds them). */
void dt_program_tp_sum(dt_program *p, float *x, size_t n);
/* Sequence parallelism (Korthikanti et al. 2022) on the tensor-parallel group: the residual stream, the norms and
 * their outputs hold this rank's B*T/tp rows (rows r*B*T/tp ..). Rows a value holds (v: a block's value; -1: the
 * stream's); a local tensor of n floats gathered to all rows (itself without SP); partial sums of all rows made
 * whole: summed in place (the same pointer back) or reduce-scattered into mine (this rank's rows); a norm's
 * backward whose weight gradient, from this rank's rows, is summed over the group. */
size_t dt_program_rows(const dt_program *p, int v);
const float *dt_program_tp_gather(dt_program *p, const float *local, size_t n);
const float *dt_program_tp_gather_to(dt_program *p, const float *local, float *all, size_t n); /* into all, not the slot's gather */
const float *dt_program_tp_combine(dt_program *p, float *partial, float *mine, size_t n);
void dt_program_norm_backward(dt_program *p, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                              const float *stats, int C);
void dt_program_tp_embedding_forward(dt_program *p, float *out, const int32_t *tokens);
void dt_program_tp_embedding_backward(dt_program *p, const float *dout, bool skip_rows);
double dt_program_tp_crossentropy_forward(dt_program *p, const int32_t *targets); /* the sum of the rows' losses */
void dt_program_tp_token_stats(dt_program *p, const int32_t *targets); /* after it: s->tok_stats */
void dt_program_tp_crossentropy_backward(dt_program *p, float dscale);

#endif
