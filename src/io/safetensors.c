/* safetensors: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data. Read and written here with Hugging Face GPT-2 names and
 * layouts; the JSON goes through cJSON. */
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether HF stores llm.c's tensor i transposed (its Conv1D keeps weights
 * as (in, out)); names, shapes and layers come from the tensor table. */
static const int hf_transposed[DT_GPT2_NTENSORS] = { 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0 };

typedef struct {
    char *buf;          /* the whole file */
    size_t size, data;  /* data section offset */
    cJSON *hdr;
    const cJSON **keys; /* the header's entries sorted by name: lookups in log time, not a scan each */
    int nkeys;
    const char *path;
} st_file;

static int by_name(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void st_close(st_file *f) {
    cJSON_Delete(f->hdr);
    free(f->keys);
    free(f->buf);
    f->hdr = NULL;
    f->keys = NULL;
    f->buf = NULL;
}

static dt_status st_open(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = path;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    long n = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    fseek(fp, 0, SEEK_SET);
    f->buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    size_t got = f->buf ? fread(f->buf, 1, (size_t)n, fp) : 0;
    fclose(fp);
    if (!f->buf || got != (size_t)n) { st_close(f); return dt_error(DT_ERR_IO, "%s: cannot read", path); }
    f->size = (size_t)n;
    uint64_t hl = 0;
    if (f->size < 8) { st_close(f); return dt_error(DT_ERR_IO, "%s: truncated (no header length)", path); }
    memcpy(&hl, f->buf, 8);
    if (hl > f->size - 8) { st_close(f); return dt_error(DT_ERR_IO, "%s: header length %llu at offset 0 exceeds the file", path, (unsigned long long)hl); }
    char save = f->buf[8 + hl];
    f->buf[8 + hl] = 0;
    f->hdr = cJSON_Parse(f->buf + 8);
    f->buf[8 + hl] = save;
    if (!cJSON_IsObject(f->hdr)) {
        st_close(f);
        return dt_error(DT_ERR_IO, "%s: the header (bytes 8..%llu) is not a JSON object", path, (unsigned long long)(8 + hl));
    }
    f->data = 8 + hl;
    for (const cJSON *it = f->hdr->child; it; it = it->next) f->nkeys++;
    f->keys = malloc(sizeof *f->keys * (size_t)(f->nkeys ? f->nkeys : 1));
    if (!f->keys) { st_close(f); return dt_error(DT_ERR_NOMEM, "%s: out of memory for %d header entries", path, f->nkeys); }
    int k = 0;
    for (const cJSON *it = f->hdr->child; it; it = it->next) f->keys[k++] = it;
    qsort(f->keys, (size_t)f->nkeys, sizeof *f->keys, by_name);
    return DT_OK;
}

static const cJSON *st_lookup(const st_file *f, const char *name) {
    cJSON probe = { .string = (char *)name };
    const cJSON *p = &probe, *const *hit = bsearch(&p, f->keys, (size_t)f->nkeys, sizeof *f->keys, by_name);
    return hit ? *hit : NULL;
}

/* Finds name (with or without the "transformer." prefix). */
static const cJSON *st_find(st_file *f, const char *name) {
    const cJSON *t = st_lookup(f, name);
    if (t) return t;
    char pre[256];
    snprintf(pre, sizeof pre, "transformer.%s", name);
    return st_lookup(f, pre);
}

/* A data offset: a whole number within the data section (a double near
 * 2^64 would wrap when converted). */
static int offset_ok(const cJSON *v, size_t limit, size_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > (double)limit || v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (size_t)v->valuedouble;
    return *out <= limit;
}

static void shape_text(char *out, size_t cap, int ndim, const int *d) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++) k += (size_t)snprintf(out + k, cap - k, "%s%d", i ? ", " : "", d[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Reads tensor `name` of shape dims[0..ndim) into out; a 2-D one
 * transposed when asked (the file then has [dims[1], dims[0]]). */
static dt_status st_read(st_file *f, const char *name, int ndim, const int *dims, int transpose, float *out) {
    const cJSON *t = st_find(f, name);
    if (!t) return dt_error(DT_ERR_IO, "%s: tensor \"%s\" is missing", f->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"), *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return dt_error(DT_ERR_IO, "%s: tensor \"%s\" lacks dtype, shape or data_offsets", f->path, name);
    size_t es = !strcmp(dt->valuestring, "F32") ? 4 : (!strcmp(dt->valuestring, "BF16") || !strcmp(dt->valuestring, "F16")) ? 2 : 0;
    if (!es) return dt_error(DT_ERR_IO, "%s: tensor \"%s\" has dtype %s (F32, BF16 or F16 expected)", f->path, name, dt->valuestring);
    int want[4], got[8], ng = cJSON_GetArraySize(sh), same = ng == ndim;
    for (int i = 0; i < ndim; i++) want[i] = dims[i];
    if (transpose && ndim == 2) want[0] = dims[1], want[1] = dims[0];
    for (int i = 0; i < ng && i < 8; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        got[i] = cJSON_IsNumber(d) ? d->valueint : -1;
        if (i < ndim && got[i] != want[i]) same = 0;
    }
    if (!same) {
        char a[96], b[96];
        shape_text(a, sizeof a, ng < 8 ? ng : 8, got);
        shape_text(b, sizeof b, ndim, want);
        return dt_error(DT_ERR_IO, "%s: tensor \"%s\" has shape %s, the model needs %s", f->path, name, a, b);
    }
    size_t n = 1, b, e;
    for (int i = 0; i < ndim; i++) n *= (size_t)want[i];
    const cJSON *ob = cJSON_GetArrayItem(of, 0), *oe = cJSON_GetArrayItem(of, 1);
    if (!offset_ok(ob, f->size - f->data, &b) || !offset_ok(oe, f->size - f->data, &e) || e < b || e - b != n * es)
        return dt_error(DT_ERR_IO, "%s: tensor \"%s\": data_offsets [%.17g, %.17g] do not match its %zu bytes or the file's "
                        "%zu data bytes", f->path, name, ob->valuedouble, oe->valuedouble, n * es, f->size - f->data);
    const unsigned char *src = (const unsigned char *)f->buf + f->data + b;
    size_t cols = transpose && ndim == 2 ? (size_t)want[1] : 1;
    for (size_t i = 0; i < n; i++) {
        float v;
        if (es == 4) memcpy(&v, src + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            v = dt->valuestring[0] == 'B' ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
        }
        out[transpose && ndim == 2 ? i % cols * (size_t)dims[1] + i / cols : i] = v;
    }
    return DT_OK;
}

static int heads_from(st_file *f, const char *path) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(f->hdr, "__metadata__"), *nh = md ? cJSON_GetObjectItemCaseSensitive(md, "n_head") : NULL;
    if (cJSON_IsString(nh)) {
        char *end;
        long v = strtol(nh->valuestring, &end, 10);
        return *end || v < 1 || v > 65536 ? 0 : (int)v;
    }
    /* HF layout: config.json next to model.safetensors */
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s", path);
    char *slash = strrchr(cfg, '/');
    snprintf(slash ? slash + 1 : cfg, sizeof cfg - (size_t)(slash ? slash + 1 - cfg : 0), "config.json");
    char *text;
    if (dt_file_read_text(cfg, 1 << 20, &text, NULL)) return 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *h = j ? cJSON_GetObjectItemCaseSensitive(j, "n_head") : NULL;
    int r = cJSON_IsNumber(h) ? h->valueint : 0;
    cJSON_Delete(j);
    return r;
}

/* Each tensor's shape as the file has it: the table's [rows, cols] (cols 0:
 * a vector), but wte with V rows (HF keeps no padding). */
static void tensor_dims(const dt_gpt2 *m, int dims[DT_GPT2_NTENSORS][2]) {
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, 0);
        dims[i][0] = i == 0 ? dt_gpt2_get_config(m)->vocab_size : t->shape[0];
        dims[i][1] = t->shape[1];
    }
}

