/* Rotary position embedding (RoFormer; Llama's layout, as Hugging Face applies it): a head's d channels
 * are two halves, and channel i < d/2 turns with channel i + d/2 by the angle pos * inv_freq[i]:
 *   x'[i]       = x[i] cos - x[i + d/2] sin
 *   x'[i + d/2] = x[i + d/2] cos + x[i] sin
 * Backward is the same turn by the opposite angle (a rotation's transpose is its inverse). */
#include "dtrain/kernels.h"

#include <math.h>

void dt_rope_frequencies(float *inv_freq, int d, const dt_rope_config *c) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < d / 2; i++) {
        /* in f32, as the reference computes it: base ** (2i / d) */
        float f = 1.0f / powf(c->theta, (float)(2 * i) / (float)d);
        if (c->factor > 0) {
            /* Llama 3.1: long wavelengths slowed by factor, short ones kept, the band between blended */
            double wavelen = 2 * pi / f, low = c->original_max / c->low_freq_factor, high = c->original_max / c->high_freq_factor;
            if (wavelen > low) f = f / c->factor;
            else if (wavelen >= high) {
                float smooth = (float)((c->original_max / wavelen - c->low_freq_factor) / (c->high_freq_factor - c->low_freq_factor));
                f = (1 - smooth) * f / c->factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* Each row's heads (contiguous, d channels each; rows row_stride floats apart) turned by sign * the angle at
 * the row's position. */
static void turn(float *x, const float *inv_freq, const int32_t *pos, int rows, int heads, int d, size_t row_stride, float sign) {
    int h2 = d / 2;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float c[256], s[256]; /* d <= 512: checked where the model is built */
        for (int i = 0; i < h2; i++) {
            float a = (float)pos[r] * inv_freq[i];
            c[i] = cosf(a);
            s[i] = sign * sinf(a);
        }
        float *xr = x + (size_t)r * row_stride;
        for (int h = 0; h < heads; h++) {
            float *v = xr + (size_t)h * d;
            for (int i = 0; i < h2; i++) {
                float x0 = v[i], x1 = v[i + h2];
                v[i] = x0 * c[i] - x1 * s[i];
                v[i + h2] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

void dt_rope_forward(float *x, const float *inv_freq, const int32_t *pos, int rows, int heads, int d, size_t row_stride) {
    turn(x, inv_freq, pos, rows, heads, d, row_stride, 1.0f);
}

void dt_rope_backward(float *dx, const float *inv_freq, const int32_t *pos, int rows, int heads, int d, size_t row_stride) {
    turn(dx, inv_freq, pos, rows, heads, d, row_stride, -1.0f);
}
