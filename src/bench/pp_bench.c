/* dtrain bench train --pp N: pipeline parallelism on N stages (GPipe,
 * 1F1B, ZB-H1 and interleaved with 2 chunks a stage) against the two other ways to put N cores on one global batch of
 * M micro-batches: one process with N threads, and N data-parallel ranks;
 * with --baseline torch, PyTorch's torch.distributed.pipelining
 * (bench/torch_pp.py: ScheduleGPipe, Schedule1F1B and, against zb1,
 * ScheduleInterleavedZeroBubble with a stage per rank, and
 * ScheduleInterleaved1F1B with 2 stages a rank, over gloo, cut at
 * dtrain's split, from the baselines' virtual environment) on the same
 * model and batch. The runs alternate within each round; medians of the
 * steps after warm-up, then over the rounds. */
#include "dtrain/bench.h"
#include "dtrain/base.h"
#include "dtrain/pipeline.h"
#include "measure.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 16, OURS = 6, KINDS = 10 };
static const char *const names[KINDS] = { "one process", "data parallel", "PP gpipe", "PP 1f1b", "PP zb1", "PP interleaved", "PyTorch gpipe",
                                          "PyTorch 1f1b", "PyTorch zb1", "PyTorch interl." };
static const char *const scheds[4] = { "gpipe", "1f1b", "zb1", "interleaved" };

static int run_torch_pp(const dt_bench_train_opts *o, const char *weights, const char *split, const char *sched, double *ms) {
    char cmd[PATH_MAX * 3];
    if (dt_bench_venv_cmd(cmd, sizeof cmd, "torch_pp.py", 1)) return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "--nproc %d --weights %s --split %s --schedule %s --micro %d --batch %d --seq %d --steps %d "
             "--warmup %d --threads 1 --virtual 2 2>/dev/null", o->pp, weights, split, sched, o->micro, o->batch, o->seq, o->steps, o->warmup);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    *ms = dt_bench_median_key(p, "ms", 0, o->steps);
    int rc = pclose(p);
    if (rc != 0 || *ms < 0) {
        dt_log(DT_LOG_ERROR, "bench train: PyTorch's pipelining (bench/torch_pp.py, %s) failed on %d stages (exit %d)", sched, o->pp, rc);
        return 1;
    }
    return 0;
}

/* dtrain layout k: its options and rank count. The data-parallel ranks
 * split the micro-batches (or, when M does not divide, each micro-batch). */
static int layout(const dt_bench_train_opts *o, int k, dt_bench_train_opts *out, char *flags, size_t cap) {
    *out = *o;
    out->threads = 1;
    out->train_flags = flags;
    const char *more = o->train_flags ? o->train_flags : "";
    int accum = o->micro;
    if (k == 0) out->threads = o->pp;
    if (k == 1 && o->micro % o->pp == 0) accum = o->micro / o->pp;
    if (k == 1 && o->micro % o->pp) out->batch = o->batch / o->pp;
    if (k <= 1) snprintf(flags, cap, "--grad-accum %d %s", accum, more);
    else snprintf(flags, cap, "--grad-accum %d --pp %d --pp-schedule %s %s", accum, o->pp, scheds[k - 2], more);
    return k == 0 ? 1 : o->pp;
}

/* The stages' first units, and the interleaved chunks' (2 a stage), for o's model; 0, or 2 with the reason said. The
 * micro-batches must divide into the stages (the interleaved schedule's need; the data-parallel layout splits them). */
static int splits(const dt_bench_train_opts *o, int *first, int *chunks) {
    dt_gpt2_config cfg;
    if (dt_gpt2_preset(o->model, &cfg) || dt_gpt2_split_stages(&cfg, o->seq, o->pp, first) ||
        dt_gpt2_split_stages(&cfg, o->seq, 2 * o->pp, chunks)) {
        dt_log(DT_LOG_ERROR, "bench train --pp %d: %s", o->pp, dt_last_error());
        return 2;
    }
    if (o->micro % o->pp) {
        dt_log(DT_LOG_ERROR, "bench train: --micro-batches %d is not a multiple of --pp %d (the interleaved schedule's need)", o->micro, o->pp);
        return 2;
    }
    return 0;
}

/* The rounds: every layout (and with a baseline, PyTorch's schedules) in turn, the order reversed every other round (a
 * drifting machine slows each alike); each one's step in ms[k][r]. */
