/* A policy-gradient step with a learned baseline (see pg_step.h). */
#include "pg_step.h"
#include "distribution.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_pg_step_init(dt_pg_step *s, const dt_rl_config *c, dt_policy *pol, dt_engine *e, int od, int ad, int max_rows) {
    int K = dt_policy_outputs(pol);
    *s = (dt_pg_step){ .c = c, .pol = pol, .e = e, .od = od, .ad = ad, .K = K, .continuous = dt_policy_logstd(pol) != NULL,
                       .cap = (max_rows + c->minibatches - 1) / c->minibatches };
    size_t cap = (size_t)s->cap;
    s->perm = malloc(sizeof(int) * (size_t)max_rows);
    s->mb_obs = malloc(sizeof(float) * cap * od);
    s->mb_act = malloc(sizeof(float) * cap * ad);
    s->dlogits = malloc(sizeof(float) * cap * K);
    s->dlogstd = malloc(sizeof(float) * (size_t)K);
    float **m[] = { &s->mb_w, &s->mb_adv, &s->mb_target, &s->dvalues };
    int ok = 1;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) ok &= (*m[i] = malloc(sizeof(float) * cap)) != NULL;
    if (!ok || !s->perm || !s->mb_obs || !s->mb_act || !s->dlogits || !s->dlogstd)
        return dt_error(DT_ERR_NOMEM, "rl: out of memory for minibatches of %d rows", s->cap);
    return DT_OK;
}

void dt_pg_step_free(dt_pg_step *s) {
    void *b[] = { s->perm, s->mb_obs, s->mb_act, s->dlogits, s->dlogstd, s->mb_w, s->mb_adv, s->mb_target, s->dvalues };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
}

/* Minibatch rows idx[0..m): observations, actions, advantages and targets, weights 1 / its valid rows. */
static void prepare(dt_pg_step *s, const int *idx, int m) {
    int valid = 0;
    for (int i = 0; i < m; i++) valid += s->valid[idx[i]];
    for (int i = 0; i < m; i++) {
        int k = idx[i];
        memcpy(s->mb_obs + (size_t)i * s->od, s->recs[k], sizeof(float) * (size_t)s->od);
        memcpy(s->mb_act + (size_t)i * s->ad, s->recs[k] + s->od, sizeof(float) * (size_t)s->ad);
        s->mb_w[i] = s->valid[k] ? 1.0f / (float)valid : 0;
        s->mb_adv[i] = s->adv[k];
        s->mb_target[i] = s->target[k];
    }
    s->rows = m;
}

static dt_status micro(void *ctx, int m, float grad_scale, float *loss) {
    (void)m;
    dt_pg_step *s = ctx;
    const float *z, *v, *ls = dt_policy_logstd(s->pol);
    dt_status st = dt_policy_forward(s->pol, s->mb_obs, s->rows, &z, &v);
    if (st) return st;
    double ent = s->c->ent_coef, vf = s->c->vf_coef, total = 0;
    memset(s->dlogstd, 0, sizeof(float) * (size_t)s->K);
    for (int i = 0; i < s->rows; i++) {
        const float *zi = z + (size_t)i * s->K, *a = s->mb_act + (size_t)i * s->ad;
        float *g = s->dlogits + (size_t)i * s->K;
        double w = (double)s->mb_w[i] * grad_scale, H, A = s->mb_adv[i], dv = v[i] - s->mb_target[i];
        if (w == 0) {
            memset(g, 0, sizeof(float) * (size_t)s->K);
            s->dvalues[i] = 0;
            continue;
        }
        double logp = s->continuous ? dt_rl_gaussian(zi, ls, s->K, a, &H) : dt_rl_categorical(zi, s->K, (int)a[0], &H);
        if (s->continuous) dt_rl_gaussian_grad(zi, ls, s->K, a, w, -A, ent, g, s->dlogstd);
        else dt_rl_categorical_grad(zi, s->K, (int)a[0], logp, H, w, -A, ent, g);
        s->dvalues[i] = (float)(w * vf * dv);
        double wr = s->mb_w[i];
        s->terms.pg += wr * -A * logp;
        s->terms.v += wr * 0.5 * dv * dv;
        s->terms.entropy += wr * H;
        total += wr * (-A * logp + vf * 0.5 * dv * dv - ent * H);
    }
    *loss = (float)total;
    return dt_policy_backward(s->pol, s->dlogits, s->dvalues, s->dlogstd);
}

dt_status dt_pg_step_run(dt_pg_step *s, int M, const float *const *recs, const float *adv, const float *target,
                         const uint8_t *valid, int u, float lr, double *loss) {
    int mbs = s->c->minibatches;
    s->recs = recs;
    s->adv = adv;
    s->target = target;
    s->valid = valid;
    s->terms = (dt_rl_terms){ 0 };
    *loss = 0;
    for (int ep = 0; ep < s->c->epochs; ep++) {
        dt_rng_shuffle(s->perm, M, s->c->seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)u * 64 + (uint64_t)ep + 1) * 0x632be59bd9b4e019ull);
        for (int b = 0; b < mbs; b++) {
            int lo = (int)((int64_t)M * b / mbs), hi = (int)((int64_t)M * (b + 1) / mbs);
            prepare(s, s->perm + lo, hi - lo);
            dt_step_result r;
            dt_status st = dt_engine_step(s->e, 1, lr, micro, s, 0, &r);
            if (st) return st;
            *loss += r.loss;
        }
    }
    double k = (double)s->c->epochs * mbs;
    *loss /= k;
    s->terms = (dt_rl_terms){ .loss = *loss, .pg = s->terms.pg / k, .v = s->terms.v / k, .entropy = s->terms.entropy / k };
    return DT_OK;
}
