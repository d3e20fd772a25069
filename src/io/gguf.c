/* GGUF, llama.cpp's model file (version 3), written for any family of the model program: its architecture's keys
 * (sizes, heads, K/V heads, rotary base and Llama 3.1's scaling as llama.cpp's rope_freqs tensor, the norms'
 * epsilon), every tensor in f32 under llama.cpp's names (the spec's gguf names), q and k rows reordered where
 * llama.cpp's rope turns adjacent pairs; a mixture's experts stacked in one tensor a layer (ffn_*_exps, [E, rows,
 * cols] as dtrain keeps them) with the expert counts' keys. The vocabulary: a tokenizer's (tokenizer.json: its tokens, merges, added
 * tokens, pattern by llama.cpp's name) where one is given; else the 256 bytes in GPT-2's byte-to-character order, then
 * placeholders "<tN>", so token ids mean the same on both sides (a byte-level model's text reads the same); with a
 * tokenizer, its tokenizer_config.json's chat template and end-of-text, as llama.cpp's converter takes them. Debian packages no GGUF library for C (ggml's
 * gguf.c is not in bookworm); the format is a header of typed key/values, tensor records, then aligned data. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/program.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, ALIGN = 32 };

/* The header as it grows; oom once an allocation failed (the rest is skipped, the save fails). */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool oom;
    uint64_t nkv;
} buf;

static void put(buf *b, const void *x, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }

static void key(buf *b, const char *arch, const char *name, uint32_t type) {
    char k[96];
    snprintf(k, sizeof k, "%s%s%s", arch ? arch : "", arch ? "." : "", name);
    put_str(b, k);
    put_u32(b, type);
    b->nkv++;
}
static void kv_u32(buf *b, const char *arch, const char *name, uint32_t v) { key(b, arch, name, GGUF_U32); put_u32(b, v); }
static void kv_f32(buf *b, const char *arch, const char *name, float v) { key(b, arch, name, GGUF_F32); put(b, &v, 4); }
static void kv_str(buf *b, const char *name, const char *v) { key(b, NULL, name, GGUF_STRING); put_str(b, v); }
static void kv_bool(buf *b, const char *name, bool v) { key(b, NULL, name, GGUF_BOOL); uint8_t x = v; put(b, &x, 1); }

/* Token i as the file lists it, and its llama.cpp type (1 normal, 3 control, 4 user-defined, 5 unused): the
 * tokenizer's (an id it lacks: a placeholder, unused); without one a byte's character below 256, a placeholder above. */
static const char *token_of(const dt_bpe *t, int i, char ph[24], uint32_t *type) {
    int added = 0;
    const char *s = t ? dt_bpe_token_text(t, (uint32_t)i, &added) : NULL;
    *type = t && !s ? 5 : added == 2 ? 3 : added == 1 ? 4 : 1;
    if (s) return s;
    if (!t && i < 256) dt_bpe_byte_char(i, ph);
    else snprintf(ph, 24, "<t%d>", i);
    return ph;
}

/* The vocabulary: tokens, types, merges (llama.cpp's BPE wants the list, empty without a tokenizer), llama.cpp's name
 * for the pattern, the begin- and end-of-text tokens (without a tokenizer the last id, never added; the end-of-text
 * tokenizer_config.json names, else the vocabulary's by its text), the chat template (as convert_hf_to_gguf.py writes
 * it: llama.cpp's chat and server read it). */
