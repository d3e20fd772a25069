/* Full-state checkpoints: everything a run needs to go on as if it had never
 * stopped.
 *
 *   DIR/latest                 "step-00000010": the newest whole checkpoint
 *   DIR/step-00000010/
 *       manifest.json          format, step, model shape, optimizer, schedule,
 *                              settings, data position, shuffling state, the
 *                              tensor table, and each file's size and hash
 *       params.f32             the parameters, the model's unit-major store
 *       optim.f32              the optimizer's buffers over the same store
 *                              (first moment / momentum, then second moment)
 *       buffers.f32            state beside the parameters, where the model
 *                              has some (a ResNet's BatchNorm running averages)
 *       codec.f32              a gradient codec's state, once a step was
 *                              compressed: every rank's residuals, then the Qs
 *                              (checkpoint_codec.c; a pipeline stage's own:
 *                              codec-stageSofP.f32)
 *       kfac.f32, shampoo.f32, a second-order optimizer's factors, roots,
 *       soap.f32               bases, in units that reshard
 *                              (checkpoint_units.c)
 *
 * A save writes a temporary directory (DIR/.tmp-step-N.PID), syncs it,
 * renames it into place, and only then points `latest` at it (itself an
 * atomic rename) and removes the older steps: a crash at any moment leaves
 * `latest` naming a whole checkpoint. The training has no randomness but the
 * data order, which is a function of the shuffle seed and the epoch; both
 * are saved. Every rank of a data-parallel run holds the same state, so rank
 * 0 writes it and, on resume, reads it and broadcasts it.
 *
 * A strategy that shards the optimizer (ZeRO) writes the same files without
 * gathering anything: rank 0 makes the temporary directory and writes the
 * parameters (whole on every rank after a step), every rank writes its slice
 * of optim.f32 in place (pwrite at its offset), the ranks exchange their
 * slices' hashes, and rank 0 writes the manifest, which lists the pieces,
 * last. So the directory (on a filesystem every rank sees) reads back on any
 * layout: a sharded run reads its own slice of optim.f32, any other run the
 * whole.
 *
 * The model is described by dt_checkpoint_model: GPT-2 and the ResNets
 * save the same files, the manifest naming the kind and its shape.
 *
 * This file writes them (and checks save paths); checkpoint_manifest.c
 * makes the manifest, checkpoint_read.c reads and resumes,
 * checkpoint_describe.c prints what one holds (ckpt info). */
