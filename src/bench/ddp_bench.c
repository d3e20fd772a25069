/* dtrain bench train --nproc 1,2,4: data-parallel scaling. For each rank
 * count N it runs the real thing, `dtrain train --nproc N` on synthetic
 * tokens, and reads the per-step times and exposed communication from its
 * metrics file; with --baseline torch, PyTorch DDP over gloo
 * (bench/torch_ddp.py) runs the same model from the same weights, one after
 * the other in each round; and N independent 1-rank runs side by side, the
 * ceiling that shared memory bandwidth and caches leave N processes on this
 * machine. Reported as the Horovod synthetic benchmark does: tok/s per
 * worker and in total, and scaling against the smallest N. */
#include "dtrain/bench.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/model.h"
#include "dtrain/obs.h"
#include "measure.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, MAXN = 16 };

/* Median over JSON lines of `key` after `skip` lines; -1 when fewer than want. */
/* dtrain train --nproc N, or with indep N independent `dtrain train` runs
 * side by side (no communication: what the machine allows N processes);
 * median ms per step (over every run's steps) and exposed ms. */
int dt_bench_run_dtrain(const dt_bench_train_opts *o, int nproc, bool indep, const char *self, const char *weights,
                        const char *data, double *ms, double *exposed) {
    static const char *const keys[2] = { "ms", "comm_exposed_ms" };
    double v[2];
    int rc = dt_bench_run_dtrain_keys(o, nproc, indep, self, weights, data, keys, 2, v);
    *ms = v[0];
    *exposed = v[1] < 0 ? 0 : v[1];
    return rc;
}

