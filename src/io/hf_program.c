/* A Hugging Face model folder as a model program: config.json for the shape and family, the weights from
 * model.safetensors or from the shards that model.safetensors.index.json maps each tensor to (save_pretrained
 * writes either). */
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SHARDS 256

typedef struct {
    const char *dir;
    cJSON *index;                 /* the index's weight_map's parent (NULL: one file) */
    const cJSON *map;
    char *names[MAX_SHARDS];      /* the shards opened so far */
    dt_safetensors *files[MAX_SHARDS];
    int n;
} shards;

static void shards_close(shards *s) {
    for (int i = 0; i < s->n; i++) {
        dt_safetensors_close(s->files[i]);
        free(s->names[i]);
    }
    cJSON_Delete(s->index);
}

/* The file holding tensor name: the one model.safetensors, or its shard by the index. */
static dt_status shard_of(shards *s, const char *name, dt_safetensors **out) {
    const char *file = "model.safetensors";
    if (s->map) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s->map, name);
        if (!cJSON_IsString(v))
            return dt_error(DT_ERR_IO, "%s/model.safetensors.index.json: \"weight_map\" has no shard for tensor \"%s\"", s->dir, name);
        file = v->valuestring;
        if (strchr(file, '/')) return dt_error(DT_ERR_IO, "%s/model.safetensors.index.json: shard \"%s\" is not a file name", s->dir, file);
    }
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], file)) {
            *out = s->files[i];
            return DT_OK;
        }
    if (s->n == MAX_SHARDS) return dt_error(DT_ERR_IO, "%s: more than %d shards", s->dir, MAX_SHARDS);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->dir, file);
    if (access(path, R_OK)) return dt_error(DT_ERR_IO, "%s: shard %s, which the index names for \"%s\", is missing", s->dir, file, name);
    dt_status st = dt_safetensors_open(path, &s->files[s->n]);
    if (st) return st;
    s->names[s->n] = strdup(file);
    *out = s->files[s->n++];
    return DT_OK;
}

static dt_status read_index(shards *s) {
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", s->dir);
    if (access(path, F_OK)) return DT_OK; /* one file */
    dt_status st = dt_file_read_text(path, 64u << 20, &text, NULL);
    if (st) return st;
    s->index = cJSON_Parse(text);
    free(text);
    s->map = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(s->map)) return dt_error(DT_ERR_IO, "%s: no \"weight_map\" object", path);
    return DT_OK;
}

static dt_status read_weights(shards *s, dt_program *p) {
    dt_model m;
    dt_program_base_model(p, &m);
    int V = dt_program_config(p)->vocab_size;
    float *params = m.params(m.self);
    for (int i = 0; i < m.ntensors; i++) {
        const dt_tensor_info *t = &m.tensors[i];
        dt_status st = DT_OK;
        for (int k = 0; k < dt_tensor_hf_pieces(t); k++) {
            dt_safetensors *f = NULL;
            char name[128];
            int ndim, dims[4];
            size_t at;
            dt_tensor_hf_piece(t, k, name, sizeof name, &ndim, dims, &at);
            if (t->split == DT_SPLIT_VOCAB) dims[0] = V;
            st = shard_of(s, name, &f);
            if (!st) st = dt_safetensors_read(f, name, ndim, dims, t->hf_transposed, params + t->offset + at);
            if (st) return st;
        }
    }
    return DT_OK;
}

/* dir/config.json as a config. */
static dt_status read_config(const char *dir, dt_lm_config *cfg) {
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    if (!st) st = dt_lm_config_from_hf(text, path, cfg);
    free(text);
    return st;
}

/* p's weights from dir's model.safetensors or its shards. */
static dt_status read_folder(const char *dir, dt_program *p) {
    shards s = { .dir = dir };
    dt_status st = read_index(&s);
    if (!st) st = read_weights(&s, p);
    shards_close(&s);
    return st;
}

dt_status dt_program_load_hf(const char *dir, dt_program **out) {
    *out = NULL;
    dt_lm_config cfg;
    dt_program *p = NULL;
    dt_status st = read_config(dir, &cfg);
    if (!st && !(st = dt_program_create(&cfg, &p))) st = read_folder(dir, p);
    if (st) {
        dt_program_destroy(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

dt_status dt_gpt2_load_hf(const char *dir, dt_gpt2 **out) {
    *out = NULL;
    dt_lm_config cfg;
    dt_gpt2 *m = NULL;
    dt_status st = read_config(dir, &cfg);
    if (!st && !(st = dt_gpt2_create(&cfg, &m))) st = read_folder(dir, dt_gpt2_program(m));
    if (st) {
        dt_gpt2_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

int dt_hf_folder_is_program(const char *dir) {
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (dt_file_read_text(path, 1 << 20, &text, NULL)) return 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const dt_family *f = cJSON_IsString(t) ? dt_family_find(t->valuestring) : NULL;
    int yes = f && strcmp(t->valuestring, "gpt2"); /* GPT-2's folders have their own reader (hf_folder.c) */
    cJSON_Delete(j);
    return yes;
}