static int rounds_of(const dt_bench_train_opts *o, int kinds, int rounds, const char *self, const char *weights, const char *data,
                     const char *split, const char *split2, double ms[][MAXR]) {
    double ex[KINDS][MAXR];
    int rc = 0;
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < kinds && !rc; i++) {
            int k = r % 2 ? kinds - 1 - i : i;
            ex[k][r] = 0;
            if (k >= OURS) { rc = run_torch_pp(o, weights, k == KINDS - 1 ? split2 : split, scheds[k - OURS], &ms[k][r]); continue; }
            dt_bench_train_opts lo;
            char flags[512];
            int n = layout(o, k, &lo, flags, sizeof flags);
            rc = dt_bench_run_dtrain(&lo, n, false, self, weights, data, &ms[k][r], &ex[k][r]);
        }
    return rc;
}

/* Each layout's median step, tokens a second and speed against one process (lines, or JSON), then the ratios. */
static void print_table(const dt_bench_train_opts *o, int kinds, int rounds, double ms[][MAXR]) {
    double one = dt_bench_median(ms[0], rounds), tok = (double)o->batch * o->micro * o->seq;
    if (!o->json) printf("%-16s %9s %10s %14s\n", "layout", "ms/step", "tok/s", "vs one process");
    for (int k = 0; k < kinds; k++) {
        double m = dt_bench_median(ms[k], rounds);
        if (o->json)
            printf("{\"model\":\"%s\",\"pp\":%d,\"layout\":\"%s\",\"micro_batches\":%d,\"batch\":%d,\"seq\":%d,\"ms\":%.2f,\"tok_per_s\":%.1f,"
                   "\"vs_one_process\":%.3f}\n", o->model, o->pp, names[k], o->micro, o->batch, o->seq, m, tok / (m / 1e3), one / m);
        else printf("%-16s %9.1f %10.1f %13.2fx\n", names[k], m, tok / (m / 1e3), one / m);
    }
    if (!o->json && o->baseline)
        printf("dtrain over PyTorch (tok/s): gpipe %.2fx, 1f1b %.2fx, zb1 %.2fx, interleaved %.2fx; zb1 over 1f1b: dtrain %.2fx, PyTorch %.2fx\n",
               dt_bench_median(ms[OURS], rounds) / dt_bench_median(ms[2], rounds),
               dt_bench_median(ms[OURS + 1], rounds) / dt_bench_median(ms[3], rounds),
               dt_bench_median(ms[OURS + 2], rounds) / dt_bench_median(ms[4], rounds),
               dt_bench_median(ms[OURS + 3], rounds) / dt_bench_median(ms[5], rounds),
               dt_bench_median(ms[3], rounds) / dt_bench_median(ms[4], rounds),
               dt_bench_median(ms[OURS + 1], rounds) / dt_bench_median(ms[OURS + 2], rounds));
    else if (!o->json)
        printf("zb1 over 1f1b (tok/s): %.2fx\n", dt_bench_median(ms[3], rounds) / dt_bench_median(ms[4], rounds));
}

int dt_bench_train_pp(const dt_bench_train_opts *o) {
    dt_bench_train_opts opt = *o;
    if (opt.micro < 1) opt.micro = 2 * o->pp;
    o = &opt;
    int first[257], chunks[513];
    int rc = splits(o, first, chunks);
    if (rc) return rc;
    char split[1024] = "", split2[2048] = "";
    for (int s = 0, k = 0; s < o->pp; s++) k += snprintf(split + k, sizeof split - (size_t)k, "%s%d", s ? "," : "", first[s]);
    for (int s = 0, k = 0; s < 2 * o->pp; s++) k += snprintf(split2 + k, sizeof split2 - (size_t)k, "%s%d", s ? "," : "", chunks[s]);
    char self[PATH_MAX], weights[] = "/tmp/dtrain-bench-weights-XXXXXX", data[] = "/tmp/dtrain-bench-tokens-XXXXXX";
    if (dt_bench_self_dir(self, sizeof self)) { dt_log(DT_LOG_ERROR, "bench train: cannot find my own executable"); return 1; }
    int rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds;
    if ((rc = dt_bench_make_inputs(o, o->pp * o->micro, weights, data))) return rc;
    int kinds = o->baseline ? KINDS : OURS;
    double ms[KINDS][MAXR];
    if (!o->json)
        printf("# dtrain bench train --pp %d: GPT-2 %s, global batch %d micro-batches of %d x %d, AdamW, %ld cores; one process with %d "
               "threads, %d data-parallel ranks, %d pipeline stages (units from %s; interleaved: chunks from %s; 1 thread each)%s; medians of %d steps after %d "
               "warm-up, %d round(s)\n", o->pp, o->model, o->micro, o->batch, o->seq, sysconf(_SC_NPROCESSORS_ONLN), o->pp, o->pp, o->pp,
               split, split2, o->baseline ? ", PyTorch's pipelining" : "", o->steps, o->warmup, rounds);
    rc = rounds_of(o, kinds, rounds, self, weights, data, split, split2, ms);
    unlink(weights);
    unlink(data);
    if (rc) return rc;
    print_table(o, kinds, rounds, ms);
    return 0;
}
