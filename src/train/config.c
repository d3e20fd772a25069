/* --config: the subset of DeepSpeed's JSON config that a single-process GPT-2
 * run uses. Flags given on the command line override the file. */
#include "dtrain/train.h"
#include "io/json_text.h"
#include "dtrain/io.h"
#include "dtrain/obs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys whose value is "auto" (HF's DeepSpeed integration writes them): they
 * keep the flag's value or dtrain's default, and are named all at once. */
static char autos[1024];

static void note_auto(const char *where, const char *key) {
    size_t n = strlen(autos);
    snprintf(autos + n, sizeof autos - n, "%s%s%s", n ? ", " : "", where, key);
}

static bool is_auto(const cJSON *v) { return cJSON_IsString(v) && !strcmp(v->valuestring, "auto"); }

/* key of o, a number in [lo, hi], into *out (left alone when absent or
 * "auto"). where is o's path ("optimizer.params."), so an error names the
 * whole key ("optimizer.params.lr"). */
static dt_status number(const char *path, const char *where, const cJSON *o, const char *key, double lo, double hi, double *out) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (!v) return DT_OK;
    if (is_auto(v)) { note_auto(where, key); return DT_OK; }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return dt_error(DT_ERR_ARG, "%s: \"%s%s\" must be a number in [%g, %g]", path, where, key, lo, hi);
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

/* The value of key in o when it is an object (or absent); anything else is an error naming it. */
static dt_status object(const char *path, const cJSON *o, const char *key, const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(o, key);
    if (*out && !cJSON_IsObject(*out)) return dt_error(DT_ERR_ARG, "%s: \"%s\" must be a JSON object", path, key);
    return DT_OK;
}

static dt_status read_optimizer(const char *path, const cJSON *opt, dt_train_config *c) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(opt, "type"), *p;
    static const char *top[] = { "type", "params", NULL };
    warn_unknown(path, "optimizer.", opt, top);
    dt_status st = object(path, opt, "params", &p);
    if (st) return st;
    dt_optim_kind kind;
    char lower[32] = "";
    if (cJSON_IsString(type)) {
        snprintf(lower, sizeof lower, "%s", type->valuestring);
        for (char *q = lower; *q; q++) *q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
        if (!strcmp(lower, "adam")) strcpy(lower, "adamw"); /* DeepSpeed's Adam with weight decay is AdamW */
    }
    if (!cJSON_IsString(type) || dt_optim_parse_kind(lower, &kind))
        return dt_error(DT_ERR_ARG, "%s: \"optimizer.type\" must be one of AdamW, Adam, SGD, LAMB, LARS", path);
    dt_optim_config keep = c->opt;
    dt_optim_defaults(kind, &c->opt);
    c->opt.weight_decay = keep.weight_decay;
    if (!p) return DT_OK;
    static const char *known[] = { "lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "trust_coef", NULL };
    warn_unknown(path, "optimizer.params.", p, known);
    double x;
    if (!st && (x = -1, st = number(path, "optimizer.params.", p, "lr", 1e-12, 10, &x), !st) && x > 0) c->sched.lr = (float)x;
    if (!st && (x = -1, st = number(path, "optimizer.params.", p, "eps", 1e-30, 1, &x), !st) && x > 0) c->opt.eps = (float)x;
    if (!st && (x = -1, st = number(path, "optimizer.params.", p, "weight_decay", 0, 10, &x), !st) && x >= 0) c->opt.weight_decay = (float)x;
    if (!st && (x = -1, st = number(path, "optimizer.params.", p, "momentum", 0, 0.999999, &x), !st) && x >= 0) c->opt.momentum = (float)x;
    if (!st && (x = -1, st = number(path, "optimizer.params.", p, "trust_coef", 1e-9, 10, &x), !st) && x > 0) c->opt.trust_coef = (float)x;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(p, "betas"), *nest = cJSON_GetObjectItemCaseSensitive(p, "nesterov");
    if (!st && is_auto(b)) note_auto("optimizer.params.", "betas");
    else if (!st && b) {
        const cJSON *b0 = cJSON_GetArrayItem(b, 0), *b1 = cJSON_GetArrayItem(b, 1);
        if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(b0) || !cJSON_IsNumber(b1) ||
            !(b0->valuedouble >= 0 && b0->valuedouble < 1 && b1->valuedouble >= 0 && b1->valuedouble < 1))
            st = dt_error(DT_ERR_ARG, "%s: \"optimizer.params.betas\" must be two numbers in [0, 1)", path);
        else {
            c->opt.beta1 = (float)b0->valuedouble;
            c->opt.beta2 = (float)b1->valuedouble;
        }
    }
    if (!st && nest) {
        if (!cJSON_IsBool(nest)) st = dt_error(DT_ERR_ARG, "%s: \"optimizer.params.nesterov\" must be true or false", path);
        else c->opt.nesterov = cJSON_IsTrue(nest);
    }
    return st;
}

/* DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR with their own
 * parameters and defaults (dt_lr_at has the formulas). */
static dt_status read_scheduler(const char *path, const cJSON *sch, dt_train_config *c) {
    static const struct { const char *name; dt_schedule_kind kind; } kinds[] = {
        { "WarmupLR", DT_SCHED_DS_WARMUP }, { "WarmupDecayLR", DT_SCHED_DS_WARMUP_DECAY },
        { "WarmupCosineLR", DT_SCHED_DS_WARMUP_COSINE },
    };
    static const char *top[] = { "type", "params", NULL };
    warn_unknown(path, "scheduler.", sch, top);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type"), *p;
    dt_status st = object(path, sch, "params", &p);
    if (st) return st;
    int k = -1;
    for (int i = 0; i < 3 && cJSON_IsString(type); i++)
        if (!strcmp(type->valuestring, kinds[i].name)) k = i;
    if (k < 0) return dt_error(DT_ERR_ARG, "%s: \"scheduler.type\" must be WarmupLR, WarmupDecayLR or WarmupCosineLR", path);
    dt_schedule *s = &c->sched;
    s->kind = kinds[k].kind;
    /* DeepSpeed's defaults */
    s->warmup = 1000;
    s->linear_warmup = 0;
    s->lr_min = 0;
    s->warmup_min_ratio = 0;
    s->cos_min_ratio = 1e-4f;
    if (s->kind != DT_SCHED_DS_WARMUP_COSINE) s->lr = 1e-3f;
    static const char *known[3][6] = {
        { "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", NULL },
        { "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps", NULL },
        { "warmup_min_ratio", "warmup_num_steps", "warmup_type", "total_num_steps", "cos_min_ratio", NULL },
    };
    if (p) warn_unknown(path, "scheduler.params.", p, known[k]);
    double x;
    if (!st && (x = -1, st = number(path, "scheduler.params.", p, "warmup_num_steps", 0, 1e9, &x), !st) && x >= 0) s->warmup = (int)x;
    if (!st && (x = -1, st = number(path, "scheduler.params.", p, "total_num_steps", 1, 1e9, &x), !st) && x > 0) s->total = (int)x;
    if (!st && s->kind != DT_SCHED_DS_WARMUP_COSINE) {
        if ((x = -1, st = number(path, "scheduler.params.", p, "warmup_max_lr", 0, 10, &x), !st) && x >= 0) s->lr = (float)x;
        if (!st && (x = -1, st = number(path, "scheduler.params.", p, "warmup_min_lr", 0, 10, &x), !st) && x >= 0) s->lr_min = (float)x;
    }
    if (!st && s->kind == DT_SCHED_DS_WARMUP_COSINE) {
        if ((x = -1, st = number(path, "scheduler.params.", p, "warmup_min_ratio", 0, 1, &x), !st) && x >= 0) s->warmup_min_ratio = (float)x;
        if (!st && (x = -1, st = number(path, "scheduler.params.", p, "cos_min_ratio", 0, 1, &x), !st) && x >= 0) s->cos_min_ratio = (float)x;
    }
    const cJSON *wt = p ? cJSON_GetObjectItemCaseSensitive(p, "warmup_type") : NULL;
    if (!st && wt) {
        if (!cJSON_IsString(wt) || (strcmp(wt->valuestring, "log") && strcmp(wt->valuestring, "linear")))
            st = dt_error(DT_ERR_ARG, "%s: \"scheduler.params.warmup_type\" must be \"log\" or \"linear\"", path);
        else s->linear_warmup = !strcmp(wt->valuestring, "linear");
    }
    if (!st && s->kind != DT_SCHED_DS_WARMUP && !s->total)
        st = dt_error(DT_ERR_ARG, "%s: %s needs \"scheduler.params.total_num_steps\"", path, kinds[k].name);
    return st;
}

