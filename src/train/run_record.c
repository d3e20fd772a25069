/* run.json: what a report needs to know about a run besides its metrics:
 * the command line, the settings, the model, the machine and its peak, the
 * memory by category, and every rank's I/O. Written by rank 0 at the end. */
#include "dtrain/train.h"
#include "dtrain/pipeline.h"
#include "dtrain/io.h"

#include "io/json_file.h"
#include "obs/run_json.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_settings(cJSON *j, const dt_train_config *c, const dt_run_record *r) {
    cJSON *s = cJSON_AddObjectToObject(j, "settings");
    const dt_gpt2_config *o = &c->shape;
    cJSON_AddStringToObject(s, "model", o->num_layers || o->channels || o->vocab_size || o->num_heads ? "custom" : c->model);
    cJSON_AddNumberToObject(s, "layers", r->model.num_layers);
    cJSON_AddNumberToObject(s, "heads", r->model.num_heads);
    cJSON_AddNumberToObject(s, "channels", r->model.channels);
    cJSON_AddNumberToObject(s, "vocab", r->model.vocab_size);
    cJSON_AddNumberToObject(s, "parameters", (double)r->params);
    cJSON_AddNumberToObject(s, "batch", c->batch);
    cJSON_AddNumberToObject(s, "seq", c->seq);
    cJSON_AddNumberToObject(s, "grad_accum", c->grad_accum);
    cJSON_AddNumberToObject(s, "ranks", r->nranks);
    cJSON_AddNumberToObject(s, "tp", c->tp > 1 ? c->tp : 1); /* ranks / (tp x pp x cp) of them read different samples */
    cJSON_AddNumberToObject(s, "cp", c->cp > 1 ? c->cp : 1);
    cJSON_AddBoolToObject(s, "sp", c->sp != 0);
    cJSON_AddNumberToObject(s, "pp", c->pp > 1 ? c->pp : 1);
    cJSON_AddStringToObject(s, "pp_schedule", dt_pp_kind_name((dt_pp_kind)c->pp_schedule));
    cJSON_AddStringToObject(s, "pp_wire", dt_pp_wire_name((dt_pp_wire)c->pp_wire));
    cJSON_AddStringToObject(s, "cp_wire", dt_pp_wire_name((dt_pp_wire)c->cp_wire));
    cJSON_AddNumberToObject(s, "threads_per_rank", c->threads);
    cJSON_AddStringToObject(s, "strategy", r->strategy);
    cJSON_AddStringToObject(s, "optimizer", dt_optim_kind_name(c->opt.kind));
    if (c->kfac_on) cJSON_AddNumberToObject(s, "kfac_workers", c->kfac.workers);
    cJSON_AddNumberToObject(s, "lr", c->sched.lr);
    cJSON_AddStringToObject(s, "schedule", dt_schedule_name(c->sched.kind));
    cJSON_AddNumberToObject(s, "warmup", c->sched.warmup);
    cJSON_AddNumberToObject(s, "grad_clip", c->grad_clip);
    cJSON_AddNumberToObject(s, "steps", c->steps);
    cJSON_AddNumberToObject(s, "steps_done", r->steps_done);
    cJSON_AddStringToObject(s, "data", c->data ? c->data : "");
    cJSON_AddBoolToObject(s, "recompute", c->recompute != 0);
    cJSON_AddStringToObject(s, "precision", dt_precision_name(c->precision));
    cJSON_AddStringToObject(s, "grad_comm", dt_precision_name(c->grad_comm));
    cJSON_AddStringToObject(s, "grad_store", dt_precision_name(c->grad_store));
}

/* name: each rank's fields [first, first + n) of its DT_RUN_RANK_FIELDS, under keys, with its rank. */
static void per_rank(cJSON *j, const char *name, const dt_run_record *r, int first, const char *const *keys, int n) {
    cJSON *arr = cJSON_AddArrayToObject(j, name);
    for (int k = 0; k < r->nranks; k++) {
        const double *v = r->ranks + (size_t)k * DT_RUN_RANK_FIELDS + first;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", k);
        for (int i = 0; i < n; i++) cJSON_AddNumberToObject(e, keys[i], v[i]);
        cJSON_AddItemToArray(arr, e);
    }
}

dt_status dt_run_record_write(const char *path, const dt_train_config *c, const dt_run_record *r) {
    cJSON *j = cJSON_CreateObject();
    char cpu[256];
    dt_run_json_command(j, c->argc, c->argv);
    add_settings(j, c, r);
    dt_cpu_model(cpu, sizeof cpu);
    cJSON *m = cJSON_AddObjectToObject(j, "machine");
    cJSON_AddStringToObject(m, "cpu", cpu);
    cJSON_AddNumberToObject(m, "peak_gflops", r->peak_gflops);
    cJSON_AddStringToObject(m, "peak_source", r->peak_source ? r->peak_source : "none");
    if (r->device) { /* --device cuda: rank 0's GPU */
        cJSON *d = cJSON_AddObjectToObject(j, "device");
        cJSON_AddStringToObject(d, "kind", "cuda");
        cJSON_AddStringToObject(d, "name", r->device);
        cJSON_AddNumberToObject(d, "ordinal", r->device_ordinal);
        cJSON_AddNumberToObject(d, "memory_used_bytes", r->device_used);
        cJSON_AddNumberToObject(d, "memory_total_bytes", r->device_total);
        cJSON_AddBoolToObject(d, "tf32", c->tf32 != 0);
        cJSON_AddStringToObject(d, "attention", r->device_flash ? "flash" : "T x T probabilities");
    }
    cJSON_AddNumberToObject(j, "flops_per_step", r->flops_per_step);
    cJSON_AddNumberToObject(j, "wall_s", r->wall_s);
    cJSON *mem = cJSON_AddObjectToObject(j, "memory_bytes");
    static const char *const mem_names[] = { "parameters", "gradients", "activations", "optimizer", "peak_rss" };
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(mem, mem_names[i], r->memory[i]);
    cJSON *io = cJSON_AddArrayToObject(j, "io");
    for (int k = 0; k < r->nranks; k++) {
        const double *v = r->ranks + (size_t)k * DT_RUN_RANK_FIELDS;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", k);
        cJSON_AddNumberToObject(e, "data_read_bytes", v[0]);
        cJSON_AddNumberToObject(e, "data_read_s", v[1]);
        cJSON_AddNumberToObject(e, "ckpt_write_bytes", v[2]);
        cJSON_AddNumberToObject(e, "ckpt_write_s", v[3]);
        cJSON_AddNumberToObject(e, "ckpt_read_bytes", v[4]);
        cJSON_AddNumberToObject(e, "ckpt_read_s", v[5]);
        cJSON_AddItemToArray(io, e);
    }
    static const char *const mem_keys[6] = { "parameters", "gradients", "optimizer", "buffers", "activations", "peak_rss" };
    per_rank(j, "memory_per_rank", r, 6, mem_keys, 6);
    /* each rank's place: the report names its rows "stage 1", "TP rank 0" from it */
    static const char *const axes[4] = { "dp", "tp", "pp", "cp" };
    per_rank(j, "placement", r, 12, axes, 4);
    cJSON_AddStringToObject(j, "metrics", r->metrics ? r->metrics : "");
    cJSON_AddStringToObject(j, "trace", r->trace ? r->trace : "");
    return dt_json_write_file(j, 1, path);
}
