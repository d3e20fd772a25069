/* GPT-2's trainer: builds the model, the data and the engine (which runs
 * each step under the parallel strategy), then loops over the steps with
 * the learning-rate schedule, progress on the terminal, one JSON line per
 * step in the metrics file, validation every eval_every steps, and atomic
 * checkpoints (full state into a directory, or weights into a file). */
#include "dtrain/train.h"
#include "progress.h"
#include "run_checks.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"
#include "dtrain/engine.h"
#include "dtrain/obs.h"
#include "dtrain/plan.h"
#include "dtrain/pipeline.h"
#include "dtrain/context.h"

#include <errno.h>
#include <limits.h>
#include <math.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

void dt_train_defaults(dt_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "d6";
    c->batch = 4;
    c->seq = 64;
    c->steps = 10;
    c->grad_accum = 1;
    c->eval_batches = 8;
    c->seed = 1337;
    c->nproc = 1;
    c->print_every = 0; /* a line every step for GPT-2, every 50 for the image models (where steps are many and short) */
    c->bucket_mb = 25;
    c->epochs = 0; /* unset: image models train 5 (run_rank) */
    c->stall_timeout = DT_STALL_TIMEOUT_DEFAULT;
    c->pp_schedule = 1; /* DT_PP_1F1B */
    c->cp_impl = -1;    /* auto */
    dt_optim_defaults(DT_OPT_ADAMW, &c->opt);
    dt_schedule_defaults(&c->sched);
    dt_loss_scale_defaults(&c->loss_scale);
}

/* A JSON number, or null when it is not finite (JSON has no NaN). */
static void json_num(FILE *f, const char *key, const char *fmt, double v) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}


/* Everything a run holds; torn down in one place. */
typedef struct {
    dt_train_config c;        /* this rank's copy (only rank 0 prints, saves, writes metrics) */
    dt_comm *w;
    dt_mesh *mesh;            /* the world as DP x TP x PP (several ranks) */
    int rank, nranks;
    int dp_rank, dp_size;     /* this rank's place among the data-parallel ranks: which slice of each batch it reads */
    dt_tp_ops tp_ops;         /* tensor parallelism's collectives, over the mesh's TP group */
    dt_cp *cp;                /* context parallelism's attention, over the mesh's CP group (--cp) */
    int T;                    /* this rank's positions a sequence: --seq, or --seq / --cp */
    dt_comm *mp;              /* the model-parallel group (the TP x PP ranks of one replica: DP x CP coordinates), with --pp */
    dt_pipeline *pipe;        /* with --pp: the stage's runner, which the engine's step runs */
    double bubble;            /* the last step's idle share, the mean over the stages */
    double bubble_model;      /* the step replayed with its actions' measured durations (dt_pipeline_bubble) */
    bool tty;
    dt_gpt2 *m;
    dt_tokens *train, *val;
    dt_loader *tl, *vl;
    dt_engine *e;
    dt_watchdog *wd;
    FILE *metrics;
    int32_t *in, *tg;
    double fwd, bwd, data;    /* this step's forward, backward and batch-loading seconds */
    double wgt;               /* of backward, zb1's W (weight gradients) */
    double tp_comm;           /* of forward and backward, in tensor parallelism's collectives */
    int first_step;           /* 0, or where a resumed run goes on from */
    dt_trace_file *trace;
    double flops_per_step;    /* model FLOPs of one step, all ranks (dt_gpt2_flops_per_token) */
    double peak_gflops;       /* the run's peak: per-thread sgemm x peak_threads (0: unknown) */
    int peak_threads;         /* threads x ranks, at most the machines' cores */
    bool fresh;               /* the model starts from random weights, not a file */
    const char *peak_source;
    int peak_bf16;            /* the peak is the bf16 GEMM's */
    double t_start;
    char metrics_path[4096], trace_path[4096]; /* under --report DIR unless given */
} run;

/* The loader's next batch into r->in, r->tg; a context-parallel rank keeps its rows of each sequence. */
static void load(run *r, dt_loader *l) {
    dt_loader_next(l, r->in, r->tg);
    if (r->T == r->c.seq) return;
    int cp = dt_mesh_size(r->mesh, DT_MESH_CP), q = dt_mesh_coord(r->mesh, DT_MESH_CP);
    dt_gpt2_cp_rows(r->in, r->c.batch, r->c.seq, q, cp);
    dt_gpt2_cp_rows(r->tg, r->c.batch, r->c.seq, q, cp);
}

/* The next training batch into r->in, r->tg (micro-batch k: every
 * pipeline stage reads each, in order, so the loaders stay together). */
static dt_status next_batch(void *ctx, int k, const int32_t **in, const int32_t **tg) {
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
    next_batch(r, k, &in, &tg);
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
    load(r, r->vl);
    *in = r->in;
    *tg = r->tg;
    return DT_OK;
}

/* The validation loss: eval_batches batches on every data-parallel rank
 * (through the stages with a pipeline), the mean over them (collective). */
