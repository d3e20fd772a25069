/* dtrain's LunarLander (Box2D 2.4) against Gymnasium's (pybox2d, Box2D 2.3).
 * The solvers differ, so trajectories part within steps; what must agree
 * is the game: the distributions of episode lengths and returns under a
 * random policy and under Gymnasium's heuristic controller, the same
 * episodes for the same seeds, by a two-sample Kolmogorov-Smirnov test
 * (fixture from scripts/make_lunar_fixture.py); except the heuristic's
 * episode lengths, which end when the landed craft falls asleep: Box2D
 * 2.4's settles about 8% later, so there the medians must agree within 15%. Then what a LunarLander
 * must refuse, that a seed replays its episode, that a pool of them split
 * over ranks runs the episodes of one pool, that a saved pool restores with its episodes restarted from the
 * saved streams (a Box2D world has no state to copy) and a rollout resumed with them leaves the reset row out, and every
 * kind's film. */
#include "dtrain/rl.h"
#include "fixture_arrays.h"
#include "rl/env_internal.h"
#include "rl/rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void check(int ok, const char *what) {
    if (!ok) { printf("FAIL: %s\n", what); failures++; }
}

/* Gymnasium's heuristic(): point toward the pad, hover lower as it nears, fire to slow the fall. */
static void heuristic(const float *s, int continuous, float *a) {
    double angle_targ = s[0] * 0.5 + s[2] * 1.0;
    angle_targ = angle_targ > 0.4 ? 0.4 : angle_targ < -0.4 ? -0.4 : angle_targ;
    double hover_targ = 0.55 * fabs(s[0]);
    double angle_todo = (angle_targ - s[4]) * 0.5 - s[5] * 1.0, hover_todo = (hover_targ - s[1]) * 0.5 - s[3] * 0.5;
    if (s[6] || s[7]) angle_todo = 0, hover_todo = -s[3] * 0.5;
    if (continuous) {
        double m = hover_todo * 20 - 1, side = -angle_todo * 20;
        a[0] = (float)(m < -1 ? -1 : m > 1 ? 1 : m);
        a[1] = (float)(side < -1 ? -1 : side > 1 ? 1 : side);
        return;
    }
    a[0] = hover_todo > fabs(angle_todo) && hover_todo > 0.05 ? 2 : angle_todo < -0.05 ? 3 : angle_todo > 0.05 ? 1 : 0;
}

/* n episodes from reset(seed 1000 + k), as the fixture's. */
static void play(const char *env, int heur, int n, double *lens, double *rets) {
    dt_env *e;
    if (dt_env_create(env, &e)) { printf("FAIL: %s: %s\n", env, dt_last_error()); exit(1); }
    int cont = dt_env_get_info(e)->actions == 0;
    uint64_t rng = 0x1234;
    for (int k = 0; k < n; k++) {
        float o[8], a[2];
        double ret = 0, r;
        int len = 0, te = 0, tr = 0;
        dt_env_reset(e, 1000 + k, o);
        while (!te && !tr) {
            if (heur) heuristic(o, cont, a);
            else if (cont) for (int i = 0; i < 2; i++) a[i] = (float)(2.0 * dt_rng_double(&rng) - 1);
            else a[0] = (float)(dt_rng_next(&rng) % 4);
            if (dt_env_step(e, a, o, &r, &te, &tr)) { printf("FAIL: %s: %s\n", env, dt_last_error()); exit(1); }
            ret += r;
            len++;
        }
        lens[k] = len, rets[k] = ret;
    }
    dt_env_destroy(e);
}

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

/* The two-sample Kolmogorov-Smirnov statistic D and its asymptotic p-value (Numerical Recipes' probks, with
 * Stephens' correction for the effective sample size). */
