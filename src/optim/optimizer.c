/* The optimizers. Each update reads the gradient once and writes the
 * parameter once; LAMB and LARS first measure every tensor's norms, since
 * their step size per tensor depends on them. Formulas follow PyTorch where
 * PyTorch has the optimizer (SGD, AdamW) and the papers otherwise; the
 * reference in scripts/make_fixtures.py writes the same ones out in torch. */
#include "dtrain/optim.h"
#include "dtrain/kernels.h"
#include "optim_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct dt_optim {
    dt_optim_config cfg;
    size_t n;
    float *m, *v;         /* first and second moments, or the momentum buffer */
    dt_tensor_span *spans;
    int nspans, ntensors; /* pieces of tensors 0..ntensors-1 (LAMB, LARS) */
    double *sums;         /* 2 per tensor: its sums of squares (dt_optim_step's own) */
    long t;               /* steps taken */
    long tv;              /* of them, the steps that updated AdamW's variance (its bias correction): a step the engine
                           * skips is in neither, whatever 1-bit or 0/1 Adam's plan had it do */
    bool frozen;          /* AdamW's variance frozen, the gradient's place the momentum (1-bit Adam) */
    /* 0/1 Adam (dt_optim_zeroone): this step's mode; a local interval's accumulation u of lr/bc1 m, its weights at
     * the start, the sum of lr/bc1 and the product of the decays */
    int zo_mode;
    float *zo_u, *zo_start;
    double zo_lrs, zo_decay;
    bool zo_keep;         /* this step starts an interval: each chunk keeps its weights before it steps */
    float zo_lr;          /* a local step's lr, counted in the interval once the step runs (a skipped one is not) */
    bool zo_pending;
};

static const char *kind_names[] = { "sgd", "adamw", "lamb", "lars", "soap" };

const char *dt_optim_kind_name(dt_optim_kind k) { return (unsigned)k < 5 ? kind_names[k] : "?"; }

dt_status dt_optim_parse_kind(const char *s, dt_optim_kind *out) {
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, kind_names[i])) { *out = (dt_optim_kind)i; return DT_OK; }
    return dt_error(DT_ERR_ARG, "unknown optimizer '%s' (expected sgd, adamw, lamb, lars or soap)", s);
}

void dt_optim_defaults(dt_optim_kind kind, dt_optim_config *o) {
    *o = (dt_optim_config){ kind, 0.9f, 0.999f, 1e-8f, 0.0f, 0.0f, 0, 0.001f, 10, 10000, -1.0f, 0 };
}

