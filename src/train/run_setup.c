/* Building a GPT-2 run: the mesh, the model (a preset or a file, whole or
 * this rank's part), the data, the engine (and a resumed run's place), the
 * metrics file, the watchdog, the peak for MFU, and what rank 0 says before
 * the first step. */
#include "run.h"
#include "run_checks.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An axis's size (1 on one process). */
static int mesh_size(const run *r, dt_mesh_dim a) { return r->mesh ? dt_mesh_size(r->mesh, a) : 1; }

/* The job's memory before it is allocated: refused, with the stages that
 * would fit, when this machine's ranks would not fit in it. */
static dt_status check_memory(run *r, const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d) {
    /* on a GPU the host holds no activations; the GPU's memory is taken whole when the model is made there, before the
     * first step, and a shortfall is refused then, naming what was asked and what is free */
    if (c->cuda) return DT_OK;
    dt_plan_job job;
    dt_train_plan_job(c, cfg, d, &job);
    job.process_bytes = dt_resident_memory();
    dt_status st = dt_plan_check_memory(&job, 3);
    r->refused_alike = st != DT_OK;
    return st;
}

/* A new model's weights: each rank draws a piece of the same stream (the
 * values do not depend on who draws them) and broadcasts it, so N ranks
 * start N times sooner than each drawing the whole model. */
static dt_status init_weights(const run *r, dt_gpt2 *m) {
    /* among the data-parallel ranks, which hold the same slices (all ranks without tensor parallelism) */
    size_t n = dt_gpt2_num_params(m);
    int p = r->ep ? 1 : r->dp_size, me = r->ep ? 0 : r->dp_rank; /* expert-parallel ranks hold different experts: each draws its own */
    dt_gpt2_init_random_range(m, r->c.seed, n * (size_t)me / (size_t)p, n * (size_t)(me + 1) / (size_t)p);
    for (int q = 0; q < p && p > 1; q++) {
        size_t lo = n * (size_t)q / (size_t)p, hi = n * (size_t)(q + 1) / (size_t)p;
        dt_status st = dt_comm_broadcast(dt_mesh_comm(r->mesh, DT_MESH_DP), dt_gpt2_params(m) + lo, hi - lo, DT_F32, q);
        if (st) return st;
    }
    return DT_OK;
}

/* --lora-rank: adapters on the base (which freezes), drawn from the run's seed; the engine then trains them alone. */
static dt_status add_lora(const dt_train_config *c, dt_gpt2 *m) {
    if (c->lora_from && c->lora.rank)
        return dt_error(DT_ERR_ARG, "--lora %s brings its adapters' rank, alpha and targets: not with --lora-rank (or a LoRA checkpoint's)",
                        c->lora_from);
    if (c->lora_from) {
        dt_status st = dt_peft_load(c->lora_from, dt_gpt2_program(m));
        return st || c->lora.dropout < 0 ? st : dt_program_set_lora_dropout(dt_gpt2_program(m), c->lora.dropout);
    }
    if (!c->lora.rank) return c->lora.dropout > 0 ? dt_error(DT_ERR_ARG, "--lora-dropout drops LoRA adapters' inputs: give --lora-rank R or --lora DIR") : DT_OK;
    dt_lora_config lc = c->lora;
    if (lc.dropout < 0) lc.dropout = 0;
    if (!lc.alpha) lc.alpha = 8;
    if (!lc.targets) lc.targets = dt_family_lora_targets(dt_lm_config_resolve(dt_gpt2_get_config(m)).family);
    dt_status st = dt_program_set_lora(dt_gpt2_program(m), &lc, c->seed ^ 0x4c6f5241ull);
    if (!st) return DT_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", dt_last_error()); /* the message is about to be rewritten */
    return dt_error(st, "--lora-rank %d: %s", c->lora.rank, why);
}

/* What a mixture of experts' run routes: its experts, top-k and weights, router, shared expert and balancing. */
static void print_experts(const dt_gpt2_config *given) {
    dt_lm_config c = dt_lm_config_resolve(given);
    char router[160] = "a softmax router", shared[64] = "", aux[64] = "";
    if (c.router == DT_ROUTER_SIGMOID_BIAS)
        snprintf(router, sizeof router, "DeepSeek-V3's sigmoid router (%d groups, the best %d; weights x %g; its bias moved by %g a step)",
                 c.expert_groups, c.group_top_k, (double)c.routed_scale, (double)c.bias_rate);
    if (c.shared_ffn) snprintf(shared, sizeof shared, ", a shared expert of %d hidden units", c.shared_ffn);
    if (c.aux_coef > 0) snprintf(aux, sizeof aux, ", the balancing loss x %g", (double)c.aux_coef);
    char cap[96] = "dropless";
    if (c.capacity_factor > 0)
        snprintf(cap, sizeof cap, "capacity factor %g, the rest dropped by %s", (double)c.capacity_factor,
                 c.drop_policy == DT_DROP_POSITION ? "position" : "weight");
    char where[128] = "in every layer";
    if (c.dense_ffn)
        snprintf(where, sizeof where, "in %d of the %d layers (every %d after the first %d; the others a dense MLP of %d hidden units)",
                 dt_lm_moe_layers(&c), c.num_layers, c.moe_every, c.first_dense, c.dense_ffn);
    printf("mixture of experts: %d %s experts of %d hidden units %s, top %d a token%s, %s%s%s; %s\n", c.experts,
           dt_family_moe_gated(c.family) ? "SwiGLU" : "GELU", c.ffn, where, c.experts_top_k, c.norm_topk ? " (weights renormalised)" : "",
           router, shared, aux, cap);
}

