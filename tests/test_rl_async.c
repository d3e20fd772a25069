/* The asynchronous env pool against the synchronous one (CartPole, MountainCar, Pendulum, LunarLander's Box2D
 * worlds): 7 environments stepped by 3 threads and received 3 at a time, each environment given the actions it gets in the synchronous pool (a function of the environment and its
 * step), must give each environment's every observation, reward and flag bit for bit as the synchronous pool does,
 * and the same finished episodes; then what it must refuse (without stepping anything, and without waiting forever). */
#include "dtrain/rl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 7, S = 400, THREADS = 3, BATCH = 3, MAXO = 8 };

static int failures;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL:", what);
    failures += !ok;
}

/* Environment i's action at its step k: the same in both pools. */
static void action(const dt_env_info *in, int i, int k, float *a) {
    uint64_t s = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ (uint64_t)k * 0xd1b54a32d192ed03ull;
    for (int d = 0; d < in->act_dim; d++) {
        uint64_t x = dt_rng_next(&s);
        float lo = dt_env_act_low(in, d), hi = dt_env_act_high(in, d);
        a[d] = in->actions ? (float)(x % (uint64_t)in->actions) : lo + (hi - lo) * (float)(x >> 40) / 16777216.0f;
    }
}

typedef struct { float obs[MAXO], rew; uint8_t te, tr, rs; } row;

static int by_env_step(const void *a, const void *b) {
    const dt_episode *x = a, *y = b;
    return x->env != y->env ? x->env - y->env : (x->step > y->step) - (x->step < y->step);
}

/* The synchronous pool's rows: ref[k][i], k 0 the reset's; its episodes. */
static int sync_run(const char *env, row (*ref)[N], dt_episode *eps, int cap) {
    dt_env_pool *p;
    if (dt_env_pool_create(env, N, 0, 11, NULL, &p)) return -1;
    const dt_env_info *in = dt_env_pool_info(p);
    float obs[N * MAXO], a[N * 4], r[N];
    uint8_t te[N], tr[N], rs[N];
    dt_env_pool_reset(p, obs);
    for (int i = 0; i < N; i++) {
        memcpy(ref[0][i].obs, obs + i * in->obs_dim, sizeof(float) * (size_t)in->obs_dim);
        ref[0][i].rew = 0, ref[0][i].te = ref[0][i].tr = 0, ref[0][i].rs = 1;
    }
    for (int k = 0; k < S; k++) {
        for (int i = 0; i < N; i++) action(in, i, k, a + i * in->act_dim);
        if (dt_env_pool_step(p, a, obs, r, te, tr, rs)) { dt_env_pool_destroy(p); return -1; }
        for (int i = 0; i < N; i++) {
            row *x = &ref[k + 1][i];
            memcpy(x->obs, obs + i * in->obs_dim, sizeof(float) * (size_t)in->obs_dim);
            x->rew = r[i], x->te = te[i], x->tr = tr[i], x->rs = rs[i];
        }
    }
    int n = dt_env_pool_episodes(p, eps, cap);
    dt_env_pool_destroy(p);
    return n;
}

