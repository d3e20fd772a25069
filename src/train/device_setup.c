/* --device cuda: the one-process GPU path (docs/gpu.md), refusing by name what it does not run yet. */
#include "device_setup.h"

#include "dtrain/strategy.h"

#include <string.h>

static dt_status refuse(const char *what) {
    return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: %s is not on the GPU path yet (the whole model on each rank, f32 or bf16, "
                                        "AdamW, GPT-2's and Llama's ops; docs/gpu.md)", what);
}

dt_status dt_train_device_check(const dt_train_config *c, int nranks) {
    if (c->tp > 1 || c->pp > 1 || c->cp > 1 || c->ep > 1) return refuse("a model split over ranks (--tp, --pp, --cp, --ep)");
    if (c->strategy && strcmp(c->strategy, "single") && strcmp(c->strategy, "ddp"))
        return refuse("ZeRO (--strategy zero1, zero2, zero3)");
    if (c->strategy && !strcmp(c->strategy, "single") && nranks > 1) return refuse("--strategy single over several ranks");
    if (c->precision == DT_F16) return refuse("fp16 (--precision fp16; bf16 is)");
    if (c->recompute) return refuse("--recompute");
    if (c->lora.rank > 0 || c->lora_from) return refuse("LoRA");
    if (c->pack) return refuse("--pack");
    if (c->grpo.prompts) return refuse("GRPO");
    if (c->kfac_on || c->shampoo_on) return refuse(c->kfac_on ? "K-FAC" : "Shampoo");
    if (c->opt.kind != DT_OPT_ADAMW) return refuse(dt_optim_kind_name(c->opt.kind));
    return DT_OK;
}

dt_status dt_train_device_attach(const dt_train_config *c, int nranks, int local_rank, dt_program *p, dt_engine_config *ec,
                                 dt_train_device *out) {
    memset(out, 0, sizeof *out);
    if (!c->cuda) return DT_OK;
    dt_status st = dt_train_device_check(c, nranks);
    if (!st) st = dt_gpu_api_load(&out->api);
    int gpus = st ? 0 : out->api->count(), ordinal = c->cuda_named || gpus < 1 ? c->cuda - 1 : local_rank % gpus;
    if (!st) st = out->api->open(out->ordinal = ordinal, &out->gpu);
    if (!st) out->api->set_tf32(out->gpu, c->tf32);
    if (!st) st = out->api->lm_create(out->gpu, p, c->batch, c->seq, &out->lm);
    if (st) {
        dt_train_device_detach(out, p);
        return st;
    }
    dt_program_device dev;
    out->api->lm_device(out->lm, &dev);
    dt_program_set_device(p, &dev);
    ec->strategy_impl = out->api->strategy;
    ec->device = out->lm;
    return DT_OK;
}

void dt_train_device_detach(dt_train_device *d, dt_program *p) {
    if (!d->api) return;
    if (p) dt_program_set_device(p, NULL);
    d->api->lm_destroy(d->lm);
    d->api->close(d->gpu);
    memset(d, 0, sizeof *d);
}

const char *dt_train_device_name(const dt_train_device *d, double *used_gib, double *total_gib) {
    if (!d->gpu) return NULL;
    size_t fr = 0, tot = 0;
    d->api->mem_info(d->gpu, &fr, &tot);
    *used_gib = (double)(tot - fr) / 1073741824.0;
    if (total_gib) *total_gib = (double)tot / 1073741824.0;
    return d->api->name(d->gpu);
}

int dt_train_device_flash(const dt_train_device *d) { return d->lm && d->api->lm_flash(d->lm); }

dt_status dt_train_device_peak(const dt_train_device *d, bool bf16, double *gflops) {
    double tf = 0;
    dt_status st = d->api->measure_gemm(d->gpu, bf16, 4096, 4096, 4096, &tf);
    *gflops = tf * 1e3;
    return st;
}
