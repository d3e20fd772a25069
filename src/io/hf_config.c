/* A Hugging Face config.json as a model program's config (dt_lm_config_from_hf). */
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Field name of j as a whole number in [lo, hi]; absent: def (def < lo: required). */
static dt_status get_int(const cJSON *j, const char *name, int def, int lo, int hi, const char *path, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v || cJSON_IsNull(v)) {
        if (def < lo) return dt_error(DT_ERR_IO, "%s: \"%s\" is missing", path, name);
        *out = def;
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return dt_error(DT_ERR_IO, "%s: \"%s\" must be a whole number in %d..%d", path, name, lo, hi);
    *out = (int)v->valuedouble;
    return DT_OK;
}

static dt_status get_float(const cJSON *j, const char *name, double def, const char *path, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return dt_error(DT_ERR_IO, "%s: \"%s\" must be a positive number", path, name);
    *out = (float)v->valuedouble;
    return DT_OK;
}

/* Rotary settings: transformers 5's rope_parameters, or 4's rope_theta with rope_scaling. */
static dt_status rope_of(const cJSON *j, const char *path, dt_lm_config *r) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *sc = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    dt_status st = get_float(cJSON_IsObject(rp) ? rp : j, "rope_theta", 10000, path, &r->rope_theta);
    if (st || !cJSON_IsObject(sc)) return st;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(sc, "type");
    if (!cJSON_IsString(type) || !strcmp(type->valuestring, "default")) return DT_OK;
    if (strcmp(type->valuestring, "llama3"))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported (default and llama3 are)", path, type->valuestring);
    if ((st = get_float(sc, "factor", 0, path, &r->rope_factor)) || (st = get_float(sc, "low_freq_factor", 1, path, &r->rope_low_freq_factor)) ||
        (st = get_float(sc, "high_freq_factor", 4, path, &r->rope_high_freq_factor)) ||
        (st = get_int(sc, "original_max_position_embeddings", -1, 1, 1 << 30, path, &r->rope_original_max)))
        return st;
    if (!(r->rope_factor > 0) || !(r->rope_high_freq_factor > r->rope_low_freq_factor))
        return dt_error(DT_ERR_IO, "%s: llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor", path);
    return DT_OK;
}

static dt_status llama_like(const cJSON *j, const char *path, dt_lm_config *c) {
    dt_status st;
    if ((st = get_int(j, "vocab_size", -1, 1, 1 << 24, path, &c->vocab_size)) ||
        (st = get_int(j, "hidden_size", -1, 1, 1 << 20, path, &c->channels)) ||
        (st = get_int(j, "intermediate_size", -1, 1, 1 << 22, path, &c->ffn)) ||
        (st = get_int(j, "num_hidden_layers", -1, 1, 4096, path, &c->num_layers)) ||
        (st = get_int(j, "num_attention_heads", -1, 1, 4096, path, &c->num_heads)) ||
        (st = get_int(j, "num_key_value_heads", c->num_heads, 1, 4096, path, &c->kv_heads)) ||
        (st = get_int(j, "head_dim", c->channels / c->num_heads, 1, 4096, path, &c->head_dim)) ||
        (st = get_int(j, "max_position_embeddings", 2048, 1, 1 << 30, path, &c->max_seq_len)) ||
        (st = get_float(j, "rms_norm_eps", 1e-6, path, &c->norm_eps)) || (st = rope_of(j, path, c)))
        return st;
    if (c->num_heads % c->kv_heads)
        return dt_error(DT_ERR_IO, "%s: \"num_key_value_heads\" %d does not divide \"num_attention_heads\" %d", path, c->kv_heads, c->num_heads);
    const char *unsupported[] = { "attention_bias", "mlp_bias", "use_sliding_window" };
    for (int i = 0; i < 3; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, unsupported[i])))
            return dt_error(DT_ERR_UNSUPPORTED, "%s: \"%s\": true is not supported by the llama family", path, unsupported[i]);
    c->untied = !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
    return DT_OK;
}

/* mlp_only_layers (Qwen 2 MoE's dense layers by number) as the first K: the only list this build places (K, or -1). */
static int first_layers(const cJSON *list, int L) {
    int n = cJSON_GetArraySize(list);
    bool *seen = calloc((size_t)L + 1, 1);
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        if (!seen || !cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= n || x->valuedouble >= L || x->valuedouble != (int)x->valuedouble ||
            seen[(int)x->valuedouble]) {
            free(seen);
            return -1;
        }
        seen[(int)x->valuedouble] = true;
    }
    free(seen);
    return n;
}

/* Qwen 2 MoE's and Qwen 3 MoE's: their experts' widths (moe_intermediate_size; Qwen 2's shared expert's), their weights
 * not renormalised unless norm_topk_prob; their dense layers (intermediate_size wide): those not a multiple of
 * decoder_sparse_step (counting from 1) and mlp_only_layers (the first K only, in this build); Qwen 2's q, k and v with
 * biases. */