static dt_status evaluate(run *r, float *out) {
    const dt_train_config *c = &r->c;
    double sum = 0;
    int n = 0;
    dt_status st = DT_OK;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "evaluation", "\"batches\":%d", c->eval_batches);
    dt_loader_reset(r->vl);
    if (r->pipe) st = dt_pipeline_forward_only(r->pipe, c->eval_batches, eval_batch, r, &sum, &n);
    for (int i = 0; i < c->eval_batches && !st && !r->pipe; i++, n++) {
        float loss = 0;
        load(r, r->vl);
        st = dt_gpt2_forward(r->m, r->in, r->tg, c->batch, r->T, &loss);
        sum += loss;
    }
    DT_TRACE_END(DT_TRACK_COMPUTE);
    if (st) return st;
    /* the mean over the ranks that computed losses (a pipeline's last stages; every rank otherwise) */
    float v[2] = { n ? (float)(sum / n) : 0, n ? 1 : 0 };
    if (r->nranks > 1 && (st = dt_comm_allreduce(r->w, v, v, 2, DT_F32, DT_SUM))) return st;
    *out = v[1] > 1 ? v[0] / v[1] : v[0];
    return DT_OK;
}


/* A refusal every rank makes alike (the memory check's), said by rank 0 alone. */
static bool refused_alike;

/* An axis's size (1 on one process). */
static int mesh_size(const run *r, dt_mesh_dim a) { return r->mesh ? dt_mesh_size(r->mesh, a) : 1; }

/* The job's memory before it is allocated: refused, with the stages that
 * would fit, when this machine's ranks would not fit in it. */
static dt_status check_memory(const dt_train_config *c, const dt_gpt2_config *cfg, const dt_train_dims *d) {
    dt_plan_job job;
    dt_train_plan_job(c, cfg, d, &job);
    job.process_bytes = dt_resident_memory();
    dt_status st = dt_plan_check_memory(&job, 3);
    refused_alike = st != DT_OK;
    return st;
}

/* A new model's weights: each rank draws a piece of the same stream (the
 * values do not depend on who draws them) and broadcasts it, so N ranks
 * start N times sooner than each drawing the whole model. */
static dt_status init_weights(const run *r, dt_gpt2 *m) {
    /* among the data-parallel ranks, which hold the same slices (all ranks without tensor parallelism) */
    size_t n = dt_gpt2_num_params(m);
    int p = r->dp_size, me = r->dp_rank;
    dt_gpt2_init_random_range(m, r->c.seed, n * (size_t)me / (size_t)p, n * (size_t)(me + 1) / (size_t)p);
    for (int q = 0; q < p && p > 1; q++) {
        size_t lo = n * (size_t)q / (size_t)p, hi = n * (size_t)(q + 1) / (size_t)p;
        dt_status st = dt_comm_broadcast(dt_mesh_comm(r->mesh, DT_MESH_DP), dt_gpt2_params(m) + lo, hi - lo, DT_F32, q);
        if (st) return st;
    }
    return DT_OK;
}

