/* The layouts dtrain runs: which mesh a job's ranks make and which
 * combinations each axis takes yet. train refuses by these rules before any
 * rank starts, and plan (the same flags) gives the same messages. */
#include "dtrain/train.h"
#include "dtrain/context.h"
#include "dtrain/pipeline.h"
#include "dtrain/io.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dt_train_is_image_model(const char *model) {
    /* the image models' specs: mlp, mlp:H1,H2,..., resnet:small, resnet18/34/50 (classify.c parses them) */
    return !strncmp(model, "mlp", 3) || !strncmp(model, "resnet", 6);
}

/* What tensor parallelism does not run with yet, or NULL. */
static const char *tp_lacks(const dt_train_config *c) {
    if (dt_train_is_image_model(c->model)) return "an image model (GPT-2 only: --model d6, 124M, ...)";
    if (c->opt.kind == DT_OPT_LAMB || c->opt.kind == DT_OPT_LARS) return "LAMB/LARS (trust ratios of whole tensors)";
    return NULL;
}

/* The second-order preconditioner the run asks for (the engine's), or NULL. */
static const char *preconditioner(const dt_train_config *c) {
    return c->kfac_on ? "K-FAC" : c->shampoo_on ? "Shampoo" : c->opt.kind == DT_OPT_SOAP ? "SOAP" : NULL;
}

/* What context parallelism does not run with yet, or NULL. */
static const char *cp_lacks(const dt_train_config *c) {
    if (dt_train_is_image_model(c->model)) return "an image model (GPT-2 only: --model d6, 124M, ...)";
    if (c->attention == DT_ATTN_FULL) return "--attention full (context parallelism merges blocks by their log-sum-exp)";
    return NULL;
}

/* Chunks per pipeline stage: --virtual-stages, 2 by default for the interleaved schedule, else 1. */
int dt_train_pp_virt(const dt_train_config *c) {
    return c->virtual_stages ? c->virtual_stages : c->pp_schedule == DT_PP_INTERLEAVED ? 2 : 1;
}

/* What pipeline parallelism does not take yet (NULL: none of it). */
static const char *pp_lacks(const dt_train_config *c) {
    if (dt_train_is_image_model(c->model)) return "an image model (GPT-2 only: --model d6, 124M, ...)";
    if (c->opt.kind == DT_OPT_LAMB || c->opt.kind == DT_OPT_LARS) return "LAMB/LARS";
    return NULL;
}

int dt_train_dp(const dt_train_config *c, int nranks) {
    int mp = (c->tp ? c->tp : 1) * (c->pp ? c->pp : 1) * (c->cp ? c->cp : 1);
    return c->dp ? c->dp : nranks / mp > 0 ? nranks / mp : 1;
}

/* The expert- and context-parallel axes' rules. */
static dt_status check_ep_cp(const dt_train_config *c, int dp, int tp, int cp, int paper) {
    int ep = c->ep ? c->ep : 1;
    if (ep > 1 && dp % ep)
        return dt_error(DT_ERR_ARG, "--ep %d does not divide the %d data-parallel ranks (its groups are consecutive data-parallel ranks)", ep, dp);
    if (ep > 1 && !paper && (cp > 1 || dt_train_is_image_model(c->model)))
        return dt_error(DT_ERR_UNSUPPORTED, "--ep %d: not with %s yet (experts spread over data-parallel ranks, with or without --pp and --tp)",
                        ep, dt_train_is_image_model(c->model) ? "an image model" : "--cp");
    if (cp > 1 && !paper && cp_lacks(c)) return dt_error(DT_ERR_UNSUPPORTED, "--cp %d: not with %s yet", cp, cp_lacks(c));
    if (cp > 1 && c->seq % (2 * cp))
        return dt_error(DT_ERR_ARG, "--cp %d: --seq %d does not split into %d chunks (2 x --cp: rank r holds chunks r and %d-r)", cp, c->seq,
                        2 * cp, 2 * cp - 1);
    if (cp > 1 && c->sp && c->seq / cp % tp)
        return dt_error(DT_ERR_ARG, "--sp with --cp %d: a rank's %d positions do not split into --tp %d parts", cp, c->seq / cp, tp);
    if (cp > 1 && c->cp_impl == DT_CP_ULYSSES && c->shape.num_heads && c->shape.num_heads % (tp * cp))
        return dt_error(DT_ERR_ARG, "--cp-impl ulysses: --tp %d x --cp %d = %d does not divide the %d attention heads (--heads)", tp, cp,
                        tp * cp, c->shape.num_heads);
    return DT_OK;
}