static double ks(double *a, int n, double *b, int m, double *pvalue) {
    qsort(a, (size_t)n, sizeof *a, cmp);
    qsort(b, (size_t)m, sizeof *b, cmp);
    double d = 0;
    for (int i = 0, j = 0; i < n && j < m;) {
        double x = a[i] <= b[j] ? a[i] : b[j];
        while (i < n && a[i] <= x) i++;
        while (j < m && b[j] <= x) j++;
        double gap = fabs((double)i / n - (double)j / m);
        if (gap > d) d = gap;
    }
    double ne = (double)n * m / (n + m), lambda = (sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) * d, p = 0;
    for (int k = 1; k <= 100; k++) p += 2 * (k % 2 ? 1 : -1) * exp(-2.0 * k * k * lambda * lambda);
    *pvalue = lambda < 0.2 ? 1 : p < 0 ? 0 : p > 1 ? 1 : p;
    return d;
}

static void moments(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = sqrt(q / n);
}

/* Length and return distributions against Gymnasium's: the KS test must not reject them at 1%. */
static void against_gymnasium(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rl/lunar_lander.bin", dir);
    if (fx_load(path)) { printf("FAIL: cannot read %s\n", path); exit(1); }
    const char *kinds[2][2] = { { "discrete", "lunarlander" }, { "continuous", "lunarlander-continuous" } };
    printf("%-24s %-9s %6s %24s %24s %6s %7s\n", "environment", "policy", "", "gymnasium: mean +- sd, median", "dtrain: mean +- sd, median",
           "KS D", "p");
    for (int k = 0; k < 2; k++)
        for (int h = 0; h < 2; h++) {
            char name[64];
            size_t n;
            snprintf(name, sizeof name, "%s_%s_len", kinds[k][0], h ? "heuristic" : "random");
            const float *glen = fx_get(name, &n);
            snprintf(name, sizeof name, "%s_%s_ret", kinds[k][0], h ? "heuristic" : "random");
            const float *gret = fx_get(name, NULL);
            double *ours[2] = { malloc(n * sizeof(double)), malloc(n * sizeof(double)) }, *theirs[2] = { malloc(n * sizeof(double)), malloc(n * sizeof(double)) };
            play(kinds[k][1], h, (int)n, ours[0], ours[1]);
            for (size_t i = 0; i < n; i++) theirs[0][i] = glen[i], theirs[1][i] = gret[i];
            for (int w = 0; w < 2; w++) {
                double gm, gs, dm, ds, p;
                moments(theirs[w], (int)n, &gm, &gs);
                moments(ours[w], (int)n, &dm, &ds);
                double d = ks(ours[w], (int)n, theirs[w], (int)n, &p); /* sorts both */
                double gmed = theirs[w][n / 2], dmed = ours[w][n / 2];
                printf("%-24s %-9s %6s %8.1f +- %5.1f %6.0f %8.1f +- %5.1f %6.0f %6.3f %7.4f\n", kinds[k][1], h ? "heuristic" : "random",
                       w ? "return" : "length", gm, gs, gmed, dm, ds, dmed, d, p);
                char what[200];
                if (h && !w) { /* Box2D 2.4's lander comes to rest (the episode's end) later: the medians, not the shapes */
                    snprintf(what, sizeof what, "%s, heuristic policy: median length %.0f, Gymnasium's %.0f (more than 15%% apart)",
                             kinds[k][1], dmed, gmed);
                    check(fabs(dmed - gmed) <= 0.15 * gmed, what);
                } else {
                    snprintf(what, sizeof what, "%s, %s policy: the %s distributions differ (KS p %.2g < 0.01)", kinds[k][1],
                             h ? "heuristic" : "random", w ? "return" : "length", p);
                    check(p >= 0.01, what);
                }
                free(ours[w]);
                free(theirs[w]);
            }
        }
    fx_free();
}

