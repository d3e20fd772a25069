/* --resume DIR alone: the run goes on with the settings its checkpoint's
 * manifest stores (data, shape, batch, optimizer, schedule, precision, ...),
 * read before the flags so that a flag given explicitly overrides them; a
 * change that alters the run is then named by the resume itself
 * (checkpoint_read.c's warn_changes). Keys an older checkpoint lacks keep the
 * defaults. GPT-2 only: an image model's manifest does not name its model.
 */
#include "dtrain/train.h"
#include "checkpoint_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* manifest[section][key] into *out when present, as an int or float. */
static void take_int(const cJSON *j, const char *section, const char *key, int *out) {
    double v;
    if (!dt_ckpt_number(j, section, key, "", &v)) *out = (int)v;
}
static void take_float(const cJSON *j, const char *section, const char *key, float *out) {
    double v;
    if (!dt_ckpt_number(j, section, key, "", &v)) *out = (float)v;
}
static void take_bool(const cJSON *j, const char *section, const char *key, int *out) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, section), *x = s ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    if (cJSON_IsBool(x)) *out = cJSON_IsTrue(x);
}
/* A string that outlives the manifest (the config keeps pointers): kept in
 * into, which lives as long as the process (one resume per process). */
static const char *take_string(const cJSON *j, const char *section, const char *key, const char *keep, char *into, size_t cap) {
    const char *v = dt_ckpt_string(j, section, key);
    if (!v || !*v || strlen(v) >= cap) return keep;
    memcpy(into, v, strlen(v) + 1);
    return into;
}
static void take_precision(const cJSON *j, const char *key, dt_dtype *out) {
    const char *v = dt_ckpt_string(j, "settings", key);
    dt_dtype t;
    if (v && !dt_precision_parse(v, &t)) *out = t;
}

static void take_optimizer(const cJSON *j, dt_train_config *c) {
    const char *kind = dt_ckpt_string(j, "optimizer", "kind");
    dt_optim_kind k;
    if (kind && !dt_optim_parse_kind(kind, &k)) {
        dt_optim_defaults(k, &c->opt);
        c->opt.kind = k;
    }
    take_float(j, "optimizer", "beta1", &c->opt.beta1);
    take_float(j, "optimizer", "beta2", &c->opt.beta2);
    take_float(j, "optimizer", "eps", &c->opt.eps);
    take_float(j, "optimizer", "weight_decay", &c->opt.weight_decay);
    take_float(j, "optimizer", "momentum", &c->opt.momentum);
    take_bool(j, "optimizer", "nesterov", &c->opt.nesterov);
    if (c->opt.kind == DT_OPT_SOAP) {
        take_int(j, "optimizer", "precond_every", &c->opt.precond_every);
        take_int(j, "optimizer", "precond_max_dim", &c->opt.precond_max_dim);
    }
    take_bool(j, "optimizer", "shampoo", &c->shampoo_on);
    if (c->shampoo_on) {
        take_int(j, "optimizer", "shampoo_block", &c->shampoo.block);
        take_int(j, "optimizer", "shampoo_every", &c->opt.precond_every);
        take_int(j, "optimizer", "shampoo_start", &c->shampoo.start);
        take_float(j, "optimizer", "shampoo_eps", &c->shampoo.eps);
        take_int(j, "optimizer", "shampoo_group", &c->shampoo.group);
        const char *w = dt_ckpt_string(j, "optimizer", "shampoo_wire");
        if (w) c->shampoo.wire = !strcmp(w, "bf16") ? DT_BF16 : DT_F32;
    }
    take_bool(j, "optimizer", "kfac", &c->kfac_on);
    if (!c->kfac_on) return;
    take_float(j, "optimizer", "kfac_damping", &c->kfac.damping);
    take_float(j, "optimizer", "kfac_decay", &c->kfac.factor_decay);
    take_float(j, "optimizer", "kfac_kl_clip", &c->kfac.kl_clip);
    take_int(j, "optimizer", "kfac_factor_every", &c->kfac.factor_every);
    take_int(j, "optimizer", "kfac_inv_every", &c->kfac.inv_every);
    take_float(j, "optimizer", "kfac_workers", &c->kfac.workers);
    const char *m = dt_ckpt_string(j, "optimizer", "kfac_method");
    if (m) c->kfac.method = !strcmp(m, "inverse") ? DT_KFAC_INVERSE : DT_KFAC_EIGEN;
    const char *sc = dt_ckpt_string(j, "optimizer", "kfac_scale"); /* absent before the choice existed: kfac-pytorch's */
    if (sc) c->kfac.scale = !strcmp(sc, "fisher") ? DT_KFAC_SCALE_FISHER : DT_KFAC_SCALE_KFAC_PYTORCH;
}