/* The pipeline's and tensor parallelism's rules, and what takes the strategy's gradients (a preconditioner, a codec). */
static dt_status check_pp_tp(const dt_train_config *c, int tp, int pp, int paper) {
    if (pp > 1 && !paper && pp_lacks(c)) return dt_error(DT_ERR_UNSUPPORTED, "--pp %d: not with %s yet", pp, pp_lacks(c));
    if (c->virtual_stages > 1 && (pp < 2 || c->pp_schedule != DT_PP_INTERLEAVED))
        return dt_error(DT_ERR_ARG, "--virtual-stages %d: chunks per stage are the interleaved schedule's (--pp N --pp-schedule interleaved)",
                        c->virtual_stages);
    if (pp > 1 && c->pp_schedule == DT_PP_INTERLEAVED && (dt_train_pp_virt(c) < 2 || c->grad_accum % pp))
        return dt_error(DT_ERR_ARG, "--pp-schedule interleaved: %s", dt_train_pp_virt(c) < 2 ? "--virtual-stages must be at least 2"
                        : "--grad-accum (micro-batches a step) must be a multiple of --pp (p micro-batches go through each chunk in turn)");
    if (tp > 1 && !paper && tp_lacks(c)) return dt_error(DT_ERR_UNSUPPORTED, "--tp %d: not with %s yet", tp, tp_lacks(c));
    /* a preconditioner takes whole averaged gradients: ZeRO-1 allreduces them as DDP does, 2 and 3 keep a shard */
    if (preconditioner(c) && !paper && c->strategy && (!strcmp(c->strategy, "zero2") || !strcmp(c->strategy, "zero3")))
        return dt_error(DT_ERR_UNSUPPORTED, "--strategy %s: not with K-FAC, Shampoo or SOAP yet (they precondition whole gradients; %s "
                        "keeps a shard of them)", c->strategy, c->strategy);
    if (preconditioner(c) && !paper && c->codec.kind >= DT_CODEC_DGC)
        return dt_error(DT_ERR_UNSUPPORTED, "%s preconditions whole f32 gradients on every rank: not with --compress dgc, onebit or "
                        "zeroone (they take the optimizer's momentum)", preconditioner(c));
    /* a codec's optimizer and strategy, as the engine checks them (so that plan refuses what train would) */
    dt_status cs = !paper && c->codec.kind != DT_CODEC_NONE ? dt_codec_check_optimizer(&c->codec, c->opt.kind, c->grad_clip, c->precision == DT_F16)
                                                            : DT_OK;
    if (!cs && !paper) cs = dt_codec_check_strategy(&c->codec, c->strategy);
    if (cs) return cs;
    if (c->sp && tp < 2) return dt_error(DT_ERR_ARG, "--sp splits the sequence over the tensor-parallel ranks: give --tp N (N >= 2)");
    if (tp > 1 && c->sp && c->seq % tp)
        return dt_error(DT_ERR_ARG, "--sp: --seq %d does not split into --tp %d parts", c->seq, tp);
    if (tp > 1 && c->shape.num_heads && c->shape.num_heads % tp)
        return dt_error(DT_ERR_ARG, "--tp %d does not divide the %d attention heads (--heads)", tp, c->shape.num_heads);
    return DT_OK;
}

