/* dtrain bench train --model resnet50 --synthetic: Horovod's
 * pytorch_synthetic_benchmark.py in dtrain's terms. For each worker count N
 * it runs `dtrain train --model M --synthetic --nproc N` (one random batch
 * per worker, SGD lr 0.01) and, with --baseline torch, bench/torch_resnet.py
 * (torchvision's model under PyTorch DDP over gloo) with PyTorch 2.x from the
 * baselines' virtual environment and with Debian's PyTorch, one after the
 * other in each round. Every timed iteration's img/s per worker is kept;
 * reported as Horovod reports it: img/sec per worker, mean +- 1.96
 * standard deviations, and total img/sec on N workers; then the ratio to
 * PyTorch and the scaling from the first N. For N > 1, N independent
 * 1-worker runs side by side too (no communication): the scaling the
 * machine's shared caches and memory bandwidth leave N processes, the
 * ceiling for data parallelism. */
#include "dtrain/bench.h"
#include "measure.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXV = 4096, SYSTEMS = 4, INDEP = 3 };
static const char *system_name[SYSTEMS] = { "dtrain", "PyTorch 2.x (PyPI, oneDNN)", "PyTorch (Debian python3-torch)",
                                            "dtrain, independent 1-worker runs side by side" };

typedef struct { double v[MAXV]; int n; } samples;

/* dtrain train --nproc n, or (indep) n independent --nproc 1 runs at once. */
static int run_dtrain(const dt_bench_train_opts *o, int n, bool indep, const char *self, samples *s) {
    char dir[] = "/tmp/dtrain-bench-XXXXXX", cmd[PATH_MAX * 3], path[PATH_MAX];
    if (!mkdtemp(dir)) { dt_log(DT_LOG_ERROR, "bench train: cannot create a temporary directory"); return 1; }
    int runs = indep ? n : 1, before = s->n;
    snprintf(cmd, sizeof cmd,
             "%s/dtrain train --model %s --synthetic --nproc %d --batch %d --steps %d --threads %d --optimizer sgd "
             "--lr 0.01 --metrics %s/metrics.$r --quiet %s > /dev/null 2>> %s/stderr",
             self, o->model, indep ? 1 : n, o->batch, o->warmup + o->steps, o->threads, dir, o->train_flags ? o->train_flags : "", dir);
    int rc = dt_bench_run_copies(cmd, runs);
    for (int r = 0; r < runs; r++) {
        snprintf(path, sizeof path, "%s/metrics.%d", dir, r);
        FILE *f = fopen(path, "r");
        if (f) dt_bench_collect(f, "img_per_s_worker", o->warmup, s->v, &s->n, MAXV), fclose(f);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/stderr", dir);
    if (rc != 0 || s->n - before < o->steps * runs) {
        dt_log(DT_LOG_ERROR, "bench train: dtrain train --model %s --synthetic --nproc %d%s failed (exit status %d); its messages:",
               o->model, indep ? 1 : n, indep ? " (independent runs)" : "", rc);
        dt_bench_print_file(path);
        rc = 1;
    }
    unlink(path);
    rmdir(dir);
    return rc ? 1 : 0;
}

/* which: 1 PyTorch 2.x from the virtual environment, 2 Debian's. */
static int run_torch(const dt_bench_train_opts *o, int n, int which, samples *s) {
    char cmd[PATH_MAX * 3];
    if (which == 1 ? dt_bench_venv_cmd(cmd, sizeof cmd, "torch_resnet.py", o->threads)
                   : dt_bench_python_cmd(cmd, sizeof cmd, "torch_resnet.py", o->threads))
        return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--model %s --nproc %d --batch %d --iters %d --warmup %d --threads %d", o->model, n,
             o->batch, o->steps, o->warmup, o->threads);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    int before = s->n;
    dt_bench_collect(p, "img_per_s_worker", 0, s->v, &s->n, MAXV);
    int rc = pclose(p);
    if (rc != 0 || s->n - before < o->steps) {
        dt_log(DT_LOG_ERROR, "bench train: %s failed with %d worker(s) (exit %d): %s", system_name[which], n, rc,
               which == 2 ? "Debian's needs python3-torch and python3-torchvision" : "scripts/make-baselines-venv.sh installs it");
        return 1;
    }
    return 0;
}

static void mean_sd(const samples *s, double *mean, double *sd) {
    double a = 0, q = 0;
    for (int i = 0; i < s->n; i++) a += s->v[i];
    *mean = s->n ? a / s->n : 0;
    for (int i = 0; i < s->n; i++) q += (s->v[i] - *mean) * (s->v[i] - *mean);
    *sd = s->n > 1 ? sqrt(q / (s->n - 1)) : 0;
}

