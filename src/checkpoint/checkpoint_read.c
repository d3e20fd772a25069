/* Reading checkpoints (the format: checkpoint_write.c): a manifest's
 * numbers and strings, the files checked against their hashes, a resume on
 * any layout (rank 0 checks and reads, the others get what they hold or
 * read their own slices), weights for --model DIR, the loader's place. */
#include "dtrain/train.h"
#include "dtrain/codec.h"
#include "checkpoint_internal.h"
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A small text file, whole (the manifest, latest). */
static dt_status read_text(const char *path, char **out) {
    dt_status st = dt_file_read_text(path, 64 << 20, out, NULL);
    return st ? dt_error(st, "%s (not a whole checkpoint)", dt_last_error()) : DT_OK;
}

/* manifest[section][key] as a number, or an error naming it. */
dt_status dt_ckpt_number(const cJSON *j, const char *section, const char *key, const char *path, double *v) {
    const cJSON *s = section ? cJSON_GetObjectItemCaseSensitive(j, section) : j;
    const cJSON *x = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    if (!cJSON_IsNumber(x))
        return dt_error(DT_ERR_IO, "%s: %s%s%s is missing or not a number", path, section ? section : "", section ? "." : "", key);
    *v = x->valuedouble;
    return DT_OK;
}

/* A count: a whole number from 0 to max (a damaged manifest must not overflow a conversion). */
dt_status dt_ckpt_count(const cJSON *j, const char *section, const char *key, const char *path, double max, double *v) {
    dt_status st = dt_ckpt_number(j, section, key, path, v);
    if (!st && !(*v >= 0 && *v <= max && *v == (double)(uint64_t)*v))
        st = dt_error(DT_ERR_IO, "%s: %s.%s is %g, not a whole number from 0 to %g", path, section ? section : "", key, *v, max);
    return st;
}

const char *dt_ckpt_string(const cJSON *j, const char *section, const char *key) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, section);
    const cJSON *x = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

dt_status dt_ckpt_manifest_lora(const cJSON *j, const char *mpath, bool *found, dt_lora_config *out, char *targets, size_t cap) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "lora");
    *found = l != NULL;
    if (!l) return DT_OK;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(l, "rank"), *a = cJSON_GetObjectItemCaseSensitive(l, "alpha"),
                *t = cJSON_GetObjectItemCaseSensitive(l, "targets"), *d = cJSON_GetObjectItemCaseSensitive(l, "dropout");
    if (!cJSON_IsNumber(r) || !cJSON_IsNumber(a) || !cJSON_IsString(t) || !(r->valuedouble >= 1 && r->valuedouble <= 65536) ||
        snprintf(targets, cap, "%s", t->valuestring) >= (int)cap)
        return dt_error(DT_ERR_IO, "%s: model.lora is not {rank, alpha, targets}", mpath);
    if (d && (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble < 1)))
        return dt_error(DT_ERR_IO, "%s: model.lora.dropout is not a probability below 1", mpath);
    *out = (dt_lora_config){ .rank = (int)r->valuedouble, .alpha = (float)a->valuedouble, .dropout = d ? (float)d->valuedouble : 0, .targets = targets };
    return DT_OK;
}

/* A checkpoint of LoRA's adapters resumes only a run with the same adapters, and the other way round. */
static dt_status check_lora(const cJSON *j, const char *path, const dt_lora_config *mine) {
    char targets[256];
    dt_lora_config saved;
    bool found;
    dt_status st = dt_ckpt_manifest_lora(j, path, &found, &saved, targets, sizeof targets);
    if (!st && !found)
        return mine ? dt_error(DT_ERR_ARG, "%s: the checkpoint holds a whole model, this run trains LoRA adapters (--lora-rank %d)", path,
                               mine->rank)
                    : DT_OK;
    if (st) return st;
    if (!mine)
        return dt_error(DT_ERR_ARG, "%s: the checkpoint holds LoRA adapters (rank %d on %s): resume it with --lora-rank %d "
                        "--lora-alpha %g --lora-targets %s", path, saved.rank, targets, saved.rank, (double)saved.alpha, targets);
    if (saved.rank != mine->rank || saved.alpha != mine->alpha || strcmp(targets, mine->targets))
        return dt_error(DT_ERR_ARG, "%s: the checkpoint's adapters are rank %d, alpha %g on %s; this run's rank %d, alpha %g on %s", path,
                        saved.rank, (double)saved.alpha, targets, mine->rank, (double)mine->alpha, mine->targets);
    return DT_OK;
}

