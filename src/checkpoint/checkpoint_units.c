/* A second-order optimizer's state in a checkpoint (optim.h's dt_state_units: the engine's preconditioner's, K-FAC's,
 * Shampoo's or SOAP's): KEY.f32 holds every unit in order as the rank that holds it whole
 * has it, and the manifest's "units" section each source's key, units, floats, its own count of steps and a hash of
 * the units' sizes. The units' sizes do not depend on the layout, so a run on other ranks (another K-FAC worker
 * fraction, another Shampoo group) loads each unit into the ranks that hold it now: resharding. A run whose units
 * differ (another block size, another model) starts that state afresh, said. A pipeline stage's preconditioner is its
 * own (over its own layers): KEY-stageSofP, written by the stage's first data-parallel rank; the stages' units one
 * after another are the whole model's, so another split (or one process) cuts them as its stages hold them. An
 * interleaved stage's (KEY-stageSofP-chunksC) is not one run of layers: only the same layout loads it. */
#include "dtrain/train.h"
#include "checkpoint_internal.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine's source: its preconditioner's (units 0 where it has none). */
static dt_state_units source(dt_engine *e) {
    const dt_engine_config *c = dt_engine_get_config(e);
    return c->precond ? c->precond->state : (dt_state_units){ 0 };
}

/* Its key in the checkpoint: a pipeline stage's own (an interleaved stage's chunks named: its layers are not one run of
 * the model's, so its state is not a piece of the whole one another split can cut). */
static void key_of(const dt_state_units *s, const dt_checkpoint_model *cm, char out[48]) {
    if (cm->stages > 1 && cm->chunks > 1) snprintf(out, 48, "%s-stage%dof%d-chunks%d", s->key, cm->stage, cm->stages, cm->chunks);
    else if (cm->stages > 1) snprintf(out, 48, "%s-stage%dof%d", s->key, cm->stage, cm->stages);
    else snprintf(out, 48, "%s", s->key);
}

static uint64_t sizes_hash(const dt_state_units *s) {
    uint64_t h = DT_HASH_INIT;
    for (int u = 0; u < s->units; u++) {
        uint64_t f = s->floats(s->ctx, u);
        h = dt_hash_words(h, &f, 2);
    }
    return h;
}

static size_t total(const dt_state_units *s, size_t *most) {
    size_t n = 0;
    *most = 1;
    for (int u = 0; u < s->units; u++) {
        size_t f = s->floats(s->ctx, u);
        n += f;
        *most = f > *most ? f : *most;
    }
    return n;
}

/* Rank 0 gets every unit, in order, from its saver (sent to it a unit at a time). */
static dt_status gather_one(const dt_state_units *s, dt_comm *w, const dt_checkpoint_model *cm, dt_checkpoint_units *out) {
    int rank = w ? dt_comm_rank(w) : 0;
    size_t most, n = total(s, &most), at = 0;
    float *all = rank == 0 ? malloc((n + 1) * sizeof *all) : NULL, *one = rank ? malloc(most * sizeof *one) : NULL;
    char what[96];
    snprintf(what, sizeof what, "hold %s's state to save", s->key);
    dt_status st = dt_ckpt_every_rank(w, rank == 0 ? all != NULL : one != NULL, what);
    for (int u = 0; u < s->units && !st; u++) {
        size_t f = s->floats(s->ctx, u);
        int from = s->saver(s->ctx, u);
        if (rank == 0 && from == 0) s->io(s->ctx, u, all + at, 0);
        else if (rank == 0) st = dt_comm_recv(w, all + at, f, DT_F32, from);
        else if (rank == from) s->io(s->ctx, u, one, 0), st = dt_comm_send(w, one, f, DT_F32, 0);
        at += f;
    }
    free(one);
    if (st || rank != 0) {
        free(all);
        return st;
    }
    *out = (dt_checkpoint_units){ "", s->units, n, s->steps(s->ctx), sizes_hash(s), all };
    key_of(s, cm, out->key);
    return DT_OK;
}

