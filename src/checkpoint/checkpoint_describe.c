/* dtrain ckpt info: what a checkpoint holds, from its manifest (the format: checkpoint_write.c). */
#include "dtrain/train.h"
#include "checkpoint_internal.h"
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line: format, step, and the layout that saved it; *tp its tensor parallelism (1: none, older checkpoints). */
static void describe_layout(FILE *f, const cJSON *j, const char *sub, const char *mpath, double step, double ranks, double *tp) {
    const char *strategy = dt_ckpt_string(j, "settings", "strategy");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    double stages = 1;
    if (dt_ckpt_number(j, "settings", "tp", mpath, tp)) *tp = 1; /* older checkpoints: no tensor parallelism */
    if (dt_ckpt_number(j, "settings", "pp", mpath, &stages)) stages = 1;
    fprintf(f, "%s: format %d, step %.0f, saved by %.0f rank%s under %s", sub, cJSON_IsNumber(ver) ? ver->valueint : 0, step, ranks,
            ranks == 1 ? "" : "s", strategy ? strategy : "?");
    if (*tp > 1) fprintf(f, " with tensor parallelism %.0f", *tp);
    if (stages > 1) fprintf(f, "%s %.0f pipeline stages", *tp > 1 ? " and" : " with", stages);
    if (*tp > 1 || stages > 1) fprintf(f, " (each rank wrote its slices in place; any layout reads them)");
    fprintf(f, "\n");
}

/* The model's line: a language model's shape (g), or another kind's numbers as the manifest names them. */
static void describe_model(FILE *f, const cJSON *j, const char *kind, const dt_gpt2_config *g, double np) {
    if (g) {
        dt_lm_config r = dt_lm_config_resolve(g);
        fprintf(f, "model: %s, %d layers, %d heads", kind, g->num_layers, g->num_heads);
        if (r.kv_heads != r.num_heads) fprintf(f, " (%d K/V heads)", r.kv_heads);
        fprintf(f, ", %d channels, vocab %d (padded %d), %d positions, %.0f parameters\n", g->channels, g->vocab_size,
                g->padded_vocab_size, g->max_seq_len, np);
        return;
    }
    const cJSON *x;
    fprintf(f, "model: %s", kind);
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(j, "model"))
        if (cJSON_IsNumber(x) && strcmp(x->string, "parameters")) fprintf(f, ", %s %.0f", x->string, x->valuedouble);
    fprintf(f, ", %.0f parameters\n", np);
}

/* The optimizer, the precision (older checkpoints have none: they trained in fp32) and the loss scaler's state. */
static void describe_training(FILE *f, const cJSON *j) {
    const char *opt = dt_ckpt_string(j, "optimizer", "kind"), *prec = dt_ckpt_string(j, "settings", "precision");
    fprintf(f, "optimizer: %s\n", opt ? opt : "?");
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "loss_scaler");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(ls, "scale"), *it = cJSON_GetObjectItemCaseSensitive(ls, "iter");
    fprintf(f, "precision: %s", prec ? prec : "fp32");
    if (cJSON_IsNumber(sc) && cJSON_IsNumber(it)) fprintf(f, " (loss scale %g after %.0f steps)", sc->valuedouble, it->valuedouble);
    fprintf(f, "\n");
}

/* How params.f32 and optim.f32 were written: whole, sharded or in slices, each piece's parameters. */
static void describe_files(FILE *f, const cJSON *j, double tp) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(files, "params.f32"), "pieces");
    fprintf(f, "params.f32: %s\n", !cJSON_IsArray(pp) || cJSON_GetArraySize(pp) < 2 ? "whole"
                                   : tp > 1 ? "in pieces (the slices written in place, hashed by rank as below)"
                                            : "sharded (each rank wrote its slice, as below)");
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(files, "optim.f32"), "pieces");
    int n = cJSON_IsArray(pieces) ? cJSON_GetArraySize(pieces) : 0;
    fprintf(f, "optim.f32: %s\n", n > 1 ? "sharded" : "whole");
    for (int k = 0; k < n; k++) {
        const cJSON *pc = cJSON_GetArrayItem(pieces, k);
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(pc, "offset"), *c = cJSON_GetObjectItemCaseSensitive(pc, "count");
        if (cJSON_IsNumber(o) && cJSON_IsNumber(c))
            fprintf(f, "  piece %d (rank %d's %s): parameters [%.0f, %.0f)\n", k, k, tp > 1 ? "hash" : "slice", o->valuedouble,
                    o->valuedouble + c->valuedouble);
    }
}

static void describe_tensors(FILE *f, const cJSON *j) {
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "tensors"), *t;
    fprintf(f, "tensors: %d\n", cJSON_GetArraySize(ts));
    cJSON_ArrayForEach(t, ts) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name"), *off = cJSON_GetObjectItemCaseSensitive(t, "offset");
        char *shape = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(t, "shape"));
        fprintf(f, "  %-24s %-14s at %.0f\n", cJSON_IsString(name) ? name->valuestring : "?", shape ? shape : "?",
                cJSON_IsNumber(off) ? off->valuedouble : -1.0);
        free(shape);
    }
}

dt_status dt_checkpoint_describe(const char *dir, FILE *f) {
    char sub[4400], mpath[4500];
    cJSON *j;
    dt_status st = dt_ckpt_open_latest(dir, sub, mpath, &j);
    if (st) return st;
    dt_gpt2_config g;
    double step = 0, ranks = 0, np = 0, tp = 1;
    const char *kind = dt_ckpt_string(j, "model", "kind");
    bool gpt2 = kind && dt_family_find(kind); /* a language model of any family */
    if (!(st = gpt2 ? dt_ckpt_manifest_shape(j, mpath, &g) : kind ? DT_OK : dt_error(DT_ERR_IO, "%s: model.kind is missing", mpath)) &&
        !(st = dt_ckpt_count(j, NULL, "step", mpath, 1e9, &step)) &&
        !(st = dt_ckpt_count(j, "settings", "ranks", mpath, 1e9, &ranks)) && !(st = dt_ckpt_count(j, "model", "parameters", mpath, 1e15, &np))) {
        describe_layout(f, j, sub, mpath, step, ranks, &tp);
        describe_model(f, j, kind, gpt2 ? &g : NULL, np);
        describe_training(f, j);
        describe_files(f, j, tp);
        dt_ckpt_codec_describe(j, f);
        dt_ckpt_units_describe(j, f);
        describe_tensors(f, j);
    }
    cJSON_Delete(j);
    return st;
}
