/* The decoder's state, shared by its making (decoder.c) and its step (decoder_step.c). */
#ifndef DTRAIN_DECODER_INTERNAL_H
#define DTRAIN_DECODER_INTERNAL_H

#include "dtrain/infer.h"
#include "dtrain/program.h"

#include <stdbool.h>

/* A Linear's weights [O, K], packed: f32, or int8 with a scale per output. */
typedef struct {
    dt_panels *p;
    int O, K;
} linear;

/* A mixture of experts' weights in one layer, and the rows' scratch a step routes them in (decoder_moe.c). */
typedef struct moe_weights moe_weights;
typedef struct moe_scratch moe_scratch;

/* One op's weights in one layer: a Linear's panels (its parts side by side) and bias; a norm's scale and bias; a
 * mixture of experts' router and experts. row: a row-parallel Linear, whose outputs this rank's partial sums are. */
typedef struct {
    linear lin;
    const float *w, *b;
    bool row;
    moe_weights *moe;
} op_weights;

struct dt_decoder {
    dt_lm_config cfg;
    dt_quant quant;
    /* the block's ops and values as the program runs them on this rank (copies: nothing of the model is kept) */
    dt_program_op *ops;
    int nops, nvalues, *vw;
    int rms, rotary;
    float *inv_freq;
    /* tensor parallelism (a part's): this rank's NHl query heads and NKVl K/V heads (kv_of[h]: the one query head h
     * reads), vocabulary rows [v0, v0 + Vv) of the real ones; the row-parallel sums over tp (NULL: one rank) */
    const dt_tp_ops *tp;
    int NHl, NKVl, hd, v0, Vv, *kv_of;
    op_weights *w;   /* [layer * nops + k] (a layer's ops: those it runs, dt_decoder_runs) */
    const float *wpe, *normw, *normb;
    linear head;     /* the real vocabulary rows this rank holds */
    linear embed;    /* an untied model's token table (tied: the head's rows are read) */
    float *small;    /* the copied norms, biases and position table */
    size_t small_used, small_cap;
    int nslots, max_rows;
    void *cache;     /* f32, or bf16 for int8 weights (kv16) */
    bool kv16;
    size_t slot_elems;
    int *filled;     /* per slot: positions the cache holds */
    float **val;     /* [v]: a block's values for max_rows rows, in bufs (values whose lives do not meet share one) */
    float **bufs;
    int nbufs;
    float *stats, *scores, *local_logits;
    int32_t *pos;    /* the step's rows' positions (rotary) */
    int leader;      /* over a part: this rank sends each step's rows to the others, who follow */
    size_t weight_bytes;
    moe_scratch *moe;  /* a mixture of experts' rows a step (NULL: none) */
    dt_gpt2 *owned;  /* the model, when the decoder took it (dt_decoder_create_taking): its f32 Linears are packed in it */
    dt_decoder_device dev; /* run set: the steps run there (dt_decoder_create_on), nothing of the model held here */
};
/* Whether layer l runs op k (a family with dense and mixture layers runs each kind's MLP in its own). */
static inline bool dt_decoder_runs(const dt_decoder *d, int l, int k) { return dt_layers_hold(d->ops[k].s.layers, dt_lm_layer_moe(&d->cfg, l)); }

/* Positions a slot has room for: max_seq_len rounded up to whole key blocks. */
size_t dt_decoder_padded_positions(const dt_decoder *d);
/* A cached key or value element's bytes. */
size_t dt_decoder_cache_elem(const dt_decoder *d);
/* One step over n checked rows (decoder_step.c). */
dt_status dt_decoder_run(dt_decoder *d, const dt_infer_row *rows, int n, float *logits);
/* A mixture of experts (decoder_moe.c): op k of layer l's weights packed from p's parameters (*out set, to be freed,
 * on a failure too); the scratch for max_rows rows, and its release; the op over n rows of x into out. */
dt_status dt_decoder_moe_load(dt_decoder *d, dt_program *p, const float *params, int l, int k, moe_weights **out);
void dt_decoder_moe_free(moe_weights *w);
dt_status dt_decoder_moe_alloc(dt_decoder *d);
void dt_decoder_moe_release(dt_decoder *d);
dt_status dt_decoder_moe_run(dt_decoder *d, const moe_weights *w, const float *x, float *out, int n);

#endif
