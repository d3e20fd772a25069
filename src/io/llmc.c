/* llm.c's model file: int32 header[256] = { 20240326, version, maxT, V, L,
 * NH, C, Vp, 0... }, then every parameter in llm.c's order (tensor-major:
 * wte, wpe, every layer's ln1w, every layer's ln1b, ...), f32 (version 3)
 * or bf16 (version 5). The model's store is unit-major; each piece is read
 * into or written from its place in the table, bit for bit. */
#include "dtrain/io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LLMC_MAGIC 20240326

static dt_status read_header(const char *path, FILE *f, int32_t h[256], dt_gpt2_config *cfg) {
    if (fread(h, sizeof(int32_t), 256, f) != 256)
        return dt_error(DT_ERR_IO, "%s: truncated header (%zu bytes needed)", path, 256 * sizeof(int32_t));
    if (h[0] != LLMC_MAGIC)
        return dt_error(DT_ERR_IO, "%s: bad magic %d at offset 0 (expected %d: not an llm.c model file)", path, h[0], LLMC_MAGIC);
    if (h[1] != 3 && h[1] != 5)
        return dt_error(DT_ERR_IO, "%s: version %d at offset 4 is not supported (3 = f32, 5 = bf16)", path, h[1]);
    *cfg = (dt_gpt2_config){ .max_seq_len = h[2], .vocab_size = h[3], .padded_vocab_size = h[7] ? h[7] : h[3], .num_layers = h[4], .num_heads = h[5], .channels = h[6] };
    return dt_gpt2_config_check(cfg, path);
}

/* The file's size must be the header plus the parameters its shape needs. */
static dt_status check_size(const char *path, FILE *f, const int32_t h[256], const dt_gpt2_config *cfg) {
    size_t need = 1024 + dt_gpt2_config_num_params(cfg) * (h[1] == 3 ? 4 : 2);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) return dt_error(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if ((size_t)sb.st_size != need)
        return dt_error(DT_ERR_IO, "%s: %lld bytes, but the header's shape (L %d, C %d, Vp %d, T %d) needs %zu (%s)", path,
                        (long long)sb.st_size, cfg->num_layers, cfg->channels, cfg->padded_vocab_size, cfg->max_seq_len, need,
                        (size_t)sb.st_size < need ? "truncated" : "trailing bytes");
    return DT_OK;
}

/* Reads the header and checks the file's size against it, so that a header
 * claiming a huge shape fails before anything is allocated. */
dt_status dt_llmc_read_config(const char *path, dt_gpt2_config *cfg) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int32_t h[256];
    dt_status st = read_header(path, f, h, cfg);
    if (!st) st = check_size(path, f, h, cfg);
    fclose(f);
    return st;
}

dt_status dt_llmc_load_into(const char *path, dt_gpt2 *m) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int32_t h[256];
    dt_gpt2_config cfg;
    dt_status st = dt_gpt2_check_whole(m, path);
    if (!st) st = read_header(path, f, h, &cfg);
    const dt_gpt2_config *mc = dt_gpt2_get_config(m);
    if (!st && mc->family && mc->family != dt_family_find("gpt2"))
        st = dt_error(DT_ERR_IO, "%s: llm.c's files hold GPT-2; the model is %s", path, dt_family_name(mc->family));
    if (!st && !dt_lm_config_same(&cfg, mc))
        st = dt_error(DT_ERR_IO, "%s: the file's shape (T %d, V %d, Vp %d, L %d, NH %d, C %d) differs from the model's "
                      "(T %d, V %d, Vp %d, L %d, NH %d, C %d)", path, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size,
                      cfg.num_layers, cfg.num_heads, cfg.channels, mc->max_seq_len, mc->vocab_size, mc->padded_vocab_size,
                      mc->num_layers, mc->num_heads, mc->channels);
    size_t n = dt_gpt2_num_params(m), es = h[1] == 3 ? 4 : 2;
    if (!st) st = check_size(path, f, h, &cfg);
    float *p = dt_gpt2_params(m);
    uint16_t *b = NULL;
    if (!st && es == 2 && !(b = malloc(n * 2))) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    /* file order: tensor i, then layer l */
    for (int i = 0; !st && i < DT_GPT2_NTENSORS; i++)
        for (int l = 0; !st && l < dt_gpt2_llmc_layers(m, i); l++) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            if ((es == 4 ? fread(p + t->offset, 4, t->count, f) : fread(b + t->offset, 2, t->count, f)) != t->count)
                st = dt_error(DT_ERR_IO, "%s: truncated parameters (in %s)", path, t->name);
        }
    if (!st && es == 2)
        for (size_t i = 0; i < n; i++) p[i] = dt_bf16_to_f32(b[i]);
    free(b);
    fclose(f);
    return st;
}

dt_status dt_llmc_load(const char *path, dt_gpt2 **out) {
    *out = NULL;
    dt_gpt2_config cfg;
    dt_status st = dt_llmc_read_config(path, &cfg);
    dt_gpt2 *m = NULL;
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) st = dt_llmc_load_into(path, m);
    if (st) { dt_gpt2_destroy(m); return st; }
    *out = m;
    return DT_OK;
}

dt_status dt_llmc_check_family(const char *path, const dt_gpt2_config *c) {
    if (c->family && c->family != dt_family_find("gpt2"))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: llm.c's files hold GPT-2, not %s (save a checkpoint directory instead)", path,
                        dt_family_name(c->family));
    return DT_OK;
}

dt_status dt_llmc_save(const char *path, dt_gpt2 *m) {
    dt_status st = dt_gpt2_check_whole(m, path);
    if (st) return st;
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    if ((st = dt_llmc_check_family(path, c))) return st;
    int32_t h[256] = { LLMC_MAGIC, 3, c->max_seq_len, c->vocab_size, c->num_layers, c->num_heads, c->channels,
                       c->padded_vocab_size };
    /* the header, then each table entry in llm.c's order, straight from the store */
    int n;
    dt_gpt2_tensors(m, &n);
    const void **parts = malloc(sizeof *parts * (size_t)(n + 1));
    size_t *sizes = malloc(sizeof *sizes * (size_t)(n + 1));
    if (!parts || !sizes) { free(parts); free(sizes); return dt_error(DT_ERR_NOMEM, "%s: out of memory", path); }
    parts[0] = h;
    sizes[0] = sizeof h;
    int k = 1;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++)
        for (int l = 0; l < dt_gpt2_llmc_layers(m, i); l++) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            parts[k] = dt_gpt2_params(m) + t->offset;
            sizes[k++] = t->count * sizeof(float);
        }
    st = dt_file_write_atomic(path, parts, sizes, k);
    free(parts);
    free(sizes);
    return st;
}
