/* Token and position embeddings. */
#include "dtrain/kernels.h"

void dt_embedding_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C) {
    dt_embedding_forward_at(out, tok, wte, wpe, NULL, B, T, C);
}

void dt_embedding_forward_at(float *out, const int32_t *tok, const float *wte, const float *wpe, const int32_t *pos, int B, int T,
                             int C) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)tok[b * T + t] * C, *pe = wpe + (size_t)(pos ? pos[t] : t) * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        }
}

void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C) {
    dt_embedding_backward_at(dwte, dwpe, dout, tok, NULL, B, T, C);
}

void dt_embedding_backward_at(float *dwte, float *dwpe, const float *dout, const int32_t *tok, const int32_t *pos, int B, int T,
                              int C) {
    /* Serial: two positions may carry the same token. Either table may be
     * NULL (data parallelism adds wte's rows itself, after its allreduce). */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            if (dwte) {
                float *we = dwte + (size_t)tok[b * T + t] * C;
                for (int c = 0; c < C; c++) we[c] += d[c];
            }
            if (dwpe) {
                float *pe = dwpe + (size_t)(pos ? pos[t] : t) * C;
                for (int c = 0; c < C; c++) pe[c] += d[c];
            }
        }
}

void dt_embedding_rows_forward(float *out, const int32_t *tok, const float *wte, int v0, int rows, int BT, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        float *o = out + (size_t)i * C;
        int r = tok[i] - v0;
        if (r < 0 || r >= rows) { for (int c = 0; c < C; c++) o[c] = 0.0f; continue; }
        const float *we = wte + (size_t)r * C;
        for (int c = 0; c < C; c++) o[c] = we[c];
    }
}

void dt_embedding_rows_backward(float *dwte, const float *dout, const int32_t *tok, int v0, int rows, int BT, int C) {
    /* serial, in position order, as dt_embedding_backward adds them */
    for (int i = 0; i < BT; i++) {
        int r = tok[i] - v0;
        if (r < 0 || r >= rows) continue;
        const float *d = dout + (size_t)i * C;
        float *we = dwte + (size_t)r * C;
        for (int c = 0; c < C; c++) we[c] += d[c];
    }
}
