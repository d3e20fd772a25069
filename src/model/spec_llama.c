/* Llama as a spec (and Qwen 2, which adds biases to q, k and v; Qwen 3, which norms each head's queries and keys;
 * Mixtral, whose MLP is a mixture of experts; Qwen 2's and Qwen 3's mixtures):
 * RMSNorm before attention and before the MLP, q, k and v as three Linears side by side (K/V heads may be fewer than
 * the heads), rotary positions, a SwiGLU MLP (gate and up side by side, then down), no other biases; the head tied
 * or its own (lm_head). Names as Hugging Face's LlamaForCausalLM (MixtralForCausalLM's files: an expert's w1, w3
 * and w2 are gate, up and down). */
#include "program_internal.h"

static const dt_tensor_spec embed[] = {
    { "wte", "model.embed_tokens.weight", W_VOCAB, W_C, DT_SPLIT_VOCAB, 1, 0, INIT_NORMAL, "token_embd.weight", W_NONE, DT_LAYERS_ALL },
};

enum { LN1W, QW, KW, VW, OW, LN2W, GATEW, UPW, DOWNW, QB, KB, VB };
/* attention and the norms around it: every family here */
#define LLAMA_ATTENTION                                                                                          \
    [LN1W] = { "ln1w", "model.layers.%d.input_layernorm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.attn_norm.weight", W_NONE, DT_LAYERS_ALL },         \
    [QW] = { "qw", "model.layers.%d.self_attn.q_proj.weight", W_Q, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_q.weight", W_NONE, DT_LAYERS_ALL },             \
    [KW] = { "kw", "model.layers.%d.self_attn.k_proj.weight", W_KV, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_k.weight", W_NONE, DT_LAYERS_ALL },            \
    [VW] = { "vw", "model.layers.%d.self_attn.v_proj.weight", W_KV, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.attn_v.weight", W_NONE, DT_LAYERS_ALL },            \
    [OW] = { "ow", "model.layers.%d.self_attn.o_proj.weight", W_C, W_Q, DT_SPLIT_ROW, 0, 0, INIT_NORMAL, "blk.%d.attn_output.weight", W_NONE, DT_LAYERS_ALL },                \
    [LN2W] = { "ln2w", "model.layers.%d.post_attention_layernorm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.ffn_norm.weight", W_NONE, DT_LAYERS_ALL }
#define LLAMA_BLOCK                                                                                          \
    LLAMA_ATTENTION,                                                                                         \
    [GATEW] = { "gatew", "model.layers.%d.mlp.gate_proj.weight", W_FFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.ffn_gate.weight", W_NONE, DT_LAYERS_ALL },        \
    [UPW] = { "upw", "model.layers.%d.mlp.up_proj.weight", W_FFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, "blk.%d.ffn_up.weight", W_NONE, DT_LAYERS_ALL },              \
    [DOWNW] = { "downw", "model.layers.%d.mlp.down_proj.weight", W_C, W_FFN, DT_SPLIT_ROW, 0, 0, INIT_NORMAL, "blk.%d.ffn_down.weight", W_NONE, DT_LAYERS_ALL }

static const dt_tensor_spec block[] = { LLAMA_BLOCK };
static const dt_tensor_spec block_qkv_bias[] = {
    LLAMA_BLOCK,
    [QB] = { "qb", "model.layers.%d.self_attn.q_proj.bias", W_Q, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_q.bias", W_NONE, DT_LAYERS_ALL },
    [KB] = { "kb", "model.layers.%d.self_attn.k_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_k.bias", W_NONE, DT_LAYERS_ALL },
    [VB] = { "vb", "model.layers.%d.self_attn.v_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_v.bias", W_NONE, DT_LAYERS_ALL },
};

static const dt_tensor_spec final[] = {
    { "lnfw", "model.norm.weight", W_C, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "output_norm.weight", W_NONE, DT_LAYERS_ALL },
    { "lm_head", "lm_head.weight", W_VOCAB, W_C, DT_SPLIT_VOCAB, 0, 0, INIT_NORMAL, "output.weight", W_NONE, DT_LAYERS_ALL },
};

enum { LN1 = 2, QKV, ATTY, ATTPROJ, RES2, LN2, GATEUP, ACT, DOWN, NVALUES };
static const dt_width values[NVALUES] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_FFN2, W_FFN, W_C };

/* the norm and q, k, v; attention from what they made (qkv: that value, or one made of it) to the MLP's norm; the MLP */
#define LLAMA_QKV_OPS(qkv_bias)                                                    \
    { DT_OP_NORM, DT_V_IN, -1, LN1, LN1W, 1, -1, DT_LAYERS_ALL },                  \
    { DT_OP_LINEAR, LN1, -1, QKV, QW, 3, qkv_bias, DT_LAYERS_ALL }
#define LLAMA_ATTENDING_OPS(qkv)                                                   \
    { DT_OP_ATTENTION, qkv, -1, ATTY, -1, 0, -1, DT_LAYERS_ALL },                  \
    { DT_OP_LINEAR, ATTY, -1, ATTPROJ, OW, 1, -1, DT_LAYERS_ALL },                 \
    { DT_OP_ADD, DT_V_IN, ATTPROJ, RES2, -1, 0, -1, DT_LAYERS_ALL },               \
    { DT_OP_NORM, RES2, -1, LN2, LN2W, 1, -1, DT_LAYERS_ALL }
#define LLAMA_MLP_OPS                                                              \
    { DT_OP_LINEAR, LN2, -1, GATEUP, GATEW, 2, -1, DT_LAYERS_ALL },                \
    { DT_OP_SWIGLU, GATEUP, -1, ACT, -1, 0, -1, DT_LAYERS_ALL },                   \
    { DT_OP_LINEAR, ACT, -1, DOWN, DOWNW, 1, -1, DT_LAYERS_ALL },                  \
    { DT_OP_ADD, RES2, DOWN, DT_V_OUT, -1, 0, -1, DT_LAYERS_ALL }
#define LLAMA_ATTENTION_OPS(qkv_bias) LLAMA_QKV_OPS(qkv_bias), LLAMA_ATTENDING_OPS(QKV)
#define LLAMA_OPS(qkv_bias) LLAMA_ATTENTION_OPS(qkv_bias), LLAMA_MLP_OPS

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

/* Qwen 3: Llama's block, and before attention each query head and each K/V head RMS-normed on its own, one weight of
 * head_dim for the queries' heads (q_norm) and one for the keys' (k_norm); its heads may be wider than the model
 * (head_dim given, not C / heads) */
#define QWEN3_HEAD_NORMS(q, k)                                                                                                                    \
    [q] = { "qnw", "model.layers.%d.self_attn.q_norm.weight", W_HD, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.attn_q_norm.weight", W_NONE, DT_LAYERS_ALL }, \
    [k] = { "knw", "model.layers.%d.self_attn.k_norm.weight", W_HD, W_NONE, DT_SPLIT_NONE, 2, 0, INIT_ONES, "blk.%d.attn_k_norm.weight", W_NONE, DT_LAYERS_ALL }
/* Qwen 3's attention ops: q, k and v, each head's q and k normed (weights from qnw: qnw and the next) into qkvn, attention
 * from it */
#define QWEN3_ATTENTION_OPS(qnw, qkvn)                                  \
    LLAMA_QKV_OPS(-1),                                                  \
    { DT_OP_HEADNORM, QKV, -1, qkvn, qnw, 2, -1, DT_LAYERS_ALL },       \
    LLAMA_ATTENDING_OPS(qkvn)
enum { QNW = DOWNW + 1, KNW };
static const dt_tensor_spec block_qwen3[] = {
    LLAMA_BLOCK,
    QWEN3_HEAD_NORMS(QNW, KNW),
};
/* its values: Llama's, then q|k|v with q and k normed */
enum { QKVN = NVALUES, NVALUES_QWEN3 };
static const dt_width values_qwen3[NVALUES_QWEN3] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_FFN2, W_FFN, W_C, W_QKV };
static const dt_op_spec ops_qwen3[] = {
    QWEN3_ATTENTION_OPS(QNW, QKVN),
    LLAMA_MLP_OPS,
};

const dt_family dt_family_qwen3 = {
    .name = "qwen3", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_qwen3, .nblock = KNW + 1, .final = final, .nfinal = 2,
    .ops = ops_qwen3, .nops = sizeof ops_qwen3 / sizeof *ops_qwen3, .values = values_qwen3, .nvalues = NVALUES_QWEN3, .gguf_arch = "qwen3",
    .hf_arch = "Qwen3ForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

/* The mixture families: Llama's attention, then in a mixture's layers a router and E SwiGLU experts in place of the
 * MLP, in the others (--moe-every, --first-dense) Llama's dense SwiGLU MLP (mlp.gate_proj, up_proj, down_proj, as
 * Qwen 2 MoE's mlp_only_layers and DeepSeek's first dense layers name theirs) */
#define DENSE_MLP(g, u, d)                                                                                                                 \
    [g] = { "gatew", "model.layers.%d.mlp.gate_proj.weight", W_DFFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, NULL, W_NONE, DT_LAYERS_DENSE }, \
    [u] = { "upw", "model.layers.%d.mlp.up_proj.weight", W_DFFN, W_C, DT_SPLIT_COLUMN, 0, 0, INIT_NORMAL, NULL, W_NONE, DT_LAYERS_DENSE },     \
    [d] = { "downw", "model.layers.%d.mlp.down_proj.weight", W_C, W_DFFN, DT_SPLIT_ROW, 0, 0, INIT_NORMAL, NULL, W_NONE, DT_LAYERS_DENSE }
#define ROUTED DT_SPEC_ROUTED
/* Qwen 2 MoE's and DeepSeek's router and experts (mlp.gate, mlp.experts.<e>.*), and their shared expert's (under shared) */
#define MLP_EXPERTS(r, g, u, d)                                                                                                          \
    ROUTED(r, "routerw", "model.layers.%d.mlp.gate.weight", W_EXPERTS, W_C, W_NONE, "blk.%d.ffn_gate_inp.weight"),                      \
    ROUTED(g, "egatew", "model.layers.%d.mlp.experts.%%d.gate_proj.weight", W_FFN, W_C, W_EXPERTS, "blk.%d.ffn_gate_exps.weight"),      \
    ROUTED(u, "eupw", "model.layers.%d.mlp.experts.%%d.up_proj.weight", W_FFN, W_C, W_EXPERTS, "blk.%d.ffn_up_exps.weight"),            \
    ROUTED(d, "edownw", "model.layers.%d.mlp.experts.%%d.down_proj.weight", W_C, W_FFN, W_EXPERTS, "blk.%d.ffn_down_exps.weight")
/* (the shared expert split by tensor parallelism as a dense MLP: gate and up by hidden units, down by its inputs) */
#define SHARED(i, name, hf, rows, cols, split, gguf) [i] = { name, hf, rows, cols, split, 0, 0, INIT_NORMAL, gguf, W_NONE, DT_LAYERS_MOE }
#define SHARED_EXPERT(shared, g, u, d)                                                                                                  \
    SHARED(g, "sgatew", "model.layers.%d.mlp." shared ".gate_proj.weight", W_SFFN, W_C, DT_SPLIT_COLUMN, "blk.%d.ffn_gate_shexp.weight"), \
    SHARED(u, "supw", "model.layers.%d.mlp." shared ".up_proj.weight", W_SFFN, W_C, DT_SPLIT_COLUMN, "blk.%d.ffn_up_shexp.weight"),       \
    SHARED(d, "sdownw", "model.layers.%d.mlp." shared ".down_proj.weight", W_C, W_SFFN, DT_SPLIT_ROW, "blk.%d.ffn_down_shexp.weight")

/* Mixtral (its dense layers in dtrain's own format: Mixtral's has none) */
enum { MDGATEW = LN2W + 1, MDUPW, MDDOWNW, ROUTERW, EGATEW, EUPW, EDOWNW };
static const dt_tensor_spec block_moe[] = {
    LLAMA_ATTENTION,
    DENSE_MLP(MDGATEW, MDUPW, MDDOWNW),
    ROUTED(ROUTERW, "routerw", "model.layers.%d.block_sparse_moe.gate.weight", W_EXPERTS, W_C, W_NONE, "blk.%d.ffn_gate_inp.weight"),
    ROUTED(EGATEW, "egatew", "model.layers.%d.block_sparse_moe.experts.%%d.w1.weight", W_FFN, W_C, W_EXPERTS, "blk.%d.ffn_gate_exps.weight"),
    ROUTED(EUPW, "eupw", "model.layers.%d.block_sparse_moe.experts.%%d.w3.weight", W_FFN, W_C, W_EXPERTS, "blk.%d.ffn_up_exps.weight"),
    ROUTED(EDOWNW, "edownw", "model.layers.%d.block_sparse_moe.experts.%%d.w2.weight", W_C, W_FFN, W_EXPERTS, "blk.%d.ffn_down_exps.weight"),
};

/* the mixture's output and the dense MLP's (the same value: the add after reads either), then the dense MLP's own */
enum { MOE = LN2 + 1, DGATEUP, DACT, NVALUES_MOE };
static const dt_width values_moe[NVALUES_MOE] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_C, W_DFFN2, W_DFFN };
#define MIXTURE_OPS(gate, down, router, nw)                                    \
    { DT_OP_LINEAR, LN2, -1, DGATEUP, gate, 2, -1, DT_LAYERS_DENSE },         \
    { DT_OP_SWIGLU, DGATEUP, -1, DACT, -1, 0, -1, DT_LAYERS_DENSE },          \
    { DT_OP_LINEAR, DACT, -1, MOE, down, 1, -1, DT_LAYERS_DENSE },            \
    { DT_OP_MOE, LN2, -1, MOE, router, nw, -1, DT_LAYERS_MOE },               \
    { DT_OP_ADD, RES2, MOE, DT_V_OUT, -1, 0, -1, DT_LAYERS_ALL }
static const dt_op_spec ops_moe[] = {
    LLAMA_ATTENTION_OPS(-1),
    MIXTURE_OPS(MDGATEW, MDDOWNW, ROUTERW, 4),
};

/* Qwen 2's MoE: Qwen 2's attention (q, k, v biases), a router and E SwiGLU experts, and beside them one shared SwiGLU
 * expert whose output a sigmoid gate of the token scales */
enum { QDGATEW = LN2W + 1, QDUPW, QDDOWNW, QROUTERW, QEGATEW, QEUPW, QEDOWNW, QSGATEW, QSUPW, QSDOWNW, QSGATEV, QQB, QKB, QVB };
static const dt_tensor_spec block_qwen_moe[] = {
    LLAMA_ATTENTION,
    DENSE_MLP(QDGATEW, QDUPW, QDDOWNW),
    MLP_EXPERTS(QROUTERW, QEGATEW, QEUPW, QEDOWNW),
    SHARED_EXPERT("shared_expert", QSGATEW, QSUPW, QSDOWNW),
    ROUTED(QSGATEV, "sgatev", "model.layers.%d.mlp.shared_expert_gate.weight", W_ONE, W_C, W_NONE, "blk.%d.ffn_gate_inp_shexp.weight"),
    [QQB] = { "qb", "model.layers.%d.self_attn.q_proj.bias", W_Q, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_q.bias", W_NONE, DT_LAYERS_ALL },
    [QKB] = { "kb", "model.layers.%d.self_attn.k_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_k.bias", W_NONE, DT_LAYERS_ALL },
    [QVB] = { "vb", "model.layers.%d.self_attn.v_proj.bias", W_KV, W_NONE, DT_SPLIT_COLUMN, 0, 0, INIT_ZEROS, "blk.%d.attn_v.bias", W_NONE, DT_LAYERS_ALL },
};
static const dt_op_spec ops_qwen_moe[] = {
    LLAMA_ATTENTION_OPS(QQB),
    MIXTURE_OPS(QDGATEW, QDDOWNW, QROUTERW, 8),
};

const dt_family dt_family_qwen2_moe = {
    .name = "qwen2_moe", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_qwen_moe, .nblock = QVB + 1, .final = final, .nfinal = 2,
    .ops = ops_qwen_moe, .nops = sizeof ops_qwen_moe / sizeof *ops_qwen_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .gguf_arch = "qwen2moe", .hf_arch = "Qwen2MoeForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

/* DeepSeek-V3's mixture with Llama's attention (its MLA is not built): a router and E SwiGLU experts, and beside them
 * shared SwiGLU experts (one of their width times their count) that every token goes through, ungated; the names are
 * transformers' DeepseekV3's (per expert as its hub files hold them); dtrain's own format (no HF folder: MLA) */
enum { DDGATEW = LN2W + 1, DDUPW, DDDOWNW, DROUTERW, DEGATEW, DEUPW, DEDOWNW, DSGATEW, DSUPW, DSDOWNW };
static const dt_tensor_spec block_deepseek_moe[] = {
    LLAMA_ATTENTION,
    DENSE_MLP(DDGATEW, DDUPW, DDDOWNW),
    MLP_EXPERTS(DROUTERW, DEGATEW, DEUPW, DEDOWNW),
    SHARED_EXPERT("shared_experts", DSGATEW, DSUPW, DSDOWNW),
};
static const dt_op_spec ops_deepseek_moe[] = {
    LLAMA_ATTENTION_OPS(-1),
    MIXTURE_OPS(DDGATEW, DDDOWNW, DROUTERW, 7),
};

const dt_family dt_family_deepseek_moe = {
    .name = "deepseek_moe", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_deepseek_moe, .nblock = DSDOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops_deepseek_moe, .nops = sizeof ops_deepseek_moe / sizeof *ops_deepseek_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .hf_none = "DeepSeek's mixture (ungated shared experts) has no Hugging Face folder with Llama's attention (transformers' "
               "DeepseekV3 is MLA)",
    .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

/* Qwen 3's MoE: Qwen 3's attention (each head's queries and keys normed), a router and E SwiGLU experts (Qwen 2 MoE's
 * names), no shared expert */
enum { WDGATEW = LN2W + 1, WDUPW, WDDOWNW, WROUTERW, WEGATEW, WEUPW, WEDOWNW, WQNW, WKNW };
static const dt_tensor_spec block_qwen3_moe[] = {
    LLAMA_ATTENTION,
    DENSE_MLP(WDGATEW, WDUPW, WDDOWNW),
    MLP_EXPERTS(WROUTERW, WEGATEW, WEUPW, WEDOWNW),
    QWEN3_HEAD_NORMS(WQNW, WKNW),
};
/* a mixture's values, then q|k|v with q and k normed */
enum { QKVN_MOE = NVALUES_MOE, NVALUES_QWEN3_MOE };
static const dt_width values_qwen3_moe[NVALUES_QWEN3_MOE] = { W_C, W_C, W_C, W_QKV, W_Q, W_C, W_C, W_C, W_C, W_DFFN2, W_DFFN, W_QKV };
static const dt_op_spec ops_qwen3_moe[] = {
    QWEN3_ATTENTION_OPS(WQNW, QKVN_MOE),
    MIXTURE_OPS(WDGATEW, WDDOWNW, WROUTERW, 4),
};

const dt_family dt_family_qwen3_moe = {
    .name = "qwen3_moe", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_qwen3_moe, .nblock = WKNW + 1, .final = final, .nfinal = 2,
    .ops = ops_qwen3_moe, .nops = sizeof ops_qwen3_moe / sizeof *ops_qwen3_moe, .values = values_qwen3_moe,
    .nvalues = NVALUES_QWEN3_MOE, .gguf_arch = "qwen3moe", .hf_arch = "Qwen3MoeForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};

const dt_family dt_family_mixtral = {
    .name = "mixtral", .rms = 1, .rotary = 1,
    .embed = embed, .nembed = 1, .block = block_moe, .nblock = EDOWNW + 1, .final = final, .nfinal = 2,
    .ops = ops_moe, .nops = sizeof ops_moe / sizeof *ops_moe, .values = values_moe, .nvalues = NVALUES_MOE,
    .gguf_arch = "llama", .gguf_pairs = 1, .hf_arch = "MixtralForCausalLM", .hf_module_prefix = "", .lora_targets = "q_proj,v_proj",
};