static dt_status load_all(st_file *f, dt_gpt2 *m) {
    int dims[DT_GPT2_NTENSORS][2];
    tensor_dims(m, dims);
    float *p = dt_gpt2_params(m);
    memset(p, 0, dt_gpt2_num_params(m) * sizeof(float)); /* padded vocabulary rows */
    for (int i = 0; i < DT_GPT2_NTENSORS; i++)
        for (int l = 0; l < dt_gpt2_llmc_layers(m, i); l++) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            dt_status st = st_read(f, t->hf, dims[i][1] ? 2 : 1, dims[i], hf_transposed[i], p + t->offset);
            if (st) return st;
        }
    return DT_OK;
}

dt_status dt_safetensors_load_into(const char *path, dt_gpt2 *m) {
    st_file f;
    dt_status st = dt_gpt2_check_whole(m, path);
    if (!st) st = st_open(path, &f);
    if (st) return st;
    st = load_all(&f, m);
    st_close(&f);
    return st;
}

dt_status dt_safetensors_load(const char *path, int heads, dt_gpt2 **out) {
    *out = NULL;
    st_file f;
    dt_status st = st_open(path, &f);
    if (st) return st;
    const cJSON *wte = st_find(&f, "wte.weight"), *wpe = st_find(&f, "wpe.weight");
    const cJSON *ws = wte ? cJSON_GetObjectItemCaseSensitive(wte, "shape") : NULL, *ps = wpe ? cJSON_GetObjectItemCaseSensitive(wpe, "shape") : NULL;
    if (!cJSON_IsArray(ws) || cJSON_GetArraySize(ws) != 2 || !cJSON_IsArray(ps) || cJSON_GetArraySize(ps) != 2) {
        st_close(&f);
        /* a config.json beside it names what it is */
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        snprintf(slash ? slash : dir, sizeof dir - (size_t)(slash ? slash - dir : 0), "%s", slash ? "" : ".");
        st = dt_hf_folder_check(dir);
        return st ? st : dt_error(DT_ERR_IO, "%s: no 2-D wte.weight and wpe.weight: not a GPT-2 safetensors file", path);
    }
    /* the layer count: h.0 .. h.(L-1) all present (sorted lookups, so a file with many keys stays fast) */
    int L = 0;
    char name[64];
    for (; L < f.nkeys; L++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", L);
        if (!st_find(&f, name)) break;
    }
    if (heads <= 0) heads = heads_from(&f, path);
    if (heads <= 0) {
        st_close(&f);
        return dt_error(DT_ERR_ARG, "%s: the head count is neither in the file's metadata nor in a config.json beside it (give --heads)", path);
    }
    int V = cJSON_GetArrayItem(ws, 0)->valueint, C = cJSON_GetArrayItem(ws, 1)->valueint;
    if (V < 1 || V > (1 << 30)) {
        st_close(&f);
        return dt_error(DT_ERR_IO, "%s: wte.weight has %d rows (1 to 2^30 expected)", path, V);
    }
    dt_gpt2_config cfg = { .max_seq_len = cJSON_GetArrayItem(ps, 0)->valueint, .vocab_size = V, .padded_vocab_size = (V + 127) / 128 * 128, .num_layers = L, .num_heads = heads, .channels = C };
    if (V == 50257) cfg.padded_vocab_size = 50304; /* llm.c's padding for GPT-2 */
    /* every tensor is in the file at 2 bytes per value or more: a shape that
     * needs more than the file holds fails before the model is allocated */
    if (!(st = dt_gpt2_config_check(&cfg, path))) {
        size_t need = (dt_gpt2_config_num_params(&cfg) - (size_t)(cfg.padded_vocab_size - cfg.vocab_size) * (size_t)C) * 2;
        if (need > f.size - f.data)
            st = dt_error(DT_ERR_IO, "%s: wte.weight and wpe.weight say %d layers of %d channels, vocab %d, %d positions: "
                          "at least %zu data bytes, but the file has %zu", path, L, C, V, cfg.max_seq_len, need, f.size - f.data);
    }
    dt_gpt2 *m = NULL;
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) st = load_all(&f, m);
    st_close(&f);
    if (st) { dt_gpt2_destroy(m); return st; }
    *out = m;
    return DT_OK;
}

