/* A checkpoint's manifest.json, section by section: the model (its kind and shape, LoRA's adapters), the optimizer
 * (its counts and settings, a second-order optimizer's), the learning rate's schedule, the settings --resume DIR alone
 * goes on with (resume_settings.c reads them), the loss scaler's state, the data's place and the shuffle, each file's
 * size and hash (a sharded save's pieces), a codec's and a second-order optimizer's state files, and the tensor table.
 * checkpoint_write.c writes it last, once every file is on disk. */
#include "dtrain/train.h"
#include "checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void model_section(cJSON *j, const dt_checkpoint_model *cm) {
    const dt_model *m = &cm->m;
    cJSON *x = cJSON_AddObjectToObject(j, "model");
    cJSON_AddStringToObject(x, "kind", m->kind);
    for (int i = 0; i < cm->nshape; i++) cJSON_AddNumberToObject(x, cm->shape_names[i], cm->shape[i]);
    for (int i = 0; i < cm->nfshape; i++) cJSON_AddNumberToObject(x, cm->fshape_names[i], cm->fshape[i]);
    cJSON_AddNumberToObject(x, "parameters", (double)dt_model_global_params(m));
    if (cm->nbuffers) cJSON_AddNumberToObject(x, "buffers", (double)cm->nbuffers);
    if (cm->lora) { /* the parameters are the adapters; the base comes from --model */
        cJSON *l = cJSON_AddObjectToObject(x, "lora");
        cJSON_AddNumberToObject(l, "rank", cm->lora->rank);
        cJSON_AddNumberToObject(l, "alpha", dt_f32_decimal(cm->lora->alpha));
        cJSON_AddStringToObject(l, "targets", cm->lora->targets);
        cJSON_AddNumberToObject(l, "dropout", dt_f32_decimal(cm->lora->dropout));
    }
}

/* A second-order optimizer's settings (its state: kfac.f32, shampoo.f32, soap.f32) in the optimizer's section x. */
static void second_order_settings(cJSON *x, const dt_train_config *c) {
    if (c->opt.kind == DT_OPT_SOAP) {
        cJSON_AddNumberToObject(x, "precond_every", c->opt.precond_every);
        cJSON_AddNumberToObject(x, "precond_max_dim", c->opt.precond_max_dim);
    }
    if (c->kfac_on) {
        cJSON_AddBoolToObject(x, "kfac", 1);
        cJSON_AddNumberToObject(x, "kfac_damping", dt_f32_decimal(c->kfac.damping));
        cJSON_AddNumberToObject(x, "kfac_decay", dt_f32_decimal(c->kfac.factor_decay));
        cJSON_AddNumberToObject(x, "kfac_kl_clip", dt_f32_decimal(c->kfac.kl_clip));
        cJSON_AddNumberToObject(x, "kfac_factor_every", c->kfac.factor_every);
        cJSON_AddNumberToObject(x, "kfac_inv_every", c->kfac.inv_every);
        cJSON_AddNumberToObject(x, "kfac_workers", dt_f32_decimal(c->kfac.workers));
        cJSON_AddStringToObject(x, "kfac_method", c->kfac.method == DT_KFAC_INVERSE ? "inverse" : "eigen");
        cJSON_AddStringToObject(x, "kfac_scale", c->kfac.scale == DT_KFAC_SCALE_FISHER ? "fisher" : "kfac-pytorch");
    }
    if (c->shampoo_on) {
        cJSON_AddBoolToObject(x, "shampoo", 1);
        cJSON_AddNumberToObject(x, "shampoo_block", c->shampoo.block);
        cJSON_AddNumberToObject(x, "shampoo_every", c->shampoo.every);
        cJSON_AddNumberToObject(x, "shampoo_start", c->shampoo.start);
        cJSON_AddNumberToObject(x, "shampoo_eps", c->shampoo.eps);
        cJSON_AddNumberToObject(x, "shampoo_group", c->shampoo.group);
        cJSON_AddStringToObject(x, "shampoo_wire", c->shampoo.wire == DT_BF16 ? "bf16" : "fp32");
    }
}

