/* What a GPT-2 run checks before any work: settings that would do nothing
 * or contradict each other, every rank agreeing on the job's shape, and the
 * threads a rank takes when --threads is not given. */
#include "run_checks.h"
#include "dtrain/io.h"
#include "dtrain/obs.h"
#include "dtrain/pipeline.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Settings that would do nothing, or contradict each other: said before any work. */
/* --grad-store: the type the model computes in, a data-parallel reduction to keep it for (else said and f32), SGD or
 * AdamW. */
static dt_status check_grad_store(dt_train_config *c, int nranks) {
    if (c->grad_store == DT_F32) return DT_OK;
    const char *gs = dt_precision_name(c->grad_store);
    if (c->grad_store != c->precision)
        return dt_error(DT_ERR_ARG, "--grad-store %s needs --precision %s: the gradients are kept in the type the model computes in "
                        "(--precision is %s)", gs, gs, dt_precision_name(c->precision));
    if (c->grad_comm != DT_F32 && c->grad_comm != c->grad_store)
        return dt_error(DT_ERR_ARG, "--grad-comm %s with --grad-store %s: gradients kept in %s travel in %s", dt_precision_name(c->grad_comm),
                        gs, gs, gs);
    int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1;
    if (nranks == 1) {
        /* as --grad-comm: a setting of the reductions, so one process (a benchmark's baseline, say) runs without it */
        if (!c->quiet) dt_log(DT_LOG_WARN, "--grad-store %s does nothing on one rank: one process keeps f32 gradients (it has no reduction)", gs);
        c->grad_store = DT_F32;
    } else if (nranks == tp * pp && c->dp <= 1) {
        /* the store is the data-parallel reduction's: a model split over every rank has none */
        if (!c->quiet)
            dt_log(DT_LOG_WARN, "--grad-store %s does nothing without data parallelism (--tp %d x --pp %d is every rank): the gradients stay f32",
                   gs, tp, pp);
        c->grad_store = DT_F32;
    } else if (c->grad_accum > 1 && !c->quiet) {
        /* ddp.c keeps the f32 store's pages through such steps (giving them back cost a fault each a step) */
        dt_log(DT_LOG_WARN, "--grad-store %s with %d micro-batches a step: they add up in the whole f32 store, which the step keeps; "
               "the 16-bit store lowers no peak here and holds 2 bytes a parameter more (it saves memory with one micro-batch a step)",
               gs, c->grad_accum);
    }
    if (c->opt.kind != DT_OPT_SGD && c->opt.kind != DT_OPT_ADAMW)
        return dt_error(DT_ERR_ARG, "--grad-store %s takes --optimizer sgd or adamw: %s's trust ratios need whole f32 tensors", gs,
                        dt_optim_kind_name(c->opt.kind));
    return DT_OK;
}

/* --compress: data parallelism's (and ZeRO's) f32 gradients of whole tensors only (a pipeline stage's are: each stage's
 * data-parallel group compresses its own); its seed from the run's. */
static dt_status check_codec(dt_train_config *c, int nranks) {
    if (c->codec.kind == DT_CODEC_NONE) return DT_OK;
    const char *k = dt_codec_name(c->codec.kind);
    const char *other = c->tp > 1 ? "--tp" : c->cp > 1 ? "--cp" : c->ep > 1 ? "--ep" : c->grad_comm != DT_F32 ? "--grad-comm"
                      : c->grad_store != DT_F32 ? "--grad-store" : NULL;
    if (other)
        return dt_error(DT_ERR_ARG, "--compress %s with %s: a codec compresses data parallelism's (and ZeRO's) whole-model f32 gradients "
                        "in this build (no split or 16-bit gradients)", k, other);
    if (nranks == 1 && !c->quiet) dt_log(DT_LOG_WARN, "--compress %s does nothing on one rank (nothing is sent)", k);
    if (!c->codec.seed) c->codec.seed = c->seed ^ 0x5eedc0dec0dec0deull;
    return DT_OK;
}

/* The activation wires and the gradients' wire: said where they do nothing, refused where they cannot apply. */
static dt_status check_wires(const dt_train_config *c, int nranks) {
    if (c->cp_wire != DT_PP_WIRE_F32 && c->cp <= 1 && !c->quiet)
        dt_log(DT_LOG_WARN, "--cp-wire %s does nothing without context parallelism (--cp)", dt_pp_wire_name(c->cp_wire));
    if (c->pp_wire != DT_PP_WIRE_F32 && c->pp <= 1 && !c->quiet)
        dt_log(DT_LOG_WARN, "--pp-wire %s does nothing without pipeline stages (--pp)", dt_pp_wire_name(c->pp_wire));
    if (c->grad_comm != DT_F32 && nranks == 1 && !c->quiet)
        dt_log(DT_LOG_WARN, "--grad-comm %s does nothing on one rank", dt_dtype_name(c->grad_comm));
    return DT_OK;
}

