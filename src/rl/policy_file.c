/* A policy's file: its tensors under PyTorch's names, and the observation
 * statistics it was trained under, which playing it needs as much as its
 * weights. */
#include "dtrain/io.h"
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *saved_params(void *buf) { return buf; }

static dt_tensor_info stat_tensor(const char *name, size_t offset, int n) {
    dt_tensor_info t = { .ndim = 1, .shape = { n }, .offset = offset, .count = (size_t)n };
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(t.hf, sizeof t.hf, "%s", name);
    dt_tensor_set_whole(&t);
    return t;
}

dt_status dt_policy_save(dt_policy *p, const char *path, int obs_dim, const double *obs_mean, const double *obs_var) {
    dt_model m;
    dt_policy_model(p, &m);
    if (!obs_mean) return dt_safetensors_save_table(path, &m, 0, DT_F32);
    size_t n = m.nparams;
    dt_tensor_info *tab = malloc(sizeof *tab * (size_t)(m.ntensors + 2));
    float *buf = malloc(sizeof(float) * (n + 2 * (size_t)obs_dim));
    if (!tab || !buf) {
        free(tab);
        free(buf);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory saving the policy", path);
    }
    memcpy(tab, m.tensors, sizeof *tab * (size_t)m.ntensors);
    memcpy(buf, dt_policy_params(p), sizeof(float) * n);
    for (int i = 0; i < obs_dim; i++) {
        buf[n + (size_t)i] = (float)obs_mean[i];
        buf[n + (size_t)obs_dim + (size_t)i] = (float)obs_var[i];
    }
    tab[m.ntensors] = stat_tensor("obs_rms.mean", n, obs_dim);
    tab[m.ntensors + 1] = stat_tensor("obs_rms.var", n + (size_t)obs_dim, obs_dim);
    dt_model with = { .self = buf, .kind = "policy", .tensors = tab, .ntensors = m.ntensors + 2, .params = saved_params };
    dt_status st = dt_safetensors_save_table(path, &with, 0, DT_F32);
    free(tab);
    free(buf);
    return st;
}

dt_status dt_policy_load(dt_policy *p, const char *path, int obs_dim, float *obs_mean, float *obs_var, int *has_norm) {
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (st) return st;
    dt_model m;
    dt_policy_model(p, &m);
    st = dt_safetensors_read_model(f, &m, 0, NULL);
    *has_norm = !st && dt_safetensors_has(f, "obs_rms.mean");
    if (*has_norm) st = dt_safetensors_read(f, "obs_rms.mean", 1, &obs_dim, 0, obs_mean);
    if (*has_norm && !st) st = dt_safetensors_read(f, "obs_rms.var", 1, &obs_dim, 0, obs_var);
    dt_safetensors_close(f);
    return st;
}
