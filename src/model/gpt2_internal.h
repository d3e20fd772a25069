/* GPT-2's insides, shared by gpt2.c (shape, tensor table, creation) and
 * gpt2_run.c (activations, forward and backward over ranges of units). */
#ifndef DTRAIN_GPT2_INTERNAL_H
#define DTRAIN_GPT2_INTERNAL_H

#include "dtrain/model.h"

#include <stdbool.h>

/* llm.c's 16 tensors, in its order. */
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
#define PER_BLOCK 12 /* ln1w .. fcprojb */

/* Activations kept from forward for backward, per held block where it says L.
 * A_RES1: a block's input widened for its backward (packed mixed precision only).
 * A_CE_STATS: each position's logit maximum and sum of exponentials, for the loss's backward. */
enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_ATT, A_RES2, A_LN2, A_LN2_MEAN, A_LN2_RSTD,
    A_FCH, A_FCH_GELU, A_RES3, A_RES1, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_CE_STATS,
    /* scratch, not per layer */
    A_TMP, A_DRES, A_DLN, A_DQKV, A_DATTY, A_DFCH, A_DFCH_GELU,
    /* sequence parallelism's: a gathered [B*T, C], a reduce-scattered [B*T/tp, C], a LayerNorm's gradient */
    A_GATHER, A_RS, A_LNGRAD,
    /* a split backward's (dt_gpt2_set_split_backward): per block, the Linears' output gradients that B leaves for W */
    A_WGRAD, A_COUNT
};

/* What a forward leaves for its range's backward (per range held). */
typedef struct { int run_a, run_b; bool have_targets, w_pending; } gpt2_run_state;

/* One micro-batch in flight (a pipeline's activation slot, gpt2_slots.c):
 * the activations and what a forward leaves for its backward. The model
 * works in one slot at a time; its fields below are that slot's. */
typedef struct {
    float *acts;
    size_t act_sizes[A_COUNT], act_off[A_COUNT], nacts;
    gpt2_run_state rs[DT_GPT2_MAX_CHUNKS];
    int cur;
    int B, T, run_a, run_b;
    size_t bt_capacity, att_capacity;
    int32_t *inputs, *targets;
    bool have_targets, blockwise, w_pending;
    float loss, w_dscale;
    uint16_t *acts_lp;
    size_t lp_layer, lp_capacity;
} gpt2_slot;

/* Units: 0 the embeddings (wte, wpe), 1..L the blocks 0..L-1, L+1 the final
 * LayerNorm and the LM head. A model holds units [ua, ub); one that holds the
 * head but not the embeddings keeps its own copy of the tied wte there. */
struct dt_gpt2 {
    dt_gpt2_config cfg;
    dt_gpt2_part part;        /* what this rank builds (gpt2_tp.c runs its collectives) */
    /* this rank's widths: attention's C/tp channels in NH/tp heads, the MLP's 4C/tp hidden units,
     * vocabulary rows [v0, v0 + Vl) of which Vv are real (below V); the whole model: C, NH, 4C, 0, Vp, V */
    int Cl, NHl, Fl, v0, Vl, Vv;
    dt_status comm_err;       /* the first failed collective (TP, SP or CP) of this pass (the pass runs on, the caller is told) */
    double tp_seconds;        /* spent in tensor parallelism's collectives (dt_gpt2_tp_comm_seconds) */
    int ua, ub;               /* units held: from the first range's start to the last one's end */
    int nr, ra[DT_GPT2_MAX_CHUNKS], rb[DT_GPT2_MAX_CHUNKS]; /* the ranges held: [ra[r], rb[r]) */
    int l0, nl;               /* blocks held: nl of them, the first l0 */
    int *bk;                  /* per block of the model: its index among those held, -1 if not held */
    gpt2_run_state rs[DT_GPT2_MAX_CHUNKS]; /* each range's (the current one's in run_a .. w_pending) */
    int cur;                  /* the current range */
    int i_wte, i_wpe, i_lnf, i_blk; /* table indices of wte, wpe, lnfw, block l0's ln1w (-1: not held) */
    dt_tensor_info *tab;      /* the held tensors, in store order */
    int ntab;
    size_t nparams;
    float *params, *grads, *own_grads, *own_params;
    dt_hook_list grad_hooks;  /* after each unit's backward */
    dt_hook_list unit_hooks;  /* before each unit's forward (first) and backward (second) */
    int defer_wte_rows;
    float *acts;
    size_t act_sizes[A_COUNT], act_off[A_COUNT], nacts;
    int B, T;                 /* of the last forward */
    int run_a, run_b;         /* its units */
    size_t bt_capacity;       /* B*T the activations are sized for */
    int32_t *inputs, *targets;
    int32_t *pos;             /* context parallelism: each row's position in the sequence (max_seq_len of them) */
    bool have_targets;
    bool split_bwd;           /* backward in two passes: B (input gradients) and W (weight gradients) */
    bool hold_hooks;          /* backward announces no unit: dt_gpt2_announce_grads does, later */
    bool w_pending;           /* this slot's B has run, its W not yet */
    float w_dscale;           /* and the loss gradient's scale it used (W recomputes the head's 16-bit one) */
    bool recompute;           /* keep one layer of activations; redo each layer's forward in backward */
    dt_attn_mode attn;
    bool blockwise;           /* of the last forward */
    size_t att_capacity;      /* floats in A_ATT */
    float loss;
    /* Mixed precision (dt_gpt2_set_precision): prec DT_BF16 or DT_F16; the
     * parameters' 16-bit copy (each unit's refreshed at its forward), the
     * 16-bit matmuls' scratch, and, unless recomputing, every block's
     * activations packed in 16 bits (lp_layer values a block: its input and
     * res2 rounded too, for the LayerNorms' backward) while only one block's
     * are kept in f32 to compute with and the residual stream alternates
     * between two f32 slots. */
    dt_dtype prec;
    uint16_t *params_lp, *acts_lp;
    gpt2_slot *slots;     /* dt_gpt2_set_slots's (NULL: one, in the fields above); slots[slot] is stale while in use */
    int nslots, slot;
    /* with unit hooks the 16-bit copy exists only while a unit runs: which
     * tensors are cast now (lp_cast), their values, and the most at once */
    uint8_t *lp_cast;
    size_t lp_held, lp_held_max;
    /* without them, the whole copy is kept: once told of writes (dt_gpt2_params_changed, lp_told), a tensor is cast
     * again only if written since its last cast (lp_current[i] 0) */
    uint8_t *lp_current;
    int lp_told;
    int lp_external;      /* the caller keeps params_lp current (a sharded f32 master): no cast here */
    float *lp_work;
    size_t lp_work_floats, lp_layer, lp_capacity;
};

