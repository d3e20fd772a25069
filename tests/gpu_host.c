/* gpu.h on the host: "device" memory is host memory and each kernel is the CPU kernel it stands for. Linked in place
 * of the CUDA path, it lets make test run the GPU model program's own orchestration (src/gpu/lm.c: its buffers, the
 * order of its ops, its gradient flow, its AdamW coefficients) against the CPU program on a machine without a GPU;
 * the kernels themselves are checked on a GPU (test_gpu_kernels). */
#include "dtrain/gpu.h"
#include "dtrain/kernels.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_gpu {
    int unused;
};

int dt_gpu_built(void) { return 1; }
int dt_gpu_count(void) { return 1; }

dt_status dt_gpu_open(int ordinal, dt_gpu **out) {
    *out = ordinal == 0 ? calloc(1, sizeof **out) : NULL;
    return *out ? DT_OK : dt_error(DT_ERR_ARG, "--device cuda:%d: the host emulation has GPU 0 only", ordinal);
}

void dt_gpu_close(dt_gpu *g) { free(g); }
int dt_gpu_ordinal(const dt_gpu *g) { return (void)g, 0; }
/* NCCL of one rank (the host has GPU 0 only, so data parallelism never asks for more): the mean of one is itself */
struct dt_gpu_nccl {
    int unused;
};
dt_status dt_gpu_nccl_id(void *id) { return memset(id, 0, DT_GPU_NCCL_ID_BYTES), DT_OK; }
dt_status dt_gpu_nccl_open(dt_gpu *g, const void *id, int nranks, int rank, dt_gpu_nccl **out) {
    (void)g, (void)id, (void)rank;
    *out = nranks == 1 ? calloc(1, sizeof **out) : NULL;
    return *out ? DT_OK : dt_error(DT_ERR_UNSUPPORTED, "host emulation: NCCL of one rank only, not %d", nranks);
}
void dt_gpu_nccl_allreduce(dt_gpu *g, dt_gpu_nccl *c, float *x, size_t n, int mean) { (void)g, (void)c, (void)x, (void)n, (void)mean; }
void dt_gpu_nccl_close(dt_gpu_nccl *c) { free(c); }
void dt_gpu_set_tf32(dt_gpu *g, int on) { (void)g, (void)on; }
int dt_gpu_tf32(const dt_gpu *g) { return (void)g, 0; }
/* the GPU's rule, so that the GPU runner takes the same path here */
int dt_gpu_flash_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }
void dt_gpu_attention_forward_lse(dt_gpu *g, float *o, float *l, const float *q, int B, int T, int C, int NH) {
    (void)g, dt_attention_forward_lse(o, l, q, B, T, C, NH);
}
void dt_gpu_attention_backward_lse(dt_gpu *g, float *dq, float *s, const float *d, const float *o, const float *q, const float *l, int B,
                                   int T, int C, int NH) {
    (void)g, (void)s, dt_attention_backward_lse(dq, d, o, q, l, B, T, C, NH);
}
/* cuDNN's attention as its arithmetic rounds: the CPU's, its output and each d(q|k|v) rounded to bf16 */
int dt_gpu_cudnn_supported(int head_dim) { return head_dim % 8 == 0 && head_dim <= 128; }
void dt_gpu_attention_forward_cudnn(dt_gpu *g, float *o, float *s, const float *q, int B, int T, int C, int NH, uint16_t *w, uint16_t *o16) {
    (void)g, (void)w, dt_attention_forward_lse(o, s, q, B, T, C, NH);
    dt_lp_round(o, (size_t)B * T * C, DT_BF16);
    if (o16) dt_lp_pack(o16, o, (size_t)B * T * C, DT_BF16);
}
void dt_gpu_attention_backward_cudnn(dt_gpu *g, float *dq, const float *d, const float *o, const float *q, const float *s, int B, int T,
                                     int C, int NH, uint16_t *w) {
    size_t n = (size_t)B * T * 3 * C;
    float *mine = calloc(n, sizeof *mine);
    if (!mine) abort(); /* a test's few kilobytes */
    (void)g, (void)w, dt_attention_backward_lse(mine, d, o, q, s, B, T, C, NH);
    dt_lp_round_add(dq, mine, n, DT_BF16);
    free(mine);
}
const char *dt_gpu_name(const dt_gpu *g) { return (void)g, "the host (CPU kernels in the GPU's place)"; }
void dt_gpu_props(const dt_gpu *g, int *sms, size_t *memory, int *capability) {
    (void)g;
    if (sms) *sms = 0;
    if (memory) *memory = 0;
    if (capability) *capability = 0;
}
/* What is free: DTRAIN_GPU_HOST_FREE_MB (a test's small GPU), else plenty. */
dt_status dt_gpu_mem_info(dt_gpu *g, size_t *f, size_t *t) {
    (void)g;
    const char *mb = getenv("DTRAIN_GPU_HOST_FREE_MB");
    *f = *t = mb ? (size_t)atol(mb) << 20 : (size_t)1 << 40;
    return DT_OK;
}
dt_status dt_gpu_alloc(dt_gpu *g, size_t bytes, void **out) {
    (void)g;
    *out = malloc(bytes ? bytes : 16);
    return *out ? DT_OK : dt_error(DT_ERR_NOMEM, "host emulation: no room for %zu bytes", bytes);
}
void dt_gpu_free(dt_gpu *g, void *p) { (void)g, free(p); }
dt_status dt_gpu_host_alloc(dt_gpu *g, size_t bytes, void **out, int *pinned) {
    (void)g, *pinned = 0, *out = malloc(bytes ? bytes : 16);
    return *out ? DT_OK : dt_error(DT_ERR_NOMEM, "host emulation: no room for %zu bytes", bytes);
}
void dt_gpu_host_free(dt_gpu *g, void *p, int pinned) { (void)g, (void)pinned, free(p); }
int dt_gpu_host_pin(dt_gpu *g, void *p, size_t bytes, int on) { return (void)g, (void)p, (void)bytes, (void)on, 0; }
dt_status dt_gpu_upload(dt_gpu *g, void *d, const void *s, size_t n) { return (void)g, memcpy(d, s, n), DT_OK; }
dt_status dt_gpu_download(dt_gpu *g, void *d, const void *s, size_t n) { return (void)g, memcpy(d, s, n), DT_OK; }
void dt_gpu_zero(dt_gpu *g, void *p, size_t n) { (void)g, memset(p, 0, n); }
dt_status dt_gpu_sync(dt_gpu *g) { return (void)g, DT_OK; }
dt_status dt_gpu_mark(dt_gpu *g, int slot) { return (void)g, (void)slot, DT_OK; }
double dt_gpu_elapsed_ms(dt_gpu *g, int from, int to) { return (void)g, (void)from, (void)to, 0; }