static dt_status qwen_moe_of(const cJSON *j, const char *path, bool shared, dt_lm_config *c) {
    dt_status st;
    int step = 1, dense_w = c->ffn;
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers"), *bias = cJSON_GetObjectItemCaseSensitive(j, "qkv_bias");
    /* (transformers 5 saves Qwen 3 MoE's count as Mixtral's num_local_experts; the hub's files say num_experts) */
    const char *count = !shared && !cJSON_GetObjectItemCaseSensitive(j, "num_experts") ? "num_local_experts" : "num_experts";
    if ((st = get_int(j, count, -1, 1, 4096, path, &c->experts)) || (st = get_int(j, "moe_intermediate_size", -1, 1, 1 << 22, path, &c->ffn)) ||
        (shared && (st = get_int(j, "shared_expert_intermediate_size", -1, 1, 1 << 22, path, &c->shared_ffn))) ||
        (st = get_int(j, "decoder_sparse_step", 1, 1, 4096, path, &step)))
        return st;
    int first = dense && !cJSON_IsNull(dense) ? cJSON_IsArray(dense) ? first_layers(dense, c->num_layers) : -1 : 0;
    if (first < 0)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: \"mlp_only_layers\" must list the first K layers (0 to K-1, each once, below "
                        "num_hidden_layers %d): this build places dense layers first and between every decoder_sparse_step-th", path,
                        c->num_layers);
    c->moe_every = step, c->first_dense = first, c->dense_ffn = dense_w;
    if (!shared && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "use_qk_norm")))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: \"use_qk_norm\": false is not Qwen 3 MoE as this build runs it (each head's queries "
                        "and keys normed)", path);
    if (shared && bias && !cJSON_IsTrue(bias)) return dt_error(DT_ERR_UNSUPPORTED, "%s: \"qkv_bias\": false is not Qwen 2 MoE as this build runs it", path);
    c->norm_topk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "norm_topk_prob"));
    return DT_OK;
}

/* Mixtral's experts (Qwen's: above): how many, how many a token, and the balancing loss as their CausalLM adds it (only
 * with output_router_logits). */
static dt_status moe_of(const cJSON *j, const char *path, dt_lm_config *c) {
    dt_status st;
    bool qwen2 = c->family == dt_family_find("qwen2_moe"), qwen = qwen2 || c->family == dt_family_find("qwen3_moe");
    if ((st = qwen ? qwen_moe_of(j, path, qwen2, c) : get_int(j, "num_local_experts", -1, 1, 4096, path, &c->experts)) ||
        (st = get_int(j, "num_experts_per_tok", 2, 1, 32, path, &c->experts_top_k)))
        return st;
    if (!qwen) c->norm_topk = 1;
    float jitter = 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window"), *jn = cJSON_GetObjectItemCaseSensitive(j, "router_jitter_noise");
    if (cJSON_IsNumber(jn) && jn->valuedouble != 0) jitter = (float)jn->valuedouble;
    if (jitter != 0) return dt_error(DT_ERR_UNSUPPORTED, "%s: \"router_jitter_noise\" %g: this build routes without noise (0)", path, (double)jitter);
    if (cJSON_IsNumber(sw) && sw->valuedouble > 0 && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window")))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: \"sliding_window\" %g: this build attends to the whole sequence", path, sw->valuedouble);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "output_router_logits")))
        return get_float(j, "router_aux_loss_coef", 0.001, path, &c->aux_coef);
    return DT_OK;
}

static dt_status gpt2_like(const cJSON *j, const char *path, dt_lm_config *c) {
    dt_status st;
    if ((st = get_int(j, "vocab_size", -1, 1, 1 << 24, path, &c->vocab_size)) || (st = get_int(j, "n_embd", -1, 1, 1 << 20, path, &c->channels)) ||
        (st = get_int(j, "n_layer", -1, 1, 4096, path, &c->num_layers)) || (st = get_int(j, "n_head", -1, 1, 4096, path, &c->num_heads)) ||
        (st = get_int(j, "n_positions", 1024, 1, 1 << 24, path, &c->max_seq_len)))
        return st;
    c->kv_heads = c->num_heads;
    c->head_dim = c->channels / c->num_heads;
    c->ffn = 4 * c->channels;
    c->norm_eps = 1e-5f;
    return DT_OK;
}

dt_status dt_lm_config_from_hf(const char *json, const char *path, dt_lm_config *out) {
    memset(out, 0, sizeof *out);
    cJSON *j = cJSON_Parse(json);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_error(DT_ERR_IO, "%s: not a JSON object", path);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type"), *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    dt_status st;
    out->family = dt_family_find(t);
    if (!out->family) {
        const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: \"model_type\" \"%s\" (architecture %s) is not a family dtrain knows (gpt2, llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe)", path, t,
                      cJSON_IsString(a0) ? a0->valuestring : "not given");
    } else {
        st = strcmp(t, "gpt2") ? llama_like(j, path, out) : gpt2_like(j, path, out);
        if (!st && dt_family_moe(out->family)) st = moe_of(j, path, out);
    }
    cJSON_Delete(j);
    if (st) return st;
    out->padded_vocab_size = (out->vocab_size + 63) / 64 * 64;
    return dt_lm_config_check(out, path);
}
