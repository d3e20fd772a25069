/* Matrix multiply through BLAS (OpenBLAS by default, BLIS at configure time):
 * the linear layers' forward and backward. Row-major, weights stored as
 * [OC, C] like torch.nn.Linear. */
#include "dtrain/kernels.h"

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
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