#include "dtrain/train.h"
#include "checkpoint_internal.h"
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int dt_checkpoint_is_dir(const char *save) {
    size_t n = strlen(save);
    return !(n > 4 && !strcmp(save + n - 4, ".bin")) && !dt_safetensors_path(save);
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { fsync(fd); close(fd); }
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[8192];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Steps other than the one just saved (now) and the keep - 1 before it (a resumed run's later steps were lost
 * work), and temporaries of saves whose process is gone. */
static void remove_others(const char *dir, int now, int keep) {
    int steps[256], n = dt_ckpt_steps(dir, steps, 256), oldest_kept = now;
    for (int i = 0, kept = 0; i < n && kept < keep; i++)
        if (steps[i] <= now) oldest_kept = steps[i], kept++;
    DIR *d = opendir(dir);
    if (!d) return;
    char p[8192];
    for (struct dirent *e; (e = readdir(d));) {
        int s = !strncmp(e->d_name, "step-", 5) ? atoi(e->d_name + 5) : -1;
        bool old = s >= 0 && (s > now || s < oldest_kept);
        const char *dot = !strncmp(e->d_name, ".tmp-step-", 10) ? strrchr(e->d_name, '.') : NULL;
        long pid = dot ? strtol(dot + 1, NULL, 10) : 0;
        bool stale = pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (!old && !stale) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        remove_tree(p);
    }
    closedir(d);
}


/* A save path's extension, when it has one (".pt" of "runs/model.pt"). */
static const char *extension(const char *path) {
    const char *base = strrchr(path, '/'), *dot;
    base = base ? base + 1 : path;
    dot = strrchr(base, '.');
    return dot && dot != base && dot[1] ? dot : NULL;
}

dt_status dt_checkpoint_check_path(const char *path, const char *flag) {
    struct stat sb;
    const char *ext = extension(path);
    /* the extensions of other formats' files: a directory named so is a mistake (a "run.v2" directory is fine) */
    static const char *const files[] = { ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".gguf", ".ggml", ".onnx", ".npz", ".npy",
                                         ".msgpack", ".json", ".txt", ".tar", ".zip", ".gz", ".model", ".st", NULL };
    int other = 0;
    for (int i = 0; ext && files[i]; i++) other |= !strcasecmp(ext, files[i]);
    if (!other || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) return DT_OK;
    bool save = !strcmp(flag, "--save"); /* export also writes llama.cpp's GGUF (checked by its caller before this) */
    return dt_error(DT_ERR_ARG, "%s %s: the name decides what is written: %s (a name without an extension), "
                    "FILE.safetensors (HF's layout)%s or FILE.bin (llm.c's); dtrain writes no %s file", flag, path,
                    save ? "a checkpoint directory" : "an HF folder", save ? "" : ", FILE.gguf (llama.cpp's)", ext);
}

dt_status dt_checkpoint_check_dir(const char *dir, const char *resume, int overwrite) {
    struct stat sb;
    dt_status st = dt_checkpoint_check_path(dir, "--save");
    if (st) return st;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_ARG, "--save %s: exists and is not a directory (a checkpoint is a directory; "
                        "a weights file ends in .bin or .safetensors)", dir);
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/latest", dir);
    /* another run's checkpoint is never replaced silently: a new run would remove it at its first save */
    if (!overwrite && access(probe, F_OK) == 0 && !dt_file_same(dir, resume)) {
        char sub[4400], mpath[4500];
        cJSON *j = NULL;
        double step = -1;
        if (dt_ckpt_open_latest(dir, sub, mpath, &j) == DT_OK) dt_ckpt_count(j, NULL, "step", mpath, 1e9, &step);
        cJSON_Delete(j);
        char at[48] = "";
        if (step >= 0) snprintf(at, sizeof at, " (step %.0f)", step);
        return dt_error(DT_ERR_ARG, "--save %s already holds a checkpoint%s: --resume %s goes on from it; --overwrite replaces it "
                        "with this run's; or name another --save directory", dir, at, dir);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dt_error(DT_ERR_IO, "--save %s: cannot create the directory: %s", dir, strerror(errno));
    return dt_file_check_writable(probe);
}

const char *const dt_ckpt_lm_shape[22] = { "max_seq_len", "vocab_size", "padded_vocab_size", "num_layers", "num_heads", "channels",
                                            "kv_heads", "head_dim", "ffn", "untied", "rope_original_max", "experts", "experts_top_k",
                                            "norm_topk", "shared_ffn", "router", "expert_groups", "group_top_k", "drop_policy",
                                            "moe_every", "first_dense", "dense_ffn" };
const char *const dt_ckpt_lm_numbers[9] = { "norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                            "aux_coef", "routed_scale", "bias_rate", "capacity_factor" };

void dt_checkpoint_gpt2(dt_gpt2 *g, dt_checkpoint_model *out) {
    memset(out, 0, sizeof *out);
    dt_gpt2_model(g, &out->m);
    dt_lm_config c = dt_lm_config_resolve(dt_gpt2_get_config(g));
    const int v[22] = { c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers, c.num_heads, c.channels,
                        c.kv_heads, c.head_dim, c.ffn, c.untied, c.rope_original_max, c.experts, c.experts_top_k, c.norm_topk,
                        c.shared_ffn, c.router, c.expert_groups, c.group_top_k, c.drop_policy, c.moe_every, c.first_dense, c.dense_ffn };
    const double f[9] = { c.norm_eps, c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.aux_coef,
                          c.routed_scale, c.bias_rate, c.capacity_factor };
    bool gpt2 = !strcmp(out->m.kind, "gpt2"); /* GPT-2's manifests keep their six sizes: the rest are its defaults */
    /* (dense layers among the mixtures, three more: a manifest without them has none) */
    out->nshape = gpt2 ? 6 : c.experts ? (c.dense_ffn ? 22 : 19) : 11;
    out->nfshape = gpt2 ? 0 : c.experts ? 9 : 5;
    for (int i = 0; i < out->nshape; i++) out->shape_names[i] = dt_ckpt_lm_shape[i], out->shape[i] = v[i];
    for (int i = 0; i < out->nfshape; i++) out->fshape_names[i] = dt_ckpt_lm_numbers[i], out->fshape[i] = f[i];
    out->lora = dt_program_lora_config(dt_gpt2_program(g));
    out->buffers = dt_program_moe_bias(dt_gpt2_program(g), &out->nbuffers); /* DeepSeek-V3's router's bias, every layer's */
}

void dt_checkpoint_resnet(dt_resnet *r, dt_checkpoint_model *out) {
    static const char *const names[5] = { "depth", "image_channels", "image_height", "image_width", "classes" };
    memset(out, 0, sizeof *out);
    dt_resnet_model(r, &out->m);
    const dt_resnet_config *c = dt_resnet_get_config(r);
    const int v[5] = { c->depth, c->channels, c->height, c->width, c->classes };
    out->nshape = 5;
    for (int i = 0; i < 5; i++) out->shape_names[i] = names[i], out->shape[i] = v[i];
    out->buffers = dt_resnet_buffers(r, &out->nbuffers);
}

static dt_status save_files(const char *dir, dt_comm *w, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm,
                            dt_engine *e, const dt_checkpoint_position *pos, size_t *written);

/* The write is the run's checkpoint I/O: counted (bytes, seconds) and traced. */
dt_status dt_checkpoint_save(const char *dir, dt_comm *w, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm,
                             dt_engine *e, const dt_checkpoint_position *pos) {
    double t0 = dt_time_now();
    size_t written = 0;
    DT_TRACE_BEGIN(DT_TRACK_IO, "checkpoint write", "\"step\":%d,\"files\":%d,\"bytes\":%zu", pos->step, cm->nbuffers ? 5 : 4,
                   (cm->m.nparams + cm->nbuffers) * sizeof(float) + dt_optim_state_bytes(dt_engine_optim(e)));
    dt_status st = save_files(dir, w, c, nranks, cm, e, pos, &written);
    DT_TRACE_END(DT_TRACK_IO);
    if (!st) dt_io_count(DT_IO_CKPT_WRITE, written, dt_time_now() - t0);
    return st;
}

dt_status dt_ckpt_every_rank(dt_comm *w, bool ok, const char *what) {
    bool all;
    dt_status st = dt_comm_every(w, ok, &all);
    if (!st && !all) st = dt_error(DT_ERR_NOMEM, "checkpoint: %s could not %s (out of memory)", ok ? "another rank" : "this rank", what);
    return st;
}

/* Rank 0's status, on every rank of w (a failure there stops them all). */
static dt_status agree(dt_comm *w, dt_status st, const char *what) {
    if (!w || dt_comm_size(w) == 1) return st;
    int32_t code = (int32_t)st;
    dt_status bs = dt_comm_broadcast(w, &code, 1, DT_I32, 0);
    if (bs) return bs;
    if (dt_comm_rank(w) == 0 || !code) return st;
    return dt_error((dt_status)code, "rank 0 could not %s (its message says why)", what);
}

/* Moving [off, off + n) of this rank's store, in each of nb buffers that
 * hold just that range (from their first float), to or from a file in the
 * whole model's layout (buffer b at b * G floats): the table's runs (a whole
 * tensor each, or a tensor-parallel slice's rows). */
typedef struct {
    int fd, nb, write;
    float *const *bufs;
    size_t G, off;
    const char *path;
    dt_status st;
    size_t tied0, tied1;   /* the store's tied copy, not written */
} runs_io;

static void run_io(size_t lo, size_t go, size_t n, void *ctx) {
    runs_io *x = ctx;
    /* a pipeline's last stage holds a copy of the tied wte: the first stage writes it (the copy's optimizer state is not wte's) */
    if (x->write && lo >= x->tied0 && lo < x->tied1) return;
    for (int b = 0; b < x->nb && !x->st; b++) {
        char *q = (char *)(x->bufs[b] + (lo - x->off));
        size_t left = n * sizeof(float);
        off_t at = (off_t)(((size_t)b * x->G + go) * sizeof(float));
        while (left && !x->st) {
            ssize_t k = x->write ? pwrite(x->fd, q, left, at) : pread(x->fd, q, left, at);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0)
                x->st = x->write ? dt_error(DT_ERR_IO, "%s: write failed: %s (the previous checkpoint is untouched)", x->path, strerror(errno))
                                 : dt_error(DT_ERR_IO, "%s: short read at byte %lld", x->path, (long long)at);
            else { q += k; left -= (size_t)k; at += k; }
        }
    }
}

dt_status dt_ckpt_file_slice(const char *path, int write, const dt_model *m, float *const *bufs, int nb, const dt_store_range *rg, int nrg) {
    int fd = write ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot %s: %s", path, write ? "create" : "open", strerror(errno));
    float *at[2] = { bufs[0], nb > 1 ? bufs[1] : NULL }; /* run j's values in each buffer */
    runs_io x = { fd, nb, write, at, dt_model_global_params(m), 0, path, DT_OK, 0, 0 };
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].tied_copy) x.tied0 = m->tensors[i].offset, x.tied1 = m->tensors[i].offset + m->tensors[i].count;
    for (int j = 0; j < nrg && !x.st; j++) {
        x.off = rg[j].off;
        dt_model_global_runs(m, rg[j].off, rg[j].n, run_io, &x);
        for (int b = 0; b < nb; b++) at[b] += rg[j].n;
    }
    if (write && fsync(fd) != 0 && !x.st) x.st = dt_error(DT_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    close(fd);
    return x.st;
}

