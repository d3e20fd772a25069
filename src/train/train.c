/* The training loop: for each step, grad_accum micro-batches of forward and
 * backward, global gradient norm and clipping, the learning-rate schedule,
 * one optimizer update; progress on the terminal, one JSON line per step in
 * the metrics file, validation every eval_every steps, an atomic save at
 * the end. */
#include "dtrain/train.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"

#include <limits.h>
#include <math.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
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
    c->bucket_mb = 25;
    c->epochs = 5;
    c->stall_timeout = DT_STALL_TIMEOUT_DEFAULT;
    dt_optim_defaults(DT_OPT_ADAMW, &c->opt);
    dt_schedule_defaults(&c->sched);
}

size_t dt_peak_memory(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static dt_status build_model(const dt_train_config *c, dt_gpt2 **out) {
    dt_gpt2_config cfg;
    dt_status st;
    bool from_file = access(c->model, R_OK) == 0;
    /* shape flags override a preset; for a file they must agree with it */
    const dt_gpt2_config *o = &c->shape;
    const int v[6] = { o->max_seq_len, o->vocab_size, o->padded_vocab_size, o->num_layers, o->num_heads, o->channels };
    static const char *names[6] = { "--max-seq", "--vocab", "--padded-vocab", "--layers", "--heads", "--channels" };
    if (from_file) {
        if ((st = dt_model_load(c->model, o->num_heads, out))) return st;
        cfg = *dt_gpt2_get_config(*out);
    } else if (dt_gpt2_preset(c->model, &cfg)) {
        return dt_error(DT_ERR_ARG, "--model %s: %s", c->model,
                        strchr(c->model, '/') || strchr(c->model, '.') ? "no such file (nor a preset: d6, 124M, 350M, 774M, 1558M, mlp)"
                                                                       : "not a preset (d6, 124M, 350M, 774M, 1558M, mlp) nor a file");
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
    if (c->seq > cfg.max_seq_len) {
        dt_gpt2_destroy(*out);
        *out = NULL;
        return dt_error(DT_ERR_ARG, "--seq %d is longer than the model's %d positions", c->seq, cfg.max_seq_len);
    }
    if (!from_file) {
        if ((st = dt_gpt2_create(&cfg, out))) return st;
        dt_gpt2_init_random(*out, c->seed);
    }
    dt_gpt2_set_recompute(*out, c->recompute);
    dt_gpt2_set_attention(*out, (dt_attn_mode)c->attention);
    return DT_OK;
}

/* .safetensors (HF layout, f32) or llm.c by the file name. */
/* The watchdog waits for the file to be whole before it may end the rank. */
static dt_status save_model(const char *path, dt_gpt2 *m, dt_watchdog *wd) {
    size_t n = strlen(path);
    dt_watchdog_hold(wd, 1);
    dt_status st = n > 12 && !strcmp(path + n - 12, ".safetensors") ? dt_safetensors_save(path, m, DT_F32) : dt_llmc_save(path, m);
    dt_watchdog_hold(wd, 0);
    return st;
}

static dt_status evaluate(dt_comm *w, dt_gpt2 *m, dt_loader *l, int batches, int B, int T, int32_t *in, int32_t *tg,
                          float *out) {
    double sum = 0;
    dt_loader_reset(l);
    for (int i = 0; i < batches; i++) {
        float loss = 0;
        dt_loader_next(l, in, tg);
        dt_status st = dt_gpt2_forward(m, in, tg, B, T, &loss);
        if (st) return st;
        sum += loss;
    }
    float mean = (float)(sum / batches);
    *out = mean;
    return w ? dt_comm_allreduce(w, &mean, out, 1, DT_F32, DT_AVG) : DT_OK;
}

/* A JSON number, or null when it is not finite (JSON has no NaN). */
static void json_num(FILE *f, const char *key, const char *fmt, double v) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

/* Settings that would do nothing, or contradict each other: said before any work. */
static dt_status check_settings(dt_train_config *c, int nranks) {
    if (c->train_batch_size && c->train_batch_size != c->batch * c->grad_accum * nranks)
        return dt_error(DT_ERR_ARG, "train_batch_size %d must equal micro-batch %d x gradient accumulation %d x %d data-parallel "
                        "ranks = %d", c->train_batch_size, c->batch, c->grad_accum, nranks, c->batch * c->grad_accum * nranks);
    if (c->save_every && !c->save) dt_log(DT_LOG_WARN, "--save-every %d does nothing without --save FILE", c->save_every);
    if (c->eval_every && !c->val_data) dt_log(DT_LOG_WARN, "--eval-every %d does nothing without --val-data FILE", c->eval_every);
    if (c->sched.warmup >= c->steps && c->sched.kind <= DT_SCHED_COSINE)
        dt_log(DT_LOG_WARN, "--warmup %d is not shorter than the %d steps: the learning rate never reaches --lr", c->sched.warmup,
               c->steps);
    /* skipping a step needs the norm before any update, so the update waits for the end of backward */
    if (c->skip_nonfinite) c->step_at_end = 1;
    if (c->save) return dt_file_check_writable(c->save);
    return DT_OK;
}

/* What every rank must agree on, compared against rank 0's. */
typedef struct {
    dt_gpt2_config model;
    int32_t batch, seq, steps, grad_accum, optimizer, eval_every;
    int64_t train_tokens, val_tokens;
    float lr;
} job_shape;

static dt_status check_same(dt_comm *w, const job_shape *mine) {
    int p = dt_comm_size(w);
    job_shape *all = malloc(sizeof *all * (size_t)p);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory");
    _Static_assert(sizeof(job_shape) % 4 == 0, "job_shape travels as int32 words");
    dt_status st = dt_comm_allgather(w, mine, all, sizeof *mine / 4, DT_I32);
    for (int r = 1; !st && r < p; r++) {
        const job_shape *a = &all[0], *b = &all[r];
        if (memcmp(&a->model, &b->model, sizeof a->model))
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 has a model with %d layers, %d channels, vocab %d; rank %d has %d layers, "
                          "%d channels, vocab %d", a->model.num_layers, a->model.channels, a->model.vocab_size, r,
                          b->model.num_layers, b->model.channels, b->model.vocab_size);
        else if (a->batch != b->batch || a->seq != b->seq || a->grad_accum != b->grad_accum)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 has batch %d x %d x %d, rank %d has %d x %d x %d", a->batch, a->seq,
                          a->grad_accum, r, b->batch, b->seq, b->grad_accum);
        else if (a->train_tokens != b->train_tokens || a->val_tokens != b->val_tokens)
            st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 reads %lld training tokens, rank %d reads %lld (different data files?)",
                          (long long)a->train_tokens, r, (long long)b->train_tokens);
        else if (a->steps != b->steps || a->optimizer != b->optimizer || a->lr != b->lr || a->eval_every != b->eval_every)
            st = dt_error(DT_ERR_ARG, "ranks differ in steps, optimizer, learning rate or evaluation (rank 0 vs rank %d)", r);
    }
    free(all);
    return st;
}