static void take_schedule(const cJSON *j, dt_train_config *c) {
    const char *kind = dt_ckpt_string(j, "schedule", "kind");
    for (int k = DT_SCHED_CONSTANT; kind && k <= DT_SCHED_LAST; k++)
        if (!strcmp(kind, dt_schedule_name((dt_schedule_kind)k))) c->sched.kind = (dt_schedule_kind)k;
    take_float(j, "schedule", "lr", &c->sched.lr);
    take_float(j, "schedule", "lr_min", &c->sched.lr_min);
    take_int(j, "schedule", "warmup", &c->sched.warmup);
    /* a total equal to the run's steps is "the run's length": kept so, a longer --steps stretches it (and is named) */
    double total, steps;
    if (!dt_ckpt_number(j, "schedule", "total", "", &total) && !dt_ckpt_number(j, "settings", "steps", "", &steps) && total != steps)
        c->sched.total = (int)total;
    take_bool(j, "schedule", "linear_warmup", &c->sched.linear_warmup);
    take_float(j, "schedule", "warmup_min_ratio", &c->sched.warmup_min_ratio);
    take_float(j, "schedule", "cos_min_ratio", &c->sched.cos_min_ratio);
    take_int(j, "schedule", "decay", &c->sched.decay); /* absent before WSD: 0 */
    const char *dt = dt_ckpt_string(j, "schedule", "decay_type");
    for (int t = DT_DECAY_COSINE; dt && t <= DT_DECAY_SQRT; t++)
        if (!strcmp(dt, dt_decay_type_name((dt_decay_type)t))) c->sched.decay_type = (dt_decay_type)t;
}

/* LoRA's adapters: the run goes on training them (the flags may still say otherwise, and are then refused). */
static void take_lora(const cJSON *j, dt_train_config *c) {
    static char targets[256];
    dt_lora_config l;
    bool found;
    if (!dt_ckpt_manifest_lora(j, "", &found, &l, targets, sizeof targets) && found) c->lora = l; /* a malformed one: refused on resume */
}

/* The model's shape: GPT-2's six sizes, another family's whole shape (family, K/V heads, widths, rotary settings). */
static dt_status take_shape(const cJSON *j, const char *kind, const char *mpath, dt_train_config *c) {
    if (strcmp(kind, "gpt2")) {
        dt_lm_config g;
        dt_status st = dt_ckpt_manifest_shape(j, mpath, &g);
        if (st) return st;
        c->shape = g;
    }
    take_int(j, "model", "num_layers", &c->shape.num_layers);
    take_int(j, "model", "num_heads", &c->shape.num_heads);
    take_int(j, "model", "channels", &c->shape.channels);
    take_int(j, "model", "vocab_size", &c->shape.vocab_size);
    take_int(j, "model", "max_seq_len", &c->shape.max_seq_len);
    take_int(j, "settings", "seq", &c->seq);
    return DT_OK;
}

/* DPO's loss as the run was given it (a manifest's values, checked again when the run makes its loss). */
static void take_dpo(const cJSON *j, dt_dpo_config *d) {
    dt_ckpt_number(j, "settings", "dpo_beta", "", &d->beta);
    dt_ckpt_number(j, "settings", "dpo_label_smoothing", "", &d->label_smoothing);
    dt_ckpt_number(j, "settings", "dpo_discopop_tau", "", &d->discopop_tau);
    dt_ckpt_number(j, "settings", "dpo_f_alpha", "", &d->f_alpha);
    double ld = NAN;
    dt_ckpt_number(j, "settings", "dpo_ld_alpha", "", &ld);
    if (!isnan(ld)) d->ld = 1, d->ld_alpha = ld;
    take_bool(j, "settings", "dpo_wpo", &d->wpo);
    const char *kinds = dt_ckpt_string(j, "settings", "dpo_loss"), *div = dt_ckpt_string(j, "settings", "dpo_f_divergence");
    if (kinds) (void)dt_dpo_losses_parse(kinds, d);
    if (div) (void)dt_dpo_divergence_parse(div, d);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "settings"), *w = s ? cJSON_GetObjectItemCaseSensitive(s, "dpo_loss_weights") : NULL, *x;
    if (!cJSON_IsArray(w) || cJSON_GetArraySize(w) > DT_DPO_MAX_LOSSES) return;
    d->nweights = 0;
    cJSON_ArrayForEach(x, w) if (cJSON_IsNumber(x)) d->weight[d->nweights++] = x->valuedouble;
}

/* What it read: the data and validation files, the tokenizer, a chat template and packing, DPO's loss, the router's
 * z-loss and sequence-wise balancing loss. */
static void take_data(const cJSON *j, dt_train_config *c) {
    static char data[PATH_MAX], val[PATH_MAX], tokenizer[PATH_MAX], chat[32];
    c->data = take_string(j, "data", "path", c->data, data, sizeof data);
    c->val_data = take_string(j, "settings", "val_data", c->val_data, val, sizeof val);
    c->tokenizer = take_string(j, "settings", "tokenizer", c->tokenizer, tokenizer, sizeof tokenizer);
    c->chat_template = take_string(j, "settings", "chat_template", c->chat_template, chat, sizeof chat);
    take_bool(j, "settings", "pack", &c->pack);
    take_dpo(j, &c->dpo);
    take_float(j, "settings", "moe_z_loss", &c->moe_z_loss);
    take_float(j, "settings", "moe_seq_aux_loss", &c->moe_seq_aux_loss);
    take_float(j, "settings", "moe_global_aux_loss", &c->moe_global_aux_loss);
}