void dt_gpu_matmul_forward(dt_gpu *g, float *o, const float *i, const float *w, const float *b, int BT, int C, int OC) {
    (void)g, dt_matmul_forward(o, i, w, b, BT, C, OC);
}
void dt_gpu_matmul_backward(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const float *w, int BT, int C,
                            int OC) {
    (void)g, dt_matmul_backward(di, dw, db, d, i, w, BT, C, OC);
}
/* a forward kernel's bits: its outputs rounded to bf16, their bits kept */
static void host_bits(float *o, uint16_t *bits, size_t n) {
    if (!bits) return;
    dt_lp_round(o, n, DT_BF16);
    dt_lp_pack(bits, o, n, DT_BF16);
}
void dt_gpu_layernorm_forward(dt_gpu *g, float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C,
                              uint16_t *h) {
    (void)g, dt_layernorm_forward(o, m, r, i, w, b, N, C);
    host_bits(o, h, (size_t)N * C);
}
/* a norm's backward input, rounded to bf16 where asked (in a copy) */
static const float *host_rounded(const float *i, size_t n, int round, float **own) {
    *own = NULL;
    if (!round) return i;
    if (!(*own = malloc(n * sizeof(float)))) abort(); /* a test's few megabytes */
    memcpy(*own, i, n * sizeof(float));
    dt_lp_round(*own, n, DT_BF16);
    return *own;
}
void dt_gpu_layernorm_backward(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const float *w,
                               const float *m, const float *r, int N, int C, int round_in) {
    float *own;
    const float *x = host_rounded(i, (size_t)N * C, round_in, &own);
    (void)g, dt_layernorm_backward(di, dw, db, d, x, w, m, r, N, C);
    free(own);
}
void dt_gpu_rmsnorm_forward(dt_gpu *g, float *o, float *r, const float *i, const float *w, int N, int C, float eps, uint16_t *h) {
    (void)g, dt_rmsnorm_forward(o, r, i, w, N, C, eps);
    host_bits(o, h, (size_t)N * C);
}
void dt_gpu_rmsnorm_backward(dt_gpu *g, float *di, float *dw, const float *d, const float *i, const float *w, const float *r, int N, int C,
                             int round_in) {
    float *own;
    const float *x = host_rounded(i, (size_t)N * C, round_in, &own);
    (void)g, dt_rmsnorm_backward(di, dw, d, x, w, r, N, C);
    free(own);
}
void dt_gpu_swiglu_forward(dt_gpu *g, float *o, const float *gu, int N, int F, uint16_t *h) {
    (void)g, dt_swiglu_forward(o, gu, N, F);
    host_bits(o, h, (size_t)N * F);
}
void dt_gpu_swiglu_backward(dt_gpu *g, float *d, const float *gu, const float *o, int N, int F) { (void)g, dt_swiglu_backward(d, gu, o, N, F); }
void dt_gpu_rope(dt_gpu *g, float *x, const float *f, int rows, int T, int heads, int d, size_t stride, int backward) {
    (void)g;
    int32_t *pos = malloc((size_t)rows * sizeof *pos);
    for (int r = 0; r < rows; r++) pos[r] = r % T;
    (backward ? dt_rope_backward : dt_rope_forward)(x, f, pos, rows, heads, d, stride);
    free(pos);
}
/* the K/V head each query head reads: NH / KVH heads share one, in order */
static int *kv_heads(int NH, int KVH) {
    int *k = malloc((size_t)NH * sizeof *k);
    for (int h = 0; h < NH; h++) k[h] = h / (NH / KVH);
    return k;
}
void dt_gpu_attention_pack(dt_gpu *g, float *p, const float *in, int BT, int NH, int KVH, int hd) {
    int *kv = kv_heads(NH, KVH);
    (void)g, dt_attention_pack(p, in, BT, NH, KVH, hd, kv);
    free(kv);
}
void dt_gpu_attention_unpack(dt_gpu *g, float *din, const float *dp, int BT, int NH, int KVH, int hd) {
    int *kv = kv_heads(NH, KVH);
    (void)g, dt_attention_unpack(din, dp, BT, NH, KVH, hd, kv);
    free(kv);
}
void dt_gpu_gelu_forward(dt_gpu *g, float *o, const float *i, size_t n, uint16_t *h) {
    (void)g, dt_gelu_forward(o, i, n);
    host_bits(o, h, n);
}
void dt_gpu_gelu_backward(dt_gpu *g, float *di, const float *i, const float *d, size_t n) { (void)g, dt_gelu_backward(di, i, d, n); }
void dt_gpu_residual_forward(dt_gpu *g, float *o, const float *a, const float *b, size_t n) { (void)g, dt_residual_forward(o, a, b, n); }
void dt_gpu_accumulate(dt_gpu *g, float *d, const float *s, size_t n) {
    (void)g;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
}
/* no positions' table (rotary positions): the token rows alone, as the vocabulary-parallel lookup of every row */
void dt_gpu_embedding_forward(dt_gpu *g, float *o, const int32_t *t, const float *e, const float *p, int B, int T, int C) {
    (void)g;
    if (p) dt_embedding_forward(o, t, e, p, B, T, C);
    else dt_embedding_rows_forward(o, t, e, 0, INT_MAX, B * T, C);
}
void dt_gpu_embedding_backward(dt_gpu *g, float *de, float *dp, const float *d, const int32_t *t, int B, int T, int C) {
    (void)g;
    if (dp) dt_embedding_backward(de, dp, d, t, B, T, C);
    else dt_embedding_rows_backward(de, d, t, 0, INT_MAX, B * T, C);
}
void dt_gpu_attention_forward(dt_gpu *g, float *o, float *a, const float *q, int B, int T, int C, int NH) {
    (void)g, dt_attention_forward(o, a, q, B, T, C, NH);
}
void dt_gpu_attention_backward(dt_gpu *g, float *dq, float *s, const float *d, const float *q, const float *a, int B, int T, int C,
                               int NH) {
    (void)g, (void)s, dt_attention_backward(dq, d, q, a, B, T, C, NH);
}
void dt_gpu_crossentropy_fused(dt_gpu *g, float *l, float *ls, const int32_t *t, int BT, int V, int Vp, float s) {
    (void)g, dt_crossentropy_fused(l, ls, t, BT, V, Vp, s, DT_F32);
}
void dt_gpu_adamw(dt_gpu *g, float *p, const float *gr, float gs, float *m, float *v, size_t n, float b1, float b2, float eps, float decay,
                  float step, float sbc2) {
    (void)g;
    for (size_t i = 0; i < n; i++) {
        float gi = gr[i] * gs;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        p[i] = p[i] * decay - step * m[i] / (sqrtf(v[i]) / sbc2 + eps);
    }
}
void dt_gpu_sumsq(dt_gpu *g, const float *x, size_t n, double *ss) {
    (void)g;
    for (size_t i = 0; i < n; i++) *ss += (double)x[i] * x[i];
}
void dt_gpu_scale(dt_gpu *g, float *x, size_t n, float f) {
    (void)g;
    for (size_t i = 0; i < n; i++) x[i] *= f;
}
void dt_gpu_round_bf16(dt_gpu *g, float *d, const float *s, size_t n, uint16_t *h) {
    if (d != s) memcpy(d, s, n * sizeof(float));
    (void)g, dt_lp_round(d, n, DT_BF16);
    host_bits(d, h, n);
}
void dt_gpu_pack_bf16(dt_gpu *g, uint16_t *d, const float *s, size_t n) { (void)g, dt_lp_pack(d, s, n, DT_BF16); }
void dt_gpu_widen_bf16(dt_gpu *g, float *d, const uint16_t *s, size_t n, int add) {
    (void)g;
    for (size_t i = 0; i < n; i++) d[i] = (add ? d[i] : 0.0f) + dt_bf16_to_f32(s[i]);
}
/* the cross-entropy's work (a row's logits a thread: its size sets no sums' order) */
#define HOST_LP_WORK ((size_t)1 << 22)
/* a kernel's work, n floats */
static float *host_work(size_t n) {
    float *work = malloc(n * sizeof *work);
    if (!work) abort(); /* a test's few megabytes */
    return work;
}
/* a block's 16-bit Linear's work: its weight whole, twice, as the program's work holds it, so that it is one chunk
 * here as there (BLAS's bits follow the shapes it is called with) */
