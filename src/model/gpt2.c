/* GPT-2: token + position embeddings, L pre-LayerNorm blocks (fused qkv, causal attention, projection; MLP 4C
 * with GELU), final LayerNorm, LM head tied to the token embedding. Its sizes live here (presets, parameter
 * counts, FLOPs, the tensor order llm.c's files use); the model itself is the model program with the gpt2 spec
 * (spec_gpt2.c), which dt_gpt2 wraps so that every caller of the GPT-2 interface runs on it. */
#include "dtrain/model.h"
#include "dtrain/program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llm.c's 16 tensors, in its order (ours are its names). */
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
static const char *const llmc_names[DT_GPT2_NTENSORS] = { "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb" };

dt_status dt_gpt2_preset(const char *name, dt_gpt2_config *out) { return dt_lm_preset(name, out); }

dt_status dt_gpt2_config_check(const dt_gpt2_config *c, const char *where) {
    if (c->max_seq_len < 1 || c->vocab_size < 1 || c->num_layers < 1 || c->num_heads < 1 || c->channels < 1)
        return dt_error(DT_ERR_ARG, "%s: sizes must be positive (T %d, V %d, L %d, NH %d, C %d)", where, c->max_seq_len,
                        c->vocab_size, c->num_layers, c->num_heads, c->channels);
    if (c->channels % c->num_heads && (!c->family || c->family == dt_family_find("gpt2")))
        return dt_error(DT_ERR_ARG, "%s: %d channels do not split into %d heads", where, c->channels, c->num_heads);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded vocabulary %d is smaller than the vocabulary %d", where, c->padded_vocab_size,
                        c->vocab_size);
    /* bounds that keep every size computation far from overflowing */
    if ((double)c->padded_vocab_size * c->channels > 1e10 || (double)c->max_seq_len * c->channels > 1e10 ||
        (double)c->num_layers * c->channels * c->channels > 1e11)
        return dt_error(DT_ERR_ARG, "%s: model too large (L %d, C %d, Vp %d, T %d: over 10^11 parameters)", where,
                        c->num_layers, c->channels, c->padded_vocab_size, c->max_seq_len);
    return dt_lm_config_check(c, where); /* the family's own rules (K/V heads, rotary heads) */
}

/* ---- sizes: the model program's own count of a part's parameters (the whole model's, or what tensor-parallel
 * rank 0 of tp holds of units [a, b)) ---- */

/* Units [a, b) as tensor-parallel rank 0 of tp holds them, for counting sizes (no collective ever runs). */
static dt_model_part sizes_part(int a, int b, int tp) {
    static const dt_tp_ops none = { 0 };
    return (dt_model_part){ .ua = a, .ub = b, .tp_size = tp > 1 ? tp : 1, .tp = tp > 1 ? &none : NULL };
}

static size_t part_params(const dt_gpt2_config *cfg, int a, int b, int tp, bool global) {
    dt_model_part part = sizes_part(a, b, tp);
    size_t local = 0, whole = 0;
    if (dt_program_shape_params(cfg, &part, &local, &whole)) return 0;
    return global ? whole : local;
}

size_t dt_gpt2_config_num_params(const dt_gpt2_config *c) { return part_params(c, 0, c->num_layers + 2, 1, true); }
size_t dt_gpt2_part_num_params(const dt_gpt2_config *c, int tp) { return part_params(c, 0, c->num_layers + 2, tp, false); }
size_t dt_gpt2_units_num_params(const dt_gpt2_config *c, int a, int b, int tp) { return part_params(c, a, b, tp, false); }
double dt_gpt2_flops_per_token(const dt_gpt2_config *c, int T) { return dt_program_flops_per_token(c, T); }






int dt_gpt2_cp_position(int r, int n, int Tl, int i) {
    int tc = Tl / 2;
    if (n <= 1) return i;
    return i < tc ? r * tc + i : (2 * n - 1 - r) * tc + i - tc;
}

void dt_gpt2_cp_rows(int32_t *x, int B, int T, int r, int n) {
    int Tl = T / n;
    /* every row's source is at or after it: in place, in order */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++) x[(size_t)b * Tl + i] = x[(size_t)b * T + dt_gpt2_cp_position(r, n, Tl, i)];
}