/* The results for np workers (row i of s): a JSON line, or the figures and the ratios against the first count's (first)
 * and the baselines. */
static void report(const dt_bench_train_opts *o, int np, int np0, samples *row, double *first, int i) {
    double mean[SYSTEMS], sd[SYSTEMS];
    for (int k = 0; k < SYSTEMS; k++) {
        mean_sd(&row[k], &mean[k], &sd[k]);
        if (i == 0) first[k] = mean[k];
    }
    first[INDEP] = first[0]; /* the ceiling's scaling is against dtrain's own first N */
    if (o->json) {
        printf("{\"model\":\"%s\",\"nproc\":%d,\"threads\":%d,\"batch\":%d,\"img_per_s_worker\":%.3f,\"ci95\":%.3f,\"img_per_s\":%.3f",
               o->model, np, o->threads, o->batch, mean[0], 1.96 * sd[0], mean[0] * np);
        if (o->baseline)
            printf(",\"torch2_img_per_s_worker\":%.3f,\"torch2_ci95\":%.3f,\"debian_torch_img_per_s_worker\":%.3f,"
                   "\"debian_torch_ci95\":%.3f", mean[1], 1.96 * sd[1], mean[2], 1.96 * sd[2]);
        if (row[INDEP].n) printf(",\"independent_img_per_s_worker\":%.3f,\"independent_ci95\":%.3f", mean[INDEP], 1.96 * sd[INDEP]);
        printf("}\n");
        return;
    }
    for (int k = 0; k < SYSTEMS; k++)
        if (row[k].n)
            printf("== %s, %d worker%s x %d thread(s):\nImg/sec per worker: %.2f +-%.2f\nTotal img/sec on %d worker%s: %.2f +-%.2f"
                   "  (scaling from %d: %.2fx)\n", system_name[k], np, np > 1 ? "s" : "", o->threads, mean[k], 1.96 * sd[k],
                   np, np > 1 ? "s" : "", mean[k] * np, 1.96 * sd[k] * np, np0, mean[k] * np / (first[k] * np0));
    if (row[INDEP].n)
        printf("dtrain's scaling is %.1f%% of the independent runs' (the machine's ceiling for %d workers)\n", 100 * mean[0] / mean[INDEP], np);
    if (o->baseline)
        printf("dtrain / PyTorch 2.x: %.2fx; dtrain / Debian's PyTorch: %.2fx (img/s per worker, %d worker%s)\n", mean[0] / mean[1],
               mean[0] / mean[2], np, np > 1 ? "s" : "");
}

int dt_bench_train_images(const dt_bench_train_opts *o) {
    char self[PATH_MAX], cpu[128];
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    int one[1] = { 1 }, nn = o->nnprocs ? o->nnprocs : 1;
    const int *np = o->nnprocs ? o->nprocs : one;
    int rounds = o->rounds < 1 ? 1 : o->rounds > 16 ? 16 : o->rounds, rc = 0;
    static samples s[16][SYSTEMS];
    memset(s, 0, sizeof s);
    const char *shape = strcmp(o->model, "resnet:small") ? "3x224x224" : "1x28x28";
    if (!o->json)
        printf("# dtrain bench train: %s, synthetic %s images, batch %d per worker, SGD lr 0.01, %d thread(s) per worker, "
               "%ld cores (%s); %d timed iterations after %d warm-up, %d round(s)%s\n", o->model, shape, o->batch, o->threads,
               sysconf(_SC_NPROCESSORS_ONLN), dt_cpu_model(cpu, sizeof cpu), o->steps, o->warmup, rounds,
               o->baseline ? "; dtrain, PyTorch 2.x and Debian's PyTorch (DDP over gloo) alternating" : "");
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < nn && !rc; i++)
            for (int k = 0; k < SYSTEMS && !rc; k++) {
                if ((k == 1 || k == 2) && !o->baseline) continue;
                if (k == INDEP && np[i] == 1) continue;
                int before = s[i][k].n;
                rc = k == 0 || k == INDEP ? run_dtrain(o, np[i], k == INDEP, self, &s[i][k]) : run_torch(o, np[i], k, &s[i][k]);
                if (rc || o->json) continue;
                for (int j = before; j < s[i][k].n; j++)
                    printf("Iter #%d: %.2f img/sec per worker [%s, %d worker%s, round %d]\n", j - before, s[i][k].v[j], system_name[k],
                           np[i], np[i] > 1 ? "s" : "", r + 1);
                fflush(stdout);
            }
    if (rc) return rc;
    double first[SYSTEMS] = { 0 };
    for (int i = 0; i < nn; i++) report(o, np[i], np[0], s[i], first, i);
    return 0;
}
