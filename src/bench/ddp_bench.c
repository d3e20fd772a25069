/* dtrain bench train --nproc 1,2,4: data-parallel scaling. For each rank
 * count N it runs the real thing, `dtrain train --nproc N` on synthetic
 * tokens, and reads the per-step times and exposed communication from its
 * metrics file; with --baseline torch, PyTorch DDP over gloo
 * (bench/torch_ddp.py) runs the same model from the same weights, one after
 * the other in each round. Reported as the Horovod synthetic benchmark does:
 * tok/s per worker and in total, and scaling against the smallest N. */
#include "dtrain/bench.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/model.h"
#include "measure.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, MAXN = 16 };

/* Median over JSON lines of `key` after `skip` lines; -1 when fewer than want. */
static double median_key(FILE *f, const char *key, int skip, int want) {
    char line[4096];
    double v[4096];
    int n = 0, seen = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *x = j ? cJSON_GetObjectItem(j, key) : NULL;
        if (cJSON_IsNumber(x) && seen++ >= skip && n < 4096) v[n++] = x->valuedouble;
        cJSON_Delete(j);
    }
    return n < want ? -1 : dt_bench_median(v, n);
}

/* dtrain train --nproc N; median ms per step and exposed ms. */
static int run_dtrain(const dt_bench_train_opts *o, int nproc, const char *self, const char *weights, const char *data,
                      double *ms, double *exposed) {
    char metrics[] = "/tmp/dtrain-bench-metrics-XXXXXX", errs[] = "/tmp/dtrain-bench-stderr-XXXXXX";
    int fm = mkstemp(metrics), fe = mkstemp(errs);
    if (fm < 0 || fe < 0) { dt_log(DT_LOG_ERROR, "bench train: cannot create temporary files"); return 1; }
    close(fm);
    close(fe);
    char cmd[PATH_MAX * 4];
    snprintf(cmd, sizeof cmd,
             "%s/dtrain train --nproc %d --model %s --data %s --batch %d --seq %d --steps %d --threads %d "
             "--metrics %s --quiet > /dev/null 2> %s",
             self, nproc, weights, data, o->batch, o->seq, o->warmup + o->steps, o->threads, metrics, errs);
    int rc = system(cmd);
    FILE *f = fopen(metrics, "r");
    *ms = f ? median_key(f, "ms", o->warmup, o->steps) : -1;
    if (f) rewind(f);
    *exposed = f ? median_key(f, "comm_exposed_ms", o->warmup, o->steps) : -1;
    if (f) fclose(f);
    if (rc != 0 || *ms < 0) {
        dt_log(DT_LOG_ERROR, "bench train: dtrain train --nproc %d failed (exit status %d); its messages:", nproc, rc);
        FILE *e = fopen(errs, "r");
        char line[1024];
        while (e && fgets(line, sizeof line, e)) fputs(line, stderr);
        if (e) fclose(e);
        rc = 1;
    }
    unlink(metrics);
    unlink(errs);
    return rc ? 1 : 0;
}

static int run_torch(const dt_bench_train_opts *o, int nproc, const char *weights, double *ms) {
    char cmd[PATH_MAX * 3];
    if (dt_bench_python_cmd(cmd, sizeof cmd, "torch_ddp.py", o->threads)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--nproc %d --weights %s --batch %d --seq %d --steps %d --warmup %d --threads %d",
             nproc, weights, o->batch, o->seq, o->steps, o->warmup, o->threads);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    *ms = median_key(p, "ms", 0, o->steps);
    int rc = pclose(p);
    if (rc != 0 || *ms < 0) {
        dt_log(DT_LOG_ERROR, "bench train: the PyTorch DDP baseline failed with %d ranks (exit %d): is python3-torch installed?",
               nproc, rc);
        return 1;
    }
    return 0;
}