/* "trace": "FILE.json", "trace_steps": "A:B" (as --trace, --trace-steps). */
static dt_status read_trace(const char *path, const cJSON *root, dt_train_config *c) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "trace"), *s = cJSON_GetObjectItemCaseSensitive(root, "trace_steps");
    if (t && (!cJSON_IsString(t) || !*t->valuestring))
        return dt_error(DT_ERR_ARG, "%s: \"trace\" must be a file path (\"trace.json\")", path);
    if (s && (!cJSON_IsString(s) || dt_trace_parse_steps(s->valuestring, &c->trace_first, &c->trace_last)))
        return dt_error(DT_ERR_ARG, "%s: \"trace_steps\" must be \"A:B\", the first and last step to trace (1 <= A <= B)", path);
    /* the path outlives the parsed document (one config per process) */
    static char kept[4096];
    if (t && snprintf(kept, sizeof kept, "%s", t->valuestring) >= (int)sizeof kept)
        return dt_error(DT_ERR_ARG, "%s: \"trace\" is longer than %zu characters", path, sizeof kept - 1);
    if (t) c->trace = kept;
    return DT_OK;
}

/* "zero_optimization": {"stage": 0..3, "reduce_bucket_size": elements}
 * (stage 0: data parallelism). DeepSpeed's keys that tune its own buffers
 * are accepted and named as ignored: dtrain always overlaps, gathers the
 * parameters in 4M-float pieces (stages 1, 2) and one tensor at a time,
 * prefetching the next unit's (stage 3). */
static dt_status read_zero(const char *path, const cJSON *root, dt_train_config *c) {
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
    if (!z) return DT_OK;
    if (!cJSON_IsObject(z)) return dt_error(DT_ERR_ARG, "%s: \"zero_optimization\" must be an object ({\"stage\": 1})", path);
    static const char *known[] = { "stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "stage3_prefetch_bucket_size",
                                   "stage3_param_persistence_threshold", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                                   "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
                                   "sub_group_size", "round_robin_gradients", NULL };
    static const char *offload[] = { "offload_optimizer", "offload_param", "cpu_offload", NULL };
    const char *known_all[32];
    int nk = 0;
    for (int k = 0; known[k]; k++) known_all[nk++] = known[k];
    for (int k = 0; offload[k]; k++) known_all[nk++] = offload[k];
    known_all[nk] = NULL;
    warn_unknown(path, "zero_optimization.", z, known_all);
    for (int k = 0; offload[k]; k++)
        if (cJSON_GetObjectItemCaseSensitive(z, offload[k]))
            dt_log(DT_LOG_WARN, "%s: zero_optimization.%s is ignored: offloading moves state from a GPU's memory to the CPU's, and "
                   "dtrain's state is in the CPU's memory already", path, offload[k]);
    for (int k = 2; known[k]; k++)
        if (cJSON_GetObjectItemCaseSensitive(z, known[k]))
            dt_log(DT_LOG_WARN, "%s: zero_optimization.%s is accepted and ignored (dtrain overlaps every reduction, and gathers "
                   "the parameters in its own pieces: one tensor at a time under stage 3, the next unit's ahead)", path, known[k]);
    double stage = -1, bucket = 0;
    dt_status st = number(path, "zero_optimization.", z, "stage", 0, 3, &stage);
    if (st) return st;
    if (stage != (double)(int)stage) return dt_error(DT_ERR_ARG, "%s: zero_optimization.stage must be 0, 1, 2 or 3", path);
    static const char *const names[4] = { NULL, "zero1", "zero2", "zero3" };
    if (stage >= 1) c->strategy = names[(int)stage];
    if (cJSON_GetObjectItemCaseSensitive(z, "reduce_bucket_size")) {
        /* DeepSpeed counts elements; dtrain's buckets are in MiB of f32 */
        if ((st = number(path, "zero_optimization.", z, "reduce_bucket_size", 1, 1e12, &bucket))) return st;
        c->bucket_mb = bucket * 4 / 1048576.0;
    }
    return DT_OK;
}

/* "fp16": {"enabled", "loss_scale" (0: dynamic), "initial_scale_power",
 * "loss_scale_window", "hysteresis", "min_loss_scale",
 * "consecutive_hysteresis"} and "bf16": {"enabled"}, with DeepSpeed's
 * defaults: enabling one sets the precision (flags given after --config
 * override it), and the fp16 section's scaler is checked whether enabled or not. */
