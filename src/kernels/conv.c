/* 2-D convolution (NCHW, weights [OC, C, KH, KW] as torch.nn.Conv2d, groups
 * 1) through im2col and sgemm, one image at a time: the image's receptive
 * fields are laid out as columns [C*KH*KW, OH*OW], and the output plane is
 * w [OC, C*KH*KW] @ columns. A 1x1 convolution with stride 1 and no padding
 * multiplies the image itself. Backward builds the columns again (cheaper
 * than keeping them for every image) for the weight gradient, then reuses
 * the buffer for the input gradient's columns and scatters them back.
 * With several threads and images, each thread takes whole images. */
#include "dtrain/kernels.h"

#include <cblas.h>
#include <stdbool.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static bool direct(const dt_conv_shape *s) { return s->KH == 1 && s->KW == 1 && s->stride == 1 && s->pad == 0; }

dt_conv_shape dt_conv_make(int N, int C, int H, int W, int OC, int K, int stride, int pad) {
    dt_conv_shape s = { .N = N, .C = C, .H = H, .W = W, .OC = OC, .KH = K, .KW = K, .stride = stride, .pad = pad };
    s.OH = (H + 2 * pad - K) / stride + 1;
    s.OW = (W + 2 * pad - K) / stride + 1;
    return s;
}

/* Threads that take whole images (each its own columns and, in backward,
 * its own weight gradient, summed in thread order at the end): as many as
 * there are images, up to the kernels' threads; with one, the images go
 * one by one and sgemm and the column loops use the threads. */
static int image_threads(const dt_conv_shape *s) {
    int nt = dt_kernels_threads();
    return nt < s->N ? nt : s->N;
}

static size_t cols_floats(const dt_conv_shape *s) { return direct(s) ? 0 : (size_t)s->C * s->KH * s->KW * s->OH * s->OW; }
static size_t grad_floats(const dt_conv_shape *s) { return (size_t)s->OC * s->C * s->KH * s->KW + (size_t)s->OC; }

size_t dt_conv2d_work_floats(const dt_conv_shape *s) {
    size_t nt = (size_t)(dt_kernels_threads() > 1 ? dt_kernels_threads() : 1);
    return nt * cols_floats(s) + (nt - 1) * grad_floats(s);
}

/* The output columns [ow0, ow1) whose input column ow*stride - pad + k is inside [0, W). */
static void valid_range(int k, int stride, int pad, int W, int OW, int *ow0, int *ow1) {
    int a = pad - k, lo = a > 0 ? (a + stride - 1) / stride : 0, hi = (W - 1 + pad - k) / stride + 1;
    if (W - 1 + pad - k < 0) hi = 0;
    *ow0 = lo < OW ? lo : OW;
    *ow1 = hi < OW ? hi : OW;
    if (*ow1 < *ow0) *ow1 = *ow0;
}

/* col[(c, kh, kw), (oh, ow)] = x[c, oh*stride - pad + kh, ow*stride - pad + kw], 0 outside. */
static void im2col(float *col, const float *x, const dt_conv_shape *s) {
    int K2 = s->KH * s->KW, P = s->OH * s->OW, st = s->stride;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < s->C * K2; r++) {
        int c = r / K2, kh = r % K2 / s->KW, kw = r % s->KW, ow0, ow1;
        valid_range(kw, st, s->pad, s->W, s->OW, &ow0, &ow1);
        const float *plane = x + (size_t)c * s->H * s->W;
        float *row = col + (size_t)r * P;
        for (int oh = 0; oh < s->OH; oh++) {
            int ih = oh * st - s->pad + kh;
            float *o = row + (size_t)oh * s->OW;
            if (ih < 0 || ih >= s->H) { memset(o, 0, sizeof(float) * (size_t)s->OW); continue; }
            const float *in = plane + (size_t)ih * s->W + kw - s->pad;
            for (int ow = 0; ow < ow0; ow++) o[ow] = 0.0f;
            if (st == 1) memcpy(o + ow0, in + ow0, sizeof(float) * (size_t)(ow1 - ow0));
            else for (int ow = ow0; ow < ow1; ow++) o[ow] = in[ow * st];
            for (int ow = ow1; ow < s->OW; ow++) o[ow] = 0.0f;
        }
    }
}

