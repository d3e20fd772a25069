/* dtrain obs layer: seeing a run. The trace file (Chrome trace-event JSON of
 * what base's recorder holds, every rank in one file), the machine's peak
 * for MFU, and the HTML report of a run directory. */
#ifndef DTRAIN_OBS_H
#define DTRAIN_OBS_H

#include "dtrain/base.h"
#include "dtrain/comm.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A trace of steps [first, last] (1-based, inclusive) into path. Collective
 * over w (NULL: one process): aligns the ranks' clocks to rank 0's and has
 * rank 0 check that path can be written. */
typedef struct dt_trace_file dt_trace_file;
dt_status dt_trace_file_create(const char *path, dt_comm *w, int first, int last, dt_trace_file **out);
/* At the start of each step: records while step is in the window. */
void dt_trace_file_step(dt_trace_file *t, int step);
/* Collective: every rank's events to rank 0, which writes the file
 * (one process per rank, one thread per track). */
dt_status dt_trace_file_write(dt_trace_file *t);
void dt_trace_file_destroy(dt_trace_file *t);
/* "A:B" -> first, last (1 <= A <= B). */
dt_status dt_trace_parse_steps(const char *s, int *first, int *last);

/* sgemm (2048^3, through BLAS) on `threads` threads: GFLOP/s, median of 5. */
double dt_peak_measure(int threads);
/* The machine's matmul peak per thread, for MFU: $DTRAIN_PEAK_GFLOPS if set,
 * else the cache (~/.cache/dtrain/peak.json, kept per CPU model), else
 * measured now on one thread and cached. *source says which. */
dt_status dt_peak_per_thread(double *gflops, const char **source);
/* Stores a measurement in the cache (dtrain bench gemm). */
dt_status dt_peak_save(double gflops_one_thread);
/* The same for the bf16 GEMM (dt_gemm_bf16), the peak of bf16 runs that
 * use it: measured on one thread (2048^3) and cached beside sgemm's. */
double dt_peak_measure_bf16(int threads);
dt_status dt_peak_bf16_per_thread(double *gflops, const char **source);
/* key's value in this machine's cache (in [0, 1e6)), or false; and a value kept there under key. */
bool dt_peak_lookup(const char *key, double *value);
dt_status dt_peak_save_rate(const char *key, double value);
/* Another rate of this machine kept in the same cache under key (below 1e6:
 * GB/s or GFLOP/s): the cache's if this CPU's, else measure(arg), saved (measure NULL: 0, nothing saved). */
dt_status dt_peak_cached_rate(const char *key, double (*measure)(int), int arg, double *value);

/* TensorBoard event files (tensorboard.c): scalars a step at a time into a new events.out.tfevents.* in dir,
 * which `tensorboard --logdir dir` shows. */
typedef struct dt_tb_writer dt_tb_writer;
dt_status dt_tb_create(const char *dir, dt_tb_writer **out);
/* One scalar of the step being gathered (at most 16 a step; w may be NULL). */
void dt_tb_scalar(dt_tb_writer *w, const char *tag, double value);
/* The gathered scalars as one event of step, written and flushed. */
dt_status dt_tb_step(dt_tb_writer *w, long step);
const char *dt_tb_path(const dt_tb_writer *w);
void dt_tb_destroy(dt_tb_writer *w);

/* A resumed run's metrics file keeps only the rows up to last_step, the
 * checkpoint's (*dropped: the rows removed; a missing file is fine). */
dt_status dt_metrics_truncate(const char *path, int last_step, int *dropped);
/* After a metrics row (of step): flushed; a write that failed (a full disk, a
 * lost mount) is said once, naming the file and the step, and *f is closed
 * and set to NULL, so the run goes on without it rather than losing rows
 * unseen. Returns false when it failed. */
bool dt_metrics_flush(FILE **f, const char *path, long step);
/* An HTML page of the run in dir (metrics.jsonl, and run.json, trace.json,
 * scaling.json where present): self-contained (Chart.js inlined), offline. */
dt_status dt_report_write(const char *dir, const char *html_path);

#ifdef __cplusplus
}
#endif
#endif
