/* Batches from a token file. Global batch i of a job with N ranks spans
 * tokens [i*N*B*T, (i+1)*N*B*T + 1); rank r takes its B*T (+1) slice of it,
 * as llm.c's loader does, so N ranks with batch B see what one rank with
 * batch N*B would. Batches wrap at the end of the file. Shuffled, the
 * global batches' order is drawn anew each pass; with rows shuffled, each
 * global batch is N*B sequences of T from anywhere in the file instead (a
 * permutation of the pass's rows computed where it is read, no table). */
#include "dtrain/data.h"

#include <stdlib.h>

struct dt_loader {
    const dt_tokens *t;
    const dt_sft *rows;          /* or an SFT file's rows (t NULL) */
    int B, T, rank, nranks;
    size_t nbatches, nrows, next, last_row;
    size_t *last;                /* the last batch's B rows (their places in the file) */
    uint64_t seed, epoch;
    bool rows_shuffled;
    size_t *order; /* shuffled batch order, NULL when in file order */
    size_t *later; /* rows, shuffled: a later epoch's order (later_epoch's), for the counts of a step that runs into it */
    uint64_t later_epoch;
};

dt_status dt_loader_create(const dt_tokens *t, int B, int T, int rank, int nranks, uint64_t seed, bool rows, dt_loader **out) {
    *out = NULL;
    size_t per = (size_t)B * T * (size_t)nranks;
    if (B < 1 || T < 1 || nranks < 1 || rank < 0 || rank >= nranks)
        return dt_error(DT_ERR_ARG, "loader: bad batch %d x %d for rank %d of %d", B, T, rank, nranks);
    if (dt_tokens_count(t) < per + 1)
        return dt_error(DT_ERR_ARG, "%s: %zu tokens are fewer than one global batch needs (%d ranks x %d x %d + 1 = %zu)",
                        dt_tokens_path(t), dt_tokens_count(t), nranks, B, T, per + 1);
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    *l = (dt_loader){ .t = t, .B = B, .T = T, .rank = rank, .nranks = nranks, .nbatches = (dt_tokens_count(t) - 1) / per,
                      .nrows = (dt_tokens_count(t) - 1) / (size_t)T, .seed = seed, .rows_shuffled = seed && rows };
    l->last = calloc((size_t)B, sizeof(size_t));
    if (seed && !rows) l->order = malloc(sizeof(size_t) * l->nbatches);
    if (!l->last || (seed && !rows && !l->order)) {
        dt_loader_destroy(l);
        return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    }
    dt_loader_reset(l);
    *out = l;
    return DT_OK;
}

dt_status dt_loader_create_rows(const dt_sft *d, int B, int rank, int nranks, uint64_t seed, dt_loader **out) {
    *out = NULL;
    size_t per = (size_t)B * (size_t)nranks;
    if (B < 1 || nranks < 1 || rank < 0 || rank >= nranks)
        return dt_error(DT_ERR_ARG, "loader: bad batch %d for rank %d of %d", B, rank, nranks);
    if (dt_sft_pairs(d) && B % 2)
        return dt_error(DT_ERR_ARG, "%s: preference pairs take an even --batch (%d): a pair is two rows, chosen and rejected", dt_sft_path(d), B);
    if (dt_sft_rows(d) < per)
        return dt_error(DT_ERR_ARG, "%s: %zu examples are fewer than one global batch needs (%d ranks x %d)", dt_sft_path(d), dt_sft_rows(d),
                        nranks, B);
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    *l = (dt_loader){ .rows = d, .B = B, .T = dt_sft_seq(d), .rank = rank, .nranks = nranks, .nbatches = dt_sft_rows(d) / per,
                      .nrows = dt_sft_rows(d), .seed = seed };
    l->last = calloc((size_t)B, sizeof(size_t));
    if (!l->last || (seed && (!(l->order = malloc(sizeof(size_t) * l->nbatches)) || !(l->later = malloc(sizeof(size_t) * l->nbatches))))) {
        dt_loader_destroy(l);
        return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    }
    dt_loader_reset(l);
    *out = l;
    return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
    if (!l) return;
    free(l->order);
    free(l->later);
    free(l->last);
    free(l);
}

/* Epoch's order of the batches into order[0..l->nbatches). */
static void shuffle_into(const dt_loader *l, size_t *order, uint64_t epoch) {
    uint64_t s = l->seed * 1000003u + epoch;
    for (size_t i = 0; i < l->nbatches; i++) order[i] = i;
    for (size_t i = l->nbatches; i > 1; i--) {
        size_t j = dt_rng_next(&s) % i, tmp = order[i - 1];
        order[i - 1] = order[j];
        order[j] = tmp;
    }
}

