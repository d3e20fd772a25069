/* dtrain bench train --cp N: context parallelism on N ranks (one thread
 * each), by ring and by all-to-all, against one process with N threads on
 * the same global batch (B sequences of --seq). The runs alternate within
 * each round; medians of the steps after warm-up, then over the rounds.
 * Attention's time and the part of it spent waiting on the group come from
 * the metrics (cp_attention_ms, cp_wait_ms): the ring's passes that its
 * blocks' compute did not hide, every all-to-all. */
#include "dtrain/bench.h"
#include "dtrain/base.h"
#include "measure.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, KINDS = 3, KEYS = 4 };

int dt_bench_train_cp(const dt_bench_train_opts *o) {
    static const char *const names[KINDS] = { "one process", "CP ring", "CP all-to-all" };
    static const char *const keys[KEYS] = { "ms", "cp_attention_ms", "cp_wait_ms", "comm_exposed_ms" };
    if (o->seq % (2 * o->cp)) {
        dt_log(DT_LOG_ERROR, "bench train: --cp %d: --seq %d does not split into %d chunks", o->cp, o->seq, 2 * o->cp);
        return 2;
    }
    char self[PATH_MAX], weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    int rc = dt_bench_make_inputs(o, 1, weights, data), rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds;
    if (rc) return rc;
    double v[KINDS][KEYS][MAXR];
    if (!o->json)
        printf("# dtrain bench train --cp %d: GPT-2 %s, global batch %d x %d, AdamW, %ld cores; one process with %d threads, %d "
               "context-parallel ranks by ring and by all-to-all (1 thread each); medians of %d steps after %d warm-up, %d round(s)\n",
               o->cp, o->model, o->batch, o->seq, sysconf(_SC_NPROCESSORS_ONLN), o->cp, o->cp, o->steps, o->warmup, rounds);
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < KINDS && !rc; i++) {
            int k = r % 2 ? KINDS - 1 - i : i; /* alternate the order: a drifting machine slows each alike */
            dt_bench_train_opts lo = *o;
            char flags[512];
            lo.threads = k == 0 ? o->cp : 1;
            if (k == 0) snprintf(flags, sizeof flags, "%s", o->train_flags ? o->train_flags : "");
            else snprintf(flags, sizeof flags, "--cp %d --cp-impl %s %s", o->cp, k == 1 ? "ring" : "ulysses", o->train_flags ? o->train_flags : "");
            lo.train_flags = flags;
            double out[KEYS];
            rc = dt_bench_run_dtrain_keys(&lo, k == 0 ? 1 : o->cp, false, self, weights, data, keys, KEYS, out);
            for (int j = 0; j < KEYS; j++) v[k][j][r] = out[j];
        }
    unlink(weights);
    unlink(data);
    if (rc) return rc;
    double one = dt_bench_median(v[0][0], rounds), tok = (double)o->batch * o->seq;
    if (!o->json) printf("%-14s %9s %9s %14s %12s %12s %14s\n", "layout", "ms/step", "tok/s", "attention ms", "waited ms", "exposed ms",
                         "vs one process");
    for (int k = 0; k < KINDS; k++) {
        double m = dt_bench_median(v[k][0], rounds), a = dt_bench_median(v[k][1], rounds), w = dt_bench_median(v[k][2], rounds);
        double e = dt_bench_median(v[k][3], rounds);
        if (o->json)
            printf("{\"model\":\"%s\",\"cp\":%d,\"layout\":\"%s\",\"batch\":%d,\"seq\":%d,\"ms\":%.2f,\"tok_per_s\":%.1f,"
                   "\"cp_attention_ms\":%.2f,\"cp_wait_ms\":%.2f,\"comm_exposed_ms\":%.2f,\"vs_one_process\":%.3f}\n", o->model, o->cp,
                   names[k], o->batch, o->seq, m, tok / (m / 1e3), k ? a : 0, k ? w : 0, e, one / m);
        else if (k == 0)
            printf("%-14s %9.1f %9.1f %14s %12s %12.1f %13.2fx\n", names[k], m, tok / (m / 1e3), "-", "-", e, one / m);
        else
            printf("%-14s %9.1f %9.1f %14.1f %12.1f %12.1f %13.2fx\n", names[k], m, tok / (m / 1e3), a, w, e, one / m);
    }
    if (!o->json)
        printf("waited: of attention's time, waiting on the context-parallel group (the ring's passes its compute did not hide; "
               "all of every all-to-all); exposed: that and the gradients' allreduce the step did not hide\n");
    return 0;
}