/* One value in dtype at out. */
static void put(unsigned char *out, float v, dt_dtype dtype) {
    if (dtype == DT_F32) memcpy(out, &v, 4);
    else {
        uint16_t h = dtype == DT_BF16 ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
        memcpy(out, &h, 2);
    }
}

/* A header being written: its JSON, the dtype's name and size, and the data bytes its entries take so far. */
typedef struct {
    cJSON *hdr;
    const char *dn;
    size_t es, total;
} st_writer;

static st_writer st_begin(dt_dtype dtype) {
    st_writer w = { cJSON_CreateObject(), dtype == DT_F32 ? "F32" : dtype == DT_BF16 ? "BF16" : "F16", dt_dtype_size(dtype), 0 };
    cJSON_AddStringToObject(cJSON_AddObjectToObject(w.hdr, "__metadata__"), "format", "pt");
    return w;
}

/* A tensor's entry: its shape and the next n values of the data. */
static void st_entry(st_writer *w, const char *name, const int *shape, int ndim, size_t n) {
    cJSON *t = cJSON_AddObjectToObject(w->hdr, name);
    cJSON_AddStringToObject(t, "dtype", w->dn);
    cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray(shape, ndim));
    double offs[2] = { (double)w->total, (double)(w->total + n * w->es) };
    cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
    w->total += n * w->es;
}

