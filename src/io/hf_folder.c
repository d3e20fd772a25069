/* A Hugging Face model folder, as save_pretrained writes one: config.json
 * (GPT2Config's fields, or LlamaConfig's / Qwen2Config's) and
 * model.safetensors, so that GPT2LMHeadModel.from_pretrained(folder) (or
 * LlamaForCausalLM's, Qwen2ForCausalLM's) loads it with no config written
 * by hand. dtrain's GPT-2 is HF's with tied embeddings, GELU's tanh form,
 * LayerNorm eps 1e-5 and no dropout. A folder of another architecture is
 * named by its config.json when it is refused. */
#include "dtrain/io.h"
#include "json_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A mixture of experts' fields: Qwen 2 MoE's and Qwen 3 MoE's (their dense layers: the first first_dense, and those
 * between every moe_every-th; Qwen 2's q/k/v with biases and its shared expert) or Mixtral's. */
static void moe_config(cJSON *j, const dt_lm_config *c, bool qwen, bool qwen2) {
    if (qwen) {
        cJSON_AddNumberToObject(j, "num_experts", c->experts);
        cJSON_AddNumberToObject(j, "moe_intermediate_size", c->ffn);
        if (qwen2) cJSON_AddNumberToObject(j, "shared_expert_intermediate_size", c->shared_ffn);
        cJSON_AddBoolToObject(j, "norm_topk_prob", c->norm_topk);
        cJSON_AddNumberToObject(j, "decoder_sparse_step", c->moe_every);
        cJSON *dense = cJSON_AddArrayToObject(j, "mlp_only_layers");
        for (int l = 0; l < c->first_dense && l < c->num_layers; l++) cJSON_AddItemToArray(dense, cJSON_CreateNumber(l));
        if (qwen2) cJSON_AddBoolToObject(j, "qkv_bias", 1);
    } else {
        cJSON_AddNumberToObject(j, "num_local_experts", c->experts);
        cJSON_AddNullToObject(j, "sliding_window");
    }
    cJSON_AddNumberToObject(j, "num_experts_per_tok", c->experts_top_k);
    cJSON_AddBoolToObject(j, "output_router_logits", c->aux_coef > 0);
    cJSON_AddNumberToObject(j, "router_aux_loss_coef", c->aux_coef > 0 ? dt_f32_decimal(c->aux_coef) : 0.001);
}