dt_status dt_checkpoint_units_gather(dt_engine *e, dt_comm *w, dt_checkpoint_model *cm) {
    dt_state_units s = source(e);
    cm->units = (dt_checkpoint_units){ 0 };
    return s.units && !s.copy ? gather_one(&s, w, cm, &cm->units) : DT_OK; /* a copy: the same state saved elsewhere */
}

/* A rank's sources as words: a present flag, units, steps, floats, sizes, the data's hash, the key's 48 bytes. */
enum { META_WORDS = 12 };
static void pack(const dt_checkpoint_units *u, uint64_t *w) {
    memset(w, 0, META_WORDS * sizeof *w);
    if (!u->data) return;
    w[0] = 1, w[1] = (uint64_t)u->units, w[2] = (uint64_t)u->steps, w[3] = u->floats, w[4] = u->sizes;
    w[5] = dt_hash_words(DT_HASH_INIT, u->data, u->floats);
    memcpy(&w[6], u->key, 48);
}

dt_status dt_ckpt_units_collect(dt_comm *w, const dt_checkpoint_model *cm, dt_ckpt_units_meta **out, int *n) {
    int p = w ? dt_comm_size(w) : 1;
    uint64_t *mine = calloc(META_WORDS, sizeof *mine), *all = calloc((size_t)p * META_WORDS, sizeof *all);
    *out = calloc((size_t)p + 1, sizeof **out), *n = 0;
    dt_status st = dt_ckpt_every_rank(w, mine && all && *out, "hold the second-order files' sizes");
    if (!st) pack(&cm->units, mine);
    if (!st) st = w ? dt_comm_allgather(w, mine, all, META_WORDS, DT_I64) : (memcpy(all, mine, META_WORDS * sizeof *all), DT_OK);
    for (int k = 0; k < p && !st; k++) {
        const uint64_t *x = all + (size_t)k * META_WORDS;
        if (!x[0]) continue;
        dt_ckpt_units_meta *m = &(*out)[(*n)++];
        *m = (dt_ckpt_units_meta){ "", (int)x[1], (long)x[2], x[3], x[4], x[5] };
        memcpy(m->key, &x[6], 47);
    }
    free(mine), free(all);
    if (st) free(*out), *out = NULL, *n = 0;
    return st;
}

void dt_ckpt_units_manifest(cJSON *j, const dt_ckpt_units_meta *u, int n) {
    cJSON *arr = NULL, *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    for (int i = 0; i < n; i++) {
        if (!arr) arr = cJSON_AddArrayToObject(j, "units");
        cJSON *x = cJSON_CreateObject();
        char h[24], file[64];
        cJSON_AddStringToObject(x, "key", u[i].key);
        cJSON_AddNumberToObject(x, "units", u[i].units);
        cJSON_AddNumberToObject(x, "floats", (double)u[i].floats);
        cJSON_AddNumberToObject(x, "steps", (double)u[i].steps);
        snprintf(h, sizeof h, "%016llx", (unsigned long long)u[i].sizes);
        cJSON_AddStringToObject(x, "sizes", h);
        cJSON_AddItemToArray(arr, x);
        snprintf(file, sizeof file, "%s.f32", u[i].key);
        cJSON *f = cJSON_AddObjectToObject(files, file);
        snprintf(h, sizeof h, "%016llx", (unsigned long long)u[i].hash);
        cJSON_AddNumberToObject(f, "bytes", (double)(u[i].floats * sizeof(float)));
        cJSON_AddStringToObject(f, "fnv1a64", h);
    }
}

dt_status dt_ckpt_units_write(const char *tmp, const dt_checkpoint_model *cm) {
    const dt_checkpoint_units *u = &cm->units;
    if (!u->data) return DT_OK;
    char path[4300];
    snprintf(path, sizeof path, "%s/%s.f32", tmp, u->key);
    size_t bytes = u->floats * sizeof(float);
    const void *p[1] = { u->data };
    return dt_file_write_atomic(path, p, &bytes, 1);
}

/* The manifest's entry for key (NULL: none). */
static const cJSON *entry(const cJSON *j, const char *key) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "units"), *x;
    cJSON_ArrayForEach(x, arr) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key)) return x;
    }
    return NULL;
}

