/* Expert parallelism inside the mixture-of-experts op: each rank of the expert-parallel group holds E/P of the E
 * experts (rank r: [r E/P, (r+1) E/P)), routes its own tokens over all E, and sends each routed row to the rank
 * holding its expert; that rank runs the rows of all the group's ranks through its experts and sends the outputs back
 * (GShard's dispatch and combine, Megatron's and DeepSpeed's placement).
 *
 * The rows leave sorted by expert, so rank d's are one block; every rank first learns every rank's count for every
 * expert (an allgather of E ints), so no rank waits on a shape another did not send, and each knows where each
 * arriving row goes: rank s's block holds its rows for this rank's first expert, then the next; the owner groups them
 * by expert (rank 0's rows first) and runs one GEMM an expert and projection. Forward keeps what backward reads on
 * the owner: the rows, their routing weights (sent beside them, one float a row) and their gate|up products.
 * Backward sends each row's d(output) the same way; the owner gives back d(input) and d(weight) (that float again).
 *
 * What arrives varies by step (dropless): the kept rows and the buffers grow to the largest step seen. */
#include "program_internal.h"

#include <stdlib.h>
#include <string.h>

struct moe_ep_keep {
    float *xs, *w, *hu;    /* the rows routed here, grouped by this rank's experts; their weights; their gate|up */
    int32_t *from;         /* [s * E + e]: rank s's rows for expert e (every rank's counts, from the allgather) */
    size_t cap;            /* rows the three hold room for */
    int n;
};

struct moe_ep_work {
    float *send, *recv;    /* rows of up to C + 1 floats */
    float *act, *ys, *g, *dhu, *dw;
    int32_t *perm, *ident; /* where arriving row q goes among the grouped rows; 0, 1, .. (the grouped rows' own order) */
    size_t *rows, *got;    /* rows to each rank, from each rank */
    int32_t *mine;         /* this rank's rows for each expert (what the counts' allgather sends) */
    size_t io_cap, n_cap;
};

static bool grow(void **b, size_t need, size_t size) {
    void *q = realloc(*b, need * size);
    if (q) *b = q;
    return q != NULL;
}

static dt_status fail(dt_program *p, dt_status st) {
    if (!p->comm_err) p->comm_err = st;
    return st;
}

/* The buffers whose sizes the model fixes (a count a rank, a count an expert), made once. */
static struct moe_ep_work *work_of(dt_program *p) {
    struct moe_ep_work *w = p->ep_work;
    if (w) return w;
    int P = p->part.ep_size, E = p->cfg.experts;
    if (!(w = calloc(1, sizeof *w)) || !grow((void **)&w->rows, (size_t)P, sizeof(size_t)) || !grow((void **)&w->got, (size_t)P, sizeof(size_t)) ||
        !grow((void **)&w->mine, (size_t)E, sizeof(int32_t))) {
        if (w) free(w->rows), free(w->got), free(w->mine), free(w);
        fail(p, dt_error(DT_ERR_NOMEM, "expert parallelism: out of memory"));
        return NULL;
    }
    return p->ep_work = w;
}

/* Room for io rows crossing (either way) and n grouped rows. */
static dt_status reserve(dt_program *p, size_t io, size_t n, int C, int F) {
    struct moe_ep_work *w = p->ep_work;
    bool ok = true;
    if (io > w->io_cap)
        ok = grow((void **)&w->send, io * (size_t)(C + 1), sizeof(float)) && grow((void **)&w->recv, io * (size_t)(C + 1), sizeof(float)),
        w->io_cap = ok ? io : 0;
    if (ok && n > w->n_cap) {
        ok = grow((void **)&w->act, n * (size_t)F, sizeof(float)) && grow((void **)&w->ys, n * (size_t)C, sizeof(float)) &&
             grow((void **)&w->g, n * (size_t)F, sizeof(float)) && grow((void **)&w->dhu, n * 2 * (size_t)F, sizeof(float)) &&
             grow((void **)&w->dw, n, sizeof(float)) && grow((void **)&w->perm, n, sizeof(int32_t)) && grow((void **)&w->ident, n, sizeof(int32_t));
        for (size_t i = 0; ok && i < n; i++) w->ident[i] = (int32_t)i;
        w->n_cap = ok ? n : 0;
    }
    return ok ? DT_OK : fail(p, dt_error(DT_ERR_NOMEM, "expert parallelism: out of memory for %zu routed rows", io > n ? io : n));
}

static struct moe_ep_keep *keep_of(dt_program *p, int l) {
    program_slot *s = p->s;
    if (!s->ep_keep && (s->ep_keep = calloc((size_t)(p->nl > 0 ? p->nl : 1), sizeof *s->ep_keep))) s->ep_nkeep = p->nl > 0 ? p->nl : 1;
    return s->ep_keep ? &s->ep_keep[p->bk[l]] : NULL;
}