/* A failure after the weights were read: they are given back. */
static dt_status drop_model(dt_gpt2 **out, dt_status st) {
    dt_gpt2_destroy(*out);
    *out = NULL;
    return st;
}

/* The model's shape: a file's (its weights read into *out) or a preset's, with the shape flags over a preset (for a
 * file they must agree with it), the experts' flags, and a resumed run's family. */
static dt_status model_config(run *r, dt_gpt2 **out, dt_gpt2_config *cfg, bool *from_file) {
    const dt_train_config *c = &r->c;
    dt_status st;
    int ck_step = -1;
    const dt_gpt2_config *o = &c->shape;
    const int v[6] = { o->max_seq_len, o->vocab_size, o->padded_vocab_size, o->num_layers, o->num_heads, o->channels };
    static const char *names[6] = { "--max-seq", "--vocab", "--padded-vocab", "--layers", "--heads", "--channels" };
    *from_file = access(c->model, R_OK) == 0;
    if (*from_file) {
        if ((st = dt_checkpoint_load_weights(c->model, o->num_heads, out, &ck_step))) return st;
        r->model_step = ck_step;
        if (ck_step >= 0 && !c->quiet && r->rank == 0 && c->steps == 0) printf("--model %s: its checkpoint at step %d\n", c->model, ck_step);
        else if (ck_step >= 0 && !c->quiet && r->rank == 0)
            printf("--model %s: the weights of its checkpoint at step %d, with a new optimizer (--resume %s goes on with its run)\n",
                   c->model, ck_step, c->model);
        *cfg = *dt_gpt2_get_config(*out);
    } else if (dt_gpt2_preset(c->model, cfg)) {
        return dt_error(DT_ERR_ARG, "--model %s: %s", c->model,
                        strchr(c->model, '/') || strchr(c->model, '.') ? "no such file (nor a preset: " DT_LM_PRESETS ", mlp, resnet:small, resnet18, resnet34, resnet50)"
                                                                       : "not a preset (" DT_LM_PRESETS ", mlp, resnet:small, resnet18, resnet34, resnet50) nor a file");
    }
    int *f[6] = { &cfg->max_seq_len, &cfg->vocab_size, &cfg->padded_vocab_size, &cfg->num_layers, &cfg->num_heads, &cfg->channels };
    for (int i = 0; i < 6; i++) {
        if (!v[i]) continue;
        if (*from_file && *f[i] != v[i])
            return drop_model(out, dt_error(DT_ERR_ARG, "%s: the file says %d but %s says %d", c->model, *f[i], names[i], v[i]));
        *f[i] = v[i];
    }
    if (!*from_file && o->vocab_size && !o->padded_vocab_size) cfg->padded_vocab_size = (cfg->vocab_size + 63) / 64 * 64;
    if (o->kv_heads) cfg->kv_heads = o->kv_heads;
    if (o->ffn) cfg->ffn = o->ffn;
    if ((st = dt_train_take_experts(c, *from_file, cfg)) || (*from_file && cfg->experts && (st = dt_gpt2_set_routing(*out, cfg))))
        return drop_model(out, st);
    if (!*from_file && o->family) { /* a resumed run's family and the rest of its shape */
        cfg->experts = o->experts, cfg->experts_top_k = o->experts_top_k, cfg->norm_topk = o->norm_topk, cfg->aux_coef = o->aux_coef;
        cfg->shared_ffn = o->shared_ffn, cfg->router = o->router, cfg->expert_groups = o->expert_groups, cfg->group_top_k = o->group_top_k;
        cfg->routed_scale = o->routed_scale, cfg->bias_rate = o->bias_rate, cfg->capacity_factor = o->capacity_factor;
        cfg->drop_policy = o->drop_policy, cfg->moe_every = o->moe_every, cfg->first_dense = o->first_dense, cfg->dense_ffn = o->dense_ffn;
        cfg->family = o->family, cfg->head_dim = o->head_dim, cfg->untied = o->untied;
        cfg->norm_eps = o->norm_eps, cfg->rope_theta = o->rope_theta, cfg->rope_factor = o->rope_factor;
        cfg->rope_low_freq_factor = o->rope_low_freq_factor, cfg->rope_high_freq_factor = o->rope_high_freq_factor;
        cfg->rope_original_max = o->rope_original_max;
    }
    return DT_OK;
}

/* This rank's part of the model on the mesh: its pipeline stage's chunks, its tensor-parallel share, its
 * context-parallel ring or all-to-all, its expert group. */
