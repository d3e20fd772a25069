/* dtrain bench train --nproc N --zero S [--baseline fsdp|deepspeed]: ZeRO
 * stage S against dtrain's own DDP and against the sharded trainers of
 * PyTorch 2.x and DeepSpeed at the same stage, on the same model from the
 * same weights, one after the other in each round (bench/torch_zero.py, in
 * the virtual environment of scripts/make-baselines-venv.sh):
 *   stage 1: ZeroRedundancyOptimizer (fsdp), DeepSpeed ZeRO-1
 *   stage 2: FSDP2 without resharding after forward (fsdp), DeepSpeed ZeRO-2
 *   stage 3: FSDP2 resharding after forward and without (fsdp), DeepSpeed ZeRO-3
 * Medians over rounds of each run's median ms per step. */
#include "dtrain/bench.h"
#include "measure.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, MAXC = 6 };

/* A baseline's median ms per step (its rank 0's JSON lines). */
static int run_python(const dt_bench_train_opts *o, int nproc, const char *mode, const char *weights, double *ms) {
    char cmd[PATH_MAX * 3];
    if (dt_bench_venv_cmd(cmd, sizeof cmd, "torch_zero.py", o->threads)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--mode %s --nproc %d --weights %s --batch %d --seq %d --steps %d --warmup %d --threads %d 2>&1",
             mode, nproc, weights, o->batch, o->seq, o->steps, o->warmup, o->threads);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    double v[4096];
    int n = 0;
    char line[8192], last[8192] = "";
    while (fgets(line, sizeof line, p)) {
        cJSON *j = line[0] == '{' ? cJSON_Parse(line) : NULL;
        cJSON *x = j ? cJSON_GetObjectItemCaseSensitive(j, "ms") : NULL;
        if (cJSON_IsNumber(x) && n < 4096) v[n++] = x->valuedouble;
        else snprintf(last, sizeof last, "%s", line);
        cJSON_Delete(j);
    }
    int rc = pclose(p);
    if (rc != 0 || n < o->steps) {
        dt_log(DT_LOG_ERROR, "bench train: the %s baseline failed with %d ranks (exit %d): %s", mode, nproc, rc, last);
        return 1;
    }
    *ms = dt_bench_median(v, n);
    return 0;
}

/* The columns: dtrain DDP, dtrain ZeRO-S, then the baselines of the stage --baseline asks for (modes: torch_zero.py's);
 * their count. */
static int columns(const dt_bench_train_opts *o, int S, const char *zname, const char **names, const char **modes) {
    names[0] = "dtrain ddp", names[1] = zname;
    int nc = 2;
    bool fsdp = o->baseline && !strcmp(o->baseline, "fsdp"), ds = o->baseline && !strcmp(o->baseline, "deepspeed");
    bool both = o->baseline && !strcmp(o->baseline, "all");
    if (fsdp || both) {
        if (S == 1) names[nc] = "torch ZeroRedundancyOptimizer", modes[nc++] = "zero1";
        if (S >= 2) names[nc] = "torch FSDP2, kept after forward", modes[nc++] = "fsdp-keep";
        if (S == 3) names[nc] = "torch FSDP2, resharded", modes[nc++] = "fsdp";
    }
    static const char *const dsm[4] = { NULL, "deepspeed1", "deepspeed2", "deepspeed3" };
    static const char *const dsn[4] = { NULL, "DeepSpeed ZeRO-1 (cpu)", "DeepSpeed ZeRO-2 (cpu)", "DeepSpeed ZeRO-3 (cpu)" };
    if (ds || both) names[nc] = dsn[S], modes[nc++] = dsm[S];
    return nc;
}

/* Each column's median over the rounds it finished (-1: none), and the table against DDP and ZeRO-S. */
static void print_table(const dt_bench_train_opts *o, int n, int nc, int rounds, const char **names, double ms[MAXC][MAXR]) {
    double tokens = (double)n * o->batch * o->seq, med[MAXC];
    printf("%-32s | %9s %12s | %8s | %s\n", "", "ms/step", "tok/s total", "/ DDP", "dtrain zero's tok/s over it");
    for (int c = 0; c < nc; c++) {
        int k = 0;
        for (int r = 0; r < rounds; r++) if (ms[c][r] >= 0) ms[c][k++] = ms[c][r];
        med[c] = k ? dt_bench_median(ms[c], k) : -1;
    }
    for (int c = 0; c < nc; c++) {
        if (med[c] < 0) { printf("%-32s | failed in every round\n", names[c]); continue; }
        printf("%-32s | %9.1f %12.1f | %7.3fx |", names[c], med[c], tokens / (med[c] / 1e3), med[c] / med[0]);
        if (c != 1) printf(" %.2fx", med[c] / med[1]);
        printf("\n");
    }
    printf("/ DDP: time per step over dtrain DDP's (below 1: faster)\n");
}

int dt_bench_train_zero(const dt_bench_train_opts *o) {
    if (o->nnprocs != 1 || o->nprocs[0] < 2) {
        dt_log(DT_LOG_ERROR, "bench train: --zero %d compares one rank count (--nproc 2, say)", o->zero);
        return 2;
    }
    char self[PATH_MAX];
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    int n = o->nprocs[0], S = o->zero;
    const char *names[MAXC] = { NULL }, *modes[MAXC] = { NULL };
    char zname[32], zflags[1024];
    snprintf(zname, sizeof zname, "dtrain zero%d", S);
    snprintf(zflags, sizeof zflags, "--zero %d %s", S, o->train_flags ? o->train_flags : "");
    int nc = columns(o, S, zname, names, modes);
    char weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    int rc = dt_bench_make_inputs(o, n, weights, data);
    if (rc) return rc;
    int rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds;
    double ms[MAXC][MAXR], unused;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("# dtrain bench train: ZeRO stage %d, GPT-2 %s, batch %d x seq %d per rank, AdamW, %d ranks x %d thread(s), %ld cores; "
           "medians of %d steps after %d warm-up, %d round(s), the runs alternating in each\n",
           S, o->model, o->batch, o->seq, n, o->threads, cores, o->steps, o->warmup, rounds);
    for (int r = 0; r < rounds && !rc; r++)
        for (int c = 0; c < nc && !rc; c++) {
            dt_bench_train_opts oc = *o;
            if (c == 1) oc.train_flags = zflags;
            if (c < 2) rc = dt_bench_run_dtrain(&oc, n, false, self, weights, data, &ms[c][r], &unused);
            else if (run_python(o, n, modes[c], weights, &ms[c][r])) {
                /* a baseline that fails (it has: DeepSpeed ZeRO-3 aborting on 124M) is reported, and the others go on */
                ms[c][r] = -1;
                printf("round %d: %-32s failed (its message is above)\n", r + 1, names[c]);
                continue;
            }
            if (!rc) { printf("round %d: %-32s %9.1f ms/step\n", r + 1, names[c], ms[c][r]); fflush(stdout); }
        }
    unlink(weights);
    unlink(data);
    if (!rc) print_table(o, n, nc, rounds, names, ms);
    return rc;
}