/* The checkpoint must be of this run's model and optimizer. */
static dt_status check_shape(const cJSON *j, const char *path, const dt_train_config *c, const dt_checkpoint_model *cm,
                             const dt_optim *o) {
    const char *fmt = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "format")) ? cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring : "";
    double v = 0;
    if (strcmp(fmt, FORMAT)) return dt_error(DT_ERR_IO, "%s: format is '%s', not '%s'", path, fmt, FORMAT);
    dt_status st = dt_ckpt_number(j, NULL, "version", path, &v);
    if (!st && (v < 1 || v > VERSION || v != (int)v)) return dt_error(DT_ERR_IO, "%s: version %g (this dtrain reads 1 to %d)", path, v, VERSION);
    const char *kind = dt_ckpt_string(j, "model", "kind");
    if (!st && (!kind || strcmp(kind, cm->m.kind)))
        return dt_error(DT_ERR_ARG, "%s: model.kind is '%s', this run trains %s", path, kind ? kind : "(missing)", cm->m.kind);
    for (int i = 0; !st && i < cm->nshape; i++)
        if (!(st = dt_ckpt_number(j, "model", cm->shape_names[i], path, &v)) && v != cm->shape[i])
            return dt_error(DT_ERR_ARG, "%s: model.%s is %g, this run's model has %d", path, cm->shape_names[i], v, cm->shape[i]);
    for (int i = 0; !st && i < cm->nfshape; i++)
        if (!(st = dt_ckpt_number(j, "model", cm->fshape_names[i], path, &v)) && (float)v != (float)cm->fshape[i])
            return dt_error(DT_ERR_ARG, "%s: model.%s is %g, this run's model has %g", path, cm->fshape_names[i], v, cm->fshape[i]);
    if (!st && (st = check_lora(j, path, cm->lora))) return st;
    const char *ok = dt_ckpt_string(j, "optimizer", "kind"), *mine = dt_optim_kind_name(c->opt.kind);
    if (!st && (!ok || strcmp(ok, mine)))
        return dt_error(DT_ERR_ARG, "%s: optimizer.kind is '%s', this run uses %s (--optimizer)", path, ok ? ok : "(missing)", mine);
    if (!st && !(st = dt_ckpt_number(j, "optimizer", "buffers", path, &v)) && v != (dt_optim_buffer((dt_optim *)o, 1) ? 2 : 1))
        return dt_error(DT_ERR_IO, "%s: optimizer.buffers is %g, %s keeps %d%s", path, v, mine, dt_optim_buffer((dt_optim *)o, 1) ? 2 : 1,
                        c->opt.kind == DT_OPT_SOAP ? " (a SOAP checkpoint from before SOAP ran as a preconditioner over SGD, its moments "
                                                     "now in soap.f32: it cannot resume)" : "");
    return st;
}

/* file's size in the manifest (bytes) and on disk (path) are the want this run needs. */
static dt_status check_size(const char *dir, const char *file, const char *path, double bytes, size_t want) {
    if (bytes != (double)want)
        return dt_error(DT_ERR_IO, "%s/manifest.json: files.%s has %.0f bytes, this run's model needs %zu", dir, file, bytes, want);
    struct stat sb;
    if (stat(path, &sb) != 0) return dt_error(DT_ERR_IO, "%s: missing (%s): not a whole checkpoint", path, strerror(errno));
    if ((size_t)sb.st_size != want)
        return dt_error(DT_ERR_IO, "%s: %lld bytes, the manifest says %zu (truncated or damaged)", path, (long long)sb.st_size, want);
    return DT_OK;
}

/* A file of nb stores against the manifest: its size, and the hash of each
 * piece (a sharded save's slices, which must tile the store) or of the
 * whole file, read a chunk at a time (the file may be larger than this
 * rank's memory for it), or with into, read into the nb buffers of nparams
 * floats as it is checked. */
