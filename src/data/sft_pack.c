/* Packing fine-tuning data (--pack; TRL's SFTTrainer with packing=True): the examples binned best-fit decreasing into
 * rows of T, each from position 0, as TRL's pack_dataset ("bfd") bins them. */
#include "sft_internal.h"
#include "dtrain/kernels.h"

#include <stdlib.h>

/* Best-fit decreasing, as TRL's pack_dataset (strategy "bfd") bins them: the examples (cut at T tokens) longest first
 * (ties in file order), each into the bin whose room is the least that holds it (of bins with equal room, the one that
 * came to it first), else a new bin. bin[k] gets each example's bin; returns the bins' count. */
static size_t best_fit(const dt_sft *d, const size_t *order, size_t *bin, int *room_of) {
    int T = d->T;
    size_t nbins = 0, *head = calloc((size_t)T + 1, sizeof *head), *next = malloc(d->nrows * sizeof *next), *tail = calloc((size_t)T + 1, sizeof *tail);
    if (!head || !next || !tail) { free(head), free(next), free(tail); return 0; }
    /* room r's bins in the order they came to it: a list through next[], head and tail 1-based (0: none) */
    for (size_t k = 0; k < d->nrows; k++) {
        size_t e = order[k], b = 0;
        int L = d->len[e] < T ? d->len[e] : T, r = L;
        while (r < T && !head[r]) r++;
        if (r < T) { b = head[r] - 1; head[r] = next[b]; if (!head[r]) tail[r] = 0; }
        else { b = nbins++; room_of[b] = T; }
        bin[e] = b, room_of[b] -= L;
        int left = room_of[b];
        if (left > 0) {
            next[b] = 0;
            if (tail[left]) next[tail[left] - 1] = b + 1; else head[left] = b + 1;
            tail[left] = b + 1;
        }
    }
    free(head), free(next), free(tail);
    return nbins;
}

static int longer_first(const void *a, const void *b, void *lens) {
    const int *len = lens;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return len[x] != len[y] ? (len[x] < len[y] ? 1 : -1) : (x > y) - (x < y);
}

dt_status dt_sft_pack(dt_sft *d) {
    if (d->pairs == 1) return dt_error(DT_ERR_ARG, "%s: preference pairs are not packed (a pair is its two rows)", d->path);
    if (d->pos) return DT_OK;
    size_t n = d->nrows, T = (size_t)d->T, *order = malloc(n * sizeof *order), *bin = malloc(n * sizeof *bin), *fill = NULL;
    int *room = malloc(n * sizeof *room);
    int32_t *in = NULL, *tg = NULL, *pos = NULL;
    size_t *sc = NULL, nb = 0;
    if (order && bin && room) {
        for (size_t k = 0; k < n; k++) order[k] = k;
        qsort_r(order, n, sizeof *order, longer_first, d->len);
        nb = best_fit(d, order, bin, room);
    }
    if (nb) in = malloc(nb * T * sizeof *in), tg = malloc(nb * T * sizeof *tg), pos = malloc(nb * T * sizeof *pos),
            sc = calloc(nb, sizeof *sc), fill = calloc(nb, sizeof *fill);
    if (!in || !tg || !pos || !sc || !fill) {
        free(order), free(bin), free(room), free(in), free(tg), free(pos), free(sc), free(fill);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory packing %zu examples", d->path, n);
    }
    /* each bin's examples in the order they came (TRL's), each from position 0; its last token predicts nothing */
    for (size_t k = 0; k < n; k++) {
        size_t e = order[k], b = bin[e], o = fill[b];
        size_t L = (size_t)d->len[e] < T ? (size_t)d->len[e] : T;
        for (size_t t = 0; t < L; t++) {
            in[b * T + o + t] = d->inputs[e * T + t], pos[b * T + o + t] = (int32_t)t;
            tg[b * T + o + t] = t + 1 < L ? d->targets[e * T + t] : DT_IGNORE_INDEX;
            sc[b] += tg[b * T + o + t] >= 0;
        }
        fill[b] = o + L;
    }
    for (size_t b = 0; b < nb; b++) /* the padding: a document of its own, never scored */
        for (size_t t = fill[b]; t < T; t++) in[b * T + t] = 0, tg[b * T + t] = DT_IGNORE_INDEX, pos[b * T + t] = (int32_t)(t - fill[b]);
    free(d->inputs), free(d->targets), free(d->scored);
    d->inputs = in, d->targets = tg, d->pos = pos, d->scored = sc, d->nrows = nb, d->cap = nb;
    for (size_t b = 0; b < nb; b++) d->len[b] = (int)fill[b];
    free(order), free(bin), free(room), free(fill);
    return DT_OK;
}

bool dt_sft_packed(const dt_sft *d) { return d->pos != NULL; }
void dt_sft_row_positions(const dt_sft *d, size_t row, int32_t *pos) {
    for (int t = 0; t < d->T; t++) pos[t] = d->pos ? d->pos[row * (size_t)d->T + t] : t;
}

