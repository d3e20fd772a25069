/* The engine's "gpu" strategy: the whole model on a GPU (dt_gpu_lm), which updates its parameters there. The host
 * store and the optimizer's buffers are mirrors: a save makes them current (materialize on), a resume's load goes
 * back to the device (materialize off). Over several ranks (data parallelism, each rank its GPU or a share of one),
 * the gradients are staged through the host store and averaged by dtrain's collectives after backward, then go back
 * to the device for the update: no overlap with backward yet. Where every rank has a GPU of its own on one machine,
 * NCCL averages them on the GPUs instead (src/gpu/nccl.cu). Part of the GPU plugin. */
#include "dtrain/gpu_lm.h"
#include "dtrain/engine.h"
#include "dtrain/parallel.h"
#include "dtrain/strategy.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    const dt_engine_config *c;
    dt_gpu_lm *m;
    dt_optim *o;
    dt_gpu_nccl *nccl; /* NULL: the gradients go through host memory */
} gpu_state;

/* Whether every rank runs on this machine (the same host name) on a GPU no other rank has. */
static dt_status one_machine_own_gpus(dt_comm *c, dt_gpu *g, bool *yes) {
    int n = dt_comm_size(c);
    char host[256] = { 0 };
    gethostname(host, sizeof host - 1);
    int64_t mine[2] = { (int64_t)dt_hash_words(DT_HASH_INIT, host, sizeof host / 4), dt_gpu_ordinal(g) };
    int64_t *all = malloc((size_t)n * sizeof mine);
    if (!all) return dt_error(DT_ERR_NOMEM, "strategy gpu: out of memory");
    dt_status st = dt_comm_allgather(c, mine, all, 2, DT_I64);
    *yes = !st;
    for (int i = 0; !st && i < n; i++) {
        *yes = *yes && all[2 * i] == mine[0];
        for (int j = 0; j < i; j++) *yes = *yes && all[2 * j + 1] != all[2 * i + 1];
    }
    free(all);
    return st;
}

/* NCCL for the gradients where one_machine_own_gpus, every rank having loaded it (else all stay on host memory, rank
 * 0 saying why): rank 0's unique id carried to the others by dtrain's broadcast, then the communicator. */
static dt_status open_nccl(gpu_state *s) {
    dt_comm *c = s->c->comm;
    dt_gpu *g = dt_gpu_lm_gpu(s->m);
    bool own = false;
    dt_status st = one_machine_own_gpus(c, g, &own);
    if (!st && !own && dt_comm_rank(c) == 0)
        dt_log(DT_LOG_INFO, "--device cuda: %d ranks, sharing a GPU or on several machines: gradients averaged through host memory "
               "by dtrain's collectives", dt_comm_size(c));
    if (st || !own) return st;
    int32_t id[DT_GPU_NCCL_ID_BYTES / 4];
    bool ok = !dt_gpu_nccl_id(id), all_ok = false; /* each rank loads NCCL; rank 0's id is kept */
    if (!(st = dt_comm_every(c, ok, &all_ok)) && !all_ok) {
        if (dt_comm_rank(c) == 0)
            dt_log(DT_LOG_WARN, "--device cuda: NCCL could not be loaded on every rank (%s): the gradients go through host memory",
                   ok ? "on another rank" : dt_last_error());
        return DT_OK;
    }
    if (!st) st = dt_comm_broadcast(c, id, DT_GPU_NCCL_ID_BYTES / 4, DT_I32, 0);
    if (!st) st = dt_gpu_nccl_open(g, id, dt_comm_size(c), dt_comm_rank(c), &s->nccl);
    if (!st && dt_comm_rank(c) == 0)
        dt_log(DT_LOG_INFO, "--device cuda: %d ranks, each on its own GPU of this machine: gradients averaged by NCCL on the GPUs",
               dt_comm_size(c));
    return st;
}

static dt_status refuse(const char *what) {
    return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: %s is not on the GPU path yet (docs/gpu.md says what is)", what);
}