static dt_status model_part(run *r, const dt_gpt2_config *cfg, dt_model_part *part) {
    const dt_train_config *c = &r->c;
    dt_status st;
    *part = dt_gpt2_whole(cfg);
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_PP) > 1) {
        /* p x v chunks by cost; stage s holds chunks s, s+p, .. (one, but for the interleaved schedule) */
        int pp = dt_mesh_size(r->mesh, DT_MESH_PP), v = dt_train_pp_virt(c);
        if ((st = dt_gpt2_stage_part(cfg, c->seq, pp, v, dt_mesh_coord(r->mesh, DT_MESH_PP), part))) return st;
    }
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_TP) > 1) {
        r->tp_ops = dt_tp_ops_over(dt_mesh_comm(r->mesh, DT_MESH_TP));
        part->tp_rank = dt_mesh_coord(r->mesh, DT_MESH_TP);
        part->tp_size = dt_mesh_size(r->mesh, DT_MESH_TP);
        part->tp = &r->tp_ops;
        part->sp = c->sp;
    }
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_CP) > 1) {
        int n = dt_mesh_size(r->mesh, DT_MESH_CP);
        dt_cp_impl impl = dt_train_cp_impl(c, cfg, part->tp_size, n);
        r->c.cp_impl = (int)impl; /* auto's choice, for what the run prints */
        if ((st = dt_cp_create(dt_mesh_comm(r->mesh, DT_MESH_CP), impl, (dt_pp_wire)c->cp_wire, &r->cp))) return st;
        part->cp_rank = dt_mesh_coord(r->mesh, DT_MESH_CP);
        part->cp_size = n;
        part->cp = dt_cp_model_ops(r->cp);
    }
    if (r->ep) {
        part->ep_rank = dt_comm_rank(r->ep);
        part->ep_size = dt_comm_size(r->ep);
        part->ep = &r->ep_ops;
    }
    /* a mixture's balancing loss or z-loss over a micro-batch held in parts: the stages' layers, the CP ranks' rows */
    int pp = mesh_size(r, DT_MESH_PP), cp = mesh_size(r, DT_MESH_CP), tp = mesh_size(r, DT_MESH_TP);
    if (cfg->experts && (cfg->aux_coef > 0 || c->moe_z_loss > 0 || c->moe_seq_aux_loss > 0) && (pp > 1 || cp > 1)) {
        int color = dt_mesh_coord(r->mesh, DT_MESH_DP) * tp + dt_mesh_coord(r->mesh, DT_MESH_TP);
        if ((st = dt_comm_split(r->w, color, r->rank, &r->moe_sums))) return st;
        r->moe_sums_ops = dt_part_sums_over(r->moe_sums);
        part->sums = &r->moe_sums_ops;
    }
    if (cfg->experts && c->moe_global_aux_loss > 0 && r->nranks > 1) { /* (a TP group's ranks count the same rows) */
        if ((st = dt_comm_split(r->w, dt_mesh_coord(r->mesh, DT_MESH_TP), r->rank, &r->moe_glob))) return st;
        r->moe_glob_ops = dt_part_sums_over(r->moe_glob);
        part->global_sums = &r->moe_glob_ops;
    }
    return DT_OK;
}

static dt_status build_model(run *r, dt_gpt2 **out) {
    const dt_train_config *c = &r->c;
    dt_gpt2_config cfg;
    bool from_file;
    dt_status st = model_config(r, out, &cfg, &from_file);
    if (st) return st;
    /* before the optimizer and the activations (and, for a preset, the model) are allocated */
    dt_train_dims dims = { .dp = r->dp_size, .tp = mesh_size(r, DT_MESH_TP), .pp = mesh_size(r, DT_MESH_PP), .cp = mesh_size(r, DT_MESH_CP), .ep = c->ep,
                           .local_ranks = r->w ? dt_comm_local_size(r->w) : 1,
                           .shared_params = r->mesh && dt_zero_shares_params(dt_mesh_replicas(r->mesh)) };
    dt_model_part part;
    if ((st = dt_train_check_model(c, &cfg, &dims)) || (st = check_memory(r, c, &cfg, &dims)) || (st = model_part(r, &cfg, &part)))
        return drop_model(out, st);
    if (!from_file) {
        if ((st = dt_gpt2_create_part(&cfg, &part, out))) return st;
        r->fresh = true; /* drawn once the ranks have agreed on the job (open_data) */
    } else if (part.tp_size > 1 || part.ua > 0 || part.ub < cfg.num_layers + 2 || part.nchunks > 1 || part.cp_size > 1 || part.ep_size > 1) {
        /* a file holds the whole model: each tensor-parallel rank or pipeline stage keeps its part of it */
        dt_gpt2 *whole = *out;
        if (!(st = dt_gpt2_create_part(&cfg, &part, out))) st = dt_gpt2_copy_slices(whole, *out);
        dt_gpt2_destroy(whole);
        if (st) return st;
    }
    if ((st = dt_program_set_z_loss(dt_gpt2_program(*out), c->moe_z_loss)) ||
        (st = dt_program_set_seq_aux_loss(dt_gpt2_program(*out), c->moe_seq_aux_loss)) ||
        (st = dt_program_set_global_aux_loss(dt_gpt2_program(*out), c->moe_global_aux_loss)))
        return st;
    dt_gpt2_set_recompute(*out, c->recompute);
    dt_gpt2_set_attention(*out, (dt_attn_mode)c->attention);
    st = dt_gpt2_set_precision(*out, c->precision);
    if (!st) st = add_lora(c, *out);
    if (!st && dt_program_lora_config(dt_gpt2_program(*out)) && c->save && !dt_checkpoint_is_dir(c->save))
        st = dt_error(DT_ERR_ARG, "--save %s: a weights file holds a whole model; a LoRA run saves a directory (the adapters' checkpoint "
                      "and PEFT's folder): --save DIR, then dtrain ckpt merge MODEL DIR OUT for the merged model", c->save);
    return st;
}

