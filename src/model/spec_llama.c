/* Llama as a spec (and Qwen 2, which adds biases to q, k and v; Mixtral, whose MLP is a mixture of experts):
 * RMSNorm before attention and before the MLP, q, k and v as three Linears side by side (K/V heads may be fewer than
 * the heads), rotary positions, a SwiGLU MLP (gate and up side by side, then down), no other biases; the head tied
 * or its own (lm_head). Names as Hugging Face's LlamaForCausalLM (MixtralForCausalLM's files: an expert's w1, w3
 * and w2 are gate, up and down). */
#include "program_internal.h"

static const dt_tensor_spec embed[] = {
    { "wte", "model.embed_tokens.weight", W_VOCAB, W_C, DT_SPLIT_VOCAB, 1, 0, INIT_NORMAL, "token_embd.weight", W_NONE },
};

enum { LN1W, QW, KW, VW, OW, LN2W, GATEW, UPW, DOWNW, QB, KB, VB };
/* attention and the norms around it: every family here */
#define LLAMA_ATTENTION                                                                                          \
    [LN1W] = { "ln1w", "model.layers.%d.input_layernorm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.attn_norm.weight", W_NONE },         \
    [QW] = { "qw", "model.layers.%d.self_attn.q_proj.weight", W_Q, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_q.weight", W_NONE },             \
    [KW] = { "kw", "model.layers.%d.self_attn.k_proj.weight", W_KV, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_k.weight", W_NONE },            \
    [VW] = { "vw", "model.layers.%d.self_attn.v_proj.weight", W_KV, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_v.weight", W_NONE },            \
    [OW] = { "ow", "model.layers.%d.self_attn.o_proj.weight", W_C, W_Q, DT_SPLIT_ROW, 0, 0, INIT_NORMAL, "blk.%d.attn_output.weight", W_NONE },                \
    [LN2W] = { "ln2w", "model.layers.%d.post_attention_layernorm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.ffn_norm.weight", W_NONE }
#define LLAMA_BLOCK                                                                                          \
    LLAMA_ATTENTION,                                                                                         \
    [GATEW] = { "gatew", "model.layers.%d.mlp.gate_proj.weight", W_FFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.ffn_gate.weight", W_NONE },        \
    [UPW] = { "upw", "model.layers.%d.mlp.up_proj.weight", W_FFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.ffn_up.weight", W_NONE },              \
    [DOWNW] = { "downw", "model.layers.%d.mlp.down_proj.weight", W_C, W_FFN, DT_SPLIT_ROW, 0, 0, INIT_NORMAL, "blk.%d.ffn_down.weight", W_NONE }

static const dt_tensor_spec block[] = { LLAMA_BLOCK };
static const dt_tensor_spec block_qkv_bias[] = {
    LLAMA_BLOCK,
    [QB] = { "qb", "model.layers.%d.self_attn.q_proj.bias", W_Q, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_q.bias", W_NONE },
    [KB] = { "kb", "model.layers.%d.self_attn.k_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_k.bias", W_NONE },
    [VB] = { "vb", "model.layers.%d.self_attn.v_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_v.bias", W_NONE },
};

static const dt_tensor_spec final[] = {
    { "lnfw", "model.norm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "output_norm.weight", W_NONE },
    { "lm_head", "lm_head.weight", W_VOCAB, W_C, DT_SPLIT_VOCAB, 0, 0, INIT_NORMAL, "output.weight", W_NONE },
};

enum { LN1 = 2, QKV, ATTY, ATTPROJ, RES2, LN2, GATEUP, ACT, DOWN, NVALUES };
static const dt_width values[NVALUES] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_FFN2, W_FFN, W_C };

#define LLAMA_ATTENTION_OPS(qkv_bias)                         \
    { DT_OP_NORM, DT_V_IN, -1, LN1, LN1W, 1, -1 },                  \
    { DT_OP_LINEAR, LN1, -1, QKV, QW, 3, qkv_bias },             \
    { DT_OP_ATTENTION, QKV, -1, ATTY, -1, 0, -1 },               \
    { DT_OP_LINEAR, ATTY, -1, ATTPROJ, OW, 1, -1 },              \
    { DT_OP_ADD, DT_V_IN, ATTPROJ, RES2, -1, 0, -1 },               \
    { DT_OP_NORM, RES2, -1, LN2, LN2W, 1, -1 }
#define LLAMA_OPS(qkv_bias)                                   \
    LLAMA_ATTENTION_OPS(qkv_bias),                               \
    { DT_OP_LINEAR, LN2, -1, GATEUP, GATEW, 2, -1 },             \
    { DT_OP_SWIGLU, GATEUP, -1, ACT, -1, 0, -1 },                \
    { DT_OP_LINEAR, ACT, -1, DOWN, DOWNW, 1, -1 },               \
    { DT_OP_ADD, RES2, DOWN, DT_V_OUT, -1, 0, -1 }

static const dt_op_spec ops[] = { LLAMA_OPS(-1) };
static const dt_op_spec ops_qkv_bias[] = { LLAMA_OPS(QB) };

const dt_family dt_family_llama = {
    .name = "llama", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block, .nblock = DOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops, .nops = sizeof ops / sizeof *ops, .values = values, .nvalues = NVALUES, .gguf_arch = "llama", .gguf_pairs = 1,
    .hf_arch = "LlamaForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

const dt_family dt_family_qwen2 = {
    .name = "qwen2", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_qkv_bias, .nblock = VB + 1, .final = final, .nfinal = 2,
    .ops = ops_qkv_bias, .nops = sizeof ops_qkv_bias / sizeof *ops_qkv_bias, .values = values, .nvalues = NVALUES, .gguf_arch = "qwen2",
    .hf_arch = "Qwen2ForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

/* Mixtral: Llama's attention, then a router and E SwiGLU experts in place of the MLP */
enum { ROUTERW = LN2W + 1, EGATEW, EUPW, EDOWNW };
static const dt_tensor_spec block_moe[] = {
    LLAMA_ATTENTION,
    [ROUTERW] = { "routerw", "model.layers.%d.block_sparse_moe.gate.weight", W_EXPERTS, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [EGATEW] = { "egatew", "model.layers.%d.block_sparse_moe.experts.%%d.w1.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL,
                 W_EXPERTS },
    [EUPW] = { "eupw", "model.layers.%d.block_sparse_moe.experts.%%d.w3.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL,
               W_EXPERTS },
    [EDOWNW] = { "edownw", "model.layers.%d.block_sparse_moe.experts.%%d.w2.weight", W_C, W_FFN, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL,
                 W_EXPERTS },
};

enum { MOE = LN2 + 1, NVALUES_MOE };
static const dt_width values_moe[NVALUES_MOE] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_C };
static const dt_op_spec ops_moe[] = {
    LLAMA_ATTENTION_OPS(-1),
    { DT_OP_MOE, LN2, -1, MOE, ROUTERW, 4, -1 },
    { DT_OP_ADD, RES2, MOE, DT_V_OUT, -1, 0, -1 },
};

/* Qwen 2's MoE: Qwen 2's attention (q, k, v biases), a router and E SwiGLU experts, and beside them one shared SwiGLU
 * expert whose output a sigmoid gate of the token scales */
enum { QROUTERW = LN2W + 1, QEGATEW, QEUPW, QEDOWNW, QSGATEW, QSUPW, QSDOWNW, QSGATEV, QQB, QKB, QVB };
static const dt_tensor_spec block_qwen_moe[] = {
    LLAMA_ATTENTION,
    [QROUTERW] = { "routerw", "model.layers.%d.mlp.gate.weight", W_EXPERTS, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [QEGATEW] = { "egatew", "model.layers.%d.mlp.experts.%%d.gate_proj.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [QEUPW] = { "eupw", "model.layers.%d.mlp.experts.%%d.up_proj.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [QEDOWNW] = { "edownw", "model.layers.%d.mlp.experts.%%d.down_proj.weight", W_C, W_FFN, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [QSGATEW] = { "sgatew", "model.layers.%d.mlp.shared_expert.gate_proj.weight", W_SFFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [QSUPW] = { "supw", "model.layers.%d.mlp.shared_expert.up_proj.weight", W_SFFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [QSDOWNW] = { "sdownw", "model.layers.%d.mlp.shared_expert.down_proj.weight", W_C, W_SFFN, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [QSGATEV] = { "sgatev", "model.layers.%d.mlp.shared_expert_gate.weight", W_ONE, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [QQB] = { "qb", "model.layers.%d.self_attn.q_proj.bias", W_Q, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, NULL, W_NONE },
    [QKB] = { "kb", "model.layers.%d.self_attn.k_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, NULL, W_NONE },
    [QVB] = { "vb", "model.layers.%d.self_attn.v_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, NULL, W_NONE },
};
static const dt_op_spec ops_qwen_moe[] = {
    LLAMA_ATTENTION_OPS(QQB),
    { DT_OP_MOE, LN2, -1, MOE, QROUTERW, 8, -1 },
    { DT_OP_ADD, RES2, MOE, DT_V_OUT, -1, 0, -1 },
};

const dt_family dt_family_qwen2_moe = {
    .name = "qwen2_moe", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_qwen_moe, .nblock = QVB + 1, .final = final, .nfinal = 2,
    .ops = ops_qwen_moe, .nops = sizeof ops_qwen_moe / sizeof *ops_qwen_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .hf_arch = "Qwen2MoeForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

/* DeepSeek-V3's mixture with Llama's attention (its MLA is not built): a router and E SwiGLU experts, and beside them
 * shared SwiGLU experts (one of their width times their count) that every token goes through, ungated; the names are
 * transformers' DeepseekV3's (per expert as its hub files hold them); dtrain's own format (no HF folder: MLA) */
enum { DROUTERW = LN2W + 1, DEGATEW, DEUPW, DEDOWNW, DSGATEW, DSUPW, DSDOWNW };
static const dt_tensor_spec block_deepseek_moe[] = {
    LLAMA_ATTENTION,
    [DROUTERW] = { "routerw", "model.layers.%d.mlp.gate.weight", W_EXPERTS, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [DEGATEW] = { "egatew", "model.layers.%d.mlp.experts.%%d.gate_proj.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [DEUPW] = { "eupw", "model.layers.%d.mlp.experts.%%d.up_proj.weight", W_FFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [DEDOWNW] = { "edownw", "model.layers.%d.mlp.experts.%%d.down_proj.weight", W_C, W_FFN, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_EXPERTS },
    [DSGATEW] = { "sgatew", "model.layers.%d.mlp.shared_experts.gate_proj.weight", W_SFFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [DSUPW] = { "supw", "model.layers.%d.mlp.shared_experts.up_proj.weight", W_SFFN, W_C, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
    [DSDOWNW] = { "sdownw", "model.layers.%d.mlp.shared_experts.down_proj.weight", W_C, W_SFFN, DT_SPLIT_NONE, 0, 0, INIT_NORMAL, NULL, W_NONE },
};
static const dt_op_spec ops_deepseek_moe[] = {
    LLAMA_ATTENTION_OPS(-1),
    { DT_OP_MOE, LN2, -1, MOE, DROUTERW, 7, -1 },
    { DT_OP_ADD, RES2, MOE, DT_V_OUT, -1, 0, -1 },
};

const dt_family dt_family_deepseek_moe = {
    .name = "deepseek_moe", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_deepseek_moe, .nblock = DSDOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops_deepseek_moe, .nops = sizeof ops_deepseek_moe / sizeof *ops_deepseek_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .hf_none = "DeepSeek's mixture (ungated shared experts) has no Hugging Face folder with Llama's attention (transformers' "
               "DeepseekV3 is MLA)",
    .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

const dt_family dt_family_mixtral = {
    .name = "mixtral", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_moe, .nblock = EDOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops_moe, .nops = sizeof ops_moe / sizeof *ops_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .hf_arch = "MixtralForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};
