/* Recursive doubling: in round k rank r exchanges everything it has with
 * rank r xor 2^k. allreduce exchanges whole vectors, allgather doubles the
 * gathered range, barrier (dissemination) sends tokens at distance 2^k.
 *
 * allreduce cost ⌈log2 p⌉(α + nβ + nγ); allgather ⌈log2 p⌉α + n(p-1)/p β.
 * Latency-optimal: auto picks it for small and medium n off-node.
 * Non-powers of two: the first 2·rem ranks pair up (even hands its data to
 * the odd one), the remaining 2^⌊log2 p⌋ run the rounds, and the odd ranks
 * hand the result back. Partners hold the same bits after every round,
 * because each op is commutative bit for bit. */
#include "../comm_internal.h"

#include <string.h>

typedef struct { int pof2, rem, newrank; } fold;

static fold fold_of(int p, int r) {
    fold f;
    f.pof2 = 1;
    while (f.pof2 * 2 <= p) f.pof2 *= 2;
    f.rem = p - f.pof2;
    if (r < 2 * f.rem) f.newrank = (r % 2) ? r / 2 : -1;
    else f.newrank = r - f.rem;
    return f;
}

static int old_rank(const fold *f, int nr) { return nr < f->rem ? 2 * nr + 1 : nr + f->rem; }

static dt_status rd_allreduce(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es;
    uint8_t *buf = a->recvbuf;
    if (a->sendbuf != a->recvbuf) memcpy(buf, a->sendbuf, bytes);
    uint8_t *tmp = dt_comm_work(c, 1, bytes);
    if (!tmp && bytes) return dt_error(DT_ERR_NOMEM, "recursive doubling: no memory");
    fold f = fold_of(p, r);
    dt_status st;
    if (r < 2 * f.rem) {
        if (r % 2 == 0) st = dt_p2p_exchange(c, r + 1, buf, bytes, -1, NULL, 0, a->dtype, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r - 1, buf, bytes, a->dtype, a->op);
        if (st) return st;
    }
    if (f.newrank >= 0) {
        for (int m = 1; m < f.pof2; m <<= 1) {
            int peer = old_rank(&f, f.newrank ^ m);
            if ((st = dt_p2p_exchange(c, peer, buf, bytes, peer, tmp, bytes, a->dtype, -1))) return st;
            /* a op b == b op a bit for bit for every op, so both partners agree */
            dt_reduce_into(buf, tmp, a->count, a->dtype, a->op);
        }
        dt_reduce_finish(buf, a->count, a->dtype, a->op, p);
    }
    if (r < 2 * f.rem) {
        if (r % 2) st = dt_p2p_exchange(c, r - 1, buf, bytes, -1, NULL, 0, a->dtype, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r + 1, buf, bytes, a->dtype, -1);
        if (st) return st;
    }
    return DT_OK;
}

/* First original-rank block held by new rank nr (blocks of a fold pair are adjacent). */
static int first_block(const fold *f, int nr) { return nr < f->rem ? 2 * nr : nr + f->rem; }

static dt_status rd_allgather(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    size_t B = a->count * dt_dtype_size(a->dtype);
    uint8_t *buf = a->recvbuf;
    memmove(buf + (size_t)r * B, a->sendbuf, B);
    fold f = fold_of(p, r);
    dt_status st;
    if (r < 2 * f.rem) {
        if (r % 2 == 0) st = dt_p2p_exchange(c, r + 1, buf + (size_t)r * B, B, -1, NULL, 0, DT_F32, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r - 1, buf + (size_t)(r - 1) * B, B, DT_F32, -1);
        if (st) return st;
    }
    if (f.newrank >= 0) {
        for (int m = 1; m < f.pof2; m <<= 1) {
            int base = f.newrank & ~(m - 1), pbase = base ^ m;
            int lo = first_block(&f, base), hi = base + m < f.pof2 ? first_block(&f, base + m) : p;
            int plo = first_block(&f, pbase), phi = pbase + m < f.pof2 ? first_block(&f, pbase + m) : p;
            int peer = old_rank(&f, f.newrank ^ m);
            st = dt_p2p_exchange(c, peer, buf + (size_t)lo * B, (size_t)(hi - lo) * B,
                                 peer, buf + (size_t)plo * B, (size_t)(phi - plo) * B, DT_F32, -1);
            if (st) return st;
        }
    }
    if (r < 2 * f.rem) {
        if (r % 2) st = dt_p2p_exchange(c, r - 1, buf, (size_t)p * B, -1, NULL, 0, DT_F32, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r + 1, buf, (size_t)p * B, DT_F32, -1);
        if (st) return st;
    }
    return DT_OK;
}

static dt_status dissemination_barrier(dt_comm *c) {
    int p = c->size, r = c->rank;
    uint8_t out = 1, in = 0;
    for (int d = 1; d < p; d <<= 1) {
        dt_status st = dt_p2p_exchange(c, (r + d) % p, &out, 1, (r - d + p) % p, &in, 1, DT_F32, -1);
        if (st) return st;
    }
    return DT_OK;
}

dt_status dt_rd_run(dt_comm *c, const coll_args *a) {
    switch (a->coll) {
    case DT_COLL_ALLREDUCE: return rd_allreduce(c, a);
    case DT_COLL_ALLGATHER: return rd_allgather(c, a);
    case DT_COLL_BARRIER: return dissemination_barrier(c);
    default: return dt_error(DT_ERR_UNSUPPORTED, "recursive doubling does not implement %s", dt_coll_name(a->coll));
    }
}