/* What it refuses; that a seed replays its episode bit for bit; that the heuristic lands. */
static void contract(void) {
    dt_env *e = NULL, *c = NULL;
    float o[8], o2[8], a[2] = { 4, 0 };
    double r, state[8] = { 0 };
    int te, tr;
    check(!dt_env_create("LunarLander-v3", &e) && !dt_env_create("lunarlander-continuous", &c), "both landers are made by name and id");
    if (!e || !c) {
        dt_env_destroy(e), dt_env_destroy(c);
        return;
    }
    dt_env_reset(e, 5, o);
    check(dt_env_step(e, a, o, &r, &te, &tr) != DT_OK && strstr(dt_last_error(), "Discrete(4)"), "action 4 is refused naming the space");
    a[0] = 0.5f;
    check(dt_env_step(e, a, o, &r, &te, &tr) != DT_OK, "action 0.5 of a discrete lander is refused");
    dt_env_reset(c, 5, o);
    a[0] = 0, a[1] = 1.5f;
    check(dt_env_step(c, a, o, &r, &te, &tr) != DT_OK && strstr(dt_last_error(), "component 1"), "a continuous action outside [-1, 1] is refused");
    check(dt_env_set_state(e, state, o) != DT_OK && strstr(dt_last_error(), "LunarLander-v3"), "set_state is refused for a physics world");
    /* the same seed, the same actions: the same observations, bit for bit */
    float first[8];
    double ret[2] = { 0, 0 };
    for (int pass = 0; pass < 2; pass++) {
        dt_env_reset(e, 42, pass ? o2 : first);
        te = tr = 0;
        uint64_t rng = 7;
        for (int t = 0; !te && !tr; t++) {
            a[0] = (float)(dt_rng_next(&rng) % 4);
            if (dt_env_step(e, a, pass ? o2 : o, &r, &te, &tr)) break;
            ret[pass] += r;
        }
    }
    dt_env_reset(e, 42, o);
    check(!memcmp(o, first, sizeof o) && ret[0] == ret[1], "reset(seed) replays the episode exactly");
    dt_env_reset(e, 43, o2);
    check(memcmp(o, o2, sizeof o) != 0, "another seed, another start");
    dt_env_destroy(e);
    dt_env_destroy(c);
}

/* A pool of 4 landers equals two pools of 2 (ranks 0 and 1's shares): the same observations and episodes. */
static void pool_split(void) {
    dt_env_pool *p, *q[2];
    check(!dt_env_pool_create("lunarlander", 4, 0, 9, NULL, &p) && !dt_env_pool_create("lunarlander", 2, 0, 9, NULL, &q[0]) &&
              !dt_env_pool_create("lunarlander", 2, 2, 9, NULL, &q[1]),
          "pools of landers");
    float o[32], oq[32], act[4], rw[4], rq[4];
    uint8_t te[4], tr[4], tq[4], trq[4];
    check(!dt_env_pool_reset(p, o), "reset");
    check(!dt_env_pool_reset(q[0], oq), "reset");
    check(!dt_env_pool_reset(q[1], oq + 16), "reset");
    int same = !memcmp(o, oq, sizeof o);
    uint64_t rng = 3;
    for (int t = 0; t < 600 && same; t++) {
        for (int i = 0; i < 4; i++) act[i] = (float)(dt_rng_next(&rng) % 4);
        dt_env_pool_step(p, act, o, rw, te, tr, NULL);
        dt_env_pool_step(q[0], act, oq, rq, tq, trq, NULL);
        dt_env_pool_step(q[1], act + 2, oq + 16, rq + 2, tq + 2, trq + 2, NULL);
        same = !memcmp(o, oq, sizeof o) && !memcmp(rw, rq, sizeof rw) && !memcmp(te, tq, sizeof te);
    }
    dt_episode ep[64];
    int n = dt_env_pool_episodes(p, ep, 64);
    check(same && n > 8, "a pool of 4 landers split over two ranks steps as one");
    dt_env_pool_destroy(p);
    dt_env_pool_destroy(q[0]);
    dt_env_pool_destroy(q[1]);
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p++) n++;
    return n;
}