static dt_status open_data(run *r) {
    const dt_train_config *c = &r->c;
    const dt_gpt2_config *mc = dt_gpt2_get_config(r->m);
    dt_status st = DT_OK;
    if (c->grpo.prompts) goto shape; /* GRPO's rows are its rollouts (dt_train_setup_grpo, once the weights are drawn) */
    if (!c->data) return dt_error(DT_ERR_ARG, "--data FILE is required (a token file: see dtrain tokenize)");
    if (dt_train_is_sft(c->val_data) && !dt_train_is_sft(c->data))
        return dt_error(DT_ERR_ARG, "--val-data %s is chats or completions (.jsonl) but --data %s is not", c->val_data, c->data);
    bool sft = dt_train_is_sft(c->data);
    if (sft && c->val_data && !dt_train_is_sft(c->val_data))
        return dt_error(DT_ERR_ARG, "--data %s is chats or completions (.jsonl) but --val-data %s is not", c->data, c->val_data);
    if (!sft && c->pack) return dt_error(DT_ERR_ARG, "--pack packs the examples of a .jsonl file; --data %s is a token file (its rows are full already)", c->data);
    st = sft ? dt_train_open_sft(r) : dt_tokens_open(c->data, &r->train);
    if (sft) goto shape;
    if (!st) st = dt_tokens_check_vocab(r->train, mc->vocab_size);
    if (!st && r->rank == 0 && mc->vocab_size > 256 && dt_tokens_max(r->train) < 256)
        dt_log(DT_LOG_WARN, "%s: every token is below 256 (byte-level data?) but the model's vocabulary is %d: "
               "--vocab 256 makes a smaller, faster model whose samples print as text", c->data, mc->vocab_size);
    if (!st) st = dt_loader_create(r->train, c->batch, c->seq, r->dp_rank, r->dp_size, c->shuffle_seed, c->shuffle_rows, &r->tl);
    if (!st && c->val_data) {
        st = dt_tokens_open(c->val_data, &r->val);
        if (!st) st = dt_tokens_check_vocab(r->val, mc->vocab_size);
        if (!st) st = dt_loader_create(r->val, c->batch, c->seq, r->dp_rank, r->dp_size, 0, false, &r->vl);
        size_t nb = st ? 0 : dt_loader_batches(r->vl);
        if (!st && nb < (size_t)c->eval_batches) {
            /* more would read the same batches again and weigh them twice */
            if (r->rank == 0 && !c->quiet)
                dt_log(DT_LOG_WARN, "%s holds %zu batch%s of %d x %d tokens per rank: evaluating %zu, not --eval-batches %d", c->val_data,
                       nb, nb == 1 ? "" : "es", c->batch, c->seq, nb, c->eval_batches);
            r->c.eval_batches = (int)nb;
        }
        if (!st && nb == 0)
            st = dt_error(DT_ERR_ARG, "--val-data %s: %zu tokens, fewer than one batch of %d x %d per rank x %d ranks", c->val_data,
                          dt_tokens_count(r->val), c->batch, c->seq, r->dp_size);
    }
shape:
    if (r->w && !st) {
        dt_train_shape js;
        memset(&js, 0, sizeof js);
        dt_train_shape_model(&js, mc);
        js.batch = c->batch; js.seq = c->seq; js.steps = c->steps; js.grad_accum = c->grad_accum;
        js.optimizer = (int32_t)c->opt.kind; js.eval_every = c->eval_every; js.lr = c->sched.lr;
        js.train_tokens = (int64_t)dt_train_data_tokens(r);
        js.val_tokens = r->val ? (int64_t)dt_tokens_count(r->val) : r->sft_val ? (int64_t)dt_sft_rows(r->sft_val) : 0;
        snprintf(js.strategy, sizeof js.strategy, "%s", c->strategy ? c->strategy : "ddp");
        js.precision = (int32_t)c->precision;
        static const dt_mesh_dim axes[4] = { DT_MESH_DP, DT_MESH_TP, DT_MESH_PP, DT_MESH_CP };
        for (int k = 0; k < 4 && r->mesh; k++) js.mesh[k] = dt_mesh_size(r->mesh, axes[k]);
        js.pp_schedule = c->pp_schedule;
        js.pp_wire = c->pp_wire;
        js.cp_wire = c->cp_wire;
        st = dt_train_check_same(r->w, &js);
    }
    return st;
}