static void shuffle(dt_loader *l) { shuffle_into(l, l->order, l->epoch); }

void dt_loader_reset(dt_loader *l) {
    l->next = 0;
    l->epoch = 0;
    if (l->order) shuffle(l);
}

size_t dt_loader_batches(const dt_loader *l) { return l->nbatches; }

/* The global batch at place k from now (a step's batches may run past the end of an epoch into the next). */
static size_t batch_at(dt_loader *l, size_t k) {
    size_t at = l->next + k, i = at % l->nbatches;
    uint64_t epoch = l->epoch + at / l->nbatches;
    if (!l->order) return i;
    if (epoch == l->epoch) return l->order[i];
    if (l->later_epoch != epoch) shuffle_into(l, l->later, epoch), l->later_epoch = epoch;
    return l->later[i];
}

size_t dt_loader_scored(dt_loader *l, int n) {
    size_t per = (size_t)l->B * (size_t)l->nranks, total = 0;
    if (!l->rows) return (size_t)n * per * (size_t)l->T;
    for (int k = 0; k < n; k++) {
        size_t b = batch_at(l, (size_t)k);
        for (size_t r = 0; r < per; r++) total += dt_sft_scored(l->rows, b * per + r);
    }
    return total;
}

void dt_loader_next(dt_loader *l, int32_t *inputs, int32_t *targets) {
    if (l->next == l->nbatches) {
        l->next = 0;
        l->epoch++;
        if (l->order) shuffle(l);
    }
    size_t b = l->order ? l->order[l->next] : l->next, per = (size_t)l->B * (size_t)l->nranks;
    for (int i = 0; i < l->B; i++) { /* this rank's B of the global batch's rows */
        size_t j = (size_t)l->rank * (size_t)l->B + (size_t)i;
        l->last[i] = l->rows_shuffled ? (size_t)dt_rng_permute(l->next * per + j, l->nrows, l->seed * 1000003u + l->epoch) : b * per + j;
    }
    l->next++;
    l->last_row = l->last[0];
    for (int i = 0; i < l->B; i++) {
        int32_t *in = inputs + (size_t)i * l->T, *tg = targets + (size_t)i * l->T;
        if (l->rows) {
            dt_sft_row(l->rows, l->last[i], in, tg);
            continue;
        }
        size_t start = l->last[i] * (size_t)l->T;
        for (int k = 0; k < l->T; k++) {
            in[k] = (int32_t)dt_tokens_get(l->t, start + (size_t)k);
            tg[k] = (int32_t)dt_tokens_get(l->t, start + (size_t)k + 1);
        }
    }
}

size_t dt_loader_last_row(const dt_loader *l) { return l->last_row; }

void dt_loader_row_keys(const dt_loader *l, uint64_t seed, uint64_t *keys) {
    uint64_t per_epoch = (uint64_t)l->nbatches * (uint64_t)l->B * (uint64_t)l->nranks;
    for (int i = 0; i < l->B; i++) {
        uint64_t s = seed ^ ((l->epoch * per_epoch + l->last[i]) * 0xd1b54a32d192ed03ull);
        keys[i] = dt_rng_next(&s);
    }
}
const dt_sft *dt_loader_rows(const dt_loader *l) { return l->rows; }

void dt_loader_positions(const dt_loader *l, int32_t *pos) {
    for (int i = 0; i < l->B; i++) {
        if (l->rows) dt_sft_row_positions(l->rows, l->last_row + (size_t)i, pos + (size_t)i * l->T);
        else for (int t = 0; t < l->T; t++) pos[(size_t)i * l->T + t] = t;
    }
}

void dt_loader_position(const dt_loader *l, uint64_t *epoch, size_t *next) {
    *epoch = l->epoch;
    *next = l->next;
}

dt_status dt_loader_seek(dt_loader *l, uint64_t epoch, size_t next) {
    if (next > l->nbatches)
        return dt_error(DT_ERR_ARG, "%s: batch %zu of an epoch of %zu batches", l->rows ? dt_sft_path(l->rows) : dt_tokens_path(l->t), next,
                        l->nbatches);
    l->epoch = epoch;
    l->next = next;
    if (l->order) shuffle(l);
    return DT_OK;
}
