/* A build without CUDA (no nvcc when it was built): opening a GPU says so, and nothing else can be reached without
 * an open GPU (the rest are here only so that callers link). */
#include "dtrain/gpu.h"

int dt_gpu_built(void) { return 0; }
int dt_gpu_count(void) { return 0; }

dt_status dt_gpu_open(int ordinal, dt_gpu **out) {
    (void)ordinal;
    *out = NULL;
    return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: this dtrain was built without CUDA (no nvcc was found when it was built; "
                                        "install the CUDA toolkit and build again)");
}

void dt_gpu_close(dt_gpu *g) { (void)g; }
void dt_gpu_set_tf32(dt_gpu *g, int on) { (void)g, (void)on; }
int dt_gpu_tf32(const dt_gpu *g) { return (void)g, 0; }
int dt_gpu_flash_supported(int head_dim) { return (void)head_dim, 0; }
void dt_gpu_attention_forward_lse(dt_gpu *g, float *o, float *l, const float *q, int B, int T, int C, int NH) {
    (void)g, (void)o, (void)l, (void)q, (void)B, (void)T, (void)C, (void)NH;
}
void dt_gpu_attention_backward_lse(dt_gpu *g, float *dq, float *s, const float *d, const float *o, const float *q, const float *l, int B,
                                   int T, int C, int NH) {
    (void)g, (void)dq, (void)s, (void)d, (void)o, (void)q, (void)l, (void)B, (void)T, (void)C, (void)NH;
}
int dt_gpu_cudnn_supported(int head_dim) { return (void)head_dim, 0; }
void dt_gpu_attention_forward_cudnn(dt_gpu *g, float *o, float *s, const float *q, int B, int T, int C, int NH, uint16_t *w, uint16_t *o16) {
    (void)g, (void)o, (void)s, (void)q, (void)B, (void)T, (void)C, (void)NH, (void)w, (void)o16;
}
void dt_gpu_attention_backward_cudnn(dt_gpu *g, float *dq, const float *d, const float *o, const float *q, const float *s, int B, int T,
                                     int C, int NH, uint16_t *w) {
    (void)g, (void)dq, (void)d, (void)o, (void)q, (void)s, (void)B, (void)T, (void)C, (void)NH, (void)w;
}
const char *dt_gpu_name(const dt_gpu *g) { return (void)g, "none"; }
void dt_gpu_props(const dt_gpu *g, int *sms, size_t *memory, int *capability) {
    (void)g;
    if (sms) *sms = 0;
    if (memory) *memory = 0;
    if (capability) *capability = 0;
}
static dt_status none(void) { return dt_error(DT_ERR_UNSUPPORTED, "this dtrain was built without CUDA"); }
int dt_gpu_ordinal(const dt_gpu *g) { return (void)g, 0; }
dt_status dt_gpu_nccl_id(void *id) { return (void)id, none(); }
dt_status dt_gpu_nccl_open(dt_gpu *g, const void *id, int nranks, int rank, dt_gpu_nccl **out) {
    (void)g, (void)id, (void)nranks, (void)rank, *out = NULL;
    return none();
}
void dt_gpu_nccl_allreduce(dt_gpu *g, dt_gpu_nccl *c, float *x, size_t n, int mean) { (void)g, (void)c, (void)x, (void)n, (void)mean; }
void dt_gpu_nccl_close(dt_gpu_nccl *c) { (void)c; }
dt_status dt_gpu_mem_info(dt_gpu *g, size_t *f, size_t *t) { return (void)g, (void)f, (void)t, none(); }
dt_status dt_gpu_alloc(dt_gpu *g, size_t bytes, void **out) { return (void)g, (void)bytes, *out = 0, none(); }
void dt_gpu_free(dt_gpu *g, void *p) { (void)g, (void)p; }
dt_status dt_gpu_upload(dt_gpu *g, void *d, const void *s, size_t n) { return (void)g, (void)d, (void)s, (void)n, none(); }
dt_status dt_gpu_download(dt_gpu *g, void *d, const void *s, size_t n) { return (void)g, (void)d, (void)s, (void)n, none(); }
void dt_gpu_zero(dt_gpu *g, void *p, size_t n) { (void)g, (void)p, (void)n; }
dt_status dt_gpu_sync(dt_gpu *g) { return (void)g, none(); }
dt_status dt_gpu_mark(dt_gpu *g, int slot) { return (void)g, (void)slot, none(); }
double dt_gpu_elapsed_ms(dt_gpu *g, int from, int to) { return (void)g, (void)from, (void)to, -1; }
void dt_gpu_matmul_forward(dt_gpu *g, float *o, const float *i, const float *w, const float *b, int BT, int C, int OC) {
    (void)g, (void)o, (void)i, (void)w, (void)b, (void)BT, (void)C, (void)OC;
}
void dt_gpu_matmul_backward(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const float *w, int BT, int C,
                            int OC) {
    (void)g, (void)di, (void)dw, (void)db, (void)d, (void)i, (void)w, (void)BT, (void)C, (void)OC;
}
void dt_gpu_layernorm_forward(dt_gpu *g, float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C,
                              uint16_t *h) {
    (void)g, (void)o, (void)m, (void)r, (void)i, (void)w, (void)b, (void)N, (void)C, (void)h;
}
void dt_gpu_layernorm_backward(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const float *w,
                               const float *m, const float *r, int N, int C, int ri) {
    (void)g, (void)di, (void)dw, (void)db, (void)d, (void)i, (void)w, (void)m, (void)r, (void)N, (void)C, (void)ri;
}
void dt_gpu_rmsnorm_forward(dt_gpu *g, float *o, float *r, const float *i, const float *w, int N, int C, float eps, uint16_t *h) {
    (void)g, (void)o, (void)r, (void)i, (void)w, (void)N, (void)C, (void)eps, (void)h;
}
void dt_gpu_rmsnorm_backward(dt_gpu *g, float *di, float *dw, const float *d, const float *i, const float *w, const float *r, int N, int C,
                             int ri) {
    (void)g, (void)di, (void)dw, (void)d, (void)i, (void)w, (void)r, (void)N, (void)C, (void)ri;
}
void dt_gpu_swiglu_forward(dt_gpu *g, float *o, const float *gu, int N, int F, uint16_t *h) {
    (void)g, (void)o, (void)gu, (void)N, (void)F, (void)h;
}
void dt_gpu_swiglu_backward(dt_gpu *g, float *d, const float *gu, const float *o, int N, int F) {
    (void)g, (void)d, (void)gu, (void)o, (void)N, (void)F;
}
void dt_gpu_rope(dt_gpu *g, float *x, const float *f, int rows, int T, int heads, int d, size_t stride, int backward) {
    (void)g, (void)x, (void)f, (void)rows, (void)T, (void)heads, (void)d, (void)stride, (void)backward;
}
void dt_gpu_attention_pack(dt_gpu *g, float *p, const float *i, int BT, int NH, int KVH, int hd) {
    (void)g, (void)p, (void)i, (void)BT, (void)NH, (void)KVH, (void)hd;
}
void dt_gpu_attention_unpack(dt_gpu *g, float *d, const float *p, int BT, int NH, int KVH, int hd) {
    (void)g, (void)d, (void)p, (void)BT, (void)NH, (void)KVH, (void)hd;
}
void dt_gpu_gelu_forward(dt_gpu *g, float *o, const float *i, size_t n, uint16_t *h) { (void)g, (void)o, (void)i, (void)n, (void)h; }
void dt_gpu_gelu_backward(dt_gpu *g, float *di, const float *i, const float *d, size_t n) { (void)g, (void)di, (void)i, (void)d, (void)n; }
void dt_gpu_residual_forward(dt_gpu *g, float *o, const float *a, const float *b, size_t n) { (void)g, (void)o, (void)a, (void)b, (void)n; }
void dt_gpu_accumulate(dt_gpu *g, float *d, const float *s, size_t n) { (void)g, (void)d, (void)s, (void)n; }
void dt_gpu_embedding_forward(dt_gpu *g, float *o, const int32_t *t, const float *e, const float *p, int B, int T, int C) {
    (void)g, (void)o, (void)t, (void)e, (void)p, (void)B, (void)T, (void)C;
}
void dt_gpu_embedding_backward(dt_gpu *g, float *de, float *dp, const float *d, const int32_t *t, int B, int T, int C) {
    (void)g, (void)de, (void)dp, (void)d, (void)t, (void)B, (void)T, (void)C;
}
void dt_gpu_attention_forward(dt_gpu *g, float *o, float *a, const float *q, int B, int T, int C, int NH) {
    (void)g, (void)o, (void)a, (void)q, (void)B, (void)T, (void)C, (void)NH;
}
void dt_gpu_attention_backward(dt_gpu *g, float *dq, float *s, const float *d, const float *q, const float *a, int B, int T, int C,
                               int NH) {
    (void)g, (void)dq, (void)s, (void)d, (void)q, (void)a, (void)B, (void)T, (void)C, (void)NH;
}
void dt_gpu_crossentropy_fused(dt_gpu *g, float *l, float *ls, const int32_t *t, int BT, int V, int Vp, float s) {
    (void)g, (void)l, (void)ls, (void)t, (void)BT, (void)V, (void)Vp, (void)s;
}
void dt_gpu_adamw(dt_gpu *g, float *p, const float *gr, float gs, float *m, float *v, size_t n, float b1, float b2, float eps, float decay,
                  float step, float sbc2) {
    (void)g, (void)p, (void)gr, (void)gs, (void)m, (void)v, (void)n, (void)b1, (void)b2, (void)eps, (void)decay, (void)step, (void)sbc2;
}
void dt_gpu_sumsq(dt_gpu *g, const float *x, size_t n, double *ss) { (void)g, (void)x, (void)n, (void)ss; }
void dt_gpu_scale(dt_gpu *g, float *x, size_t n, float f) { (void)g, (void)x, (void)n, (void)f; }
void dt_gpu_round_bf16(dt_gpu *g, float *d, const float *s, size_t n, uint16_t *h) { (void)g, (void)d, (void)s, (void)n, (void)h; }
void dt_gpu_pack_bf16(dt_gpu *g, uint16_t *d, const float *s, size_t n) { (void)g, (void)d, (void)s, (void)n; }
void dt_gpu_matmul_sums_bf16(dt_gpu *g, float *o, const float *i, const uint16_t *i16, const uint16_t *w, int BT, int C, int OC,
                             uint16_t *wk) {
    (void)g, (void)o, (void)i, (void)i16, (void)w, (void)BT, (void)C, (void)OC, (void)wk;
}
void dt_gpu_matmul_backward_bf16_from(dt_gpu *g, float *di, float *dw, const uint16_t *d, const float *i, const uint16_t *i16,
                                      const uint16_t *w, int BT, int C, int OC, uint16_t *w16, float *wk) {
    (void)g, (void)di, (void)dw, (void)d, (void)i, (void)i16, (void)w, (void)BT, (void)C, (void)OC, (void)w16, (void)wk;
}
void dt_gpu_crossentropy_forward_bf16(dt_gpu *g, const float *l, float *ls, float *st, const int32_t *t, int BT, int V, int Vp) {
    (void)g, (void)l, (void)ls, (void)st, (void)t, (void)BT, (void)V, (void)Vp;
}
void dt_gpu_crossentropy_backward_bf16(dt_gpu *g, uint16_t *d, const float *l, const float *st, const int32_t *t, int BT, int V, int Vp,
                                       float s) {
    (void)g, (void)d, (void)l, (void)st, (void)t, (void)BT, (void)V, (void)Vp, (void)s;
}
void dt_gpu_widen_bf16(dt_gpu *g, float *d, const uint16_t *s, size_t n, int add) { (void)g, (void)d, (void)s, (void)n, (void)add; }
void dt_gpu_matmul_forward_bf16(dt_gpu *g, float *o, const float *i, const uint16_t *i16, const uint16_t *w, const uint16_t *b, int BT,
                                int C, int OC, uint16_t *wk) {
    (void)g, (void)o, (void)i, (void)i16, (void)w, (void)b, (void)BT, (void)C, (void)OC, (void)wk;
}
void dt_gpu_matmul_backward_bf16(dt_gpu *g, float *di, float *dw, float *db, const float *d, const float *i, const uint16_t *i16,
                                 const uint16_t *w, int BT, int C, int OC, uint16_t *w16, float *wk) {
    (void)g, (void)di, (void)dw, (void)db, (void)d, (void)i, (void)i16, (void)w, (void)BT, (void)C, (void)OC, (void)w16, (void)wk;
}
dt_status dt_gpu_measure_gemm(dt_gpu *g, int bf16, int M, int N, int K, double *t) {
    return (void)g, (void)bf16, (void)M, (void)N, (void)K, (void)t, none();
}
dt_status dt_gpu_measure_copy(dt_gpu *g, size_t bytes, double *gbs) { return (void)g, (void)bytes, (void)gbs, none(); }
void dt_gpu_embed_rows(dt_gpu *g, float *o, const int32_t *r, const float *wte, const float *wpe, int n, int C) {
    (void)g, (void)o, (void)r, (void)wte, (void)wpe, (void)n, (void)C;
}
void dt_gpu_rope_rows(dt_gpu *g, float *x, const float *f, const int32_t *r, int n, int heads, int d, size_t stride) {
    (void)g, (void)x, (void)f, (void)r, (void)n, (void)heads, (void)d, (void)stride;
}
void dt_gpu_attention_cached(dt_gpu *g, float *o, const dt_gpu_kv *kv, const float *in, const int32_t *r, int n, int l, int NH, int win) {
    (void)g, (void)o, (void)kv, (void)in, (void)r, (void)n, (void)l, (void)NH, (void)win;
}
void dt_gpu_gather_rows(dt_gpu *g, float *o, const float *in, const int32_t *idx, int m, int C) {
    (void)g, (void)o, (void)in, (void)idx, (void)m, (void)C;
}
dt_status dt_gpu_host_alloc(dt_gpu *g, size_t bytes, void **out, int *pinned) { return (void)g, (void)bytes, *pinned = 0, *out = 0, none(); }
void dt_gpu_host_free(dt_gpu *g, void *p, int pinned) { (void)g, (void)p, (void)pinned; }
int dt_gpu_host_pin(dt_gpu *g, void *p, size_t bytes, int on) { return (void)g, (void)p, (void)bytes, (void)on, 0; }
