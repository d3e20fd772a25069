/* dtrain bench rl: environment steps per second of dtrain's env pools under
 * random actions, N environments a worker and W worker processes (each its
 * own pool, started together), and (--async T) the asynchronous pool's
 * receive-and-send loop, against Gymnasium's vector environments and EnvPool
 * (bench/rl_rollout.py in the baselines' virtual environment) on the same
 * machine, one after the other. */
#include "dtrain/bench.h"
#include "dtrain/rl.h"
#include "measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* count floats of random actions into a, from the stream s: a discrete action's index, or uniform in a Box's bounds. */
static void random_actions(const dt_env_info *in, uint64_t *s, float *a, int count) {
    for (int i = 0; i < count; i++) {
        uint64_t x = dt_rng_next(s);
        float lo = dt_env_act_low(in, i % in->act_dim), hi = dt_env_act_high(in, i % in->act_dim);
        a[i] = in->actions ? (float)(x % (uint64_t)in->actions) : lo + (hi - lo) * (float)(x >> 40) / 16777216.0f;
    }
}

/* One worker: steps of random actions on a pool of n; the seconds they took. */
static double worker(const char *env, const char *python, int n, int index, int64_t steps, dt_status *st) {
    dt_env_pool *p;
    dt_env_bridge_config one = { .python = python, .workers = 1 }; /* a bridged pool: one Python process a worker, as each baseline's */
    if ((*st = dt_env_pool_create(env, n, index * n, 1, &one, &p))) return 0;
    const dt_env_info *in = dt_env_pool_info(p);
    float *obs = malloc(sizeof(float) * (size_t)n * in->obs_dim), *a = malloc(sizeof(float) * (size_t)n * in->act_dim), *r = malloc(sizeof(float) * (size_t)n);
    uint8_t *te = malloc((size_t)n), *tr = malloc((size_t)n);
    uint64_t s = 7 + (uint64_t)index;
    *st = dt_env_pool_reset(p, obs);
    double t0 = dt_time_now();
    for (int64_t k = 0; k < steps / n && !*st; k++) {
        random_actions(in, &s, a, n * in->act_dim);
        *st = dt_env_pool_step(p, a, obs, r, te, tr, NULL);
    }
    double t = dt_time_now() - t0;
    free(obs); free(a); free(r); free(te); free(tr);
    dt_env_pool_destroy(p);
    return t;
}

/* The asynchronous pool of n environments stepped by `threads` threads, received in batches of b: steps/s of the
 * receive-and-send loop under random actions (-1: it failed). */
static double async_rate(const char *env, int n, int threads, int b, int64_t steps) {
    dt_env_pool_async *p;
    if (dt_env_pool_async_create(env, n, 0, 1, threads, b, &p)) return -1;
    const dt_env_info *in = dt_env_pool_async_info(p);
    float *obs = malloc(sizeof(float) * (size_t)b * in->obs_dim), *a = malloc(sizeof(float) * (size_t)b * in->act_dim), *r = malloc(sizeof(float) * (size_t)b);
    uint8_t *te = malloc((size_t)b), *tr = malloc((size_t)b);
    int *ids = malloc(sizeof *ids * (size_t)b);
    uint64_t s = 7;
    dt_status st = obs && a && r && te && tr && ids ? dt_env_pool_async_reset(p) : dt_error(DT_ERR_NOMEM, "out of memory");
    double t0 = dt_time_now();
    int64_t k = 0;
    for (; k < steps && !st; k += b) {
        st = dt_env_pool_async_recv(p, ids, obs, r, te, tr, NULL);
        if (st) break;
        random_actions(in, &s, a, b * in->act_dim);
        st = dt_env_pool_async_send(p, a, ids, b);
    }
    double t = dt_time_now() - t0;
    if (st) dt_log(DT_LOG_ERROR, "bench rl: the asynchronous pool: %s", dt_last_error());
    free(obs); free(a); free(r); free(te); free(tr); free(ids);
    dt_env_pool_async_destroy(p);
    return st ? -1 : (double)k / t;
}

/* W workers started together (a pipe each way); the total steps over the slowest worker's time. */
static double rate(const char *env, const char *python, int n, int W, int64_t steps) {
    int go[2], back[2];
    if (pipe(go) || pipe(back)) return -1;
    for (int w = 0; w < W; w++) {
        pid_t pid = fork();
        if (pid < 0) return -1;
        if (pid == 0) {
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 1) _exit(1);
            dt_status st;
            double t = worker(env, python, n, w, steps / W, &st);
            if (st) dt_log(DT_LOG_ERROR, "bench rl: worker %d: %s", w, dt_last_error()), t = -1;
            _exit(write(back[1], &t, sizeof t) == sizeof t ? 0 : 1);
        }
    }
    close(go[0]);
    close(back[1]);
    for (int w = 0; w < W; w++) if (write(go[1], "g", 1) != 1) return -1;
    double worst = 0, t;
    for (int w = 0; w < W; w++) {
        if (read(back[0], &t, sizeof t) != sizeof t || t < 0) worst = -1;
        else if (worst >= 0 && t > worst) worst = t;
    }
    close(go[1]);
    close(back[0]);
    while (wait(NULL) > 0) {}
    return worst > 0 ? (double)(steps / W / n * n * W) / worst : -1;
}

int dt_bench_rl(const dt_bench_rl_opts *o) {
    const char *name = dt_env_id(o->env);
    if (!name) { dt_log(DT_LOG_ERROR, "bench rl: environment '%s' is not one dtrain has: %s", o->env, dt_env_list()); return 2; }
    char id[256];
    snprintf(id, sizeof id, "%s", dt_env_bridged(name) ? dt_env_bridged(name) : name); /* the baselines make it themselves */
    char cpu[256];
    dt_cpu_model(cpu, sizeof cpu);
    printf("%s, random actions, %lld steps a row, on %s\n", id, (long long)o->steps, cpu);
    printf("%-34s %8s %8s %14s\n", "rollout", "envs/w", "workers", "steps/s");
    for (int wi = 0; wi < o->nworkers; wi++)
        for (int ni = 0; ni < o->nenvs; ni++) {
            double r = rate(o->env, o->python, o->envs[ni], o->workers[wi], o->steps);
            if (r < 0) { dt_log(DT_LOG_ERROR, "bench rl: a worker failed"); return 1; }
            printf("%-34s %8d %8d %14.0f\n", dt_env_bridged(o->env) ? "dtrain gym bridge" : "dtrain env pool", o->envs[ni], o->workers[wi], r);
            fflush(stdout);
        }
    for (int ni = 0; ni < o->nenvs && o->async_threads > 0 && !dt_env_bridged(o->env); ni++) {
        int n = o->envs[ni], b = n / 2 > 0 ? n / 2 : 1;
        double r = async_rate(o->env, n, o->async_threads, b, o->steps);
        if (r < 0) return 1;
        char name[64];
        snprintf(name, sizeof name, "dtrain async pool (batch %d)", b);
        printf("%-34s %8d %8d %14.0f\n", name, n, o->async_threads, r);
        fflush(stdout);
    }
    if (!o->baseline) return 0;
    char cmd[8192];
    if (dt_bench_venv_cmd(cmd, sizeof cmd, "rl_rollout.py", 1)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--env %s --steps %lld --slow-steps %lld%s", id, (long long)o->steps, (long long)o->slow_steps,
             o->async_threads > 0 ? " --async" : "");
    fflush(stdout);
    int rc = system(cmd);
    if (rc) dt_log(DT_LOG_WARN, "bench rl: the baselines' script failed (its messages are above)");
    return rc ? 1 : 0;
}