int dt_bench_run_dtrain_keys(const dt_bench_train_opts *o, int nproc, bool indep, const char *self, const char *weights,
                             const char *data, const char *const *keys, int nkeys, double *out) {
    char dir[] = "/tmp/dtrain-bench-XXXXXX";
    if (!mkdtemp(dir)) { dt_log(DT_LOG_ERROR, "bench train: cannot create a temporary directory"); return 1; }
    int runs = indep ? nproc : 1;
    char cmd[PATH_MAX * 4 + 256];
    snprintf(cmd, sizeof cmd,
             "%s/dtrain train --nproc %d --model %s --data %s --batch %d --seq %d --steps %d --threads %d "
             "--metrics %s/metrics.$r --quiet %s > /dev/null 2>> %s/stderr",
             self, indep ? 1 : nproc, weights, data, o->batch, o->seq, o->warmup + o->steps, o->threads, dir,
             o->train_flags ? o->train_flags : "", dir);
    int rc = dt_bench_run_copies(cmd, runs);
    enum { CAP = 4096 };
    double v[CAP];
    char path[PATH_MAX];
    for (int k = 0; k < nkeys; k++) {
        int nv = 0;
        for (int r = 0; r < runs; r++) {
            snprintf(path, sizeof path, "%s/metrics.%d", dir, r);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            dt_bench_collect(f, keys[k], o->warmup, v, &nv, CAP);
            fclose(f);
        }
        /* the first key (ms) must be there for every step; the others, where the run has them (-1: absent) */
        out[k] = (k == 0 ? nv >= o->steps * runs : nv > 0) ? dt_bench_median(v, nv) : -1;
    }
    for (int r = 0; r < runs; r++) {
        snprintf(path, sizeof path, "%s/metrics.%d", dir, r);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/stderr", dir);
    if (rc != 0 || out[0] < 0) {
        dt_log(DT_LOG_ERROR, "bench train: dtrain train --nproc %d%s failed (exit status %d); its messages:", indep ? 1 : nproc,
               indep ? " (independent runs)" : "", rc);
        dt_bench_print_file(path);
        rc = 1;
    }
    unlink(path);
    rmdir(dir);
    return rc ? 1 : 0;
}

/* --report DIR: one more run of the largest N writing its run directory
 * (metrics, trace, run.json) there; the scaling joins it in scaling.json. */
static int report_run(const dt_bench_train_opts *o, int nproc, const char *self, const char *weights, const char *data) {
    char cmd[PATH_MAX * 5];
    snprintf(cmd, sizeof cmd, "%s/dtrain train --nproc %d --model %s --data %s --batch %d --seq %d --steps %d --threads %d "
             "--report '%s' --quiet %s > /dev/null", self, nproc, weights, data, o->batch, o->seq, o->warmup + o->steps, o->threads,
             o->report, o->train_flags ? o->train_flags : "");
    if (strchr(o->report, '\'') || system(cmd) != 0) {
        dt_log(DT_LOG_ERROR, "bench train: the report's run (dtrain train --nproc %d --report %s) failed", nproc, o->report);
        return 1;
    }
    return 0;
}

static int write_scaling(const dt_bench_train_opts *o, cJSON *records) {
    char path[PATH_MAX + 32], html[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/scaling.json", o->report);
    snprintf(html, sizeof html, "%s/report.html", o->report);
    char *text = cJSON_Print(records);
    const void *parts[1] = { text };
    size_t len = text ? strlen(text) : 0;
    dt_status st = text ? dt_file_write_atomic(path, parts, &len, 1) : dt_error(DT_ERR_NOMEM, "out of memory");
    free(text);
    if (!st) st = dt_report_write(o->report, html);
    if (st) { dt_log(DT_LOG_ERROR, "bench train: %s", dt_last_error()); return 1; }
    printf("report: %s (with the scaling chart)\n", html);
    return 0;
}

static int run_torch(const dt_bench_train_opts *o, int nproc, const char *weights, double *ms) {
    char cmd[PATH_MAX * 3];
    if (dt_bench_python_cmd(cmd, sizeof cmd, "torch_ddp.py", o->threads)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--nproc %d --weights %s --batch %d --seq %d --steps %d --warmup %d --threads %d",
             nproc, weights, o->batch, o->seq, o->steps, o->warmup, o->threads);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    *ms = dt_bench_median_key(p, "ms", 0, o->steps);
    int rc = pclose(p);
    if (rc != 0 || *ms < 0) {
        dt_log(DT_LOG_ERROR, "bench train: the PyTorch DDP baseline failed with %d ranks (exit %d): is python3-torch installed?",
               nproc, rc);
        return 1;
    }
    return 0;
}

int dt_bench_make_inputs(const dt_bench_train_opts *o, int maxn, char *weights, char *data) {
    dt_gpt2_config cfg;
    dt_gpt2 *m = NULL;
    if (dt_gpt2_preset(o->model, &cfg)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    if (o->seq > cfg.max_seq_len) cfg.max_seq_len = o->seq; /* long contexts: the position table grows to --seq */
    if (dt_gpt2_create(&cfg, &m)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    dt_gpt2_init_random(m, 1337);
    int fw = mkstemp(weights), fd = mkstemp(data);
    if (fw < 0 || fd < 0) { dt_log(DT_LOG_ERROR, "bench train: cannot create temporary files"); dt_gpt2_destroy(m); return 1; }
    close(fw);
    close(fd);
    size_t ntok = (size_t)maxn * o->batch * o->seq * (size_t)(o->warmup + o->steps) + 1;
    uint32_t *tok = malloc(ntok * sizeof *tok);
    uint64_t s = 1;
    for (size_t i = 0; tok && i < ntok; i++) tok[i] = (uint32_t)(dt_rng_next(&s) % (uint64_t)cfg.vocab_size);
    int rc = !tok || dt_llmc_save(weights, m) || dt_tokens_write(data, tok, ntok);
    free(tok);
    dt_gpt2_destroy(m);
    if (rc) { dt_log(DT_LOG_ERROR, "bench train: %s", dt_last_error()); unlink(weights); unlink(data); return 1; }
    return 0;
}

/* Each round's step times per rank count: dtrain's (and its exposed communication), N independent runs', PyTorch's. */
typedef struct { double dtrain[MAXN][MAXR], exposed[MAXN][MAXR], torch[MAXN][MAXR], indep[MAXN][MAXR]; } ddp_times;

/* The rounds, each rank count in turn (said as they end); the exit code. */
static int run_rounds(const dt_bench_train_opts *o, int rounds, int nn, const char *self, const char *weights, const char *data,
                      ddp_times *t) {
    int rc = 0;
    double unused;
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < nn && !rc; i++) {
            int n = o->nprocs[i];
            rc = dt_bench_run_dtrain(o, n, false, self, weights, data, &t->dtrain[i][r], &t->exposed[i][r]);
            t->indep[i][r] = t->dtrain[i][r];
            if (!rc && n > 1) rc = dt_bench_run_dtrain(o, n, true, self, weights, data, &t->indep[i][r], &unused);
            if (!rc && o->baseline) rc = run_torch(o, n, weights, &t->torch[i][r]);
            if (rc || o->json) continue;
            printf("round %d, %d rank(s): dtrain %.1f ms/step, %.1f tok/s total", r + 1, n, t->dtrain[i][r],
                   (double)n * o->batch * o->seq / (t->dtrain[i][r] / 1e3));
            if (n > 1) printf("; %d independent runs %.1f ms/step", n, t->indep[i][r]);
            if (o->baseline) printf("; torch %.1f ms/step, %.1f tok/s total", t->torch[i][r], (double)n * o->batch * o->seq / (t->torch[i][r] / 1e3));
            printf("\n");
            fflush(stdout);
        }
    return rc;
}

/* The medians' table (or JSON lines), each row a record in records (the medians sort t's rounds in place). */
static void print_table(const dt_bench_train_opts *o, int rounds, int nn, ddp_times *t, cJSON *records) {
    double tok1 = 0, ttok1 = 0;
    if (!o->json)
        printf("%5s | %9s %12s %12s %8s %8s | %9s %8s %8s | %9s %12s %8s | %s\n", "ranks", "ms/step", "tok/s/worker",
               "tok/s total", "scaling", "exposed", "indep ms", "scaling", "of it", o->baseline ? "torch ms" : "",
               o->baseline ? "torch tok/s" : "", o->baseline ? "scaling" : "", o->baseline ? "dtrain/torch" : "");
    for (int i = 0; i < nn; i++) {
        int n = o->nprocs[i];
        double ms = dt_bench_median(t->dtrain[i], rounds), ex = dt_bench_median(t->exposed[i], rounds);
        double per = o->batch * o->seq / (ms / 1e3), tot = per * n;
        if (i == 0) tok1 = tot / n;
        double scale = tot / tok1; /* against the first N's per-worker rate */
        double im = dt_bench_median(t->indep[i], rounds), iscale = n * (o->batch * o->seq / (im / 1e3)) / tok1;
        double tm = o->baseline ? dt_bench_median(t->torch[i], rounds) : 0, ttot = o->baseline ? n * o->batch * o->seq / (tm / 1e3) : 0;
        if (i == 0) ttok1 = ttot / n;
        char rec[1024];
        int k = snprintf(rec, sizeof rec, "{\"model\":\"%s\",\"nproc\":%d,\"threads\":%d,\"ms\":%.2f,\"tok_per_s_worker\":%.1f,"
                         "\"tok_per_s\":%.1f,\"scaling\":%.3f,\"efficiency\":%.3f,\"comm_exposed_ms\":%.2f,\"independent_ms\":%.2f,"
                         "\"independent_scaling\":%.3f", o->model, n, o->threads, ms, per, tot, scale, scale / n, ex, im, iscale);
        if (o->baseline)
            snprintf(rec + k, sizeof rec - (size_t)k, ",\"torch_ms\":%.2f,\"torch_tok_per_s\":%.1f,\"torch_scaling\":%.3f}", tm, ttot,
                     ttot / ttok1);
        else snprintf(rec + k, sizeof rec - (size_t)k, "}");
        cJSON_AddItemToArray(records, cJSON_Parse(rec));
        if (o->json) {
            printf("%s\n", rec);
            continue;
        }
        printf("%5d | %9.1f %12.1f %12.1f %7.2fx %7.1f%% | %9.1f %7.2fx %7.1f%% |", n, ms, per, tot, scale, 100 * ex / ms, im, iscale,
               100 * scale / iscale);
        if (o->baseline) printf(" %9.1f %12.1f %7.2fx | %.2fx", tm, ttot, ttot / ttok1, tm / ms);
        printf("\n");
    }
}

int dt_bench_train_ddp(const dt_bench_train_opts *o) {
    char self[PATH_MAX];
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    char weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    int maxn = 1;
    for (int i = 0; i < o->nnprocs; i++) if (o->nprocs[i] > maxn) maxn = o->nprocs[i];
    int rc = dt_bench_make_inputs(o, maxn, weights, data);
    if (rc) return rc;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds, nn = o->nnprocs > MAXN ? MAXN : o->nnprocs;
    ddp_times *t = calloc(1, sizeof *t);
    if (!t) rc = 1, dt_log(DT_LOG_ERROR, "bench train: out of memory");
    if (!o->json && t)
        printf("# dtrain bench train: data parallel GPT-2 %s, batch %d x seq %d per rank, AdamW, %d thread(s) per rank, "
               "%ld cores; dtrain train --nproc N%s; medians of %d steps after %d warm-up, %d round(s)\n",
               o->model, o->batch, o->seq, o->threads, cores, o->baseline ? " and PyTorch DDP (gloo) alternating" : "",
               o->steps, o->warmup, rounds);
    if (!rc) rc = run_rounds(o, rounds, nn, self, weights, data, t);
    if (!rc && o->report) rc = report_run(o, maxn, self, weights, data);
    unlink(weights);
    unlink(data);
    cJSON *records = rc ? NULL : cJSON_CreateArray();
    if (records) print_table(o, rounds, nn, t, records);
    free(t);
    if (rc) return rc;
    if (!o->json)
        printf("scaling: total tok/s over the per-worker tok/s of the first row (%d rank%s; efficiency = scaling / ranks); "
               "exposed: communication not hidden behind compute, %% of the step; indep: N independent 1-rank runs side "
               "by side, no communication (what this machine gives N processes), and dtrain's scaling as a share of "
               "theirs%s\n", o->nprocs[0], o->nprocs[0] > 1 ? "s" : "",
               cores < maxn ? "; more ranks than cores run oversubscribed" : "");
    rc = o->report ? write_scaling(o, records) : 0;
    cJSON_Delete(records);
    return rc;
}
