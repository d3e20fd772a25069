/* Dropout whose mask is a function of where a value is, not of a generator's state (a counter-based draw, as
 * Philox is in cuRAND): value f of row i is kept iff the (f+1)-th draw of splitmix64's stream from the row's key is at
 * least p's share of 2^64. Whoever knows a value's row key and global column draws the same mask: a rank holding a
 * slice of the columns, a forward recomputed in backward, backward regenerating the mask it needs (nothing is kept),
 * one process or any layout of the same global batch. */
#include "dtrain/kernels.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t dt_dropout_row_key(uint64_t key, uint32_t a, uint32_t b) { return mix64(key ^ mix64(((uint64_t)a << 32) | b)); }

/* The smallest draw kept: p of the 2^64 draws are below it (p in [0, 1)). */
static uint64_t threshold(float p) { return p <= 0 ? 0 : (uint64_t)ldexp((double)p, 64); }

void dt_dropout(float *out, int ldo, const float *x, int ldx, int rows, int cols, const uint64_t *row_key, uint64_t col0, float p, bool add) {
    uint64_t lo = threshold(p);
    float scale = (float)(1.0 / (1.0 - (double)p)); /* torch's: the kept values divided by 1 - p, as one factor */
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *oi = out + (size_t)i * ldo;
        uint64_t s = row_key[i] + col0 * 0x9e3779b97f4a7c15ull;
        for (int f = 0; f < cols; f++) {
            s += 0x9e3779b97f4a7c15ull;
            float v = mix64(s) >= lo ? xi[f] * scale : 0.0f;
            oi[f] = add ? oi[f] + v : v;
        }
    }
}
