/* dtrain plan --device cuda: a plan for one GPU, from the GPU itself (the plugin's dt_gpu_lm_plan: the pre-flight's
 * count of the model's bytes, and a step timed at the job's batch with one layer and two). What the GPU path does not
 * run is refused by name, as train refuses it. */
#include "device_setup.h"

#include "dtrain/obs.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gib(size_t b) { return (double)b / 1073741824.0; }

static void print_text(const dt_train_config *c, const dt_gpt2_config *cfg, const char *gpu, int ordinal, const dt_gpu_plan *p, FILE *f) {
    double tokens = (double)c->batch * c->seq;
    fprintf(f, "plan: %.3gB parameters (%d layers, %d channels, %d heads), batch %d x %d positions, %s%s, attention %s; "
               "one process on GPU %d (%s)\n",
            dt_gpt2_config_num_params(cfg) / 1e9, cfg->num_layers, cfg->channels, cfg->num_heads, c->batch, c->seq,
            c->precision == DT_BF16 ? "bf16" : "f32", c->tf32 ? " (TF32 matmuls)" : "", c->attention == DT_ATTN_CUDNN ? "cuDNN's (log-sum-exps)" : p->flash ? "flash (log-sum-exps)" : "T x T",
            ordinal, gpu);
    fprintf(f, "memory on the GPU (the pre-flight's count): parameters, gradients and AdamW's moments%s %.2f GiB; activations and "
               "work %.2f GiB; total %.2f GiB: %s the %.2f GiB free\n",
            c->precision == DT_BF16 ? ", and their bf16 copy" : "", gib(p->state), gib(p->need - p->state), gib(p->need),
            p->fits ? "fits in" : "does NOT fit in", gib(p->free_bytes));
    if (!p->timed) return;
    fprintf(f, "step time (timed on the GPU at this batch, the model with 1 layer and with 2): a block %.2f ms x %d, the rest "
               "%.2f ms (embedding, head and loss, the update)\n  step %.1f ms, %.0f tokens/s\n",
            p->block_ms, cfg->num_layers, p->rest_ms, p->step_ms, tokens / (p->step_ms / 1e3));
}

static void print_json(const dt_train_config *c, const dt_gpt2_config *cfg, const char *gpu, int ordinal, const dt_gpu_plan *p, FILE *f) {
    cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "device", "cuda");
    cJSON_AddStringToObject(o, "gpu", gpu);
    cJSON_AddNumberToObject(o, "ordinal", ordinal);
    cJSON_AddNumberToObject(o, "params", (double)dt_gpt2_config_num_params(cfg));
    cJSON_AddNumberToObject(o, "state", (double)p->state);
    cJSON_AddNumberToObject(o, "activations", (double)(p->need - p->state));
    cJSON_AddNumberToObject(o, "total", (double)p->need);
    cJSON_AddNumberToObject(o, "free", (double)p->free_bytes);
    cJSON_AddBoolToObject(o, "fits", p->fits);
    cJSON_AddStringToObject(o, "attention", c->attention == DT_ATTN_CUDNN ? "cudnn" : p->flash ? "flash" : "full");
    if (p->timed) {
        cJSON_AddNumberToObject(o, "step_ms", p->step_ms);
        cJSON_AddNumberToObject(o, "tok_per_s", (double)c->batch * c->seq / (p->step_ms / 1e3));
        cJSON_AddNumberToObject(b, "block_ms", p->block_ms);
        cJSON_AddNumberToObject(b, "layers", cfg->num_layers);
        cJSON_AddNumberToObject(b, "rest_ms", p->rest_ms);
    }
    cJSON_AddItemToObject(o, "breakdown", b);
    char *s = cJSON_PrintUnformatted(o);
    if (s) fprintf(f, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

int dt_train_plan_gpu(const dt_train_config *c, const dt_plan_request *rq, const dt_gpt2_config *cfg, int nranks, FILE *f) {
    dt_status st = dt_train_device_check(c, nranks);
    if (!st && nranks > 1)
        st = dt_error(DT_ERR_UNSUPPORTED, "plan --device cuda: it plans one GPU's step; %d ranks over GPUs are not priced yet", nranks);
    if (!st && (rq->search || rq->params > 0 || strcmp(rq->hardware, "this")))
        st = dt_error(DT_ERR_UNSUPPORTED, "plan --device cuda: the GPU here is measured (not with --search, --params or --hardware)");
    if (!st && (c->batch < 1 || c->seq < 1 || c->seq > cfg->max_seq_len))
        st = dt_error(DT_ERR_ARG, "plan --device cuda: batch %d x %d positions (at most %d)", c->batch, c->seq, cfg->max_seq_len);
    const dt_gpu_api *api = NULL;
    dt_gpu *g = NULL;
    int ordinal = c->cuda - 1;
    dt_gpu_plan p;
    if (!st) st = dt_gpu_api_load(&api);
    if (!st) st = api->open(ordinal, &g);
    if (!st) {
        api->set_tf32(g, c->tf32);
        dt_attn_mode att = (dt_attn_mode)c->attention;
        st = api->lm_plan(g, cfg, c->precision == DT_BF16 ? DT_BF16 : DT_F32, att, c->batch, c->seq, &c->opt, &p);
    }
    if (!st) {
        if (rq->json) print_json(c, cfg, api->name(g), ordinal, &p, f);
        else print_text(c, cfg, api->name(g), ordinal, &p, f);
    }
    if (g) api->close(g);
    if (st) {
        dt_log(DT_LOG_ERROR, "plan: %s", dt_last_error());
        return 2;
    }
    return 0;
}
