/* IDX files (the MNIST family's format: big-endian magic 0x000008TT with
 * TT = 0x08 for unsigned bytes, then one 32-bit size per dimension, then
 * the bytes), gzip-compressed or not (zlib reads both), and the image sets
 * built from a directory of them. */
#include "dtrain/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

dt_status dt_idx_load(const char *path, dt_idx *out) {
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    uint8_t h[16];
    dt_status st = DT_OK;
    if (gzread(f, h, 4) != 4) st = dt_error(DT_ERR_IO, "%s: shorter than an IDX header", path);
    else if (h[0] || h[1] || h[2] != 0x08 || h[3] < 1 || h[3] > 3)
        st = dt_error(DT_ERR_IO, "%s: not an IDX file of unsigned bytes with 1 to 3 dimensions (magic %02x %02x %02x %02x)",
                      path, h[0], h[1], h[2], h[3]);
    size_t count = 1;
    if (!st) {
        out->ndim = h[3];
        if (gzread(f, h + 4, (unsigned)(4 * out->ndim)) != 4 * out->ndim) st = dt_error(DT_ERR_IO, "%s: truncated header", path);
        for (int i = 0; !st && i < out->ndim; i++) {
            uint32_t d = be32(h + 4 + 4 * i);
            if (d == 0 || d > (1u << 28)) st = dt_error(DT_ERR_IO, "%s: dimension %d is %u", path, i, d);
            out->dims[i] = (int)d;
            /* checked before multiplying: three dimensions of 2^28 would wrap */
            if (!st && count > ((size_t)1 << 34) / d)
                st = dt_error(DT_ERR_IO, "%s: dimensions multiply past 16 GiB of data (dimension %d is %u)", path, i, d);
            if (!st) count *= d;
        }
    }
    /* the buffer grows with the data that really arrives: a compressed file's
     * header can claim gigabytes that are not there */
    size_t got = 0, cap = 0;
    while (!st && got < count) {
        if (got == cap) {
            size_t want = cap ? (cap * 2 < count ? cap * 2 : count) : (count < (1u << 20) ? count : 1u << 20);
            uint8_t *g = realloc(out->data, want);
            if (!g) { st = dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes", path, want); break; }
            out->data = g;
            cap = want;
        }
        size_t left = cap - got;
        unsigned chunk = left > (1u << 30) ? 1u << 30 : (unsigned)left;
        int n = gzread(f, out->data + got, chunk);
        if (n <= 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            st = dt_error(DT_ERR_IO, "%s: %s after %zu of %zu data bytes", path,
                          n < 0 || zerr ? msg : "the data ends", got, count);
        }
        got += n > 0 ? (size_t)n : 0;
    }
    gzclose(f);
    if (st) { dt_idx_free(out); return st; }
    out->count = count;
    return DT_OK;
}

void dt_idx_free(dt_idx *x) {
    free(x->data);
    memset(x, 0, sizeof *x);
}

dt_status dt_images_load(const char *dir, const char *prefix, dt_images *out) {
    memset(out, 0, sizeof *out);
    char ip[4096], lp[4096];
    snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    dt_idx im, lb;
    dt_status st = dt_idx_load(ip, &im);
    if (st) return st;
    if ((st = dt_idx_load(lp, &lb))) { dt_idx_free(&im); return st; }
    if (im.ndim != 3) st = dt_error(DT_ERR_IO, "%s: images need 3 dimensions (count, rows, columns), found %d", ip, im.ndim);
    else if (lb.ndim != 1) st = dt_error(DT_ERR_IO, "%s: labels need 1 dimension, found %d", lp, lb.ndim);
    else if (im.dims[0] != lb.dims[0])
        st = dt_error(DT_ERR_IO, "%s has %d images but %s has %d labels", ip, im.dims[0], lp, lb.dims[0]);
    size_t n = im.ndim ? (size_t)im.dims[0] : 0, dim = st ? 0 : (size_t)im.dims[1] * im.dims[2];
    if (!st) {
        out->x = malloc(n * dim * sizeof(float));
        out->y = malloc(n * sizeof(int32_t));
        if (!out->x || !out->y) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", ip);
    }
    int classes = 0;
    for (size_t i = 0; !st && i < n; i++) {
        out->y[i] = lb.data[i];
        if (lb.data[i] + 1 > classes) classes = lb.data[i] + 1;
    }
    for (size_t i = 0; !st && i < n * dim; i++) out->x[i] = im.data[i] * (1.0f / 255.0f);
    int rows = st ? 0 : im.dims[1], cols = st ? 0 : im.dims[2];
    dt_idx_free(&im);
    dt_idx_free(&lb);
    if (st) { dt_images_free(out); return st; }
    out->n = (int)n;
    out->channels = 1;
    out->rows = rows;
    out->cols = cols;
    out->dim = (int)dim;
    out->classes = classes;
    return DT_OK;
}

void dt_images_free(dt_images *s) {
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}