/* The engine over the model, and where a resumed run goes on from. */
static dt_status make_engine(run *r) {
    const dt_train_config *c = &r->c;
    /* gradients average over the replicas: DP x CP (context-parallel ranks hold the same weights) */
    dt_engine_config ec = { .comm = r->mesh ? dt_mesh_replicas(r->mesh) : NULL, .strategy = c->strategy, .opt = c->opt,
                            .grad_clip = c->grad_clip, .skip_nonfinite = c->skip_nonfinite, .step_at_end = c->step_at_end,
                            .bucket_first = DT_DDP_FIRST_BUCKET, .bucket_bytes = (size_t)(c->bucket_mb * 1048576.0),
                            .loss_scale = c->precision == DT_F16 ? &c->loss_scale : NULL, .grad_comm = c->grad_comm,
                            .grad_store = c->grad_store,
                            .mp_comm = r->mesh && dt_mesh_size(r->mesh, DT_MESH_TP) > 1 ? dt_mesh_comm(r->mesh, DT_MESH_TP) : NULL,
                            .expert_comm = r->ep_replicas, .ep = r->ep ? dt_comm_size(r->ep) : 1, .codec = &c->codec };
    /* the norm: the group's experts, and the rest counted once (ZeRO's shards already part both over every rank) */
    bool zero = c->strategy && !strncmp(c->strategy, "zero", 4);
    if (r->ep && !zero) ec.mp_comm = r->mp ? r->mp : r->ep;
    dt_gpt2_model(r->m, &ec.model);
    dt_status st = DT_OK;
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_PP) > 1) {
        /* the pipeline before the engine: its hooks come before a data-parallel strategy's */
        dt_pipeline_config pc = { dt_mesh_comm(r->mesh, DT_MESH_PP), dt_gpt2_program(r->m), (dt_pp_kind)c->pp_schedule, dt_train_pp_virt(c), c->grad_accum, c->batch,
                                  r->T, dt_train_next_batch, r, (dt_pp_wire)c->pp_wire };
        if ((st = dt_pipeline_create(&pc, &r->pipe))) return st;
        ec.schedule = dt_pipeline_schedule(r->pipe);
        ec.loss_comm = r->w;
        /* (ZeRO's sum over every data-parallel rank takes in the expert-parallel group: the stages alone then) */
        ec.mp_comm = c->ep > 1 && zero ? dt_mesh_comm(r->mesh, DT_MESH_PP) : r->mp;
    }
    /* a pipeline's stages (the ranks of this one's tensor-parallel place): K-FAC's KL clipping and skips span them */
    dt_comm *tp = r->mesh && dt_mesh_size(r->mesh, DT_MESH_TP) > 1 ? dt_mesh_comm(r->mesh, DT_MESH_TP) : NULL;
    dt_comm *stages = ec.schedule ? dt_mesh_comm(r->mesh, DT_MESH_PP) : NULL;
    if (!st) st = dt_train_precond_create(c, &ec, stages, tp, r->rank, "embeddings, norms, head, experts", &r->pre);
    if (!st) st = dt_train_device_attach(c, r->nranks, r->w ? dt_comm_local_rank(r->w) : 0, dt_gpt2_program(r->m), &ec, &r->dev);
    if (!st) st = dt_engine_create(&ec, &r->e);
    if (st || !c->resume) return st;
    dt_checkpoint_position pos;
    dt_checkpoint_model cm;
    dt_checkpoint_gpt2(r->m, &cm);
    dt_train_checkpoint_stage(r, &cm);
    if ((st = dt_checkpoint_resume(c->resume, r->nranks > 1 ? r->w : NULL, c, &cm, r->e, &pos))) return st;
    if (pos.step >= c->steps)
        return dt_error(DT_ERR_ARG, "--resume %s: the checkpoint is at step %d, and --steps is %d: nothing left to train", c->resume,
                        pos.step, c->steps);
    if (pos.data_tokens != dt_train_data_tokens(r))
        dt_log(DT_LOG_WARN, "--resume %s: saved reading %zu training tokens, --data has %zu", c->resume, pos.data_tokens,
               dt_train_data_tokens(r));
    r->first_step = pos.step;
    if (r->dev.lm && (st = dt_engine_materialize(r->e, 0))) return st; /* the loaded state to the GPU */
    return dt_checkpoint_seek(&pos, r->tl, (size_t)c->batch * c->seq * r->dp_size, c->shuffle_seed != 0);
}

/* The model FLOPs of a step and the run's peak, for MFU (rank 0 reports them). */
/* The threads the peak counts: those asked for, but no more than the cores
 * of the machines the ranks run on (--nproc 4 --threads 2 on 2 cores can
 * do what 2 cores do, not 8 threads' worth). */
static int peak_threads(const run *r) {
    int asked = r->c.threads * r->nranks;
    long cores = dt_cpu_cores();
    int nodes = r->w && r->nranks > 1 ? dt_comm_nodes(r->w) : 1;
    long have = cores > 0 ? cores * nodes : asked;
    return asked < have ? asked : (int)have;
}

static void find_peak(run *r) {
    const dt_train_config *c = &r->c;
    r->flops_per_step = dt_program_step_flops_per_token(dt_gpt2_program(r->m), c->seq) * c->batch * c->seq * c->grad_accum * r->dp_size;
    double per_thread;
    if (r->rank != 0 || (c->quiet && !c->metrics) || c->steps == 0) return; /* no steps (eval): no MFU */
    if (r->dev.gpu) { /* the GPU's matmuls' rate, measured now */
        bool bf16 = c->precision == DT_BF16;
        if (dt_train_device_peak(&r->dev, bf16, &r->peak_gflops)) dt_log(DT_LOG_WARN, "no MFU: %s", dt_last_error());
        r->peak_source = bf16 ? "the GPU's bf16 GEMM at 4096^3, measured now"
                         : c->tf32 ? "the GPU's TF32 GEMM at 4096^3, measured now" : "the GPU's f32 GEMM at 4096^3, measured now";
        return;
    }
    /* a bf16 run on the bf16 GEMM: MFU against that GEMM's rate, not sgemm's (which it beats) */
    r->peak_bf16 = c->precision == DT_BF16 && dt_gemm_bf16_ready();
    if ((r->peak_bf16 ? dt_peak_bf16_per_thread : dt_peak_per_thread)(&per_thread, &r->peak_source)) {
        dt_log(DT_LOG_WARN, "no MFU: %s", dt_last_error());
        return;
    }
    r->peak_threads = peak_threads(r);
    r->peak_gflops = per_thread * r->peak_threads;
}

/* ", x N tensor-parallel (sequence parallel) x P pipeline stages" or nothing. */
static const char *tp_note(const run *r) {
    static char note[160];
    int tp = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_TP) : 1, cp = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_CP) : 1;
    int pp = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_PP) : 1, k = 0;
    note[0] = 0;
    if (tp > 1) k = snprintf(note, sizeof note, " x %d tensor-parallel%s", tp, r->c.sp ? " (sequence parallel)" : "");
    if (cp > 1)
        k += snprintf(note + k, sizeof note - (size_t)k, " x %d context-parallel (%s attention, %d positions a rank)", cp,
                      r->c.cp_impl == DT_CP_ULYSSES ? "all-to-all" : "ring", r->T);
    if (pp > 1) snprintf(note + k, sizeof note - (size_t)k, " x %d pipeline stages", pp);
    return note;
}

