/* A gradient codec's state in a checkpoint (codec.f32): every data-parallel rank's own state, rank after rank (its
 * residuals, error feedback, then DGC's velocities or 1-bit Adam's momentum, then 1-bit Adam's server errors, each in
 * the table's order), then the Qs (the same on every rank). Saved once a step was compressed;
 * resumed by a run of the same codec, rank and ranks, bit for bit (DeepSpeed resets its error buffers on load). Another
 * codec or rank count starts its state afresh, said. The manifest's "codec" section says what the file holds. Under a
 * pipeline each stage's data-parallel group compresses its own tensors: its first rank writes codec-stageSofP.f32, the
 * section's "pieces" say each one's size, and only the same stages (and chunks) resume it. */
#include "dtrain/train.h"
#include "checkpoint_internal.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank's own state: the residuals, then the velocities (DGC's, 1-bit Adam's momentum), then the server errors (1-bit
 * Adam's); a codec without one has none of it. */
static const dt_codec_state_kind own[] = { DT_CODEC_RESIDUAL, DT_CODEC_VELOCITY, DT_CODEC_SERVER };

static size_t own_size(const dt_codec *k) {
    size_t n = 0;
    for (int i = 0; i < 3; i++) n += dt_codec_state_size(k, own[i]);
    return n;
}

static dt_status own_io(dt_codec *k, float *buf, int load) {
    dt_status st = DT_OK;
    for (int i = 0; i < 3 && !st; i++) {
        st = dt_codec_state_io(k, own[i], buf, load);
        buf += dt_codec_state_size(k, own[i]);
    }
    return st;
}

dt_status dt_checkpoint_codec_gather(dt_engine *e, dt_comm *w, dt_checkpoint_model *cm) {
    dt_codec *k = dt_engine_codec(e);
    cm->codec_state = NULL;
    cm->codec_floats = cm->codec_shared = 0;
    cm->codec_ranks = w ? dt_comm_size(w) : 1;
    if (!k || !dt_codec_has_state(k)) return DT_OK;
    size_t R = own_size(k), Q = dt_codec_state_size(k, DT_CODEC_Q), S = dt_codec_shared_size(k), p = (size_t)cm->codec_ranks;
    bool root = !w || dt_comm_rank(w) == 0;
    float *mine = malloc((R ? R : 1) * sizeof *mine), *all = root ? malloc((p * R + Q + S + 1) * sizeof *all) : NULL;
    dt_status st = dt_ckpt_every_rank(w, mine && (all || !root) && !own_io(k, mine, 0), "hold the codec's state to save");
    if (!st) st = w ? dt_comm_gather(w, mine, all, R, DT_F32, 0) : (memcpy(all, mine, R * sizeof *mine), DT_OK);
    if (!st && root) st = dt_codec_state_io(k, DT_CODEC_Q, all + p * R, 0);
    if (!st && root) st = dt_codec_shared_io(k, all + p * R + Q, S, 0);
    free(mine);
    if (st || !root) { free(all); return st; }
    cm->codec_state = all;
    cm->codec_floats = p * R + Q + S;
    cm->codec_shared = S;
    return DT_OK;
}

/* The file a stage's state is in: codec.f32, or a pipeline stage's own. */
static void file_of(int stage, int stages, char out[48]) {
    if (stages > 1) snprintf(out, 48, "codec-stage%dof%d.f32", stage, stages);
    else snprintf(out, 48, "codec.f32");
}

dt_status dt_ckpt_codec_collect(dt_comm *w, const dt_checkpoint_model *cm, dt_ckpt_codec_meta **out, int *n) {
    int p = w ? dt_comm_size(w) : 1;
    uint64_t mine[5] = { cm->codec_floats > 0, (uint64_t)(cm->stages > 1 ? cm->stage : 0), cm->codec_floats, cm->codec_shared, 0 };
    if (mine[0]) mine[4] = dt_hash_words(DT_HASH_INIT, cm->codec_state, cm->codec_floats);
    uint64_t *all = calloc(5 * (size_t)p, sizeof *all);
    *out = calloc((size_t)p + 1, sizeof **out), *n = 0;
    dt_status st = dt_ckpt_every_rank(w, all && *out, "hold the stages' codec files' sizes");
    if (!st) st = w ? dt_comm_allgather(w, mine, all, 5, DT_I64) : (memcpy(all, mine, sizeof mine), DT_OK);
    for (int r = 0; r < p && !st; r++) /* in rank order: the stages' first ranks are in stage order */
        if (all[5 * r]) (*out)[(*n)++] = (dt_ckpt_codec_meta){ (int)all[5 * r + 1], all[5 * r + 2], all[5 * r + 3], all[5 * r + 4] };
    free(all);
    if (st) free(*out), *out = NULL, *n = 0;
    return st;
}