/* LlamaConfig's (Qwen2Config's, Qwen3Config's, MixtralConfig's, Qwen2MoeConfig's, Qwen3MoeConfig's) fields: what transformers needs to build the same model. */
static cJSON *llama_config(const dt_gpt2_config *given) {
    dt_lm_config c = dt_lm_config_resolve(given);
    bool q2moe = c.family == dt_family_find("qwen2_moe"), q3moe = c.family == dt_family_find("qwen3_moe"), moe = c.experts > 0;
    cJSON *j = cJSON_CreateObject();
    const char *arch[1] = { dt_family_hf_arch(c.family, NULL) }; /* (the caller saw that it has one) */
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(j, "model_type", dt_family_name(c.family));
    if (moe) moe_config(j, &c, q2moe || q3moe, q2moe);
    cJSON_AddNumberToObject(j, "vocab_size", c.vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c.channels);
    cJSON_AddNumberToObject(j, "intermediate_size", c.dense_ffn ? c.dense_ffn : c.ffn); /* (Qwen 2 MoE's dense layers') */
    cJSON_AddNumberToObject(j, "num_hidden_layers", c.num_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c.num_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c.kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c.head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c.max_seq_len);
    cJSON_AddNumberToObject(j, "rms_norm_eps", dt_f32_decimal(c.norm_eps)); /* (1e-05, not the float's 9.99999974737875e-06) */
    cJSON_AddNumberToObject(j, "rope_theta", dt_f32_decimal(c.rope_theta));
    if (c.rope_factor > 0) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", "llama3");
        cJSON_AddNumberToObject(r, "factor", c.rope_factor);
        cJSON_AddNumberToObject(r, "low_freq_factor", c.rope_low_freq_factor);
        cJSON_AddNumberToObject(r, "high_freq_factor", c.rope_high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", c.rope_original_max);
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", !c.untied);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (c.family == dt_family_find("llama") || c.family == dt_family_find("qwen3") || q3moe) { /* (Qwen 2 has q/k/v biases; the other mixtures have no such fields) */
        cJSON_AddBoolToObject(j, "attention_bias", 0);
        if (c.family == dt_family_find("llama")) cJSON_AddBoolToObject(j, "mlp_bias", 0);
    }
    cJSON_AddNullToObject(j, "bos_token_id");
    cJSON_AddNullToObject(j, "eos_token_id");
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static cJSON *gpt2_config(const dt_gpt2_config *c) {
    cJSON *j = cJSON_CreateObject();
    const char *arch[1] = { "GPT2LMHeadModel" };
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", c->max_seq_len);
    cJSON_AddNumberToObject(j, "n_embd", c->channels);
    cJSON_AddNumberToObject(j, "n_layer", c->num_layers);
    cJSON_AddNumberToObject(j, "n_head", c->num_heads);
    cJSON_AddNullToObject(j, "n_inner"); /* 4 x n_embd */
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "resid_pdrop", 0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
    if (c->vocab_size == 50257) { /* GPT-2's tokenizer: <|endoftext|> */
        cJSON_AddNumberToObject(j, "bos_token_id", 50256);
        cJSON_AddNumberToObject(j, "eos_token_id", 50256);
    } else { /* GPT2Config's default (50256) lies outside another vocabulary */
        cJSON_AddNullToObject(j, "bos_token_id");
        cJSON_AddNullToObject(j, "eos_token_id");
    }
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

dt_status dt_hf_folder_save(const char *dir, dt_gpt2 *m) {
    const dt_family *f = dt_gpt2_get_config(m)->family;
    const char *why;
    if (f && !dt_family_hf_arch(f, &why)) return dt_error(DT_ERR_UNSUPPORTED, "%s: %s; dtrain's checkpoint keeps it", dir, why);
    if (dt_gpt2_get_config(m)->router == DT_ROUTER_SIGMOID_BIAS) /* before anything is written */
        return dt_error(DT_ERR_UNSUPPORTED, "%s: DeepSeek-V3's sigmoid router with its bias has no Mixtral or Qwen 2 MoE folder in "
                        "transformers (its attention is MLA); dtrain's checkpoint keeps it", dir);
    dt_lm_config r = dt_lm_config_resolve(dt_gpt2_get_config(m));
    if (r.dense_ffn && r.family != dt_family_find("qwen2_moe") && r.family != dt_family_find("qwen3_moe"))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %s's dense layers among its mixtures (%d of %d layers dense) have no place in its "
                        "Hugging Face config (Qwen's MoE has: decoder_sparse_step, mlp_only_layers); dtrain's checkpoint keeps it",
                        dir, dt_family_name(r.family), r.num_layers - dt_lm_moe_layers(&r), r.num_layers);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dt_error(DT_ERR_IO, "%s: cannot create the folder: %s", dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    dt_status st = dt_safetensors_save(path, m, DT_F32);
    if (st) return st;
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    cJSON *j = c->family && c->family != dt_family_find("gpt2") ? llama_config(c) : gpt2_config(c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return dt_json_write_file(j, 1, path);
}

dt_status dt_hf_tokenizer_copy(const char *tokenizer_json, const char *dir) {
    static const char *beside[] = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json" };
    const char *slash = strrchr(tokenizer_json, '/');
    int at = slash ? (int)(slash - tokenizer_json + 1) : 0;
    dt_status st = DT_OK;
    for (size_t i = 0; i < sizeof beside / sizeof *beside && !st; i++) {
        char from[4200], to[4200], *text = NULL;
        size_t len = 0;
        if (i == 0) snprintf(from, sizeof from, "%s", tokenizer_json);
        else snprintf(from, sizeof from, "%.*s%s", at, tokenizer_json, beside[i]);
        snprintf(to, sizeof to, "%s/%s", dir, beside[i]);
        if (dt_file_read_text(from, (size_t)1 << 30, &text, &len)) {
            if (i == 0) st = dt_error(DT_ERR_IO, "%s: cannot read the tokenizer to copy into %s", from, dir);
            continue; /* the others: where the tokenizer has them */
        }
        const void *parts[1] = { text };
        st = dt_file_write_atomic(to, parts, &len, 1);
        free(text);
    }
    return st;
}

dt_status dt_hf_folder_check(const char *dir) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (dt_file_read_text(path, 1 << 20, &text, NULL)) return DT_OK; /* no config: the weights say what they are */
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, "model_type") : NULL;
    const cJSON *a = j ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0) : NULL;
    const char *type = cJSON_IsString(t) ? t->valuestring : "", *arch = cJSON_IsString(a) ? a->valuestring : "";
    dt_status st = DT_OK;
    /* the model program's families that transformers has (GPT-2's heads share its weights: GPT2Model, GPT2LMHeadModel, ...) */
    bool known = (!*type || dt_family_find(type)) && (!*arch || !strncmp(arch, "GPT2", 4) || dt_family_find_hf_arch(arch));
    if (!known) {
        char what[256], archs[512];
        snprintf(what, sizeof what, "%s%s%s%s%s", arch, *arch && *type ? " (" : "", *type ? "model_type " : "", type,
                 *arch && *type ? ")" : "");
        dt_family_hf_archs(archs, sizeof archs);
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: the folder holds a %s model; dtrain reads these model types (architectures): %s", path,
                      what, archs);
    }
    cJSON_Delete(j);
    return st;
}