/* The grouped rows' layout from every rank's counts: lstart[j] this rank's expert j's first row; perm[q] where
 * arriving row q (rank by rank, each rank's expert by expert) goes; back[s] rows that came from rank s. Returns n. */
static int layout(const dt_program *p, const struct moe_ep_keep *k, int E, int32_t *lstart, int32_t *perm, size_t *back) {
    /* (perm and back NULL: the counts alone) */
    int P = p->part.ep_size, El = E / P, e0 = p->part.ep_rank * El, q = 0;
    lstart[0] = 0;
    for (int j = 0; j < El; j++) {
        lstart[j + 1] = lstart[j];
        for (int s = 0; s < P; s++) lstart[j + 1] += k->from[(size_t)s * E + e0 + j];
    }
    for (int s = 0; back && s < P; s++) {
        back[s] = 0;
        for (int j = 0; j < El; j++) {
            int before = 0, c = k->from[(size_t)s * E + e0 + j];
            for (int t = 0; t < s; t++) before += k->from[(size_t)t * E + e0 + j];
            for (int i = 0; perm && i < c; i++) perm[q++] = lstart[j] + before + i;
            back[s] += (size_t)c;
        }
    }
    return lstart[El];
}

/* Rows to each rank: the experts it holds, a block of the sorted rows. */
static void rows_to(const dt_program *p, const int32_t *start, int E, size_t *rows) {
    int P = p->part.ep_size, El = E / P;
    for (int d = 0; d < P; d++) rows[d] = (size_t)(start[(d + 1) * El] - start[d * El]);
}

static double sent_bytes(const dt_program *p, const size_t *rows, size_t row) {
    double b = 0;
    for (int d = 0; d < p->part.ep_size; d++) b += d == p->part.ep_rank ? 0 : (double)rows[d] * (double)row * sizeof(float);
    return b;
}

/* The exchange, with the bytes it sends to other ranks counted. */
static dt_status exchange(dt_program *p, const size_t *rows, size_t row) {
    struct moe_ep_work *w = p->ep_work;
    p->ep_bytes += sent_bytes(p, rows, row);
    dt_status st = p->part.ep->exchange(p->part.ep->ctx, w->send, rows, w->recv, w->io_cap, w->got, row);
    return st ? fail(p, st) : DT_OK;
}

/* Every rank's counts, kept, and room for the rows they make. */
static dt_status learn_counts(dt_program *p, struct moe_ep_keep *k, const moe_ep_block *b, int32_t *lstart, int *n) {
    int P = p->part.ep_size, E = b->E;
    struct moe_ep_work *w = work_of(p);
    if (!w) return p->comm_err;
    if (!k || (!k->from && !(k->from = malloc(sizeof *k->from * (size_t)P * E))))
        return fail(p, dt_error(DT_ERR_NOMEM, "expert parallelism: out of memory"));
    for (int e = 0; e < E; e++) w->mine[e] = b->start[e + 1] - b->start[e];
    dt_status st = p->part.ep->counts(p->part.ep->ctx, w->mine, k->from, (size_t)E);
    if (st) return fail(p, st);
    *n = layout(p, k, E, lstart, NULL, NULL);
    if ((size_t)*n > k->cap) {
        size_t c = (size_t)*n;
        if (!grow((void **)&k->xs, c * (size_t)b->C, sizeof(float)) || !grow((void **)&k->w, c, sizeof(float)) ||
            !grow((void **)&k->hu, c * 2 * (size_t)b->F, sizeof(float)))
            return fail(p, dt_error(DT_ERR_NOMEM, "expert parallelism: out of memory for %d routed rows", *n));
        k->cap = c;
    }
    k->n = *n;
    return reserve(p, (size_t)(b->rows > *n ? b->rows : *n), (size_t)*n, b->C, b->F);
}

void dt_program_moe_ep_forward(dt_program *p, const moe_ep_block *b, const float *xs, const float *w, float *ys) {
    int C = b->C, El = b->E / p->part.ep_size, n = 0;
    int32_t lstart[DT_MOE_MAX_EXPERTS + 1];
    struct moe_ep_keep *k = keep_of(p, b->l);
    memset(ys, 0, (size_t)b->rows * C * sizeof(float));
    if (p->comm_err || learn_counts(p, k, b, lstart, &n)) return;
    struct moe_ep_work *wk = p->ep_work;
    for (int r = 0; r < b->rows; r++) {
        memcpy(wk->send + (size_t)r * (C + 1), xs + (size_t)r * C, (size_t)C * sizeof(float));
        wk->send[(size_t)r * (C + 1) + C] = w[b->order[r]];
    }
    rows_to(p, b->start, b->E, wk->rows);
    if (exchange(p, wk->rows, (size_t)C + 1)) return;
    layout(p, k, b->E, lstart, wk->perm, wk->rows);
    for (int q = 0; q < n; q++) {
        memcpy(k->xs + (size_t)wk->perm[q] * C, wk->recv + (size_t)q * (C + 1), (size_t)C * sizeof(float));
        k->w[wk->perm[q]] = wk->recv[(size_t)q * (C + 1) + C];
    }
    dt_moe_experts_forward(k->hu, wk->act, wk->ys, k->xs, lstart, b->wg, b->wu, b->wd, El, C, b->F, p->prec);
    for (int q = 0; q < n; q++) memcpy(wk->send + (size_t)q * C, wk->ys + (size_t)wk->perm[q] * C, (size_t)C * sizeof(float));
    if (exchange(p, wk->rows, (size_t)C)) return; /* back to where they came from: wk->rows now counts those */
    memcpy(ys, wk->recv, (size_t)b->rows * C * sizeof(float));
}

