/* GPT-2's trainer: the defaults, the launch of local ranks, and the loop
 * over the steps (the learning-rate schedule, evaluation every eval_every
 * steps, the non-finite rule, periodic saves, progress on the terminal).
 * Building the run is run_setup.c's; saving it run_save.c's; its metrics,
 * memory report and run record run_output.c's. */
#include "run.h"
#include "progress.h"
#include "run_checks.h"
#include "dtrain/kernels.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dt_train_defaults(dt_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "d6";
    c->batch = 4;
    c->seq = 64;
    c->steps = 10;
    c->grad_accum = 1;
    c->keep_last = 1;
    c->lora.dropout = -1; /* not given */
    c->shape.aux_coef = -1; /* not given: the model's own (0, or a Hugging Face folder's) */
    c->shape.bias_rate = -1; /* not given: 0.001 for the sigmoid router (DeepSeek-V3's) */
    c->eval_batches = 8;
    c->seed = 1337;
    c->nproc = 1;
    c->print_every = 0; /* a line every step for GPT-2, every 50 for the image models (where steps are many and short) */
    c->bucket_mb = 25;
    c->codec = (dt_codec_config){ .kind = DT_CODEC_NONE, .rank = 1, .start = 0, .min_rate = 2, .density = 0.01f, /* PyTorch's rank and rate */
                                  .var_scaler = 16, .local_scaler = 32678, .local_clip = 16 }; /* DeepSpeed's 0/1 Adam's */
    c->epochs = 0; /* unset: image models train 5 (run_rank) */
    c->stall_timeout = DT_STALL_TIMEOUT_DEFAULT;
    c->pp_schedule = 1; /* DT_PP_1F1B */
    c->cp_impl = -1;    /* auto */
    dt_optim_defaults(DT_OPT_ADAMW, &c->opt);
    dt_kfac_defaults(&c->kfac);
    dt_shampoo_defaults(&c->shampoo);
    dt_grpo_defaults(&c->grpo);
    dt_schedule_defaults(&c->sched);
    dt_loss_scale_defaults(&c->loss_scale);
}

/* The loader's next batch into r->in, r->tg; a context-parallel rank keeps its rows of each sequence. */
static void load(run *r, dt_loader *l) {
    if (r->grpo && !l) { dt_train_grpo_batch(r); return; } /* GRPO's rows: its rollout's, in order */
    dt_loader_next(l, r->in, r->tg);
    if (r->pos) dt_loader_positions(l, r->pos);
    if (r->keys && l == r->tl) dt_loader_row_keys(l, r->c.seed, r->keys);
    if (r->dpo) dt_train_dpo_queue(r, l);
    if (r->T == r->c.seq) return;
    int cp = dt_mesh_size(r->mesh, DT_MESH_CP), q = dt_mesh_coord(r->mesh, DT_MESH_CP);
    dt_gpt2_cp_rows(r->in, r->c.batch, r->c.seq, q, cp);
    dt_gpt2_cp_rows(r->tg, r->c.batch, r->c.seq, q, cp);
}

/* The next training batch into r->in, r->tg (micro-batch k: every
 * pipeline stage reads each, in order, so the loaders stay together). */
dt_status dt_train_next_batch(void *ctx, int k, const int32_t **in, const int32_t **tg) {
    run *r = ctx;
    (void)k;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_DATA, "next batch", "\"tokens\":%d", r->c.batch * r->c.seq);
    load(r, r->tl);
    DT_TRACE_END(DT_TRACK_DATA);
    r->data += dt_time_now() - t0;
    *in = r->in;
    *tg = r->tg;
    return DT_OK;
}

/* One micro-batch for the engine: the next batch, forward, backward. */
static dt_status micro(void *ctx, int k, float grad_scale, float *loss) {
    run *r = ctx;
    const int32_t *in, *tg;
    dt_train_next_batch(r, k, &in, &tg);
    double ta = dt_time_now();
    dt_status st = dt_gpt2_forward(r->m, in, tg, r->c.batch, r->T, loss);
    double tb = dt_time_now();
    if (!st) st = dt_gpt2_backward(r->m, grad_scale);
    r->fwd += tb - ta;
    r->bwd += dt_time_now() - tb;
    r->tp_comm += dt_gpt2_tp_comm_seconds(r->m);
    return st;
}