dt_status dt_ckpt_file_runs(const char *path, int write, const dt_model *m, float *const *bufs, int nb, size_t off, size_t n) {
    dt_store_range one = { off, n };
    return dt_ckpt_file_slice(path, write, m, bufs, nb, &one, 1);
}

/* This rank's slice of each buffer, written in place into the shared file. */
static dt_status write_slice(const char *path, const dt_model *m, const float *const *bufs, int nb, size_t off, size_t n) {
    return dt_ckpt_file_runs(path, 1, m, (float *const *)bufs, nb, off, n);
}

/* This rank's slice of the store P (its runs, dt_engine_runs), written in place into the shared file. */
static dt_status write_runs(const char *path, const dt_model *m, const float *P, const dt_engine *e) {
    const dt_store_range *rg;
    dt_status st = DT_OK;
    for (int j = 0, nrg = dt_engine_runs(e, &rg); j < nrg && !st; j++) {
        const float *at[1] = { P + rg[j].off };
        st = write_slice(path, m, at, 1, rg[j].off, rg[j].n);
    }
    return st;
}

/* A file's floats [a, b) of each of its nb buffers of G, hashed as verify_file does a piece. */
static dt_status hash_piece(const char *path, int nb, size_t G, size_t a, size_t b, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 18 };
    float *buf = malloc(CHUNK * sizeof(float));
    dt_status st = buf ? DT_OK : dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    uint64_t h = DT_HASH_INIT;
    for (int bi = 0; bi < nb && !st; bi++)
        for (size_t at = a; at < b && !st; at += CHUNK) {
            size_t m = b - at < CHUNK ? b - at : CHUNK;
            if (pread(fd, buf, m * sizeof(float), (off_t)(((size_t)bi * G + at) * sizeof(float))) != (ssize_t)(m * sizeof(float)))
                st = dt_error(DT_ERR_IO, "%s: short read", path);
            else h = dt_hash_words(h, buf, m);
        }
    free(buf);
    close(fd);
    *out = h;
    return st;
}