static dt_status read_precision(const char *path, const cJSON *root, dt_train_config *c) {
    static const char *const sections[2] = { "fp16", "bf16" };
    int enabled[2] = { 0, 0 };
    for (int i = 0; i < 2; i++) {
        const cJSON *s;
        dt_status st = object(path, root, sections[i], &s);
        if (st) return st;
        if (!s) continue;
        static const char *known16[] = { "enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                                         "min_loss_scale", "consecutive_hysteresis", NULL };
        static const char *knownbf[] = { "enabled", NULL };
        warn_unknown(path, i ? "bf16." : "fp16.", s, i ? knownbf : known16);
        const cJSON *on = cJSON_GetObjectItemCaseSensitive(s, "enabled");
        if (is_auto(on)) note_auto(sections[i], ".enabled"), on = NULL; /* the --precision flag decides */
        if (on && !cJSON_IsBool(on)) return dt_error(DT_ERR_ARG, "%s: \"%s.enabled\" must be true or false", path, sections[i]);
        enabled[i] = cJSON_IsTrue(on);
        if (i == 0) {
            dt_loss_scale_config *l = &c->loss_scale;
            dt_loss_scale_defaults(l);
            double v = -1, power = 16;
            if ((st = number(path, "fp16.", s, "loss_scale", 0, 0x1p100, &v))) return st;
            if ((st = number(path, "fp16.", s, "initial_scale_power", 0, 100, &power))) return st;
            if (power != (int)power) return dt_error(DT_ERR_ARG, "%s: \"fp16.initial_scale_power\" must be a whole number", path);
            l->dynamic = v <= 0;
            l->scale = v > 0 ? v : ldexp(1.0, (int)power);
            v = l->window;
            if ((st = number(path, "fp16.", s, "loss_scale_window", 1, 1e9, &v))) return st;
            l->window = (int)v;
            v = l->hysteresis;
            if ((st = number(path, "fp16.", s, "hysteresis", 1, 1e9, &v))) return st;
            l->hysteresis = (int)v;
            if ((st = number(path, "fp16.", s, "min_loss_scale", 0x1p-100, 0x1p100, &l->min_scale))) return st;
            const cJSON *ch = cJSON_GetObjectItemCaseSensitive(s, "consecutive_hysteresis");
            if (ch && !cJSON_IsBool(ch)) return dt_error(DT_ERR_ARG, "%s: \"fp16.consecutive_hysteresis\" must be true or false", path);
            l->consecutive_hysteresis = cJSON_IsTrue(ch);
            if ((st = dt_loss_scale_check(l, path))) return st;
        }
    }
    if (enabled[0] && enabled[1])
        return dt_error(DT_ERR_ARG, "%s: \"fp16.enabled\" and \"bf16.enabled\" are both true; choose one", path);
    if (enabled[0]) c->precision = DT_F16;
    if (enabled[1]) c->precision = DT_BF16;
    return DT_OK;
}

/* "data_types": {"grad_accum_dtype": "fp32" | "bf16" | "fp16"}: DeepSpeed's
 * type for the gradients between backward and the update, our --grad-store. */
static dt_status read_data_types(const char *path, const cJSON *root, dt_train_config *c) {
    const cJSON *s;
    dt_status st = object(path, root, "data_types", &s);
    if (st || !s) return st;
    static const char *known[] = { "grad_accum_dtype", NULL };
    warn_unknown(path, "data_types.", s, known);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "grad_accum_dtype");
    if (!t) return DT_OK;
    if (dt_precision_parse(cJSON_IsString(t) ? t->valuestring : "", &c->grad_store))
        return dt_error(DT_ERR_ARG, "%s: \"data_types.grad_accum_dtype\" must be \"fp32\", \"bf16\" or \"fp16\"", path);
    return DT_OK;
}

/* "communication_data_type": "fp32" | "bf16" | "fp16": DeepSpeed's type for
 * the gradients' reductions, our --grad-comm. */
static dt_status read_comm_type(const char *path, const cJSON *root, dt_train_config *c) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "communication_data_type");
    if (!t || is_auto(t)) return DT_OK;
    if (dt_precision_parse(cJSON_IsString(t) ? t->valuestring : "", &c->grad_comm))
        return dt_error(DT_ERR_ARG, "%s: \"communication_data_type\" must be \"fp32\", \"bf16\" or \"fp16\"", path);
    return DT_OK;
}

