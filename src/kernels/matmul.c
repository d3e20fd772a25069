/* Matrix multiply through BLAS (OpenBLAS by default, BLIS at configure time):
 * the linear layers' forward and backward. Row-major, weights stored as
 * [OC, C] like torch.nn.Linear. bf16 ones through a bf16 GEMM where the CPU
 * has one (gemm_bf16.c). */
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <cblas.h>
#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <strings.h>

#ifndef DT_BLAS_BLIS
char *openblas_get_corename(void);
#endif

void dt_kernels_blas_name(char *out, size_t n) {
#ifdef DT_BLAS_BLIS
    snprintf(out, n, "BLIS");
#else
    snprintf(out, n, "OpenBLAS %s", openblas_get_corename());
#endif
}

/* An OpenBLAS kernel set's vector level for sgemm: 2 AVX-512 (Cooperlake's and Sapphire Rapids' are SkylakeX's with bf16
 * besides), 1 AVX2 with FMA, 0 older (OpenBLAS 0.3's names for x86-64). */
static int core_level(const char *name) {
    static const char *const names[] = { "SapphireRapids", "Cooperlake", "SkylakeX", "Haswell", "Zen" };
    static const int levels[] = { 2, 2, 2, 1, 1 };
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (!strcasecmp(name, names[i])) return levels[i];
    return 0;
}

const char *dt_kernels_blas_core_wanted(void) {
#ifdef DT_BLAS_BLIS
    return NULL;
#else
    int have = core_level(openblas_get_corename());
    if (have >= 2) return NULL; /* the highest level: nothing to read from the CPU's flags */
    const char *want = dt_cpu_has("avx512_bf16") && dt_cpu_has("avx512bw") ? "Cooperlake"
                       : dt_cpu_has("avx512f") && dt_cpu_has("avx512bw") && dt_cpu_has("avx512vl") && dt_cpu_has("avx512dq") ? "SkylakeX"
                       : dt_cpu_has("avx2") && dt_cpu_has("fma")                                                                 ? "Haswell"
                                                                                                                                 : NULL;
    return want && have < core_level(want) ? want : NULL;
#endif
}

void dt_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int BT, int C, int OC) {
    if (bias) {
        /* Start from the bias so that sgemm adds onto it (beta = 1). */
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < BT; i++)
            for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] = bias[o];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
}

void dt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        int BT, int C, int OC) {
    if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        /* Row by row, so each pass over dout is contiguous; columns split between threads. */
        #pragma omp parallel
        {
            int nt = 1, t = 0;
#ifdef _OPENMP
            nt = omp_get_num_threads();
            t = omp_get_thread_num();
#endif
            int o0 = (int)((long)OC * t / nt), o1 = (int)((long)OC * (t + 1) / nt);
            for (int i = 0; i < BT; i++) {
                const float *row = dout + (size_t)i * OC;
                #pragma omp simd
                for (int o = o0; o < o1; o++) dbias[o] += row[o];
            }
        }
    }
}

/* Mixed precision. The weights come as 16-bit values and are widened one
 * chunk of output rows at a time (as many as half of work holds: sgemm over
 * chunks narrower than a few thousand columns lost a third of its speed on
 * the LM head here, so the model gives room for 8192 rows) into work
 * (exactly: every bf16 or f16 value is an f32), so sgemm multiplies 16-bit values and sums in f32, which is
 * what a 16-bit GEMM with f32 accumulation computes. The results are rounded
 * to 16 bits where autocast's linear returns 16-bit tensors. */
void dt_lora_down(float *u, const float *inp, const float *a, int BT, int C, int r) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, r, C, 1.0f, inp, C, a, C, 0.0f, u, r);
}

void dt_lora_up(float *out, int ldo, const float *u, const float *b, float scale, int BT, int r, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, r, scale, u, r, b, r, 1.0f, out, ldo);
}

void dt_lora_up_backward(float *db, float *du, const float *dout, int ldo, const float *u, const float *b, float scale, int BT, int r,
                         int OC) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, r, BT, scale, dout, ldo, u, r, 1.0f, db, r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, r, OC, scale, dout, ldo, b, r, 0.0f, du, r);
}

void dt_lora_down_backward(float *dinp, float *da, const float *du, const float *inp, const float *a, int BT, int C, int r) {
    if (da) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, C, BT, 1.0f, du, r, inp, C, 1.0f, da, C);
    if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, r, 1.0f, du, r, a, C, 1.0f, dinp, C);
}

