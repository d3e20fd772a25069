/* Hardware the planner prices a layout on: this machine (measured, in
 * this_machine.c), a preset (A100 40 GB, H100 80 GB: the vendors' published
 * figures), or a JSON file of the same fields. */
#include "plan_internal.h"
#include "io/json_text.h"

#include "dtrain/base.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* NVIDIA's data sheets (dense, no sparsity): A100 SXM 40 GB: 312 TFLOP/s bf16, 19.5 fp32 (156 TF32), 1555 GB/s HBM, NVLink 600 GB/s
 * both ways; H100 SXM 80 GB: 989 bf16, 67 fp32 (494 TF32), 3350 GB/s, NVLink 900 GB/s. Between nodes, DGX's one 200 (A100) or
 * 400 (H100) Gbit/s InfiniBand port per GPU. Latencies are typical NCCL figures (a few microseconds). The efficiency is what large
 * GEMMs reach in practice (Megatron's published runs: 50-60% of peak for whole steps). */
static const dt_plan_hardware presets[] = {
    { .name = "a100-40g", .memory = 40.0 * (1 << 30), .devices_per_node = 8, .cores_per_device = 1, .flops_f32 = 156e12,
      .flops_lowp = 312e12, .mem_bw = 1555e9, .intra_alpha = 5e-6, .intra_beta = 1 / 300e9, .inter_alpha = 10e-6, .inter_beta = 1 / 25e9,
      .gemm_efficiency = 0.7, .attention_efficiency = 0.7 },
    { .name = "h100-80g", .memory = 80.0 * (1 << 30), .devices_per_node = 8, .cores_per_device = 1, .flops_f32 = 494e12,
      .flops_lowp = 989e12, .mem_bw = 3350e9, .intra_alpha = 5e-6, .intra_beta = 1 / 450e9, .inter_alpha = 10e-6, .inter_beta = 1 / 50e9,
      .gemm_efficiency = 0.7, .attention_efficiency = 0.7 },
};

/* key of o: a number above 0 (below hi), or an error naming it. */
static dt_status field(const char *path, const cJSON *o, const char *key, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return dt_error(DT_ERR_ARG, "%s: the field \"%s\" is missing", path, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > hi)
        return dt_error(DT_ERR_ARG, "%s: the field \"%s\" must be a number above 0%s", path, key, hi < 1e30 ? " and at most 1" : "");
    *out = v->valuedouble;
    return DT_OK;
}

static dt_status from_file(const char *path, dt_plan_hardware *h) {
    char *buf;
    dt_status st = dt_file_read_text(path, 1 << 20, &buf, NULL);
    if (st) return st;
    cJSON *j = dt_json_parse_whole(buf); /* text after the object is not ignored */
    free(buf);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_error(DT_ERR_ARG, "%s: not one JSON object (the fields: see docs/planner.md)", path);
    }
    memset(h, 0, sizeof *h);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *sh = cJSON_GetObjectItemCaseSensitive(j, "shared_memory");
    snprintf(h->name, sizeof h->name, "%s", cJSON_IsString(name) ? name->valuestring : path);
    double mem_gb = 0, dev = 0, f32 = 0, lowp = 0, bw = 0, ia = 0, ibw = 0, xa = 0, xbw = 0, eff = 0.7, aeff = 0.7;
    st = field(path, j, "memory_gb", 1e40, &mem_gb);
    if (!st) st = field(path, j, "devices_per_node", 1e40, &dev);
    if (!st) st = field(path, j, "tflops_f32", 1e40, &f32);
    if (!st) st = field(path, j, "tflops_bf16", 1e40, &lowp);
    if (!st) st = field(path, j, "memory_bandwidth_gbs", 1e40, &bw);
    if (!st) st = field(path, j, "intra_node_latency_us", 1e40, &ia);
    if (!st) st = field(path, j, "intra_node_bandwidth_gbs", 1e40, &ibw);
    if (!st) st = field(path, j, "inter_node_latency_us", 1e40, &xa);
    if (!st) st = field(path, j, "inter_node_bandwidth_gbs", 1e40, &xbw);
    if (!st && cJSON_GetObjectItemCaseSensitive(j, "gemm_efficiency")) st = field(path, j, "gemm_efficiency", 1, &eff);
    if (!st && cJSON_GetObjectItemCaseSensitive(j, "attention_efficiency")) st = field(path, j, "attention_efficiency", 1, &aeff);
    double reserved = -1, slow = 0;
    if (!st && cJSON_GetObjectItemCaseSensitive(j, "reserved_gb")) st = field(path, j, "reserved_gb", 1e40, &reserved);
    /* the link's processing on the ranks' cores (as `bench comm --calibrate` measures it): 0 (none, the default) up to 10x */
    const cJSON *sl = cJSON_GetObjectItemCaseSensitive(j, "inter_node_slowdown");
    if (!st && sl) {
        if (cJSON_IsNumber(sl) && sl->valuedouble >= 0 && sl->valuedouble < 10) slow = sl->valuedouble;
        else st = dt_error(DT_ERR_ARG, "%s: the field \"inter_node_slowdown\" must be a number from 0 up to (not including) 10", path);
    }
    if (!st && sh && !cJSON_IsBool(sh)) st = dt_error(DT_ERR_ARG, "%s: the field \"shared_memory\" must be true or false", path);
    if (!st && dev != floor(dev)) st = dt_error(DT_ERR_ARG, "%s: the field \"devices_per_node\" must be a whole number", path);
    if (!st) {
        h->memory = mem_gb * 1e9, h->devices_per_node = (int)dev, h->shared_memory = cJSON_IsTrue(sh), h->cores_per_device = 1;
        h->flops_f32 = f32 * 1e12, h->flops_lowp = lowp * 1e12, h->mem_bw = bw * 1e9;
        h->intra_alpha = ia * 1e-6, h->intra_beta = 1 / (ibw * 1e9), h->inter_alpha = xa * 1e-6, h->inter_beta = 1 / (xbw * 1e9);
        h->gemm_efficiency = eff, h->attention_efficiency = aeff;
        h->reserved = reserved >= 0 ? reserved * 1e9 : -1, h->inter_slowdown = slow;
    }
    cJSON_Delete(j);
    return st;
}

/* A device's memory that a job cannot have (GPUs; a CPU machine's available memory is the job's): unless given, 1 GiB
 * for the CUDA context and NCCL's buffers and 5% for the caching allocator's fragmentation. */
static void reserve(dt_plan_hardware *h) {
    if (h->shared_memory) h->reserved = 0;
    else if (h->reserved < 0) h->reserved = 1073741824.0 + 0.05 * h->memory;
}

dt_status dt_plan_hardware_get(const char *name, dt_plan_hardware *h) {
    if (!name || !strcmp(name, "this")) return dt_plan_this_machine(h);
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcasecmp(name, presets[i].name)) {
            *h = presets[i];
            h->reserved = -1; /* the default */
            reserve(h);
            return DT_OK;
        }
    if (access(name, R_OK) != 0) return dt_error(DT_ERR_ARG, "--hardware %s: not a preset (this, a100-40g, h100-80g) nor a readable JSON file", name);
    dt_status st = from_file(name, h);
    if (!st) reserve(h);
    return st;
}
