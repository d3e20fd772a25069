/* 2-D convolution (NCHW, weights [OC, C, KH, KW] as torch.nn.Conv2d, groups
 * 1) through im2col and sgemm, one image at a time: the image's receptive
 * fields are laid out as columns [C*KH*KW, OH*OW], and the output plane is
 * w [OC, C*KH*KW] @ columns. A 1x1 convolution with stride 1 and no padding
 * multiplies the image itself. Backward builds the columns again (cheaper
 * than keeping them for every image) for the weight gradient, then reuses
 * the buffer for the input gradient's columns and scatters them back. */
#include "dtrain/kernels.h"

#include <cblas.h>
#include <stdbool.h>
#include <string.h>

static bool direct(const dt_conv_shape *s) { return s->KH == 1 && s->KW == 1 && s->stride == 1 && s->pad == 0; }

dt_conv_shape dt_conv_make(int N, int C, int H, int W, int OC, int K, int stride, int pad) {
    dt_conv_shape s = { .N = N, .C = C, .H = H, .W = W, .OC = OC, .KH = K, .KW = K, .stride = stride, .pad = pad };
    s.OH = (H + 2 * pad - K) / stride + 1;
    s.OW = (W + 2 * pad - K) / stride + 1;
    return s;
}

size_t dt_conv2d_work_floats(const dt_conv_shape *s) {
    return direct(s) ? 0 : (size_t)s->C * s->KH * s->KW * s->OH * s->OW;
}

/* col[(c, kh, kw), (oh, ow)] = x[c, oh*stride - pad + kh, ow*stride - pad + kw], 0 outside. */
static void im2col(float *col, const float *x, const dt_conv_shape *s) {
    int K2 = s->KH * s->KW, P = s->OH * s->OW;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < s->C * K2; r++) {
        int c = r / K2, kh = r % K2 / s->KW, kw = r % s->KW;
        const float *plane = x + (size_t)c * s->H * s->W;
        float *row = col + (size_t)r * P;
        for (int oh = 0; oh < s->OH; oh++) {
            int ih = oh * s->stride - s->pad + kh;
            float *o = row + (size_t)oh * s->OW;
            if (ih < 0 || ih >= s->H) { memset(o, 0, sizeof(float) * (size_t)s->OW); continue; }
            const float *in = plane + (size_t)ih * s->W;
            for (int ow = 0; ow < s->OW; ow++) {
                int iw = ow * s->stride - s->pad + kw;
                o[ow] = iw >= 0 && iw < s->W ? in[iw] : 0.0f;
            }
        }
    }
}

/* dx += the columns scattered back; channels in parallel (each writes only its own plane). */
static void col2im(float *dx, const float *col, const dt_conv_shape *s) {
    int K2 = s->KH * s->KW, P = s->OH * s->OW;
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < s->C; c++) {
        float *plane = dx + (size_t)c * s->H * s->W;
        for (int k = 0; k < K2; k++) {
            int kh = k / s->KW, kw = k % s->KW;
            const float *row = col + ((size_t)c * K2 + k) * P;
            for (int oh = 0; oh < s->OH; oh++) {
                int ih = oh * s->stride - s->pad + kh;
                if (ih < 0 || ih >= s->H) continue;
                float *out = plane + (size_t)ih * s->W;
                const float *g = row + (size_t)oh * s->OW;
                for (int ow = 0; ow < s->OW; ow++) {
                    int iw = ow * s->stride - s->pad + kw;
                    if (iw >= 0 && iw < s->W) out[iw] += g[ow];
                }
            }
        }
    }
}

void dt_conv2d_forward(float *out, const float *inp, const float *w, const float *bias, const dt_conv_shape *s, float *work) {
    int CK = s->C * s->KH * s->KW, P = s->OH * s->OW;
    for (int n = 0; n < s->N; n++) {
        const float *x = inp + (size_t)n * s->C * s->H * s->W;
        float *y = out + (size_t)n * s->OC * P;
        if (bias)
            for (int o = 0; o < s->OC; o++)
                for (int p = 0; p < P; p++) y[(size_t)o * P + p] = bias[o];
        const float *col = x;
        if (!direct(s)) {
            im2col(work, x, s);
            col = work;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->OC, P, CK, 1.0f, w, CK, col, P, bias ? 1.0f : 0.0f, y, P);
    }
}

void dt_conv2d_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        const dt_conv_shape *s, float *work) {
    int CK = s->C * s->KH * s->KW, P = s->OH * s->OW;
    for (int n = 0; n < s->N; n++) {
        const float *x = inp + (size_t)n * s->C * s->H * s->W, *dy = dout + (size_t)n * s->OC * P;
        float *dx = dinp ? dinp + (size_t)n * s->C * s->H * s->W : NULL;
        if (dbias)
            for (int o = 0; o < s->OC; o++) {
                float acc = 0;
                const float *row = dy + (size_t)o * P;
                #pragma omp simd reduction(+ : acc)
                for (int p = 0; p < P; p++) acc += row[p];
                dbias[o] += acc;
            }
        if (direct(s)) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, CK, P, 1.0f, dy, P, x, P, 1.0f, dw, CK);
            if (dx) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CK, P, s->OC, 1.0f, w, CK, dy, P, 1.0f, dx, P);
            continue;
        }
        im2col(work, x, s);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, CK, P, 1.0f, dy, P, work, P, 1.0f, dw, CK);
        if (!dx) continue;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CK, P, s->OC, 1.0f, w, CK, dy, P, 0.0f, work, P);
        col2im(dx, work, s);
    }
}