size_t dt_gpt2_lp_work_floats(const dt_gpt2_config *c, bool head) { return dt_gpt2_part_lp_work_bytes(c, 1, head) / sizeof(float); }

dt_model_part dt_gpt2_whole(const dt_gpt2_config *cfg) { return (dt_model_part){ .ua = 0, .ub = cfg->num_layers + 2, .tp_size = 1 }; }

/* ---- the GPT-2 interface over the model program ---- */

struct dt_gpt2 {
    dt_program *p;
    dt_gpt2_config cfg;
};


dt_status dt_gpt2_create_part(const dt_gpt2_config *cfg, const dt_model_part *part, dt_gpt2 **out) {
    *out = NULL;
    dt_status st = dt_gpt2_config_check(cfg, "model");
    if (st) return st;
    dt_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    dt_lm_config c = *cfg;
    if ((st = dt_program_create_part(&c, part, &m->p))) {
        free(m);
        return st;
    }
    m->cfg = *cfg;
    *out = m;
    return DT_OK;
}

dt_status dt_gpt2_create_units(const dt_gpt2_config *cfg, int a, int b, dt_gpt2 **out) {
    dt_model_part p = dt_gpt2_whole(cfg);
    p.ua = a;
    p.ub = b;
    return dt_gpt2_create_part(cfg, &p, out);
}

dt_status dt_gpt2_create(const dt_gpt2_config *cfg, dt_gpt2 **out) { return dt_gpt2_create_units(cfg, 0, cfg->num_layers + 2, out); }

void dt_gpt2_destroy(dt_gpt2 *m) {
    if (!m) return;
    dt_program_destroy(m->p);
    free(m);
}

dt_program *dt_gpt2_program(dt_gpt2 *m) { return m->p; }
const dt_gpt2_config *dt_gpt2_get_config(const dt_gpt2 *m) { return &m->cfg; }

dt_status dt_gpt2_set_routing(dt_gpt2 *m, const dt_gpt2_config *r) {
    dt_status st = dt_program_set_routing(m->p, r);
    if (!st) m->cfg.experts_top_k = r->experts_top_k, m->cfg.aux_coef = r->aux_coef, m->cfg.capacity_factor = r->capacity_factor;
    if (!st) m->cfg.drop_policy = r->drop_policy;
    return st;
}
size_t dt_gpt2_num_params(const dt_gpt2 *m) { return dt_program_num_params(m->p); }
float *dt_gpt2_params(dt_gpt2 *m) { return dt_program_params(m->p); }
float *dt_gpt2_grads(dt_gpt2 *m) { return dt_program_grads(m->p); }
void dt_gpt2_model(dt_gpt2 *m, dt_model *out) { dt_program_model(m->p, out); }
const dt_tensor_info *dt_gpt2_tensors(const dt_gpt2 *m, int *n) { return dt_program_tensors(m->p, n); }
int dt_gpt2_chunks(const dt_gpt2 *m, int *a, int *b) { return dt_program_chunks(m->p, a, b); }

void dt_gpt2_units(const dt_gpt2 *m, int *a, int *b) {
    int ra[DT_GPT2_MAX_CHUNKS], rb[DT_GPT2_MAX_CHUNKS], n = dt_program_chunks(m->p, ra, rb);
    *a = ra[0];
    *b = rb[n - 1];
}

dt_status dt_gpt2_check_whole(const dt_gpt2 *m, const char *what) {
    int a, b, ra[DT_GPT2_MAX_CHUNKS], rb[DT_GPT2_MAX_CHUNKS];
    dt_gpt2_units(m, &a, &b);
    if (a == 0 && b == m->cfg.num_layers + 2 && dt_program_chunks(m->p, ra, rb) == 1) return DT_OK;
    return dt_error(DT_ERR_ARG, "%s: the model holds units [%d, %d) of 0..%d, not the whole model", what, a, b, m->cfg.num_layers + 1);
}