/* dx += the columns scattered back; channels in parallel (each writes only its own plane). */
static void col2im(float *dx, const float *col, const dt_conv_shape *s) {
    int K2 = s->KH * s->KW, P = s->OH * s->OW, st = s->stride;
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < s->C; c++) {
        float *plane = dx + (size_t)c * s->H * s->W;
        for (int k = 0; k < K2; k++) {
            int kh = k / s->KW, kw = k % s->KW, ow0, ow1;
            valid_range(kw, st, s->pad, s->W, s->OW, &ow0, &ow1);
            const float *row = col + ((size_t)c * K2 + k) * P;
            for (int oh = 0; oh < s->OH; oh++) {
                int ih = oh * st - s->pad + kh;
                if (ih < 0 || ih >= s->H) continue;
                float *out = plane + (size_t)ih * s->W + kw - s->pad;
                const float *g = row + (size_t)oh * s->OW;
                if (st == 1) {
                    #pragma omp simd
                    for (int ow = ow0; ow < ow1; ow++) out[ow] += g[ow];
                } else {
                    for (int ow = ow0; ow < ow1; ow++) out[ow * st] += g[ow];
                }
            }
        }
    }
}

const float *dt_conv2d_columns(const float *image, const dt_conv_shape *s, float *cols) {
    if (direct(s)) return image;
    im2col(cols, image, s);
    return cols;
}

static void forward_image(float *y, const float *x, const float *w, const float *bias, const dt_conv_shape *s, float *cols) {
    int CK = s->C * s->KH * s->KW, P = s->OH * s->OW;
    if (bias)
        for (int o = 0; o < s->OC; o++)
            for (int p = 0; p < P; p++) y[(size_t)o * P + p] = bias[o];
    const float *col = x;
    if (!direct(s)) {
        im2col(cols, x, s);
        col = cols;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->OC, P, CK, 1.0f, w, CK, col, P, bias ? 1.0f : 0.0f, y, P);
}

void dt_conv2d_forward(float *out, const float *inp, const float *w, const float *bias, const dt_conv_shape *s, float *work) {
    size_t in = (size_t)s->C * s->H * s->W, on = (size_t)s->OC * s->OH * s->OW;
    int nt = image_threads(s);
    if (nt <= 1) {
        for (int n = 0; n < s->N; n++) forward_image(out + n * on, inp + n * in, w, bias, s, work);
        return;
    }
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < s->N; n++) {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        forward_image(out + n * on, inp + n * in, w, bias, s, work + (size_t)t * cols_floats(s));
    }
}

/* One image's gradients: dw, db += its part; dx (if any) += its input gradient. */
static void backward_image(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, const dt_conv_shape *s,
                           float *cols) {
    int CK = s->C * s->KH * s->KW, P = s->OH * s->OW;
    if (db)
        for (int o = 0; o < s->OC; o++) {
            float acc = 0;
            const float *row = dy + (size_t)o * P;
            #pragma omp simd reduction(+ : acc)
            for (int p = 0; p < P; p++) acc += row[p];
            db[o] += acc;
        }
    if (direct(s)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, CK, P, 1.0f, dy, P, x, P, 1.0f, dw, CK);
        if (dx) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CK, P, s->OC, 1.0f, w, CK, dy, P, 1.0f, dx, P);
        return;
    }
    im2col(cols, x, s);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, CK, P, 1.0f, dy, P, cols, P, 1.0f, dw, CK);
    if (!dx) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CK, P, s->OC, 1.0f, w, CK, dy, P, 0.0f, cols, P);
    col2im(dx, cols, s);
}

void dt_conv2d_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        const dt_conv_shape *s, float *work) {
    size_t in = (size_t)s->C * s->H * s->W, on = (size_t)s->OC * s->OH * s->OW, nw = (size_t)s->OC * s->C * s->KH * s->KW;
    int nt = image_threads(s);
    if (nt <= 1) {
        for (int n = 0; n < s->N; n++) backward_image(dinp ? dinp + n * in : NULL, dw, dbias, dout + n * on, inp + n * in, w, s, work);
        return;
    }
    /* thread t > 0 sums its images' weight (and bias) gradients in its own
     * buffer after everyone's columns; thread 0 into dw itself */
    float *own = work + (size_t)nt * cols_floats(s);
    #pragma omp parallel num_threads(nt)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *gw = t ? own + (size_t)(t - 1) * grad_floats(s) : dw, *gb = t ? gw + nw : dbias;
        if (t) memset(gw, 0, grad_floats(s) * sizeof(float));
        #pragma omp for schedule(static)
        for (int n = 0; n < s->N; n++)
            backward_image(dinp ? dinp + n * in : NULL, gw, dbias ? gb : NULL, dout + n * on, inp + n * in, w, s,
                           work + (size_t)t * cols_floats(s));
    }
    for (int t = 1; t < nt; t++) {
        const float *gw = own + (size_t)(t - 1) * grad_floats(s);
        for (size_t i = 0; i < nw; i++) dw[i] += gw[i];
        for (int o = 0; dbias && o < s->OC; o++) dbias[o] += gw[nw + o];
    }
}