/* Rank 0: s's saved state into *out (NULL: nothing to load, said) and its count of steps. */
static dt_status read_one(const char *sdir, const char *mpath, const cJSON *j, const dt_state_units *s, const char *key, float **out,
                          double *steps) {
    *out = NULL;
    const cJSON *x = entry(j, key);
    if (!x) {
        dt_log(DT_LOG_WARN, "%s: no %s state saved (an older checkpoint, another optimizer, or another pipeline): it starts afresh, so the "
               "steps differ from the uninterrupted run's", mpath, key);
        return DT_OK;
    }
    double units = 0, floats = 0;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(x, "sizes");
    dt_status st = dt_ckpt_count(x, NULL, "units", mpath, 1e9, &units);
    if (!st) st = dt_ckpt_count(x, NULL, "floats", mpath, 1e15, &floats);
    if (!st) st = dt_ckpt_count(x, NULL, "steps", mpath, 1e15, steps);
    if (!st && !cJSON_IsString(h)) st = dt_error(DT_ERR_IO, "%s: units.%s has no sizes", mpath, key);
    if (st) return st;
    size_t most, n = total(s, &most);
    char mine[24];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)sizes_hash(s));
    if ((int)units != s->units || (size_t)floats != n || strcmp(mine, h->valuestring)) {
        dt_log(DT_LOG_WARN, "%s: the saved %s state is %.0f units of %.0f floats, this run's %d of %zu (other settings, or another "
               "model): it starts afresh", mpath, key, units, floats, s->units, n);
        return DT_OK;
    }
    float *buf = malloc((n + 1) * sizeof *buf);
    char file[64];
    snprintf(file, sizeof file, "%s.f32", key);
    st = buf ? dt_ckpt_verify_file(sdir, j, file, 1, n, &buf) : dt_error(DT_ERR_NOMEM, "checkpoint: out of memory for %s's state", key);
    if (st) free(buf);
    else *out = buf;
    return st;
}

/* ---- resharding across pipeline splits ---- */

/* The whole model's units of a source as this run holds them, its stages' lists one after another (a stage's layers
 * follow the earlier stages', and each list is in the whole model's order): where this stage's start, how many there
 * are, and every unit's floats. Collective over world: each rank says its stage and count, and each stage's first
 * rank its units' sizes. */
typedef struct {
    int units, u0;
    uint64_t *size;
} whole_units;

static dt_status whole_of(const dt_state_units *s, dt_comm *world, const dt_checkpoint_model *cm, whole_units *out) {
    int p = world ? dt_comm_size(world) : 1, me = world ? dt_comm_rank(world) : 0;
    int64_t mine[2] = { cm->stages > 1 ? cm->stage : 0, s->units }, *all = calloc(2 * (size_t)p, sizeof *all);
    dt_status st = all ? DT_OK : dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    if (!st) st = world ? dt_comm_allgather(world, mine, all, 2, DT_I64) : (memcpy(all, mine, sizeof mine), DT_OK);
    int first = -1; /* this stage's first rank */
    *out = (whole_units){ 0 };
    for (int64_t g = 0; !st && g <= (cm->stages > 1 ? cm->stages - 1 : 0); g++)
        for (int r = 0; r < p; r++) {
            if (all[2 * r] != g) continue;
            if (g == mine[0]) out->u0 = out->units, first = first < 0 ? r : first;
            out->units += (int)all[2 * r + 1];
            break;
        }
    if (!st && !(out->size = calloc((size_t)out->units + 1, sizeof *out->size))) st = dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    for (int u = 0; !st && first == me && u < s->units; u++) out->size[out->u0 + u] = s->floats(s->ctx, u);
    if (!st && world) st = dt_comm_allreduce(world, out->size, out->size, (size_t)out->units, DT_I64, DT_SUM);
    free(all);
    return st;
}

static uint64_t range_hash(const whole_units *w, int u0, int n) {
    uint64_t h = DT_HASH_INIT;
    for (int u = u0; u < u0 + n; u++) h = dt_hash_words(h, &w->size[u], 2);
    return h;
}

static size_t range_floats(const whole_units *w, int u0, int n) {
    size_t f = 0;
    for (int u = u0; u < u0 + n; u++) f += w->size[u];
    return f;
}