static dt_status create(const dt_engine_config *c, void **state, size_t *off, size_t *n) {
    if (!c->device) return dt_error(DT_ERR_ARG, "strategy gpu: no GPU model (dt_engine_config.device)");
    if (c->loss_scale) return refuse("fp16's loss scaling");
    if (c->precond) return refuse(c->precond->name);
    if (c->grad_store != DT_F32 || c->grad_comm != DT_F32) return refuse("16-bit gradients");
    if (c->codec && c->codec->kind != DT_CODEC_NONE) return refuse("gradient compression");
    if (c->opt.kind != DT_OPT_ADAMW) return refuse(dt_optim_kind_name(c->opt.kind));
    if (c->mp_comm || c->schedule || c->expert_comm) return refuse("a model split over ranks");
    gpu_state *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "strategy gpu: out of memory");
    s->c = c;
    s->m = c->device;
    dt_status st = c->comm && dt_comm_size(c->comm) > 1 ? open_nccl(s) : DT_OK;
    if (st) {
        free(s);
        return st;
    }
    *state = s;
    *off = 0;
    *n = c->model.nparams;
    return DT_OK;
}

static void destroy(void *state) {
    gpu_state *s = state;
    if (s) dt_gpu_nccl_close(s->nccl);
    free(s);
}

static dt_status attach(void *state, dt_optim *o) {
    ((gpu_state *)state)->o = o;
    return DT_OK;
}

/* Data parallelism: the gradients averaged over the ranks by NCCL on the GPUs, or through the host store by dtrain's
 * allreduce. */
static dt_status finish(void *state, dt_sync_result *r) {
    gpu_state *s = state;
    dt_comm *c = s->c->comm;
    if (!c || dt_comm_size(c) == 1) return DT_OK;
    const dt_model *md = &s->c->model;
    float *g = md->grads(md->self);
    double t0 = dt_time_now();
    if (s->nccl) {
        dt_status st = dt_gpu_lm_grads_nccl(s->m, s->nccl);
        r->exposed_ms = (dt_time_now() - t0) * 1e3;
        return st;
    }
    dt_status st = dt_gpu_lm_grads(s->m, g, 1);
    if (!st) st = dt_comm_allreduce(c, g, g, md->nparams, DT_F32, DT_AVG);
    if (!st) st = dt_gpu_lm_grads(s->m, g, 0);
    r->exposed_ms = (dt_time_now() - t0) * 1e3; /* all of it: after backward, nothing overlaps it */
    return st;
}

static dt_status update(void *state, float lr, struct dt_step_result *r) {
    gpu_state *s = state;
    if (s->c->skip_nonfinite && !isfinite(r->loss)) { /* as the engine's own update: the step changes nothing */
        r->skipped = 1;
        return dt_gpu_lm_zero_grad(s->m);
    }
    return dt_gpu_lm_step(s->m, &s->c->opt, lr, s->c->grad_clip, s->c->skip_nonfinite, &r->norm, &r->skipped);
}

static dt_status materialize(void *state, int on) {
    gpu_state *s = state;
    const dt_model *md = &s->c->model;
    long t = dt_optim_steps(s->o);
    dt_status st = dt_gpu_lm_state(s->m, md->params(md->self), dt_optim_buffer(s->o, 0), dt_optim_buffer(s->o, 1), &t, on);
    if (!st && on) dt_optim_set_steps(s->o, t);
    return st;
}

/* The replicas' weights agree (the device's, brought to the host first). */
static dt_status check_replicas(void *state, uint64_t *hash) {
    gpu_state *s = state;
    const dt_model *md = &s->c->model;
    if (!s->c->comm || dt_comm_size(s->c->comm) == 1) return DT_OK; /* one replica */
    dt_status st = materialize(state, 1);
    return st ? st : dt_ddp_check_replicas(s->c->comm, md->params(md->self), md->nparams, hash);
}

const dt_strategy dt_strategy_gpu = { .name = "gpu", .create = create, .destroy = destroy, .attach = attach, .finish = finish,
                                      .update = update, .materialize = materialize, .check_replicas = check_replicas };