dt_status dt_optim_create(const dt_optim_config *cfg, size_t n, const dt_tensor_span *spans, int nspans, dt_optim **out) {
    *out = NULL;
    if (cfg->kind == DT_OPT_SOAP)
        return dt_error(DT_ERR_ARG, "optimizer: SOAP is a preconditioner (soap.h) over SGD, not an optimizer of its own");
    if ((unsigned)cfg->kind > DT_OPT_SOAP) return dt_error(DT_ERR_ARG, "optimizer: unknown kind %d", (int)cfg->kind);
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return dt_error(DT_ERR_ARG, "optimizer: betas (%g, %g) must be in [0, 1)", cfg->beta1, cfg->beta2);
    if (!(cfg->eps > 0)) return dt_error(DT_ERR_ARG, "optimizer: eps %g must be positive", cfg->eps);
    if (!(cfg->weight_decay >= 0)) return dt_error(DT_ERR_ARG, "optimizer: weight decay %g must be >= 0", cfg->weight_decay);
    if (!(cfg->momentum >= 0 && cfg->momentum < 1)) return dt_error(DT_ERR_ARG, "optimizer: momentum %g must be in [0, 1)", cfg->momentum);
    if (cfg->nesterov && cfg->momentum == 0) return dt_error(DT_ERR_ARG, "optimizer: Nesterov needs a momentum");
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->n = n;
    bool adam = cfg->kind == DT_OPT_ADAMW || cfg->kind == DT_OPT_LAMB;
    /* zero pages the first update faults in: nothing resident before then (a setup that still holds a
     * transient copy of the parameters, ZeRO's before it shares them, does not add the state on top) */
    o->m = dt_alloc_zeroed(n * sizeof(float));
    o->v = adam ? dt_alloc_zeroed(n * sizeof(float)) : NULL;
    if (!o->m || (adam && !o->v)) { dt_optim_destroy(o); return dt_error(DT_ERR_NOMEM, "optimizer: no memory for its state"); }
    if (cfg->kind == DT_OPT_LAMB || cfg->kind == DT_OPT_LARS) {
        /* no spans: one tensor, the whole slice */
        dt_tensor_span whole = { 0, n, 0, 0, 0, 0 };
        if (!spans || nspans < 1) { spans = &whole; nspans = 1; }
        o->spans = malloc(sizeof *o->spans * (size_t)nspans);
        if (!o->spans) { dt_optim_destroy(o); return dt_error(DT_ERR_NOMEM, "optimizer: out of memory"); }
        memcpy(o->spans, spans, sizeof *spans * (size_t)nspans);
        o->nspans = nspans;
        for (int i = 0; i < nspans; i++) {
            if (spans[i].tensor < 0 || spans[i].offset + spans[i].count > n) {
                dt_optim_destroy(o);
                return dt_error(DT_ERR_ARG, "optimizer: span %d (tensor %d, [%zu, +%zu)) is outside the slice of %zu", i, spans[i].tensor,
                                spans[i].offset, spans[i].count, n);
            }
            if (spans[i].tensor + 1 > o->ntensors) o->ntensors = spans[i].tensor + 1;
        }
        if (!(o->sums = malloc(sizeof *o->sums * 2 * (size_t)o->ntensors))) {
            dt_optim_destroy(o);
            return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
        }
    }
    *out = o;
    return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
    if (!o) return;
    dt_free_zeroed(o->m);
    dt_free_zeroed(o->v);
    dt_free_zeroed(o->zo_u);
    dt_free_zeroed(o->zo_start);
    free(o->spans);
    free(o->sums);
    free(o);
}

long dt_optim_steps(const dt_optim *o) { return o->t; }
void dt_optim_set_steps(dt_optim *o, long t) { o->t = o->tv = t; }
long dt_optim_variance_steps(const dt_optim *o) { return o->tv; }
void dt_optim_set_variance_steps(dt_optim *o, long tv) { o->tv = tv; }
float *dt_optim_buffer(dt_optim *o, int i) { return i == 0 ? o->m : i == 1 ? o->v : NULL; }
size_t dt_optim_size(const dt_optim *o) { return o->n; }

size_t dt_optim_state_bytes(const dt_optim *o) {
    return o->n * sizeof(float) * ((o->v ? 2 : 1) + (o->zo_u ? 2 : 0));
}

static double norm2(const float *x, size_t n) {
    double s = 0;
    #pragma omp parallel for simd reduction(+ : s) schedule(static)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

double dt_grad_norm(const float *g, size_t n) { return norm2(g, n); }

enum { CHUNK = 8192 }; /* floats per chunk of the passes below and of the elementwise updates */

double dt_grad_norm_lp(const uint16_t *g, size_t n, dt_dtype t) {
    double s = 0;
    #pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t a = 0; a < n; a += CHUNK) {
        float x[CHUNK];
        size_t k = n - a < CHUNK ? n - a : CHUNK;
        dt_lp_unpack(x, g + a, k, t);
        double part = 0;
        #pragma omp simd reduction(+ : part)
        for (size_t i = 0; i < k; i++) part += (double)x[i] * x[i];
        s += part;
    }
    return sqrt(s);
}

void dt_grad_scale(float *g, size_t n, float f) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= f;
}

double dt_grad_clip(float *g, size_t n, double norm, float max_norm) {
    if (max_norm > 0) {
        double f = max_norm / (norm + 1e-6);
        if (f < 1) dt_grad_scale(g, n, (float)f);
    }
    return norm;
}