/* --dp x --tp x --pp x --cp must be the job's ranks. */
dt_status dt_train_check_mesh(const dt_train_config *c, int nranks, int paper) {
    int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, cp = c->cp ? c->cp : 1, mp = tp * pp * cp;
    int dp = c->dp ? c->dp : (nranks % mp ? 0 : nranks / mp);
    char axes[64]; /* the model's axes as given (--cp only when used) */
    snprintf(axes, sizeof axes, "--tp %d x --pp %d%s", tp, pp, cp > 1 ? " x --cp " : "");
    if (cp > 1) snprintf(axes + strlen(axes), sizeof axes - strlen(axes), "%d", cp);
    if (!c->dp && !dp)
        return dt_error(DT_ERR_ARG, "%s = %d does not divide the job's %d rank%s", axes, mp, nranks, nranks == 1 ? "" : "s");
    if ((long)dp * mp != nranks)
        return dt_error(DT_ERR_ARG, "--dp %d x %s = %ld, but the job has %d rank%s", dp, axes, (long)dp * mp, nranks, nranks == 1 ? "" : "s");
    /* DeepSpeed's global batch counts the data-parallel replicas: the model's axes share one batch */
    if (c->train_batch_size && c->train_batch_size != (long)c->batch * c->grad_accum * dp)
        return dt_error(DT_ERR_ARG, "train_batch_size %d must equal micro-batch %d x gradient accumulation %d x %d data-parallel "
                        "ranks = %ld", c->train_batch_size, c->batch, c->grad_accum, dp, (long)c->batch * c->grad_accum * dp);
    dt_status st = check_ep_cp(c, dp, tp, cp, paper);
    return st ? st : check_pp_tp(c, tp, pp, paper);
}


dt_cp_impl dt_train_cp_impl(const dt_train_config *c, const dt_gpt2_config *cfg, int tp, int cp) {
    if (c->cp_impl >= 0) return (dt_cp_impl)c->cp_impl;
    /* a CPU rank's order of magnitude: attention at ~20 GFLOP/s a thread, ~10 GB/s between ranks (shared memory) and to memory */
    return dt_cp_choose(cp, cfg->num_heads / (tp > 0 ? tp : 1), c->seq / (cp > 0 ? cp : 1), 20e9 * (c->threads > 0 ? c->threads : 1), 10e9, 10e9);
}

dt_status dt_train_check_model(const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d) {
    if (c->seq > cfg->max_seq_len) return dt_error(DT_ERR_ARG, "--seq %d is longer than the model's %d positions", c->seq, cfg->max_seq_len);
    int v = dt_train_pp_virt(c);
    if (d->pp > 1 && v > 1 && d->pp * v > cfg->num_layers + 2)
        return dt_error(DT_ERR_ARG, "--pp %d x --virtual-stages %d = %d chunks: more than the model's %d units (the embedding, %d blocks, "
                        "the head)", d->pp, v, d->pp * v, cfg->num_layers + 2, cfg->num_layers);
    if (d->pp > cfg->num_layers + 2)
        return dt_error(DT_ERR_ARG, "--pp %d: more stages than the model's %d units (the embedding, %d blocks, the head)", d->pp,
                        cfg->num_layers + 2, cfg->num_layers);
    if (d->tp > 1 && cfg->num_heads % d->tp)
        return dt_error(DT_ERR_ARG, "--tp %d does not divide the %d attention heads (--heads)", d->tp, cfg->num_heads);
    if (d->ep > 1 && !cfg->experts)
        return dt_error(DT_ERR_ARG, "--ep %d spreads a mixture's experts over ranks: the model has none (--experts E)", d->ep);
    if (d->ep > 1 && cfg->experts % d->ep)
        return dt_error(DT_ERR_ARG, "--ep %d does not divide the model's %d experts (each rank holds the same number)", d->ep, cfg->experts);
    /* a weights file that cannot hold the family: said before the run, not when its first save comes */
    dt_status st = !c->save || dt_checkpoint_is_dir(c->save) ? DT_OK
                   : dt_safetensors_path(c->save) ? dt_safetensors_check_family(c->save, cfg) : dt_llmc_check_family(c->save, cfg);
    if (st) return dt_error(st, "--save %s", dt_last_error());
    int dp = d->dp * d->cp; /* the replicas the optimizer's steps are shared by (context parallelism's ranks are ones) */
    if (c->opt.kind == DT_OPT_SOAP && c->opt.soap_group > 1 && dp % c->opt.soap_group)
        return dt_error(DT_ERR_ARG, "SOAP: --soap-group %d does not divide the %d data-parallel ranks", c->opt.soap_group, dp);
    int heads = cfg->num_heads / d->tp;
    if (d->cp > 1 && dt_train_cp_impl(c, cfg, d->tp, d->cp) == DT_CP_ULYSSES && (heads % d->cp || cfg->channels / d->tp % d->cp))
        return dt_error(DT_ERR_ARG, "--cp-impl ulysses: a rank's %d attention heads (of %d, over --tp %d) do not split over --cp %d", heads,
                        cfg->num_heads, d->tp, d->cp);
    return DT_OK;
}