static int lp_rows(int C, size_t half) {
    size_t r = half / (size_t)C;
    return r < 1 ? 1 : r > INT_MAX ? INT_MAX : (int)r;
}

/* Where the CPU multiplies bf16 (dt_gemm_bf16), the bf16 matmuls need no
 * widening: the weights are read as they are, the f32-held activations and
 * output gradients are packed to bf16 once (slot), and each GEMM that the
 * bf16 one cannot take falls back to sgemm on widened values. NULL: sgemm. */
static const uint16_t *bf16_input(int slot, const float *x, int rows, int cols, dt_dtype t) {
    return t == DT_BF16 && dt_gemm_bf16_ready() ? dt_gemm_bf16_pack(slot, x, (size_t)rows * (size_t)cols) : NULL;
}

void dt_matmul_forward_lp(float *out, const float *inp, const uint16_t *w, const uint16_t *bias, int BT, int C, int OC,
                          dt_dtype t, float *work, size_t work_floats, int partial) {
    if (bias) {
        dt_lp_unpack(work, bias, (size_t)OC, t);
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < BT; i++)
            for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] = work[o];
    }
    const uint16_t *a16 = bf16_input(0, inp, BT, C, t);
    if (a16 && dt_gemm_bf16(0, 1, BT, OC, C, a16, C, w, C, bias != NULL, out, OC)) {
        if (!partial) dt_lp_round(out, (size_t)BT * OC, t);
        return;
    }
    int R = lp_rows(C, work_floats / 2);
    for (int o0 = 0; o0 < OC; o0 += R) {
        int r = OC - o0 < R ? OC - o0 : R;
        dt_lp_unpack(work, w + (size_t)o0 * C, (size_t)r * C, t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, r, C, 1.0f, inp, C, work, C, bias ? 1.0f : 0.0f, out + o0, OC);
        /* each chunk's columns while they are still in cache (the LM head's logits are the largest tensor) */
        if (partial) continue;
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < BT; i++) dt_lp_round(out + (size_t)i * OC + o0, (size_t)r, t);
    }
}

void dt_matmul_backward_lp(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const uint16_t *w, int BT,
                           int C, int OC, dt_dtype t, float *work, size_t work_floats, int partial) {
    const uint16_t *d16 = bf16_input(0, dout, BT, OC, t), *a16 = d16 && dw ? bf16_input(1, inp, BT, C, t) : NULL;
    int dinp_done = dinp && d16 && dt_gemm_bf16(0, 0, BT, C, OC, d16, OC, w, C, 1, dinp, C);
    int R = lp_rows(C, work_floats / 2);
    float *wf = work, *dwc = work + work_floats / 2;
    for (int o0 = 0; o0 < OC; o0 += R) {
        int r = OC - o0 < R ? OC - o0 : R;
        size_t rc = (size_t)r * C;
        if (dinp && !dinp_done) {
            dt_lp_unpack(wf, w + (size_t)o0 * C, rc, t);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, r, 1.0f, dout + o0, OC, wf, C, 1.0f, dinp, C);
        }
        /* this use's weight gradient is a 16-bit tensor; the f32 store sums the uses */
        if (!dw) continue;
        if (!(a16 && dt_gemm_bf16(1, 0, r, C, BT, d16 + o0, OC, a16, C, 0, dwc, C)))
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, C, BT, 1.0f, dout + o0, OC, inp, C, 0.0f, dwc, C);
        dt_lp_round_add(dw + (size_t)o0 * C, dwc, rc, t);
    }
    if (dinp && !partial) dt_lp_round(dinp, (size_t)BT * C, t);
    if (dbias) {
        float *sum = wf;
        for (int o = 0; o < OC; o++) sum[o] = 0;
        for (int i = 0; i < BT; i++) {
            const float *row = dout + (size_t)i * OC;
            #pragma omp simd
            for (int o = 0; o < OC; o++) sum[o] += row[o];
        }
        dt_lp_round(sum, (size_t)OC, t);
        for (int o = 0; o < OC; o++) dbias[o] += sum[o];
    }
}

/* 1.5M floats a chunk, so a chunk's three pieces stay in a 32 MiB L3; at least 1024 rows (narrower, sgemm slows). */
int dt_matmul_lp16_rows(int C, int OC) {
    int rows = (int)(((size_t)1536 << 10) / (size_t)C);
    if (rows < 1024) rows = 1024;
    return rows < OC ? rows : OC;
}