/* The elementwise updates (SGD, AdamW) go through [a, b) of the slice in
 * chunks of CHUNK elements, and return the sum of squares of the gradients
 * they read: the norm comes free with the pass. Each chunk's gradients are
 * zeroed after its loop, while they are still in cache: a conditional store
 * inside the loop kept GCC from vectorising it (4x slower). */
typedef struct {
    float b1, b2, eps, step, sbc2, decay; /* AdamW */
    float lr, mu, wd;                     /* SGD */
    bool first, nesterov;
    bool keep;                            /* 0/1 Adam's local step: the weights kept first (an interval's start) */
    bool given;                           /* 1-bit Adam's frozen stage: the gradient's place holds the momentum */
} coef;

/* u, w: 0/1 Adam's local step's accumulation and kept weights (NULL for the others) */
typedef double (*chunk_fn)(const coef *k, float *restrict p, const float *restrict g, float *restrict m,
                           float *restrict v, float *restrict u, float *restrict w, size_t n);

static double adamw_chunk(const coef *k, float *restrict p, const float *restrict g, float *restrict mo,
                          float *restrict vo, float *restrict u, float *restrict w, size_t n) {
    (void)u, (void)w;
    float b1 = k->b1, b2 = k->b2, eps = k->eps, step = k->step, sbc2 = k->sbc2, decay = k->decay;
    double ss = 0;
    #pragma omp simd reduction(+ : ss)
    for (size_t i = 0; i < n; i++) {
        /* torch: p *= 1 - lr wd; m, v updated; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) */
        float gi = g[i];
        ss += (double)gi * gi;
        float m = b1 * mo[i] + (1.0f - b1) * gi;
        float v = b2 * vo[i] + (1.0f - b2) * gi * gi;
        mo[i] = m;
        vo[i] = v;
        p[i] = p[i] * decay - step * m / (sqrtf(v) / sbc2 + eps);
    }
    return ss;
}

/* AdamW's step with v as it is (sbc2 from its updates so far): 1-bit Adam's frozen stage, where g is the momentum
 * itself, averaged over the ranks (k->given); 0/1 Adam's steps between the variance's, the momentum from g; its local
 * steps (u) also add their lr/bc1 m to u, an interval's first keeping the weights it starts from in w. v = 0: the
 * gradient was 0 at every step that updated v (an embedding row no batch used); the momentum there carries the
 * signs' scale, not a gradient: no step (DeepSpeed asks for such a mask, exp_avg_mask). */
static double adamw_kept_v_chunk(const coef *k, float *restrict p, const float *restrict g, float *restrict mo,
                                 float *restrict vo, float *restrict u, float *restrict w, size_t n) {
    float b1 = k->b1, eps = k->eps, step = k->step, sbc2 = k->sbc2, decay = k->decay;
    bool given = k->given;
    if (u && k->keep) memcpy(w, p, n * sizeof *p);
    double ss = 0;
    #pragma omp simd reduction(+ : ss)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        ss += (double)gi * gi;
        float m = given ? gi : b1 * mo[i] + (1.0f - b1) * gi;
        mo[i] = m;
        float d = vo[i] > 0 ? step * m / (sqrtf(vo[i]) / sbc2 + eps) : 0.0f;
        p[i] = p[i] * decay - d;
    }
    if (u)
        for (size_t i = 0; i < n; i++) u[i] += step * mo[i];
    return ss;
}

static double sgd_chunk(const coef *k, float *restrict p, const float *restrict g, float *restrict buf,
                        float *restrict unused, float *restrict u, float *restrict w, size_t n) {
    (void)unused, (void)u, (void)w;
    float lr = k->lr, mu = k->mu, wd = k->wd;
    bool first = k->first, nesterov = k->nesterov;
    double ss = 0;
    #pragma omp simd reduction(+ : ss)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        ss += (double)gi * gi;
        float d = gi + wd * p[i];
        if (mu > 0) {
            /* torch: the buffer starts as the first gradient (no dampening) */
            float m = first ? d : mu * buf[i] + d;
            buf[i] = m;
            d = nesterov ? d + mu * m : m;
        }
        p[i] -= lr * d;
    }
    return ss;
}