/* Where the mesh put each rank (rank -> dp, tp -> node), said by rank 0;
 * a tensor-parallel group split across machines (its collectives every
 * layer, over the network) is warned about. Collective. */
static dt_status print_placement(run *r) {
    int n = r->nranks, tp = dt_mesh_size(r->mesh, DT_MESH_TP);
    int32_t mine = dt_comm_node(r->w), *node = malloc((size_t)n * sizeof *node);
    if (!node) return dt_error(DT_ERR_NOMEM, "placement: out of memory");
    dt_status st = dt_comm_allgather(r->w, &mine, node, 1, DT_I32);
    if (st || r->rank != 0 || r->c.quiet) { free(node); return st; }
    int dp = dt_mesh_size(r->mesh, DT_MESH_DP), cp = dt_mesh_size(r->mesh, DT_MESH_CP);
    if (cp > 1) { /* the 4D mesh; without CP the line reads as it always has */
        printf("mesh pp %d x dp %d x cp %d x tp %d (tp innermost): rank (pp, dp, cp, tp) node:", dt_mesh_size(r->mesh, DT_MESH_PP), dp, cp, tp);
        for (int q = 0; q < n; q++)
            printf(" %d (%d, %d, %d, %d) %d%s", q, q / (tp * cp * dp), q / (tp * cp) % dp, q / tp % cp, q % tp, node[q], q + 1 < n ? "," : "\n");
    } else {
        printf("mesh pp %d x dp %d x tp %d (tp innermost): rank (pp, dp, tp) node:", dt_mesh_size(r->mesh, DT_MESH_PP), dp, tp);
        for (int q = 0; q < n; q++) printf(" %d (%d, %d, %d) %d%s", q, q / (tp * dp), q / tp % dp, q % tp, node[q], q + 1 < n ? "," : "\n");
    }
    for (int q = 0; q < n; q++)
        if (node[q] != node[q - q % tp])
            dt_log(DT_LOG_WARN, "tensor-parallel group of ranks %d..%d spans machines %d and %d: its collectives run every layer "
                   "over the network", q - q % tp, q - q % tp + tp - 1, node[q - q % tp], node[q]);
    free(node);
    return DT_OK;
}

/* The pipeline's split of the units, its cost balance and its schedule (rank 0). */
static void print_stages(const run *r) {
    const dt_gpt2_config *mc = dt_gpt2_get_config(r->m);
    int pp = dt_mesh_size(r->mesh, DT_MESH_PP), v = dt_train_pp_virt(&r->c), first[pp * v + 1], L = mc->num_layers;
    if (dt_gpt2_split_stages(mc, r->c.seq, pp * v, first)) return;
    double total = dt_gpt2_units_cost(mc, r->c.seq, 0, L + 2);
    const dt_pp_schedule *s = dt_pipeline_actions(r->pipe);
    printf("pipeline %s, %d stages, %d micro-batches of %d x %d a step; units by cost (embedding 0, blocks 1..%d, head %d):",
           dt_pp_kind_name(s->kind), pp, s->micro, r->c.batch, r->c.seq, L, L + 1);
    for (int k = 0; k < pp; k++) {
        double share = 0;
        printf(" stage %d ", k);
        for (int j = 0; j < v; j++) {
            int a = first[j * pp + k], b = first[j * pp + k + 1];
            printf("%s[%d, %d)", j ? "+" : "", a, b);
            share += dt_gpt2_units_cost(mc, r->c.seq, a, b) / total;
        }
        printf(" %.1f%%%s", 100 * share, k + 1 < pp ? "," : "");
    }
    printf("; activations and gradients %s\n", dt_pipeline_mailboxes(r->pipe) ? "through mailboxes in the shared arena (one machine)"
                                                                              : "by point-to-point messages");
    if (r->c.pp_print) dt_pp_schedule_print(s, stdout);
}

/* The model, its layout and where it runs (the GPU, LoRA's adapters). */
static void print_model(const run *r) {
    const dt_train_config *c = &r->c;
    dt_lm_config m = dt_lm_config_resolve(dt_gpt2_get_config(r->m)), *mc = &m;
    char kv[48] = "";
    if (mc->kv_heads != mc->num_heads) snprintf(kv, sizeof kv, " (%d K/V heads)", mc->kv_heads);
    printf("model %s (%s): %d layers, %d heads%s, %d channels, vocab %d (padded %d), %.2fM parameters; "
           "batch %d x %d x %d accumulation x %d data-parallel rank%s%s, %s, %s, %d thread%s per rank\n",
           c->shape.num_layers || c->shape.channels || c->shape.vocab_size || c->shape.num_heads ? "custom" : c->model,
           dt_family_name(mc->family), mc->num_layers, mc->num_heads, kv, mc->channels, mc->vocab_size, mc->padded_vocab_size,
           dt_gpt2_config_num_params(mc) / 1e6,
           c->batch, c->seq, c->grad_accum, r->dp_size, r->dp_size == 1 ? "" : "s", tp_note(r), dt_engine_strategy_name(r->e),
           dt_optim_kind_name(c->opt.kind), dt_kernels_threads(), dt_kernels_threads() == 1 ? "" : "s");
    if (mc->experts) print_experts(mc);
    double gib = 0;
    const char *gpu = dt_train_device_name(&r->dev, &gib, NULL);
    if (gpu)
        printf("on the GPU (rank 0's: cuda:%d): %s, %.2f GiB of its memory in use; %s%s; the parameters, gradients and AdamW's "
               "moments live there (a save copies them back)\n", r->dev.ordinal, gpu, gib, c->precision == DT_BF16 ? "bf16 (below)" : "f32",
               c->tf32 && c->precision != DT_BF16 ? " with TF32 matmuls" : "");
    const dt_lora_config *lc = dt_program_lora_config(dt_gpt2_program(r->m));
    if (lc) {
        dt_model am;
        dt_gpt2_model(r->m, &am);
        size_t n = dt_model_global_params(&am);
        printf("LoRA rank %d, alpha %g on %s: %.3fM adapter parameters train (%.2f%% of the model's), the rest is frozen; data "
               "parallelism reduces %.2f MiB a step\n", lc->rank, (double)lc->alpha, lc->targets, n / 1e6,
               100.0 * (double)n / (double)dt_gpt2_config_num_params(mc), n * 4 / 1048576.0);
    }
}