static dt_status eval_batch(void *ctx, int k, const int32_t **in, const int32_t **tg) {
    run *r = ctx;
    (void)k;
    load(r, r->fl);
    *in = r->in;
    *tg = r->tg;
    return DT_OK;
}

dt_status dt_train_forward_batches(run *r, dt_loader *l, int nb, float *out) {
    const dt_train_config *c = &r->c;
    double sum = 0;
    int n = 0;
    dt_status st = DT_OK;
    r->fl = l;
    if (r->dpo) dt_dpo_restart(r->dpo);
    dt_program_set_row_keys(dt_gpt2_program(r->m), NULL); /* evaluating: nothing drops */
    if (r->pipe) st = dt_pipeline_forward_only(r->pipe, nb, eval_batch, r, &sum, &n);
    for (int i = 0; i < nb && !st && !r->pipe; i++, n++) {
        float loss = 0;
        load(r, l);
        st = dt_gpt2_forward(r->m, r->in, r->tg, c->batch, r->T, &loss);
        sum += loss;
    }
    dt_program_set_row_keys(dt_gpt2_program(r->m), r->keys);
    if (st) return st;
    /* the mean over the ranks that computed losses (a pipeline's last stages; every rank otherwise) */
    float v[2] = { n ? (float)(sum / n) : 0, n ? 1 : 0 };
    if (r->nranks > 1 && (st = dt_comm_allreduce(r->w, v, v, 2, DT_F32, DT_SUM))) return st;
    *out = v[1] > 1 ? v[0] / v[1] : v[0];
    return DT_OK;
}

/* The validation loss: eval_batches batches on every data-parallel rank
 * (through the stages with a pipeline), the mean over them (collective). */
static dt_status evaluate(run *r, float *out) {
    const dt_train_config *c = &r->c;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "evaluation", "\"batches\":%d", c->eval_batches);
    dt_loader_reset(r->vl);
    dt_train_loss_tokens(r, r->vl, c->eval_batches); /* SFT: the mean over every evaluated batch's scored tokens */
    double s[DT_DPO_NSTATS];
    if (r->dpo) dt_dpo_stats(r->dpo, s, true);
    dt_status st = dt_train_forward_batches(r, r->vl, c->eval_batches, out);
    if (!st) st = dt_train_moe_val_load(r); /* and not the next step's */
    if (!st && r->dpo) st = dt_train_dpo_stats(r, true, r->dpo_val);
    DT_TRACE_END(DT_TRACK_COMPUTE);
    return st;
}

/* After a step: evaluation, metrics, the non-finite rule, periodic saves,
 * progress. Returns 0 to go on, else the exit code. */
static int after_step(run *r, int step, float lr, const dt_step_result *s, double ms, double t_start) {
    const dt_train_config *c = &r->c;
    double tps = (double)c->batch * c->seq * c->grad_accum * r->dp_size / (ms / 1e3); /* the global batch's tokens */
    /* a step skipped by the loss scaler (its gradients overflowed) was meant to be, and said so */
    bool scaled_skip = s->skipped && dt_engine_loss_scale(r->e);
    bool finite = (isfinite(s->loss) && isfinite(s->norm)) || scaled_skip;
    /* --val-data alone evaluates at the end */
    bool eval = r->vl && finite && ((c->eval_every > 0 && (step + 1) % c->eval_every == 0) || step + 1 == c->steps);
    float val = NAN;
    if (eval && evaluate(r, &val)) {
        dt_log(DT_LOG_ERROR, "step %d, evaluation: %s", step + 1, dt_last_error());
        return 1;
    }
    if (r->metrics) dt_train_write_metrics(r, step, lr, s, ms, tps, eval, val);
    if (r->tb) dt_train_write_tensorboard(r, step, lr, s, ms, tps, eval, val);
    if (!finite && !c->skip_nonfinite) {
        dt_log(DT_LOG_ERROR, "step %d: the %s is %s; stopping without saving (the last checkpoint, if any, is kept; "
               "--on-nonfinite skip skips such steps instead)", step + 1, isfinite(s->loss) ? "gradient norm" : "loss",
               isnan(isfinite(s->loss) ? s->norm : s->loss) ? "NaN" : "infinite");
        return 1;
    }
    if (s->skipped && !finite) dt_log(DT_LOG_WARN, "step %d: the %s is not finite; step skipped", step + 1, isfinite(s->loss) ? "gradient norm" : "loss");
    /* a checkpoint every save_every steps, atomically: a crash leaves the last one whole */
    if (c->save && c->save_every > 0 && (step + 1) % c->save_every == 0 && step + 1 < c->steps && !s->stop && dt_train_save(r, step + 1)) {
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        return 1;
    }
    double mfu = r->peak_gflops > 0 ? r->flops_per_step / (ms / 1e3) / 1e9 / r->peak_gflops : 0;
    if (!c->quiet)
        dt_progress_print(r->tty, c->print_every ? c->print_every : 1,
                          &(dt_progress){ .step = step, .steps = c->steps, .first = r->first_step, .loss = s->loss, .lr = lr,
                                          .norm = s->norm, .skipped = s->skipped, .ms = ms, .rate = tps, .unit = "tok/s", .mfu = mfu,
                                          .bubble = r->pipe ? r->bubble : NAN, .experts = r->moe_worst, .dropped = r->moe_dropped,
                                          .elapsed = dt_time_now() - t_start, .val = eval ? val : NAN, .val_experts = r->moe_val_worst,
                                          .grpo = r->grpo != NULL, .reward = r->grpo_step.reward, .kl = r->grpo_step.kl });
    return 0;
}