/* This step leaves AdamW's variance as it is (1-bit Adam's frozen stage, 0/1 Adam's momentum-only and local steps). */
static bool kept_variance(const dt_optim *o) { return o->frozen || o->zo_mode == DT_ZO_MOMENTUM || o->zo_mode == DT_ZO_LOCAL; }

static chunk_fn chunk_of(const dt_optim *o) {
    return o->cfg.kind != DT_OPT_ADAMW ? sgd_chunk : kept_variance(o) ? adamw_kept_v_chunk : adamw_chunk;
}

/* A step starts: its count, and the variance's where it updates it; a local step of 0/1 Adam counted in its interval now (not where the plan told of it: a step
 * the engine skips never gets here), the interval's weights kept by its first. */
static void step_starts(dt_optim *o) {
    o->t++;
    if (!kept_variance(o)) o->tv++;
    if (!o->zo_pending) return;
    const dt_optim_config *c = &o->cfg;
    o->zo_pending = false;
    o->zo_keep = o->zo_lrs == 0;
    if (o->zo_keep) o->zo_decay = 1;
    o->zo_lrs += o->zo_lr / (1.0f - powf(c->beta1, (float)o->t));
    o->zo_decay *= 1.0f - o->zo_lr * c->weight_decay;
}

static coef coefs(const dt_optim *o, float lr) {
    const dt_optim_config *c = &o->cfg;
    float bc1 = 1.0f - powf(c->beta1, (float)o->t), bc2 = 1.0f - powf(c->beta2, (float)o->tv);
    return (coef){ c->beta1, c->beta2, c->eps, lr / bc1, sqrtf(bc2), 1.0f - lr * c->weight_decay,
                   lr, c->momentum, c->weight_decay, o->t == 1, c->nesterov != 0, o->zo_keep, o->frozen };
}

static bool local(const dt_optim *o) { return o->zo_mode == DT_ZO_LOCAL && o->zo_u; }

/* The state's [a, a + n), p and g at the piece's first parameter and gradient. */
static double elementwise_at(dt_optim *o, float *p, float *g, float lr, size_t a, size_t n, int zero) {
    coef k = coefs(o, lr);
    chunk_fn f = chunk_of(o);
    double ss = 0;
    #pragma omp parallel for reduction(+ : ss) schedule(static)
    for (size_t s = 0; s < n; s += CHUNK) {
        size_t c = n - s < CHUNK ? n - s : CHUNK, i = a + s;
        ss += f(&k, p + s, g + s, o->m + i, o->v ? o->v + i : NULL, local(o) ? o->zo_u + i : NULL, local(o) ? o->zo_start + i : NULL, c);
        if (zero) memset(g + s, 0, c * sizeof *g);
    }
    return ss;
}

static double elementwise(dt_optim *o, float *p, float *g, float lr, size_t a, size_t b, int zero) {
    return elementwise_at(o, p + a, g + a, lr, a, b - a, zero);
}

/* LAMB's first half: the moments, and per tensor |u|^2 (u = m^ / (sqrt(v^) +
 * eps) + wd p) and |p|^2 into sums[2t], sums[2t+1]. */
static double lamb_norms(dt_optim *o, float *p, float *g, double *sums) {
    const dt_optim_config *c = &o->cfg;
    float bc1 = 1.0f - powf(c->beta1, (float)o->t), bc2 = 1.0f - powf(c->beta2, (float)o->t);
    double ss = 0;
    for (int s = 0; s < o->nspans; s++) {
        size_t a = o->spans[s].offset, n = o->spans[s].count;
        double un = 0;
        #pragma omp parallel for reduction(+ : un, ss) schedule(static)
        for (size_t i = a; i < a + n; i++) {
            ss += (double)g[i] * g[i];
            float m = c->beta1 * o->m[i] + (1.0f - c->beta1) * g[i];
            float v = c->beta2 * o->v[i] + (1.0f - c->beta2) * g[i] * g[i];
            o->m[i] = m;
            o->v[i] = v;
            float u = (m / bc1) / (sqrtf(v / bc2) + c->eps) + c->weight_decay * p[i];
            un += (double)u * u;
        }
        double wn = norm2(p + a, n);
        sums[2 * o->spans[s].tensor] += un;
        sums[2 * o->spans[s].tensor + 1] += wn * wn;
    }
    return ss;
}

