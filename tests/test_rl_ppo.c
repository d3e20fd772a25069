/* PPO: its loss and gradient against CleanRL's under PyTorch's autograd
 * (fixture from scripts/make_ppo_fixture.py), the categorical policy's and
 * the Gaussian's; then, on every rank of a `dtrain launch -n N` job, the
 * learner over N ranks against one process with the same global batch, on
 * CartPole and on Pendulum (continuous, observations and rewards
 * normalised): the policy's weights within 1e-6 (relative), and one
 * process's run again bit for bit. On CartPole within 1e-6 after each of
 * 20 updates: a discrete action does not move with a rounding difference
 * in the weights, so the rollouts stay the same. A continuous action does,
 * and Pendulum's dynamics amplify it (about 2x an update): there the first
 * update, whose rollout is the same on both sides (the learner alone), and
 * the second are held to 1e-6, and the drift after 20 is printed. */
#include "dtrain/comm.h"
#include "dtrain/kernels.h"
#include "dtrain/rl.h"
#include "fixture_arrays.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UPDATES 20

static int failures, rank;

static void check(int ok, const char *what) {
    if (!ok) { printf("FAIL (rank %d): %s\n", rank, what); failures++; }
}

static void loss_case(int clip_vloss) {
    char name[64];
#define FX(s) (snprintf(name, sizeof name, "v%d.%s", clip_vloss, s), fx_get(name, &n))
    size_t n, B;
    const float *values = FX("values");
    B = n;
    const float *logits = FX("logits");
    int K = (int)(n / B);
    const float *actions = FX("actions"), *old_logp = FX("old_logp"), *adv = FX("adv"), *old_v = FX("old_values");
    const float *ret = FX("returns"), *terms = FX("terms"), *dlogits = FX("dlogits"), *dvalues = FX("dvalues");
#undef FX
    dt_rl_config c;
    dt_ppo_defaults(&c);
    c.clip_vloss = clip_vloss;
    float *w = malloc(B * sizeof(float)), *dz = malloc(B * K * sizeof(float)), *dv = malloc(B * sizeof(float));
    for (size_t i = 0; i < B; i++) w[i] = 1.0f / (float)B;
    dt_rl_terms t = { 0 };
    dt_ppo_loss(&c, (int)B, K, NULL, logits, values, actions, old_logp, old_v, adv, ret, w, dz, NULL, dv, &t);
    double got[6] = { t.loss, t.pg, t.v, t.entropy, t.approx_kl, t.clipfrac }, worst = 0;
    for (int i = 0; i < 6; i++) worst = fmax(worst, fabs(got[i] - terms[i]) / fmax(1e-3, fabs(terms[i])));
    double gz = fx_rel_max(dz, dlogits, B * K), gv = fx_rel_max(dv, dvalues, B);
    printf("ppo loss (value clipping %s): loss %.6f (PyTorch %.6f), terms within %.1e, d logits within %.1e, d values %.1e\n",
           clip_vloss ? "on" : "off", t.loss, (double)terms[0], worst, gz, gv);
    check(worst <= 1e-5, "loss, pg, v, entropy, approx_kl and clipfrac are PyTorch's");
    check(gz <= 1e-5 && gv <= 1e-5, "the gradients are autograd's");
    free(w);
    free(dz);
    free(dv);
}

static void gaussian_loss_case(void) {
    size_t n, B, K;
    const float *values = fx_get("g.values", &B), *mean = fx_get("g.mean", &n), *logstd = fx_get("g.logstd", &K);
    const float *actions = fx_get("g.actions", &n), *old_logp = fx_get("g.old_logp", &n), *adv = fx_get("g.adv", &n);
    const float *old_v = fx_get("g.old_values", &n), *ret = fx_get("g.returns", &n), *terms = fx_get("g.terms", &n);
    const float *dmean = fx_get("g.dmean", &n), *dlogstd = fx_get("g.dlogstd", &n), *dvalues = fx_get("g.dvalues", &n);
    dt_rl_config c;
    dt_ppo_defaults(&c); /* ent_coef 0.01, as the fixture's */
    float *w = malloc(B * sizeof(float)), *dz = malloc(B * K * sizeof(float)), *dv = malloc(B * sizeof(float)), dls[8] = { 0 };
    for (size_t i = 0; i < B; i++) w[i] = 1.0f / (float)B;
    dt_rl_terms t = { 0 };
    if (K <= 8) dt_ppo_loss(&c, (int)B, (int)K, logstd, mean, values, actions, old_logp, old_v, adv, ret, w, dz, dls, dv, &t);
    double got[6] = { t.loss, t.pg, t.v, t.entropy, t.approx_kl, t.clipfrac }, worst = 0;
    for (int i = 0; i < 6; i++) worst = fmax(worst, fabs(got[i] - terms[i]) / fmax(1e-3, fabs(terms[i])));
    double gz = fx_rel_max(dz, dmean, B * K), gl = fx_rel_max(dls, dlogstd, K), gv = fx_rel_max(dv, dvalues, B);
    printf("ppo loss (Gaussian, %zu dimensions): loss %.6f (PyTorch %.6f), terms within %.1e, d means within %.1e, d log std %.1e, "
           "d values %.1e\n", K, t.loss, (double)terms[0], worst, gz, gl, gv);
    check(K <= 8 && worst <= 1e-5, "the Gaussian policy's loss terms are PyTorch's");
    check(gz <= 1e-5 && gl <= 1e-5 && gv <= 1e-5, "the Gaussian policy's gradients are autograd's");
    free(w);
    free(dz);
    free(dv);
}