static void optimizer_section(cJSON *j, const dt_train_config *c, dt_optim *o) {
    cJSON *x = cJSON_AddObjectToObject(j, "optimizer");
    cJSON_AddStringToObject(x, "kind", dt_optim_kind_name(c->opt.kind));
    cJSON_AddNumberToObject(x, "steps", (double)dt_optim_steps(o));
    cJSON_AddNumberToObject(x, "variance_steps", (double)dt_optim_variance_steps(o));
    cJSON_AddNumberToObject(x, "buffers", dt_optim_buffer(o, 1) ? 2 : 1);
    cJSON_AddNumberToObject(x, "beta1", c->opt.beta1);
    cJSON_AddNumberToObject(x, "beta2", c->opt.beta2);
    cJSON_AddNumberToObject(x, "eps", c->opt.eps);
    cJSON_AddNumberToObject(x, "weight_decay", c->opt.weight_decay);
    cJSON_AddNumberToObject(x, "momentum", c->opt.momentum);
    cJSON_AddBoolToObject(x, "nesterov", c->opt.nesterov);
    second_order_settings(x, c);
}

static void schedule_section(cJSON *j, const dt_train_config *c) {
    cJSON *x = cJSON_AddObjectToObject(j, "schedule");
    cJSON_AddStringToObject(x, "kind", dt_schedule_name(c->sched.kind));
    cJSON_AddNumberToObject(x, "lr", c->sched.lr);
    cJSON_AddNumberToObject(x, "lr_min", c->sched.lr_min);
    cJSON_AddNumberToObject(x, "warmup", c->sched.warmup);
    cJSON_AddNumberToObject(x, "total", c->sched.total ? c->sched.total : c->steps);
    cJSON_AddBoolToObject(x, "linear_warmup", c->sched.linear_warmup);
    cJSON_AddNumberToObject(x, "warmup_min_ratio", c->sched.warmup_min_ratio);
    cJSON_AddNumberToObject(x, "cos_min_ratio", c->sched.cos_min_ratio);
    cJSON_AddNumberToObject(x, "decay", c->sched.decay);
    cJSON_AddStringToObject(x, "decay_type", dt_decay_type_name(c->sched.decay_type));
}

/* DPO's loss as given (each only where given: a resumed run reads back what was said). */
static void dpo_settings(cJSON *x, const dt_dpo_config *d) {
    if (d->beta > 0) cJSON_AddNumberToObject(x, "dpo_beta", d->beta);
    if (d->nloss) {
        char kinds[256] = "";
        for (int i = 0; i < d->nloss; i++) snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", i ? "," : "", dt_dpo_kind_name(d->loss[i]));
        cJSON_AddStringToObject(x, "dpo_loss", kinds);
    }
    if (d->nweights) cJSON_AddItemToObject(x, "dpo_loss_weights", cJSON_CreateDoubleArray(d->weight, d->nweights));
    if (d->label_smoothing > 0) cJSON_AddNumberToObject(x, "dpo_label_smoothing", d->label_smoothing);
    if (d->discopop_tau > 0) cJSON_AddNumberToObject(x, "dpo_discopop_tau", d->discopop_tau);
    if (d->divergence != DT_DPO_REVERSE_KL) cJSON_AddStringToObject(x, "dpo_f_divergence", dt_dpo_divergence_name(d->divergence));
    if (d->f_alpha > 0) cJSON_AddNumberToObject(x, "dpo_f_alpha", d->f_alpha);
    if (d->ld) cJSON_AddNumberToObject(x, "dpo_ld_alpha", d->ld_alpha);
    if (d->wpo) cJSON_AddBoolToObject(x, "dpo_wpo", 1);
}