/* The header (padded so that the data starts 8-byte aligned) and data (w->total bytes) written to path atomically;
 * the header and data freed. */
static dt_status st_finish(st_writer *w, const char *path, unsigned char *data) {
    char *json = cJSON_PrintUnformatted(w->hdr);
    cJSON_Delete(w->hdr);
    size_t jl = json ? strlen(json) : 0, padded = (jl + 7) & ~(size_t)7;
    char *head = malloc(8 + padded);
    dt_status st;
    if (!head || !data || !json) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    } else {
        uint64_t hl = padded;
        memcpy(head, &hl, 8);
        memcpy(head + 8, json, jl);
        memset(head + 8 + jl, ' ', padded - jl);
        const void *parts[2] = { head, data };
        size_t sizes[2] = { 8 + padded, w->total };
        st = dt_file_write_atomic(path, parts, sizes, 2);
    }
    free(json);
    free(head);
    free(data);
    return st;
}

dt_status dt_safetensors_save_table(const char *path, const dt_model *v, int vocab, dt_dtype dtype) {
    st_writer w = st_begin(dtype);
    for (int i = 0; i < v->ntensors; i++) {
        const dt_tensor_info *t = &v->tensors[i];
        for (int k = 0; k < dt_tensor_hf_pieces(t); k++) {
            char name[128];
            int ndim, shape[4];
            size_t at, n = 1;
            dt_tensor_hf_piece(t, k, name, sizeof name, &ndim, shape, &at);
            if (t->split == DT_SPLIT_VOCAB) shape[0] = vocab;
            for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
            st_entry(&w, name, shape, ndim, n);
        }
    }
    unsigned char *data = malloc(w.total ? w.total : 1);
    const float *p = v->params(v->self);
    size_t pos = 0;
    for (int i = 0; data && i < v->ntensors; i++) {
        const dt_tensor_info *t = &v->tensors[i];
        size_t n = t->split == DT_SPLIT_VOCAB ? (size_t)vocab * (size_t)t->shape[1] : t->count;
        for (size_t j = 0; j < n; j++, pos += w.es) put(data + pos, p[t->offset + j], dtype);
    }
    return st_finish(&w, path, data);
}

/* Another family (Llama, Qwen 2): every tensor of the table under its Hugging Face name. */
static dt_status save_by_table(const char *path, dt_gpt2 *m, dt_dtype dtype) {
    dt_model v;
    dt_program_base_model(dt_gpt2_program(m), &v);
    return dt_safetensors_save_table(path, &v, dt_gpt2_get_config(m)->vocab_size, dtype);
}

int dt_safetensors_path(const char *path) {
    size_t n = strlen(path);
    return n > 12 && !strcmp(path + n - 12, ".safetensors");
}

dt_status dt_safetensors_check_family(const char *path, const dt_gpt2_config *c) {
    /* (GPT-2's names with experts among them would read back as a GPT-2 whose tensors do not fit) */
    if (c->family == dt_family_find("gpt2_moe"))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: GPT-2 with GELU experts (gpt2_moe) has no weights-file format outside dtrain's "
                        "checkpoint directory, which keeps it (--save DIR)", path);
    return DT_OK;
}