static dt_status vocabulary(buf *b, int V, const dt_gguf_vocab *v, const char *path) {
    const dt_bpe *t = v ? v->bpe : NULL;
    const char *pat = t ? dt_bpe_pattern(t) : dt_bpe_gpt2_pattern;
    const char *pre = !pat ? NULL
                      : !strcmp(pat, dt_bpe_gpt2_pattern) ? "gpt-2"
                      : !strcmp(pat, dt_bpe_llama3_pattern) ? "llama-bpe"
                      : !strcmp(pat, dt_bpe_qwen2_pattern) ? "qwen2" : NULL;
    if (!pre)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: the tokenizer's pre-tokenizer pattern is not GPT-2's, Llama 3's or Qwen 2's, the ones "
                        "llama.cpp is told by name", path);
    if (t && dt_bpe_vocab_size(t) > V)
        return dt_error(DT_ERR_ARG, "%s: the tokenizer has %d tokens, the model only %d", path, dt_bpe_vocab_size(t), V);
    if (t && v->eos >= V) return dt_error(DT_ERR_ARG, "%s: the end-of-text token %d is beyond the model's %d", path, v->eos, V);
    kv_str(b, "tokenizer.ggml.model", "gpt2"); /* byte-level BPE */
    kv_str(b, "tokenizer.ggml.pre", pre);
    key(b, NULL, "tokenizer.ggml.tokens", GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, (uint64_t)V);
    int eos = t ? -1 : V - 1, bos = t ? dt_bpe_bos(t) : V - 1;
    char ph[24];
    uint32_t type;
    for (int i = 0; i < V; i++) {
        const char *s = token_of(t, i, ph, &type);
        put_str(b, s);
        if (type == 3 && (!strcmp(s, "<|end_of_text|>") || !strcmp(s, "<|endoftext|>") || !strcmp(s, "<|im_end|>"))) eos = i;
    }
    key(b, NULL, "tokenizer.ggml.token_type", GGUF_ARRAY);
    put_u32(b, GGUF_I32);
    put_u64(b, (uint64_t)V);
    for (int i = 0; i < V; i++) token_of(t, i, ph, &type), put_u32(b, type);
    int nm = t ? dt_bpe_merge_count(t) : 0;
    key(b, NULL, "tokenizer.ggml.merges", GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, (uint64_t)nm);
    for (int i = 0; i < nm; i++) put_str(b, dt_bpe_merge(t, i));
    if (bos >= 0) kv_u32(b, NULL, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (t && v->eos >= 0) eos = v->eos;
    if (eos >= 0) kv_u32(b, NULL, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    kv_bool(b, "tokenizer.ggml.add_bos_token", t && bos >= 0);
    if (t && v->chat_template) kv_str(b, "tokenizer.chat_template", v->chat_template);
    return DT_OK;
}

static void architecture(buf *b, const dt_lm_config *c, const char *arch) {
    kv_str(b, "general.architecture", arch);
    kv_str(b, "general.name", "dtrain");
    kv_u32(b, NULL, "general.file_type", 0); /* all f32 */
    kv_u32(b, arch, "context_length", (uint32_t)c->max_seq_len);
    kv_u32(b, arch, "embedding_length", (uint32_t)c->channels);
    kv_u32(b, arch, "feed_forward_length", (uint32_t)c->ffn);
    kv_u32(b, arch, "block_count", (uint32_t)c->num_layers);
    kv_u32(b, arch, "attention.head_count", (uint32_t)c->num_heads);
    if (!strcmp(arch, "gpt2")) {
        kv_f32(b, arch, "attention.layer_norm_epsilon", c->norm_eps);
        return;
    }
    kv_u32(b, arch, "attention.head_count_kv", (uint32_t)c->kv_heads);
    kv_u32(b, arch, "attention.key_length", (uint32_t)c->head_dim);
    kv_u32(b, arch, "attention.value_length", (uint32_t)c->head_dim);
    kv_u32(b, arch, "rope.dimension_count", (uint32_t)c->head_dim);
    kv_f32(b, arch, "rope.freq_base", c->rope_theta);
    kv_f32(b, arch, "attention.layer_norm_rms_epsilon", c->norm_eps);
    kv_u32(b, arch, "vocab_size", (uint32_t)c->vocab_size);
    if (!c->experts) return;
    kv_u32(b, arch, "expert_count", (uint32_t)c->experts);
    kv_u32(b, arch, "expert_used_count", (uint32_t)c->experts_top_k);
    kv_u32(b, arch, "expert_feed_forward_length", (uint32_t)c->ffn);
    if (c->shared_ffn) kv_u32(b, arch, "expert_shared_feed_forward_length", (uint32_t)c->shared_ffn);
}

/* What llama.cpp's architecture runs of a mixture as it is here, or why not: every layer a mixture, softmax routing
 * with its weights renormalised over the k as the architecture does it (its llama's and qwen3moe's do, qwen2moe's does
 * not). */
static dt_status mixture_fits(const dt_lm_config *c, const char *arch, const char *path) {
    if (!c->experts) return DT_OK;
    if (dt_lm_moe_layers(c) != c->num_layers)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %d of the %d layers are dense among the mixtures: llama.cpp's %s makes every layer a "
                        "mixture; dtrain's checkpoint and Hugging Face folder keep it", path, c->num_layers - dt_lm_moe_layers(c),
                        c->num_layers, arch);
    if (c->router == DT_ROUTER_SIGMOID_BIAS)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: DeepSeek-V3's sigmoid router with its bias is not llama.cpp's %s's softmax router", path, arch);
    bool norm = strcmp(arch, "qwen2moe") != 0;
    if (!c->norm_topk != !norm)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: the experts' weights are%s renormalised over the top %d, and llama.cpp's %s %s them",
                        path, c->norm_topk ? "" : " not", c->experts_top_k, arch, norm ? "renormalises" : "does not renormalise");
    return DT_OK;
}