/* Rank 0, once every slice is on disk: the manifest, last, then the
 * directory renamed into place and `latest` moved to it. */
static dt_status commit(const char *dir, const char *tmp, const char *name, const dt_ckpt_manifest_in *in, size_t *written) {
    const dt_train_config *c = in->c;
    const dt_checkpoint_position *pos = in->pos;
    char path[4200], final[4200];
    cJSON *j = dt_ckpt_manifest(in);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    size_t tl = text ? strlen(text) : 0;
    const void *tp[1] = { text };
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    dt_status st = text ? dt_file_write_atomic(path, tp, &tl, 1) : dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    free(text);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    if (!st) {
        fsync_dir(tmp);
        remove_tree(final); /* the same step saved again (a resumed run) */
        if (rename(tmp, final) != 0) st = dt_error(DT_ERR_IO, "%s: cannot rename %s into place: %s", dir, tmp, strerror(errno));
    }
    if (st) return st;
    fsync_dir(dir);
    char latest[4200], line[40];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    size_t ll = strlen(line);
    const void *lp[1] = { line };
    if ((st = dt_file_write_atomic(latest, lp, &ll, 1))) return st;
    fsync_dir(dir);
    remove_others(dir, pos->step, c->keep_last > 0 ? c->keep_last : 1);
    *written = tl + ll;
    return DT_OK;
}