/* The end of a run: the replicas agree, the final save, the memory report. */
static int finish(run *r, int steps_done, int stop_signal) {
    const dt_train_config *c = &r->c;
    if (r->tty) printf("\n");
    uint64_t hash;
    int checked;
    if (dt_engine_sync_replicas(r->e) || dt_engine_check_replicas(r->e, &checked, &hash)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    if (checked && r->dp_size > 1 && !c->quiet) {
        if (r->dp_size == r->nranks) printf("weights identical on all %d ranks (hash %016llx)\n", r->nranks, (unsigned long long)hash);
        else printf("weights identical on the %d data-parallel ranks of each slice (rank 0's slice: hash %016llx)\n", r->dp_size,
                    (unsigned long long)hash);
    }
    if (!stop_signal && steps_done < c->steps && !c->quiet)
        printf("stopped after %d steps (--stop-after); --resume %s goes on\n", c->stop_after, c->save ? c->save : "(no --save)");
    if (stop_signal && r->rank == 0)
        dt_log(DT_LOG_WARN, "stopped by signal %d (%s) after step %d of %d%s", stop_signal, strsignal(stop_signal), steps_done,
               c->steps, c->save ? "; saving" : " (nothing saved: no --save)");
    if (c->save) {
        if (dt_train_save(r, steps_done)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
        if (!c->quiet) printf("saved %s (step %d)\n", c->save, steps_done);
    }
    if (!c->quiet)
        printf("peak memory %.1f MiB (model %.1f MiB: parameters, gradients, activations%s; optimizer state %.1f MiB%s)\n",
               dt_peak_memory() / 1048576.0, dt_gpt2_memory(r->m) / 1048576.0, c->recompute ? " with --recompute" : "",
               dt_train_optim_bytes(r) / 1048576.0, r->pre.kfac ? ", K-FAC's factors and decompositions in it" : r->pre.shampoo ? ", this rank's Shampoo blocks in it" : "");
    double gib = 0;
    const char *gpu = c->quiet ? NULL : dt_train_device_name(&r->dev, &gib, NULL);
    if (gpu) printf("the GPU (%s): %.2f GiB of its memory in use at the end; the host's memory figures hold its mirrors of the "
                    "parameters and AdamW's state\n", gpu, gib);
    dt_train_observe_end(r, steps_done);
    return stop_signal ? 128 + stop_signal : 0;
}

/* A pipeline step's forward and backward seconds (this stage's) and its
 * bubble (collective over the stages). */
static dt_status pipeline_times(run *r) {
    dt_pipeline_times(r->pipe, &r->fwd, &r->bwd, &r->wgt);
    r->bwd += r->wgt; /* zb1's W: backward's other half */
    return dt_pipeline_bubble(r->pipe, &r->bubble, &r->bubble_model);
}

/* --steps 0: the model's validation loss, every rank's share averaged. */
static int evaluate_only(run *r) {
    const dt_train_config *c = &r->c;
    float val;
    double t0 = dt_time_now();
    if (evaluate(r, &val)) {
        dt_log(DT_LOG_ERROR, "evaluation: %s", dt_last_error());
        return 1;
    }
    /* six decimals: enough to set beside another framework's figure */
    if (r->rank == 0)
        printf("validation loss %.6f (%s: %d batch%s of %d x %d tokens on each of %d rank%s, %.1f s)\n", val, c->val_data,
               c->eval_batches, c->eval_batches == 1 ? "" : "es", c->batch, c->seq, r->dp_size, r->dp_size == 1 ? "" : "s",
               dt_time_now() - t0);
    if (r->rank == 0 && r->moe_val_worst > 0)
        printf("experts' load over them (the most chosen expert over the mean): worst layer %.4f, layers' average %.4f\n",
               r->moe_val_worst, r->moe_val_mean);
    if (r->metrics) dt_train_write_eval_metrics(r, val);
    return isfinite(val) ? 0 : 1;
}

/* The loop: one engine step per iteration, everything else in after_step. */
static int train_loop(run *r) {
    const dt_train_config *c = &r->c;
    if (c->steps == 0) return evaluate_only(r);
    double t_start = r->t_start = dt_time_now();
    int step = r->first_step, stop_signal = 0;
    dt_train_catch_signals();
    for (; step < c->steps && !stop_signal; step++) {
        double t0 = dt_time_now();
        float lr = dt_lr_at(&c->sched, c->steps, step);
        dt_step_result s;
        r->fwd = r->bwd = r->data = r->tp_comm = 0;
        dt_comm_set_progress(r->w, step + 1);
        dt_trace_file_step(r->trace, step + 1);
        DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "step", "\"step\":%d", step + 1);
        dt_train_loss_tokens(r, r->tl, c->grad_accum);
        if (r->dpo) dt_dpo_restart(r->dpo);
        dt_status st = r->grpo ? dt_train_grpo_prepare(r, step) : DT_OK;
        if (!st) st = dt_engine_step(r->e, c->grad_accum, lr, micro, r, dt_train_interrupted(), &s);
        DT_TRACE_END(DT_TRACK_COMPUTE);
        if (!st && r->pipe) st = pipeline_times(r);
        if (!st && r->dpo) st = dt_train_dpo_stats(r, false, r->dpo_step); /* the step's pairs (before an evaluation's) */
        if (!st && r->grpo) st = dt_train_grpo_stats(r, &r->grpo_step);
        if (!st) st = dt_train_moe_load(r);
        if (st) {
            /* an error that names its step already (the loss scaler's) is said as it is */
            if (!strncmp(dt_last_error(), "step ", 5)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            else dt_log(DT_LOG_ERROR, "step %d: %s", step + 1, dt_last_error());
            return 1;
        }
        /* every rank stops after the step any rank was asked to */
        if (s.stop) stop_signal = dt_train_interrupted() ? dt_train_interrupted() : SIGTERM;
        int rc = after_step(r, step, lr, &s, (dt_time_now() - t0) * 1e3, t_start);
        if (rc) return rc;
        if (c->stop_after && step + 1 - r->first_step == c->stop_after && step + 1 < c->steps) {
            step++;
            break;
        }
    }
    return finish(r, step, stop_signal);
}

static void teardown(run *r) {
    dt_watchdog_stop(r->wd);
    dt_trace_file_destroy(r->trace);
    if (r->metrics) fclose(r->metrics);
    dt_tb_destroy(r->tb);
    dt_engine_destroy(r->e);
    dt_train_device_detach(&r->dev, r->m ? dt_gpt2_program(r->m) : NULL);
    dt_train_precond_destroy(&r->pre);
    dt_pipeline_destroy(r->pipe);
    dt_comm_destroy(r->mp);
    dt_comm_destroy(r->ep_replicas);
    dt_comm_destroy(r->ep);
    dt_cp_destroy(r->cp);
    dt_mesh_destroy(r->mesh);
    dt_loader_destroy(r->tl);
    dt_loader_destroy(r->vl);
    dt_tokens_close(r->train);
    dt_tokens_close(r->val);
    dt_sft_destroy(r->sft);
    dt_sft_destroy(r->sft_val);
    dt_dpo_destroy(r->dpo);
    dt_train_grpo_destroy(r);
    free(r->pos);
    free(r->keys);
    dt_gpt2_destroy(r->m);
    dt_comm_destroy(r->moe_sums); /* after the model, which waits for its last sums */
    dt_comm_destroy(r->moe_glob);
    free(r->in);
    free(r->tg);
}

/* --nproc N on one machine: the same command line once per rank. */
static int launch_ranks(const dt_train_config *c) {
    if (!c->argv) { dt_log(DT_LOG_ERROR, "train: --nproc needs the command line to re-run"); return 2; }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { dt_log(DT_LOG_ERROR, "train: cannot find my own executable"); return 1; }
    self[n] = 0;
    c->argv[0] = self;
    return dt_comm_launch(c->nproc, c->argv);
}

static int fail(int rc) {
    dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    return rc;
}

static int run_rank(const dt_train_config *cfg, dt_comm *w, dt_launch_kind kind) {
    dt_train_config kept = *cfg, *c0 = &kept;
    /* said by the launching process, or under MPI by the first rank */
    if (dt_train_keep_global_batch(c0, w ? dt_comm_size(w) : 1, kind == DT_LAUNCH_MPI && dt_comm_first_voice())) return fail(2);
    if (dt_train_check_mesh(c0, w ? dt_comm_size(w) : 1, 0)) return fail(2);
    if (dt_train_is_image_model(c0->model)) {
        dt_kernels_set_threads(c0->threads > 0 ? c0->threads : dt_comm_default_threads(w));
        dt_train_config ic = *c0;
        if (!ic.epochs) ic.epochs = 5;
        return dt_classify_run(&ic, w);
    }
    run r = { .c = *c0, .w = w, .rank = w ? dt_comm_rank(w) : 0, .nranks = w ? dt_comm_size(w) : 1, .model_step = -1 };
    if (r.c.threads <= 0) r.c.threads = dt_comm_default_threads(w);
    if (dt_train_observers(&r)) return fail(2);
    /* one voice; save stays: a sharded optimizer is saved by every rank (save() says who writes) */
    if (r.rank != 0) { r.c.quiet = 1; r.c.metrics = NULL; r.c.tensorboard = NULL; }
    if (dt_train_check_settings(&r.c, r.nranks)) return fail(2);
    dt_kernels_set_threads(r.c.threads);
    r.tty = isatty(STDOUT_FILENO) && !r.c.quiet && kind != DT_LAUNCH_MPI;
    int rc = dt_train_setup(&r) ? (r.rank != 0 && r.refused_alike ? 1 : fail(1)) : train_loop(&r);
    teardown(&r);
    return rc;
}

int dt_train_run(const dt_train_config *c) {
    dt_launch_kind kind;
    if (dt_comm_detect_launch(&kind)) return fail(2);
    bool in_job = kind != DT_LAUNCH_NONE;
    if (c->nproc > 1 && kind == DT_LAUNCH_MPI) {
        dt_log(DT_LOG_ERROR, "--nproc %d inside an mpirun/srun job: the job's ranks are the ranks (drop --nproc, or give "
               "mpirun -np / srun -n the count)", c->nproc);
        return 2;
    }
    const char *ws = getenv("DTRAIN_WORLD_SIZE");
    if (c->nproc > 1 && kind == DT_LAUNCH_LOCAL && ws && atoi(ws) != c->nproc) {
        /* dtrain launch -n 2 -- dtrain train --nproc 4: the launch decides, so say which count wins */
        const char *rank = getenv("DTRAIN_RANK");
        if (!rank || !strcmp(rank, "0")) /* said once */
            dt_log(DT_LOG_ERROR, "--nproc %d inside dtrain launch -n %s: the launch's ranks are the ranks (drop --nproc, or launch "
                   "-n %d)", c->nproc, ws, c->nproc);
        return 2;
    }
    if (!in_job) { /* refused before any rank starts; said here, once */
        dt_train_config kept = *c;
        if (dt_train_keep_global_batch(&kept, c->nproc, 1) || dt_train_check_mesh(&kept, c->nproc, 0) ||
            dt_train_check_preset(&kept, c->nproc))
            return fail(2);
    }
    if (c->nproc > 1 && !in_job) {
        /* the peak for MFU, measured (once per machine) before the ranks share the cores */
        double g;
        const char *src;
        if (!c->quiet || c->metrics || c->report) (void)dt_peak_per_thread(&g, &src);
        return launch_ranks(c);
    }
    dt_comm *w = NULL;
    if (in_job && dt_comm_init(&w)) return fail(1);
    dt_comm_set_stall_timeout(w, c->stall_timeout);
    int rc = run_rank(c, w, kind);
    dt_comm_destroy(w);
    return rc;
}