dt_status dt_ckpt_verify_file(const char *dir, const cJSON *j, const char *file, int nb, size_t nparams, float *const *into) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(j, "files"), *f = cJSON_IsObject(fs) ? cJSON_GetObjectItemCaseSensitive(fs, file) : NULL;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(f, "bytes"), *whole = cJSON_GetObjectItemCaseSensitive(f, "fnv1a64");
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(f, "pieces");
    size_t want = nparams * sizeof(float) * (size_t)nb;
    if (!cJSON_IsNumber(b) || (!cJSON_IsString(whole) && !cJSON_IsArray(pieces)))
        return dt_error(DT_ERR_IO, "%s/manifest.json: files.%s is missing its bytes or hashes", dir, file);
    dt_status sz = check_size(dir, file, path, b->valuedouble, want);
    if (sz) return sz;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 18 };
    float *buf = into ? NULL : malloc(CHUNK * sizeof(float));
    dt_status st = buf || into ? DT_OK : dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    int np = cJSON_IsArray(pieces) ? cJSON_GetArraySize(pieces) : 1;
    size_t next = 0; /* pieces tile [0, nparams) in order */
    for (int k = 0; k < np && !st; k++) {
        const cJSON *pc = cJSON_IsArray(pieces) ? cJSON_GetArrayItem(pieces, k) : NULL;
        double o = 0, cnt = (double)nparams;
        const cJSON *h = pc ? cJSON_GetObjectItemCaseSensitive(pc, "fnv1a64") : whole;
        if (pc && ((st = dt_ckpt_count(pc, NULL, "offset", path, 1e15, &o)) || (st = dt_ckpt_count(pc, NULL, "count", path, 1e15, &cnt)))) break;
        if ((size_t)o != next || (size_t)o + (size_t)cnt > nparams || !cJSON_IsString(h)) {
            st = dt_error(DT_ERR_IO, "%s/manifest.json: %s piece %d (offset %.0f, %.0f floats) does not follow the pieces before "
                          "it within the %zu parameters, or has no hash", dir, file, k, o, cnt, nparams);
            break;
        }
        next = (size_t)o + (size_t)cnt;
        uint64_t hash = DT_HASH_INIT;
        for (int bi = 0; bi < nb && !st; bi++)
            for (size_t at = 0; at < (size_t)cnt && !st; at += CHUNK) {
                size_t m = (size_t)cnt - at < CHUNK ? (size_t)cnt - at : CHUNK, bytes = m * sizeof(float);
                off_t pos = (off_t)(((size_t)bi * nparams + (size_t)o + at) * sizeof(float));
                float *dst = into ? into[bi] + (size_t)o + at : buf;
                if (pread(fd, dst, bytes, pos) != (ssize_t)bytes) st = dt_error(DT_ERR_IO, "%s: short read", path);
                else hash = dt_hash_words(hash, dst, m);
            }
        char hex[24];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
        if (!st && strcmp(hex, h->valuestring))
            st = dt_error(DT_ERR_IO, "%s: floats [%.0f, %.0f) hash to %s, the manifest says %s (damaged, or a piece from another run)",
                          path, o, o + cnt, hex, h->valuestring);
    }
    if (!st && next != nparams)
        st = dt_error(DT_ERR_IO, "%s/manifest.json: %s's pieces cover %zu of the %zu parameters", dir, file, next, nparams);
    free(buf);
    close(fd);
    return st;
}

/* Reads file (of the manifest's size and hash, or hashes of its pieces: a
 * ZeRO-3 save's params.f32) into the n-float buffers bufs[0..nb), once. */
static dt_status read_floats(const char *dir, const cJSON *j, const char *file, float *const *bufs, int nb, size_t n) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(j, "files"), *f = cJSON_IsObject(fs) ? cJSON_GetObjectItemCaseSensitive(fs, file) : NULL;
    const cJSON *b = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "bytes") : NULL;
    const cJSON *h = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "fnv1a64") : NULL;
    /* in pieces: each checked as it is read */
    if (cJSON_IsObject(f) && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(f, "pieces"))) return dt_ckpt_verify_file(dir, j, file, nb, n, bufs);
    if (!cJSON_IsNumber(b) || !cJSON_IsString(h))
        return dt_error(DT_ERR_IO, "%s/manifest.json: files.%s is missing its bytes or hash", dir, file);
    size_t want = n * sizeof(float) * (size_t)nb;
    dt_status sz = check_size(dir, file, path, b->valuedouble, want);
    if (sz) return sz;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint64_t hash = DT_HASH_INIT;
    dt_status st = DT_OK;
    for (int i = 0; i < nb && !st; i++) {
        if (fread(bufs[i], sizeof(float), n, fp) != n) st = dt_error(DT_ERR_IO, "%s: short read", path);
        else hash = dt_hash_words(hash, bufs[i], n);
    }
    fclose(fp);
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    if (!st && strcmp(hex, h->valuestring))
        st = dt_error(DT_ERR_IO, "%s: its contents hash to %s, the manifest says %s (damaged)", path, hex, h->valuestring);
    return st;
}

/* [off, off + n) of this rank's store from each buffer of a verified file
 * (optim.f32, or a tensor-parallel rank's slices of params.f32). */
static dt_status read_slice(const char *dir, const char *file, const dt_model *m, float *const *bufs, int nb, size_t off, size_t n) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return dt_ckpt_file_runs(path, 0, m, bufs, nb, off, n);
}

/* This rank's slice of optim.f32 (verified), its runs of the store (dt_engine_runs). */
static dt_status read_optim(const char *dir, const dt_engine *e, const dt_model *m, float *const *obuf) {
    char path[8192];
    const dt_store_range *rg;
    int nrg = dt_engine_runs(e, &rg);
    snprintf(path, sizeof path, "%s/optim.f32", dir);
    return dt_ckpt_file_slice(path, 0, m, obuf, obuf[1] ? 2 : 1, rg, nrg);
}