void dt_ckpt_codec_manifest(cJSON *j, const dt_checkpoint_model *cm, const dt_ckpt_codec_meta *pc, int n, const dt_train_config *c) {
    if (!n) return;
    cJSON *x = cJSON_AddObjectToObject(j, "codec"), *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    cJSON_AddStringToObject(x, "kind", dt_codec_name(c->codec.kind));
    cJSON_AddNumberToObject(x, "rank", c->codec.rank);
    cJSON_AddNumberToObject(x, "start", c->codec.start);
    cJSON_AddNumberToObject(x, "min_rate", c->codec.min_rate);
    cJSON_AddNumberToObject(x, "density", dt_f32_decimal(c->codec.density));
    cJSON_AddNumberToObject(x, "warmup", c->codec.warmup);
    cJSON_AddNumberToObject(x, "ranks", cm->codec_ranks);
    cJSON *arr = NULL;
    if (cm->stages > 1) {
        cJSON_AddNumberToObject(x, "stages", cm->stages);
        cJSON_AddNumberToObject(x, "chunks", cm->chunks > 1 ? cm->chunks : 1);
        arr = cJSON_AddArrayToObject(x, "pieces");
    }
    for (int i = 0; i < n; i++) {
        cJSON *at = x;
        if (arr) {
            at = cJSON_CreateObject();
            cJSON_AddNumberToObject(at, "stage", pc[i].stage);
            cJSON_AddItemToArray(arr, at);
        }
        cJSON_AddNumberToObject(at, "floats", (double)pc[i].floats);
        if (pc[i].shared) cJSON_AddNumberToObject(at, "shared", (double)pc[i].shared);
        char h[24], file[48];
        file_of(pc[i].stage, cm->stages, file);
        cJSON *f = cJSON_AddObjectToObject(files, file);
        snprintf(h, sizeof h, "%016llx", (unsigned long long)pc[i].hash);
        cJSON_AddNumberToObject(f, "bytes", (double)(pc[i].floats * sizeof(float)));
        cJSON_AddStringToObject(f, "fnv1a64", h);
    }
}

dt_status dt_ckpt_codec_write(const char *tmp, const dt_checkpoint_model *cm) {
    if (!cm->codec_floats) return DT_OK;
    char path[4200], file[48];
    file_of(cm->stage, cm->stages, file);
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    size_t bytes = cm->codec_floats * sizeof(float);
    const void *p[1] = { cm->codec_state };
    return dt_file_write_atomic(path, p, &bytes, 1);
}

/* Whether a manifest's files entry is a codec's state (codec.f32, codec-stageSofP.f32). */
static bool codec_file(const char *name) {
    int g, q, end = 0;
    return !strcmp(name, "codec.f32") || (sscanf(name, "codec-stage%dof%d.f32%n", &g, &q, &end) == 2 && !name[end]);
}

dt_status dt_ckpt_codec_verify(const char *dir, const cJSON *j, char *listed, size_t cap) {
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(j, "files")) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(f, "bytes");
        if (!codec_file(f->string) || !cJSON_IsNumber(b)) continue;
        dt_status st = dt_ckpt_verify_file(dir, j, f->string, 1, (size_t)(b->valuedouble / sizeof(float)), NULL);
        if (st) return st;
        size_t at = strlen(listed);
        snprintf(listed + at, cap - at, ", %s", f->string);
    }
    return DT_OK;
}

void dt_ckpt_codec_describe(const cJSON *j, FILE *f) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "codec"), *ranks = cJSON_GetObjectItemCaseSensitive(x, "ranks"), *e;
    const char *kind = dt_ckpt_string(j, "codec", "kind");
    if (!kind || !cJSON_IsNumber(ranks)) return;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "files")) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes");
        if (codec_file(e->string) && cJSON_IsNumber(b))
            fprintf(f, "%s: --compress %s's state, every one of %.0f data-parallel ranks' (the same codec and ranks resume it), %.3f MiB\n",
                    e->string, kind, ranks->valuedouble, b->valuedouble / 1048576.0);
    }
}