/* The head's chunk of weight rows, and its token blocks that chunk's size (R x C floats), from the shape whatever
 * the work beyond it: backward's dinp sums the chunks and dw the blocks, and BLAS's bits on several threads follow
 * the shapes it is called with, so another caller's larger work must not move them (only a smaller one does). */
static int lp16_chunk(int C, int OC, size_t part) {
    int R = dt_matmul_lp16_rows(C, OC), fit = lp_rows(C, part);
    return R < fit ? R : fit;
}

/* The head's 16-bit logits: weight rows widened a chunk at a time (a third
 * of work), and the outputs of that chunk computed for a block of tokens
 * at a time into the second third, then narrowed into out; backward widens
 * a block of dout into the last third and sums the chunk's weight gradient
 * over the token blocks in the second before rounding it once, as the
 * whole use's gradient. */
void dt_matmul_forward_lp16(uint16_t *out, const float *inp, const uint16_t *w, int BT, int C, int OC, dt_dtype t, float *work,
                            size_t work_floats) {
    size_t part = work_floats / 3;
    float *wf = work, *oc = work + part;
    const uint16_t *a16 = bf16_input(0, inp, BT, C, t);
    int R = lp16_chunk(C, OC, part);
    for (int o0 = 0; o0 < OC; o0 += R) {
        int r = OC - o0 < R ? OC - o0 : R, tb = lp_rows(r, (size_t)R * (size_t)C), widened = 0;
        for (int t0 = 0; t0 < BT; t0 += tb) {
            int n = BT - t0 < tb ? BT - t0 : tb;
            if (!(a16 && dt_gemm_bf16(0, 1, n, r, C, a16 + (size_t)t0 * C, C, w + (size_t)o0 * C, C, 0, oc, r))) {
                if (!widened++) dt_lp_unpack(wf, w + (size_t)o0 * C, (size_t)r * C, t);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r, C, 1.0f, inp + (size_t)t0 * C, C, wf, C, 0.0f, oc, r);
            }
            #pragma omp parallel for schedule(static)
            for (int i = 0; i < n; i++) dt_lp_pack(out + (size_t)(t0 + i) * OC + o0, oc + (size_t)i * r, (size_t)r, t);
        }
    }
}

void dt_matmul_backward_lp16(float *dinp, float *dw, const uint16_t *dout, const dt_ce_grad *ce, const float *inp,
                             const uint16_t *w, int BT, int C, int OC, dt_dtype t, float *work, size_t work_floats, int partial) {
    size_t part = work_floats / 3;
    float *wf = work, *dwc = work + part, *dc = work + 2 * part;
    const uint16_t *a16 = bf16_input(1, inp, BT, C, t);
    int R = lp16_chunk(C, OC, part);
    for (int o0 = 0; o0 < OC; o0 += R) {
        int r = OC - o0 < R ? OC - o0 : R, tb = lp_rows(r, (size_t)R * (size_t)C), widened = 0;
        for (int t0 = 0; t0 < BT; t0 += tb) {
            int n = BT - t0 < tb ? BT - t0 : tb;
            if (ce) dt_crossentropy_grad_lp(dc, dout, t0, n, OC, o0, r, ce, t);
            else {
                #pragma omp parallel for schedule(static)
                for (int i = 0; i < n; i++) dt_lp_unpack(dc + (size_t)i * r, dout + (size_t)(t0 + i) * OC + o0, (size_t)r, t);
            }
            /* the block's gradient holds bf16 values (rounded as autocast's linear receives it) */
            const uint16_t *d16 = a16 ? bf16_input(2, dc, n, r, t) : NULL;
            if (dinp && !(d16 && dt_gemm_bf16(0, 0, n, C, r, d16, r, w + (size_t)o0 * C, C, 1, dinp + (size_t)t0 * C, C))) {
                if (!widened++) dt_lp_unpack(wf, w + (size_t)o0 * C, (size_t)r * C, t);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, r, 1.0f, dc, r, wf, C, 1.0f, dinp + (size_t)t0 * C, C);
            }
            if (dw && !(d16 && dt_gemm_bf16(1, 0, r, C, n, d16, r, a16 + (size_t)t0 * C, C, t0 != 0, dwc, C)))
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, C, n, 1.0f, dc, r, inp + (size_t)t0 * C, C, t0 ? 1.0f : 0.0f,
                            dwc, C);
        }
        if (dw) dt_lp_round_add(dw + (size_t)o0 * C, dwc, (size_t)r * C, t);
    }
    if (dinp && !partial) dt_lp_round(dinp, (size_t)BT * C, t);
}