/* The saved run's global batch: micro-batch x accumulation x data-parallel ranks (tensor-parallel ranks, pipeline
 * stages and context-parallel ranks share their samples; a checkpoint without those keys had none); 0 if unknown. */
long dt_ckpt_global_batch(const cJSON *j) {
    static const char *const keys[3] = { "batch", "grad_accum", "ranks" };
    static const char *const mp[3] = { "tp", "pp", "cp" };
    double v, global = 1, shared = 1;
    for (int i = 0; i < 3; i++) {
        if (dt_ckpt_number(j, "settings", keys[i], "", &v)) return 0;
        global *= v;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "settings");
    for (int i = 0; i < 3; i++) {
        const cJSON *x = st ? cJSON_GetObjectItemCaseSensitive(st, mp[i]) : NULL;
        if (cJSON_IsNumber(x) && x->valuedouble >= 1) shared *= x->valuedouble;
    }
    return global >= shared ? (long)(global / shared) : 0;
}

/* The layout comes from the flags, not the checkpoint (which reshards): where it differs from the saved one, said in
 * a line, since the math is the same up to rounding but not the memory a rank needs (an EP run resumed without --ep
 * holds every expert on every rank). A key an older checkpoint lacks: 1. */
static void say_layout(const cJSON *j, const char *path, const dt_train_config *c, int nranks) {
    static const char *const keys[5] = { "ranks", "tp", "pp", "cp", "ep" };
    int now[5] = { nranks, c->tp > 1 ? c->tp : 1, c->pp > 1 ? c->pp : 1, c->cp > 1 ? c->cp : 1, c->ep > 1 ? c->ep : 1 }, differ = 0;
    double then[5];
    for (int i = 0; i < 5; i++) {
        if (dt_ckpt_number(j, "settings", keys[i], "", &then[i])) then[i] = 1;
        differ |= then[i] != now[i];
    }
    if (differ)
        dt_log(DT_LOG_INFO, "%s: saved on %g ranks, tp %g, pp %g, cp %g, ep %g; resumed on %d, tp %d, pp %d, cp %d, ep %d (the state "
               "resharded)", path, then[0], then[1], then[2], then[3], then[4], now[0], now[1], now[2], now[3], now[4]);
}

/* Settings that may change on resume, but change the run: said. */
static void warn_changes(const cJSON *j, const char *path, const dt_train_config *c, int nranks) {
    double v = 0;
    if (!dt_ckpt_number(j, "settings", "seq", path, &v) && v != c->seq)
        dt_log(DT_LOG_WARN, "%s: saved with --seq %g, resumed with %d", path, v, c->seq);
    long then = dt_ckpt_global_batch(j), now = (long)c->batch * c->grad_accum * dt_train_dp(c, nranks);
    if (then && then != now)
        dt_log(DT_LOG_WARN, "%s: the global batch was %ld samples, now %ld: the run is not the one that was saved", path, then, now);
    if (!dt_ckpt_number(j, "schedule", "lr", path, &v) && (float)v != c->sched.lr)
        dt_log(DT_LOG_WARN, "%s: saved with --lr %g, resumed with %g", path, v, c->sched.lr);
    int total = c->sched.total ? c->sched.total : c->steps;
    if (c->sched.kind != DT_SCHED_CONSTANT && !dt_ckpt_number(j, "schedule", "total", path, &v) && v != total)
        dt_log(DT_LOG_WARN, "%s: the %s schedule ran over %g steps, now over %d: the learning rate from here differs", path,
               dt_schedule_name(c->sched.kind), v, total);
    say_layout(j, path, c, nranks);
    const char *seed = dt_ckpt_string(j, "rng", "shuffle_seed");
    char mine_seed[32];
    snprintf(mine_seed, sizeof mine_seed, "%llu", (unsigned long long)c->shuffle_seed);
    if (seed && strcmp(seed, mine_seed))
        dt_log(DT_LOG_WARN, "%s: saved with shuffle seed %s, resumed with %s: the data order changes", path, seed, mine_seed);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "rng"), "shuffle_rows");
    if (c->shuffle_seed && (cJSON_IsTrue(rows) != (c->shuffle_rows != 0)))
        dt_log(DT_LOG_WARN, "%s: saved shuffling %s, resumed shuffling %s: the data order changes", path,
               cJSON_IsTrue(rows) ? "rows" : "batches", c->shuffle_rows ? "rows" : "batches");
}

/* The loss scaler's state, where this run scales (ls) and the checkpoint has
 * one; a checkpoint of a run that did not scale leaves the scaler at its start. */
