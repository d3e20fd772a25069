/* The planner on a GPU: a step of the model timed on the device at the job's own batch, width, precision and
 * attention, without building the model. A step is linear in the layers (every block runs the same kernels on the
 * same shapes, and the update and the gradients' norm are linear in the parameters), so the model with one layer and
 * with two, each timed over a few steps, give the rest of the step and a block's share; the memory is the
 * pre-flight's own count (dt_gpu_lm_count) for those two models, which is linear in the layers the same way. */
#include "dtrain/gpu_lm.h"

#include <stdlib.h>

#define WARMUPS 2
#define REPEATS 5

/* The job's model with L layers, seeded, in the job's precision and attention. */
static dt_status small_model(const dt_lm_config *cfg, int L, dt_dtype prec, dt_attn_mode att, dt_program **out) {
    dt_lm_config c = *cfg;
    c.num_layers = L;
    dt_status st = dt_program_create(&c, out);
    if (st) return st;
    dt_program_init_random(*out, 1337);
    dt_program_set_attention(*out, att);
    if (prec != DT_F32 && (st = dt_program_set_precision(*out, prec))) dt_program_destroy(*out), *out = NULL;
    return st;
}

/* The median milliseconds of a training step (forward with the loss, backward, the clipped AdamW update) of p's
 * model at B x T on random tokens. */
static dt_status time_step(dt_gpu *g, dt_program *p, int B, int T, const dt_optim_config *opt, double *ms) {
    dt_gpu_lm *m = NULL;
    int V = dt_program_config(p)->vocab_size, n = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * 2 * (size_t)n);
    dt_status st = tok ? dt_gpu_lm_create(g, p, B, T, &m) : dt_error(DT_ERR_NOMEM, "plan: out of memory");
    uint64_t s = 99;
    for (int i = 0; tok && i < 2 * n; i++) s = s * 6364136223846793005ull + 1442695040888963407ull, tok[i] = (int32_t)((s >> 33) % (uint64_t)V);
    double t[REPEATS];
    for (int i = 0; !st && i < WARMUPS + REPEATS; i++) {
        double t0 = dt_time_now(), norm;
        float loss;
        int skipped;
        st = dt_gpu_lm_forward(m, tok, tok + n, 0, &loss);
        if (!st) st = dt_gpu_lm_backward(m, 1.0f);
        if (!st) st = dt_gpu_lm_step(m, opt, 1e-4f, 1.0f, 0, &norm, &skipped); /* it waits for the device */
        if (i >= WARMUPS) t[i - WARMUPS] = (dt_time_now() - t0) * 1e3;
    }
    if (!st) *ms = dt_median(t, REPEATS);
    dt_gpu_lm_destroy(m);
    free(tok);
    return st;
}

/* The whole model's count from the one- and two-layer models' (lse: 1 for flash attention). */
static dt_status count(dt_gpu *g, const dt_lm_config *cfg, dt_dtype prec, dt_attn_mode att, int B, int T, dt_gpu_plan *out) {
    size_t need[2] = { 0, 0 }, state[2] = { 0, 0 };
    dt_status st = DT_OK;
    for (int L = 1; !st && L <= 2; L++) {
        dt_program *p = NULL;
        st = small_model(cfg, L, prec, att, &p);
        if (!st) st = dt_gpu_lm_count(g, p, B, T, &need[L - 1], &state[L - 1], &out->flash);
        dt_program_destroy(p);
    }
    size_t Lm1 = (size_t)cfg->num_layers - 1;
    out->need = need[0] + Lm1 * (need[1] - need[0]);
    out->state = state[0] + Lm1 * (state[1] - state[0]);
    return st;
}

dt_status dt_gpu_lm_plan(dt_gpu *g, const dt_lm_config *cfg, dt_dtype prec, dt_attn_mode att, int B, int T, const dt_optim_config *opt,
                         dt_gpu_plan *out) {
    *out = (dt_gpu_plan){ 0 };
    size_t total = 0;
    dt_status st = dt_gpu_mem_info(g, &out->free_bytes, &total);
    /* the pre-flight's choice of attention: with auto, flash where the T x T probabilities would not fit and it can */
    dt_attn_mode used = att == DT_ATTN_AUTO ? DT_ATTN_FULL : att;
    if (!st) st = count(g, cfg, prec, used, B, T, out);
    if (!st && att == DT_ATTN_AUTO && out->need > out->free_bytes) {
        dt_gpu_plan flash = *out;
        if (!(st = count(g, cfg, prec, DT_ATTN_BLOCKWISE, B, T, &flash)) && flash.flash) *out = flash, used = DT_ATTN_BLOCKWISE;
    }
    out->fits = !st && out->need <= out->free_bytes;
    double ms[2] = { 0, 0 };
    for (int L = 1; !st && out->fits && L <= 2; L++) {
        dt_program *p = NULL;
        st = small_model(cfg, L, prec, used, &p);
        if (!st) st = time_step(g, p, B, T, opt, &ms[L - 1]);
        dt_program_destroy(p);
    }
    if (!st && out->fits) {
        out->block_ms = ms[1] - ms[0] > 0 ? ms[1] - ms[0] : 0;
        out->rest_ms = ms[0] - out->block_ms;
        out->step_ms = ms[0] + (cfg->num_layers - 1) * out->block_ms;
        out->timed = 1;
    }
    return st;
}