/* LAMB's second half: p -= lr * (|p| / |u|) * u, the norms the whole tensor's. */
static void lamb_apply(dt_optim *o, float *p, float *g, float lr, const double *sums, int zero) {
    const dt_optim_config *c = &o->cfg;
    float bc1 = 1.0f - powf(c->beta1, (float)o->t), bc2 = 1.0f - powf(c->beta2, (float)o->t);
    for (int s = 0; s < o->nspans; s++) {
        size_t a = o->spans[s].offset, n = o->spans[s].count;
        double un = sqrt(sums[2 * o->spans[s].tensor]), wn = sqrt(sums[2 * o->spans[s].tensor + 1]);
        float trust = wn > 0 && un > 0 ? (float)(wn / un) : 1.0f;
        #pragma omp parallel for schedule(static)
        for (size_t i = a; i < a + n; i++) {
            float u = (o->m[i] / bc1) / (sqrtf(o->v[i] / bc2) + c->eps) + c->weight_decay * p[i];
            p[i] -= lr * trust * u;
            if (zero) g[i] = 0;
        }
    }
}

/* LARS's first half: per tensor |p|^2 and |g|^2. */
static double lars_norms(dt_optim *o, float *p, float *g, double *sums) {
    double ss = 0;
    for (int s = 0; s < o->nspans; s++) {
        size_t a = o->spans[s].offset, n = o->spans[s].count;
        double wn = norm2(p + a, n), gn = norm2(g + a, n);
        ss += gn * gn;
        sums[2 * o->spans[s].tensor] += wn * wn;
        sums[2 * o->spans[s].tensor + 1] += gn * gn;
    }
    return ss;
}

static void lars_apply(dt_optim *o, float *p, float *g, float lr, const double *sums, int zero) {
    const dt_optim_config *c = &o->cfg;
    for (int s = 0; s < o->nspans; s++) {
        size_t a = o->spans[s].offset, n = o->spans[s].count;
        double wn = sqrt(sums[2 * o->spans[s].tensor]), gn = sqrt(sums[2 * o->spans[s].tensor + 1]);
        float local = wn > 0 && gn > 0 ? (float)(c->trust_coef * wn / (gn + c->weight_decay * wn)) : 1.0f;
        #pragma omp parallel for schedule(static)
        for (size_t i = a; i < a + n; i++) {
            float d = g[i] + c->weight_decay * p[i];
            float b = c->momentum * o->m[i] + lr * local * d;
            o->m[i] = b;
            p[i] -= b;
            if (zero) g[i] = 0;
        }
    }
}

size_t dt_optim_nsums(const dt_optim *o) { return o->sums ? 2 * (size_t)o->ntensors : 0; }

double dt_optim_norms(dt_optim *o, float *params, float *grads, double *sums) {
    step_starts(o);
    memset(sums, 0, dt_optim_nsums(o) * sizeof *sums);
    return o->cfg.kind == DT_OPT_LAMB ? lamb_norms(o, params, grads, sums) : lars_norms(o, params, grads, sums);
}

void dt_optim_apply(dt_optim *o, float *params, float *grads, float lr, const double *sums, int zero_grads) {
    if (o->cfg.kind == DT_OPT_LAMB) lamb_apply(o, params, grads, lr, sums, zero_grads);
    else lars_apply(o, params, grads, lr, sums, zero_grads);
}

double dt_optim_step(dt_optim *o, float *params, float *grads, float lr, int zero_grads) {
    if (o->sums) { /* LAMB, LARS: the slice holds whole tensors */
        double ss = dt_optim_norms(o, params, grads, o->sums);
        dt_optim_apply(o, params, grads, lr, o->sums, zero_grads);
        return sqrt(ss);
    }
    step_starts(o);
    return sqrt(elementwise(o, params, grads, lr, 0, o->n, zero_grads));
}