/* --threads 0: the cores this rank may use (its affinity mask, or Slurm's
 * cpus-per-task) shared among the ranks on this machine when the mask is the
 * whole machine, so that ranks x threads never oversubscribes by default. */
static int default_threads(dt_comm *w) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
    const char *slurm = getenv("SLURM_CPUS_PER_TASK");
    if (slurm && atoi(slurm) > 0 && atoi(slurm) < mine) return atoi(slurm);
    int sharing = w && mine >= online ? dt_comm_local_size(w) : 1;
    return mine / sharing > 0 ? mine / sharing : 1;
}

/* Progress: one line per step where stdout is not a terminal of our own
 * (a file, a pipe, or mpirun's pty, whose \r-joined lines would make one
 * huge log line); on a terminal one line redrawn in place, fitted to its width. */
static void progress(bool tty, int step, int steps, float loss, float lr, double norm, double ms, double tps, double elapsed,
                     float val) {
    int eta = (int)(elapsed / (step + 1) * (steps - step - 1));
    char line[256];
    int n = snprintf(line, sizeof line, "step %d/%d loss %.4f lr %.2e norm %.3f %.0f ms %.0f tok/s ETA %dm%02ds", step + 1, steps,
                     loss, lr, norm, ms, tps, eta / 60, eta % 60);
    if (!tty) printf("%s\n", line);
    else {
        struct winsize ws;
        int cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
        int width = cols - 1 - n - 3, done;
        if (width > 24) width = 24;
        if (n > cols - 1) line[cols > 1 ? cols - 1 : 0] = 0, n = cols - 1;
        char bar[32] = "";
        if (width >= 8) {
            done = (int)((double)(step + 1) / steps * width);
            for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
            bar[width] = 0;
        }
        printf("\r%s%s%s%s\033[K", line, bar[0] ? " [" : "", bar, bar[0] ? "]" : "");
    }
    if (!isnan(val)) printf("%sval loss %.4f\n", tty ? "\n" : "", val);
    fflush(stdout);
}