static dt_status read_loss_scale(const cJSON *j, const char *path, dt_loss_scale *ls) {
    if (!ls) return DT_OK;
    if (!cJSON_GetObjectItemCaseSensitive(j, "loss_scaler")) {
        dt_log(DT_LOG_WARN, "%s: saved without a loss scaler (not fp16): the scale starts at %g", path, ls->scale);
        return DT_OK;
    }
    double v[4];
    dt_status st = dt_ckpt_number(j, "loss_scaler", "scale", path, &v[0]);
    if (!st) st = dt_ckpt_count(j, "loss_scaler", "iter", path, 1e15, &v[1]);
    if (!st) st = dt_ckpt_number(j, "loss_scaler", "last_overflow", path, &v[2]);
    if (!st) st = dt_ckpt_count(j, "loss_scaler", "hysteresis", path, 1e9, &v[3]);
    if (!st && !(v[0] > 0 && isfinite(v[0])))
        st = dt_error(DT_ERR_IO, "%s: loss_scaler.scale is %g, not a positive number", path, v[0]);
    if (!st && !(v[2] >= -1 && v[2] < v[1] + 1 && v[2] == (double)(int64_t)v[2]))
        st = dt_error(DT_ERR_IO, "%s: loss_scaler.last_overflow is %g, not a step from -1 to %g", path, v[2], v[1] - 1);
    if (!st) *ls = (dt_loss_scale){ .scale = v[0], .iter = (int64_t)v[1], .last_overflow = (int64_t)v[2], .hysteresis = (int)v[3] };
    return st;
}

/* Rank 0's part of a resume: the latest checkpoint of dir into the model and optimizer. */
/* dir's latest checkpoint: its directory (sub) and its manifest, parsed. */
dt_status dt_ckpt_open_latest(const char *dir, char sub[4400], char mpath[4500], cJSON **out) {
    char path[4200], *text = NULL;
    *out = NULL;
    dt_status st;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (access(path, F_OK) == 0) { /* one step's folder (DIR/step-N) */
        snprintf(sub, 4400, "%s", dir);
        snprintf(mpath, 4500, "%s", path);
        goto manifest;
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    if ((st = read_text(path, &text))) return st;
    text[strcspn(text, "\n")] = 0;
    if (strncmp(text, "step-", 5) || strchr(text, '/') || strlen(text) > 20) {
        st = dt_error(DT_ERR_IO, "%s: names '%.40s', not a step-N directory", path, text);
        free(text);
        return st;
    }
    snprintf(sub, 4400, "%s/%s", dir, text);
    free(text);
    snprintf(mpath, 4500, "%s/manifest.json", sub);
manifest:
    if ((st = read_text(mpath, &text))) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return dt_error(DT_ERR_IO, "%s: not a JSON object (damaged)", mpath); }
    *out = j;
    return DT_OK;
}

/* The manifest's model shape, checked. */
dt_status dt_ckpt_manifest_shape(const cJSON *j, const char *mpath, dt_gpt2_config *g) {
    memset(g, 0, sizeof *g);
    int *f[19] = { &g->max_seq_len, &g->vocab_size, &g->padded_vocab_size, &g->num_layers, &g->num_heads, &g->channels,
                   &g->kv_heads, &g->head_dim, &g->ffn, &g->untied, &g->rope_original_max, &g->experts, &g->experts_top_k, &g->norm_topk,
                   &g->shared_ffn, &g->router, &g->expert_groups, &g->group_top_k, &g->drop_policy };
    float *x[9] = { &g->norm_eps, &g->rope_theta, &g->rope_factor, &g->rope_low_freq_factor, &g->rope_high_freq_factor, &g->aux_coef,
                    &g->routed_scale, &g->bias_rate, &g->capacity_factor };
    const char *kind = dt_ckpt_string(j, "model", "kind");
    g->family = kind ? dt_family_find(kind) : NULL;
    if (!g->family) {
        char names[256];
        dt_family_names(names, sizeof names);
        return dt_error(DT_ERR_IO, "%s: model.kind is '%s', not a language model family (%s)", mpath, kind ? kind : "(missing)", names);
    }
    bool moe = dt_family_moe(g->family);
    int n = strcmp(kind, "gpt2") ? moe ? 19 : 11 : 6; /* GPT-2's manifests hold its six sizes; a mixture of experts', eight more */
    for (int i = 0; i < n; i++) {
        double v = 0;
        /* untied and the rope's original length may be 0; the others count */
        dt_status st = i >= 9 && i != 11 && i != 12 ? dt_ckpt_number(j, "model", dt_ckpt_lm_shape[i], mpath, &v) : dt_ckpt_count(j, "model", dt_ckpt_lm_shape[i], mpath, 1 << 30, &v);
        if (st) return st;
        if (!(v >= 0 && v <= (1 << 30))) return dt_error(DT_ERR_IO, "%s: model.%s is %g", mpath, dt_ckpt_lm_shape[i], v);
        *f[i] = (int)v;
    }
    int *dense[3] = { &g->moe_every, &g->first_dense, &g->dense_ffn }; /* a mixture's dense layers, where it has some */
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    for (int i = 0; moe && i < 3; i++) {
        double v = 0;
        if (!cJSON_GetObjectItemCaseSensitive(model, dt_ckpt_lm_shape[19 + i])) continue;
        dt_status st = dt_ckpt_count(j, "model", dt_ckpt_lm_shape[19 + i], mpath, 1 << 30, &v);
        if (st) return st;
        *dense[i] = (int)v;
    }
    for (int i = 0; n > 6 && i < (moe ? 9 : 5); i++) {
        double v = 0;
        dt_status st = dt_ckpt_number(j, "model", dt_ckpt_lm_numbers[i], mpath, &v);
        if (st) return st;
        *x[i] = (float)v;
    }
    return dt_gpt2_config_check(g, mpath);
}

