/* Packing a Linear's weights [O, K] into panels (panels.h), in f32 or in
 * int8 with one absmax scale per output channel. */
#include "panels.h"
#include "simd.h"

#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whether weights are packed here: where the AVX-512 kernels run, and for int8 where they multiply bf16 (panels.h). */
static bool packs(bool int8) { return int8 ? dt_kernels_dpbf16() : dt_kernels_simd() == DT_SIMD_AVX512; }

/* Where element (o, k) of a packed [O, K] goes, in chunks of c inputs. */
static size_t packed_at(int o, int k, int O, int K, int c, bool packed) {
    if (!packed) return (size_t)o * K + k;
    int p = o / DT_PANEL, i = o % DT_PANEL, pw = O - p * DT_PANEL < DT_PANEL ? O - p * DT_PANEL : DT_PANEL, Kc = K & ~(c - 1);
    size_t base = (size_t)p * DT_PANEL * K;
    if (k < Kc) return base + (size_t)(k / c) * pw * c + (size_t)i * c + (k % c);
    return base + (size_t)Kc * pw + (size_t)i * (K - Kc) + (k - Kc);
}

/* Every panel of w ([O, K] rows of es-byte elements) packed where it lies: a panel holds the same elements as its
 * rows did, so each goes through one copy of a panel's size, not of the whole. */
static dt_status pack_where_it_lies(char *w, size_t es, int O, int K) {
    int c = dt_panel_chunk(es == 1);
    if (!packs(es == 1)) return DT_OK;
    char *rows = malloc(es * DT_PANEL * (size_t)K);
    if (!rows) return dt_error(DT_ERR_NOMEM, "panels: out of memory packing a [%d, %d] weight", O, K);
    for (int o0 = 0; o0 < O; o0 += DT_PANEL) {
        int pw = O - o0 < DT_PANEL ? O - o0 : DT_PANEL;
        memcpy(rows, w + es * (size_t)o0 * K, es * (size_t)pw * K);
        for (int i = 0; i < pw; i++)
            for (int k = 0; k < K; k++) {
                size_t to = packed_at(o0 + i, k, O, K, c, true), from = (size_t)i * K + k;
                if (es == sizeof(float)) ((float *)w)[to] = ((const float *)rows)[from];
                else w[to] = rows[from];
            }
    }
    free(rows);
    return DT_OK;
}

dt_status dt_panels_create(const float *w, int O, int K, bool int8, dt_panels **out) {
    *out = NULL;
    if (O < 1 || K < 1) return dt_error(DT_ERR_ARG, "panels: a [%d, %d] weight (each must be >= 1)", O, K);
    dt_panels *p = calloc(1, sizeof *p);
    size_t n = (size_t)O * K;
    /* aligned: a packed f32 panel is read in loads of 64 bytes, each split over two cache lines otherwise */
    if (p) *p = (dt_panels){ O, K, int8 ? NULL : dt_alloc_streamed(n * sizeof(float)), int8 ? dt_alloc_streamed(n) : NULL,
                             int8 ? malloc((size_t)O * sizeof(float)) : NULL, packs(int8), false };
    if (!p || (int8 ? !p->q || !p->scale : !p->f)) {
        dt_panels_destroy(p);
        return dt_error(DT_ERR_NOMEM, "panels: out of memory packing a [%d, %d] weight", O, K);
    }
    if (int8) {
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < O; o++) p->scale[o] = dt_int8_quantize(p->q + (size_t)o * K, w + (size_t)o * K, (size_t)K);
    } else {
        memcpy(p->f, w, n * sizeof(float));
    }
    dt_status st = pack_where_it_lies(int8 ? (char *)p->q : (char *)p->f, int8 ? 1 : sizeof(float), O, K);
    if (st) { dt_panels_destroy(p); return st; }
    *out = p;
    return DT_OK;
}

dt_status dt_panels_pack_in_place(float *w, int O, int K, dt_panels **out) {
    *out = NULL;
    if (O < 1 || K < 1) return dt_error(DT_ERR_ARG, "panels: a [%d, %d] weight (each must be >= 1)", O, K);
    dt_panels *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "panels: out of memory");
    *p = (dt_panels){ O, K, w, NULL, NULL, packs(false), true };
    dt_status st = pack_where_it_lies((char *)w, sizeof(float), O, K);
    if (st) { free(p); return st; }
    *out = p;
    return DT_OK;
}

void dt_panels_destroy(dt_panels *p) {
    if (!p) return;
    if (!p->borrowed) dt_free_aligned(p->f);
    dt_free_aligned(p->q);
    free(p->scale);
    free(p);
}

size_t dt_panels_bytes(const dt_panels *p) {
    size_t n = (size_t)p->O * p->K;
    return p->f ? n * sizeof(float) : n + (size_t)p->O * sizeof(float);
}

void dt_panels_row(const dt_panels *p, int o, float *dst) {
    /* where each chunk is, found once (the embeddings read a row a token) */
    int c = dt_panel_chunk(p->q != NULL), Kc = p->K & ~(c - 1);
    size_t first = packed_at(o, 0, p->O, p->K, c, p->packed);
    size_t step = p->K >= 2 * c ? packed_at(o, c, p->O, p->K, c, p->packed) - first : (size_t)c;
    for (int k = 0; k < p->K; k++) {
        size_t at = k < Kc ? first + (size_t)(k / c) * step + (k % c) : packed_at(o, k, p->O, p->K, c, p->packed);
        dst[k] = p->f ? p->f[at] : (float)p->q[at] * p->scale[o];
    }
}