dt_status dt_safetensors_save(const char *path, dt_gpt2 *m, dt_dtype dtype) {
    if (dt_gpt2_check_whole(m, path)) return DT_ERR_ARG;
    if (dtype != DT_F32 && dtype != DT_BF16 && dtype != DT_F16)
        return dt_error(DT_ERR_ARG, "%s: safetensors can be written as f32, bf16 or f16, not %s", path, dt_dtype_name(dtype));
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    dt_status st = dt_safetensors_check_family(path, c);
    if (st) return st;
    if (c->family && c->family != dt_family_find("gpt2")) return save_by_table(path, m, dtype);
    st_writer w = st_begin(dtype);
    char nh[32];
    snprintf(nh, sizeof nh, "%d", c->num_heads);
    cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(w.hdr, "__metadata__"), "n_head", nh);
    int dims[DT_GPT2_NTENSORS][2];
    tensor_dims(m, dims);
    /* first pass: names, shapes, offsets */
    for (int i = 0; i < DT_GPT2_NTENSORS; i++)
        for (int l = 0; l < dt_gpt2_llmc_layers(m, i); l++) {
            int d0 = dims[i][0], d1 = dims[i][1];
            int shape[2] = { hf_transposed[i] ? d1 : d0, hf_transposed[i] ? d0 : d1 };
            st_entry(&w, dt_gpt2_llmc_tensor(m, i, l)->hf, shape, d1 ? 2 : 1, (size_t)d0 * (size_t)(d1 ? d1 : 1));
        }
    unsigned char *data = malloc(w.total ? w.total : 1);
    size_t pos = 0;
    const float *p = dt_gpt2_params(m);
    for (int i = 0; data && i < DT_GPT2_NTENSORS; i++) {
        int tr = hf_transposed[i];
        for (int l = 0; l < dt_gpt2_llmc_layers(m, i); l++) {
            int d0 = dims[i][0], d1 = dims[i][1] ? dims[i][1] : 1;
            const float *src = p + dt_gpt2_llmc_tensor(m, i, l)->offset;
            for (int r = 0; r < (tr ? d1 : d0); r++)
                for (int q = 0; q < (tr ? d0 : d1); q++, pos += w.es) /* element (r, q) of the stored shape */
                    put(data + pos, tr ? src[(size_t)q * d1 + r] : src[(size_t)r * d1 + q], dtype);
        }
    }
    return st_finish(&w, path, data);
}

int dt_model_file_is_safetensors(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    unsigned char b[9] = { 0 };
    size_t n = fread(b, 1, 9, fp);
    fclose(fp);
    /* llm.c files start with the int32 magic 20240326; safetensors with a length then '{' */
    return n == 9 && b[8] == '{';
}

dt_status dt_model_load(const char *path, int heads, dt_gpt2 **out) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* an HF folder (save_pretrained, dtrain ckpt export DIR/): its model.safetensors, the heads from its config.json */
        char inner[4200];
        dt_status st = dt_hf_folder_check(path);
        if (st) { *out = NULL; return st; }
        if (dt_hf_folder_is_program(path)) return dt_gpt2_load_hf(path, out); /* Llama, Qwen 2 */
        snprintf(inner, sizeof inner, "%s/model.safetensors", path);
        if (access(inner, R_OK) == 0) return dt_safetensors_load(inner, heads, out);
        *out = NULL;
        return dt_error(DT_ERR_ARG, "%s is a directory without a model.safetensors: a model is a weights file (.bin, .safetensors), "
                        "an HF folder holding model.safetensors, or a dtrain checkpoint directory", path);
    }
    if (dt_model_file_is_safetensors(path)) {
        /* a Llama's or Qwen 2's model.safetensors: its folder's config.json says the shape */
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        if (dt_hf_folder_is_program(dir)) return dt_gpt2_load_hf(dir, out);
        return dt_safetensors_load(path, heads, out);
    }
    return dt_llmc_load(path, out);
}