int dt_checkpoint_is_checkpoint(const char *path) {
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", path);
    if (access(p, F_OK) == 0) return 1;
    snprintf(p, sizeof p, "%s/manifest.json", path);
    return access(p, F_OK) == 0;
}

dt_status dt_checkpoint_load_weights(const char *path, int heads, dt_gpt2 **out, int *step) {
    if (step) *step = -1;
    return dt_checkpoint_is_checkpoint(path) ? dt_checkpoint_load_model(path, out, step) : dt_model_load(path, heads, out);
}

dt_status dt_checkpoint_load_model(const char *dir, dt_gpt2 **out, int *step) {
    char sub[4400], mpath[4500];
    cJSON *j;
    *out = NULL;
    dt_status st = dt_ckpt_open_latest(dir, sub, mpath, &j);
    if (st) return st;
    dt_gpt2_config g;
    double v = 0;
    if (cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "lora")) /* not a model */
        st = dt_error(DT_ERR_ARG, "%s: the checkpoint holds LoRA adapters, not a model: train --model BASE with its --lora flags and "
                      "--resume it", mpath);
    if (!st && !(st = dt_ckpt_manifest_shape(j, mpath, &g)) && !(st = dt_ckpt_count(j, NULL, "step", mpath, 1e9, &v)) && !(st = dt_gpt2_create(&g, out))) {
        float *p[1] = { dt_gpt2_params(*out) };
        st = read_floats(sub, j, "params.f32", p, 1, dt_gpt2_num_params(*out));
        if (st) { dt_gpt2_destroy(*out); *out = NULL; }
    }
    if (step) *step = (int)v;
    cJSON_Delete(j);
    return st;
}

dt_status dt_checkpoint_load_adapters(const char *dir, dt_program **out) {
    char sub[4400], mpath[4500], targets[256];
    cJSON *j;
    *out = NULL;
    dt_status st = dt_ckpt_open_latest(dir, sub, mpath, &j);
    if (st) return st;
    dt_gpt2_config g;
    dt_lora_config lc;
    bool found;
    st = dt_ckpt_manifest_lora(j, mpath, &found, &lc, targets, sizeof targets);
    if (!st && !found) st = dt_error(DT_ERR_ARG, "%s: the checkpoint holds a whole model, not LoRA adapters", mpath);
    if (!st) st = dt_ckpt_manifest_shape(j, mpath, &g);
    if (!st) st = dt_program_create_table(&g, NULL, out);
    if (!st) st = dt_program_set_lora(*out, &lc, 0);
    if (!st) {
        dt_model m;
        dt_program_model(*out, &m);
        float *p[1] = { m.params(m.self) };
        st = read_floats(sub, j, "params.f32", p, 1, m.nparams);
    }
    if (st) dt_program_destroy(*out), *out = NULL;
    cJSON_Delete(j);
    return st;
}

/* The variance's updates of a checkpoint from before they were saved, as that version counted them: by the codec's
 * plan up to the run's step (1-bit Adam's warm-up, 0/1 Adam's variance steps), otherwise the optimizer's steps. */
static long planned_variance_steps(dt_engine *e, long osteps, long step) {
    dt_codec *k = dt_engine_codec(e);
    const dt_codec_config *c = k ? dt_codec_get_config(k) : NULL;
    if (c && c->kind == DT_CODEC_ONEBIT) return step >= c->start ? c->start : osteps;
    if (!c || c->kind != DT_CODEC_ZEROONE) return osteps;
    dt_zeroone_step z;
    dt_codec_zeroone_at(c, step, &z);
    return z.nvar;
}