/* A tensor-parallel save: the files are the whole model's, each rank's
 * slices written in place at their runs, so the ranks' writes interleave.
 * Once all are on disk, each rank hashes a contiguous 1/p of each file
 * (read back) for the manifest's pieces. */
static dt_status hash_pieces(const char *tmp, dt_comm *w, int nb, size_t G, dt_ckpt_piece *mine) {
    int r = dt_comm_rank(w), p = dt_comm_size(w);
    char path[4200];
    size_t a = G * (size_t)r / (size_t)p, b = G * (size_t)(r + 1) / (size_t)p;
    *mine = (dt_ckpt_piece){ a, b - a, 0, 0 };
    snprintf(path, sizeof path, "%s/params.f32", tmp);
    dt_status st = hash_piece(path, 1, G, a, b, &mine->phash);
    snprintf(path, sizeof path, "%s/optim.f32", tmp);
    return st ? st : hash_piece(path, nb, G, a, b, &mine->hash);
}

/* The temporary directory tmp (rank 0's, named by its pid) made by rank 0 for step folder name, every rank of w told. */
static dt_status make_tmp(const char *dir, const char *name, dt_comm *w, char tmp[4096]) {
    int64_t pid = getpid();
    dt_status st = w ? dt_comm_broadcast(w, &pid, 1, DT_I64, 0) : DT_OK;
    if (st) return st;
    if (snprintf(tmp, 4096, "%s/.tmp-%s.%lld", dir, name, (long long)pid) >= 4096) st = dt_error(DT_ERR_ARG, "%s: path too long", dir);
    if ((!w || dt_comm_rank(w) == 0) && !st) {
        remove_tree(tmp);
        if (mkdir(tmp, 0755) != 0) st = dt_error(DT_ERR_IO, "%s: cannot create %s: %s", dir, tmp, strerror(errno));
    }
    return agree(w, st, "create the checkpoint's directory");
}

/* Every rank's piece into all (rank order) and whether it got there (st, this rank's): the first rank that failed is
 * named ("rank R " what), on every rank. */
