/* BatchNorm over [N, C, HW] (torch.nn.BatchNorm2d), split where
 * synchronised BatchNorm reduces across ranks: forward takes per-channel
 * sums (summed over every rank's batch by the caller when synchronised)
 * before it normalises, and backward takes the sums of the output
 * gradient and of its product with the normalised input the same way.
 * Sums are in double, so sum-of-squares minus squared mean loses nothing
 * that matters at these counts. */
#include "dtrain/kernels.h"

#include <math.h>

void dt_batchnorm_sums(double *sum, double *sumsq, const float *inp, int N, int C, int HW) {
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                s += x[i];
                q += (double)x[i] * x[i];
            }
        }
        sum[c] = s;
        sumsq[c] = q;
    }
}

void dt_batchnorm_stats(float *mean, float *rstd, float *run_mean, float *run_var, const double *sum, const double *sumsq,
                        double count, int C, float momentum, float eps) {
    for (int c = 0; c < C; c++) {
        double m = sum[c] / count, v = sumsq[c] / count - m * m;
        if (v < 0) v = 0;
        mean[c] = (float)m;
        rstd[c] = (float)(1.0 / sqrt(v + eps));
        if (!run_mean) continue;
        /* torch: the running variance is the unbiased one */
        double unbiased = count > 1 ? v * count / (count - 1) : v;
        run_mean[c] = (float)((1 - momentum) * run_mean[c] + momentum * m);
        run_var[c] = (float)((1 - momentum) * run_var[c] + momentum * unbiased);
    }
}

void dt_batchnorm_eval_stats(float *mean, float *rstd, const float *run_mean, const float *run_var, int C, float eps) {
    for (int c = 0; c < C; c++) {
        mean[c] = run_mean[c];
        rstd[c] = 1.0f / sqrtf(run_var[c] + eps);
    }
}

void dt_batchnorm_forward(float *out, const float *inp, const float *mean, const float *rstd, const float *w, const float *b,
                          int N, int C, int HW) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            size_t at = ((size_t)n * C + c) * HW;
            float sc = rstd[c] * w[c], sh = b[c] - mean[c] * sc;
            #pragma omp simd
            for (int i = 0; i < HW; i++) out[at + i] = inp[at + i] * sc + sh;
        }
}

void dt_batchnorm_backward_sums(double *sdy, double *sdyx, const float *dout, const float *inp, const float *mean,
                                const float *rstd, int N, int C, int HW) {
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int n = 0; n < N; n++) {
            size_t at = ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                s += dout[at + i];
                q += (double)dout[at + i] * ((inp[at + i] - mean[c]) * rstd[c]);
            }
        }
        sdy[c] = s;
        sdyx[c] = q;
    }
}

void dt_batchnorm_backward(float *dinp, const float *dout, const float *inp, const float *mean, const float *rstd, const float *w,
                           const double *sdy, const double *sdyx, double count, int N, int C, int HW) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            size_t at = ((size_t)n * C + c) * HW;
            float k = rstd[c] * w[c], mdy = (float)(sdy[c] / count), mdyx = (float)(sdyx[c] / count);
            for (int i = 0; i < HW; i++) {
                float xh = (inp[at + i] - mean[c]) * rstd[c];
                dinp[at + i] += k * (dout[at + i] - mdy - xh * mdyx);
            }
        }
}
