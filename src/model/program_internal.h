/* The model program's spec: what a family file declares and program.c interprets. */
#ifndef DTRAIN_PROGRAM_INTERNAL_H
#define DTRAIN_PROGRAM_INTERNAL_H

#include "dtrain/program.h"

/* Widths a spec names, resolved from the config (program.c, width_of). */
typedef enum { W_NONE, W_C, W_Q, W_KV, W_QKV, W_FFN, W_FFN2, W_VOCAB, W_POS } dt_width;

/* One tensor: our name and Hugging Face's ("%d": the layer), its rows and columns (W_NONE: a vector), how
 * tensor parallelism splits it, and what mixed precision reads in f32 (dt_tensor_info's f32_read). hf_t: HF
 * stores it transposed (GPT-2's Conv1D); how a seed initialises it. */
typedef struct {
    const char *name, *hf;
    dt_width rows, cols;
    dt_tp_split split;
    int f32_read, hf_t;
    enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init; /* a weight, a norm's scale, a bias */
} dt_tensor_spec;

typedef enum { OP_NORM, OP_LINEAR, OP_ATTENTION, OP_GELU, OP_SWIGLU, OP_ADD } dt_op_kind;

/* The values a block's ops pass: V_IN (the residual stream entering), V_OUT (leaving), then the block's own. */
enum { V_IN = 0, V_OUT = 1 };

/* One op of a block: it reads in (and in2, the add's other input) and writes out. Its weights are the block's
 * tensors [w, w + nw): a Linear's parts side by side in the store (Llama's q, k and v; GPT-2's fused c_attn is one
 * part), its output their rows in that order; bias: the tensors [b, b + nw), or -1. */
typedef struct {
    dt_op_kind kind;
    int in, in2, out;
    int w, nw, b;
} dt_op_spec;

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
    const dt_width *values;            /* each value's width (V_IN and V_OUT: W_C) */
    int nvalues;
};

extern const dt_family dt_family_gpt2, dt_family_llama, dt_family_qwen2;

#endif
