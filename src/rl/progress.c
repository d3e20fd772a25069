/* A run's progress (see progress.h). */
#include "progress.h"
#include "dtrain/obs.h"

#include <math.h>
#include <stdlib.h>

dt_status dt_rl_progress_open(dt_rl_progress *g, const dt_rl_config *c, int lead) {
    *g = (dt_rl_progress){ .print = lead, .print_every = c->print_every, .path = c->metrics };
    /* a resumed run goes on with the file it wrote */
    if (c->metrics && lead && !(g->metrics = fopen(c->metrics, c->resume ? "a" : "w")))
        return dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    return DT_OK;
}

void dt_rl_progress_close(dt_rl_progress *g) {
    if (g->metrics) fclose(g->metrics);
    g->metrics = NULL;
}

static int by_step_env(const void *a, const void *b) {
    const dt_episode *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->env > y->env) - (x->env < y->env);
}

void dt_rl_progress_add(dt_rl_progress *g, dt_episode *ep, int n) {
    qsort(ep, (size_t)n, sizeof *ep, by_step_env);
    for (int i = 0; i < n; i++) g->returns[g->episodes++ % DT_RL_WINDOW] = ep[i].ret;
}

double dt_rl_progress_mean(const dt_rl_progress *g) {
    int n = g->episodes < DT_RL_WINDOW ? (int)g->episodes : DT_RL_WINDOW;
    double s = 0;
    for (int i = 0; i < n; i++) s += g->returns[i];
    return n ? s / n : NAN;
}

void dt_rl_progress_update(dt_rl_progress *g, int u, int updates, int64_t steps, double loss, const dt_rl_terms *t, float lr,
                           double sps, double lag) {
    double mr = dt_rl_progress_mean(g);
    if (g->metrics) {
        fprintf(g->metrics, "{\"step\":%d,\"env_steps\":%lld,\"episodes\":%lld,\"mean_return\":%.6g,\"loss\":%.6g,\"pg_loss\":%.6g,"
                "\"v_loss\":%.6g,\"entropy\":%.6g,\"approx_kl\":%.6g,\"clipfrac\":%.6g,\"lr\":%.6g,", u, (long long)steps,
                (long long)g->episodes, isfinite(mr) ? mr : 0.0, loss, t->pg, t->v, t->entropy, t->approx_kl, t->clipfrac, (double)lr);
        if (isfinite(lag)) fprintf(g->metrics, "\"policy_lag\":%.4g,", lag);
        fprintf(g->metrics, "\"steps_per_s\":%.1f}\n", sps);
        dt_metrics_flush(&g->metrics, g->path, u);
    }
    if (!g->print || !g->print_every || (u % g->print_every && u != updates)) return;
    printf("update %4d/%d | env steps %8lld | episodes %6lld | mean return %7.2f | pg %+.4f v %.4f ent %.3f kl %.4f", u, updates,
           (long long)steps, (long long)g->episodes, mr, t->pg, t->v, t->entropy, t->approx_kl);
    if (isfinite(lag)) printf(" lag %.1f", lag);
    printf(" | %.0f steps/s\n", sps);
    fflush(stdout);
}

int dt_rl_whole_updates(const char *algo, int64_t total, int64_t per, int lead) {
    int64_t n = total / per;
    if (lead && n >= 1 && total % per)
        dt_log(DT_LOG_WARN, "%s: --total-steps %lld is not a whole number of rollouts of %lld env steps: the run takes %lld "
               "of them, %lld env steps", algo, (long long)total, (long long)per, (long long)n, (long long)(n * per));
    return (int)n;
}