typedef struct { float *p[UPDATES + 1]; double loss[UPDATES + 1], ret[UPDATES + 1]; size_t n; } trail;

static void keep(const dt_rl_result *r, const float *params, size_t n, void *ctx) {
    trail *t = ctx;
    int u = r->updates;
    if (u > UPDATES) return;
    t->loss[u] = r->loss;
    t->ret[u] = r->mean_return;
    t->n = n;
    t->p[u] = malloc(n * sizeof(float));
    memcpy(t->p[u], params, n * sizeof(float));
}

static void run(dt_comm *w, int continuous, trail *t) {
    dt_rl_config c;
    if (continuous) {
        dt_ppo_defaults_continuous(&c); /* smaller: 20 updates of 4 x 64 */
        c.num_steps = 64;
        c.minibatches = 4;
        c.epochs = 2;
    } else dt_ppo_defaults(&c);
    c.num_envs = 4;
    c.total_steps = (int64_t)UPDATES * c.num_envs * c.num_steps;
    c.print_every = 0;
    dt_rl_result r;
    dt_status st = dt_ppo_run(&c, w, keep, t, &r);
    if (st) printf("ppo: %s\n", dt_last_error());
    check(!st && r.updates == UPDATES, "PPO ran its 20 updates");
}

/* The learner over the job's P ranks against one process (and one process against itself). */
static void compare(dt_comm *w, int P, int continuous) {
    int held = continuous ? 2 : UPDATES; /* updates held to 1e-6 (Pendulum's drift: about 1e-8, 2e-8, 1e-7, 2e-7, 3e-7, 2e-6) */
    double drift = 0;
    trail one = { 0 }, again = { 0 }, many = { 0 };
    run(NULL, continuous, &one);
    run(NULL, continuous, &again);
    if (P > 1) run(w, continuous, &many);
    double worst = 0, worst_loss = 0;
    int same = 1, same_returns = 1;
    for (int u = 1; u <= UPDATES && one.p[u] && again.p[u]; u++) {
        same &= !memcmp(one.p[u], again.p[u], one.n * sizeof(float));
        if (P > 1 && many.p[u]) {
            double d = 0, m = 0;
            for (size_t i = 0; i < one.n; i++) {
                d += ((double)many.p[u][i] - one.p[u][i]) * ((double)many.p[u][i] - one.p[u][i]);
                m += (double)one.p[u][i] * one.p[u][i];
            }
            drift = sqrt(d / m);
            if (u > held) continue;
            worst = fmax(worst, drift);
            worst_loss = fmax(worst_loss, fabs(many.loss[u] - one.loss[u]) / fmax(1e-3, fabs(one.loss[u])));
            same_returns &= many.ret[u] == one.ret[u] || (isnan(many.ret[u]) && isnan(one.ret[u])); /* NaN: no episode yet */
        }
    }
    check(same, "one process's run again gives the same weights, bit for bit");
    if (P > 1) {
        if (rank == 0)
            printf("ppo learner (%s) on %d ranks against one process, %d update%s: weights within %.2e (relative), losses within "
                   "%.2e, mean returns %s; after %d: %.2e\n", continuous ? "Pendulum, Gaussian" : "CartPole", P, held,
                   held > 1 ? "s" : "", worst, worst_loss, same_returns ? "the same" : "differ", UPDATES, drift);
        check(worst <= 1e-6, "N ranks' weights within 1e-6 of one process's at every update held");
        check(worst_loss <= 1e-5, "N ranks' losses within 1e-5 of one process's at every update held");
        check(same_returns, "N ranks' episodes are one process's (the same mean returns)");
    }
    for (int u = 0; u <= UPDATES; u++) { free(one.p[u]); free(again.p[u]); free(many.p[u]); }
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    char path[512];
    dt_comm *w = NULL;
    if (dt_comm_init(&w)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    rank = dt_comm_rank(w);
    int P = dt_comm_size(w);
    dt_kernels_set_threads(1);
    snprintf(path, sizeof path, "%s/ppo_loss.bin", dir);
    if (fx_load(path)) { printf("FAIL: cannot read %s\n", path); return 1; }
    if (rank == 0) { loss_case(1); loss_case(0); gaussian_loss_case(); }
    fx_free();
    for (int continuous = 0; continuous <= 1; continuous++) compare(w, P, continuous);
    dt_comm_destroy(w);
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    if (rank == 0) printf("ppo: all checks passed\n");
    return 0;
}
