/* --config: the subset of DeepSpeed's JSON config that a single-process GPT-2
 * run uses. Flags given on the command line override the file. */
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status number(const char *path, const cJSON *o, const char *key, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!v) return DT_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return dt_error(DT_ERR_ARG, "%s: \"%s\" must be a number in [%g, %g]", path, key, lo, hi);
    *out = v->valuedouble;
    return DT_OK;
}

static void warn_unknown(const char *path, const char *where, const cJSON *o, const char *const *known) {
    for (const cJSON *it = o->child; it; it = it->next) {
        int ok = 0;
        for (int k = 0; known[k]; k++) ok |= !strcmp(it->string, known[k]);
        if (!ok) dt_log(DT_LOG_WARN, "%s: ignoring unknown key \"%s%s\"", path, where, it->string);
    }
}

dt_status dt_train_config_load(const char *path, dt_train_config *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!text || got != (size_t)n) { free(text); return dt_error(DT_ERR_IO, "%s: cannot read", path); }
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        long off = e ? (long)(e - text) : -1;
        free(text);
        return dt_error(DT_ERR_IO, "%s: not valid JSON (near byte %ld)", path, off);
    }
    static const char *top[] = { "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
                                 "gradient_clipping", "steps", "train_batch_size", NULL };
    warn_unknown(path, "", root, top);
    double x;
    dt_status st = DT_OK;
    if (!st && (x = -1, st = number(path, root, "train_micro_batch_size_per_gpu", 1, 1e6, &x), !st) && x > 0) c->batch = (int)x;
    if (!st && (x = -1, st = number(path, root, "gradient_accumulation_steps", 1, 1e6, &x), !st) && x > 0) c->grad_accum = (int)x;
    if (!st && (x = -1, st = number(path, root, "gradient_clipping", 0, 1e9, &x), !st) && x >= 0) c->grad_clip = (float)x;
    if (!st && (x = -1, st = number(path, root, "steps", 1, 1e9, &x), !st) && x > 0) c->steps = (int)x;
    const cJSON *opt = cJSON_GetObjectItem(root, "optimizer");
    if (!st && opt) {
        const cJSON *type = cJSON_GetObjectItem(opt, "type"), *p = cJSON_GetObjectItem(opt, "params");
        dt_optim_kind kind;
        char lower[32] = "";
        if (cJSON_IsString(type)) {
            snprintf(lower, sizeof lower, "%s", type->valuestring);
            for (char *q = lower; *q; q++) *q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
            if (!strcmp(lower, "adam")) strcpy(lower, "adamw"); /* DeepSpeed's Adam with weight decay is AdamW */
        }
        if (!cJSON_IsString(type) || dt_optim_parse_kind(lower, &kind))
            st = dt_error(DT_ERR_ARG, "%s: \"optimizer.type\" must be one of AdamW, Adam, SGD, LAMB, LARS", path);
        if (!st) {
            dt_optim_config keep = c->opt;
            dt_optim_defaults(kind, &c->opt);
            c->opt.weight_decay = keep.weight_decay;
        }
        if (!st && p) {
            static const char *known[] = { "lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "trust_coef", NULL };
            warn_unknown(path, "optimizer.params.", p, known);
            if (!st && (x = -1, st = number(path, p, "lr", 1e-12, 10, &x), !st) && x > 0) c->lr = (float)x;
            if (!st && (x = -1, st = number(path, p, "eps", 1e-30, 1, &x), !st) && x > 0) c->opt.eps = (float)x;
            if (!st && (x = -1, st = number(path, p, "weight_decay", 0, 10, &x), !st) && x >= 0) c->opt.weight_decay = (float)x;
            if (!st && (x = -1, st = number(path, p, "momentum", 0, 0.999999, &x), !st) && x >= 0) c->opt.momentum = (float)x;
            if (!st && (x = -1, st = number(path, p, "trust_coef", 1e-9, 10, &x), !st) && x > 0) c->opt.trust_coef = (float)x;
            const cJSON *b = cJSON_GetObjectItem(p, "betas"), *nest = cJSON_GetObjectItem(p, "nesterov");
            if (!st && b) {
                if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(b, 0)) ||
                    !cJSON_IsNumber(cJSON_GetArrayItem(b, 1)) || !(cJSON_GetArrayItem(b, 0)->valuedouble >= 0 &&
                    cJSON_GetArrayItem(b, 0)->valuedouble < 1 && cJSON_GetArrayItem(b, 1)->valuedouble >= 0 &&
                    cJSON_GetArrayItem(b, 1)->valuedouble < 1))
                    st = dt_error(DT_ERR_ARG, "%s: \"optimizer.params.betas\" must be two numbers in [0, 1)", path);
                else {
                    c->opt.beta1 = (float)cJSON_GetArrayItem(b, 0)->valuedouble;
                    c->opt.beta2 = (float)cJSON_GetArrayItem(b, 1)->valuedouble;
                }
            }
            if (!st && nest) c->opt.nesterov = cJSON_IsTrue(nest);
        }
    }
    const cJSON *sch = cJSON_GetObjectItem(root, "scheduler");
    if (!st && sch) {
        const cJSON *type = cJSON_GetObjectItem(sch, "type"), *p = cJSON_GetObjectItem(sch, "params");
        if (!cJSON_IsString(type) || (strcmp(type->valuestring, "WarmupCosineLR") && strcmp(type->valuestring, "WarmupDecayLR") &&
                                      strcmp(type->valuestring, "WarmupLR")))
            st = dt_error(DT_ERR_ARG, "%s: \"scheduler.type\" must be WarmupLR, WarmupDecayLR or WarmupCosineLR", path);
        else c->schedule = strcmp(type->valuestring, "WarmupLR") ? DT_SCHED_COSINE : DT_SCHED_CONSTANT;
        if (!st && p) {
            static const char *known[] = { "warmup_num_steps", "total_num_steps", "warmup_max_lr", "warmup_min_lr", "cos_min_ratio", NULL };
            warn_unknown(path, "scheduler.params.", p, known);
            if (!st && (x = -1, st = number(path, p, "warmup_num_steps", 0, 1e9, &x), !st) && x >= 0) c->warmup = (int)x;
            if (!st && (x = -1, st = number(path, p, "total_num_steps", 1, 1e9, &x), !st) && x > 0) c->steps = (int)x;
            if (!st && (x = -1, st = number(path, p, "warmup_max_lr", 1e-12, 10, &x), !st) && x > 0) c->lr = (float)x;
            if (!st && (x = -1, st = number(path, p, "warmup_min_lr", 0, 10, &x), !st) && x >= 0) c->lr_min = (float)x;
        }
    }
    cJSON_Delete(root);
    free(text);
    return st;
}
