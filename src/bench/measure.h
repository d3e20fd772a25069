/* What the benchmarks share: medians, and where this executable lives (the
 * baselines' scripts and programs are found next to it). */
#ifndef DTRAIN_BENCH_MEASURE_H
#define DTRAIN_BENCH_MEASURE_H

#include "dtrain/bench.h"
#include "dtrain/comm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* How much longer one core's GEMMs take while a thread of this rank keeps exchanging n floats each way with peer on
 * another machine (buf: 2 n floats of w's): beside over alone, less 1 (0 if none, or if an exchange failed). Collective
 * for this rank and peer. */
double dt_bench_link_slowdown(dt_comm *w, int peer, float *buf, size_t n);

/* Median of n values (sorts v). */
double dt_bench_median(double *v, int n);
/* Appends the values of key in the JSON lines of f, after skip of them, to v[*n..cap). */
void dt_bench_collect(FILE *f, const char *key, int skip, double *v, int *n, int cap);
/* The median of key's values in the JSON lines of f after skip of them; -1 if fewer than want. */
double dt_bench_median_key(FILE *f, const char *key, int skip, int want);
/* copies runs of the shell command cmd side by side (in it, $r is each
 * copy's index: 0, 1, ...), waiting for all: 0 when every one exited 0. */
int dt_bench_run_copies(const char *cmd, int copies);
/* A failed run's messages (the file at path) onto stderr. */
void dt_bench_print_file(const char *path);
/* This executable's path (1: not found). */
int dt_bench_self(char *out, size_t cap);
/* The directory of this executable (build/), without a trailing slash; 0 on success. */
int dt_bench_self_dir(char *out, size_t cap);

/* The start of a shell command running bench/SCRIPT (a PyTorch baseline)
 * with threads threads, into out; the caller appends the script's flags.
 * 0 on success. */
int dt_bench_python_cmd(char *out, size_t cap, const char *script, int threads);
/* The same with the baselines' virtual environment ($DTRAIN_VENV, else
 * .venv-baselines next to build/); 1, saying how to make it, when missing. */
int dt_bench_venv_cmd(char *out, size_t cap, const char *script, int threads);

/* The same weights (an llm.c file of the preset, seed 1337) for dtrain and
 * the baselines, and random tokens enough for maxn ranks' steps, into
 * mkstemp paths made from the templates weights and data. */
int dt_bench_make_inputs(const dt_bench_train_opts *o, int maxn, char *weights, char *data);
/* dtrain train --nproc N with o->train_flags (or, indep, N independent
 * 1-rank runs side by side): median ms per step after the warm-up, and
 * median exposed communication. */
int dt_bench_run_dtrain(const dt_bench_train_opts *o, int nproc, bool indep, const char *self, const char *weights,
                        const char *data, double *ms, double *exposed);
/* The same, with the medians of any metrics keys[0..n) into out (keys[0]
 * must be "ms"; a key the metrics lack: -1). */
int dt_bench_run_dtrain_keys(const dt_bench_train_opts *o, int nproc, bool indep, const char *self, const char *weights,
                             const char *data, const char *const *keys, int nkeys, double *out);

#endif