/* A tensor record: its name, dimensions innermost first (cols, rows, then stack: experts; 0: none), f32, and where its
 * data starts. */
static void record(buf *b, const char *name, int rows, int cols, int stack, uint64_t offset) {
    put_str(b, name);
    put_u32(b, stack ? 3 : cols ? 2 : 1);
    put_u64(b, (uint64_t)(cols ? cols : rows));
    if (cols) put_u64(b, (uint64_t)rows);
    if (stack) put_u64(b, (uint64_t)stack);
    put_u32(b, 0); /* GGML_TYPE_F32 */
    put_u64(b, offset);
}

static size_t aligned(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Rows [0, rows) of a [rows, cols] tensor into out, each head's rows (hd of them) reordered from Hugging Face's halves
 * to adjacent pairs when pairs: row i * 2 + j of a head is its row j * hd / 2 + i. */
static void copy_rows(float *out, const float *in, int rows, int cols, int hd, bool pairs) {
    for (int r = 0; r < rows; r++) {
        int h = r / hd, k = r % hd, from = pairs ? h * hd + (k % 2) * (hd / 2) + k / 2 : r;
        memcpy(out + (size_t)r * cols, in + (size_t)from * cols, sizeof(float) * (size_t)cols);
    }
}

/* What a tensor is in the file: its rows (the token table's and an untied head's real vocabulary only; an expert's), its
 * columns (0: a vector) and its experts (0: not stacked). */
static int file_rows(const dt_tensor_info *t, const dt_lm_config *c) {
    return t->split == DT_SPLIT_VOCAB ? c->vocab_size : t->stacked ? t->shape[1] : t->shape[0];
}
static int file_cols(const dt_tensor_info *t) { return t->ndim >= 2 ? t->shape[t->ndim - 1] : 0; }
static int file_stack(const dt_tensor_info *t) { return t->stacked ? t->shape[0] : 0; }

/* Each tensor's record (the tied copy's and those without a GGUF name left out) and, with Llama 3.1's scaling
 * (half > 0), rope_freqs' of half values: their count in *ntensors; the data's bytes returned. */
static size_t tensor_records(buf *recs, const dt_tensor_info *tab, int n, const dt_lm_config *c, int half, int *ntensors) {
    size_t data = 0;
    *ntensors = 0;
    for (int i = 0; i < n; i++) {
        if (tab[i].tied_copy || !tab[i].gguf[0]) continue;
        int rows = file_rows(&tab[i], c), cols = file_cols(&tab[i]), stack = file_stack(&tab[i]);
        record(recs, tab[i].gguf, rows, cols, stack, data);
        data = aligned(data + sizeof(float) * (size_t)rows * (size_t)(cols ? cols : 1) * (size_t)(stack ? stack : 1));
        (*ntensors)++;
    }
    if (half > 0) {
        record(recs, "rope_freqs.weight", half, 0, 0, data);
        data = aligned(data + sizeof(float) * (size_t)half);
        (*ntensors)++;
    }
    return data;
}

/* The tensors' values into body, in their records' order (q and k rows in llama.cpp's pairs where the family keeps
 * them otherwise); the bytes written returned. */
static size_t tensor_data(uint8_t *body, const dt_tensor_info *tab, int n, const float *params, const dt_lm_config *c, bool pairs) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &tab[i];
        if (t->tied_copy || !t->gguf[0]) continue;
        int stack = file_stack(t), rows = file_rows(t, c) * (stack ? stack : 1), cols = file_cols(t) ? file_cols(t) : 1;
        bool qk = pairs && (strstr(t->gguf, ".attn_q.") || strstr(t->gguf, ".attn_k."));
        copy_rows((float *)(body + at), params + t->offset, rows, cols, c->head_dim, qk); /* (the experts one after another) */
        at = aligned(at + sizeof(float) * (size_t)rows * (size_t)cols);
    }
    return at;
}