/* The codec's flags in the settings section x: --resume DIR alone goes on compressing as the run did. */
static void codec_settings(cJSON *x, const dt_codec_config *k) {
    if (k->kind == DT_CODEC_NONE) return;
    cJSON_AddStringToObject(x, "compress", dt_codec_name(k->kind));
    cJSON_AddNumberToObject(x, "compress_rank", k->rank);
    cJSON_AddNumberToObject(x, "compress_start", k->start);
    cJSON_AddNumberToObject(x, "compress_density", dt_f32_decimal(k->density));
    cJSON_AddNumberToObject(x, "compress_warmup", k->warmup);
    cJSON_AddStringToObject(x, "compress_exchange", dt_codec_exchange_name(k->exchange));
    cJSON_AddNumberToObject(x, "compress_refresh", k->refresh);
    if (k->kind == DT_CODEC_ZEROONE) {
        cJSON_AddNumberToObject(x, "compress_var_scaler", k->var_scaler);
        cJSON_AddNumberToObject(x, "compress_local_scaler", k->local_scaler);
        cJSON_AddNumberToObject(x, "compress_local_clip", k->local_clip);
    }
}

/* The layout's and the run's settings: the layout reads the global batch (ranks / (tp x pp x cp)); the rest is what
 * --resume DIR alone needs to go on as the run did. */
static void settings_section(cJSON *j, const dt_train_config *c, int nranks, const char *strategy) {
    cJSON *x = cJSON_AddObjectToObject(j, "settings");
    cJSON_AddNumberToObject(x, "steps", c->steps);
    cJSON_AddNumberToObject(x, "batch", c->batch);
    cJSON_AddNumberToObject(x, "seq", c->seq);
    cJSON_AddNumberToObject(x, "grad_accum", c->grad_accum);
    cJSON_AddNumberToObject(x, "ranks", nranks);
    cJSON_AddNumberToObject(x, "tp", c->tp > 1 ? c->tp : 1);
    cJSON_AddNumberToObject(x, "pp", c->pp > 1 ? c->pp : 1);
    cJSON_AddNumberToObject(x, "cp", c->cp > 1 ? c->cp : 1);
    cJSON_AddNumberToObject(x, "ep", c->ep > 1 ? c->ep : 1); /* experts split: the layout said on a resume that differs */
    cJSON_AddStringToObject(x, "strategy", strategy);
    cJSON_AddNumberToObject(x, "grad_clip", c->grad_clip);
    cJSON_AddNumberToObject(x, "seed", (double)c->seed);
    cJSON_AddStringToObject(x, "precision", dt_precision_name(c->precision));
    cJSON_AddStringToObject(x, "grad_store", dt_precision_name(c->grad_store));
    cJSON_AddStringToObject(x, "grad_comm", dt_precision_name(c->grad_comm));
    cJSON_AddNumberToObject(x, "threads", c->threads); /* BLAS's sums depend on it: the same count resumes bit for bit */
    cJSON_AddNumberToObject(x, "eval_every", c->eval_every);
    cJSON_AddNumberToObject(x, "keep_last", c->keep_last > 0 ? c->keep_last : 1);
    cJSON_AddNumberToObject(x, "eval_batches", c->eval_batches);
    cJSON_AddBoolToObject(x, "recompute", c->recompute);
    cJSON_AddNumberToObject(x, "attention", c->attention);
    cJSON_AddBoolToObject(x, "skip_nonfinite", c->skip_nonfinite);
    char where[PATH_MAX];
    if (c->val_data) cJSON_AddStringToObject(x, "val_data", realpath(c->val_data, where) ? where : c->val_data);
    /* fine-tuning data's: how its rows were made, and DPO's beta */
    if (c->tokenizer) cJSON_AddStringToObject(x, "tokenizer", realpath(c->tokenizer, where) ? where : c->tokenizer);
    if (c->chat_template) cJSON_AddStringToObject(x, "chat_template", c->chat_template);
    if (c->pack) cJSON_AddBoolToObject(x, "pack", 1);
    dpo_settings(x, &c->dpo);
    if (c->moe_z_loss > 0) cJSON_AddNumberToObject(x, "moe_z_loss", c->moe_z_loss);
    if (c->moe_seq_aux_loss > 0) cJSON_AddNumberToObject(x, "moe_seq_aux_loss", c->moe_seq_aux_loss);
    if (c->moe_global_aux_loss > 0) cJSON_AddNumberToObject(x, "moe_global_aux_loss", c->moe_global_aux_loss);
    codec_settings(x, &c->codec);
}

