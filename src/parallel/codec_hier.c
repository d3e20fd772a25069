/* Top-k's hierarchical exchange (DGC's own advice for a cluster: dense inside a machine, sparse between machines):
 * the bucket is summed inside each machine by a reduce-scatter over shared memory, local rank j getting slice j of the
 * machine's sum; j adds its residual to its slice and sends the slice's top k (k = the density's share of the slice)
 * to the ranks holding slice j on the other machines (an allgather); each sums the machines' pairs in machine order
 * and divides by all the ranks; an allgather inside the machine gives every rank every slice.
 *
 * Error feedback is the machine's: a local rank's residual holds what its slice of the machine's sum left unsent, so
 * sent + residual = the machine's sum + the old residual, entry by entry of the slice. Between machines a rank sends
 * k / l pairs of a bucket where the allgather sends k (l ranks a machine), and receives (machines - 1) of those: the
 * slow link carries l times less, the fast one the dense sum. Bytes and ratio in the metrics count the pairs between
 * machines. DGC's momentum is each rank's own: not summed inside a machine here (refused). */
#include "codec_sparse.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { NODE_SUM, PAIRS, NODE_GATHER };

struct dt_sparse_hier {
    int phase;
    int l, j, q, P;       /* ranks a machine, this rank's slice, machines, all ranks */
    size_t blk, lo, hi, kk; /* a slice's entries (the bucket padded to l of them), this rank's [lo, hi), its pairs */
    float *buf, *slice;   /* the bucket packed (l x blk), this rank's slice of the machine's sum, then of the average */
    uint64_t *all;        /* every machine's pairs for this slice */
};

/* The fewest and the most ranks of comm a machine holds (collective). */
static dt_status local_sizes(dt_comm *comm, int *fewest, int *most) {
    int32_t v[2] = { dt_comm_local_size(comm), -dt_comm_local_size(comm) };
    dt_status st = dt_comm_allreduce(comm, v, v, 2, DT_I32, DT_MIN);
    *fewest = v[0], *most = -v[1];
    return st;
}

dt_status dt_sparse_hier_fits(dt_comm *comm, int *fits) {
    int lo, hi;
    dt_status st = local_sizes(comm, &lo, &hi);
    *fits = !st && lo == hi && dt_comm_nodes(comm) > 1;
    return st;
}

dt_status dt_sparse_groups_make(dt_comm *comm, dt_sparse_groups *gr) {
    if (gr->made) return DT_OK;
    int lo, hi;
    dt_status st = local_sizes(comm, &lo, &hi);
    if (!st && lo != hi)
        st = dt_error(DT_ERR_ARG, "--compress-exchange hier: the machines hold %d to %d ranks of the data-parallel group: it needs the "
                      "same count on each", lo, hi);
    if (!st) st = dt_comm_split(comm, dt_comm_node(comm), dt_comm_rank(comm), &gr->node);
    if (!st) st = dt_comm_split(comm, dt_comm_local_rank(comm), dt_comm_rank(comm), &gr->cross);
    gr->made = !st;
    return st;
}

void dt_sparse_groups_destroy(dt_sparse_groups *gr) {
    if (gr->node) dt_comm_destroy(gr->node);
    if (gr->cross) dt_comm_destroy(gr->cross);
    *gr = (dt_sparse_groups){ 0 };
}

size_t dt_sparse_hier_bytes(size_t len, size_t kmax, int l, int q) {
    size_t blk = l > 0 ? (len + (size_t)l - 1) / (size_t)l : len;
    return (blk * (size_t)l + 1 + blk + 1) * sizeof(float) + (kmax * (size_t)q + 1) * sizeof(uint64_t);
}

size_t dt_sparse_hier_held(const dt_sparse_hier *h, size_t len, size_t kmax) { return h ? dt_sparse_hier_bytes(len, kmax, h->l, h->q) : 0; }

static dt_status make(dt_sparse_groups *gr, dt_sparse_bucket *p) {
    dt_sparse_hier *h = calloc(1, sizeof *h);
    if (!(p->hier = h)) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    h->l = dt_comm_size(gr->node), h->j = dt_comm_rank(gr->node), h->q = dt_comm_size(gr->cross), h->P = h->l * h->q;
    h->blk = (p->len + (size_t)h->l - 1) / (size_t)h->l;
    h->lo = (size_t)h->j * h->blk < p->len ? (size_t)h->j * h->blk : p->len;
    h->hi = h->lo + h->blk < p->len ? h->lo + h->blk : p->len;
    h->buf = malloc(sizeof *h->buf * (h->blk * (size_t)h->l + 1));
    h->slice = malloc(sizeof *h->slice * (h->blk + 1));
    h->all = malloc(sizeof *h->all * (p->kmax * (size_t)h->q + 1));
    if (!h->buf || !h->slice || !h->all) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    return DT_OK;
}

