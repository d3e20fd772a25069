/* dtrain bench train --tp N: tensor parallelism on N ranks against the two
 * other ways to put N cores on one global batch: one process with N threads,
 * and N data-parallel ranks (batch / N each); with --baseline torch,
 * PyTorch's tensor parallelism (bench/torch_tp.py: DTensor's
 * ColwiseParallel/RowwiseParallel over gloo, from the baselines' virtual
 * environment) on the same model and batch. The runs alternate within each
 * round; medians of the steps after warm-up, then over the rounds. The
 * exposed communication is the metrics' comm_exposed_ms (for TP, the time
 * in its collectives, all on the critical path). --sp adds sequence
 * parallelism to both: dtrain's --sp, PyTorch's SequenceParallel plan. */
#include "dtrain/bench.h"
#include "dtrain/base.h"
#include "measure.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, KINDS = 3 };

static int run_torch_tp(const dt_bench_train_opts *o, const char *weights, double *ms) {
    char cmd[PATH_MAX * 3];
    if (dt_bench_venv_cmd(cmd, sizeof cmd, "torch_tp.py", 1)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--nproc %d --weights %s --batch %d --seq %d --steps %d --warmup %d --threads 1%s 2>/dev/null",
             o->tp, weights, o->batch, o->seq, o->steps, o->warmup, o->sp ? " --sp" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    *ms = dt_bench_median_key(p, "ms", 0, o->steps);
    int rc = pclose(p);
    if (rc != 0 || *ms < 0) {
        dt_log(DT_LOG_ERROR, "bench train: PyTorch's tensor parallelism (bench/torch_tp.py) failed on %d ranks (exit %d)", o->tp, rc);
        return 1;
    }
    return 0;
}

/* Kind k of the three dtrain layouts: its options and rank count. */
static int layout(const dt_bench_train_opts *o, int k, dt_bench_train_opts *out, char *flags, size_t cap) {
    *out = *o;
    out->threads = 1;
    snprintf(flags, cap, "%s", o->train_flags ? o->train_flags : "");
    out->train_flags = flags;
    if (k == 0) { out->threads = o->tp; return 1; } /* one process, N threads */
    if (k == 1) { out->batch = o->batch / o->tp; return o->tp; } /* N data-parallel ranks */
    snprintf(flags, cap, "--tp %d%s %s", o->tp, o->sp ? " --sp" : "", o->train_flags ? o->train_flags : "");
    return o->tp;
}

int dt_bench_train_tp(const dt_bench_train_opts *o) {
    const char *const names[KINDS] = { "one process", "data parallel", o->sp ? "TP + SP" : "tensor parallel" };
    if (o->sp && o->seq % o->tp) {
        dt_log(DT_LOG_ERROR, "bench train: --sp: --seq %d does not split into --tp %d parts", o->seq, o->tp);
        return 2;
    }
    if (o->batch % o->tp) {
        dt_log(DT_LOG_ERROR, "bench train: --batch %d does not split into %d data-parallel ranks (the comparison needs it)", o->batch, o->tp);
        return 2;
    }
    char self[PATH_MAX], weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    int rc = dt_bench_make_inputs(o, o->tp, weights, data), rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds;
    if (rc) return rc;
    double ms[KINDS + 1][MAXR], ex[KINDS + 1][MAXR];
    if (!o->json)
        printf("# dtrain bench train --tp %d: GPT-2 %s, global batch %d x %d, AdamW, %ld cores; one process with %d threads, %d "
               "data-parallel ranks, %d tensor-parallel ranks%s (1 thread each)%s; medians of %d steps after %d warm-up, %d round(s)\n",
               o->tp, o->model, o->batch, o->seq, sysconf(_SC_NPROCESSORS_ONLN), o->tp, o->tp, o->tp, o->sp ? " with sequence parallelism" : "",
               o->baseline ? (o->sp ? ", PyTorch's tensor and sequence parallelism" : ", PyTorch's tensor parallelism") : "", o->steps, o->warmup, rounds);
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < KINDS + (o->baseline != NULL) && !rc; i++) {
            int k = r % 2 ? KINDS - 1 - i : i; /* alternate the order: a drifting machine slows each alike */
            if (i == KINDS) { rc = run_torch_tp(o, weights, &ms[KINDS][r]); ex[KINDS][r] = 0; continue; }
            dt_bench_train_opts lo;
            char flags[512];
            int n = layout(o, k, &lo, flags, sizeof flags);
            rc = dt_bench_run_dtrain(&lo, n, false, self, weights, data, &ms[k][r], &ex[k][r]);
        }
    unlink(weights);
    unlink(data);
    if (rc) return rc;
    double one = dt_bench_median(ms[0], rounds), tok = (double)o->batch * o->seq;
    if (!o->json) printf("%-16s %9s %10s %12s %14s\n", "layout", "ms/step", "tok/s", "exposed ms", "vs one process");
    for (int k = 0; k < KINDS + (o->baseline != NULL); k++) {
        double m = dt_bench_median(ms[k], rounds), e = dt_bench_median(ex[k], rounds);
        const char *name = k == KINDS ? (o->sp ? "PyTorch TP + SP" : "PyTorch TP") : names[k];
        if (o->json)
            printf("{\"model\":\"%s\",\"tp\":%d,\"layout\":\"%s\",\"batch\":%d,\"seq\":%d,\"ms\":%.2f,\"tok_per_s\":%.1f,"
                   "\"comm_exposed_ms\":%.2f,\"vs_one_process\":%.3f}\n", o->model, o->tp, name, o->batch, o->seq, m, tok / (m / 1e3),
                   e, one / m);
        else {
            char exs[32];
            snprintf(exs, sizeof exs, k == KINDS ? "-" : "%.1f", e);
            printf("%-16s %9.1f %10.1f %12s %13.2fx\n", name, m, tok / (m / 1e3), exs, one / m);
        }
    }
    if (!o->json && o->baseline)
        printf("dtrain TP over PyTorch TP (tok/s): %.2fx\n", dt_bench_median(ms[KINDS], rounds) / dt_bench_median(ms[2], rounds));
    return 0;
}
