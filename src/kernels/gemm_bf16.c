/* A bf16 GEMM with f32 accumulation where the CPU multiplies bf16
 * (AVX512-BF16's vdpbf16ps): oneDNN's matmul primitive (Debian's
 * libdnnl-dev). OpenBLAS 0.3.21 has no sbgemm; on this project's Zen 4
 * machines oneDNN's bf16 matmul runs at about twice OpenBLAS's sgemm rate on
 * one core (210 against 102 GFLOP/s at 1024 x 768 x 3072), which is what a
 * bf16 step can gain. Elsewhere (no avx512_bf16, a build without oneDNN,
 * DTRAIN_BF16_GEMM=0) dt_gemm_bf16_ready says no and the callers widen the
 * weights into f32 sgemm, which computes the same products (a bf16 value is
 * an f32) summed in another order.
 *
 * A primitive is made once per shape and kept (a small table): making one
 * costs tens of microseconds, a step calls a few hundred GEMMs of a few
 * dozen shapes. Not thread-safe: one model calls it from one thread. */
#include "dtrain/kernels.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef DT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

enum { SHAPES = 128 };

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc, acc;
    dnnl_memory_desc_t a, b, c;
    dnnl_primitive_t prim;
} shape;

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static shape shapes[SHAPES];
static int nshapes, next_evict;
static int ready = -1;

static void md(dnnl_memory_desc_t *d, int rows, int cols, int ld, int trans, dnnl_data_type_t t) {
    /* op(X) is rows x cols; X itself is stored row-major with leading dimension ld */
    dnnl_dims_t dims = { rows, cols }, strides = { trans ? 1 : ld, trans ? ld : 1 };
    dnnl_memory_desc_init_by_strides(d, 2, dims, t, strides);
}

static shape *find(int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc, int acc) {
    for (int i = 0; i < nshapes; i++) {
        shape *s = &shapes[i];
        if (s->ta == ta && s->tb == tb && s->M == M && s->N == N && s->K == K && s->lda == lda && s->ldb == ldb && s->ldc == ldc &&
            s->acc == acc)
            return s;
    }
    shape *s = nshapes < SHAPES ? &shapes[nshapes++] : &shapes[next_evict++ % SHAPES];
    if (s->prim) dnnl_primitive_destroy(s->prim);
    memset(s, 0, sizeof *s);
    md(&s->a, M, K, lda, ta, dnnl_bf16);
    md(&s->b, K, N, ldb, tb, dnnl_bf16);
    md(&s->c, M, N, ldc, 0, dnnl_f32);
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_matmul_desc_init(&d, &s->a, &s->b, NULL, &s->c) == dnnl_success && dnnl_primitive_attr_create(&attr) == dnnl_success;
    /* C += A B: the sum post-op adds what C held */
    if (ok && acc) ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
                        dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok) ok = dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL) == dnnl_success;
    if (ok) ok = dnnl_primitive_create(&s->prim, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) {
        s->prim = NULL;
        nshapes--; /* (an evicted slot stays empty: the next miss takes it again) */
        return NULL;
    }
    s->ta = ta, s->tb = tb, s->M = M, s->N = N, s->K = K, s->lda = lda, s->ldb = ldb, s->ldc = ldc, s->acc = acc;
    return s;
}

int dt_gemm_bf16(int ta, int tb, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc, float *C,
                 int ldc) {
    if (!dt_gemm_bf16_ready() || M <= 0 || N <= 0 || K <= 0) return 0;
    shape *s = find(ta, tb, M, N, K, lda, ldb, ldc, acc);
    if (!s) return 0;
    dnnl_memory_t a = NULL, b = NULL, c = NULL;
    int ok = dnnl_memory_create(&a, &s->a, engine, (void *)A) == dnnl_success &&
             dnnl_memory_create(&b, &s->b, engine, (void *)B) == dnnl_success &&
             dnnl_memory_create(&c, &s->c, engine, C) == dnnl_success;
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, a }, { DNNL_ARG_WEIGHTS, b }, { DNNL_ARG_DST, c } };
    if (ok) ok = dnnl_primitive_execute(s->prim, stream, 3, args) == dnnl_success && dnnl_stream_wait(stream) == dnnl_success;
    if (a) dnnl_memory_destroy(a);
    if (b) dnnl_memory_destroy(b);
    if (c) dnnl_memory_destroy(c);
    return ok;
}

/* The packed copies (bf16 of f32 values that bf16 holds: activations, output gradients), one buffer per slot, kept */
static uint16_t *packed[3];
static size_t packed_cap[3];

uint16_t *dt_gemm_bf16_pack(int slot, const float *x, size_t need) {
    if (slot < 0 || slot > 2) return NULL;
    if (need > packed_cap[slot]) {
        free(packed[slot]);
        packed_cap[slot] = (packed[slot] = malloc(need * sizeof(uint16_t))) ? need : 0;
        if (!packed[slot]) return NULL;
    }
    dt_lp_pack(packed[slot], x, need, DT_BF16);
    return packed[slot];
}

static void release(void) {
    for (int i = 0; i < 3; i++) {
        free(packed[i]);
        packed[i] = NULL;
        packed_cap[i] = 0;
    }
    for (int i = 0; i < nshapes; i++)
        if (shapes[i].prim) dnnl_primitive_destroy(shapes[i].prim);
    nshapes = 0;
    if (stream) dnnl_stream_destroy(stream);
    if (engine) dnnl_engine_destroy(engine);
    stream = NULL;
    engine = NULL;
}

int dt_gemm_bf16_wanted(void) {
    static _Atomic int wanted = -1;
    if (wanted < 0) {
        const char *e = getenv("DTRAIN_BF16_GEMM");
        wanted = dt_cpu_has("avx512_bf16") && !(e && !strcmp(e, "0"));
    }
    return wanted;
}

int dt_gemm_bf16_ready(void) {
    if (ready >= 0) return ready;
    ready = dt_gemm_bf16_wanted() && dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
            dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success;
    if (ready) atexit(release);
    return ready;
}

int dt_gemm_bf16_built(void) { return 1; }

void dt_gemm_bf16_enable(int on) {
    if (!on) ready = 0;
    else if (ready == 0 && engine) ready = 1;
    else if (ready == 0) ready = -1;
}
#else
int dt_gemm_bf16(int ta, int tb, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc, float *C,
                 int ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)acc, (void)C, (void)ldc;
    return 0;
}
int dt_gemm_bf16_ready(void) { return 0; }
int dt_gemm_bf16_built(void) { return 0; }
int dt_gemm_bf16_wanted(void) { return 0; }
uint16_t *dt_gemm_bf16_pack(int slot, const float *x, size_t n) {
    (void)slot, (void)x, (void)n;
    return NULL;
}
void dt_gemm_bf16_enable(int on) { (void)on; }
#endif