/* A file the run writes from its start (the metrics, truncated then; the trace) that is one it reads: refused, as
 * writing it would destroy the input before or while it is read. */
static dt_status check_outputs(const dt_train_config *c) {
    const char *out[2][2] = { { "--metrics", c->metrics }, { "--trace", c->trace } };
    const char *in[5][2] = { { "--data", c->data }, { "--val-data", c->val_data }, { "--grpo", c->grpo.prompts },
                             { "--tokenizer", c->tokenizer }, { "--model", c->model } };
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++)
            if (dt_file_same(out[i][1], in[j][1]))
                return dt_error(DT_ERR_ARG, "%s %s is the file %s %s names: writing it would destroy what the run reads (name another "
                                "file)", out[i][0], out[i][1], in[j][0], in[j][1]);
    return DT_OK;
}

dt_status dt_train_check_settings(dt_train_config *c, int nranks) {
    if (c->grpo.prompts) {
        dt_status st = dt_train_check_grpo(c);
        if (st) return st;
    } else if (c->grpo.nrewards || c->grpo.tools) {
        return dt_error(DT_ERR_ARG, "%s %s %s GRPO's completions: give the prompts with --grpo FILE", c->grpo.nrewards ? "--reward" : "--grpo-tools",
                        c->grpo.nrewards ? c->grpo.reward[0] : c->grpo.tools, c->grpo.nrewards ? "scores" : "runs the tools of");
    }
    if (c->sync_bn) return dt_error(DT_ERR_ARG, "--sync-bn: GPT-2 has no BatchNorm (the ResNets have: --model resnet:small, resnet18, ...)");
    if (c->steps == 0) { /* an evaluation: the validation loss of the model (a preset, file or checkpoint) */
        if (!c->val_data && !c->data) return dt_error(DT_ERR_ARG, "--steps 0 evaluates: give the tokens to evaluate on (--val-data FILE)");
        if (!c->val_data) c->val_data = c->data;
        if (!c->data) c->data = c->val_data;
        if (c->save || c->resume)
            return dt_error(DT_ERR_ARG, "--steps 0 evaluates and changes nothing: %s has nothing to do (a checkpoint is evaluated "
                            "with --model DIR)", c->save ? "--save" : "--resume");
    }
    if (c->epochs) return dt_error(DT_ERR_ARG, "--epochs %d: GPT-2 trains for --steps N (each step reads the next batch of the token file, "
                                   "wrapping around at its end); epochs are the image models'", c->epochs);
    if (c->stop_after && !c->save)
        return dt_error(DT_ERR_ARG, "--stop-after %d without --save: nothing would be kept to --resume from (give --save DIR)",
                        c->stop_after);
    if (c->synthetic) return dt_error(DT_ERR_ARG, "--synthetic: image models only (GPT-2's synthetic throughput: dtrain bench train)");
    if (c->init) return dt_error(DT_ERR_ARG, "--init %s: a ResNet's starting weights (GPT-2 starts from a file with --model FILE)", c->init);
    if (c->save_every && !c->save && !c->quiet) dt_log(DT_LOG_WARN, "--save-every %d does nothing without --save FILE", c->save_every);
    if (c->eval_every && !c->val_data) dt_log(DT_LOG_WARN, "--eval-every %d does nothing without --val-data FILE", c->eval_every);
    bool ours = c->sched.kind <= DT_SCHED_COSINE || c->sched.kind >= DT_SCHED_LINEAR; /* DeepSpeed's count their own */
    if (c->steps > 0 && !c->quiet && c->sched.warmup >= c->steps && ours)
        dt_log(DT_LOG_WARN, "--warmup %d is not shorter than the %d steps: the learning rate never reaches --lr", c->sched.warmup,
               c->steps);
    int total = c->sched.total > 0 ? c->sched.total : c->steps, decay = c->sched.decay > 0 ? c->sched.decay : total / 10;
    if (c->sched.kind == DT_SCHED_WSD && c->steps > 0 && c->sched.warmup + decay > total)
        return dt_error(DT_ERR_ARG, "--schedule wsd: --warmup %d and %d decay steps (--decay-steps) do not fit in the %d steps",
                        c->sched.warmup, decay, total);
    dt_status st = check_outputs(c);
    if (!st) st = check_grad_store(c, nranks);
    if (!st) st = check_codec(c, nranks);
    if (!st) st = check_wires(c, nranks);
    if (st) return st;
    /* skipping a step needs the norm before any update, so the update waits for the end of backward */
    if (c->skip_nonfinite) c->step_at_end = 1;
    if (c->save) return dt_checkpoint_is_dir(c->save) ? dt_checkpoint_check_dir(c->save, c->resume, c->overwrite) : dt_file_check_writable(c->save);
    return DT_OK;
}