/* What 16 bits (and the GPU's attention) gain here, so that nobody expects the speed of a bf16 GEMM that is not there. */
static void print_precision(const run *r) {
    const dt_train_config *c = &r->c;
    if (r->dev.gpu && c->attention == DT_ATTN_CUDNN) {
        printf("attention on the GPU: cuDNN's fused attention (bf16 products with f32 sums, each row's log-sum-exp kept, not T x T "
               "probabilities)\n");
    } else if (r->dev.gpu) {
        bool flash = dt_train_device_flash(&r->dev), tf32 = c->tf32;
        printf("attention on the GPU: %s%s\n", flash ? "flash (each row's log-sum-exp kept, not T x T probabilities; its products in TF32)"
                                                : tf32 ? "T x T probabilities kept, products in TF32" : "T x T probabilities kept, products in f32",
               flash && c->attention != DT_ATTN_BLOCKWISE ? ", because the T x T probabilities would not fit the GPU"
               : !flash && c->attention == DT_ATTN_BLOCKWISE ? " (--attention blockwise takes flash attention in a bf16 or --tf32 run, heads of 32, 64 "
                                                              "or 128 channels)"
                                                            : "");
    }
    if (c->precision != DT_F32 && r->dev.gpu) {
        printf("bf16 on the GPU: autocast's roundings, the Linears' products bf16 on the tensor cores with f32 sums; master weights, "
               "gradients and AdamW in f32\n");
    } else if (c->precision != DT_F32) {
        char matmuls[256];
        if (c->precision == DT_BF16 && dt_gemm_bf16_ready())
            snprintf(matmuls, sizeof matmuls, "run on a bf16 GEMM (oneDNN, this CPU's avx512_bf16): about twice sgemm's rate");
        else
            snprintf(matmuls, sizeof matmuls, "widen 16-bit values into f32 sgemm, because %s: expect fp32's speed or a little less",
                     c->precision == DT_BF16 && dt_cpu_has("avx512_bf16") ? "this build has no bf16 GEMM (oneDNN) or DTRAIN_BF16_GEMM=0"
                     : c->precision == DT_BF16                           ? "this CPU has no bf16 arithmetic (no avx512_bf16)"
                                                                         : "dtrain has no fp16 GEMM");
        printf("%s: activations and the parameters' working copy in 16 bits, master weights in f32, averaged gradients in %s; "
               "the matmuls %s, and half the activation memory\n", dt_precision_name(c->precision),
               c->grad_store != DT_F32 ? "16 bits (--grad-store)" : "f32", matmuls);
    }
}

/* The peak MFU is measured against. */
static void print_mfu(const run *r) {
    const dt_train_config *c = &r->c;
    if (r->peak_gflops > 0 && r->dev.gpu)
        printf("MFU against %.1f TFLOP/s (%s); %.3f GFLOP per step\n", r->peak_gflops / 1e3, r->peak_source, r->flops_per_step / 1e9);
    else if (r->peak_gflops > 0)
        printf("MFU against %.1f GFLOP/s (%d thread%s x %.1f GFLOP/s %s per thread, %s%s); %.3f GFLOP per step\n",
               r->peak_gflops, r->peak_threads, r->peak_threads > 1 ? "s" : "", r->peak_gflops / r->peak_threads,
               r->peak_bf16 ? "bf16 GEMM" : "sgemm", r->peak_source,
               r->peak_threads < c->threads * r->nranks ? "; the cores there are, not the threads asked for" : "", r->flops_per_step / 1e9);
}

/* What rank 0 says before the first step: the model and layout, a resumed run's step, the validation, what 16 bits
 * gain on this CPU, the peak MFU is measured against. */
static void print_start(const run *r) {
    const dt_train_config *c = &r->c;
    print_model(r);
    if (r->first_step) printf("resumed from %s at step %d\n", c->resume, r->first_step);
    /* said before it happens: an evaluation of long sequences can take longer than many steps */
    if (r->vl && c->steps > 0) {
        char when[64] = "at the end";
        if (c->eval_every > 0 && c->eval_every < c->steps) snprintf(when, sizeof when, "every %d steps and at the end", c->eval_every);
        printf("validation: %d batch%s of %d x %d tokens a data-parallel rank from %s, %s (--eval-batches, --eval-every)\n",
               c->eval_batches, c->eval_batches == 1 ? "" : "es", c->batch, c->seq, c->val_data, when);
    }
    print_precision(r);
    print_mfu(r);
}

