/* What the benchmarks share: medians, and where this executable lives (the
 * baselines' scripts and programs are found next to it). */
#ifndef DTRAIN_BENCH_MEASURE_H
#define DTRAIN_BENCH_MEASURE_H

#include <stddef.h>

/* Median of n values (sorts v). */
double dt_bench_median(double *v, int n);
/* The directory of this executable (build/), without a trailing slash; 0 on success. */
int dt_bench_self_dir(char *out, size_t cap);

/* The start of a shell command running bench/SCRIPT (a PyTorch baseline)
 * with threads threads, into out; the caller appends the script's flags.
 * 0 on success. */
int dt_bench_python_cmd(char *out, size_t cap, const char *script, int threads);

#endif