/* The pieces a checkpoint holds of source KEY in another pipeline split: KEY whole, or KEY-stage0ofQ..Q-1 all of them;
 * how many (0: none), their entries in out (at most cap). */
static int pieces_of(const cJSON *j, const char *key, const cJSON **out, int cap) {
    if ((out[0] = entry(j, key))) return 1;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "units"), *x;
    cJSON_ArrayForEach(x, arr) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key");
        int g, q, at = 0;
        size_t n = strlen(key);
        if (!cJSON_IsString(k) || strncmp(k->valuestring, key, n) || sscanf(k->valuestring + n, "-stage%dof%d%n", &g, &q, &at) != 2 ||
            k->valuestring[n + (size_t)at] || g != 0 || q < 2 || q > cap)
            continue;
        char name[48];
        int found = 1;
        for (int i = 1; i < q && found; i++) {
            snprintf(name, sizeof name, "%s-stage%dof%d", key, i, q);
            found = (out[i] = entry(j, name)) != NULL;
        }
        if (found) return out[0] = x, q;
    }
    return 0;
}

/* Rank 0 of a stage: its units of the whole state saved by another pipeline split (pieces, in stage order) into *out,
 * each piece's sizes checked against this run's whole list; NULL where they do not agree (said). */
static dt_status read_split(const char *sdir, const char *mpath, const cJSON *j, const whole_units *w, const dt_state_units *s,
                            const cJSON **pc, int np, float **out, double *steps) {
    *out = NULL;
    size_t all = 0;
    int units = 0;
    dt_status st = DT_OK;
    for (int q = 0; q < np && !st; q++) {
        double n = 0, f = 0;
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(pc[q], "sizes");
        if (!(st = dt_ckpt_count(pc[q], NULL, "units", mpath, 1e9, &n)) && !(st = dt_ckpt_count(pc[q], NULL, "floats", mpath, 1e15, &f)))
            st = dt_ckpt_count(pc[q], NULL, "steps", mpath, 1e15, steps);
        if (st) return st;
        char want[24] = "";
        if (units + (int)n <= w->units) snprintf(want, sizeof want, "%016llx", (unsigned long long)range_hash(w, units, (int)n));
        if (!cJSON_IsString(h) || strcmp(want, h->valuestring) || range_floats(w, units, (int)n) != (size_t)f) {
            dt_log(DT_LOG_WARN, "%s: the saved %s state (%d piece%s) does not divide as this run's %d units do (other settings, or another "
                   "model): it starts afresh", mpath, s->key, np, np == 1 ? "" : "s", w->units);
            return DT_OK;
        }
        units += (int)n, all += (size_t)f;
    }
    if (units != w->units) {
        dt_log(DT_LOG_WARN, "%s: the saved %s state holds %d units, this run's whole model %d: it starts afresh", mpath, s->key, units, w->units);
        return DT_OK;
    }
    float *buf = malloc((all + 1) * sizeof *buf), *at = buf;
    if (!buf) return dt_error(DT_ERR_NOMEM, "checkpoint: out of memory for %s's state", s->key);
    for (int q = 0; q < np && !st; q++) {
        char file[64];
        snprintf(file, sizeof file, "%s.f32", cJSON_GetObjectItemCaseSensitive(pc[q], "key")->valuestring);
        double f = cJSON_GetObjectItemCaseSensitive(pc[q], "floats")->valuedouble;
        st = dt_ckpt_verify_file(sdir, j, file, 1, (size_t)f, &at);
        at += (size_t)f;
    }
    size_t most;
    if (!st) memmove(buf, buf + range_floats(w, 0, w->u0), total(s, &most) * sizeof *buf);
    if (st) free(buf);
    else *out = buf;
    return st;
}

/* Every unit from rank 0 to the ranks that hold it (a broadcast each: any rank may), into what they hold. */
static dt_status scatter_one(const dt_state_units *s, dt_comm *w, const float *all) {
    int rank = w ? dt_comm_rank(w) : 0;
    size_t most, at = 0;
    total(s, &most);
    float *one = malloc(most * sizeof *one);
    char what[96];
    snprintf(what, sizeof what, "hold a unit of %s's state", s->key);
    dt_status st = dt_ckpt_every_rank(w, one != NULL, what);
    for (int u = 0; u < s->units && !st; u++) {
        size_t f = s->floats(s->ctx, u);
        if (rank == 0) memcpy(one, all + at, f * sizeof *one);
        if (w) st = dt_comm_broadcast(w, one, f, DT_F32, 0);
        if (!st && s->loads(s->ctx, u, rank)) s->io(s->ctx, u, one, 1);
        at += f;
    }
    free(one);
    return st;
}