static size_t linear_work(int C, int OC) { return 2 * (size_t)OC * (size_t)C; }
/* the input a Linear reads: its producer's bits where given (so that bits wired to the wrong value show), else inp */
static const float *host_input(const float *i, const uint16_t *i16, size_t n, float **own) {
    *own = NULL;
    if (!i16) return i;
    if (!(*own = malloc(n * sizeof(float)))) abort(); /* a test's few megabytes */
    dt_lp_unpack(*own, i16, n, DT_BF16);
    return *own;
}
void dt_gpu_matmul_forward_bf16(dt_gpu *g, float *o, const float *i, const uint16_t *i16, const uint16_t *w, const uint16_t *b, int BT,
                                int C, int OC, uint16_t *wk) {
    size_t n = linear_work(C, OC);
    float *work = host_work(n), *own;
    const float *x = host_input(i, i16, (size_t)BT * C, &own);
    (void)g, (void)wk, dt_matmul_forward_lp(o, x, w, b, BT, C, OC, DT_BF16, work, n, 0);
    free(work), free(own);
}
void dt_gpu_matmul_backward_bf16(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const uint16_t *i16,
                                 const uint16_t *w, int BT, int C, int OC, uint16_t *w16, float *wk) {
    size_t n = linear_work(C, OC);
    float *work = host_work(n), *own, *dr;
    const float *x = host_input(i, i16, (size_t)BT * C, &own);
    const float *dy = host_rounded(d, (size_t)BT * OC, 1, &dr); /* read rounded; d itself left as it was */
    (void)g, (void)w16, (void)wk, dt_matmul_backward_lp(di, dw, db, dy, x, w, BT, C, OC, DT_BF16, work, n, 0);
    free(work), free(own), free(dr);
}
/* the head's halves, each the CPU program's own (dt_matmul_*_lp16: its chunks of the vocabulary and blocks of tokens
 * are the shapes BLAS is called with, which set the bits once it runs on several threads), with the work they need:
 * its sums (rounded here already: the cross-entropy reads them rounded, and rounding twice is rounding once), its
 * backward from bf16 bits */