static dt_status exchange_pieces(dt_comm *w, dt_status st, dt_ckpt_piece mine, dt_ckpt_piece *all, const char *what) {
    int p = w ? dt_comm_size(w) : 1;
    uint64_t me[5] = { st != DT_OK, mine.off, mine.count, mine.hash, mine.phash }, *got = malloc(sizeof *got * 5 * (size_t)p);
    dt_status gs = dt_ckpt_every_rank(w, got != NULL, "hold the ranks' pieces");
    if (!gs && w) gs = dt_comm_allgather(w, me, got, 5, DT_I64);
    else if (!gs) memcpy(got, me, sizeof me);
    int failed = -1;
    for (int r = 0; !gs && r < p; r++) {
        if (got[5 * r] && failed < 0) failed = r;
        all[r] = (dt_ckpt_piece){ got[5 * r + 1], got[5 * r + 2], got[5 * r + 3], got[5 * r + 4] };
    }
    free(got);
    if (!st && !gs && failed >= 0) st = dt_error(DT_ERR_IO, "checkpoint: rank %d %s (its message says why)", failed, what);
    return st ? st : gs;
}

/* w: the ranks that share a sharded optimizer (each writes its slice), or
 * NULL (rank 0 alone writes everything: one slice, the whole store); for a
 * tensor-parallel model (its table's slices are not the whole model) every
 * rank of the job, the data-parallel rank 0 of each slice writing it unless
 * the optimizer (and with ZeRO-3 the parameters) are sharded. */
