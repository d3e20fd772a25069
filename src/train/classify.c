/* Image classification training (dtrain train --model mlp | resnet...): an
 * MLP or a ResNet on an IDX image set (Fashion-MNIST from Debian's
 * dataset-fashion-mnist by default), driven by the same engine as GPT-2, so under the same parallel
 * strategies (data parallelism: each layer's bucket averaged as backward
 * finishes it). A distributed sampler gives every rank its own part of each
 * global batch: one permutation per epoch (the same on every rank), global
 * batch k = permutation[k*G .. (k+1)*G), micro-batch j of it takes the j-th
 * N*B, and rank r the r-th B of that, so N ranks of batch B see what one
 * rank of batch N*B sees. A ResNet's BatchNorm normalises each rank's
 * batch by its own statistics, or with --sync-bn by the statistics of every
 * rank's batch (torch.nn.SyncBatchNorm); before each evaluation every rank
 * takes rank 0's running averages, as PyTorch DDP's broadcast_buffers does
 * before each forward. Throughput is reported as the Horovod benchmark
 * does: images/s per worker and in total.
 *
 * A ResNet's run saves full-state checkpoints as GPT-2's does (--save DIR,
 * --save-every, --stop-after, SIGINT/SIGTERM; checkpoint_write.c), with the
 * BatchNorm running averages beside the parameters; its place is the
 * global step, whose epoch and batch follow from the images per step, and
 * each epoch's order from the shuffle seed, so a resumed run takes the
 * uninterrupted one's steps. */
#include "dtrain/data.h"
#include "dtrain/kernels.h"
#include "dtrain/engine.h"
#include "dtrain/io.h"
#include "dtrain/obs.h"
#include "dtrain/train.h"
#include "classify_report.h"
#include "precond_setup.h"
#include "progress.h"

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* "mlp" (hidden 256,128) or "mlp:H1,H2,...". */
static dt_status parse_hidden(const char *spec, int *sizes, int *n) {
    const char *p = spec + 3;
    *n = 1; /* sizes[0]: the inputs, filled in later */
    if (!*p) { sizes[(*n)++] = 256; sizes[(*n)++] = 128; return DT_OK; }
    if (*p++ != ':') return dt_error(DT_ERR_ARG, "--model %s: expected mlp or mlp:H1,H2,... (hidden layer sizes)", spec);
    while (*p) {
        char *e;
        long h = strtol(p, &e, 10);
        if (e == p || h < 1 || h > 65536 || *n >= 15 || (*e && *e != ','))
            return dt_error(DT_ERR_ARG, "--model %s: hidden sizes must be 1..65536, at most 14 of them", spec);
        sizes[(*n)++] = (int)h;
        p = *e ? e + 1 : e;
    }
    return DT_OK;
}

/* The model being trained, the MLP or a ResNet, behind one face. */
typedef struct {
    dt_mlp *mlp;
    dt_resnet *resnet;
} classifier;

static dt_status cls_forward(classifier *m, const float *x, const int32_t *y, int B, bool train, float *loss, int *correct) {
    return m->mlp ? dt_mlp_forward(m->mlp, x, y, B, loss, correct) : dt_resnet_forward(m->resnet, x, y, B, train, loss, correct);
}

static dt_status cls_backward(classifier *m, float scale) {
    return m->mlp ? dt_mlp_backward(m->mlp, scale) : dt_resnet_backward(m->resnet, scale);
}

static size_t cls_params(const classifier *m) { return m->mlp ? dt_mlp_num_params(m->mlp) : dt_resnet_num_params(m->resnet); }

/* Synchronised BatchNorm: the sums over every rank's batch. */
static dt_status sum_over_ranks(double *sums, size_t n, void *w) { return dt_comm_allreduce(w, sums, sums, n, DT_F64, DT_SUM); }

/* Accuracy over the test set, each rank on its share, summed. */
static double test_accuracy(dt_comm *w, classifier *m, const dt_images *t, int B, float *x, int32_t *y) {
    int rank = w ? dt_comm_rank(w) : 0, p = w ? dt_comm_size(w) : 1;
    int lo = (int)((long)t->n * rank / p), hi = (int)((long)t->n * (rank + 1) / p);
    double c[2] = { 0, 0 }, all[2];
    for (int i = lo; i < hi; i += B) {
        int b = hi - i < B ? hi - i : B, correct = 0;
        memcpy(x, t->x + (size_t)i * t->dim, (size_t)b * t->dim * sizeof(float));
        memcpy(y, t->y + i, (size_t)b * sizeof(int32_t));
        if (cls_forward(m, x, y, b, false, NULL, &correct)) return -1;
        c[0] += correct;
        c[1] += b;
    }
    if (w && dt_comm_allreduce(w, c, all, 2, DT_F64, DT_SUM)) return -1;
    if (!w) { all[0] = c[0]; all[1] = c[1]; }
    return all[0] / all[1];
}