static void against_sync(const char *env) {
    static row ref[S + 1][N];
    dt_episode sync_eps[512], async_eps[512];
    int nsync = sync_run(env, ref, sync_eps, 512), nasync = 0;
    dt_env_pool_async *p;
    char what[200];
    snprintf(what, sizeof what, "%s: the synchronous pool runs and an asynchronous one is made", env);
    int made = nsync >= 0 && !dt_env_pool_async_create(env, N, 0, 11, THREADS, BATCH, &p);
    check(made, what);
    if (!made) return;
    const dt_env_info *in = dt_env_pool_async_info(p);
    int got[N] = { 0 }, ids[BATCH], mismatches = 0, spread = 0, done = 0;
    float obs[BATCH * MAXO], r[BATCH], a[BATCH * 4];
    uint8_t te[BATCH], tr[BATCH], rs[BATCH];
    dt_status st = dt_env_pool_async_reset(p);
    while (!st && done < N) {
        if ((st = dt_env_pool_async_recv(p, ids, obs, r, te, tr, rs))) break;
        for (int j = 0; j < BATCH; j++) {
            int i = ids[j], k = got[i]++;
            const row *x = k <= S ? &ref[k][i] : NULL;
            if (x && (memcmp(x->obs, obs + j * in->obs_dim, sizeof(float) * (size_t)in->obs_dim) || x->rew != r[j] || x->te != te[j] ||
                           x->tr != tr[j] || x->rs != rs[j]))
                mismatches++;
            done += k == S;
            action(in, i, k, a + j * in->act_dim); /* on past S too: the others need the batches filled */
        }
        int lo = S, hi = 0;
        for (int i = 0; i < N; i++) lo = got[i] < lo ? got[i] : lo, hi = got[i] > hi ? got[i] : hi;
        spread = hi - lo > spread ? hi - lo : spread;
        nasync += dt_env_pool_async_episodes(p, async_eps + nasync, 512 - nasync);
        st = dt_env_pool_async_send(p, a, ids, BATCH);
    }
    snprintf(what, sizeof what, "%s: %d environments, %d threads, batches of %d: every environment's %d steps as the synchronous "
             "pool's, bit for bit (%d rows differ; environments up to %d steps apart)", env, N, THREADS, BATCH, S, mismatches, spread);
    check(!st && mismatches == 0 && spread >= 1, what);
    if (st) printf("  (%s)\n", dt_last_error());
    /* the episodes that ended within the compared steps, in the synchronous pool's order */
    int kept = 0;
    for (int e = 0; e < nasync; e++)
        if (async_eps[e].step < S) async_eps[kept++] = async_eps[e];
    qsort(sync_eps, (size_t)nsync, sizeof *sync_eps, by_env_step);
    qsort(async_eps, (size_t)kept, sizeof *async_eps, by_env_step);
    int same = kept == nsync;
    for (int e = 0; e < nsync && same; e++)
        same = sync_eps[e].env == async_eps[e].env && sync_eps[e].step == async_eps[e].step && sync_eps[e].len == async_eps[e].len &&
               sync_eps[e].ret == async_eps[e].ret;
    snprintf(what, sizeof what, "%s: the same %d finished episodes (environment, step, length, return) as the synchronous pool (%d)",
             env, kept, nsync);
    check(same, what);
    for (int e = 0; e < nsync && e < kept && !same; e++)
        if (sync_eps[e].env != async_eps[e].env || sync_eps[e].step != async_eps[e].step || sync_eps[e].len != async_eps[e].len)
            printf("  episode %d: environment %d step %lld length %d, against %d %lld %d\n", e, sync_eps[e].env, (long long)sync_eps[e].step,
                   sync_eps[e].len, async_eps[e].env, (long long)async_eps[e].step, async_eps[e].len), same = 1;
    dt_env_pool_async_destroy(p); /* with environments still stepping */
}

static void refusals(void) {
    dt_env_pool_async *p;
    check(dt_env_pool_async_create("gym:CartPole-v1", 4, 0, 1, 2, 2, &p) == DT_ERR_UNSUPPORTED, "a bridged environment is refused by name");
    check(dt_env_pool_async_create("cartpole", 4, 0, 1, 2, 5, &p) == DT_ERR_ARG, "batches larger than the pool are refused");
    check(dt_env_pool_async_create("cartpole", 4, 0, 1, 0, 2, &p) == DT_ERR_ARG, "no threads is refused");
    if (dt_env_pool_async_create("cartpole", 4, 0, 1, 2, 2, &p)) { check(0, "a pool of 4 cartpoles"); return; }
    int ids[2];
    float obs[8], r[2], a[2] = { 0, 1 }, bad[2] = { 0, 5 };
    uint8_t te[2], tr[2];
    check(dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL) == DT_ERR_ARG, "a receive before any environment steps is refused, not waited on");
    check(!dt_env_pool_async_reset(p) && !dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL), "reset, then a batch of 2 received");
    int other[2] = { 0, 1 };
    for (int i = 0; i < 4; i++) other[0] = i != ids[0] && i != ids[1] ? i : other[0];
    other[1] = ids[0];
    check(dt_env_pool_async_send(p, a, other, 2) == DT_ERR_ARG, "an action for an environment still stepping is refused");
    int twice[2] = { ids[0], ids[0] }, outside[2] = { ids[0], 9 };
    check(dt_env_pool_async_send(p, a, twice, 2) == DT_ERR_ARG, "two actions for one environment in a send are refused");
    check(dt_env_pool_async_send(p, a, outside, 2) == DT_ERR_ARG, "an environment outside the pool is refused");
    check(dt_env_pool_async_reset(p) == DT_ERR_ARG, "a reset while environments step is refused");
    check(dt_env_pool_async_send(p, bad, ids, 2) == DT_ERR_ARG, "an action outside the space is refused");
    check(!dt_env_pool_async_send(p, a, ids, 2), "and nothing of that send was taken: the same environments are sent again");
    check(!dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL) && !dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL),
          "the other environments' resets and these steps received");
    check(dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL) == DT_ERR_ARG, "a receive with nothing stepping is refused, not waited on");
    dt_env_pool_async_destroy(p);
}

int main(void) {
    against_sync("cartpole");
    against_sync("mountaincar");
    against_sync("pendulum");
    against_sync("lunarlander"); /* Box2D worlds stepped on several threads */
    refusals();
    if (failures) { printf("%d failed\n", failures); return 1; }
    printf("ok: the asynchronous pool steps every environment as the synchronous pool does, whatever the batches; refusals\n");
    return 0;
}
