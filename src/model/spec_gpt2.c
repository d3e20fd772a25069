/* GPT-2 as a spec: pre-LayerNorm blocks, fused q/k/v, GELU MLP four times as wide, learned positions, every
 * Linear with a bias, the head tied to the token table. Names as llm.c's (ours) and Hugging Face's. */
#include "program_internal.h"

static const dt_tensor_spec embed[] = {
    { "wte", "wte.weight", W_VOCAB, W_C, DT_SPLIT_VOCAB, 1, 0, INIT_NORMAL, "token_embd.weight", W_NONE, DT_LAYERS_ALL },
    { "wpe", "wpe.weight", W_POS, W_C, DT_SPLIT_NONE, 1, 0, INIT_NORMAL, "position_embd.weight", W_NONE, DT_LAYERS_ALL },
};

enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB };
/* attention and the norms around it: GPT-2's, and gpt2_moe's */
#define GPT2_ATTENTION                                                                                                                   \
    [LN1W] = { "ln1w", "h.%d.ln_1.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.attn_norm.weight", W_NONE, DT_LAYERS_ALL },            \
    [LN1B] = { "ln1b", "h.%d.ln_1.bias", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ZEROS, "blk.%d.attn_norm.bias", W_NONE, DT_LAYERS_ALL },              \
    [QKVW] = { "qkvw", "h.%d.attn.c_attn.weight", W_QKV, W_C, DT_SPLIT_COLUMN, 0, 1, INIT_NORMAL, "blk.%d.attn_qkv.weight", W_NONE, DT_LAYERS_ALL },  \
    [QKVB] = { "qkvb", "h.%d.attn.c_attn.bias", W_QKV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_qkv.bias", W_NONE, DT_LAYERS_ALL },    \
    [ATTPROJW] = { "attprojw", "h.%d.attn.c_proj.weight", W_C, W_Q, DT_SPLIT_ROW, 0, 1, INIT_NORMAL, "blk.%d.attn_output.weight", W_NONE, DT_LAYERS_ALL }, \
    [ATTPROJB] = { "attprojb", "h.%d.attn.c_proj.bias", W_C, W_NONE, DT_SPLIT_NONE, 0, 0, INIT_ZEROS, "blk.%d.attn_output.bias", W_NONE, DT_LAYERS_ALL },  \
    [LN2W] = { "ln2w", "h.%d.ln_2.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.ffn_norm.weight", W_NONE, DT_LAYERS_ALL },             \
    [LN2B] = { "ln2b", "h.%d.ln_2.bias", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ZEROS, "blk.%d.ffn_norm.bias", W_NONE, DT_LAYERS_ALL }
static const dt_tensor_spec block[] = {
    GPT2_ATTENTION,
    [FCW] = { "fcw", "h.%d.mlp.c_fc.weight", W_FFN, W_C, DT_SPLIT_COLUMN, 0, 1, INIT_NORMAL, "blk.%d.ffn_up.weight", W_NONE, DT_LAYERS_ALL },
    [FCB] = { "fcb", "h.%d.mlp.c_fc.bias", W_FFN, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.ffn_up.bias", W_NONE, DT_LAYERS_ALL },
    [FCPROJW] = { "fcprojw", "h.%d.mlp.c_proj.weight", W_C, W_FFN, DT_SPLIT_ROW, 0, 1, INIT_NORMAL, "blk.%d.ffn_down.weight", W_NONE, DT_LAYERS_ALL },
    [FCPROJB] = { "fcprojb", "h.%d.mlp.c_proj.bias", W_C, W_NONE, DT_SPLIT_NONE, 0, 0, INIT_ZEROS, "blk.%d.ffn_down.bias", W_NONE, DT_LAYERS_ALL },
};

static const dt_tensor_spec final[] = {
    { "lnfw", "ln_f.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "output_norm.weight", W_NONE, DT_LAYERS_ALL },
    { "lnfb", "ln_f.bias", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ZEROS, "output_norm.bias", W_NONE, DT_LAYERS_ALL },
};

enum { LN1 = 2, QKV, ATTY, ATTPROJ, RES2, LN2, FCH, FCHG, FCPROJ, NVALUES };
static const dt_width values[NVALUES] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_FFN, W_FFN, W_C };

#define GPT2_ATTENTION_OPS                                      \
    { DT_OP_NORM, DT_V_IN, -1, LN1, LN1W, 1, LN1B, DT_LAYERS_ALL },                \
    { DT_OP_LINEAR, LN1, -1, QKV, QKVW, 1, QKVB, DT_LAYERS_ALL },                  \
    { DT_OP_ATTENTION, QKV, -1, ATTY, -1, 0, -1, DT_LAYERS_ALL },                  \
    { DT_OP_LINEAR, ATTY, -1, ATTPROJ, ATTPROJW, 1, ATTPROJB, DT_LAYERS_ALL },     \
    { DT_OP_ADD, DT_V_IN, ATTPROJ, RES2, -1, 0, -1, DT_LAYERS_ALL },               \
    { DT_OP_NORM, RES2, -1, LN2, LN2W, 1, LN2B, DT_LAYERS_ALL }
static const dt_op_spec ops[] = {
    GPT2_ATTENTION_OPS,
    { DT_OP_LINEAR, LN2, -1, FCH, FCW, 1, FCB, DT_LAYERS_ALL },
    { DT_OP_GELU, FCH, -1, FCHG, -1, 0, -1, DT_LAYERS_ALL },
    { DT_OP_LINEAR, FCHG, -1, FCPROJ, FCPROJW, 1, FCPROJB, DT_LAYERS_ALL },
    { DT_OP_ADD, RES2, FCPROJ, DT_V_OUT, -1, 0, -1, DT_LAYERS_ALL },
};

const dt_family dt_family_gpt2 = {
    .name = "gpt2", .rms = 0, .rotary = 0,
    .embed = embed, .nembed = 2, .block = block, .nblock = 12, .final = final, .nfinal = 2,
    .ops = ops, .nops = sizeof ops / sizeof *ops, .values = values, .nvalues = NVALUES, .gguf_arch = "gpt2",
    .hf_arch = "GPT2LMHeadModel", .hf_module_prefix = "transformer.", .lora_targets = "c_attn",
};

/* GPT-2 with a mixture of experts in place of its MLP (Megatron's GPT MoE, the Switch Transformer's FFN): a router and E
 * GELU experts, up [E, F, C] and down [E, C, F] without biases, the rest GPT-2's. dtrain's own format (no Hugging Face
 * architecture holds it, nor llama.cpp's: no GGUF architecture); the names follow GPT-2's */
enum { MFCW = LN2B + 1, MFCB, MFCPROJW, MFCPROJB, MROUTERW, MEUPW, MEDOWNW };
#define DENSE(i, name, hf, rows, cols, split, init, t) [i] = { name, hf, rows, cols, split, 0, t, init, NULL, W_NONE, DT_LAYERS_DENSE }
#define ROUTED DT_SPEC_ROUTED
static const dt_tensor_spec block_moe[] = {
    GPT2_ATTENTION,
    /* the layers without a mixture (--moe-every, --first-dense): GPT-2's MLP */
    DENSE(MFCW, "fcw", "h.%d.mlp.c_fc.weight", W_DFFN, W_C, DT_SPLIT_COLUMN, INIT_NORMAL, 1),
    DENSE(MFCB, "fcb", "h.%d.mlp.c_fc.bias", W_DFFN, W_NONE, DT_SPLIT_COLUMN, INIT_ZEROS, 0),
    DENSE(MFCPROJW, "fcprojw", "h.%d.mlp.c_proj.weight", W_C, W_DFFN, DT_SPLIT_ROW, INIT_NORMAL, 1),
    DENSE(MFCPROJB, "fcprojb", "h.%d.mlp.c_proj.bias", W_C, W_NONE, DT_SPLIT_NONE, INIT_ZEROS, 0),
    ROUTED(MROUTERW, "routerw", "h.%d.mlp.router.weight", W_EXPERTS, W_C, W_NONE, NULL),
    ROUTED(MEUPW, "eupw", "h.%d.mlp.experts.%%d.c_fc.weight", W_FFN, W_C, W_EXPERTS, NULL),
    ROUTED(MEDOWNW, "edownw", "h.%d.mlp.experts.%%d.c_proj.weight", W_C, W_FFN, W_EXPERTS, NULL),
};

/* the mixture's output and the dense MLP's (the add after reads either), then the dense MLP's own */
enum { MOE = LN2 + 1, DFCH, DFCHG, NVALUES_MOE };
static const dt_width values_moe[NVALUES_MOE] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_C, W_DFFN, W_DFFN };

static const dt_op_spec ops_moe[] = {
    GPT2_ATTENTION_OPS,
    { DT_OP_LINEAR, LN2, -1, DFCH, MFCW, 1, MFCB, DT_LAYERS_DENSE },
    { DT_OP_GELU, DFCH, -1, DFCHG, -1, 0, -1, DT_LAYERS_DENSE },
    { DT_OP_LINEAR, DFCHG, -1, MOE, MFCPROJW, 1, MFCPROJB, DT_LAYERS_DENSE },
    { DT_OP_MOE, LN2, -1, MOE, MROUTERW, 3, -1, DT_LAYERS_MOE },
    { DT_OP_ADD, RES2, MOE, DT_V_OUT, -1, 0, -1, DT_LAYERS_ALL },
};

const dt_family dt_family_gpt2_moe = {
    .name = "gpt2_moe", .rms = 0, .rotary = 0,
    .embed = embed, .nembed = 2, .block = block_moe, .nblock = MEDOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops_moe, .nops = sizeof ops_moe / sizeof *ops_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .hf_none = "GPT-2 with GELU experts (gpt2_moe) has no Hugging Face architecture",
    .hf_module_prefix = "transformer.", .lora_targets = "c_attn",
};