void dt_train_shape_model(dt_train_shape *s, const dt_gpt2_config *given) {
    dt_lm_config c = dt_lm_config_resolve(given);
    int family = dt_family_index(c.family);
    const int32_t w[11] = { c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers, c.num_heads, c.channels,
                            family, c.kv_heads, c.head_dim, c.ffn, c.untied };
    const float f[5] = { c.norm_eps, c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor };
    const int32_t moe[10] = { c.experts, c.experts_top_k, c.norm_topk, c.shared_ffn, c.router, c.expert_groups, c.group_top_k,
                              c.moe_every, c.first_dense, c.dense_ffn };
    memcpy(s->model, w, sizeof w);
    memcpy(s->model + 11, f, sizeof f);
    memcpy(s->model + 16, moe, sizeof moe);
}

dt_status dt_train_check_same(dt_comm *w, const dt_train_shape *mine) {
    int p = dt_comm_size(w);
    dt_train_shape *all = malloc(sizeof *all * (size_t)p);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory");
    _Static_assert(sizeof(dt_train_shape) % 4 == 0, "dt_train_shape travels as int32 words");
    dt_status st = dt_comm_allgather(w, mine, all, sizeof *mine / 4, DT_I32);
    for (int r = 1; !st && r < p; r++) {
        const dt_train_shape *a = &all[0], *b = &all[r];
        if (memcmp(a->model, b->model, sizeof a->model))
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 has a model with %d layers, %d channels, vocab %d; rank %d has %d layers, "
                          "%d channels, vocab %d (or another family, K/V heads or widths)", a->model[3], a->model[5], a->model[1], r,
                          b->model[3], b->model[5], b->model[1]);
        else if (a->batch != b->batch || a->seq != b->seq || a->grad_accum != b->grad_accum)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 has batch %d x %d x %d, rank %d has %d x %d x %d", a->batch, a->seq,
                          a->grad_accum, r, b->batch, b->seq, b->grad_accum);
        else if (a->train_tokens != b->train_tokens || a->val_tokens != b->val_tokens)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 reads %lld training tokens, rank %d reads %lld (different data files?)",
                          (long long)a->train_tokens, r, (long long)b->train_tokens);
        else if (a->precision != b->precision)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 trains in %s, rank %d in %s (--precision)", dt_dtype_name(a->precision), r,
                          dt_dtype_name(b->precision));
        else if (strncmp(a->strategy, b->strategy, sizeof a->strategy))
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 runs strategy %.15s, rank %d runs %.15s (--zero / --strategy)", a->strategy, r,
                          b->strategy);
        else if (memcmp(a->mesh, b->mesh, sizeof a->mesh))
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 lays the job out as dp %d x tp %d x pp %d x cp %d, rank %d as %d x %d x %d x %d",
                          a->mesh[0], a->mesh[1], a->mesh[2], a->mesh[3], r, b->mesh[0], b->mesh[1], b->mesh[2], b->mesh[3]);
        else if (a->mesh[2] > 1 && a->pp_schedule != b->pp_schedule)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 runs the %s pipeline schedule, rank %d %s (--pp-schedule)",
                          dt_pp_kind_name(a->pp_schedule), r, dt_pp_kind_name(b->pp_schedule));
        else if (a->mesh[2] > 1 && a->pp_wire != b->pp_wire)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0's stages exchange %s, rank %d's %s (--pp-wire)", dt_pp_wire_name(a->pp_wire), r,
                          dt_pp_wire_name(b->pp_wire));
        else if (a->mesh[3] > 1 && a->cp_wire != b->cp_wire)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0's attention sends %s, rank %d's %s (--cp-wire)", dt_pp_wire_name(a->cp_wire), r,
                          dt_pp_wire_name(b->cp_wire));
        else if (a->steps != b->steps || a->optimizer != b->optimizer || a->lr != b->lr || a->eval_every != b->eval_every)
            st = dt_error(DT_ERR_ARG, "ranks differ in steps, optimizer, learning rate or evaluation (rank 0 vs rank %d)", r);
    }
    free(all);
    return st;
}