double dt_optim_step_clipped(dt_optim *o, float *params, float *grads, float lr, float max_norm) {
    if (!(max_norm > 0)) return dt_optim_step(o, params, grads, lr, 1);
    double norm = dt_grad_clip(grads, o->n, dt_grad_norm(grads, o->n), max_norm);
    dt_optim_step(o, params, grads, lr, 1);
    return norm;
}

double dt_optim_step_lp(dt_optim *o, float *params, uint16_t *grads, dt_dtype t, float scale, float lr) {
    if (!dt_optim_elementwise(o)) return NAN;
    step_starts(o);
    coef k = coefs(o, lr);
    chunk_fn f = chunk_of(o);
    double ss = 0;
    #pragma omp parallel for reduction(+ : ss) schedule(static)
    for (size_t s = 0; s < o->n; s += CHUNK) {
        float g[CHUNK];
        size_t n = o->n - s < CHUNK ? o->n - s : CHUNK;
        dt_lp_unpack(g, grads + s, n, t);
        if (scale != 1.0f) /* as the f32 path scales its store before the update */
            for (size_t i = 0; i < n; i++) g[i] *= scale;
        ss += f(&k, params + s, g, o->m + s, o->v ? o->v + s : NULL, local(o) ? o->zo_u + s : NULL, local(o) ? o->zo_start + s : NULL, n);
        memset(grads + s, 0, n * sizeof *grads);
    }
    return sqrt(ss);
}

int dt_optim_elementwise(const dt_optim *o) { return o->cfg.kind == DT_OPT_SGD || o->cfg.kind == DT_OPT_ADAMW; }

void dt_optim_begin(dt_optim *o) { step_starts(o); }

void dt_optim_freeze_variance(dt_optim *o, int on) { o->frozen = o->cfg.kind == DT_OPT_ADAMW && on; }

dt_status dt_optim_zeroone(dt_optim *o, int mode, float lr) {
    if (mode && o->cfg.kind != DT_OPT_ADAMW) return dt_error(DT_ERR_ARG, "0/1 Adam: AdamW's, not %s", dt_optim_kind_name(o->cfg.kind));
    o->zo_mode = mode;
    o->zo_keep = false;
    o->zo_pending = false;
    if (mode != DT_ZO_LOCAL) return DT_OK;
    if (!o->zo_u && (!(o->zo_u = dt_alloc_zeroed(o->n * sizeof(float))) || !(o->zo_start = dt_alloc_zeroed(o->n * sizeof(float)))))
        return dt_error(DT_ERR_NOMEM, "0/1 Adam: no memory for its local steps' accumulation (2 x %zu floats)", o->n);
    o->zo_lr = lr, o->zo_pending = true; /* counted when the step starts (step_starts) */
    return DT_OK;
}

float *dt_optim_zeroone_accum(dt_optim *o) { return o->zo_lrs > 0 ? o->zo_u : NULL; }

void dt_optim_zeroone_end(dt_optim *o, float *p) {
    if (!(o->zo_lrs > 0)) return;
    coef k = coefs(o, 0);
    float decay = (float)o->zo_decay, lrs = (float)o->zo_lrs;
    float *u = o->zo_u, *w = o->zo_start, *m = o->m, *v = o->v;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        float d = v[i] > 0 ? u[i] / (sqrtf(v[i]) / k.sbc2 + k.eps) : 0.0f;
        p[i] = w[i] * decay - d;
        m[i] = u[i] / lrs;
        u[i] = 0;
    }
    o->zo_lrs = 0;
    o->zo_decay = 1;
}

double dt_optim_update(dt_optim *o, float *params, float *grads, float lr, size_t off, size_t n, int zero_grads) {
    if (off > o->n || n > o->n - off || !dt_optim_elementwise(o)) return 0;
    return elementwise(o, params, grads, lr, off, off + n, zero_grads);
}

double dt_optim_update_at(dt_optim *o, float *params, float *grads, float lr, size_t off, size_t n, int zero_grads) {
    if (off > o->n || n > o->n - off || !dt_optim_elementwise(o)) return 0;
    return elementwise_at(o, params, grads, lr, off, n, zero_grads);
}

