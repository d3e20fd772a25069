/* dtrain's environments against Gymnasium's: each episode started from the
 * state Gymnasium's started from, given the same actions, must end at the
 * same steps (terminated, truncated) with observations within float32's
 * rounding of Gymnasium's (counted: how many are bit for bit) and the same
 * rewards. Fixtures from scripts/make_rl_env_fixture.py. Then the running
 * observation and reward normalisation against Gymnasium 0.29's wrappers
 * (scripts/make_rl_norm_fixture.py), and the checks that an environment and
 * a pool refuse what they must. */
#include "dtrain/rl.h"
#include "fixture_arrays.h"
#include "rl/running_norm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXA = 16 };
static struct { char name[32]; int type; size_t n; void *v; } arr[MAXA];
static int narr;
static int failures;

static void check(int ok, const char *what) {
    if (!ok) { printf("FAIL: %s\n", what); failures++; }
}

static int load(const char *path) {
    static const size_t size[3] = { 4, 8, 1 };
    for (int i = 0; i < narr; i++) free(arr[i].v);
    narr = 0;
    FILE *f = fopen(path, "rb");
    char magic[4];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "DTRL", 4)) { if (f) fclose(f); return -1; }
    uint32_t len, n;
    uint8_t t;
    while (narr < MAXA && fread(&len, 4, 1, f) == 1) {
        if (len >= sizeof arr[0].name || fread(arr[narr].name, 1, len, f) != len || fread(&t, 1, 1, f) != 1 || t > 2 ||
            fread(&n, 4, 1, f) != 1) break;
        arr[narr].name[len] = 0;
        arr[narr].type = t;
        arr[narr].n = n;
        arr[narr].v = malloc(n * size[t] + 1);
        if (!arr[narr].v || fread(arr[narr].v, size[t], n, f) != n) break;
        narr++;
    }
    int rest = fgetc(f) != EOF;
    fclose(f);
    return rest ? -1 : 0;
}

static void *get(const char *name, int type, size_t *n) {
    for (int i = 0; i < narr; i++)
        if (!strcmp(arr[i].name, name) && arr[i].type == type) { if (n) *n = arr[i].n; return arr[i].v; }
    printf("FAIL: the fixture has no %s\n", name);
    exit(1);
}

/* float32's rounding: at most one unit in the last place apart */
static int ulps(float a, float b) {
    if (a == b) return 0;
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    if ((x < 0) != (y < 0)) return fabsf(a - b) <= 1e-45f ? 1 : 1 << 30;
    return abs(x - y);
}

static void dynamics(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/rl/%s.dtrl", dir, name);
    if (load(path)) { printf("FAIL: cannot read %s\n", path); failures++; return; }
    dt_env *e;
    if (dt_env_create(name, &e)) { printf("FAIL: %s\n", dt_last_error()); failures++; return; }
    const dt_env_info *in = dt_env_get_info(e);
    size_t nsteps, nstarts;
    const double *start = get("start", 1, &nstarts), *state = get("state", 1, NULL), *reward = get("reward", 1, &nsteps);
    const float *first = get("first_obs", 0, NULL), *action = get("action", 0, NULL), *obs = get("obs", 0, NULL);
    const uint8_t *term = get("terminated", 2, NULL), *trunc = get("truncated", 2, NULL);
    float o[16];
    size_t k = 0, exact = 0, values = 0, flags_differ = 0;
    int worst = 0, worst_first = 0;
    double worst_reward = 0;
    for (size_t t = 0; t < nsteps; t++) {
        if (k < nstarts && (size_t)start[k] == t) {
            dt_env_set_state(e, state + k * in->state_dim, o);
            for (int i = 0; i < in->obs_dim; i++) {
                int u = ulps(o[i], first[k * in->obs_dim + i]);
                if (u > worst_first) worst_first = u;
            }
            k++;
        }
        double r;
        int te, tr;
        if (dt_env_step(e, action + t, o, &r, &te, &tr)) { printf("FAIL: %s step %zu: %s\n", name, t, dt_last_error()); failures++; break; }
        for (int i = 0; i < in->obs_dim; i++, values++) {
            int u = ulps(o[i], obs[t * in->obs_dim + i]);
            exact += u == 0;
            if (u > worst) worst = u;
        }
        double dr = fabs(r - reward[t]) / fmax(1.0, fabs(reward[t]));
        if (dr > worst_reward) worst_reward = dr;
        flags_differ += te != term[t] || tr != trunc[t];
    }
    printf("%-15s %zu steps, %zu episodes: flags differ at %zu steps; observations %zu of %zu bit for bit, worst %d ulp "
           "(first observations %d); rewards within %.1e\n", in->id, nsteps, nstarts, flags_differ, exact, values, worst, worst_first,
           worst_reward);
    check(k == nstarts && flags_differ == 0, "terminated and truncated at Gymnasium's steps");
    check(worst <= 1 && worst_first <= 1, "observations within float32's rounding of Gymnasium's");
    check(worst_reward <= 1e-12, "rewards Gymnasium's");
    dt_env_destroy(e);
}