static float *head_work(int C, int OC, size_t *n) {
    *n = 3 * (size_t)dt_matmul_lp16_rows(C, OC) * (size_t)C;
    return host_work(*n);
}
void dt_gpu_matmul_sums_bf16(dt_gpu *g, float *o, const float *i, const uint16_t *i16, const uint16_t *w, int BT, int C, int OC,
                             uint16_t *wk) {
    size_t n;
    float *work = head_work(C, OC, &n), *own;
    uint16_t *o16 = malloc((size_t)BT * OC * sizeof *o16);
    if (!o16) abort();
    const float *x = host_input(i, i16, (size_t)BT * C, &own);
    (void)g, (void)wk, dt_matmul_forward_lp16(o16, x, w, BT, C, OC, DT_BF16, work, n);
    dt_lp_unpack(o, o16, (size_t)BT * OC, DT_BF16);
    free(work), free(own), free(o16);
}
void dt_gpu_matmul_backward_bf16_from(dt_gpu *g, float *di, float *dw, const uint16_t *d16, const float *i, const uint16_t *i16,
                                      const uint16_t *w, int BT, int C, int OC, uint16_t *w16, float *wk) {
    size_t n;
    float *work = head_work(C, OC, &n), *own;
    const float *x = host_input(i, i16, (size_t)BT * C, &own);
    (void)g, (void)w16, (void)wk, dt_matmul_backward_lp16(di, dw, d16, NULL, x, w, BT, C, OC, DT_BF16, work, n, 0);
    free(work), free(own);
}
/* the head's 16-bit cross-entropy: the CPU's own (dt_crossentropy_forward_lp, dt_crossentropy_grad_lp) on the
 * logits' bf16 bits */