dt_status dt_checkpoint_units_resume(const char *sub, dt_comm *w, dt_comm *world, dt_engine *e, const dt_checkpoint_model *cm) {
    dt_state_units s = source(e);
    int rank = w ? dt_comm_rank(w) : 0;
    /* a source every rank has (a pipeline stage without a Linear has K-FAC with no units: it joins the collectives) */
    if (!s.key) return DT_OK;
    char sdir[4400], mpath[4500];
    cJSON *j = NULL;
    dt_status st = rank == 0 ? dt_ckpt_open_latest(sub, sdir, mpath, &j) : DT_OK;
    whole_units wu = { 0 };
    dt_status ws = whole_of(&s, world, cm, &wu); /* collective: every rank, whatever rank 0 finds */
    if (!s.units) {
        free(wu.size);
        cJSON_Delete(j);
        return st ? st : ws;
    }
    float *all = NULL;
    double steps = 0;
    char key[48];
    key_of(&s, cm, key);
    const cJSON *pc[64];
    int np = 0;
    if (!st && rank == 0 && cm->chunks <= 1 && !entry(j, key) && (np = pieces_of(j, s.key, pc, 64)) && !ws)
        st = read_split(sdir, mpath, j, &wu, &s, pc, np, &all, &steps); /* saved by another pipeline split */
    else if (!st && rank == 0) st = read_one(sdir, mpath, j, &s, key, &all, &steps);
    free(wu.size);
    cJSON_Delete(j);
    if (!st) st = ws;
    /* whether rank 0 read it, and has something to hand out */
    double got[3] = { st == DT_OK, all != NULL, steps };
    dt_status bs = w ? dt_comm_broadcast(w, got, 3, DT_F64, 0) : DT_OK;
    if (!st && !bs && !got[0]) st = dt_error(DT_ERR_IO, "rank 0 could not read %s's state in %s (its message says why)", key, sub);
    if (!st) st = bs;
    if (!st && got[1]) st = scatter_one(&s, w, all);
    if (!st && got[1]) s.set_steps(s.ctx, (long)got[2]);
    free(all);
    return st;
}

/* Each units entry's file (KEY.f32) against its size and hash; ", KEY.f32" added to listed for each. */
dt_status dt_ckpt_units_verify(const char *dir, const cJSON *j, char *listed, size_t cap) {
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(j, "units")) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key"), *f = cJSON_GetObjectItemCaseSensitive(x, "floats");
        if (!cJSON_IsString(k) || !cJSON_IsNumber(f) || strlen(k->valuestring) > 47 || f->valuedouble < 0)
            return dt_error(DT_ERR_IO, "%s/manifest.json: a units entry without its key or floats", dir);
        char file[64];
        snprintf(file, sizeof file, "%s.f32", k->valuestring);
        dt_status st = dt_ckpt_verify_file(dir, j, file, 1, (size_t)f->valuedouble, NULL);
        if (st) return st;
        size_t at = strlen(listed);
        snprintf(listed + at, cap - at, ", %s", file);
    }
    return DT_OK;
}

void dt_ckpt_units_describe(const cJSON *j, FILE *f) {
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(j, "units")) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key"), *u = cJSON_GetObjectItemCaseSensitive(x, "units");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "floats"), *s = cJSON_GetObjectItemCaseSensitive(x, "steps");
        if (cJSON_IsString(k) && cJSON_IsNumber(u) && cJSON_IsNumber(n) && cJSON_IsNumber(s))
            fprintf(f, "%s.f32: %.0f units (any layout loads them), %.3f MiB, its step %.0f\n", k->valuestring, u->valuedouble,
                    n->valuedouble * sizeof(float) / 1048576.0, s->valuedouble);
    }
}