dt_status dt_safetensors_load_resnet(const char *path, dt_resnet *m) {
    st_file f;
    dt_status st = st_open(path, &f);
    if (st) return st;
    int nt;
    const dt_tensor_info *tab = dt_resnet_tensors(m, &nt);
    float *p = dt_resnet_params(m), *buf = dt_resnet_buffers(m, NULL);
    for (int i = 0; i < nt && !st; i++) st = st_read(&f, tab[i].hf, tab[i].ndim, tab[i].shape, 0, p + tab[i].offset);
    /* the running averages (num_batches_tracked, which momentum makes unused, is not read) */
    for (int i = 0; i < dt_resnet_num_batchnorms(m) && !st; i++) {
        int C;
        size_t at;
        const char *bn = dt_resnet_batchnorm_name(m, i, &C, &at);
        char name[96];
        snprintf(name, sizeof name, "%s.running_mean", bn);
        st = st_read(&f, name, 1, &C, 0, buf + at);
        snprintf(name, sizeof name, "%s.running_var", bn);
        if (!st) st = st_read(&f, name, 1, &C, 0, buf + at + C);
    }
    st_close(&f);
    return st;
}

/* ---- any file, by tensor name ---- */

struct dt_safetensors { st_file f; };

dt_status dt_safetensors_open(const char *path, dt_safetensors **out) {
    *out = NULL;
    dt_safetensors *s = calloc(1, sizeof *s);
    char *p = s ? strdup(path) : NULL;
    if (!p) { free(s); return dt_error(DT_ERR_NOMEM, "%s: out of memory", path); }
    dt_status st = st_open(p, &s->f);
    if (st) { free(p); free(s); return st; }
    *out = s;
    return DT_OK;
}

void dt_safetensors_close(dt_safetensors *s) {
    if (!s) return;
    free((char *)s->f.path);
    st_close(&s->f);
    free(s);
}

int dt_safetensors_has(const dt_safetensors *s, const char *name) { return st_lookup(&s->f, name) != NULL; }

dt_status dt_safetensors_read(dt_safetensors *s, const char *name, int ndim, const int *dims, int transposed, float *out) {
    return st_read(&s->f, name, ndim, dims, transposed, out);
}

dt_status dt_safetensors_read_i32(dt_safetensors *s, const char *name, size_t n, int32_t *out) {
    st_file *f = &s->f;
    const cJSON *t = st_lookup(f, name);
    if (!t) return dt_error(DT_ERR_IO, "%s: tensor \"%s\" is missing", f->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    size_t b, e;
    if (!cJSON_IsString(dt) || strcmp(dt->valuestring, "I32"))
        return dt_error(DT_ERR_IO, "%s: tensor \"%s\" is not I32", f->path, name);
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !offset_ok(cJSON_GetArrayItem(of, 0), f->size - f->data, &b) ||
        !offset_ok(cJSON_GetArrayItem(of, 1), f->size - f->data, &e) || e < b || e - b != n * 4)
        return dt_error(DT_ERR_IO, "%s: tensor \"%s\" does not hold %zu int32 values within the file", f->path, name, n);
    memcpy(out, f->buf + f->data + b, n * 4);
    return DT_OK;
}

const char *dt_safetensors_metadata(const dt_safetensors *s, const char *key) {
    const cJSON *meta = st_lookup(&s->f, "__metadata__");
    const cJSON *v = meta ? cJSON_GetObjectItemCaseSensitive(meta, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

dt_status dt_safetensors_read_model(dt_safetensors *s, const dt_model *m, int vocab, const char *skip) {
    float *params = m->params(m->self);
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (skip && !strcmp(t->name, skip)) continue;
        for (int k = 0; k < dt_tensor_hf_pieces(t); k++) {
            char name[128];
            int ndim, dims[4];
            size_t at;
            dt_tensor_hf_piece(t, k, name, sizeof name, &ndim, dims, &at);
            if (t->split == DT_SPLIT_VOCAB && vocab < dims[0]) dims[0] = vocab; /* the file has the real rows, the table padding too */
            dt_status st = st_read(&s->f, name, ndim, dims, t->hf_transposed, params + t->offset + at);
            if (st) return st;
        }
    }
    return DT_OK;
}