static uint16_t *host_logits16(const float *l, size_t n) {
    uint16_t *x = malloc(n * sizeof *x);
    if (!x) abort();
    dt_lp_pack(x, l, n, DT_BF16);
    return x;
}
void dt_gpu_crossentropy_forward_bf16(dt_gpu *g, const float *l, float *ls, float *st, const int32_t *t, int BT, int V, int Vp) {
    uint16_t *x = host_logits16(l, (size_t)BT * Vp);
    float *work = host_work(HOST_LP_WORK);
    (void)g, dt_crossentropy_forward_lp(ls, st, x, t, BT, V, Vp, DT_BF16, work, HOST_LP_WORK);
    free(work), free(x);
}
void dt_gpu_crossentropy_backward_bf16(dt_gpu *g, uint16_t *d, const float *l, const float *st, const int32_t *t, int BT, int V, int Vp,
                                       float dscale) {
    uint16_t *x = host_logits16(l, (size_t)BT * Vp);
    float *df = malloc((size_t)BT * Vp * sizeof(float));
    if (!df) abort();
    dt_ce_grad ce = { .stats = st, .targets = t, .V = V, .v0 = 0, .dscale = dscale, .row_scale = NULL };
    (void)g, dt_crossentropy_grad_lp(df, x, 0, BT, Vp, 0, Vp, &ce, DT_BF16);
    dt_lp_pack(d, df, (size_t)BT * Vp, DT_BF16);
    free(df), free(x);
}
dt_status dt_gpu_measure_gemm(dt_gpu *g, int bf16, int M, int N, int K, double *t) {
    return (void)g, (void)bf16, (void)M, (void)N, (void)K, *t = 0, DT_OK;
}
dt_status dt_gpu_measure_copy(dt_gpu *g, size_t bytes, double *gbs) { return (void)g, (void)bytes, *gbs = 0, DT_OK; }
/* decoding: the kernels' arithmetic in loops (the CPU decoder's rotary kernel for the turn) */
void dt_gpu_embed_rows(dt_gpu *g, float *o, const int32_t *r, const float *wte, const float *wpe, int n, int C) {
    (void)g;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            o[(size_t)i * C + c] = wte[(size_t)r[4 * i + 2] * C + c] + (wpe ? wpe[(size_t)r[4 * i + 1] * C + c] : 0.0f);
}
void dt_gpu_rope_rows(dt_gpu *g, float *x, const float *f, const int32_t *r, int n, int heads, int d, size_t stride) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; pos && i < n; i++) pos[i] = r[4 * i + 1];
    if (pos) dt_rope_forward(x, f, pos, n, heads, d, stride);
    (void)g, free(pos);
}
static float *host_kv(const dt_gpu_kv *kv, int s, int l, int part) {
    return kv->cache + (size_t)s * kv->slot_elems + ((size_t)l * 2 + part) * kv->P * (size_t)kv->KVH * kv->hd;
}
void dt_gpu_attention_cached(dt_gpu *g, float *o, const dt_gpu_kv *kv, const float *in, const int32_t *r, int n, int l, int NH, int win) {
    size_t hd = (size_t)kv->hd, KV = (size_t)kv->KVH * hd, Q = (size_t)NH * hd;
    for (int i = 0; i < n; i++)
        for (int part = 0; part < 2; part++)
            memcpy(host_kv(kv, r[4 * i], l, part) + (size_t)r[4 * i + 1] * KV, in + (size_t)i * win + Q + part * KV, KV * sizeof(float));
    float *s = malloc(sizeof(float) * (size_t)kv->P);
    for (int i = 0; s && i < n; i++)
        for (int h = 0; h < NH; h++) {
            int npos = r[4 * i + 1] + 1, kh = h / (NH / kv->KVH);
            const float *q = in + (size_t)i * win + h * hd, *K = host_kv(kv, r[4 * i], l, 0) + kh * hd, *V = host_kv(kv, r[4 * i], l, 1) + kh * hd;
            float mx = -INFINITY, sum = 0, *y = o + (size_t)i * Q + h * hd;
            for (int t = 0; t < npos; t++) {
                float d = 0;
                for (size_t j = 0; j < hd; j++) d += q[j] * K[t * KV + j];
                s[t] = d / sqrtf((float)hd);
                mx = fmaxf(mx, s[t]);
            }
            for (int t = 0; t < npos; t++) sum += (s[t] = expf(s[t] - mx));
            for (size_t j = 0; j < hd; j++) {
                float acc = 0;
                for (int t = 0; t < npos; t++) acc += s[t] * V[t * KV + j];
                y[j] = acc / sum;
            }
        }
    (void)g, free(s);
}
void dt_gpu_gather_rows(dt_gpu *g, float *o, const float *in, const int32_t *idx, int m, int C) {
    (void)g;
    for (int i = 0; i < m; i++) memcpy(o + (size_t)i * C, in + (size_t)idx[i] * C, sizeof(float) * (size_t)C);
}