static dt_status read_step(const char *dir, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm, dt_engine *e,
                           dt_checkpoint_position *pos) {
    char sub[4400], mpath[4500];
    cJSON *j;
    dt_status st = dt_ckpt_open_latest(dir, sub, mpath, &j);
    if (st) return st;
    dt_optim *o = dt_engine_optim(e);
    double step = 0, osteps = 0, vsteps = -1, v[4] = { 0 };
    size_t n = cm->m.nparams;
    st = check_shape(j, mpath, c, cm, o);
    if (!st) st = dt_ckpt_count(j, NULL, "step", mpath, 1e9, &step);
    if (!st) st = dt_ckpt_count(j, "optimizer", "steps", mpath, 1e12, &osteps);
    if (!st && cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "optimizer"), "variance_steps")) {
        st = dt_ckpt_count(j, "optimizer", "variance_steps", mpath, 1e12, &vsteps);
        if (!st && vsteps > osteps) st = dt_error(DT_ERR_IO, "%s: optimizer.variance_steps %.0f is more than its steps %.0f", mpath, vsteps, osteps);
    }
    static const char *const dk[4] = { "tokens", "tokens_per_batch", "epoch", "next_batch" };
    for (int i = 0; i < 4 && !st; i++) st = dt_ckpt_count(j, "data", dk[i], mpath, 1e15, &v[i]);
    if (!st && v[1] < 1) st = dt_error(DT_ERR_IO, "%s: data.tokens_per_batch is 0", mpath);
    float *pbuf[1] = { cm->m.params(cm->m.self) }, *bbuf[1] = { cm->buffers }, *obuf[2] = { dt_optim_buffer(o, 0), dt_optim_buffer(o, 1) };
    size_t off, share;
    dt_engine_share(e, &off, &share);
    size_t G = dt_model_global_params(&cm->m);
    if (G == n) { /* the whole model: read as it is checked */
        if (!st) st = read_floats(sub, j, "params.f32", pbuf, 1, n);
    } else { /* tensor-parallel slices: checked whole, then this rank's runs read */
        if (!st) st = dt_ckpt_verify_file(sub, j, "params.f32", 1, G, NULL);
        if (!st) st = read_slice(sub, "params.f32", &cm->m, pbuf, 1, 0, n);
    }
    if (!st && cm->nbuffers) st = read_floats(sub, j, "buffers.f32", bbuf, 1, cm->nbuffers);
    if (!st) st = dt_ckpt_verify_file(sub, j, "optim.f32", obuf[1] ? 2 : 1, G, NULL);
    if (!st) st = read_optim(sub, e, &cm->m, obuf);
    if (!st) st = read_loss_scale(j, mpath, dt_engine_loss_scale(e));
    if (!st) {
        warn_changes(j, mpath, c, nranks);
        dt_optim_set_steps(o, (long)osteps);
        dt_optim_set_variance_steps(o, vsteps >= 0 ? (long)vsteps : planned_variance_steps(e, (long)osteps, (long)step));
        *pos = (dt_checkpoint_position){ (int)step, (uint64_t)v[2], (size_t)v[3], (size_t)v[1], (size_t)v[0] };
    }
    cJSON_Delete(j);
    return st;
}

/* The latest checkpoint of dir, or where it is damaged the newest whole one that --keep-last kept (said). */
static dt_status read_checkpoint(const char *dir, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm, dt_engine *e,
                                 dt_checkpoint_position *pos) {
    dt_status st = read_step(dir, c, nranks, cm, e, pos);
    if (st != DT_ERR_IO || !strstr(dt_last_error(), "damaged")) return st;
    char why[1024], sub[4400];
    snprintf(why, sizeof why, "%s", dt_last_error());
    int steps[64], n = dt_ckpt_steps(dir, steps, 64);
    for (int i = 1; i < n; i++) { /* steps[0] is the damaged latest */
        snprintf(sub, sizeof sub, "%s/step-%08d", dir, steps[i]);
        if (dt_checkpoint_verify_step(sub, NULL)) continue;
        dt_log(DT_LOG_WARN, "%s; going on from %s, the newest whole checkpoint (steps %d to %d run again)", why, sub, steps[i] + 1,
               steps[0]);
        return read_step(sub, c, nranks, cm, e, pos);
    }
    return dt_error(DT_ERR_IO, "%s%s", why, n > 1 ? "; no older checkpoint in the folder is whole either" : " (--keep-last N keeps older ones)");
}