/* The file's JSON object (*out, for cJSON_Delete). */
static dt_status parse_file(const char *path, cJSON **out) {
    char *text = NULL;
    size_t len = 0;
    dt_status st = dt_file_read_text(path, 16 << 20, &text, &len);
    if (st) return st;
    /* a NUL would end a key or a value unseen, text after the object would be ignored */
    if (dt_json_holds_nul(text, len)) {
        free(text);
        return dt_error(DT_ERR_IO, "%s: holds a NUL character (\\u0000, or a raw byte): not taken", path);
    }
    cJSON *root = *out = dt_json_parse_whole(text);
    const char *e = root ? NULL : cJSON_GetErrorPtr();
    long off = e ? (long)(e - text) : -1;
    free(text);
    if (!root) return dt_error(DT_ERR_IO, "%s: not valid JSON (near byte %ld; one value, nothing after it)", path, off);
    if (cJSON_IsObject(root)) return DT_OK;
    cJSON_Delete(root), *out = NULL;
    return dt_error(DT_ERR_ARG, "%s: the top level must be a JSON object ({\"train_micro_batch_size_per_gpu\": ...})", path);
}

dt_status dt_train_config_load(const char *path, dt_train_config *c) {
    cJSON *root = NULL;
    dt_status pst = parse_file(path, &root);
    if (pst) return pst;
    static const char *top[] = { "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
                                 "gradient_clipping", "steps", "train_batch_size", "trace", "trace_steps", "zero_optimization",
                                 "fp16", "bf16", "data_types", "communication_data_type", "wall_clock_breakdown", "steps_per_print",
                                 NULL };
    warn_unknown(path, "", root, top);
    autos[0] = 0;
    double x;
    dt_status st = DT_OK;
    if (!st && (x = -1, st = number(path, "", root, "train_micro_batch_size_per_gpu", 1, 1e6, &x), !st) && x > 0) c->batch = (int)x;
    if (!st && (x = -1, st = number(path, "", root, "gradient_accumulation_steps", 1, 1e6, &x), !st) && x > 0) c->grad_accum = (int)x;
    if (!st && (x = -1, st = number(path, "", root, "train_batch_size", 1, 1e9, &x), !st) && x > 0) c->train_batch_size = (int)x;
    if (!st && (x = -1, st = number(path, "", root, "gradient_clipping", 0, 1e9, &x), !st) && x >= 0) c->grad_clip = (float)x;
    if (!st && (x = -1, st = number(path, "", root, "steps", 1, 1e9, &x), !st) && x > 0) c->steps = (int)x;
    if (!st && (x = -1, st = number(path, "", root, "steps_per_print", 1, 1e9, &x), !st) && x > 0) c->print_every = (int)x;
    if (!st) st = read_comm_type(path, root, c);
    const cJSON *wcb = cJSON_GetObjectItemCaseSensitive(root, "wall_clock_breakdown");
    if (!st && wcb && !cJSON_IsBool(wcb)) st = dt_error(DT_ERR_ARG, "%s: \"wall_clock_breakdown\" must be true or false", path);
    if (!st && cJSON_IsTrue(wcb))
        dt_log(DT_LOG_INFO, "%s: wall_clock_breakdown: dtrain times every step's forward, backward, optimizer, exposed communication "
               "and data in --metrics FILE (and --report DIR draws them)", path);
    if (!st) st = read_trace(path, root, c);
    if (!st) st = read_zero(path, root, c);
    if (!st) st = read_precision(path, root, c);
    if (!st) st = read_data_types(path, root, c);
    const cJSON *opt = NULL, *sch = NULL;
    if (!st) st = object(path, root, "optimizer", &opt);
    if (!st) st = object(path, root, "scheduler", &sch);
    if (!st && opt) st = read_optimizer(path, opt, c);
    if (!st && sch) st = read_scheduler(path, sch, c);
    /* the schedule's length is the run's unless "steps" says otherwise */
    if (!st && c->sched.total > 0 && !cJSON_GetObjectItemCaseSensitive(root, "steps")) c->steps = c->sched.total;
    if (!st && autos[0])
        dt_log(DT_LOG_WARN, "%s: \"auto\" (HF's placeholder) keeps the flag's value or dtrain's default for: %s", path, autos);
    cJSON_Delete(root);
    return st;
}