static dt_status build_model(run *r, dt_gpt2 **out) {
    const dt_train_config *c = &r->c;
    dt_gpt2_config cfg;
    dt_status st;
    bool from_file = access(c->model, R_OK) == 0;
    int ck_step = -1;
    /* shape flags override a preset; for a file they must agree with it */
    const dt_gpt2_config *o = &c->shape;
    const int v[6] = { o->max_seq_len, o->vocab_size, o->padded_vocab_size, o->num_layers, o->num_heads, o->channels };
    static const char *names[6] = { "--max-seq", "--vocab", "--padded-vocab", "--layers", "--heads", "--channels" };
    if (from_file) {
        if ((st = dt_checkpoint_load_weights(c->model, o->num_heads, out, &ck_step))) return st;
        if (ck_step >= 0 && !c->quiet && r->rank == 0)
            printf("--model %s: the weights of its checkpoint at step %d, with a new optimizer (--resume %s goes on with its run)\n",
                   c->model, ck_step, c->model);
        cfg = *dt_gpt2_get_config(*out);
    } else if (dt_gpt2_preset(c->model, &cfg)) {
        return dt_error(DT_ERR_ARG, "--model %s: %s", c->model,
                        strchr(c->model, '/') || strchr(c->model, '.') ? "no such file (nor a preset: d6, 124M, 350M, 774M, 1558M, mlp, resnet:small, resnet18, resnet34, resnet50)"
                                                                       : "not a preset (d6, 124M, 350M, 774M, 1558M, mlp, resnet:small, resnet18, resnet34, resnet50) nor a file");
    }
    int *f[6] = { &cfg.max_seq_len, &cfg.vocab_size, &cfg.padded_vocab_size, &cfg.num_layers, &cfg.num_heads, &cfg.channels };
    for (int i = 0; i < 6; i++) {
        if (!v[i]) continue;
        if (from_file && *f[i] != v[i]) {
            dt_gpt2_destroy(*out);
            *out = NULL;
            return dt_error(DT_ERR_ARG, "%s: the file says %d but %s says %d", c->model, *f[i], names[i], v[i]);
        }
        *f[i] = v[i];
    }
    if (!from_file && o->vocab_size && !o->padded_vocab_size) cfg.padded_vocab_size = (cfg.vocab_size + 63) / 64 * 64;
    /* before the optimizer and the activations (and, for a preset, the model) are allocated */
    dt_train_dims dims = { .dp = r->dp_size, .tp = mesh_size(r, DT_MESH_TP), .pp = mesh_size(r, DT_MESH_PP), .cp = mesh_size(r, DT_MESH_CP),
                           .local_ranks = r->w ? dt_comm_local_size(r->w) : 1,
                           .shared_params = r->mesh && dt_zero_shares_params(dt_mesh_replicas(r->mesh)) };
    if ((st = dt_train_check_model(c, &cfg, &dims)) || (st = check_memory(c, &cfg, &dims))) {
        dt_gpt2_destroy(*out);
        *out = NULL;
        return st;
    }
    dt_gpt2_part part = dt_gpt2_whole(&cfg);
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_PP) > 1) {
        /* p x v chunks by cost; stage s holds chunks s, s+p, .. (one, but for the interleaved schedule) */
        int pp = dt_mesh_size(r->mesh, DT_MESH_PP), v = dt_train_pp_virt(c);
        if ((st = dt_gpt2_stage_part(&cfg, c->seq, pp, v, dt_mesh_coord(r->mesh, DT_MESH_PP), &part))) {
            dt_gpt2_destroy(*out);
            *out = NULL;
            return st;
        }
    }
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_TP) > 1) {
        r->tp_ops = dt_tp_ops_over(dt_mesh_comm(r->mesh, DT_MESH_TP));
        part.tp_rank = dt_mesh_coord(r->mesh, DT_MESH_TP);
        part.tp_size = dt_mesh_size(r->mesh, DT_MESH_TP);
        part.tp = &r->tp_ops;
        part.sp = c->sp;
    }
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_CP) > 1) {
        int n = dt_mesh_size(r->mesh, DT_MESH_CP);
        dt_cp_impl impl = dt_train_cp_impl(c, &cfg, part.tp_size, n);
        r->c.cp_impl = (int)impl; /* auto's choice, for what the run prints */
        if ((st = dt_cp_create(dt_mesh_comm(r->mesh, DT_MESH_CP), impl, &r->cp))) {
            dt_gpt2_destroy(*out);
            *out = NULL;
            return st;
        }
        part.cp_rank = dt_mesh_coord(r->mesh, DT_MESH_CP);
        part.cp_size = n;
        part.cp = dt_cp_model_ops(r->cp);
    }
    if (!from_file) {
        if ((st = dt_gpt2_create_part(&cfg, &part, out))) return st;
        r->fresh = true; /* drawn once the ranks have agreed on the job (open_data) */
    } else if (part.tp_size > 1 || part.ua > 0 || part.ub < cfg.num_layers + 2 || part.nchunks > 1 || part.cp_size > 1) {
        /* a file holds the whole model: each tensor-parallel rank or pipeline stage keeps its part of it */
        dt_gpt2 *whole = *out;
        if (!(st = dt_gpt2_create_part(&cfg, &part, out))) st = dt_gpt2_copy_slices(whole, *out);
        dt_gpt2_destroy(whole);
        if (st) return st;
    }
    dt_gpt2_set_recompute(*out, c->recompute);
    dt_gpt2_set_attention(*out, (dt_attn_mode)c->attention);
    return dt_gpt2_set_precision(*out, c->precision);
}


