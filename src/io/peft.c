/* PEFT's LoRA adapter folders: adapter_config.json (LoraConfig's fields) and adapter_model.safetensors (the
 * adapters under "base_model.model.<module>.lora_A.weight" and .lora_B.weight, PEFT's names, which the model
 * program's adapter table carries). What PEFT's from_pretrained reads, written; what dtrain's LoRA is, read (a list
 * of target modules, no bias, no DoRA, rsLoRA or per-layer patterns: each other setting is refused naming it). */
#include "dtrain/io.h"
#include "json_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static cJSON *adapter_config(const dt_program *p, const dt_lora_config *c) {
    cJSON *j = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(j, "target_modules");
    char list[256];
    snprintf(list, sizeof list, "%s", c->targets);
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) cJSON_AddItemToArray(t, cJSON_CreateString(m));
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(j, "r", c->rank);
    cJSON_AddNumberToObject(j, "lora_alpha", dt_f32_decimal(c->alpha));
    cJSON_AddNumberToObject(j, "lora_dropout", dt_f32_decimal(c->dropout));
    cJSON_AddStringToObject(j, "bias", "none");
    /* GPT-2's Conv1D keeps its weights [in, out]: PEFT merges the transposed product (the adapters are alike) */
    cJSON_AddBoolToObject(j, "fan_in_fan_out", !strcmp(dt_family_name(dt_program_config(p)->family), "gpt2"));
    cJSON_AddBoolToObject(j, "use_rslora", 0);
    cJSON_AddBoolToObject(j, "use_dora", 0);
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    cJSON_AddNullToObject(j, "base_model_name_or_path");
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddObjectToObject(j, "rank_pattern");
    cJSON_AddObjectToObject(j, "alpha_pattern");
    return j;
}

dt_status dt_peft_save(const char *dir, dt_program *p) {
    const dt_lora_config *c = dt_program_lora_config(p);
    if (!c) return dt_error(DT_ERR_ARG, "%s: the model has no LoRA adapters to save", dir);
    dt_model m;
    dt_program_model(p, &m);
    if (dt_model_global_params(&m) != m.nparams)
        return dt_error(DT_ERR_ARG, "%s: PEFT's folder holds every layer's adapters; this part of the model holds %zu of their %zu values",
                        dir, m.nparams, dt_model_global_params(&m));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dt_error(DT_ERR_IO, "%s: cannot create the folder: %s", dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    dt_status st = dt_safetensors_save_table(path, &m, 0, DT_F32);
    if (st) return st;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return dt_json_write_file(adapter_config(p, c), 1, path);
}

/* A field that must be absent, null, false or empty (a setting this build does not run). */
static dt_status unset(const cJSON *j, const char *key, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v) || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child)) return DT_OK;
    return dt_error(DT_ERR_UNSUPPORTED, "%s: \"%s\" is set: this build reads plain LoRA adapters (no %s)", path, key, key);
}

dt_status dt_peft_read_config(const char *dir, dt_lora_config *out, char *targets, size_t cap) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return dt_error(DT_ERR_IO, "%s: not JSON", path);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "peft_type"), *r = cJSON_GetObjectItemCaseSensitive(j, "r"),
                *alpha = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha"), *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules"),
                *bias = cJSON_GetObjectItemCaseSensitive(j, "bias"), *drop = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA"))
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: \"peft_type\" is %s, not LORA", path, cJSON_IsString(type) ? type->valuestring : "missing");
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536 || r->valuedouble != (int)r->valuedouble)
        st = dt_error(DT_ERR_IO, "%s: \"r\" is not a rank from 1 to 65536", path);
    else if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0))
        st = dt_error(DT_ERR_IO, "%s: \"lora_alpha\" is not a positive number", path);
    else if (cJSON_IsString(tm))
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: \"target_modules\" is a regular expression (\"%s\"): this build reads a list of names", path,
                      tm->valuestring);
    else if (!cJSON_IsArray(tm) || !tm->child)
        st = dt_error(DT_ERR_IO, "%s: \"target_modules\" is not a list of module names", path);
    else if (bias && !cJSON_IsNull(bias) && (!cJSON_IsString(bias) || strcmp(bias->valuestring, "none")))
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: \"bias\" is not \"none\": this build's adapters have no biases", path);
    static const char *const off[] = { "use_dora", "use_rslora", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern" };
    for (size_t i = 0; !st && i < sizeof off / sizeof *off; i++) st = unset(j, off[i], path);
    size_t at = 0;
    for (const cJSON *m = st ? NULL : tm->child; m && !st; m = m->next) {
        int k = cJSON_IsString(m) ? snprintf(targets + at, cap - at, "%s%s", at ? "," : "", m->valuestring) : -1;
        if (k < 0 || (size_t)k >= cap - at) st = dt_error(DT_ERR_IO, "%s: \"target_modules\" holds a name that is not a string, or too many", path);
        else at += (size_t)k;
    }
    if (!st)
        *out = (dt_lora_config){ .rank = (int)r->valuedouble, .alpha = (float)alpha->valuedouble,
                                 .dropout = cJSON_IsNumber(drop) ? (float)drop->valuedouble : 0, .targets = targets };
    cJSON_Delete(j);
    return st;
}

dt_status dt_peft_merge(const char *dir, dt_program *p) {
    dt_status st = dt_peft_load(dir, p);
    if (!st) dt_program_lora_merge(p);
    return st;
}

/* The file's adapters into p's: by name where p holds whole tensors (one process, a pipeline stage); a
 * tensor-parallel part takes its slices of the whole adapters, read into a table's (no base weights). */
static dt_status read_adapters(const char *path, const dt_lora_config *c, dt_program *p) {
    dt_model m;
    dt_program_model(p, &m);
    bool sliced = false;
    for (int i = 0; i < m.ntensors; i++)
        for (int d = 0; d < m.tensors[i].ndim; d++) sliced |= m.tensors[i].shape[d] != m.tensors[i].gshape[d];
    dt_safetensors *f = NULL;
    dt_program *whole = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st && !sliced) st = dt_safetensors_read_model(f, &m, 0, NULL);
    if (!st && sliced && !(st = dt_program_create_table(dt_program_config(p), NULL, &whole)) && !(st = dt_program_set_lora(whole, c, 0))) {
        dt_model w;
        dt_program_model(whole, &w);
        if (!(st = dt_safetensors_read_model(f, &w, 0, NULL)))
            dt_model_copy_slices(&m, m.params(m.self), w.params(w.self));
    }
    dt_program_destroy(whole);
    dt_safetensors_close(f);
    return st;
}

dt_status dt_peft_load(const char *dir, dt_program *p) {
    char targets[256], path[4200];
    dt_lora_config c;
    dt_status st = dt_peft_read_config(dir, &c, targets, sizeof targets);
    if (st) return st;
    if ((st = dt_program_set_lora(p, &c, 0))) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_error(st, "%s: %s", dir, why);
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    return read_adapters(path, &c, p);
}
