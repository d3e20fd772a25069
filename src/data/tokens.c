/* Token files (llm.c's format), read whole into memory. */
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAGIC_U16 20240520
#define MAGIC_U32 20240801

struct dt_tokens {
    char path[512];
    size_t n;
    int wide; /* uint32 tokens */
    void *data;
};

static dt_status tokens_read(const char *path, dt_tokens **out);

/* The read is the run's data I/O: counted (bytes, seconds) and traced. */
dt_status dt_tokens_open(const char *path, dt_tokens **out) {
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_DATA, "read token file", "\"file\":\"%.60s\"", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    dt_status st = tokens_read(path, out);
    DT_TRACE_END(DT_TRACK_DATA);
    if (!st) dt_io_count(DT_IO_DATA_READ, 1024 + (*out)->n * ((*out)->wide ? 4 : 2), dt_time_now() - t0);
    return st;
}

static dt_status tokens_read(const char *path, dt_tokens **out) {
    *out = NULL;
    struct stat ds;
    if (stat(path, &ds) == 0 && S_ISDIR(ds.st_mode))
        return dt_error(DT_ERR_ARG, "%s is a directory: a token file is made by dtrain tokenize (--bytes IN OUT, or --bpe ENC VOCAB IN "
                        "OUT); a directory of IDX files is --data for --model mlp or a resnet", path);
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int32_t h[256];
    dt_status st = DT_OK;
    if (fread(h, 4, 256, f) != 256) st = dt_error(DT_ERR_IO, "%s: truncated header (1024 bytes needed)", path);
    else if (h[0] != MAGIC_U16 && h[0] != MAGIC_U32)
        st = dt_error(DT_ERR_IO, "%s: bad magic %d at offset 0 (expected %d or %d: not an llm.c token file)", path, h[0], MAGIC_U16, MAGIC_U32);
    else if ((h[0] == MAGIC_U16 && h[1] != 1) || (h[0] == MAGIC_U32 && h[1] != 7))
        st = dt_error(DT_ERR_IO, "%s: version %d at offset 4 does not go with magic %d (1 for uint16, 7 for uint32)", path, h[1], h[0]);
    else if (h[2] < 0) st = dt_error(DT_ERR_IO, "%s: negative token count %d at offset 8", path, h[2]);
    size_t es = h[0] == MAGIC_U32 ? 4 : 2;
    struct stat sb;
    if (!st && fstat(fileno(f), &sb) == 0 && (size_t)sb.st_size != 1024 + (size_t)h[2] * es)
        st = dt_error(DT_ERR_IO, "%s: header says %d tokens (%zu bytes) but the file has %lld bytes after the header (%s)", path,
                      h[2], (size_t)h[2] * es, (long long)sb.st_size - 1024,
                      (size_t)sb.st_size < 1024 + (size_t)h[2] * es ? "truncated" : "trailing bytes");
    dt_tokens *t = NULL;
    if (!st) {
        t = calloc(1, sizeof *t);
        if (t) t->data = malloc((size_t)h[2] * es + 1);
        if (!t || !t->data) st = dt_error(DT_ERR_NOMEM, "%s: no memory for %d tokens", path, h[2]);
        else if (fread(t->data, es, (size_t)h[2], f) != (size_t)h[2]) st = dt_error(DT_ERR_IO, "%s: truncated tokens", path);
    }
    fclose(f);
    if (st) { if (t) { free(t->data); free(t); } return st; }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->n = (size_t)h[2];
    t->wide = es == 4;
    *out = t;
    return DT_OK;
}

void dt_tokens_close(dt_tokens *t) {
    if (!t) return;
    free(t->data);
    free(t);
}

size_t dt_tokens_count(const dt_tokens *t) { return t->n; }
const char *dt_tokens_path(const dt_tokens *t) { return t->path; }

uint32_t dt_tokens_max(const dt_tokens *t) {
    uint32_t m = 0;
    for (size_t i = 0; i < t->n; i++) {
        uint32_t v = dt_tokens_get(t, i);
        if (v > m) m = v;
    }
    return m;
}

uint32_t dt_tokens_get(const dt_tokens *t, size_t i) {
    return t->wide ? ((const uint32_t *)t->data)[i] : ((const uint16_t *)t->data)[i];
}

dt_status dt_tokens_check_vocab(const dt_tokens *t, int vocab) {
    for (size_t i = 0; i < t->n; i++) {
        uint32_t v = dt_tokens_get(t, i);
        if (v >= (uint32_t)vocab)
            return dt_error(DT_ERR_IO, "%s: token %u at index %zu (byte offset %zu) is outside the model's vocabulary of %d",
                            t->path, v, i, 1024 + i * (t->wide ? 4 : 2), vocab);
    }
    return DT_OK;
}

dt_status dt_tokens_write(const char *path, const uint32_t *tokens, size_t n) {
    if (n > INT32_MAX) return dt_error(DT_ERR_ARG, "%s: %zu tokens do not fit the format's int32 count", path, n);
    int wide = 0;
    for (size_t i = 0; i < n && !wide; i++) wide = tokens[i] > 65535;
    int32_t h[256] = { wide ? MAGIC_U32 : MAGIC_U16, wide ? 7 : 1, (int32_t)n };
    const void *body = tokens;
    uint16_t *narrow = NULL;
    if (!wide) {
        narrow = malloc(n * 2 + 2);
        if (!narrow) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
        for (size_t i = 0; i < n; i++) narrow[i] = (uint16_t)tokens[i];
        body = narrow;
    }
    const void *parts[2] = { h, body };
    size_t sizes[2] = { sizeof h, n * (wide ? 4 : 2) };
    dt_status st = dt_file_write_atomic(path, parts, sizes, 2);
    free(narrow);
    return st;
}