/* Where the run stands: the loss scaler's whole state (a resumed fp16 run scales, skips and grows as the uninterrupted
 * one), the data's place and the shuffle's. */
static void position_sections(cJSON *j, const dt_train_config *c, const dt_loss_scale *ls, const dt_checkpoint_position *pos) {
    cJSON *x;
    if (ls) {
        x = cJSON_AddObjectToObject(j, "loss_scaler");
        cJSON_AddNumberToObject(x, "scale", ls->scale);
        cJSON_AddNumberToObject(x, "iter", (double)ls->iter);
        cJSON_AddNumberToObject(x, "last_overflow", (double)ls->last_overflow);
        cJSON_AddNumberToObject(x, "hysteresis", ls->hysteresis);
    }
    char where[PATH_MAX];
    x = cJSON_AddObjectToObject(j, "data");
    cJSON_AddStringToObject(x, "path", !c->data ? "" : realpath(c->data, where) ? where : c->data);
    cJSON_AddNumberToObject(x, "tokens", (double)pos->data_tokens);
    cJSON_AddNumberToObject(x, "tokens_per_batch", (double)pos->tokens_per_batch);
    cJSON_AddNumberToObject(x, "epoch", (double)pos->epoch);
    cJSON_AddNumberToObject(x, "next_batch", (double)pos->next);
    x = cJSON_AddObjectToObject(j, "rng");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->shuffle_seed); /* 64 bits: not a JSON double */
    cJSON_AddStringToObject(x, "shuffle_seed", seed);
    cJSON_AddBoolToObject(x, "shuffle_rows", c->shuffle_rows);
    cJSON_AddNumberToObject(x, "shuffle_epoch", (double)pos->epoch);
}

/* params.f32, optim.f32 and buffers.f32 (where the model has buffers): each one's bytes and hash, or its pieces' (the
 * optimizer's in a sharded save, the parameters' too where they were saved in slices). */
static void files_section(cJSON *j, const dt_ckpt_manifest_in *in) {
    static const char *const files[3] = { "params.f32", "optim.f32", "buffers.f32" };
    cJSON *x = cJSON_AddObjectToObject(j, "files");
    for (int i = 0; i < (in->cm->nbuffers ? 3 : 2); i++) {
        cJSON *f = cJSON_AddObjectToObject(x, files[i]);
        char h[24];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)in->hashes[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)in->bytes[i]);
        if ((i == 0 && !in->params_pieces) || i == 2 || in->npieces == 0) {
            cJSON_AddStringToObject(f, "fnv1a64", h);
            continue;
        }
        cJSON *ps = cJSON_AddArrayToObject(f, "pieces");
        for (int k = 0; k < in->npieces; k++) {
            const dt_ckpt_piece *pc = &in->pieces[k];
            cJSON *e = cJSON_CreateObject();
            snprintf(h, sizeof h, "%016llx", (unsigned long long)(i == 0 ? pc->phash : pc->hash));
            cJSON_AddNumberToObject(e, "offset", (double)pc->off);
            cJSON_AddNumberToObject(e, "count", (double)pc->count);
            cJSON_AddStringToObject(e, "fnv1a64", h);
            cJSON_AddItemToArray(ps, e);
        }
    }
}

cJSON *dt_ckpt_manifest(const dt_ckpt_manifest_in *in) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", FORMAT);
    cJSON_AddNumberToObject(j, "version", VERSION);
    cJSON_AddNumberToObject(j, "step", in->pos->step);
    model_section(j, in->cm);
    optimizer_section(j, in->c, in->o);
    schedule_section(j, in->c);
    settings_section(j, in->c, in->nranks, in->strategy);
    position_sections(j, in->c, in->ls, in->pos);
    files_section(j, in);
    dt_ckpt_codec_manifest(j, in->cm, in->side->codec, in->side->ncodec, in->c);
    dt_ckpt_units_manifest(j, in->side->units, in->side->nunits);
    dt_ckpt_table_manifest(j, in->side->tensors, in->side->ntensors);
    return j;
}
