/* The model program's presets: GPT-2's sizes on the gpt2 family, and Llama shapes (a tiny one for tests,
 * SmolLM-135M's and Llama 3.2 1B's, as their config.json files give them). */
#include "dtrain/program.h"

#include <string.h>

static dt_lm_config llama(int V, int T, int L, int NH, int KV, int C, int F, float theta, bool tied) {
    dt_lm_config c = { .family = dt_family_find("llama"), .vocab_size = V, .padded_vocab_size = (V + 63) / 64 * 64, .max_seq_len = T,
                       .num_layers = L, .num_heads = NH, .kv_heads = KV, .head_dim = C / NH, .channels = C, .ffn = F,
                       .norm_eps = 1e-5f, .rope = { .theta = theta }, .tied = tied };
    return c;
}

dt_status dt_lm_preset(const char *name, dt_lm_config *out) {
    if (!strcmp(name, "llama-tiny")) *out = llama(512, 256, 4, 8, 2, 128, 344, 10000, false);
    else if (!strcmp(name, "smollm-135m")) *out = llama(49152, 2048, 30, 9, 3, 576, 1536, 10000, true);
    else if (!strcmp(name, "llama3.2-1b")) {
        *out = llama(128256, 131072, 16, 32, 8, 2048, 8192, 500000, true);
        out->rope = (dt_rope_config){ .theta = 500000, .factor = 32, .low_freq_factor = 1, .high_freq_factor = 4, .original_max = 8192 };
    } else {
        dt_gpt2_config g;
        dt_status st = dt_gpt2_preset(name, &g);
        if (st)
            return dt_error(DT_ERR_ARG, "unknown model preset '%s' (expected llama-tiny, smollm-135m, llama3.2-1b, d6, 124M, 350M, 774M or 1558M)",
                            name);
        *out = (dt_lm_config){ .family = dt_family_find("gpt2"), .vocab_size = g.vocab_size, .padded_vocab_size = g.padded_vocab_size,
                               .max_seq_len = g.max_seq_len, .num_layers = g.num_layers, .num_heads = g.num_heads, .kv_heads = g.num_heads,
                               .head_dim = g.channels / g.num_heads, .channels = g.channels, .ffn = 4 * g.channels, .norm_eps = 1e-5f,
                               .tied = true };
    }
    return DT_OK;
}