static dt_status open_data(run *r) {
    const dt_train_config *c = &r->c;
    const dt_gpt2_config *mc = dt_gpt2_get_config(r->m);
    if (!c->data) return dt_error(DT_ERR_ARG, "--data FILE is required (a token file: see dtrain tokenize)");
    dt_status st = dt_tokens_open(c->data, &r->train);
    if (!st) st = dt_tokens_check_vocab(r->train, mc->vocab_size);
    if (!st && r->rank == 0 && mc->vocab_size > 256 && dt_tokens_max(r->train) < 256)
        dt_log(DT_LOG_WARN, "%s: every token is below 256 (byte-level data?) but the model's vocabulary is %d: "
               "--vocab 256 makes a smaller, faster model whose samples print as text", c->data, mc->vocab_size);
    if (!st) st = dt_loader_create(r->train, c->batch, c->seq, r->dp_rank, r->dp_size, c->shuffle_seed, &r->tl);
    if (!st && c->val_data) {
        st = dt_tokens_open(c->val_data, &r->val);
        if (!st) st = dt_tokens_check_vocab(r->val, mc->vocab_size);
        if (!st) st = dt_loader_create(r->val, c->batch, c->seq, r->dp_rank, r->dp_size, 0, &r->vl);
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
    if (r->w && !st) {
        dt_train_shape js;
        memset(&js, 0, sizeof js);
        js.model = *mc;
        js.batch = c->batch; js.seq = c->seq; js.steps = c->steps; js.grad_accum = c->grad_accum;
        js.optimizer = (int32_t)c->opt.kind; js.eval_every = c->eval_every; js.lr = c->sched.lr;
        js.train_tokens = (int64_t)dt_tokens_count(r->train);
        js.val_tokens = r->val ? (int64_t)dt_tokens_count(r->val) : 0;
        snprintf(js.strategy, sizeof js.strategy, "%s", c->strategy ? c->strategy : "ddp");
        js.precision = (int32_t)c->precision;
        static const dt_mesh_dim axes[4] = { DT_MESH_DP, DT_MESH_TP, DT_MESH_PP, DT_MESH_CP };
        for (int k = 0; k < 4 && r->mesh; k++) js.mesh[k] = dt_mesh_size(r->mesh, axes[k]);
        js.pp_schedule = c->pp_schedule;
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
                            .bucket_first = 1u << 20, .bucket_bytes = (size_t)(c->bucket_mb * 1048576.0),
                            .loss_scale = c->precision == DT_F16 ? &c->loss_scale : NULL, .grad_comm = c->grad_comm,
                            .grad_store = c->grad_store,
                            .mp_comm = r->mesh && dt_mesh_size(r->mesh, DT_MESH_TP) > 1 ? dt_mesh_comm(r->mesh, DT_MESH_TP) : NULL,
                            .mp_counts_replicated = !r->mesh || dt_mesh_coord(r->mesh, DT_MESH_TP) == 0 };
    dt_gpt2_model(r->m, &ec.model);
    dt_status st = DT_OK;
    if (r->mesh && dt_mesh_size(r->mesh, DT_MESH_PP) > 1) {
        /* the pipeline before the engine: its hooks come before a data-parallel strategy's */
        dt_pipeline_config pc = { dt_mesh_comm(r->mesh, DT_MESH_PP), r->m, (dt_pp_kind)c->pp_schedule, dt_train_pp_virt(c), c->grad_accum, c->batch,
                                  r->T, next_batch, r };
        if ((st = dt_pipeline_create(&pc, &r->pipe))) return st;
        ec.schedule = dt_pipeline_schedule(r->pipe);
        ec.loss_comm = r->w;
        ec.mp_comm = r->mp;
    }
    st = dt_engine_create(&ec, &r->e);
    if (st || !c->resume) return st;
    dt_checkpoint_position pos;
    dt_checkpoint_model cm;
    dt_checkpoint_gpt2(r->m, &cm);
    if ((st = dt_checkpoint_resume(c->resume, r->nranks > 1 ? r->w : NULL, c, &cm, r->e, &pos))) return st;
    if (pos.step >= c->steps)
        return dt_error(DT_ERR_ARG, "--resume %s: the checkpoint is at step %d, and --steps is %d: nothing left to train", c->resume,
                        pos.step, c->steps);
    if (pos.data_tokens != dt_tokens_count(r->train))
        dt_log(DT_LOG_WARN, "--resume %s: saved reading %zu training tokens, --data has %zu", c->resume, pos.data_tokens,
               dt_tokens_count(r->train));
    r->first_step = pos.step;
    return dt_checkpoint_seek(&pos, r->tl, (size_t)c->batch * c->seq * r->dp_size, c->shuffle_seed != 0);
}

/* The model FLOPs of a step and the run's peak, for MFU (rank 0 reports them). */
/* The threads the peak counts: those asked for, but no more than the cores
 * of the machines the ranks run on (--nproc 4 --threads 2 on 2 cores can
 * do what 2 cores do, not 8 threads' worth). */
static int peak_threads(const run *r) {
    int asked = r->c.threads * r->nranks;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nodes = r->w && r->nranks > 1 ? dt_comm_nodes(r->w) : 1;
    long have = cores > 0 ? cores * nodes : asked;
    return asked < have ? asked : (int)have;
}

static void find_peak(run *r) {
    const dt_train_config *c = &r->c;
    r->flops_per_step = dt_gpt2_flops_per_token(dt_gpt2_get_config(r->m), c->seq) * c->batch * c->seq * c->grad_accum * r->dp_size;
    double per_thread;
    if (r->rank != 0 || (c->quiet && !c->metrics)) return;
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

static dt_status setup(run *r) {
    dt_train_config *c = &r->c;
    dt_status st = DT_OK;
    if (r->nranks > 1) {
        /* check_mesh has vetted the layout; dp 0 means the ranks tp x pp x cp leave */
        int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, cp = c->cp ? c->cp : 1;
        st = dt_mesh_create(r->w, c->dp ? c->dp : r->nranks / (tp * pp * cp), tp, pp, cp, &r->mesh);
    }
    r->T = r->mesh ? c->seq / dt_mesh_size(r->mesh, DT_MESH_CP) : c->seq;
    /* with a pipeline, the ranks of one replica's model (its TP x PP ranks): the norm's and the loss's group */
    if (!st && r->mesh && dt_mesh_size(r->mesh, DT_MESH_PP) > 1)
        st = dt_comm_split(r->w, dt_comm_rank(dt_mesh_replicas(r->mesh)), r->rank, &r->mp);
    r->dp_rank = r->mesh ? dt_mesh_coord(r->mesh, DT_MESH_DP) : 0;
    r->dp_size = r->mesh ? dt_mesh_size(r->mesh, DT_MESH_DP) : 1;
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
    size_t BT = (size_t)c->batch * c->seq;
    if (!st && (!(r->in = malloc(BT * 4)) || !(r->tg = malloc(BT * 4))))
        st = dt_error(DT_ERR_NOMEM, "out of memory for a batch of %zu tokens", BT);
    if (!st) st = dt_watchdog_start(r->nranks > 1 ? r->w : NULL, &r->wd);
    if (!st) find_peak(r);
    if (!st && r->mesh && (dt_mesh_size(r->mesh, DT_MESH_TP) > 1 || dt_mesh_size(r->mesh, DT_MESH_CP) > 1 || r->pipe)) st = print_placement(r);
    if (!st && r->pipe && r->rank == 0 && !c->quiet) print_stages(r);
    if (st || c->quiet) return st;
    const dt_gpt2_config *mc = dt_gpt2_get_config(r->m);
    printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %.2fM parameters; "
           "batch %d x %d x %d accumulation x %d data-parallel rank%s%s, %s, %s, %d thread%s per rank\n",
           c->shape.num_layers || c->shape.channels || c->shape.vocab_size || c->shape.num_heads ? "custom" : c->model,
           mc->num_layers, mc->num_heads, mc->channels, mc->vocab_size, mc->padded_vocab_size, dt_gpt2_config_num_params(mc) / 1e6,
           c->batch, c->seq, c->grad_accum, r->dp_size, r->dp_size == 1 ? "" : "s", tp_note(r), dt_engine_strategy_name(r->e),
           dt_optim_kind_name(c->opt.kind), dt_kernels_threads(), dt_kernels_threads() == 1 ? "" : "s");
    if (r->first_step) printf("resumed from %s at step %d\n", c->resume, r->first_step);
    /* what a 16-bit run gains on this CPU, so that nobody expects the speed of a bf16 GEMM that is not there */
    if (c->precision != DT_F32) {
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
    if (r->peak_gflops > 0)
        printf("MFU against %.1f GFLOP/s (%d thread%s x %.1f GFLOP/s %s per thread, %s%s); %.3f GFLOP per step\n",
               r->peak_gflops, r->peak_threads, r->peak_threads > 1 ? "s" : "", r->peak_gflops / r->peak_threads,
               r->peak_bf16 ? "bf16 GEMM" : "sgemm", r->peak_source,
               r->peak_threads < c->threads * r->nranks ? "; the cores there are, not the threads asked for" : "", r->flops_per_step / 1e9);
    return DT_OK;
}

/* Whether the engine's strategy shards the optimizer: then every rank saves its slice. */
static bool sharded(const run *r) {
    size_t off, n;
    dt_engine_share(r->e, &off, &n);
    return off != 0 || n != dt_gpt2_num_params(r->m);
}

/* The weights file: rank 0 writes the model, gathered first from the ranks'
 * parts when it is split (TP, PP: collective). */
static dt_status save_weights(run *r, int steps_done) {
    const char *path = r->c.save;
    size_t n = strlen(path);
    dt_gpt2 *whole = r->m;
    dt_status st = DT_OK;
    if (r->mesh && (dt_mesh_size(r->mesh, DT_MESH_TP) > 1 || dt_mesh_size(r->mesh, DT_MESH_PP) > 1))
        st = dt_mesh_gather_gpt2(r->mesh, r->w, r->m, &whole);
    if (!st && r->rank == 0) {
        double t0 = dt_time_now();
        DT_TRACE_BEGIN(DT_TRACK_IO, "weights write", "\"step\":%d,\"files\":1", steps_done);
        st = n > 12 && !strcmp(path + n - 12, ".safetensors") ? dt_safetensors_save(path, whole, DT_F32) : dt_llmc_save(path, whole);
        DT_TRACE_END(DT_TRACK_IO);
        struct stat sb;
        if (!st && stat(path, &sb) == 0) dt_io_count(DT_IO_CKPT_WRITE, (size_t)sb.st_size, dt_time_now() - t0);
    }
    if (whole != r->m) dt_gpt2_destroy(whole);
    return st;
}

/* Weights to FILE.bin / FILE.safetensors, or the full state to a directory;
 * the watchdog waits for it to be whole before it may end the rank. */
static dt_status save(run *r, int steps_done) {
    const char *path = r->c.save;
    dt_watchdog_hold(r->wd, 1);
    /* a sharded strategy's checkpoint: every rank writes its slices (ZeRO-3's
     * parameters too); a weights file: ZeRO-3's ranks gather their parameters,
     * a model in parts is gathered for rank 0 (collective) */
    bool tp = r->mesh && (dt_mesh_size(r->mesh, DT_MESH_TP) > 1 || dt_mesh_size(r->mesh, DT_MESH_PP) > 1); /* the model in parts */
    bool slices = dt_checkpoint_is_dir(path) && (sharded(r) || tp);
    dt_status st = slices ? DT_OK : dt_engine_materialize(r->e, 1);
    if (st || (r->rank != 0 && !slices && !tp)) {
        /* rank 0 writes what every rank holds */
    } else if (dt_checkpoint_is_dir(path)) {
        dt_checkpoint_position pos = { steps_done, 0, 0, (size_t)r->c.batch * r->c.seq * r->dp_size, dt_tokens_count(r->train) };
        dt_loader_position(r->tl, &pos.epoch, &pos.next);
        dt_checkpoint_model cm;
        dt_checkpoint_gpt2(r->m, &cm);
        st = dt_checkpoint_save(path, tp ? r->w : sharded(r) ? dt_engine_get_config(r->e)->comm : NULL, &r->c, r->nranks, &cm, r->e, &pos);
    } else {
        st = save_weights(r, steps_done);
    }
    dt_status back = slices ? DT_OK : dt_engine_materialize(r->e, 0);
    dt_watchdog_hold(r->wd, 0);
    return st ? st : back;
}

static void write_metrics(run *r, int step, float lr, const dt_step_result *s, double ms, double tps, bool eval, float val) {
    FILE *f = r->metrics;
    /* context parallelism's attention this step; its waits on the group are exposed communication */
    double cw = 0, ca = r->cp ? dt_cp_attention_seconds(r->cp, &cw) : 0;
    fprintf(f, "{\"step\":%d", step + 1);
    json_num(f, "loss", "%.6f", s->loss);
    fprintf(f, ",\"lr\":%.6g", lr);
    json_num(f, "grad_norm", "%.6f", s->norm);
    fprintf(f, ",\"ms\":%.3f,\"tok_per_s\":%.1f,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"optimizer_ms\":%.3f,"
            "\"compute_ms\":%.3f,\"comm_exposed_ms\":%.3f,\"data_ms\":%.3f", ms, tps, r->fwd * 1e3, r->bwd * 1e3, s->update_ms,
            (r->fwd + r->bwd - r->tp_comm - cw) * 1e3 - s->exposed_in_backward_ms + s->update_ms, s->exposed_ms + (r->tp_comm + cw) * 1e3,
            r->data * 1e3);
    if (r->tp_comm > 0) fprintf(f, ",\"tp_comm_ms\":%.3f", r->tp_comm * 1e3);
    if (r->cp) fprintf(f, ",\"cp_attention_ms\":%.3f,\"cp_wait_ms\":%.3f", ca * 1e3, cw * 1e3);
    if (r->pipe) fprintf(f, ",\"bubble\":%.4f,\"bubble_model\":%.4f", r->bubble, r->bubble_model);
    if (r->wgt > 0) fprintf(f, ",\"weight_grad_ms\":%.3f", r->wgt * 1e3);
    double gflops = r->flops_per_step / (ms / 1e3) / 1e9;
    fprintf(f, ",\"model_gflops\":%.2f", gflops);
    if (r->peak_gflops > 0) fprintf(f, ",\"mfu\":%.4f", gflops / r->peak_gflops);
    /* this rank's I/O so far (each rank's totals are in run.json) */
    uint64_t b[2];
    double t[2];
    dt_io_get(DT_IO_DATA_READ, &b[0], &t[0]);
    dt_io_get(DT_IO_CKPT_WRITE, &b[1], &t[1]);
    fprintf(f, ",\"data_read_bytes\":%llu,\"data_read_ms\":%.3f,\"ckpt_write_bytes\":%llu,\"ckpt_write_ms\":%.3f",
            (unsigned long long)b[0], t[0] * 1e3, (unsigned long long)b[1], t[1] * 1e3);
    /* the share of the update done inside backward (the rest is in optimizer_ms) */
    if (r->nranks > 1) fprintf(f, ",\"updated_in_backward\":%.3f", s->updated_in_backward);
    if (eval) json_num(f, "val_loss", "%.6f", val);
    if (s->skipped) fprintf(f, ",\"skipped\":true");
    if (dt_engine_loss_scale(r->e)) fprintf(f, ",\"loss_scale\":%.17g", s->loss_scale);
    fprintf(f, "}\n");
    fflush(f);
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
    if (r->metrics) write_metrics(r, step, lr, s, ms, tps, eval, val);
    if (!finite && !c->skip_nonfinite) {
        dt_log(DT_LOG_ERROR, "step %d: the %s is %s; stopping without saving (the last checkpoint, if any, is kept; "
               "--on-nonfinite skip skips such steps instead)", step + 1, isfinite(s->loss) ? "gradient norm" : "loss",
               isnan(isfinite(s->loss) ? s->norm : s->loss) ? "NaN" : "infinite");
        return 1;
    }
    if (s->skipped && !scaled_skip) dt_log(DT_LOG_WARN, "step %d: the %s is not finite; step skipped", step + 1, isfinite(s->loss) ? "gradient norm" : "loss");
    /* a checkpoint every save_every steps, atomically: a crash leaves the last one whole */
    if (c->save && c->save_every > 0 && (step + 1) % c->save_every == 0 && step + 1 < c->steps && !s->stop && save(r, step + 1)) {
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        return 1;
    }
    double mfu = r->peak_gflops > 0 ? r->flops_per_step / (ms / 1e3) / 1e9 / r->peak_gflops : 0;
    if (!c->quiet)
        dt_progress_print(r->tty, c->print_every ? c->print_every : 1,
                          &(dt_progress){ .step = step, .steps = c->steps, .first = r->first_step, .loss = s->loss, .lr = lr,
                                          .norm = s->norm, .skipped = s->skipped, .ms = ms, .rate = tps, .unit = "tok/s", .mfu = mfu,
                                          .elapsed = dt_time_now() - t_start, .val = eval ? val : NAN });
    return 0;
}

/* Bytes of parameters (with mixed precision's 16-bit copy) and gradients this rank holds. */
static void held(const run *r, size_t *params, size_t *grads) {
    dt_engine_held(r->e, params, grads);
    *params += dt_gpt2_lp_params_bytes(r->m);
}

/* Every rank's I/O counters and memory, on every rank (collective). */
static dt_status gather_ranks(run *r, double *all) {
    double mine[DT_RUN_RANK_FIELDS];
    for (int k = 0; k < 3; k++) {
        uint64_t b;
        dt_io_get((dt_io_kind)k, &b, &mine[2 * k + 1]);
        mine[2 * k] = (double)b;
    }
    size_t hp, hg;
    held(r, &hp, &hg);
    const double mem[6] = { (double)hp, (double)hg, (double)dt_optim_state_bytes(dt_engine_optim(r->e)), (double)dt_engine_buffer_bytes(r->e),
                            (double)dt_gpt2_activation_memory(r->m), (double)dt_peak_memory() };
    memcpy(mine + 6, mem, sizeof mem);
    if (r->nranks == 1) { memcpy(all, mine, sizeof mine); return DT_OK; }
    return dt_comm_allgather(r->w, mine, all, DT_RUN_RANK_FIELDS, DT_F64);
}

/* run.json and report.html into --report DIR (rank 0). */
static void write_report(run *r, int steps_done, const double *ranks) {
    const dt_train_config *c = &r->c;
    size_t np = dt_gpt2_config_num_params(dt_gpt2_get_config(r->m)); /* the whole model's, under TP too */
    dt_run_record rec = { .model = *dt_gpt2_get_config(r->m), .params = np, .nranks = r->nranks, .steps_done = steps_done,
                          .strategy = dt_engine_strategy_name(r->e), .metrics = c->metrics, .trace = c->trace,
                          .peak_source = r->peak_source, .peak_gflops = r->peak_gflops, .flops_per_step = r->flops_per_step,
                          .wall_s = dt_time_now() - r->t_start, .ranks = ranks };
    size_t hp, hg;
    held(r, &hp, &hg);
    double mem[5] = { (double)hp, (double)hg, (double)dt_gpt2_activation_memory(r->m), (double)dt_optim_state_bytes(dt_engine_optim(r->e)),
                      (double)dt_peak_memory() };
    memcpy(rec.memory, mem, sizeof mem);
    char path[4200], html[4200];
    snprintf(path, sizeof path, "%s/run.json", c->report);
    snprintf(html, sizeof html, "%s/report.html", c->report);
    if (dt_run_record_write(path, c, &rec) || dt_report_write(c->report, html))
        dt_log(DT_LOG_WARN, "the report was not written (the training is done and saved): %s", dt_last_error());
    else if (!c->quiet) printf("report: %s\n", html);
}

/* After the last step: the trace, every rank's I/O, the report. A failure
 * here warns: the training itself is done. */
static void observe_end(run *r, int steps_done) {
    const dt_train_config *c = &r->c;
    if (r->trace && dt_trace_file_write(r->trace)) dt_log(DT_LOG_WARN, "the trace was not written: %s", dt_last_error());
    else if (r->trace && r->rank == 0 && !c->quiet) printf("trace: %s (steps %d to %d)\n", c->trace, c->trace_first, c->trace_last);
    double *all = calloc((size_t)r->nranks * DT_RUN_RANK_FIELDS, sizeof *all);
    if (!all || gather_ranks(r, all)) { dt_log(DT_LOG_WARN, "per-rank figures: %s", all ? dt_last_error() : "out of memory"); free(all); return; }
    if (r->rank == 0 && !c->quiet) {
        printf("memory per rank (MiB): parameters, gradients, optimizer state, communication buffers, activations; peak resident\n");
        for (int k = 0; k < r->nranks; k++) {
            const double *v = all + (size_t)k * DT_RUN_RANK_FIELDS, M = 1048576.0;
            printf("  rank %d: %.1f, %.1f, %.1f, %.1f, %.1f; peak %.1f\n", k, v[6] / M, v[7] / M, v[8] / M, v[9] / M, v[10] / M, v[11] / M);
        }
        printf("activations kept from forward for backward (rank 0): %.1f MiB; the rest of them is one block's working set, "
               "the gradients in flight and scratch\n", dt_gpt2_activation_kept(r->m) / 1048576.0);
        for (int k = 0; k < r->nranks; k++) {
            const double *v = all + (size_t)k * DT_RUN_RANK_FIELDS;
            printf("I/O rank %d: read %.2f MiB of tokens in %.1f ms, wrote %.2f MiB of checkpoints in %.1f ms\n", k, v[0] / 1048576.0,
                   v[1] * 1e3, v[2] / 1048576.0, v[3] * 1e3);
        }
    }
    if (r->rank == 0 && c->report) write_report(r, steps_done, all);
    free(all);
}

/* The end of a run: the replicas agree, the final save, the memory report. */
static int finish(run *r, int steps_done, int stop_signal) {
    const dt_train_config *c = &r->c;
    if (r->tty) printf("\n");
    uint64_t hash;
    int checked;
    if (dt_engine_check_replicas(r->e, &checked, &hash)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
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
        if (save(r, steps_done)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
        if (!c->quiet) printf("saved %s (step %d)\n", c->save, steps_done);
    }
    if (!c->quiet)
        printf("peak memory %.1f MiB (model %.1f MiB: parameters, gradients, activations%s; optimizer state %.1f MiB)\n",
               dt_peak_memory() / 1048576.0, dt_gpt2_memory(r->m) / 1048576.0, c->recompute ? " with --recompute" : "",
               dt_optim_state_bytes(dt_engine_optim(r->e)) / 1048576.0);
    observe_end(r, steps_done);
    return stop_signal ? 128 + stop_signal : 0;
}

/* A pipeline step's forward and backward seconds (this stage's) and its
 * bubble (collective over the stages). */
static dt_status pipeline_times(run *r) {
    dt_pipeline_times(r->pipe, &r->fwd, &r->bwd, &r->wgt);
    r->bwd += r->wgt; /* zb1's W: backward's other half */
    return dt_pipeline_bubble(r->pipe, &r->bubble, &r->bubble_model);
}

/* The loop: one engine step per iteration, everything else in after_step. */
/* --steps 0: the model's validation loss, every rank's share averaged. */
static int evaluate_only(run *r) {
    const dt_train_config *c = &r->c;
    float val;
    double t0 = dt_time_now();
    if (evaluate(r, &val)) {
        dt_log(DT_LOG_ERROR, "evaluation: %s", dt_last_error());
        return 1;
    }
    if (r->rank == 0)
        printf("validation loss %.4f (%s: %d batch%s of %d x %d tokens on each of %d rank%s, %.1f s)\n", val, c->val_data,
               c->eval_batches, c->eval_batches == 1 ? "" : "es", c->batch, c->seq, r->dp_size, r->dp_size == 1 ? "" : "s",
               dt_time_now() - t0);
    return isfinite(val) ? 0 : 1;
}

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
        dt_status st = dt_engine_step(r->e, c->grad_accum, lr, micro, r, dt_train_interrupted(), &s);
        DT_TRACE_END(DT_TRACK_COMPUTE);
        if (!st && r->pipe) st = pipeline_times(r);
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
    dt_engine_destroy(r->e);
    dt_pipeline_destroy(r->pipe);
    dt_comm_destroy(r->mp);
    dt_cp_destroy(r->cp);
    dt_mesh_destroy(r->mesh);
    dt_loader_destroy(r->tl);
    dt_loader_destroy(r->vl);
    dt_tokens_close(r->train);
    dt_tokens_close(r->val);
    dt_gpt2_destroy(r->m);
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

/* --report DIR: the metrics and a trace of a few steps go there unless
 * named elsewhere; --trace alone records steps 1 to 10 unless told. */
static dt_status observers(run *r) {
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

static int run_rank(const dt_train_config *c0, dt_comm *w, dt_launch_kind kind) {
    if (dt_train_check_mesh(c0, w ? dt_comm_size(w) : 1, 0)) return fail(2);
    if (!strncmp(c0->model, "mlp", 3) || !strncmp(c0->model, "resnet", 6)) {
        dt_kernels_set_threads(c0->threads > 0 ? c0->threads : dt_train_default_threads(w));
        dt_train_config ic = *c0;
        if (!ic.epochs) ic.epochs = 5;
        return dt_classify_run(&ic, w);
    }
    run r = { .c = *c0, .w = w, .rank = w ? dt_comm_rank(w) : 0, .nranks = w ? dt_comm_size(w) : 1 };
    if (r.c.threads <= 0) r.c.threads = dt_train_default_threads(w);
    if (observers(&r)) return fail(2);
    /* one voice; save stays: a sharded optimizer is saved by every rank (save() says who writes) */
    if (r.rank != 0) { r.c.quiet = 1; r.c.metrics = NULL; }
    if (dt_train_check_settings(&r.c, r.nranks)) return fail(2);
    dt_kernels_set_threads(r.c.threads);
    r.tty = isatty(STDOUT_FILENO) && !r.c.quiet && kind != DT_LAUNCH_MPI;
    int rc = setup(&r) ? (r.rank != 0 && refused_alike ? 1 : fail(1)) : train_loop(&r);
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
    if (!in_job && dt_train_check_mesh(c, c->nproc, 0)) return fail(2);
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