dt_status dt_train_setup(run *r) {
    dt_train_config *c = &r->c;
    dt_status st = DT_OK;
    if (r->nranks > 1) {
        /* check_mesh has vetted the layout; dp 0 means the ranks tp x pp x cp leave */
        int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, cp = c->cp ? c->cp : 1;
        st = dt_mesh_create(r->w, c->dp ? c->dp : r->nranks / (tp * pp * cp), tp, pp, cp, &r->mesh);
    }
    r->T = r->mesh ? c->seq / dt_mesh_size(r->mesh, DT_MESH_CP) : c->seq;
    r->dp_rank = r->mesh ? dt_mesh_coord(r->mesh, DT_MESH_DP) : 0;
    r->dp_size = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_DP) : 1;
    /* with a pipeline, the ranks of one replica's model (its TP x PP ranks, and with --ep its expert-parallel group's):
     * the norm's and the loss's group; with --ep and --tp, the norm's (the TP slices and the group's experts) */
    if (!st && r->mesh && (dt_mesh_size(r->mesh, DT_MESH_PP) > 1 || (c->ep > 1 && dt_mesh_size(r->mesh, DT_MESH_TP) > 1)))
        st = dt_comm_split(r->w, c->ep > 1 ? r->dp_rank / c->ep : dt_comm_rank(dt_mesh_replicas(r->mesh)), r->rank, &r->mp);
    if (!st && c->ep > 1) { /* ep consecutive data-parallel ranks split the experts; those with the same place hold the same ones */
        dt_comm *dp = dt_mesh_comm(r->mesh, DT_MESH_DP);
        st = dt_comm_split(dp, r->dp_rank / c->ep, r->dp_rank, &r->ep);
        if (!st && r->dp_size > c->ep) st = dt_comm_split(dp, r->dp_rank % c->ep, r->dp_rank, &r->ep_replicas);
        if (!st) r->ep_ops = dt_ep_ops_over(r->ep);
    }
    /* traced from here when the window starts at step 1: the data and checkpoint reads too */
    if (!st && c->trace) st = dt_trace_file_create(c->trace, r->nranks > 1 ? r->w : NULL, c->trace_first, c->trace_last, &r->trace);
    dt_trace_file_step(r->trace, 1);
    if (!st) st = build_model(r, &r->m);
    if (!st) st = open_data(r);
    if (!st && r->fresh) st = init_weights(r, r->m);
    if (!st) st = make_engine(r);
    int dropped = 0;
    if (!st && c->metrics && r->first_step && !(st = dt_metrics_truncate(c->metrics, r->first_step, &dropped)) && dropped && !c->quiet)
        printf("%s: %d row%s after step %d removed (that work was lost and runs again)\n", c->metrics, dropped, dropped == 1 ? "" : "s",
               r->first_step);
    if (!st && c->metrics && !(r->metrics = fopen(c->metrics, r->first_step ? "a" : "w")))
        st = dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    if (!st && c->tensorboard && c->steps > 0) st = dt_tb_create(c->tensorboard, &r->tb); /* a resumed run: a new file from its step on */
    size_t BT = (size_t)c->batch * c->seq;
    if (!st && (!(r->in = malloc(BT * 4)) || !(r->tg = malloc(BT * 4))))
        st = dt_error(DT_ERR_NOMEM, "out of memory for a batch of %zu tokens", BT);
    /* LoRA's dropout draws from each training row's key (evaluation sets none: nothing drops) */
    const dt_lora_config *lc = st ? NULL : dt_program_lora_config(dt_gpt2_program(r->m));
    if (lc && lc->dropout > 0 && !(r->keys = malloc((size_t)c->batch * sizeof *r->keys)))
        st = dt_error(DT_ERR_NOMEM, "out of memory for a batch's keys");
    if (!st && r->keys) dt_program_set_row_keys(dt_gpt2_program(r->m), r->keys);
    if (!st) st = dt_watchdog_start(r->nranks > 1 ? r->w : NULL, &r->wd);
    if (!st) find_peak(r);
    if (!st && r->mesh && (dt_mesh_size(r->mesh, DT_MESH_TP) > 1 || dt_mesh_size(r->mesh, DT_MESH_CP) > 1 || r->pipe)) st = print_placement(r);
    if (!st && r->pipe && r->rank == 0 && !c->quiet) print_stages(r);
    if (!st && !c->quiet) print_start(r);
    if (!st) st = dt_train_setup_dpo(r);
    if (!st && c->grpo.prompts) st = dt_train_setup_grpo(r);
    return st;
}

/* --report DIR: the metrics and a trace of a few steps go there unless
 * named elsewhere; --trace alone records steps 1 to 10 unless told. */
dt_status dt_train_observers(run *r) {
    dt_train_config *c = &r->c;
    if (c->report) {
        if (mkdir(c->report, 0755) != 0 && errno != EEXIST)
            return dt_error(DT_ERR_IO, "--report %s: cannot create the directory: %s", c->report, strerror(errno));
        if (!c->metrics) {
            snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", c->report);
            c->metrics = r->metrics_path;
        }
        if (!c->trace) {
            snprintf(r->trace_path, sizeof r->trace_path, "%s/trace.json", c->report);
            c->trace = r->trace_path;
            /* step 1 is the warm-up: a few steady ones show the overlap */
            if (!c->trace_first) c->trace_first = c->steps > 1 ? 2 : 1, c->trace_last = c->steps > 3 ? 4 : c->steps;
        }
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/report.html", c->report);
        if (r->rank == 0 && dt_file_check_writable(probe)) return dt_error(DT_ERR_IO, "--report %s: %s", c->report, dt_last_error());
    }
    if (c->trace && !c->trace_first) c->trace_first = 1, c->trace_last = 10;
    return DT_OK;
}