dt_status dt_sparse_hier_start(dt_codec *k, dt_sparse_groups *gr, dt_sparse_bucket *p, float *g, dt_request **req) {
    dt_status st = p->hier ? DT_OK : make(gr, p);
    if (st) return st;
    dt_sparse_hier *h = p->hier;
    for (int i = 0; i < p->n; i++) memcpy(h->buf + p->at[i], g + k->t[p->t[i]].offset, k->t[p->t[i]].count * sizeof *g);
    memset(h->buf + p->len, 0, (h->blk * (size_t)h->l - p->len) * sizeof *h->buf);
    h->phase = NODE_SUM;
    return dt_comm_ireduce_scatter(gr->node, h->buf, h->slice, h->blk, DT_F32, DT_SUM, req);
}

/* The machine's sum of this rank's slice into the residual; its top k to the other machines. */
static dt_status send_pairs(dt_codec *k, dt_sparse_groups *gr, dt_sparse_bucket *p, dt_request **req) {
    dt_sparse_hier *h = p->hier;
    int ti = 0;
    for (size_t e = h->lo; e < h->hi; e++) {
        size_t j;
        dt_sparse_locate(p, e, &ti, &j);
        float *res = dt_codec_state_held(k, p->t[ti], DT_CODEC_RESIDUAL);
        res[j] = h->slice[e - h->lo] + res[j];
    }
    /* the density's share of the slice: the same on every machine (its slices are alike) */
    h->kk = h->hi > h->lo ? (size_t)ceil(dt_codec_density_at(&k->c, k->steps) * (double)(h->hi - h->lo)) : 0;
    if (h->kk > h->hi - h->lo) h->kk = h->hi - h->lo;
    dt_status st = dt_sparse_choose(k, p, h->lo, h->hi, h->kk);
    if (st) return st;
    k->now.after += 2 * h->kk;
    k->now.bytes += (double)h->kk * sizeof *p->pairs;
    k->now.received += (double)h->kk * sizeof *p->pairs * (double)(h->q - 1);
    h->phase = PAIRS;
    return dt_comm_iallgather(gr->cross, p->pairs, h->all, h->kk, DT_I64, req);
}

/* The machines' pairs summed in machine order, over all the ranks; the slices to every rank of the machine. */
static dt_status gather_slices(dt_sparse_groups *gr, dt_sparse_bucket *p, dt_request **req) {
    dt_sparse_hier *h = p->hier;
    memset(h->slice, 0, h->blk * sizeof *h->slice);
    for (int r = 0; r < h->q; r++)
        for (size_t m = 0; m < h->kk; m++) {
            uint64_t x = h->all[(size_t)r * h->kk + m];
            h->slice[(uint32_t)x - h->lo] += dt_sparse_value(x);
        }
    for (size_t e = 0; e < h->blk; e++) h->slice[e] /= (float)h->P;
    h->phase = NODE_GATHER;
    return dt_comm_iallgather(gr->node, h->slice, h->buf, h->blk, DT_F32, req);
}

dt_status dt_sparse_hier_next(dt_codec *k, dt_sparse_groups *gr, dt_sparse_bucket *p, float *g, dt_request **req, int *done) {
    dt_sparse_hier *h = p->hier;
    switch (h->phase) {
    case NODE_SUM: return send_pairs(k, gr, p, req);
    case PAIRS: return gather_slices(gr, p, req);
    default:
        for (int i = 0; i < p->n; i++) memcpy(g + k->t[p->t[i]].offset, h->buf + p->at[i], k->t[p->t[i]].count * sizeof *g);
        *done = 1;
        return DT_OK;
    }
}

int dt_sparse_hier_next_collective(const dt_sparse_bucket *p) { return p->hier->phase != NODE_GATHER; }

void dt_sparse_hier_destroy(dt_sparse_hier *h) {
    if (!h) return;
    free(h->buf), free(h->slice), free(h->all);
    free(h);
}