void dt_gpt2_init_random(dt_gpt2 *m, uint64_t seed) { dt_program_init_random(m->p, seed); }
void dt_gpt2_init_random_range(dt_gpt2 *m, uint64_t seed, size_t lo, size_t hi) { dt_program_init_random_range(m->p, seed, lo, hi); }


dt_status dt_gpt2_copy_slices(const dt_gpt2 *whole, dt_gpt2 *part) {
    if (!dt_lm_config_same(&whole->cfg, &part->cfg) || dt_gpt2_check_whole(whole, "copy slices"))
        return dt_error(DT_ERR_ARG, "model: slices come from a whole model of the same shape");
    dt_model view;
    dt_program_model(part->p, &view);
    dt_model_copy_slices(&view, dt_program_params(part->p), dt_program_params(whole->p));
    return DT_OK;
}

int dt_gpt2_llmc_layers(const dt_gpt2 *m, int i) { return i >= LN1W && i <= FCPROJB ? m->cfg.num_layers : 1; }

const dt_tensor_info *dt_gpt2_llmc_tensor(const dt_gpt2 *m, int i, int l) {
    char name[48];
    if (i < 0 || i >= DT_GPT2_NTENSORS) return NULL;
    if (i >= LN1W && i <= FCPROJB) snprintf(name, sizeof name, "h.%d.%s", l, llmc_names[i]);
    else snprintf(name, sizeof name, "%s", llmc_names[i]);
    int n;
    const dt_tensor_info *tab = dt_program_tensors(m->p, &n);
    for (int k = 0; k < n; k++) /* the first: a last stage's copy of wte comes after the first stage's own */
        if (!strcmp(tab[k].name, name)) return &tab[k];
    return NULL;
}

dt_status dt_gpt2_forward(dt_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    return dt_program_forward(m->p, inputs, targets, B, T, loss);
}
dt_status dt_gpt2_forward_units(dt_gpt2 *m, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets, int B, int T,
                                float *loss) {
    return dt_program_forward_units(m->p, a, b, tokens, x, targets, B, T, loss);
}
dt_status dt_gpt2_backward(dt_gpt2 *m, float grad_scale) { return dt_program_backward(m->p, grad_scale); }
dt_status dt_gpt2_backward_units(dt_gpt2 *m, const float *dout, float grad_scale) { return dt_program_backward_units(m->p, dout, grad_scale); }
dt_status dt_gpt2_backward_weights(dt_gpt2 *m) { return dt_program_backward_weights(m->p); }
dt_status dt_gpt2_set_split_backward(dt_gpt2 *m, int on) { return dt_program_set_split_backward(m->p, on); }
dt_status dt_gpt2_set_recompute(dt_gpt2 *m, int on) { return dt_program_set_recompute(m->p, on); }
void dt_gpt2_set_attention(dt_gpt2 *m, dt_attn_mode mode) { dt_program_set_attention(m->p, mode); }
dt_status dt_gpt2_set_precision(dt_gpt2 *m, dt_dtype t) { return dt_program_set_precision(m->p, t); }
dt_dtype dt_gpt2_precision(const dt_gpt2 *m) { return dt_program_precision(m->p); }
void dt_gpt2_params_changed(dt_gpt2 *m) { dt_program_params_changed(m->p); }
const float *dt_gpt2_logits(const dt_gpt2 *m) { return dt_program_logits(m->p); }
const float *dt_gpt2_output(const dt_gpt2 *m) { return dt_program_output(m->p); }
const float *dt_gpt2_input_grad(const dt_gpt2 *m, const int32_t **tokens, int *n) { return dt_program_input_grad(m->p, tokens, n); }
dt_status dt_gpt2_use_chunk(dt_gpt2 *m, int chunk) { return dt_program_use_chunk(m->p, chunk); }
dt_status dt_gpt2_set_slots(dt_gpt2 *m, int n) { return dt_program_set_slots(m->p, n); }
void dt_gpt2_use_slot(dt_gpt2 *m, int k) { dt_program_use_slot(m->p, k); }
int dt_gpt2_num_slots(const dt_gpt2 *m) { return dt_program_num_slots(m->p); }
dt_status dt_gpt2_reserve(dt_gpt2 *m, int B, int T) { return dt_program_reserve(m->p, B, T); }
void dt_gpt2_zero_grad(dt_gpt2 *m) { dt_program_zero_grad(m->p); }
void dt_gpt2_hold_grad_hooks(dt_gpt2 *m, int on) { dt_program_hold_grad_hooks(m->p, on); }
void dt_gpt2_announce_grads(dt_gpt2 *m) { dt_program_announce_grads(m->p); }
void dt_gpt2_set_grad_hook(dt_gpt2 *m, dt_unit_hook hook, void *ctx) { dt_program_set_grad_hook(m->p, hook, ctx); }
void dt_gpt2_set_unit_hooks(dt_gpt2 *m, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    dt_program_set_unit_hooks(m->p, before_forward, before_backward, ctx);
}
void dt_gpt2_set_defer_wte_rows(dt_gpt2 *m, int on) { dt_program_set_defer_rows(m->p, on); }
void dt_gpt2_set_grad_storage(dt_gpt2 *m, float *grads) { dt_program_set_grad_storage(m->p, grads); }
void dt_gpt2_set_param_storage(dt_gpt2 *m, float *params) { dt_program_set_param_storage(m->p, params); }
double dt_gpt2_tp_comm_seconds(dt_gpt2 *m) { return dt_program_tp_comm_seconds(m->p); }
size_t dt_gpt2_memory(const dt_gpt2 *m) { return dt_program_memory(m->p); }
size_t dt_gpt2_activation_memory(const dt_gpt2 *m) { return dt_program_activation_memory(m->p); }
size_t dt_gpt2_activation_kept(const dt_gpt2 *m) { return dt_program_activation_kept(m->p); }
size_t dt_gpt2_lp_params_bytes(const dt_gpt2 *m) { return dt_program_lp_params_bytes(m->p); }

