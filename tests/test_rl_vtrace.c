/* V-trace against RLlib's (fixture from scripts/make_vtrace_fixture.py:
 * ray.rllib's vtrace_torch, DeepMind's recursion) with both truncations
 * biting, and what dtrain adds to it: a row that is not a transition (the
 * reset step of next-step autoreset) splits a column into two that are
 * computed as if apart, and on-policy V-trace is GAE's lambda-1 return. REINFORCE's returns beside it. */
#include "dtrain/rl.h"
#include "fixture_arrays.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void check(int ok, const char *what) {
    if (!ok) { printf("FAIL: %s\n", what); failures++; }
}

static const float *get(const char *name, const char *field, size_t *n) {
    char k[48];
    snprintf(k, sizeof k, "%s.%s", name, field);
    return fx_get(k, n);
}

static void rllib_case(const char *name) {
    size_t TB, nv, n;
    const float *log_rho = get(name, "log_rho", &TB), *rew = get(name, "rewards", &n), *disc = get(name, "discount", &n);
    const float *rho_bar = get(name, "rho_bar", &n), *vs_ref = get(name, "vs", &n), *adv_ref = get(name, "adv", &n);
    const float *values = get(name, "values", &nv);
    int B = (int)(nv - TB), T = (int)(TB / (size_t)B);
    float *vs = malloc(TB * sizeof(float)), *adv = malloc(TB * sizeof(float));
    uint8_t *valid = malloc(TB);
    memset(valid, 1, TB);
    dt_vtrace(T, B, rho_bar[0], 1.0f, log_rho, values, rew, disc, valid, vs, adv);
    double ev = fx_rel_max(vs, vs_ref, TB), ea = fx_rel_max(adv, adv_ref, TB);
    printf("v-trace %s (T %d, B %d, rho_bar %g): vs within %.1e of RLlib's, advantages within %.1e\n", name, T, B, (double)rho_bar[0],
           ev, ea);
    check(ev <= 1e-6 && ea <= 1e-6, "V-trace's targets and advantages are RLlib's");
    free(vs);
    free(adv);
    free(valid);
}

/* A column with a reset row at r: its rows before r are a column of r steps bootstrapped from row r's value (the
 * episode's last observation), the rows after it a column of their own; the reset row gets vs = V and advantage 0. */
static void reset_row_case(void) {
    enum { T = 12, R = 5 };
    float lr[T], rew[T], disc[T], val[T + 1], vs[T], adv[T], vs1[T], adv1[T];
    uint8_t valid[T];
    uint64_t s = 7;
    for (int t = 0; t < T; t++) {
        lr[t] = (float)(dt_rng_double(&s) * 2 - 1);
        rew[t] = (float)(dt_rng_double(&s) * 2 - 1);
        disc[t] = 0.97f;
        valid[t] = t != R;
        val[t] = (float)(dt_rng_double(&s) * 4 - 2);
    }
    val[T] = 0.5f;
    dt_vtrace(T, 1, 1.0f, 1.0f, lr, val, rew, disc, valid, vs, adv);
    dt_vtrace(R, 1, 1.0f, 1.0f, lr, val, rew, disc, valid, vs1, adv1); /* rows 0..R-1, bootstrap val[R] */
    dt_vtrace(T - R - 1, 1, 1.0f, 1.0f, lr + R + 1, val + R + 1, rew + R + 1, disc + R + 1, valid + R + 1, vs1 + R + 1,
              adv1 + R + 1);
    int same = vs[R] == val[R] && adv[R] == 0;
    for (int t = 0; t < T; t++) same &= t == R || (vs[t] == vs1[t] && adv[t] == adv1[t]);
    printf("v-trace over a reset row: the column is two episodes computed apart (%s)\n", same ? "bit for bit" : "they differ");
    check(same, "a reset row cuts V-trace's recursion");
}

/* pi = mu: rho = c = 1, and vs_s is the discounted return to the end of the unroll, bootstrapped there. */
static void on_policy_case(void) {
    enum { T = 16 };
    float lr[T] = { 0 }, rew[T], disc[T], val[T + 1], vs[T], adv[T];
    uint8_t valid[T];
    uint64_t s = 3;
    for (int t = 0; t <= T; t++) val[t] = (float)(dt_rng_double(&s) * 2);
    for (int t = 0; t < T; t++) {
        rew[t] = (float)dt_rng_double(&s);
        disc[t] = t == 9 ? 0 : 0.9f; /* an episode ends at step 9 */
        valid[t] = 1;
    }
    dt_vtrace(T, 1, 1.0f, 1.0f, lr, val, rew, disc, valid, vs, adv);
    double worst = 0, g = val[T];
    for (int t = T - 1; t >= 0; t--) {
        g = rew[t] + (double)disc[t] * g;
        worst = fmax(worst, fabs(vs[t] - g) / fmax(1, fabs(g)));
    }
    printf("v-trace on policy: the lambda-1 return within %.1e\n", worst);
    check(worst <= 1e-6, "on-policy V-trace is the discounted return");
}

/* REINFORCE's returns on a column of three episodes: the tail of one begun before the rollout, a whole one, and the
 * start of one the rollout cuts; only the whole one is used, its returns the discounted sums to its end. */
static void mc_returns_case(void) {
    enum { T = 14 };
    /* rows 0-2: the tail (done at 2); 3: reset; 4-8: whole (done at 8); 9: reset; 10-13: cut */
    float rew[T], ret[T];
    uint8_t done[T] = { 0 }, valid[T], use[T];
    for (int t = 0; t < T; t++) {
        rew[t] = (float)(t + 1);
        valid[t] = t != 3 && t != 9;
    }
    done[2] = done[8] = 1;
    dt_mc_returns(T, 1, 0.5f, rew, done, valid, 0, ret, use);
    int ok = 1;
    for (int t = 0; t < T; t++) {
        double g = 0;
        for (int s = 8; s >= t; s--) g = rew[s] + 0.5 * g;
        ok &= use[t] == (t >= 4 && t <= 8) && (!use[t] || fabs(ret[t] - g) < 1e-6);
    }
    dt_mc_returns(T, 1, 0.5f, rew, done, valid, 1, ret, use); /* the first rollout: row 0 starts an episode */
    ok &= use[0] && use[2] && fabs(ret[0] - (1 + 0.5 * 2 + 0.25 * 3)) < 1e-6 && !use[10];
    printf("reinforce's returns: only whole episodes used, their returns the discounted sums (%s)\n", ok ? "yes" : "no");
    check(ok, "REINFORCE's Monte Carlo returns");
}

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rl/vtrace.bin", argc > 1 ? argv[1] : "tests/fixtures");
    if (fx_load(path)) { printf("FAIL: cannot read %s (scripts/make_vtrace_fixture.py writes it)\n", path); return 1; }
    rllib_case("a");
    rllib_case("b");
    reset_row_case();
    on_policy_case();
    mc_returns_case();
    fx_free();
    printf("%s\n", failures ? "FAILED" : "v-trace: all checks passed");
    return failures != 0;
}
