/* What the tests against Hugging Face's libraries (TRL, PEFT) share: a check's line, a relative error, and every
 * gradient of a model against a fixture's "grad.<HF name>" tensors. Header-only. */
#ifndef DTRAIN_TESTS_FIXTURE_CHECKS_H
#define DTRAIN_TESTS_FIXTURE_CHECKS_H

#include "dtrain/io.h"
#include "dtrain/model.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int failed;

static void check(const char *what, bool ok, const char *detail) {
    if (!ok) failed++;
    printf("%-72s %s%s%s\n", what, ok ? "ok" : "FAIL", detail ? "  " : "", detail ? detail : "");
}

static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (double)(a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d) / (sqrt(r) + 1e-30);
}

/* A fixture file's model: its "config" metadata (a config.json) as a config; the program's (base) weights from the file. */
static inline dt_status fixture_config(dt_safetensors *f, const char *path, dt_lm_config *cfg) {
    const char *json = dt_safetensors_metadata(f, "config");
    return json ? dt_lm_config_from_hf(json, path, cfg) : dt_error(DT_ERR_IO, "%s: no config", path);
}

static inline dt_status fixture_weights(dt_safetensors *f, dt_program *p) {
    dt_model m;
    dt_program_base_model(p, &m);
    return dt_safetensors_read_model(f, &m, dt_program_config(p)->vocab_size, NULL);
}

/* Both: the file's model made and read. */
static inline dt_status fixture_program(dt_safetensors *f, const char *path, dt_lm_config *cfg, dt_program **p) {
    dt_status st = fixture_config(f, path, cfg);
    if (!st) st = dt_program_create(cfg, p);
    return st ? st : fixture_weights(f, *p);
}

/* The worst relative error of m's gradients against f's "grad.<name>" (vocab: the real rows of a padded table; a
 * stacked tensor: each expert's piece under its own name). */
static dt_status grads_err(dt_safetensors *f, const dt_model *m, int vocab, double *worst) {
    dt_status st = DT_OK;
    *worst = 0;
    for (int i = 0; !st && i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        for (int k = 0; !st && k < dt_tensor_hf_pieces(t); k++) {
            char piece[128], name[136];
            int ndim, dims[4];
            size_t at, n = 1;
            dt_tensor_hf_piece(t, k, piece, sizeof piece, &ndim, dims, &at);
            snprintf(name, sizeof name, "grad.%s", piece);
            if (t->split == DT_SPLIT_VOCAB) dims[0] = vocab;
            for (int d = 0; d < ndim; d++) n *= (size_t)dims[d];
            float *want = malloc(n * sizeof(float));
            if (!want) return dt_error(DT_ERR_NOMEM, "out of memory");
            if (!(st = dt_safetensors_read(f, name, ndim, dims, 0, want)))
                *worst = fmax(*worst, rel_err(m->grads(m->self) + t->offset + at, want, n));
            free(want);
        }
    }
    return st;
}

#endif