/* Where tensor i (llm.c's index) of block l starts in the store; and a tensor outside the blocks (the embeddings,
 * the final LayerNorm). */
static inline size_t block_off(const struct dt_gpt2 *m, int l, int i) { return m->tab[m->i_blk + m->bk[l] * PER_BLOCK + i - LN1W].offset; }
static inline size_t top_off(const struct dt_gpt2 *m, int i) {
    return m->tab[i == WTE ? m->i_wte : i == WPE ? m->i_wpe : m->i_lnf + i - LNFW].offset;
}
/* Block l's tensor i among the parameters and the gradients; the same outside the blocks; activation i. */
static inline float *layer_param(const struct dt_gpt2 *m, int l, int i) { return m->params + block_off(m, l, i); }
static inline float *layer_grad(const struct dt_gpt2 *m, int l, int i) { return m->grads + block_off(m, l, i); }
static inline float *top_param(const struct dt_gpt2 *m, int i) { return m->params + top_off(m, i); }
static inline float *top_grad(const struct dt_gpt2 *m, int i) { return m->grads + top_off(m, i); }
static inline float *act(const struct dt_gpt2 *m, int i) { return m->acts + m->act_off[i]; }
/* Tensor parallelism's conjugate operators on the residual stream (gpt2_tp.c):
 * the sum of the group's partial results in place (a row-parallel Linear's
 * output in forward, a column-parallel Linear's input gradient in backward),
 * and the vocabulary-parallel embedding and cross-entropy. No-ops on one rank. */
void dt_gpt2_tp_sum(dt_gpt2 *m, float *x, size_t n);
/* Sequence parallelism (dt_gpt2_part.sp): the residual stream, the
 * LayerNorms and their outputs hold this rank's B*T/tp rows (contiguous:
 * rows r*B*T/tp ..). Rows this rank holds; a local tensor of n floats
 * gathered to all rows (or itself without SP); a row-parallel output's
 * partial sums [all rows] summed (all rows, in place) or reduce-scattered
 * (this rank's rows); a LayerNorm's backward whose weight gradient, over
 * this rank's rows only, is summed over the group (Megatron's finalize for
 * SP), added to dw, db. */
size_t dt_gpt2_tp_rows(const dt_gpt2 *m);
const float *dt_gpt2_tp_gather(dt_gpt2 *m, const float *local, size_t n);
const float *dt_gpt2_tp_combine(dt_gpt2 *m, float *partial, size_t n);
/* dt_gpt2_tp_combine of a Linear's partial outputs (or input gradients),
 * which mixed precision rounds to 16 bits once they are whole, as one
 * process rounds the Linear's (the kernels leave a partial sum in f32). */
const float *dt_gpt2_tp_combine_linear(dt_gpt2 *m, float *partial, size_t n);
void dt_gpt2_tp_layernorm_backward(dt_gpt2 *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                   const float *w, const float *mean, const float *rstd, int C);
void dt_gpt2_tp_embedding_forward(dt_gpt2 *m, float *out, const int32_t *tokens, int B, int T);
void dt_gpt2_tp_embedding_backward(dt_gpt2 *m, float *dwte, float *dwpe, const float *dout, int B, int T);
/* logits: f32, or 16-bit under mixed precision (uint16_t) */
float dt_gpt2_tp_crossentropy_forward(dt_gpt2 *m, float *losses, float *stats, const void *logits, const int32_t *targets, int BT);
void dt_gpt2_tp_crossentropy_backward(dt_gpt2 *m, float *dlogits, const float *stats, const int32_t *targets, int BT, float dscale);
/* The other slots' memory (gpt2_slots.c): freed (destroy), dropped to be
 * sized again (their layout changed), and counted. */
void dt_gpt2_free_slots(dt_gpt2 *m);
void dt_gpt2_drop_slots(dt_gpt2 *m);
size_t dt_gpt2_slots_bytes(const dt_gpt2 *m);


#endif