/* ---- memory without a model: the program's own count ---- */

size_t dt_gpt2_chunks_activation_split(const dt_gpt2_config *cfg, int n, const int *a, const int *b, int tp, int sp, int B, int T,
                                        int recompute, int attention, dt_dtype precision, int split, size_t *area) {
    dt_model_part part = sizes_part(a[0], b[n - 1], tp);
    part.sp = sp;
    part.nchunks = n > 1 ? n : 0;
    for (int k = 0; k < n && n > 1; k++) part.chunk_a[k] = a[k], part.chunk_b[k] = b[k];
    return dt_program_activation_split_bytes(cfg, &part, B, T, recompute, (dt_attn_mode)attention, precision, split, area);
}

size_t dt_gpt2_chunks_activation_bytes(const dt_gpt2_config *cfg, int n, const int *a, const int *b, int tp, int sp, int B, int T,
                                       int recompute, int attention, dt_dtype precision, int split) {
    return dt_gpt2_chunks_activation_split(cfg, n, a, b, tp, sp, B, T, recompute, attention, precision, split, NULL);
}

size_t dt_gpt2_part_activation_bytes(const dt_gpt2_config *c, int tp, int sp, int B, int T, int recompute, int attention, dt_dtype precision) {
    int a = 0, b = c->num_layers + 2;
    return dt_gpt2_chunks_activation_bytes(c, 1, &a, &b, tp, sp, B, T, recompute, attention, precision, 0) +
           (precision != DT_F32 ? dt_gpt2_lp_work_floats(c, true) * sizeof(float) : 0);
}

size_t dt_gpt2_part_lp_work_bytes(const dt_gpt2_config *cfg, int tp, bool head) {
    dt_model_part part = head ? sizes_part(cfg->num_layers + 1, cfg->num_layers + 2, tp) : sizes_part(0, 1, tp);
    return dt_program_lp_work_bytes(cfg, &part);
}

size_t dt_gpt2_activation_bytes(const dt_gpt2_config *c, int B, int T, int recompute, int attention, dt_dtype precision) {
    return dt_gpt2_part_activation_bytes(c, 1, 0, B, T, recompute, attention, precision);
}
