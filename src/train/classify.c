/* Image classification training (dtrain train --model mlp): an MLP on an
 * IDX image set (Fashion-MNIST from Debian's dataset-fashion-mnist by
 * default), data parallel over the job's ranks exactly as GPT-2 is: the
 * gradients live in DDP's arena and each layer's bucket is averaged as
 * backward finishes it. A distributed sampler gives every rank its own part
 * of each global batch: one permutation per epoch (the same on every rank),
 * global batch k = permutation[k*G .. (k+1)*G), rank r takes the r-th B of
 * it, so N ranks of batch B see what one rank of batch N*B sees. Throughput
 * is reported as the Horovod benchmark does: images/s per worker and in
 * total. */
#include "dtrain/data.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void shuffle(int *perm, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) perm[i] = i;
    uint64_t s = seed ? seed : 1;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(dt_rng_next(&s) % (uint64_t)(i + 1));
        int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
}

/* Accuracy over the test set, each rank on its share, summed. */
static double test_accuracy(dt_comm *w, dt_mlp *m, const dt_images *t, int B, float *x, int32_t *y) {
    int rank = w ? dt_comm_rank(w) : 0, p = w ? dt_comm_size(w) : 1;
    int lo = (int)((long)t->n * rank / p), hi = (int)((long)t->n * (rank + 1) / p);
    double c[2] = { 0, 0 }, all[2];
    for (int i = lo; i < hi; i += B) {
        int b = hi - i < B ? hi - i : B, correct = 0;
        memcpy(x, t->x + (size_t)i * t->dim, (size_t)b * t->dim * sizeof(float));
        memcpy(y, t->y + i, (size_t)b * sizeof(int32_t));
        if (dt_mlp_forward(m, x, y, b, NULL, &correct)) return -1;
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

int dt_classify_run(const dt_train_config *c, dt_comm *w) {
    int rank = w ? dt_comm_rank(w) : 0, p = w ? dt_comm_size(w) : 1, quiet = c->quiet || rank != 0;
    const char *dir = c->data ? c->data : DEFAULT_DIR;
    dt_images tr = { 0 }, te = { 0 };
    dt_mlp *m = NULL;
    dt_ddp *ddp = NULL;
    dt_watchdog *wd = NULL;
    dt_optim *opt = NULL;
    FILE *metrics = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    double *ips = NULL; /* img/s per worker, per epoch */
    int *perm = NULL, rc = 1, sizes[17], ns = 0;
    dt_status st = parse_hidden(c->model, sizes, &ns);
    if (!st) st = dt_images_load(dir, "train", &tr);
    if (!st) st = dt_images_load(dir, "t10k", &te);
    if (!st && te.dim != tr.dim) st = dt_error(DT_ERR_IO, "%s: test images have %d pixels, training images %d", dir, te.dim, tr.dim);
    int B = c->batch, G = B * p;
    if (!st && G > tr.n) st = dt_error(DT_ERR_ARG, "global batch %d x %d ranks is larger than the %d training images", B, p, tr.n);
    if (!st) {
        sizes[0] = tr.dim;
        sizes[ns++] = tr.classes > te.classes ? tr.classes : te.classes;
        st = dt_mlp_create(sizes, ns, &m);
    }
    if (!st && w) st = check_same(w, &tr, &te, B, c->epochs, dt_mlp_num_params(m));
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    dt_mlp_init_random(m, c->seed);
    int L = dt_mlp_num_layers(m);
    dt_grad_range ranges[32];
    dt_tensor_span spans[32];
    for (int l = L - 1, k = 0; l >= 0; l--, k += 2) {
        size_t wo, bo;
        int in, outn;
        dt_mlp_layer(m, l, &wo, &bo, &in, &outn);
        ranges[k] = (dt_grad_range){ l, wo, (size_t)in * outn };
        ranges[k + 1] = (dt_grad_range){ l, bo, (size_t)outn };
        spans[k] = (dt_tensor_span){ wo, (size_t)in * outn };
        spans[k + 1] = (dt_tensor_span){ bo, (size_t)outn };
    }
    size_t np = dt_mlp_num_params(m);
    if (w && p > 1) {
        st = dt_ddp_create_ranges(w, np, ranges, 2 * L, 1u << 20, (size_t)(c->bucket_mb * 1048576.0), &ddp);
        if (!st) {
            dt_mlp_set_grad_storage(m, dt_ddp_grads(ddp));
            dt_mlp_set_grad_hook(m, dt_ddp_grad_hook, ddp);
        }
    }
    if (!st) st = dt_optim_create(&c->opt, np, spans, 2 * L, &opt);
    if (!st && ddp && !c->step_at_end && dt_optim_elementwise(opt) && !(c->grad_clip > 0))
        st = dt_ddp_set_optimizer(ddp, opt, dt_mlp_params(m));
    if (!st) st = dt_watchdog_start(p > 1 ? w : NULL, &wd);
    if (!st && c->metrics && rank == 0 && !(metrics = fopen(c->metrics, "w")))
        st = dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    x = malloc((size_t)B * tr.dim * sizeof(float));
    y = malloc((size_t)B * sizeof(int32_t));
    perm = malloc((size_t)tr.n * sizeof(int));
    ips = calloc(c->epochs > 0 ? (size_t)c->epochs : 1, sizeof *ips);
    if (!st && (!x || !y || !perm || !ips)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }

    int steps = tr.n / G, epochs = c->epochs;
    if (!quiet) {
        printf("mlp");
        for (int i = 0; i < ns; i++) printf("%s%d", i ? "-" : " ", sizes[i]);
        printf(" (%zu parameters) on %s: %d training / %d test images; batch %d x %d ranks, %d steps per epoch, %s lr %g, "
               "%d thread(s) per rank\n", np, dir, tr.n, te.n, B, p, steps, dt_optim_kind_name(c->opt.kind), c->sched.lr, dt_kernels_threads());
        fflush(stdout);
    }
    double acc = 0;
    for (int e = 0; e < epochs; e++) {
        shuffle(perm, tr.n, c->shuffle_seed + (uint64_t)e + 1);
        double t0 = dt_time_now(), loss_sum = 0, exposed_sum = 0;
        for (int s = 0; s < steps; s++) {
            const int *idx = perm + (size_t)s * G + (size_t)rank * B;
            for (int i = 0; i < B; i++) {
                memcpy(x + (size_t)i * tr.dim, tr.x + (size_t)idx[i] * tr.dim, (size_t)tr.dim * sizeof(float));
                y[i] = tr.y[idx[i]];
            }
            float loss = 0;
            double exposed = 0, norm = -1;
            float lr = dt_lr_at(&c->sched, steps * epochs, e * steps + s);
            if (ddp) dt_ddp_begin(ddp, 1, lr);
            st = dt_mlp_forward(m, x, y, B, &loss, NULL);
            if (!st) st = dt_mlp_backward(m, 1.0f);
            if (!st && ddp) st = dt_ddp_finish(ddp, &exposed, &norm);
            if (!st && w && p > 1) st = dt_comm_allreduce(w, &loss, &loss, 1, DT_F32, DT_AVG);
            if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
            if (norm < 0) norm = dt_optim_step_clipped(opt, dt_mlp_params(m), dt_mlp_grads(m), lr, c->grad_clip); /* not inside backward */
            /* a diverged run stops here, naming the step (GPT-2's trainer can also skip: --on-nonfinite) */
            if (!isfinite(loss) || !isfinite(norm)) {
                dt_log(DT_LOG_ERROR, "epoch %d, step %d: the %s is not finite; stopping", e + 1, s + 1, isfinite(loss) ? "gradient norm" : "loss");
                goto out;
            }
            loss_sum += loss;
            exposed_sum += exposed;
        }
        double secs = dt_time_now() - t0;
        ips[e] = (double)steps * B / secs;
        acc = test_accuracy(p > 1 ? w : NULL, m, &te, B, x, y);
        if (acc < 0) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
        if (!quiet) {
            printf("epoch %d/%d: loss %.4f, test accuracy %.2f%%, %.0f img/s per worker, %.0f img/s total (%d worker%s), "
                   "exposed communication %.1f%%\n", e + 1, epochs, loss_sum / steps, 100 * acc, ips[e], ips[e] * p, p,
                   p > 1 ? "s" : "", 100 * exposed_sum / 1e3 / secs);
            fflush(stdout);
        }
        if (metrics) {
            fprintf(metrics, "{\"epoch\":%d,\"loss\":%.6f,\"test_accuracy\":%.6f,\"img_per_s_worker\":%.1f,\"img_per_s\":%.1f,"
                    "\"comm_exposed_ms\":%.3f}\n", e + 1, loss_sum / steps, acc, ips[e], ips[e] * p, exposed_sum);
            fflush(metrics);
        }
    }
    uint64_t hash;
    if (ddp && (st = dt_ddp_check_replicas(w, dt_mlp_params(m), np, &hash))) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
    if (ddp && !quiet) printf("weights identical on all %d ranks (hash %016llx)\n", p, (unsigned long long)hash);
    if (!quiet) {
        double mean, sd;
        mean_sd(ips, epochs, &mean, &sd);
        printf("img/s per worker: %.1f +-%.1f\ntotal img/s on %d worker%s: %.1f +-%.1f\nfinal test accuracy: %.2f%%\n", mean, sd, p,
               p > 1 ? "s" : "", mean * p, sd * p, 100 * acc);
    }
    rc = 0;
out:
    dt_watchdog_stop(wd);
    if (metrics) fclose(metrics);
    if (m) dt_mlp_set_grad_hook(m, NULL, NULL);
    if (m) dt_mlp_set_grad_storage(m, NULL);
    dt_ddp_destroy(ddp);
    dt_optim_destroy(opt);
    dt_mlp_destroy(m);
    dt_images_free(&tr);
    dt_images_free(&te);
    free(x);
    free(y);
    free(perm);
    free(ips);
    return rc;
}