/* Films: every kind draws; what moves is animated with a value a frame, what does not is drawn once. */
static void films(void) {
    const char *names[] = { "cartpole", "acrobot", "mountaincar", "pendulum", "lunarlander", "lunarlander-continuous" };
    const int moving[] = { 3, 1, 1, 1, 3, 3 }; /* cart, pole, axle; the links; the car; the rod; the craft and its legs */
    for (int k = 0; k < 6; k++) {
        dt_env *e;
        dt_env_film *f;
        float o[8], a[2] = { 0, 0 };
        double r;
        int te = 0, tr = 0, t = 0;
        if (dt_env_create(names[k], &e) || dt_env_film_create(e, 40, &f)) { printf("FAIL: film of %s: %s\n", names[k], dt_last_error()); failures++; continue; }
        check(dt_env_film_add(f, e) != DT_OK, "a frame before the first reset is refused");
        dt_env_reset(e, 1, o);
        dt_env_film_add(f, e);
        for (; t < 60 && !te && !tr; t++) { /* past the cap: later frames are dropped */
            a[0] = dt_env_get_info(e)->actions ? (float)(t % 2) : (float)(t % 3 - 1) * 0.9f;
            if (dt_env_step(e, a, o, &r, &te, &tr)) break;
            dt_env_film_add(f, e);
        }
        char *svg = NULL, what[160];
        size_t len;
        int frames = dt_env_film_frames(f);
        dt_status st = dt_env_film_svg(f, "a <title> & more", &svg, &len);
        snprintf(what, sizeof what, "film of %s: %d frames, %d moving shapes (want %d), a value a frame, the title escaped", names[k],
                 frames, svg ? count(svg, "<animate") : -1, moving[k]);
        check(!st && frames == (t + 1 < 40 ? t + 1 : 40) && !strncmp(svg, "<svg", 4) && count(svg, "<animate") == moving[k] &&
                  count(svg, ";") == moving[k] * (frames - 1) + 3 /* the title's escapes */ && strstr(svg, "a &lt;title&gt; &amp; more"),
              what);
        free(svg);
        dt_env_film_destroy(f);
        dt_env_destroy(e);
    }
}

/* Two landers saved mid-episode and restored into two other pools: each restarts (its next step a reset, no reward, the
 * interrupted episode not counted), its new episode the one a lander given the saved stream resets to, both pools alike. */
static void restart(void) {
    dt_env_pool *p, *a, *b;
    check(!dt_env_pool_create("lunarlander", 2, 0, 9, NULL, &p) && !dt_env_pool_create("lunarlander", 2, 0, 5, NULL, &a) &&
              !dt_env_pool_create("lunarlander", 2, 0, 7, NULL, &b),
          "pools of landers");
    float o[16], oa[16], ob[16], act[2] = { 2, 2 }, rw[2];
    uint8_t te[2], tr[2], rs[2] = { 0, 0 };
    double rec[2][DT_ENV_POOL_RECORD];
    check(!dt_env_pool_reset(p, o) && !dt_env_pool_reset(a, oa) && !dt_env_pool_reset(b, ob), "reset");
    for (int t = 0; t < 20; t++) dt_env_pool_step(p, act, o, rw, te, tr, NULL); /* firing the main engine: in flight */
    dt_episode ep[4];
    dt_env_pool_episodes(p, ep, 4);
    int ok = dt_env_pool_restarts(p);
    for (int i = 0; i < 2; i++) ok = ok && !dt_env_pool_record(p, i, rec[i]) && !dt_env_pool_restore(a, i, rec[i]) && !dt_env_pool_restore(b, i, rec[i]);
    check(ok, "landers record and restore (restarting)");
    check(!dt_env_pool_step(a, act, oa, rw, te, tr, rs) && rs[0] && rs[1] && rw[0] == 0 && rw[1] == 0,
          "a restored lander's next step is a reset, without reward");
    check(!dt_env_pool_step(b, act, ob, rw, te, tr, NULL) && !memcmp(oa, ob, sizeof oa), "two restores of one record restart alike");
    check(dt_env_pool_episodes(a, ep, 4) == 0, "the interrupted episodes are not counted");
    dt_env *e;
    float oe[8];
    double r;
    int term, trunc;
    check(!dt_env_create("lunarlander", &e) && !dt_env_restore(e, rec[1]), "a lander restores alone");
    check(dt_env_step(e, act, oe, &r, &term, &trunc) != DT_OK, "a restored lander refuses a step before its reset");
    dt_env_reset(e, -1, oe); /* the pool's reset: the environment's own stream */
    check(!memcmp(oe, oa + 8, sizeof oe), "the restarted episode is the one the saved stream resets to");
    dt_env_destroy(e);
    dt_env_pool_destroy(p);
    dt_env_pool_destroy(a);
    dt_env_pool_destroy(b);
}