dt_status dt_train_check_preset(const dt_train_config *c, int nranks) {
    dt_gpt2_config cfg;
    if (dt_train_is_image_model(c->model) || access(c->model, F_OK) == 0 || dt_gpt2_preset(c->model, &cfg))
        return DT_OK; /* an image model, a file (the ranks read its shape), or no preset (the ranks say so) */
    const dt_gpt2_config *o = &c->shape;
    int *f[6] = { &cfg.max_seq_len, &cfg.vocab_size, &cfg.padded_vocab_size, &cfg.num_layers, &cfg.num_heads, &cfg.channels };
    const int v[6] = { o->max_seq_len, o->vocab_size, o->padded_vocab_size, o->num_layers, o->num_heads, o->channels };
    for (int i = 0; i < 6; i++)
        if (v[i]) *f[i] = v[i];
    if (dt_train_take_experts(c, false, &cfg)) return DT_OK; /* the ranks say what is wrong with them */
    int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, cp = c->cp ? c->cp : 1;
    dt_train_dims d = { .dp = dt_train_dp(c, nranks), .tp = tp, .pp = pp, .cp = cp, .ep = c->ep, .local_ranks = nranks };
    return dt_train_check_model(c, &cfg, &d);
}

void dt_train_plan_job(const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d, dt_plan_job *job) {
    *job = (dt_plan_job){ .model = *cfg, .batch = c->batch, .seq = c->seq, .recompute = c->recompute, .attention = c->attention,
                          .cp = d->cp, .cp_ulysses = d->cp > 1 && dt_train_cp_impl(c, cfg, d->tp, d->cp) == DT_CP_ULYSSES,
                          .opt = c->opt, .dp = d->dp * d->cp, .ep = d->ep, .tp = d->tp, .sp = c->sp, .pp = d->pp, .micro = c->grad_accum,
                          .gpipe = c->pp_schedule == DT_PP_GPIPE, .zb = c->pp_schedule == DT_PP_ZB1,
                          .virt = c->pp_schedule == DT_PP_INTERLEAVED ? dt_train_pp_virt(c) : 1, .pp_wire = c->pp_wire,
                          .cp_wire = c->cp_wire, .local_ranks = d->local_ranks,
                          .stage = c->strategy && !strncmp(c->strategy, "zero", 4) ? c->strategy[4] - '0' : 0,
                          /* (with experts spread over ranks ZeRO keeps a copy per rank: zero.c) */
                          .bucket_bytes = (size_t)(c->bucket_mb * 1048576.0), .shared_params = d->shared_params && d->ep <= 1,
                          .precision = c->precision,
                          .grad_store = c->grad_store, .grad_comm = c->grad_comm, .lora = c->lora, .codec = c->codec, .steps = c->steps,
                          .grad_clip = c->grad_clip, .skip_nonfinite = c->skip_nonfinite, .step_at_end = c->step_at_end,
                          .kfac_on = c->kfac_on, .kfac = c->kfac, .shampoo_on = c->shampoo_on, .shampoo = c->shampoo };
    if (job->lora.rank && !job->lora.alpha) job->lora.alpha = 8;
    if (job->lora.dropout < 0) job->lora.dropout = 0; /* not given */
    if (job->lora.rank && !job->lora.targets) job->lora.targets = dt_family_lora_targets(dt_lm_config_resolve(cfg).family);
    struct stat sb;
    if (c->data && stat(c->data, &sb) == 0) job->data_bytes += (size_t)sb.st_size;
    if (c->val_data && stat(c->val_data, &sb) == 0) job->data_bytes += (size_t)sb.st_size;
}