static void refusals(void) {
    dt_env *e;
    float o[8], a;
    double r;
    int te, tr;
    check(dt_env_create("cartpool", &e) == DT_ERR_ARG && strstr(dt_last_error(), "cartpool") && strstr(dt_last_error(), "CartPole-v1"),
          "an unknown environment is named with the ones there are");
    check(!dt_env_create("CartPole-v1", &e), "Gymnasium's id is taken");
    a = 0;
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG && strstr(dt_last_error(), "reset"), "a step before any reset is refused");
    dt_env_reset(e, 3, o);
    a = 2;
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG && strstr(dt_last_error(), "Discrete(2)"), "action 2 of Discrete(2) is refused");
    a = 0.5f;
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG, "action 0.5 of Discrete(2) is refused");
    a = NAN;
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG, "a NaN action is refused");
    a = 1;
    int steps = 0;
    do check(!dt_env_step(e, &a, o, &r, &te, &tr), "a step in the space"); while (!te && !tr && ++steps < 600);
    check(te && !tr, "pushing right only ends with the pole down");
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG && strstr(dt_last_error(), "ended"), "a step after the end is refused");
    /* the same seed, the same episode; reset() without one goes on */
    float o1[4], o2[4], o3[4];
    dt_env_reset(e, 7, o1);
    dt_env_reset(e, -1, o3);
    dt_env_reset(e, 7, o2);
    check(!memcmp(o1, o2, sizeof o1) && memcmp(o1, o3, sizeof o1), "a seed gives its episode again, no seed a new one");
    for (int i = 0; i < 4; i++) check(fabsf(o1[i]) <= 0.05f, "CartPole starts within 0.05");
    dt_env_destroy(e);
    check(!dt_env_create("pendulum", &e), "pendulum");
    dt_env_reset(e, 1, o);
    a = 2.5f;
    check(dt_env_step(e, &a, o, &r, &te, &tr) == DT_ERR_ARG && strstr(dt_last_error(), "Box(-2, 2)"), "torque 2.5 is refused");
    dt_env_destroy(e);
}

