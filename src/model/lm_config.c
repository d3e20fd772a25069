/* The model program's presets: GPT-2's sizes (the gpt2 family), and Llama shapes (a tiny one for tests,
 * SmolLM-135M's and Llama 3.2 1B's, as their config.json files give them), Qwen 3's (a tiny one, and 0.6B's), and a
 * tiny Mixtral and a tiny Qwen 3 MoE for tests. */
#include "dtrain/program.h"

#include <string.h>

static dt_lm_config llama(int V, int T, int L, int NH, int KV, int C, int F, float theta, bool tied) {
    dt_lm_config c = { .family = dt_family_find("llama"), .vocab_size = V, .padded_vocab_size = (V + 63) / 64 * 64, .max_seq_len = T,
                       .num_layers = L, .num_heads = NH, .kv_heads = KV, .channels = C, .ffn = F, .norm_eps = 1e-5f,
                       .rope_theta = theta, .untied = !tied };
    return c;
}

dt_status dt_lm_preset(const char *name, dt_lm_config *out) {
    static const struct { const char *name; int L, NH, C, T; } gpt2[] = {
        { "d6", 6, 6, 384, 256 }, { "124M", 12, 12, 768, 1024 }, { "350M", 24, 16, 1024, 1024 },
        { "774M", 36, 20, 1280, 1024 }, { "1558M", 48, 25, 1600, 1024 },
    };
    for (size_t i = 0; i < sizeof gpt2 / sizeof gpt2[0]; i++)
        if (!strcmp(name, gpt2[i].name)) {
            *out = (dt_lm_config){ .max_seq_len = gpt2[i].T, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = gpt2[i].L, .num_heads = gpt2[i].NH, .channels = gpt2[i].C };
            return DT_OK;
        }
    if (!strcmp(name, "llama-tiny")) *out = llama(512, 256, 4, 8, 2, 128, 344, 10000, false);
    else if (!strcmp(name, "mixtral-tiny")) { /* llama-tiny's attention, 8 experts of 172 hidden units, 2 a token */
        *out = llama(512, 256, 4, 8, 2, 128, 172, 10000, false);
        out->family = dt_family_find("mixtral"), out->experts = 8, out->experts_top_k = 2, out->norm_topk = 1;
    } else if (!strcmp(name, "qwen3-tiny")) { /* llama-tiny's sizes (untied), Qwen 3's block, heads wider than C / heads */
        *out = llama(512, 256, 4, 8, 2, 128, 344, 1000000, false);
        out->family = dt_family_find("qwen3"), out->head_dim = 32, out->norm_eps = 1e-6f;
    } else if (!strcmp(name, "qwen3-moe-tiny")) { /* qwen3-tiny's attention, mixtral-tiny's 8 experts of 172, 2 a token */
        *out = llama(512, 256, 4, 8, 2, 128, 172, 1000000, false);
        out->family = dt_family_find("qwen3_moe"), out->head_dim = 32, out->norm_eps = 1e-6f;
        out->experts = 8, out->experts_top_k = 2, out->norm_topk = 1;
    } else if (!strcmp(name, "qwen3-0.6b")) {
        *out = llama(151936, 40960, 28, 16, 8, 1024, 3072, 1000000, true);
        out->family = dt_family_find("qwen3"), out->head_dim = 128, out->norm_eps = 1e-6f;
    } else if (!strcmp(name, "smollm-135m")) *out = llama(49152, 2048, 30, 9, 3, 576, 1536, 10000, true);
    else if (!strcmp(name, "llama3.2-1b")) {
        *out = llama(128256, 131072, 16, 32, 8, 2048, 8192, 500000, true);
        out->rope_factor = 32, out->rope_low_freq_factor = 1, out->rope_high_freq_factor = 4, out->rope_original_max = 8192;
    } else {
        return dt_error(DT_ERR_ARG, "unknown model preset '%s' (expected %s)", name, DT_LM_PRESETS);
    }
    return DT_OK;
}