int dt_bench_train_ddp(const dt_bench_train_opts *o) {
    char self[PATH_MAX];
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    dt_gpt2_config cfg;
    dt_gpt2 *m = NULL;
    if (dt_gpt2_preset(o->model, &cfg) || dt_gpt2_create(&cfg, &m)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    dt_gpt2_init_random(m, 1337);
    /* The same weights for dtrain and PyTorch, and random tokens enough for
     * every rank of the largest run to read fresh batches. */
    char weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    int fw = mkstemp(weights), fd = mkstemp(data);
    if (fw < 0 || fd < 0) { dt_log(DT_LOG_ERROR, "bench train: cannot create temporary files"); return 1; }
    close(fw);
    close(fd);
    int maxn = 1;
    for (int i = 0; i < o->nnprocs; i++) if (o->nprocs[i] > maxn) maxn = o->nprocs[i];
    size_t ntok = (size_t)maxn * o->batch * o->seq * (size_t)(o->warmup + o->steps) + 1;
    uint32_t *tok = malloc(ntok * sizeof *tok);
    uint64_t s = 1;
    for (size_t i = 0; tok && i < ntok; i++) tok[i] = (uint32_t)(dt_rng_next(&s) % (uint64_t)cfg.vocab_size);
    int rc = !tok || dt_llmc_save(weights, m) || dt_tokens_write(data, tok, ntok);
    free(tok);
    dt_gpt2_destroy(m);
    if (rc) { dt_log(DT_LOG_ERROR, "bench train: %s", dt_last_error()); unlink(weights); unlink(data); return 1; }

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds, nn = o->nnprocs > MAXN ? MAXN : o->nnprocs;
    double dms[MAXN][MAXR], dex[MAXN][MAXR], tms[MAXN][MAXR];
    if (!o->json)
        printf("# dtrain bench train: data parallel GPT-2 %s, batch %d x seq %d per rank, AdamW, %d thread(s) per rank, "
               "%ld cores; dtrain train --nproc N%s; medians of %d steps after %d warm-up, %d round(s)\n",
               o->model, o->batch, o->seq, o->threads, cores, o->baseline ? " and PyTorch DDP (gloo) alternating" : "",
               o->steps, o->warmup, rounds);
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < nn && !rc; i++) {
            int n = o->nprocs[i];
            rc = run_dtrain(o, n, self, weights, data, &dms[i][r], &dex[i][r]);
            if (!rc && o->baseline) rc = run_torch(o, n, weights, &tms[i][r]);
            if (!rc && !o->json) {
                printf("round %d, %d rank(s): dtrain %.1f ms/step, %.1f tok/s total", r + 1, n, dms[i][r],
                       (double)n * o->batch * o->seq / (dms[i][r] / 1e3));
                if (o->baseline) printf("; torch %.1f ms/step, %.1f tok/s total", tms[i][r],
                                        (double)n * o->batch * o->seq / (tms[i][r] / 1e3));
                printf("\n");
                fflush(stdout);
            }
        }
    unlink(weights);
    unlink(data);
    if (rc) return rc;

    double tok1 = 0, ttok1 = 0;
    if (!o->json) {
        printf("%5s | %9s %12s %12s %8s %8s | %9s %12s %8s | %s\n", "ranks", "ms/step", "tok/s/worker", "tok/s total",
               "scaling", "exposed", o->baseline ? "torch ms" : "", o->baseline ? "torch tok/s" : "",
               o->baseline ? "scaling" : "", o->baseline ? "dtrain/torch" : "");
    }
    for (int i = 0; i < nn; i++) {
        int n = o->nprocs[i];
        double ms = dt_bench_median(dms[i], rounds), ex = dt_bench_median(dex[i], rounds);
        double per = o->batch * o->seq / (ms / 1e3), tot = per * n;
        if (i == 0) tok1 = tot / n;
        double scale = tot / tok1; /* against the first N's per-worker rate */
        double tm = o->baseline ? dt_bench_median(tms[i], rounds) : 0, ttot = o->baseline ? n * o->batch * o->seq / (tm / 1e3) : 0;
        if (i == 0) ttok1 = ttot / n;
        if (o->json) {
            printf("{\"model\":\"%s\",\"nproc\":%d,\"threads\":%d,\"ms\":%.2f,\"tok_per_s_worker\":%.1f,\"tok_per_s\":%.1f,"
                   "\"scaling\":%.3f,\"efficiency\":%.3f,\"comm_exposed_ms\":%.2f",
                   o->model, n, o->threads, ms, per, tot, scale, scale / n, ex);
            if (o->baseline) printf(",\"torch_ms\":%.2f,\"torch_tok_per_s\":%.1f,\"torch_scaling\":%.3f", tm, ttot, ttot / ttok1);
            printf("}\n");
        } else {
            printf("%5d | %9.1f %12.1f %12.1f %7.2fx %7.1f%% |", n, ms, per, tot, scale, 100 * ex / ms);
            if (o->baseline) printf(" %9.1f %12.1f %7.2fx | %.2fx", tm, ttot, ttot / ttok1, tm / ms);
            printf("\n");
        }
    }
    if (!o->json)
        printf("scaling: total tok/s over the per-worker tok/s of the first row (%d rank%s; efficiency = scaling / ranks); "
               "exposed: communication not hidden behind compute, %% of the step%s\n", o->nprocs[0], o->nprocs[0] > 1 ? "s" : "",
               cores < maxn ? "; more ranks than cores run oversubscribed" : "");
    return 0;
}