/* This stage's piece of the manifest's codec section x (the section itself without a pipeline) into *out, NULL where the
 * saved stages are not this run's (said by the first stage). */
static dt_status piece_of(const cJSON *x, const char *mpath, const dt_checkpoint_model *cm, const cJSON **out) {
    double stages = 1, chunks = 1;
    dt_status st = cJSON_GetObjectItemCaseSensitive(x, "stages") ? dt_ckpt_count(x, NULL, "stages", mpath, 1e6, &stages) : DT_OK;
    if (!st && cJSON_GetObjectItemCaseSensitive(x, "chunks")) st = dt_ckpt_count(x, NULL, "chunks", mpath, 1e6, &chunks);
    if (st) return st;
    int want = cm->stages > 1 ? cm->stages : 1, wchunks = cm->chunks > 1 ? cm->chunks : 1, stage = want > 1 ? cm->stage : 0;
    const cJSON *e = x;
    if (stages > 1) {
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(x, "pieces")) {
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(e, "stage");
            if (cJSON_IsNumber(g) && g->valuedouble == stage) break;
        }
    }
    *out = stages == want && chunks == wchunks ? e : NULL;
    char keep[80] = ""; /* the same stages in other chunks: the schedule's flags keep it */
    if (stages == want && chunks != wchunks && chunks > 1)
        snprintf(keep, sizeof keep, " (--pp-schedule interleaved --virtual-stages %.0f keeps it)", chunks);
    else if (stages == want && chunks != wchunks)
        snprintf(keep, sizeof keep, " (a schedule of one chunk a stage keeps it)");
    char mine[64] = "this run has no pipeline";
    if (want > 1) snprintf(mine, sizeof mine, "this run's stage %d of %d%s", stage, want, wchunks > 1 ? " in chunks" : "");
    if (!*out && (stage == 0 || stages == want))
        dt_log(DT_LOG_WARN, "%s: the codec's state was saved by %.0f pipeline stage%s of %.0f chunk%s%s; %s: its state starts afresh%s",
               mpath, stages, stages == 1 ? "" : "s", chunks, chunks == 1 ? "" : "s", e ? "" : " without this stage's", mine, keep);
    return DT_OK;
}

/* A PowerSGD piece as builds before 2026-12-06 wrote it: after each rank's residuals two more Q-sized blocks (the
 * velocity and server kinds it counted and never wrote: zeros), read and dropped. */
static bool older_psgd(const dt_codec *k, int ranks, size_t R, size_t Q, size_t S, size_t floats) {
    return Q > 0 && dt_codec_get_config(k)->kind == DT_CODEC_POWERSGD && floats == (size_t)ranks * (R + 2 * Q) + Q + S;
}

/* Rank 0 of the stage's data-parallel ranks: step folder sub's state of this stage into *out where this run's codec can
 * take it (NULL: nothing to resume, said). */
