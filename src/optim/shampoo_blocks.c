/* Shampoo's blocks (shampoo.h): distributed_shampoo's merge_small_dims (target order 1) and multi_dim_split, and the
 * assignment of blocks to ranks. */
#include "shampoo_blocks.h"

#include "dtrain/kfac.h"
#include "dtrain/shampoo.h"

#include <stdlib.h>

/* Dimensions of size 1 dropped; from the last, each merged into the one after it while the product stays within
 * block and more than one dimension would be left. */
int dt_shampoo_merge(int ndim, const int *shape, int block, int *out) {
    int sq[4], n = 0;
    for (int i = ndim - 1; i >= 0 && n < 4; i--)
        if (shape[i] != 1) sq[n++] = shape[i];
    if (!n) sq[n++] = 1;
    long m[4] = { sq[0] };
    int k = 1;
    for (int i = 1; i < n; i++) {
        int remaining = n - i;
        if (k + remaining > 1 && m[k - 1] * sq[i] <= block) m[k - 1] *= sq[i];
        else m[k++] = sq[i];
    }
    for (int i = 0; i < k; i++) out[i] = (int)m[k - 1 - i];
    return k;
}

/* The blocks of tensor t, merged to md[0..k), cut every `block` along each dimension, the first dimension slowest. */
static void tensor_blocks(const dt_tensor_info *t, int ti, const int *md, int k, int block, sh_block *b, int *n) {
    size_t ms[4];
    int chunks[4], total = 1;
    for (int i = k - 1; i >= 0; i--) {
        ms[i] = i == k - 1 ? 1 : ms[i + 1] * (size_t)md[i + 1];
        chunks[i] = (md[i] + block - 1) / block;
        total *= chunks[i];
    }
    for (int c = 0; c < total; c++) {
        sh_block *x = &b[(*n)++];
        *x = (sh_block){ .tensor = ti, .index = c, .of = total, .ndim = k, .base = t->offset, .numel = 1 };
        int rest = c;
        double cube = 0, side = 0;
        for (int i = k - 1; i >= 0; i--) {
            int at = rest % chunks[i] * block;
            rest /= chunks[i];
            x->dim[i] = md[i] - at < block ? md[i] - at : block;
            x->stride[i] = ms[i];
            x->base += (size_t)at * ms[i];
            x->numel *= (size_t)x->dim[i];
            cube += (double)x->dim[i] * x->dim[i] * x->dim[i];
            side += x->dim[i];
        }
        x->cost = cube + (double)x->numel * side;
    }
}

/* Tensor t as Shampoo sees it: itself, or a mixture's stacked experts ([E, rows, cols]) each its own matrix, as Hugging
 * Face's separate Linears are (piece e of *pieces). */
static dt_tensor_info piece(const dt_tensor_info *t, int e, int *pieces) {
    dt_tensor_info x = *t;
    *pieces = 1;
    if (!t->stacked || t->ndim != 3) return x;
    *pieces = t->shape[0];
    x.ndim = 2, x.shape[0] = t->shape[1], x.shape[1] = t->shape[2], x.shape[2] = 0;
    x.count = (size_t)x.shape[0] * (size_t)x.shape[1];
    x.offset = t->offset + (size_t)e * x.count;
    return x;
}

int sh_blocks_make(const dt_tensor_info *t, int ntensors, int block, sh_block **out, int *n) {
    size_t cap = 0;
    int md[4], pieces;
    for (int i = 0; i < ntensors; i++) {
        if (!t[i].count || t[i].tied_copy) continue;
        dt_tensor_info x = piece(&t[i], 0, &pieces);
        int k = dt_shampoo_merge(x.ndim, x.shape, block, md);
        size_t c = (size_t)pieces;
        for (int j = 0; j < k; j++) c *= (size_t)(md[j] + block - 1) / (size_t)block;
        cap += c;
    }
    *n = 0;
    if (!(*out = calloc(cap + 1, sizeof **out))) return -1;
    for (int i = 0; i < ntensors; i++) {
        if (!t[i].count || t[i].tied_copy) continue;
        piece(&t[i], 0, &pieces);
        bool own = pieces > 1 && t[i].shape[0] != t[i].gshape[0]; /* expert parallelism: this rank's experts of all */
        for (int e = 0, first = *n; e < pieces; e++) {
            dt_tensor_info x = piece(&t[i], e, &pieces);
            int k = dt_shampoo_merge(x.ndim, x.shape, block, md), at = *n;
            tensor_blocks(&x, i, md, k, block, *out, n);
            for (int j = at; j < *n; j++) { /* numbered among the tensor's */
                sh_block *y = &(*out)[j];
                y->index = j - first, y->of = (*n - at) * pieces, y->own = own;
            }
        }
    }
    return 0;
}

size_t sh_blocks_assign(sh_block *b, int n, int ranks, size_t *counts, size_t *own) {
    double *cost = calloc((size_t)n + 1, sizeof *cost);
    int *owner = calloc((size_t)n + 1, sizeof *owner), *shared = calloc((size_t)n + 1, sizeof *shared), k = 0;
    for (int i = 0; i < n && shared; i++)
        if (!b[i].own) shared[k++] = i;
    if (cost && owner && shared) {
        for (int j = 0; j < k; j++) cost[j] = b[shared[j]].cost;
        dt_kfac_assign(cost, k, ranks, 1, owner); /* KAISA's greedy: largest first, to the least loaded rank */
    } else {
        for (int j = 0; j < k && owner; j++) owner[j] = j % ranks; /* out of memory for two small arrays: still a spread */
    }
    for (int i = 0, j = 0; i < n; i++) b[i].owner = b[i].own ? -1 : owner && shared ? owner[j++] : i % ranks;
    free(cost), free(owner), free(shared);
    size_t share = 0;
    for (int r = 0; r < ranks; r++) {
        counts[r] = 0;
        for (int i = 0; i < n; i++)
            if (b[i].owner == r) b[i].at = counts[r], counts[r] += b[i].numel;
        share = counts[r] > share ? counts[r] : share;
    }
    for (int i = 0; i < n; i++) /* every rank's share as large as the largest: one allgather of equal blocks, no repacking */
        if (!b[i].own) b[i].at += (size_t)b[i].owner * share;
    *own = 0;
    for (int i = 0; i < n; i++)
        if (b[i].own) b[i].at = *own, *own += b[i].numel;
    return share;
}

/* The block padded in front to order 4 (size 1, stride 0), then four loops; strided_from: from the store into x. */
static void block_copy(const sh_block *b, const float *from, float *to, int strided_from) {
    int d[4] = { 1, 1, 1, 1 };
    size_t s[4] = { 0, 0, 0, 0 };
    for (int i = 0; i < b->ndim; i++) d[4 - b->ndim + i] = b->dim[i], s[4 - b->ndim + i] = b->stride[i];
    size_t k = 0;
    for (int i0 = 0; i0 < d[0]; i0++)
        for (int i1 = 0; i1 < d[1]; i1++)
            for (int i2 = 0; i2 < d[2]; i2++) {
                size_t row = b->base + i0 * s[0] + i1 * s[1] + i2 * s[2];
                for (int i3 = 0; i3 < d[3]; i3++, k++) {
                    if (strided_from) to[k] = from[row + i3 * s[3]];
                    else to[row + i3 * s[3]] = from[k];
                }
            }
}

void sh_block_gather(const sh_block *b, const float *store, float *x) { block_copy(b, store, x, 1); }
void sh_block_scatter(const sh_block *b, const float *x, float *store) { block_copy(b, x, store, 0); }