/* Llama 3.1's scaling as llama.cpp takes it: each frequency's divisor, the unscaled over the scaled (freqs: room for
 * both, 2 x head_dim / 2). */
static void rope_divisors(float *out, float *freqs, const dt_lm_config *c) {
    int half = c->head_dim / 2;
    dt_rope_config plain = { .theta = c->rope_theta }, scaled = { .theta = c->rope_theta, .factor = c->rope_factor,
                             .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                             .original_max = c->rope_original_max };
    dt_rope_frequencies(freqs, c->head_dim, &plain);
    dt_rope_frequencies(freqs + half, c->head_dim, &scaled);
    for (int i = 0; i < half; i++) out[i] = freqs[i] / freqs[half + i];
}

dt_status dt_gguf_save(const char *path, dt_gpt2 *m, const dt_gguf_vocab *v) {
    dt_status st = dt_gpt2_check_whole(m, "a GGUF export");
    if (st) return st;
    dt_program *p = dt_gpt2_program(m);
    const dt_lm_config *c = dt_program_config(p);
    const char *arch = dt_family_gguf_arch(c->family);
    if (!arch) return dt_error(DT_ERR_UNSUPPORTED, "%s: a GGUF export of the %s family is not in this build", path, dt_family_name(c->family));
    if ((st = mixture_fits(c, arch, path))) return st;
    int n, ntensors;
    const dt_tensor_info *tab = dt_program_tensors(p, &n);
    buf h = { 0 }, kv = { 0 }, recs = { 0 };
    architecture(&kv, c, arch);
    if ((st = vocabulary(&kv, c->vocab_size, v, path))) { free(kv.p); return st; }
    int half = c->rope_factor > 0 ? c->head_dim / 2 : 0;
    float *freqs = half ? calloc(2 * (size_t)half, sizeof(float)) : NULL;
    size_t data = tensor_records(&recs, tab, n, c, half, &ntensors);
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)ntensors);
    put_u64(&h, kv.nkv);
    if (kv.p) put(&h, kv.p, kv.n);
    if (recs.p) put(&h, recs.p, recs.n);
    static const uint8_t zeros[ALIGN];
    put(&h, zeros, aligned(h.n) - h.n);
    uint8_t *body = calloc(data ? data : 1, 1);
    if (h.oom || kv.oom || recs.oom || !body || (half && !freqs)) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if (!st) {
        size_t at = tensor_data(body, tab, n, dt_program_params(p), c, dt_family_gguf_pairs(c->family));
        if (freqs) rope_divisors((float *)(body + at), freqs, c);
        const void *parts[2] = { h.p, body };
        size_t sizes[2] = { h.n, data };
        st = dt_file_write_atomic(path, parts, sizes, 2);
    }
    free(h.p); free(kv.p); free(recs.p); free(body); free(freqs);
    return st;
}