static dt_status read_state(const char *sub, const dt_codec *k, int ranks, const dt_checkpoint_model *cm, float **out, size_t *n,
                            size_t *shared) {
    char sdir[4400], mpath[4500], file[48];
    cJSON *j;
    *out = NULL;
    dt_status st = dt_ckpt_open_latest(sub, sdir, mpath, &j);
    if (st) return st;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "codec");
    const char *kind = dt_ckpt_string(j, "codec", "kind");
    double rank = 0, rate = 0, saved = 0, floats = 0, density = 0, S = 0;
    if (!cJSON_IsObject(x)) {
        if (k && dt_codec_has_state(k) && cm->stage == 0)
            dt_log(DT_LOG_WARN, "%s: no codec state saved: --compress %s starts its residuals and Q afresh", mpath, dt_codec_name(dt_codec_get_config(k)->kind));
        cJSON_Delete(j);
        return DT_OK;
    }
    st = dt_ckpt_count(j, "codec", "rank", mpath, 1e6, &rank);
    if (!st) st = dt_ckpt_number(j, "codec", "min_rate", mpath, &rate);
    if (!st) st = dt_ckpt_count(j, "codec", "ranks", mpath, 1e6, &saved);
    if (!st) st = dt_ckpt_number(j, "codec", "density", mpath, &density);
    const dt_codec_config *c = k ? dt_codec_get_config(k) : NULL;
    if (!st && (!c || !kind || strcmp(kind, dt_codec_name(c->kind)) || (int)rank != c->rank || (float)rate != c->min_rate ||
                (float)density != c->density || (int)saved != ranks)) {
        if (cm->stage == 0)
            dt_log(DT_LOG_WARN, "%s: the codec's state was saved by --compress %s --compress-rank %d on %d ranks; this run %s: its state "
                   "starts afresh", mpath, kind ? kind : "?", (int)rank, (int)saved, c ? "compresses otherwise" : "has no codec");
        cJSON_Delete(j);
        return DT_OK;
    }
    const cJSON *pc = NULL;
    if (!st) st = piece_of(x, mpath, cm, &pc);
    if (!st && !pc) {
        cJSON_Delete(j);
        return DT_OK;
    }
    if (!st) st = dt_ckpt_count(pc, NULL, "floats", mpath, 1e15, &floats);
    if (!st && cJSON_GetObjectItemCaseSensitive(pc, "shared")) st = dt_ckpt_count(pc, NULL, "shared", mpath, 1e12, &S);
    size_t R = st ? 0 : own_size(k), Q = st ? 0 : dt_codec_state_size(k, DT_CODEC_Q), want = (size_t)ranks * R + Q + (size_t)S;
    size_t got = older_psgd(k, ranks, R, Q, (size_t)S, (size_t)floats) ? (size_t)floats : want;
    file_of(cm->stage, cm->stages, file);
    if (!st && (size_t)floats != got)
        st = dt_error(DT_ERR_IO, "%s: %s holds %.0f floats; this model's codec keeps %zu", mpath, file, floats, want);
    float *buf = st ? NULL : malloc((got + 1) * sizeof *buf);
    if (!st && !buf) st = dt_error(DT_ERR_NOMEM, "checkpoint: out of memory for the codec's state");
    if (!st) st = dt_ckpt_verify_file(sdir, j, file, 1, got, &buf);
    cJSON_Delete(j);
    if (st) { free(buf); return st; }
    if (got != want) { /* each rank's residuals, then Q and the shared words, where the zeros were between them */
        for (int r = 1; r < ranks; r++) memmove(buf + (size_t)r * R, buf + (size_t)r * (R + 2 * Q), R * sizeof *buf);
        memmove(buf + (size_t)ranks * R, buf + (size_t)ranks * (R + 2 * Q), (Q + (size_t)S) * sizeof *buf);
    }
    *out = buf;
    *n = want;
    *shared = (size_t)S;
    return DT_OK;
}

dt_status dt_checkpoint_codec_resume(const char *sub, dt_comm *w, dt_engine *e, int step, const dt_checkpoint_model *cm) {
    dt_codec *k = dt_engine_codec(e);
    int rank = w ? dt_comm_rank(w) : 0, p = w ? dt_comm_size(w) : 1;
    if (k) dt_codec_set_steps(k, step); /* the start step counts from the run's first */
    float *all = NULL;
    size_t n = 0, S = 0;
    dt_status st = rank == 0 ? read_state(sub, k, p, cm, &all, &n, &S) : DT_OK;
    int64_t ok[3] = { st == DT_OK, all != NULL, (int64_t)S };
    dt_status bs = w ? dt_comm_broadcast(w, ok, 3, DT_I64, 0) : DT_OK;
    S = (size_t)ok[2];
    if (bs || !ok[0]) { free(all); return bs ? bs : rank == 0 ? st : dt_error(DT_ERR_IO, "rank 0 could not read the codec's state in %s (its message says why)", sub); }
    if (!ok[1] || !k) return DT_OK;
    size_t R = own_size(k), Q = dt_codec_state_size(k, DT_CODEC_Q);
    float *mine = malloc((R + Q + S + 1) * sizeof *mine);
    st = dt_ckpt_every_rank(w, mine != NULL, "hold the codec's state to resume");
    if (!st) st = w ? dt_comm_scatter(w, all, mine, R, DT_F32, 0) : (memcpy(mine, all, R * sizeof *mine), DT_OK);
    if (!st && rank == 0) memcpy(mine + R, all + (size_t)p * R, (Q + S) * sizeof *mine);
    if (!st && w) st = dt_comm_broadcast(w, mine + R, Q + S, DT_F32, 0);
    if (!st) st = own_io(k, mine, 1);
    if (!st) st = dt_codec_state_io(k, DT_CODEC_Q, mine + R, 1);
    if (!st) st = dt_codec_shared_io(k, mine + R + Q, S, 1);
    free(mine);
    free(all);
    return st;
}