/* --dp x --tp x --pp must be the job's ranks; only data parallelism exists so far. */
static dt_status check_mesh(const dt_train_config *c, int nranks) {
    int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, dp = c->dp ? c->dp : (nranks % (tp * pp) ? 0 : nranks / (tp * pp));
    if (!c->dp && !dp)
        return dt_error(DT_ERR_ARG, "--tp %d x --pp %d = %d does not divide the job's %d rank%s", tp, pp, tp * pp, nranks,
                        nranks == 1 ? "" : "s");
    if ((long)dp * tp * pp != nranks)
        return dt_error(DT_ERR_ARG, "--dp %d x --tp %d x --pp %d = %ld, but the job has %d rank%s", dp, tp, pp, (long)dp * tp * pp,
                        nranks, nranks == 1 ? "" : "s");
    if (tp > 1 || pp > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "--tp %d --pp %d: tensor and pipeline parallelism are not built yet (--tp 1 --pp 1)", tp, pp);
    return DT_OK;
}

int dt_train_run(const dt_train_config *c0) {
    dt_launch_kind kind;
    if (dt_comm_detect_launch(&kind)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 2; }
    bool in_job = kind != DT_LAUNCH_NONE;
    if (c0->nproc > 1 && kind == DT_LAUNCH_MPI) {
        dt_log(DT_LOG_ERROR, "--nproc %d inside an mpirun/srun job: the job's ranks are the ranks (drop --nproc, or give "
               "mpirun -np / srun -n the count)", c0->nproc);
        return 2;
    }
    if (!in_job && check_mesh(c0, c0->nproc)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 2; }
    if (c0->nproc > 1 && !in_job) {
        /* Data parallel on this machine: the same command line, once per rank. */
        if (!c0->argv) { dt_log(DT_LOG_ERROR, "train: --nproc needs the command line to re-run"); return 2; }
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) { dt_log(DT_LOG_ERROR, "train: cannot find my own executable"); return 1; }
        self[n] = 0;
        c0->argv[0] = self;
        return dt_comm_launch(c0->nproc, c0->argv);
    }
    dt_comm *w = NULL;
    if (in_job && dt_comm_init(&w)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    dt_comm_set_stall_timeout(w, c0->stall_timeout);
    if (w && check_mesh(c0, dt_comm_size(w))) {
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        dt_comm_destroy(w);
        return 2;
    }
    if (!strncmp(c0->model, "mlp", 3)) {
        dt_kernels_set_threads(c0->threads > 0 ? c0->threads : default_threads(w));
        int rc = dt_classify_run(c0, w);
        dt_comm_destroy(w);
        return rc;
    }
    int rank = w ? dt_comm_rank(w) : 0, nranks = w ? dt_comm_size(w) : 1;
    dt_train_config cc = *c0;
    const dt_train_config *c = &cc;
    if (cc.threads <= 0) cc.threads = default_threads(w);
    if (rank != 0) { cc.quiet = 1; cc.metrics = NULL; cc.save = NULL; } /* one voice */
    if (check_settings(&cc, nranks)) {
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        dt_comm_destroy(w);
        return 2;
    }
    dt_kernels_set_threads(c->threads);
    dt_ddp *ddp = NULL;
    dt_watchdog *wd = NULL;
    dt_gpt2 *m = NULL;
    dt_tokens *train = NULL, *val = NULL;
    dt_loader *tl = NULL, *vl = NULL;
    dt_optim *opt = NULL;
    FILE *metrics = NULL;
    int32_t *in = NULL, *tg = NULL;
    int rc = 1;
    dt_status st = build_model(c, &m);
    if (!st && !c->data) st = dt_error(DT_ERR_ARG, "--data FILE is required (a token file: see dtrain tokenize)");
    if (!st) st = dt_tokens_open(c->data, &train);
    const dt_gpt2_config *mc = m ? dt_gpt2_get_config(m) : NULL;
    if (!st) st = dt_tokens_check_vocab(train, mc->vocab_size);
    if (!st && rank == 0 && mc->vocab_size > 256 && dt_tokens_max(train) < 256)
        dt_log(DT_LOG_WARN, "%s: every token is below 256 (byte-level data?) but the model's vocabulary is %d: "
               "--vocab 256 makes a smaller, faster model whose samples print as text", c->data, mc->vocab_size);
    if (!st) st = dt_loader_create(train, c->batch, c->seq, rank, nranks, c->shuffle_seed, &tl);
    if (!st && c->val_data) {
        st = dt_tokens_open(c->val_data, &val);
        if (!st) st = dt_tokens_check_vocab(val, mc->vocab_size);
        if (!st) st = dt_loader_create(val, c->batch, c->seq, rank, nranks, 0, &vl);
    }
    if (w && !st) {
        job_shape js;
        memset(&js, 0, sizeof js);
        js.model = *mc;
        js.batch = c->batch; js.seq = c->seq; js.steps = c->steps; js.grad_accum = c->grad_accum;
        js.optimizer = (int32_t)c->opt.kind; js.eval_every = c->eval_every; js.lr = c->sched.lr;
        js.train_tokens = (int64_t)dt_tokens_count(train);
        js.val_tokens = val ? (int64_t)dt_tokens_count(val) : 0;
        st = check_same(w, &js);
    }
    if (w && !st && nranks > 1) st = dt_ddp_create(w, m, 1u << 20, (size_t)(c->bucket_mb * 1048576.0), &ddp);
    size_t np = m ? dt_gpt2_num_params(m) : 0;
    dt_tensor_span spans[DT_GPT2_NTENSORS];
    for (int i = 0; m && i < DT_GPT2_NTENSORS; i++) dt_gpt2_tensor(m, i, NULL, &spans[i].offset, &spans[i].count);
    if (!st) st = dt_optim_create(&c->opt, np, spans, DT_GPT2_NTENSORS, &opt);
    /* bucket by bucket inside backward, unless clipping needs the whole norm first */
    if (!st && ddp && !c->step_at_end && dt_optim_elementwise(opt) && !(c->grad_clip > 0))
        st = dt_ddp_set_optimizer(ddp, opt, dt_gpt2_params(m));
    if (!st && c->metrics && !(metrics = fopen(c->metrics, "w")))
        st = dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }

    size_t BT = (size_t)c->batch * c->seq;
    in = malloc(BT * 4);
    tg = malloc(BT * 4);
    if (!in || !tg) { dt_log(DT_LOG_ERROR, "out of memory for a batch of %zu tokens", BT); goto out; }
    bool tty = isatty(STDOUT_FILENO) && !c->quiet && kind != DT_LAUNCH_MPI;
    if (!st && (st = dt_watchdog_start(nranks > 1 ? w : NULL, &wd))) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (!c->quiet)
        printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %.2fM parameters; "
               "batch %d x %d x %d accumulation x %d ranks, %s, %d threads per rank\n",
               c->shape.num_layers || c->shape.channels || c->shape.vocab_size || c->shape.num_heads ? "custom" : c->model,
               mc->num_layers, mc->num_heads, mc->channels, mc->vocab_size, mc->padded_vocab_size, np / 1e6,
               c->batch, c->seq, c->grad_accum, nranks, dt_optim_kind_name(c->opt.kind), dt_kernels_threads());
    double t_start = dt_time_now();
    float val_loss = -1;
    int step = 0, stop_signal = 0;
    dt_train_catch_signals();
    for (; step < c->steps && !stop_signal; step++) {
        double t0 = dt_time_now(); /* gradients start at zero: the optimizer zeroes them as it goes */
        double loss_sum = 0, fwd = 0, bwd = 0;
        float lr = dt_lr_at(&c->sched, c->steps, step);
        dt_comm_set_progress(w, step + 1);
        for (int k = 0; k < c->grad_accum && !st; k++) {
            float loss = 0;
            dt_loader_next(tl, in, tg);
            if (ddp) dt_ddp_begin(ddp, k == c->grad_accum - 1, lr); /* only the last micro-step synchronises */
            double ta = dt_time_now();
            st = dt_gpt2_forward(m, in, tg, c->batch, c->seq, &loss);
            double tb = dt_time_now();
            if (!st) st = dt_gpt2_backward(m, 1.0f / c->grad_accum);
            fwd += tb - ta;
            bwd += dt_time_now() - tb;
            loss_sum += loss;
        }
        double exposed = 0, norm = -1, to = dt_time_now();
        if (!st && ddp) st = dt_ddp_finish(ddp, &exposed, &norm);
        /* the loss one rank with the global batch would see, and whether any rank was asked to stop: one allreduce */
        float agree[2] = { (float)(loss_sum / c->grad_accum), (float)dt_train_interrupted() };
        if (!st && w && nranks > 1) st = dt_comm_allreduce(w, agree, agree, 2, DT_F32, DT_SUM);
        if (st) { dt_log(DT_LOG_ERROR, "step %d: %s", step + 1, dt_last_error()); goto out; }
        float loss = nranks > 1 ? agree[0] / nranks : agree[0];
        stop_signal = agree[1] > 0 ? (dt_train_interrupted() ? dt_train_interrupted() : SIGTERM) : 0;
        bool skipped = false;
        if (norm < 0) {
            float *g = dt_gpt2_grads(m);
            if (c->skip_nonfinite) norm = dt_grad_norm(g, np); /* before the update: it may have to be skipped */
            if (c->skip_nonfinite && !(isfinite(loss) && isfinite(norm))) {
                memset(g, 0, np * sizeof *g);
                skipped = true;
            } else norm = dt_optim_step_clipped(opt, dt_gpt2_params(m), g, lr, c->grad_clip);
        }
        double opt_ms = (dt_time_now() - to) * 1e3 - exposed;
        double ms = (dt_time_now() - t0) * 1e3, tps = BT * c->grad_accum * nranks / (ms / 1e3);
        bool finite = isfinite(loss) && isfinite(norm);
        /* --val-data alone evaluates at the end */
        bool eval = vl && finite && ((c->eval_every > 0 && (step + 1) % c->eval_every == 0) || step + 1 == c->steps);
        if (eval && (st = evaluate(nranks > 1 ? w : NULL, m, vl, c->eval_batches, c->batch, c->seq, in, tg, &val_loss))) {
            dt_log(DT_LOG_ERROR, "step %d, evaluation: %s", step + 1, dt_last_error());
            goto out;
        }
        if (metrics) {
            fprintf(metrics, "{\"step\":%d", step + 1);
            json_num(metrics, "loss", "%.6f", loss);
            fprintf(metrics, ",\"lr\":%.6g", lr);
            json_num(metrics, "grad_norm", "%.6f", norm);
            fprintf(metrics, ",\"ms\":%.3f,\"tok_per_s\":%.1f,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"optimizer_ms\":%.3f,"
                    "\"compute_ms\":%.3f,\"comm_exposed_ms\":%.3f", ms, tps, fwd * 1e3, bwd * 1e3, opt_ms,
                    (fwd + bwd) * 1e3 + opt_ms, exposed);
            /* the share of the update done inside backward (the rest is in optimizer_ms) */
            if (ddp) fprintf(metrics, ",\"updated_in_backward\":%.3f", dt_ddp_updated_in_backward(ddp));
            if (eval) json_num(metrics, "val_loss", "%.6f", val_loss);
            if (skipped) fprintf(metrics, ",\"skipped\":true");
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        if (!finite && !c->skip_nonfinite) {
            dt_log(DT_LOG_ERROR, "step %d: the %s is %s; stopping without saving (the last checkpoint, if any, is kept; "
                   "--on-nonfinite skip skips such steps instead)", step + 1, isfinite(loss) ? "gradient norm" : "loss",
                   isnan(isfinite(loss) ? norm : loss) ? "NaN" : "infinite");
            goto out;
        }
        if (skipped) dt_log(DT_LOG_WARN, "step %d: the %s is not finite; step skipped", step + 1, isfinite(loss) ? "gradient norm" : "loss");
        /* a checkpoint every save_every steps, atomically: a crash leaves the last one whole */
        if (c->save && c->save_every > 0 && (step + 1) % c->save_every == 0 && step + 1 < c->steps && !stop_signal &&
            save_model(c->save, m, wd)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            goto out;
        }
        if (!c->quiet) progress(tty, step, c->steps, loss, lr, norm, ms, tps, dt_time_now() - t_start, eval ? val_loss : NAN);
    }
    if (tty) printf("\n");
    uint64_t hash;
    if (ddp && (st = dt_ddp_check_replicas(w, dt_gpt2_params(m), np, &hash))) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (ddp && !c->quiet) printf("weights identical on all %d ranks (hash %016llx)\n", nranks, (unsigned long long)hash);
    if (stop_signal && rank == 0)
        dt_log(DT_LOG_WARN, "stopped by signal %d (%s) after step %d of %d%s", stop_signal, strsignal(stop_signal), step,
               c->steps, c->save ? "; saving" : " (nothing saved: no --save)");
    if (c->save) {
        if (save_model(c->save, m, wd)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
        if (!c->quiet) printf("saved %s (step %d)\n", c->save, step);
    }
    if (!c->quiet) {
        printf("peak memory %.1f MiB (model %.1f MiB: parameters, gradients, activations%s; optimizer state %.1f MiB)\n",
               dt_peak_memory() / 1048576.0, dt_gpt2_memory(m) / 1048576.0, c->recompute ? " with --recompute" : "",
               dt_optim_state_bytes(opt) / 1048576.0);
    }
    rc = stop_signal ? 128 + stop_signal : 0;
out:
    dt_watchdog_stop(wd);
    if (metrics) fclose(metrics);
    dt_ddp_destroy(ddp);
    dt_optim_destroy(opt);
    dt_loader_destroy(tl);
    dt_loader_destroy(vl);
    dt_tokens_close(train);
    dt_tokens_close(val);
    dt_gpt2_destroy(m);
    dt_comm_destroy(w);
    free(in);
    free(tg);
    return rc;
}