dt_status dt_checkpoint_resume(const char *dir, dt_comm *w, const dt_train_config *c, const dt_checkpoint_model *cm, dt_engine *e,
                               dt_checkpoint_position *pos) {
    int rank = w ? dt_comm_rank(w) : 0, nranks = w ? dt_comm_size(w) : 1;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_IO, "checkpoint read", "\"rank0_reads\":true");
    dt_status st = rank == 0 ? read_checkpoint(dir, c, nranks, cm, e, pos) : DT_OK;
    DT_TRACE_END(DT_TRACK_IO);
    if (rank == 0 && !st)
        dt_io_count(DT_IO_CKPT_READ, (cm->m.nparams + cm->nbuffers) * sizeof(float) + dt_optim_state_bytes(dt_engine_optim(e)),
                    dt_time_now() - t0);
    char sub[4200];
    if (nranks == 1) {
        snprintf(sub, sizeof sub, "%s/step-%08d", dir, pos->step);
        return st ? st : dt_checkpoint_units_resume(sub, NULL, NULL, e, cm);
    }
    /* every rank learns whether rank 0 could, then gets what it read */
    int32_t ok = st == DT_OK;
    dt_status bs = dt_comm_broadcast(w, &ok, 1, DT_I32, 0);
    if (bs) return bs;
    if (!ok) return rank == 0 ? st : dt_error(DT_ERR_IO, "rank 0 could not resume from %s (its message says why)", dir);
    dt_optim *o = dt_engine_optim(e);
    size_t n = cm->m.nparams, off, share;
    dt_engine_share(e, &off, &share);
    int64_t meta[7] = { pos->step, (int64_t)pos->epoch, (int64_t)pos->next, (int64_t)pos->tokens_per_batch,
                        (int64_t)pos->data_tokens, dt_optim_steps(o), dt_optim_variance_steps(o) };
    bool sliced = dt_model_global_params(&cm->m) != n; /* tensor parallelism: every rank holds its own slices */
    st = dt_comm_broadcast(w, meta, 7, DT_I64, 0);
    snprintf(sub, sizeof sub, "%s/step-%08d", dir, (int)meta[0]);
    float *pbuf[1] = { cm->m.params(cm->m.self) };
    if (!st && !sliced) st = dt_comm_broadcast(w, pbuf[0], n, DT_F32, 0);
    else if (!st && rank != 0) st = read_slice(sub, "params.f32", &cm->m, pbuf, 1, 0, n);
    if (!st && cm->nbuffers) st = dt_comm_broadcast(w, cm->buffers, cm->nbuffers, DT_F32, 0);
    float *obuf[2] = { dt_optim_buffer(o, 0), dt_optim_buffer(o, 1) };
    if ((share != n || sliced) && rank != 0 && !st) /* each rank reads its own slice of the file rank 0 has checked */
        st = read_optim(sub, e, &cm->m, obuf);
    for (int i = 0; i < 2 && !st && share == n && !sliced; i++)
        if (obuf[i]) st = dt_comm_broadcast(w, obuf[i], n, DT_F32, 0);
    dt_loss_scale *ls = dt_engine_loss_scale(e);
    if (ls && !st) {
        double lv[4] = { ls->scale, (double)ls->iter, (double)ls->last_overflow, ls->hysteresis };
        st = dt_comm_broadcast(w, lv, 4, DT_F64, 0);
        *ls = (dt_loss_scale){ .scale = lv[0], .iter = (int64_t)lv[1], .last_overflow = (int64_t)lv[2], .hysteresis = (int)lv[3] };
    }
    if (!st) st = dt_checkpoint_codec_resume(sub, dt_engine_get_config(e)->comm, e, (int)meta[0], cm);
    if (!st) st = dt_checkpoint_units_resume(sub, dt_engine_get_config(e)->comm, w, e, cm);
    if (st) return st;
    *pos = (dt_checkpoint_position){ (int)meta[0], (uint64_t)meta[1], (size_t)meta[2], (size_t)meta[3], (size_t)meta[4] };
    dt_optim_set_steps(o, (long)meta[5]);
    dt_optim_set_variance_steps(o, (long)meta[6]);
    return DT_OK;
}

/* The loader where the checkpoint's was. The same tokens per global batch:
 * the same place. Otherwise (say 2 ranks of batch 4 saved, 1 process of
 * batch 4 with 2 accumulation steps resumes), the place in tokens, which
 * in file order within the first pass converts exactly. */
dt_status dt_checkpoint_seek(const dt_checkpoint_position *pos, dt_loader *l, size_t tokens_per_batch, int shuffled) {
    if (pos->tokens_per_batch == tokens_per_batch) return dt_loader_seek(l, pos->epoch, pos->next);
    size_t tokens = 0;
    bool over = __builtin_mul_overflow(pos->next, pos->tokens_per_batch, &tokens);
    if (over || shuffled || pos->epoch != 0 || tokens % tokens_per_batch)
        return dt_error(DT_ERR_ARG, "--resume: the checkpoint read %zu tokens per global batch, this run reads %zu; its place in "
                        "the data (epoch %llu, batch %zu%s) has no equivalent here (keep ranks x --batch x --seq as saved)",
                        pos->tokens_per_batch, tokens_per_batch, (unsigned long long)pos->epoch, pos->next,
                        shuffled ? ", shuffled" : "");
    return dt_loader_seek(l, 0, tokens / tokens_per_batch);
}