static dt_status save_files(const char *dir, dt_comm *w, const dt_train_config *c, int nranks, const dt_checkpoint_model *cm,
                            dt_engine *e, const dt_checkpoint_position *pos, size_t *written) {
    dt_model m = cm->m;
    dt_optim *o = dt_engine_optim(e);
    size_t off, n, G = dt_model_global_params(&m);
    dt_engine_share(e, &off, &n);
    bool sliced = G != m.nparams, sharded = off != 0 || n != m.nparams;
    const dt_engine_config *ec = dt_engine_get_config(e);
    dt_comm *dp = ec->ep > 1 ? ec->expert_comm : ec->comm; /* with experts spread over ranks: those holding the same ones */
    bool dp0 = !dp || dt_comm_rank(dp) == 0; /* writes what its data-parallel ranks all hold */
    if (sliced && !w) return dt_error(DT_ERR_ARG, "checkpoint: a tensor- or pipeline-parallel model's ranks save together");
    if ((off != 0 || n != m.nparams) && !w)
        return dt_error(DT_ERR_ARG, "checkpoint: strategy %s shards the optimizer: all its ranks save together",
                        dt_engine_strategy_name(e));
    int rank = w ? dt_comm_rank(w) : 0, p = w ? dt_comm_size(w) : 1;
    char tmp[4096], path[4200], name[32];
    snprintf(name, sizeof name, "step-%08d", pos->step);
    dt_status st = make_tmp(dir, name, w, tmp);
    if (st) return st;
    const float *P = m.params(m.self), *bufs[2] = { dt_optim_buffer(o, 0), dt_optim_buffer(o, 1) };
    int nb = bufs[1] ? 2 : 1;
    uint64_t phash = 0, bhash = 0, hp = 0, h = dt_hash_words(DT_HASH_INIT, bufs[0], n);
    if (nb == 2) h = dt_hash_words(h, bufs[1], n);
    /* ZeRO-3 with a copy per rank: each holds only its slice of the parameters, and writes it */
    bool ps = w && dt_engine_params_sharded(e);
    if (ps || (sliced && dp0)) {
        const float *slice[1] = { ps ? P + off : P };
        hp = dt_hash_words(DT_HASH_INIT, P + off, n);
        snprintf(path, sizeof path, "%s/params.f32", tmp);
        st = ps ? write_runs(path, &m, P, e) : write_slice(path, &m, slice, 1, 0, m.nparams);
    } else if (rank == 0 && !sliced) {
        size_t pb = m.nparams * sizeof(float);
        const void *pp[1] = { P };
        phash = dt_hash_words(DT_HASH_INIT, P, m.nparams);
        snprintf(path, sizeof path, "%s/params.f32", tmp);
        st = dt_file_write_atomic(path, pp, &pb, 1);
    }
    if (rank == 0 && cm->nbuffers && !st) {
        /* every rank's buffers are rank 0's before each evaluation; rank 0's are saved */
        size_t bb = cm->nbuffers * sizeof(float);
        const void *bp[1] = { cm->buffers };
        bhash = dt_hash_words(DT_HASH_INIT, cm->buffers, cm->nbuffers);
        snprintf(path, sizeof path, "%s/buffers.f32", tmp);
        st = dt_file_write_atomic(path, bp, &bb, 1);
    }
    if (!st) st = dt_ckpt_codec_write(tmp, cm); /* the ranks holding a codec's state (a stage's first data-parallel rank) */
    if (!st) st = dt_ckpt_units_write(tmp, cm); /* the ranks holding a source's state (a stage's first data-parallel rank) */
    snprintf(path, sizeof path, "%s/optim.f32", tmp);
    const dt_store_range *rg;
    int nrg = dt_engine_runs(e, &rg);
    if (!st && (!sliced || sharded || dp0)) st = dt_ckpt_file_slice(path, 1, &m, (float *const *)bufs, nb, rg, nrg);
    /* every rank's slice, and whether it is on disk: the manifest needs the one, the commit the other */
    dt_ckpt_piece *all = calloc((size_t)p, sizeof *all);
    dt_status as = dt_ckpt_every_rank(w, all != NULL, "hold the ranks' pieces");
    st = as ? as : exchange_pieces(w, st, (dt_ckpt_piece){ off, n, h, hp }, all, "could not write its part");
    if (!st && sliced) { /* every write is on disk (the exchange above): the pieces' hashes, read back */
        dt_ckpt_piece mp;
        st = exchange_pieces(w, hash_pieces(tmp, w, nb, G, &mp), mp, all, "could not hash its piece");
        ps = true; /* params.f32 in pieces too */
    }
    /* every stage's second-order and codec state and the whole table, for the manifest */
    dt_ckpt_side side = { 0 };
    if (!st) st = dt_ckpt_units_collect(w, cm, &side.units, &side.nunits);
    if (!st) st = dt_ckpt_codec_collect(w, cm, &side.codec, &side.ncodec);
    if (!st) st = dt_ckpt_table_collect(w, cm, sliced, &side.tensors, &side.ntensors);
    *written = 0;
    size_t nbytes[3] = { G * sizeof(float), G * sizeof(float) * (size_t)nb, cm->nbuffers * sizeof(float) };
    dt_ckpt_manifest_in in = { c, nranks, dt_engine_strategy_name(e), cm, o, dt_engine_loss_scale(e), pos, { phash, 0, bhash },
                               { nbytes[0], nbytes[1], nbytes[2] }, all, p, ps, &side };
    if (rank == 0 && !st) st = commit(dir, tmp, name, &in, written);
    free(side.units), free(side.codec), free(side.tensors);
    if (rank == 0 && st) remove_tree(tmp);
    /* this rank's own bytes: its slices, and rank 0 the whole parameters unless they are in slices */
    *written += n * sizeof(float) * (size_t)(nb + ps) + (rank == 0 ? ((ps ? 0 : m.nparams) + cm->nbuffers) * sizeof(float) : 0);
    free(all);
    return agree(w, st, "commit the checkpoint");
}

dt_status dt_checkpoint_gather(dt_engine *e, dt_checkpoint_model *cm) {
    dt_comm *w = dt_engine_get_config(e)->comm;
    dt_status st = dt_checkpoint_codec_gather(e, w, cm);
    return st ? st : dt_checkpoint_units_gather(e, w, cm);
}

void dt_checkpoint_release(dt_checkpoint_model *cm) {
    free(cm->codec_state);
    cm->codec_state = NULL;
    free(cm->units.data), cm->units.data = NULL;
}