void dt_program_moe_ep_backward(dt_program *p, const moe_ep_block *b, float *dys, float *dw) {
    int C = b->C, F = b->F, El = b->E / p->part.ep_size;
    int32_t lstart[DT_MOE_MAX_EXPERTS + 1];
    struct moe_ep_keep *k = keep_of(p, b->l);
    if (p->comm_err || !k || !k->from) {
        memset(dys, 0, (size_t)b->rows * C * sizeof(float));
        return;
    }
    struct moe_ep_work *wk = p->ep_work;
    memcpy(wk->send, dys, (size_t)b->rows * C * sizeof(float));
    rows_to(p, b->start, b->E, wk->rows);
    dt_status st = exchange(p, wk->rows, (size_t)C);
    int n = layout(p, k, b->E, lstart, wk->perm, wk->rows);
    for (int q = 0; !st && q < n; q++) memcpy(wk->ys + (size_t)wk->perm[q] * C, wk->recv + (size_t)q * C, (size_t)C * sizeof(float));
    if (!st) {
        dt_moe_experts_backward(wk->ys, b->grads[0], b->grads[1], b->grads[2], wk->dw, wk->ys, wk->g, wk->dhu, k->xs, k->hu, wk->act, k->w,
                                wk->ident, lstart, b->wg, b->wu, b->wd, El, C, F, p->prec, dt_program_moe_use(p));
        for (int q = 0; q < n; q++) {
            memcpy(wk->send + (size_t)q * (C + 1), wk->ys + (size_t)wk->perm[q] * C, (size_t)C * sizeof(float));
            wk->send[(size_t)q * (C + 1) + C] = wk->dw[wk->perm[q]];
        }
        st = exchange(p, wk->rows, (size_t)C + 1);
    }
    for (int r = 0; r < b->rows; r++) { /* a failed exchange: nothing flows back (the pass runs on; its caller is told) */
        if (st) memset(dys + (size_t)r * C, 0, (size_t)C * sizeof(float));
        else memcpy(dys + (size_t)r * C, wk->recv + (size_t)r * (C + 1), (size_t)C * sizeof(float));
        dw[b->order[r]] = st ? 0 : wk->recv[(size_t)r * (C + 1) + C];
    }
}

void dt_program_moe_ep_free_keep(program_slot *s) {
    for (int i = 0; s->ep_keep && i < s->ep_nkeep; i++) {
        struct moe_ep_keep *k = &s->ep_keep[i];
        free(k->xs), free(k->w), free(k->hu), free(k->from);
    }
    free(s->ep_keep);
    s->ep_keep = NULL;
}

void dt_program_moe_ep_free_work(dt_program *p) {
    struct moe_ep_work *w = p->ep_work;
    if (!w) return;
    free(w->send), free(w->recv), free(w->act), free(w->ys), free(w->g), free(w->dhu), free(w->dw), free(w->perm), free(w->ident);
    free(w->rows), free(w->got), free(w->mine), free(w);
    p->ep_work = NULL;
}

/* What expert parallelism's buffers hold now: the exchanges' rows, the grouped rows' work and each held block's kept
 * rows (they grow to the most rows a step routed here; activations, in the run's memory figures). */
size_t dt_program_moe_ep_bytes(const dt_program *p) {
    const struct moe_ep_work *w = p->ep_work;
    size_t C = (size_t)p->cfg.channels, F = (size_t)p->cfg.ffn, E = (size_t)p->cfg.experts, P = (size_t)p->part.ep_size, n = 0;
    if (w) n += w->io_cap * (C + 1) * 2 * sizeof(float) + w->n_cap * ((4 * F + C + 1) * sizeof(float) + 2 * sizeof(int32_t));
    for (int k = 0; k < p->nslots; k++)
        for (int i = 0; p->slots[k].ep_keep && i < p->slots[k].ep_nkeep; i++) {
            const struct moe_ep_keep *x = &p->slots[k].ep_keep[i];
            n += x->cap * (C + 1 + 2 * F) * sizeof(float) + (x->from ? P * E * sizeof(int32_t) : 0);
        }
    return n;
}