/* A rollout resumed from its record: on LunarLander, whose episodes restart, the first row is the reset's (not valid, no
 * reward) and the next one is a transition again; on CartPole, whose state is copied, the first row goes on (valid), as
 * the uninterrupted rollout's does. What PPO's --resume trains on. */
static void rollout_resumed(const char *env, int restarts) {
    dt_rl_config c = { .seed = 3, .gamma = 0.99f };
    dt_env_pool *p, *a;
    dt_policy *pol;
    dt_rollout r, q;
    int od = restarts ? 8 : 4, K = restarts ? 4 : 2, T = 6;
    size_t len = dt_rollout_rec_len(od, 1);
    float rec[2][(6 + 1) * 2 * (8 + 1 + DT_RL_NFIELDS)];
    int ok = !dt_env_pool_create(env, 2, 0, 9, NULL, &p) && !dt_env_pool_create(env, 2, 0, 5, NULL, &a) &&
             !dt_policy_create(od, K, 0, 16, 1, &pol) && !dt_rollout_init(&r, &c, p, pol, 0, T) && !dt_rollout_init(&q, &c, a, pol, 0, T);
    ok = ok && !dt_rollout_run(&r, 0, rec[0]);
    double saved[64];
    for (int j = 0; j < 2 && ok; j++) {
        double er[DT_ENV_POOL_RECORD];
        dt_rollout_record(&r, j, saved);
        ok = !dt_env_pool_record(p, j, er) && !dt_env_pool_restore(a, j, er) && !dt_rollout_restore(&q, j, saved);
    }
    ok = ok && !dt_rollout_run(&r, T, rec[0]) && !dt_rollout_run(&q, T, rec[1]);
    char what[160];
    snprintf(what, sizeof what, "%s: a rollout saved and restored runs", env);
    check(ok, what);
    for (int j = 0; j < 2 && ok; j++) {
        const float *f0 = rec[1] + (size_t)j * len + od + 1, *f1 = rec[1] + ((size_t)2 + j) * len + od + 1;
        const float *g0 = rec[0] + (size_t)j * len + od + 1;
        snprintf(what, sizeof what, "%s, environment %d: the resumed rollout's first row %s", env, j,
                 restarts ? "is the restart's reset (not valid, no reward)" : "goes on as the uninterrupted one's");
        check(restarts ? f0[DT_RL_VALID] == 0 && f0[DT_RL_REW] == 0 : f0[DT_RL_VALID] == 1 && !memcmp(f0, g0, sizeof(float) * DT_RL_NFIELDS), what);
        snprintf(what, sizeof what, "%s, environment %d: its second row is a transition", env, j);
        check(f1[DT_RL_VALID] == 1, what);
    }
    dt_rollout_free(&r);
    dt_rollout_free(&q);
    dt_policy_destroy(pol);
    dt_env_pool_destroy(p);
    dt_env_pool_destroy(a);
}

int main(int argc, char **argv) {
    if (argc < 2) { printf("usage: test_rl_lunar FIXTURE_DIR\n"); return 2; }
    against_gymnasium(argv[1]);
    contract();
    pool_split();
    restart();
    rollout_resumed("lunarlander", 1);
    rollout_resumed("cartpole", 0);
    films();
    if (failures) { printf("%d failed\n", failures); return 1; }
    printf("ok: LunarLander's episodes are Gymnasium's by distribution, it refuses what it must, seeds replay, pools split and restart; films\n");
    return 0;
}