void dt_schedule_defaults(dt_schedule *s) {
    memset(s, 0, sizeof *s);
    s->lr = 3e-4f;
    s->cos_min_ratio = 1e-4f;
}

const char *dt_schedule_name(dt_schedule_kind k) {
    static const char *names[] = { "constant", "cosine", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "linear", "wsd" };
    return k >= DT_SCHED_CONSTANT && k <= DT_SCHED_LAST ? names[k] : "?";
}

const char *dt_decay_type_name(dt_decay_type t) {
    return t == DT_DECAY_LINEAR ? "linear" : t == DT_DECAY_SQRT ? "1-sqrt" : "cosine";
}

/* transformers' get_wsd_schedule factor at step s (its linear warm-up; m its min_lr_ratio) */
static double wsd_factor(const dt_schedule *c, int total, int s) {
    double m = c->lr > 0 ? (double)c->lr_min / c->lr : 0;
    int decay = c->decay > 0 ? c->decay : total / 10, stable = total - c->warmup - decay > 0 ? total - c->warmup - decay : 0;
    if (s < c->warmup) return fmax(0.0, (double)s / c->warmup * (1 - m) + m);
    if (s < c->warmup + stable) return 1;
    if (s >= c->warmup + stable + decay) return m;
    double p = (double)(s - c->warmup - stable) / (decay > 1 ? decay : 1);
    double f = c->decay_type == DT_DECAY_LINEAR ? 1 - p : c->decay_type == DT_DECAY_SQRT ? 1 - sqrt(p) : 0.5 * (1 + cos(M_PI * p));
    return fmax(0.0, f * (1 - m) + m);
}

/* DeepSpeed's warm-up fraction at iteration s (warm-up of at least 2 steps). */
static double ds_gamma(const dt_schedule *c, int s, int warmup) {
    return c->linear_warmup ? (double)s / warmup : log((double)s + 1) / log((double)warmup);
}

float dt_lr_at(const dt_schedule *c, int run_steps, int step) {
    int total = c->total > 0 ? c->total : run_steps;
    int ds_warmup = c->warmup > 2 ? c->warmup : 2;
    switch (c->kind) {
    case DT_SCHED_CONSTANT:
    case DT_SCHED_COSINE: {
        if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
        if (c->kind == DT_SCHED_CONSTANT || total <= c->warmup) return c->lr;
        double progress = (double)(step - c->warmup) / (double)(total - c->warmup);
        if (progress > 1) progress = 1;
        return c->lr_min + (float)(0.5 * (1.0 + cos(M_PI * progress))) * (c->lr - c->lr_min);
    }
    case DT_SCHED_DS_WARMUP:
    case DT_SCHED_DS_WARMUP_DECAY: {
        double g = step < ds_warmup ? ds_gamma(c, step, ds_warmup)
                 : c->kind == DT_SCHED_DS_WARMUP ? 1.0
                 : fmax(0.0, (double)(total - step) / fmax(1.0, (double)(total - ds_warmup)));
        return (float)(c->lr_min + (c->lr - c->lr_min) * g);
    }
    case DT_SCHED_LINEAR:
        if (step < c->warmup) return c->lr * (float)((double)step / c->warmup);
        return c->lr_min + (c->lr - c->lr_min) * (float)fmax(0.0, (double)(total - step) / (total - c->warmup > 1 ? total - c->warmup : 1));
    case DT_SCHED_WSD: return (float)(c->lr * wsd_factor(c, total, step));
    case DT_SCHED_DS_WARMUP_COSINE: {
        double r;
        if (step < ds_warmup) r = c->warmup_min_ratio + (1.0 - c->warmup_min_ratio) * ds_gamma(c, step, ds_warmup);
        else {
            double span = total - ds_warmup > 0 ? total - ds_warmup : 1;
            r = fmax(0.0, c->cos_min_ratio + (1.0 - c->cos_min_ratio) * (1 + cos(M_PI * (step - ds_warmup + 1) / span)) / 2);
        }
        return (float)(c->lr * r);
    }
    }
    return c->lr;
}