/* Gradient compression's codec and its settings. */
static void take_codec(const cJSON *j, dt_train_config *c) {
    const char *codec = dt_ckpt_string(j, "settings", "compress");
    if (!codec || dt_codec_parse(codec, &c->codec.kind)) return;
    take_int(j, "settings", "compress_rank", &c->codec.rank);
    take_int(j, "settings", "compress_start", &c->codec.start);
    take_float(j, "settings", "compress_density", &c->codec.density);
    take_int(j, "settings", "compress_warmup", &c->codec.warmup);
    take_int(j, "settings", "compress_refresh", &c->codec.refresh);
    take_int(j, "settings", "compress_var_scaler", &c->codec.var_scaler);
    take_int(j, "settings", "compress_local_scaler", &c->codec.local_scaler);
    take_int(j, "settings", "compress_local_clip", &c->codec.local_clip);
    const char *x = dt_ckpt_string(j, "settings", "compress_exchange");
    if (x) (void)dt_codec_parse_exchange(x, &c->codec.exchange);
}

/* The run's course: steps, batches, clipping, threads, evaluation, keeping, recomputing, attention, the seeds. */
static void take_run(const cJSON *j, dt_train_config *c) {
    take_int(j, "settings", "steps", &c->steps);
    take_int(j, "settings", "batch", &c->batch);
    take_int(j, "settings", "grad_accum", &c->grad_accum);
    c->resume_batch = dt_ckpt_global_batch(j);
    take_float(j, "settings", "grad_clip", &c->grad_clip);
    take_int(j, "settings", "threads", &c->threads);
    take_int(j, "settings", "eval_every", &c->eval_every);
    take_int(j, "settings", "keep_last", &c->keep_last);
    take_int(j, "settings", "eval_batches", &c->eval_batches);
    take_bool(j, "settings", "recompute", &c->recompute);
    take_int(j, "settings", "attention", &c->attention);
    take_bool(j, "settings", "skip_nonfinite", &c->skip_nonfinite);
    double v;
    if (!dt_ckpt_number(j, "settings", "seed", "", &v)) c->seed = (uint64_t)v;
    const char *shuffle = dt_ckpt_string(j, "rng", "shuffle_seed");
    if (shuffle) c->shuffle_seed = strtoull(shuffle, NULL, 10);
    take_bool(j, "rng", "shuffle_rows", &c->shuffle_rows);
}

dt_status dt_checkpoint_read_settings(const char *dir, dt_train_config *c) {
    char sub[4400], mpath[4500];
    cJSON *j;
    dt_status st = dt_ckpt_open_latest(dir, sub, mpath, &j);
    if (st) return st;
    const char *kind = dt_ckpt_string(j, "model", "kind");
    /* an image model's name is not in its manifest: its flags say the run */
    if (kind && dt_family_find(kind) && !(st = take_shape(j, kind, mpath, c))) {
        take_data(j, c);
        take_codec(j, c);
        take_run(j, c);
        take_precision(j, "precision", &c->precision);
        take_precision(j, "grad_store", &c->grad_store);
        take_precision(j, "grad_comm", &c->grad_comm);
        take_optimizer(j, c);
        take_schedule(j, c);
        take_lora(j, c);
        if (!c->save) c->save = dir; /* it goes on saving where it was saved */
    }
    cJSON_Delete(j);
    return st;
}

/* The largest micro-batch up to b that global splits into on dp ranks (0: none). */
static int micro_batch_that_splits(long global, int dp, int b) {
    for (; b > 0; b--)
        if (global % ((long)b * dp) == 0) return b;
    return 0;
}

dt_status dt_train_keep_global_batch(dt_train_config *c, int nranks, int say) {
    if (!c->resume_batch) return DT_OK;
    int dp = dt_train_dp(c, nranks);
    long per_step = (long)c->batch * dp;
    if (c->resume_batch % per_step) {
        int b = micro_batch_that_splits(c->resume_batch, dp, c->batch);
        if (b)
            return dt_error(DT_ERR_ARG, "--resume %s: the run was saved with a global batch of %ld samples, which %d data-parallel "
                            "rank%s at --batch %d do not make; --batch %d keeps it (gradient accumulation %ld)", c->resume,
                            c->resume_batch, dp, dp == 1 ? "" : "s", c->batch, b, c->resume_batch / ((long)b * dp));
        return dt_error(DT_ERR_ARG, "--resume %s: the run was saved with a global batch of %ld samples, which does not split over %d "
                        "data-parallel ranks: resume on a number of them that divides it", c->resume, c->resume_batch, dp);
    }
    int accum = (int)(c->resume_batch / per_step);
    if (accum != c->grad_accum && say)
        dt_log(DT_LOG_INFO, "--resume %s: %d data-parallel rank%s x --batch %d: gradient accumulation %d (was %d) keeps the saved "
               "global batch of %ld samples", c->resume, dp, dp == 1 ? "" : "s", c->batch, accum, c->grad_accum, c->resume_batch);
    c->grad_accum = accum;
    return DT_OK;
}
