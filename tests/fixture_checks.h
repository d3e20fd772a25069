/* What the tests against Python libraries' fixtures (TRL, PEFT, kfac-pytorch) share: a check's line, a relative error, a fixture's
 * settings and model, and every tensor of a model's store against a fixture's "<prefix><HF name>" tensors. Header-only. */
#ifndef DTRAIN_TESTS_FIXTURE_CHECKS_H
#define DTRAIN_TESTS_FIXTURE_CHECKS_H

#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/model.h"
#include "dtrain/program.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

/* A fine-tuning file's rows (dir/file, by template kind with the tokenizer dir/sft/tokenizer, rows of seq) and the
 * fixture that holds TRL's rows of it (dir/fixture); the caller closes and destroys all three. */
static inline dt_status fixture_sft_open(const char *dir, const char *tokenizer, dt_chat_kind kind, int seq, const char *file,
                                         const char *fixture, dt_bpe **tok, dt_sft **d, dt_safetensors **f) {
    char path[600];
    snprintf(path, sizeof path, "%s/sft/%s", dir, tokenizer);
    dt_status st = dt_bpe_load_json(path, tok);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (!st) st = dt_sft_load(path, *tok, kind, -1, seq, d); /* (chats: each answer ends with its template's end of turn) */
    snprintf(path, sizeof path, "%s/%s", dir, fixture);
    if (!st) st = dt_safetensors_open(path, f);
    return st;
}

static void check(const char *what, bool ok, const char *detail) {
    if (!ok) failed++;
    printf("%-72s %s%s%s\n", what, ok ? "ok" : "FAIL", detail ? "  " : "", detail ? detail : "");
}

static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (double)(a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d) / (sqrt(r) + 1e-30);
}

/* A settings object's number under key (NaN: missing). */
static inline double fixture_number(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A fixture file's settings: its metadata under key as JSON (*out: the caller deletes it), or an error naming it. */
static inline dt_status fixture_settings(dt_safetensors *f, const char *path, const char *key, cJSON **out) {
    const char *json = dt_safetensors_metadata(f, key);
    *out = json ? cJSON_Parse(json) : NULL;
    return *out ? DT_OK : dt_error(DT_ERR_IO, "%s: no \"%s\" settings in its metadata", path, key);
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

/* The worst relative error of store (a store in m's layout: its parameters or gradients) against f's "<prefix><name>"
 * tensors (vocab: the real rows of a padded table; a stacked tensor: each expert's piece under its own name); the
 * worst tensor's name into *worst_name (NULL: not wanted). */
static dt_status fixture_err(dt_safetensors *f, const dt_model *m, const float *store, const char *prefix, int vocab, double *worst,
                             const char **worst_name) {
    dt_status st = DT_OK;
    *worst = 0;
    for (int i = 0; !st && i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        for (int k = 0; !st && k < dt_tensor_hf_pieces(t); k++) {
            char piece[128], name[160];
            int ndim, dims[4];
            size_t at, n = 1;
            dt_tensor_hf_piece(t, k, piece, sizeof piece, &ndim, dims, &at);
            snprintf(name, sizeof name, "%s%s", prefix, piece);
            if (t->split == DT_SPLIT_VOCAB) dims[0] = vocab;
            for (int d = 0; d < ndim; d++) n *= (size_t)dims[d];
            float *want = malloc(n * sizeof(float));
            if (!want) return dt_error(DT_ERR_NOMEM, "out of memory");
            if (!(st = dt_safetensors_read(f, name, ndim, dims, 0, want))) {
                double e = rel_err(store + t->offset + at, want, n);
                if (e > *worst && worst_name) *worst_name = t->hf;
                *worst = fmax(*worst, e);
            }
            free(want);
        }
    }
    return st;
}

/* The worst relative error of m's gradients of the named tensors against f's "<prefix><name>" (each must be there). */
static inline dt_status fixture_named_grads_err(dt_safetensors *f, const dt_model *m, const char *prefix, const cJSON *names, double *worst) {
    const cJSON *n;
    int found = 0;
    *worst = 0;
    cJSON_ArrayForEach(n, names) {
        for (int i = 0; i < m->ntensors; i++) {
            const dt_tensor_info *t = &m->tensors[i];
            char piece[128], key[200];
            int ndim, dims[4];
            size_t at, count = 1;
            if (dt_tensor_hf_pieces(t) != 1) continue;
            dt_tensor_hf_piece(t, 0, piece, sizeof piece, &ndim, dims, &at);
            if (strcmp(piece, n->valuestring)) continue;
            for (int d = 0; d < ndim; d++) count *= (size_t)dims[d];
            float *want = malloc(count * sizeof(float));
            snprintf(key, sizeof key, "%s%s", prefix, piece);
            dt_status st = want ? dt_safetensors_read(f, key, ndim, dims, 0, want) : dt_error(DT_ERR_NOMEM, "out of memory");
            if (!st) *worst = fmax(*worst, rel_err(m->grads(m->self) + t->offset + at, want, count)), found++;
            free(want);
            if (st) return st;
        }
    }
    return found == cJSON_GetArraySize(names) ? DT_OK : dt_error(DT_ERR_IO, "%d of %d named gradients found", found, cJSON_GetArraySize(names));
}

/* The worst relative error of m's gradients against f's "grad.<name>". */
static inline dt_status grads_err(dt_safetensors *f, const dt_model *m, int vocab, double *worst) {
    return fixture_err(f, m, m->grads(m->self), "grad.", vocab, worst, NULL);
}

#endif