/* Every rank must train the same thing on the same data: each compares
 * every rank with rank 0 (one allgather), so all fail together. */
static dt_status check_same(dt_comm *w, const dt_images *tr, const dt_images *te, int B, int epochs, size_t np) {
    enum { K = 6 };
    static const char *what[K] = { "training images", "test images", "pixels per image", "batch", "epochs", "parameters" };
    int p = dt_comm_size(w);
    int64_t mine[K] = { tr->n, te->n, tr->dim, B, epochs, (int64_t)np }, *all = malloc(sizeof mine * (size_t)p);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_status st = dt_comm_allgather(w, mine, all, K, DT_I64);
    for (int r = 1; !st && r < p; r++)
        for (int i = 0; !st && i < K; i++)
            if (all[(size_t)r * K + i] != all[i])
                st = dt_error(DT_ERR_ARG, "ranks differ: rank 0 has %lld %s, rank %d has %lld", (long long)all[i], what[i], r,
                              (long long)all[(size_t)r * K + i]);
    free(all);
    return st;
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

typedef struct {
    const dt_train_config *c;
    dt_comm *w;
    int rank, p, quiet, B, G;  /* G: images per step over all ranks and micro-batches */
    double t_start;            /* this process's start, for the progress line's ETA */
    bool tty;                  /* rank 0's progress line redrawn in place (stdout is its terminal) */
    dt_images tr, te;
    classifier m;
    dt_engine *e;
    dt_train_precond pre;      /* --optimizer kfac or shampoo */
    dt_watchdog *wd;
    FILE *metrics;
    dt_tb_writer *tb;          /* --tensorboard (rank 0) */
    char report_metrics[4200]; /* --report DIR without --metrics: DIR/metrics.jsonl */
    float *x;
    int32_t *y;
    int *perm, sizes[17], ns;
    double *ips;               /* img/s per worker, per epoch */
    int step;                  /* of the epoch, for micro */
    int first;                 /* global steps done before this process (--resume) */
    int stopped;               /* --stop-after reached (0), or the signal that stopped the run */
    double train_s;            /* seconds in training steps so far (evaluations left out) */
    bool stop;                 /* the run ends before its last epoch's end */
} cls_run;

static dt_status micro(void *ctx, int k, float grad_scale, float *loss) {
    cls_run *r = ctx;
    const int *idx = r->perm + (size_t)r->step * r->G + ((size_t)k * r->p + (size_t)r->rank) * r->B;
    for (int i = 0; i < r->B; i++) {
        memcpy(r->x + (size_t)i * r->tr.dim, r->tr.x + (size_t)idx[i] * r->tr.dim, (size_t)r->tr.dim * sizeof(float));
        r->y[i] = r->tr.y[idx[i]];
    }
    dt_status st = cls_forward(&r->m, r->x, r->y, r->B, true, loss, NULL);
    return st ? st : cls_backward(&r->m, grad_scale);
}

/* One global batch of random images (N(0, 1), as Horovod's benchmark draws
 * them) and labels, the same on every rank: ImageNet's shape and 1000
 * classes for torchvision's ResNets, Fashion-MNIST's for the small one and
 * the MLP. */
static dt_status synthetic_images(cls_run *r, bool mlp) {
    bool small = mlp || !strcmp(r->c->model, "resnet:small");
    dt_images *t = &r->tr;
    t->channels = small ? 1 : 3;
    t->rows = t->cols = small ? 28 : 224;
    t->classes = small ? 10 : 1000;
    t->dim = t->channels * t->rows * t->cols;
    t->n = r->c->batch * r->p * r->c->grad_accum;
    t->x = malloc((size_t)t->n * t->dim * sizeof(float));
    t->y = malloc((size_t)t->n * sizeof(int32_t));
    if (!t->x || !t->y) return dt_error(DT_ERR_NOMEM, "--synthetic: out of memory for %d images of %d values", t->n, t->dim);
    uint64_t s = r->c->seed + 17;
    for (size_t i = 0; i < (size_t)t->n * t->dim; i++) t->x[i] = dt_rng_normal(&s);
    for (int i = 0; i < t->n; i++) t->y[i] = (int32_t)(dt_rng_next(&s) % (uint64_t)t->classes);
    r->te = *t; /* no test set: the checks compare the training set's shape with itself */
    r->te.x = NULL, r->te.y = NULL;
    return DT_OK;
}

static int steps_per_epoch(const cls_run *r) { return r->tr.n / r->G; }

/* Where --resume goes on from: the checkpoint's global step, on the same
 * images in the same global batches. */
static dt_status resume(cls_run *r) {
    const dt_train_config *c = r->c;
    dt_checkpoint_model cm;
    dt_checkpoint_position pos;
    dt_checkpoint_resnet(r->m.resnet, &cm);
    dt_status st = dt_checkpoint_resume(c->resume, r->p > 1 ? r->w : NULL, c, &cm, r->e, &pos);
    if (st) return st;
    if (pos.data_tokens != (size_t)r->tr.n || pos.tokens_per_batch != (size_t)r->G)
        return dt_error(DT_ERR_ARG, "--resume %s: the checkpoint trained on %zu images, %zu per step; this run has %d, %d per step "
                        "(keep the data and ranks x --batch x --grad-accum as saved)", c->resume, pos.data_tokens, pos.tokens_per_batch,
                        r->tr.n, r->G);
    int steps = steps_per_epoch(r);
    if (pos.step >= steps * c->epochs)
        return dt_error(DT_ERR_ARG, "--resume %s: the checkpoint is at step %d, the end of epoch %d of %d: nothing left to train",
                        c->resume, pos.step, pos.step / steps, c->epochs);
    r->first = pos.step;
    return DT_OK;
}

/* The full state after `done` global steps. Every rank calls it: under a
 * sharded optimizer (ZeRO, whose parameters are then in slices too) every
 * rank writes its slices, else rank 0 writes what all hold; the watchdog
 * waits for it. */
static dt_status save(cls_run *r, int done) {
    int steps = steps_per_epoch(r);
    dt_checkpoint_position pos = { done, (uint64_t)(done / steps), (size_t)(done % steps), (size_t)r->G, (size_t)r->tr.n };
    dt_checkpoint_model cm;
    dt_checkpoint_resnet(r->m.resnet, &cm);
    size_t off, n;
    dt_engine_share(r->e, &off, &n);
    bool sharded = off != 0 || n != cm.m.nparams;
    dt_watchdog_hold(r->wd, 1);
    /* 0/1 Adam's ranks made one; a codec's state (every rank's residuals) and a second-order optimizer's, to rank 0
     * (collectives) */
    dt_status st = dt_engine_sync_replicas(r->e);
    if (!st) st = dt_checkpoint_gather(r->e, &cm);
    /* rank 0's running averages are the ones every rank evaluates with */
    if (!st && (sharded || r->rank == 0))
        st = dt_checkpoint_save(r->c->save, sharded ? dt_engine_get_config(r->e)->comm : NULL, r->c, r->p, &cm, r->e, &pos);
    dt_checkpoint_release(&cm);
    dt_watchdog_hold(r->wd, 0);
    if (!st && !r->quiet) printf("saved %s (step %d)\n", r->c->save, done);
    return st;
}

/* The optimizer as the run line says it: a preconditioner over its base's step; name's 32 bytes. */
static const char *optimizer_name(const dt_train_config *c, char *name) {
    snprintf(name, 32, "%s%s", c->kfac_on ? "kfac over " : c->shampoo_on ? "shampoo over " : "", dt_optim_kind_name(c->opt.kind));
    return name;
}

/* --metrics, or --report's DIR/metrics.jsonl, or none */
static const char *metrics_path(const cls_run *r) {
    return r->c->metrics ? r->c->metrics : r->report_metrics[0] ? r->report_metrics : NULL;
}

/* What an image model's run refuses before any data is read: the flags built for the language models alone, and
 * --save/--resume where they cannot hold. */
static dt_status check_flags(const dt_train_config *c, bool mlp) {
    if ((c->save || c->resume) && (mlp || c->synthetic))
        return dt_error(DT_ERR_UNSUPPORTED, "--model %s: %s%s: checkpoints are built for the ResNets' training (and GPT-2's)", c->model,
                        c->save ? "--save" : "--resume", c->synthetic ? " with --synthetic" : "");
    if (c->save && !dt_checkpoint_is_dir(c->save))
        return dt_error(DT_ERR_ARG, "--save %s: an image model saves checkpoints to a directory (.bin and .safetensors are "
                        "GPT-2's weights files)", c->save);
    if (c->save) {
        dt_status cs = dt_checkpoint_check_dir(c->save, c->resume, c->overwrite);
        if (cs) return cs;
    }
    if (c->stop_after && !c->save)
        return dt_error(DT_ERR_ARG, "--stop-after %d without --save: nothing would be kept to --resume from (give --save DIR)",
                        c->stop_after);
    if (c->sync_bn && mlp) return dt_error(DT_ERR_ARG, "--sync-bn: the MLP has no BatchNorm (a ResNet has)");
    if (c->cuda) /* said, not silently run on the CPU */
        return dt_error(DT_ERR_UNSUPPORTED, "--model %s: --device cuda is built for the language models (GPT-2's and Llama's families) so far", c->model);
    if (c->lora.rank || c->lora_from) /* said, not silently skipped */
        return dt_error(DT_ERR_UNSUPPORTED, "--model %s: LoRA is built for the language models (GPT-2, Llama, Qwen 2)", c->model);
    if (c->precision != DT_F32)
        return dt_error(DT_ERR_UNSUPPORTED, "--precision %s: image models train in fp32 only (mixed precision is built for GPT-2)",
                        c->precision == DT_BF16 ? "bf16" : "fp16");
    if (c->grad_store != DT_F32)
        return dt_error(DT_ERR_UNSUPPORTED, "--grad-store %s: image models keep f32 gradients (16-bit ones come with GPT-2's --precision)",
                        dt_dtype_name(c->grad_store));
    return DT_OK;
}

/* The images (or synthetic ones), the global batch against them, the model made for their shape and classes, and every
 * rank's agreement on all of it. */
static dt_status data_and_model(cls_run *r, bool mlp) {
    const dt_train_config *c = r->c;
    const char *dir = c->data ? c->data : DEFAULT_DIR;
    dt_resnet_config named; /* the name checked before any data is read */
    dt_status st = mlp ? parse_hidden(c->model, r->sizes, &r->ns) : dt_resnet_config_parse(c->model, 1, 224, 224, 10, &named);
    if (!st && c->synthetic) st = synthetic_images(r, mlp);
    if (!st && !c->synthetic) st = dt_images_load(dir, "train", &r->tr);
    if (!st && !c->synthetic) st = dt_images_load(dir, "t10k", &r->te);
    if (!st && r->te.dim != r->tr.dim) st = dt_error(DT_ERR_IO, "%s: test images have %d pixels, training images %d", dir, r->te.dim, r->tr.dim);
    r->B = c->batch;
    r->G = c->batch * r->p * c->grad_accum;
    if (!st && r->G > r->tr.n)
        st = dt_error(DT_ERR_ARG, "global batch %d x %d ranks x %d accumulation is larger than the %d training images", r->B, r->p,
                      c->grad_accum, r->tr.n);
    int classes = r->tr.classes > r->te.classes ? r->tr.classes : r->te.classes;
    if (!st && mlp) {
        r->sizes[0] = r->tr.dim;
        r->sizes[r->ns++] = classes;
        st = dt_mlp_create(r->sizes, r->ns, &r->m.mlp);
    } else if (!st) {
        dt_resnet_config rc;
        st = dt_resnet_config_parse(c->model, r->tr.channels, r->tr.rows, r->tr.cols, classes, &rc);
        if (st) st = dt_error(DT_ERR_ARG, "%s (the images in %s are %d x %d x %d)", dt_last_error(), c->synthetic ? "--synthetic" : dir,
                              r->tr.channels, r->tr.rows, r->tr.cols);
        if (!st) st = dt_resnet_create(&rc, &r->m.resnet);
    }
    if (!st && r->w) st = check_same(r->w, &r->tr, &r->te, r->B, c->epochs, cls_params(&r->m));
    if (st) return st;
    if (mlp && c->init) return dt_error(DT_ERR_ARG, "--init %s: the MLP starts from its own initialisation (a ResNet loads a state dict)", c->init);
    if (mlp) dt_mlp_init_random(r->m.mlp, c->seed);
    else dt_resnet_init_random(r->m.resnet, c->seed);
    if (c->init && (st = dt_safetensors_load_resnet(c->init, r->m.resnet))) return st;
    if (c->sync_bn && r->p > 1) dt_resnet_set_bn_reduce(r->m.resnet, sum_over_ranks, r->w);
    return DT_OK;
}

/* The engine (and a preconditioner), a resumed run's place, the watchdog, the metrics and TensorBoard files, the batch's
 * buffers. */
static dt_status engine_and_outputs(cls_run *r, bool mlp) {
    const dt_train_config *c = r->c;
    dt_engine_config ec = { .comm = r->p > 1 ? r->w : NULL, .strategy = c->strategy, .opt = c->opt, .grad_clip = c->grad_clip,
                            .skip_nonfinite = 0, .step_at_end = c->step_at_end, .bucket_first = DT_DDP_FIRST_BUCKET,
                            .bucket_bytes = (size_t)(c->bucket_mb * 1048576.0), .codec = &c->codec };
    if (mlp) dt_mlp_model(r->m.mlp, &ec.model);
    else dt_resnet_model(r->m.resnet, &ec.model);
    dt_status st = dt_train_precond_create(c, &ec, NULL, NULL, r->rank, mlp ? "none" : "the BatchNorms", &r->pre);
    if (!st) st = dt_engine_create(&ec, &r->e);
    if (!st && c->resume) st = resume(r);
    if (!st) st = dt_watchdog_start(r->p > 1 ? r->w : NULL, &r->wd);
    const char *mpath = metrics_path(r);
    if (!st && mpath && r->rank == 0 && !(r->metrics = fopen(mpath, "w"))) st = dt_error(DT_ERR_IO, "%s: cannot write the metrics file", mpath);
    if (!st && c->tensorboard && r->rank == 0) st = dt_tb_create(c->tensorboard, &r->tb);
    r->x = malloc((size_t)r->B * r->tr.dim * sizeof(float));
    r->y = malloc((size_t)r->B * sizeof(int32_t));
    r->perm = malloc((size_t)r->tr.n * sizeof(int));
    r->ips = calloc(c->epochs > 0 ? (size_t)c->epochs : 1, sizeof *r->ips);
    if (!st && (!r->x || !r->y || !r->perm || !r->ips)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    return st;
}

/* What the run says first: the model, its data, the batch and the optimizer; a ResNet's memory for a batch. */
static void say_setup(const cls_run *r, bool mlp) {
    const dt_train_config *c = r->c;
    const char *dir = c->data ? c->data : DEFAULT_DIR;
    char opt[32];
    printf("%s", mlp ? "mlp" : c->model);
    for (int i = 0; mlp && i < r->ns; i++) printf("%s%d", i ? "-" : " ", r->sizes[i]);
    if (c->synthetic)
        printf(" (%zu parameters%s): synthetic %dx%dx%d images, batch %d per worker, %d worker%s, %d steps, %s lr %g, "
               "%d thread(s) per worker\n", cls_params(&r->m), mlp ? "" : c->sync_bn && r->p > 1 ? ", synchronised BatchNorm" : "",
               r->tr.channels, r->tr.rows, r->tr.cols, r->B, r->p, r->p > 1 ? "s" : "", c->steps, optimizer_name(c, opt),
               c->sched.lr, dt_kernels_threads());
    else
        printf(" (%zu parameters%s) on %s: %d training / %d test images; batch %d x %d rank%s, %d steps per epoch, %s lr %g, "
               "%d thread(s) per rank\n", cls_params(&r->m), mlp ? "" : c->sync_bn && r->p > 1 ? ", synchronised BatchNorm" : ", BatchNorm per rank",
               dir, r->tr.n, r->te.n, r->B, r->p, r->p == 1 ? "" : "s", r->tr.n / r->G, optimizer_name(c, opt), c->sched.lr, dt_kernels_threads());
    if (r->m.resnet) {
        size_t kept, grads, work;
        dt_resnet_batch_bytes(r->m.resnet, r->B, &kept, &grads, &work);
        printf("memory for a batch of %d per rank: activations kept for backward %.1f MiB, gradient buffers %.1f MiB, "
               "convolution scratch %.1f MiB\n", r->B, kept / 1048576.0, grads / 1048576.0, work / 1048576.0);
    }
    fflush(stdout);
}

static dt_status setup(cls_run *r) {
    const dt_train_config *c = r->c;
    bool mlp = !strncmp(c->model, "mlp", 3);
    if (c->trace) /* said, not silently skipped */
        return dt_error(DT_ERR_UNSUPPORTED, "--model %s: --trace is not built for image models yet (the language models' trainer only)",
                        c->model);
    dt_status st = DT_OK;
    if (c->report && r->rank == 0) st = dt_classify_report_prepare(c->report, r->report_metrics, sizeof r->report_metrics);
    if (!st) st = check_flags(c, mlp);
    if (!st) st = data_and_model(r, mlp);
    if (!st) st = engine_and_outputs(r, mlp);
    if (!st && !r->quiet) say_setup(r, mlp);
    return st;
}

/* Every rank evaluates with rank 0's BatchNorm running averages (they
 * differ between ranks unless BatchNorm is synchronised). */
static dt_status share_running(cls_run *r) {
    size_t n;
    if (!r->m.resnet || r->p < 2) return DT_OK;
    float *b = dt_resnet_buffers(r->m.resnet, &n);
    return dt_comm_broadcast(r->w, b, n, DT_F32, 0);
}

/* The test accuracy now (-1: failed, said): every rank with rank 0's running averages, ZeRO-3's whole model. */
static double evaluate(cls_run *r) {
    double acc = dt_engine_materialize(r->e, 1) || share_running(r) ? -1 : test_accuracy(r->p > 1 ? r->w : NULL, &r->m, &r->te, r->B, r->x, r->y);
    if (acc >= 0 && dt_engine_materialize(r->e, 0)) acc = -1;
    if (acc < 0) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    return acc;
}

/* TensorBoard's scalars of a metrics line at step (--tensorboard, rank 0): n tags and their values (not finite: left
 * out). A failure to write stops them, said once, as GPT-2's trainer does. */
static void tb_step(cls_run *r, int step, const char *const *tags, const double *values, int n) {
    if (!r->tb) return;
    for (int i = 0; i < n; i++)
        if (isfinite(values[i])) dt_tb_scalar(r->tb, tags[i], values[i]);
    if (dt_tb_step(r->tb, step)) {
        dt_log(DT_LOG_WARN, "%s; TensorBoard's events stop here", dt_last_error());
        dt_tb_destroy(r->tb);
        r->tb = NULL;
    }
}

static const char *const acc_tag[] = { "val/accuracy" };

/* --eval-every N: the test accuracy after global step done, inside an epoch (its end evaluates anyway), with the
 * seconds trained so far, for curves of accuracy against epochs and time. Returns the exit code. */
static int evaluate_inside(cls_run *r, int done) {
    double acc = evaluate(r);
    if (acc < 0) return 1;
    double epochs = (double)done / steps_per_epoch(r);
    if (!r->quiet) {
        if (r->tty) printf("\n");
        printf("step %d (epoch %.2f): test accuracy %.2f%% after %.1f s of training\n", done, epochs, 100 * acc, r->train_s);
        fflush(stdout);
    }
    if (r->metrics) {
        fprintf(r->metrics, "{\"step\":%d,\"epochs\":%.4f,\"test_accuracy\":%.6f,\"train_s\":%.3f}\n", done, epochs, acc, r->train_s);
        dt_metrics_flush(&r->metrics, metrics_path(r), done);
    }
    tb_step(r, done, acc_tag, &acc, 1);
    return 0;
}

/* A step's line: the progress, the metrics (a codec's wire, as GPT-2's lines have it) and TensorBoard's scalars. */
static void report_step(cls_run *r, int e, int done, int total, const char *prefix, const dt_step_result *s, float lr, double ms) {
    const dt_train_config *c = r->c;
    if (!r->quiet)
        dt_progress_print(r->tty, c->print_every ? c->print_every : 50,
                          &(dt_progress){ .step = done - 1, .steps = total, .first = r->first, .loss = s->loss, .lr = lr,
                                          .norm = s->norm, .ms = ms, .rate = r->G / (ms / 1e3), .unit = "img/s",
                                          .elapsed = dt_time_now() - r->t_start, .prefix = prefix, .val = NAN, .bubble = NAN });
    if (r->metrics) {
        fprintf(r->metrics, "{\"epoch\":%d,\"step\":%d,\"loss\":%.6f,\"lr\":%g,\"grad_norm\":%.6f", e + 1, done, s->loss, lr, s->norm);
        if (s->grad_bytes > 0) fprintf(r->metrics, ",\"grad_sent_bytes\":%.0f,\"compress_ratio\":%.4f", s->grad_bytes, s->compress_ratio);
        if (s->grad_recv_bytes > 0) fprintf(r->metrics, ",\"grad_recv_bytes\":%.0f", s->grad_recv_bytes);
        fputs("}\n", r->metrics);
        dt_metrics_flush(&r->metrics, metrics_path(r), done);
    }
    static const char *const tags[] = { "train/loss", "train/lr", "train/grad_norm", "perf/img_per_s" };
    tb_step(r, done, tags, (const double[]){ s->loss, lr, s->norm, r->G / (ms / 1e3) }, 4);
}

/* The run stops after step done (a signal, --stop-after): said; the exit code. */
static int say_stopped(cls_run *r, int done, int total) {
    const dt_train_config *c = r->c;
    if (r->stopped && r->rank == 0)
        dt_log(DT_LOG_WARN, "stopped by signal %d (%s) after step %d of %d%s", r->stopped, strsignal(r->stopped), done, total,
               c->save ? "; saved" : " (nothing saved: no --save)");
    else if (!r->quiet)
        printf("stopped after %d steps (--stop-after); --resume %s goes on\n", c->stop_after, c->save ? c->save : "(no --save)");
    dt_metrics_flush(&r->metrics, metrics_path(r), done);
    return r->stopped ? 128 + r->stopped : 0;
}

/* The epoch's end: its test accuracy (*acc; 1: failed), loss, rates and exposed communication, said. */
static int report_epoch(cls_run *r, int e, int first, double loss_sum, double exposed_sum, double secs, double *acc) {
    const dt_train_config *c = r->c;
    int steps = steps_per_epoch(r);
    r->ips[e] = (double)(steps - first) * r->B * c->grad_accum / secs;
    if ((*acc = evaluate(r)) < 0) return 1;
    if (!r->quiet) {
        if (r->tty) printf("\n");
        printf("epoch %d/%d: loss %.4f, test accuracy %.2f%%, %.0f img/s per worker, %.0f img/s total (%d worker%s), "
               "exposed communication %.1f%%\n", e + 1, c->epochs, loss_sum / (steps - first), 100 * *acc, r->ips[e], r->ips[e] * r->p, r->p,
               r->p > 1 ? "s" : "", 100 * exposed_sum / 1e3 / secs);
        fflush(stdout);
    }
    if (r->metrics) {
        fprintf(r->metrics, "{\"epoch\":%d,\"epochs\":%d,\"train_loss\":%.6f,\"test_accuracy\":%.6f,\"img_per_s_worker\":%.1f,\"img_per_s\":%.1f,"
                "\"comm_exposed_ms\":%.3f,\"train_s\":%.3f}\n", e + 1, e + 1, loss_sum / (steps - first), *acc, r->ips[e], r->ips[e] * r->p,
                exposed_sum, r->train_s);
        dt_metrics_flush(&r->metrics, metrics_path(r), e * steps + r->step);
    }
    tb_step(r, e * steps + r->step, acc_tag, acc, 1);
    return 0;
}

/* One epoch; *acc gets the test accuracy after it. Returns the exit code (0: go on). */
static int epoch(cls_run *r, int e, double *acc) {
    const dt_train_config *c = r->c;
    int steps = steps_per_epoch(r), total = steps * c->epochs, first = r->first > e * steps ? r->first - e * steps : 0;
    dt_rng_shuffle(r->perm, r->tr.n, c->shuffle_seed + (uint64_t)e + 1);
    double trained0 = r->train_s, loss_sum = 0, exposed_sum = 0; /* the epoch's img/s: its steps' time, evaluations left out */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "epoch %d/%d", e + 1, c->epochs);
    for (r->step = first; r->step < steps; r->step++) {
        dt_step_result s;
        int done = e * steps + r->step + 1;
        double ts = dt_time_now();
        float lr = dt_lr_at(&c->sched, total, done - 1);
        if (dt_engine_step(r->e, c->grad_accum, lr, micro, r, dt_train_interrupted(), &s)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            return 1;
        }
        /* a diverged run stops here, naming the step (GPT-2's trainer can also skip: --on-nonfinite) */
        if (!isfinite(s.loss) || !isfinite(s.norm)) {
            dt_log(DT_LOG_ERROR, "epoch %d, step %d: the %s is not finite; stopping", e + 1, r->step + 1,
                   isfinite(s.loss) ? "gradient norm" : "loss");
            return 1;
        }
        loss_sum += s.loss;
        exposed_sum += s.exposed_ms;
        double ms = (dt_time_now() - ts) * 1e3;
        r->train_s += ms / 1e3;
        report_step(r, e, done, total, prefix, &s, lr, ms);
        /* every rank stops after the step any rank was signalled in, saving first */
        if (s.stop) r->stopped = dt_train_interrupted() ? dt_train_interrupted() : SIGTERM;
        r->stop = s.stop || (c->stop_after && done - r->first == c->stop_after && done < total);
        if (c->save && (r->stop || (c->save_every && done % c->save_every == 0 && done < total)) && save(r, done)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            return 1;
        }
        if (!r->stop && c->eval_every && done % c->eval_every == 0 && r->step + 1 < steps && evaluate_inside(r, done)) return 1;
        if (r->stop) {
            int rc = say_stopped(r, done, total);
            if (r->step + 1 < steps) return rc;
            r->step++; /* at the epoch's end: evaluated, as the uninterrupted run does */
            break;
        }
    }
    if (report_epoch(r, e, first, loss_sum, exposed_sum, r->train_s - trained0, acc)) return 1;
    return r->stop && r->stopped ? 128 + r->stopped : 0;
}

/* --synthetic: --steps steps on the one batch, each timed; img/s per worker
 * per step printed and in the metrics, as Horovod's synthetic benchmark
 * prints its iterations. Returns the exit code. */
static int synthetic_steps(cls_run *r) {
    const dt_train_config *c = r->c;
    r->step = 0;
    for (int i = 0; i < r->tr.n; i++) r->perm[i] = i;
    double *ips = calloc((size_t)c->steps, sizeof *ips);
    if (!ips) { dt_log(DT_LOG_ERROR, "out of memory"); return 1; }
    for (int k = 0; k < c->steps; k++) {
        dt_step_result s;
        double t0 = dt_time_now();
        if (dt_engine_step(r->e, c->grad_accum, c->sched.lr, micro, r, 0, &s)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            free(ips);
            return 1;
        }
        double ms = (dt_time_now() - t0) * 1e3;
        ips[k] = (double)r->B * c->grad_accum / (ms / 1e3);
        if (!r->quiet) printf("Iter #%d: %.1f img/sec per worker (loss %.4f)\n", k, ips[k], s.loss);
        if (r->metrics) {
            fprintf(r->metrics, "{\"step\":%d,\"loss\":%.6f,\"ms\":%.3f,\"img_per_s_worker\":%.2f,\"img_per_s\":%.2f,\"comm_exposed_ms\":%.3f}\n",
                    k + 1, s.loss, ms, ips[k], ips[k] * r->p, s.exposed_ms);
            dt_metrics_flush(&r->metrics, metrics_path(r), k + 1);
        }
        static const char *const tags[] = { "train/loss", "perf/img_per_s" };
        tb_step(r, k + 1, tags, (const double[]){ s.loss, ips[k] * r->p }, 2);
    }
    if (!r->quiet) {
        double mean, sd;
        mean_sd(ips, c->steps, &mean, &sd);
        printf("Img/sec per worker: %.1f +-%.1f\nTotal img/sec on %d worker%s: %.1f +-%.1f\n", mean, 1.96 * sd, r->p, r->p > 1 ? "s" : "",
               mean * r->p, 1.96 * sd * r->p);
    }
    free(ips);
    return 0;
}

/* --report DIR (rank 0, after the last epoch): run.json and report.html. */
static dt_status write_report(cls_run *r, double acc) {
    const dt_train_config *c = r->c;
    int steps = steps_per_epoch(r), e0 = r->first / steps;
    double mean = 0, sd = 0;
    mean_sd(r->ips + e0, c->epochs - e0, &mean, &sd);
    dt_metrics_flush(&r->metrics, metrics_path(r), steps * c->epochs);
    dt_classify_outcome o = { .metrics = metrics_path(r), .params = cls_params(&r->m), .ranks = r->p, .steps_per_epoch = steps,
                              .steps_done = steps * c->epochs, .images_per_step = r->G, .test_accuracy = acc, .img_per_s = mean * r->p,
                              .wall_s = dt_time_now() - r->t_start };
    dt_status st = dt_classify_report_write(c->report, c, &o);
    if (!st && !r->quiet) printf("report: %s/report.html\n", c->report);
    return st;
}

int dt_classify_run(const dt_train_config *c, dt_comm *w) {
    cls_run r = { .c = c, .w = w, .rank = w ? dt_comm_rank(w) : 0, .p = w ? dt_comm_size(w) : 1 };
    r.quiet = c->quiet || r.rank != 0;
    r.tty = !r.quiet && isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_RANK");
    r.t_start = dt_time_now();
    int rc = 1;
    double acc = 0;
    if (setup(&r)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (c->synthetic) { rc = synthetic_steps(&r); goto out; }
    dt_train_catch_signals();
    for (int e = r.first / steps_per_epoch(&r); e < c->epochs; e++)
        if ((rc = epoch(&r, e, &acc)) || r.stop) goto out;
    rc = 1;
    uint64_t hash;
    int checked;
    if (dt_engine_sync_replicas(r.e) || dt_engine_check_replicas(r.e, &checked, &hash)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (checked && !r.quiet) printf("weights identical on all %d ranks (hash %016llx)\n", r.p, (unsigned long long)hash);
    if (c->save && save(&r, steps_per_epoch(&r) * c->epochs)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (!r.quiet) {
        double mean, sd;
        int e0 = r.first / steps_per_epoch(&r); /* the epochs this process ran */
        mean_sd(r.ips + e0, c->epochs - e0, &mean, &sd);
        printf("img/s per worker: %.1f +-%.1f\ntotal img/s on %d worker%s: %.1f +-%.1f\nfinal test accuracy: %.2f%%\n", mean, sd,
               r.p, r.p > 1 ? "s" : "", mean * r.p, sd * r.p, 100 * acc);
    }
    if (c->report && r.rank == 0 && write_report(&r, acc)) dt_log(DT_LOG_WARN, "the report was not written (the training is done): %s", dt_last_error());
    rc = 0;
out:
    dt_watchdog_stop(r.wd);
    if (r.metrics) fclose(r.metrics);
    dt_tb_destroy(r.tb);
    dt_engine_destroy(r.e);
    dt_train_precond_destroy(&r.pre);
    dt_mlp_destroy(r.m.mlp);
    dt_resnet_destroy(r.m.resnet);
    dt_images_free(&r.tr);
    dt_images_free(&r.te);
    free(r.x);
    free(r.y);
    free(r.perm);
    free(r.ips);
    return rc;
}