/* A pool resets an ended environment at the next step, ignoring its action; split in two, the same episodes. */
static void pool(void) {
    dt_env_pool *p, *q[2];
    check(!dt_env_pool_create("cartpole", 4, 0, 11, NULL, &p), "a pool of 4");
    check(!dt_env_pool_create("cartpole", 2, 0, 11, NULL, &q[0]) && !dt_env_pool_create("cartpole", 2, 2, 11, NULL, &q[1]), "two pools of 2");
    float o[16], oq[16], a[4], rw[4], rq[4];
    uint8_t te[4], tr[4], rs[4], teq[4], trq[4], rsq[4];
    check(!dt_env_pool_reset(p, o), "reset");
    check(!dt_env_pool_reset(q[0], oq), "reset");
    check(!dt_env_pool_reset(q[1], oq + 8), "reset");
    check(!memcmp(o, oq, sizeof o), "split pools start where one pool does");
    int resets = 0, same = 1, wrong = 0;
    uint8_t was_done[4] = { 0 };
    for (int t = 0; t < 300; t++) {
        for (int i = 0; i < 4; i++) a[i] = (float)((t * 7 + i * 3) % 5 % 2);
        check(!dt_env_pool_step(p, a, o, rw, te, tr, rs), "a pool step");
        check(!dt_env_pool_step(q[0], a, oq, rq, teq, trq, rsq) && !dt_env_pool_step(q[1], a + 2, oq + 8, rq + 2, teq + 2, trq + 2, rsq + 2),
              "split pools' steps");
        same &= !memcmp(o, oq, sizeof o) && !memcmp(rw, rq, sizeof rw) && !memcmp(te, teq, 4) && !memcmp(rs, rsq, 4);
        for (int i = 0; i < 4; i++) {
            wrong += rs[i] != was_done[i] || (rs[i] && (rw[i] != 0 || te[i] || tr[i]));
            resets += rs[i];
            was_done[i] = te[i] || tr[i];
        }
    }
    check(!wrong, "an environment resets exactly at the step after its episode ended, with reward 0 and no flags");
    check(same, "two pools of 2 step as one pool of 4");
    check(resets > 5, "episodes ended and reset");
    dt_episode ep[64];
    int n = dt_env_pool_episodes(p, ep, 64), ordered = 1;
    check(n > 5, "finished episodes counted");
    for (int i = 0; i < n; i++) {
        check(ep[i].ret == ep[i].len && ep[i].env >= 0 && ep[i].env < 4, "CartPole's return is its length");
        if (i) ordered &= ep[i].step > ep[i - 1].step || (ep[i].step == ep[i - 1].step && ep[i].env > ep[i - 1].env);
    }
    check(ordered, "episodes in order of (step, environment)");
    a[0] = 3;
    check(dt_env_pool_step(p, a, o, rw, te, tr, rs) == DT_ERR_ARG && strstr(dt_last_error(), "environment 0"),
          "an action out of the space is refused naming the environment");
    dt_env_pool_destroy(p);
    dt_env_pool_destroy(q[0]);
    dt_env_pool_destroy(q[1]);
}

/* A scripted stream through NormalizeObservation + clip and NormalizeReward + clip: each output as Gymnasium's. */
static void normalisation(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rl/norm.bin", dir);
    if (fx_load(path)) { check(0, "the normalisation fixture reads"); return; }
    size_t n, d3;
    const float *obs = fx_get("obs", &d3), *rew = fx_get("rew", &n), *term = fx_get("term", &n), *reset = fx_get("reset", &n);
    const float *out_obs = fx_get("out_obs", &d3), *out_rew = fx_get("out_rew", &n);
    int dim = (int)(d3 / n), same = 0, rows = 0;
    dt_running_norm on, rn;
    double ret = 0, worst = 0;
    check(!dt_running_norm_init(&on, dim) && !dt_running_norm_init(&rn, 1) && dim <= 8, "the statistics are made");
    for (size_t k = 0; k < n && dim <= 8; k++) {
        float x[8];
        memcpy(x, obs + k * dim, sizeof(float) * (size_t)dim);
        dt_running_norm_obs(&on, x, 1);
        for (int i = 0; i < dim; i++) {
            double want = out_obs[k * dim + i];
            worst = fmax(worst, fabs(x[i] - want) / fmax(1, fabs(want)));
            same += x[i] == out_obs[k * dim + i];
        }
        if (reset[k]) continue;
        float r = dt_running_norm_reward(&rn, &ret, rew[k], term[k] != 0, 0.99);
        worst = fmax(worst, fabs(r - out_rew[k]) / fmax(1, fabs(out_rew[k])));
        same += r == out_rew[k];
        rows++;
    }
    printf("normalisation: %zu observations and %d rewards through Gymnasium 0.29's wrappers: %d of %zu values bit for bit, "
           "the rest within %.1e\n", n, rows, same, d3 + (size_t)rows, worst);
    check(worst <= 1e-6, "normalised observations and rewards are Gymnasium's within 1e-6");
    dt_running_norm_free(&on);
    dt_running_norm_free(&rn);
    fx_free();
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    const char *kinds[] = { "cartpole", "acrobot", "mountaincar", "pendulum" };
    for (int i = 0; i < 4; i++) dynamics(dir, kinds[i]);
    normalisation(dir);
    refusals();
    pool();
    for (int i = 0; i < narr; i++) free(arr[i].v);
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("environments: all checks passed\n");
    return 0;
}
