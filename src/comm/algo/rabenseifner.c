/* Rabenseifner allreduce: reduce-scatter by recursive halving, then
 * allgather by recursive doubling.
 *
 * cost 2⌈log2 p⌉α + 2n(p-1)/p β + n(p-1)/p γ: ring's bandwidth with log p
 * latency, so auto picks it for medium-to-large n off-node. Non-powers of
 * two fold as in recursive doubling. Each block is reduced once, at its
 * owner, then copied: every rank holds the same bits. */
#include "../comm_internal.h"

#include <string.h>

dt_status dt_rabenseifner_run(dt_comm *c, const coll_args *a) {
    if (a->coll != DT_COLL_ALLREDUCE)
        return dt_error(DT_ERR_UNSUPPORTED, "rabenseifner does not implement %s", dt_coll_name(a->coll));
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype), n = a->count, bytes = n * es;
    uint8_t *buf = a->recvbuf;
    if (a->sendbuf != a->recvbuf) memcpy(buf, a->sendbuf, bytes);
    int pof2 = 1;
    while (pof2 * 2 <= p) pof2 *= 2;
    int rem = p - pof2, nr = r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem;
    dt_status st;
    if (r < 2 * rem) {
        if (r % 2 == 0) st = dt_p2p_exchange(c, r + 1, buf, bytes, -1, NULL, 0, a->dtype, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r - 1, buf, bytes, a->dtype, a->op);
        if (st) return st;
    }
    if (nr >= 0) {
        uint8_t *tmp = dt_comm_work(c, 1, bytes);
        if (!tmp) return dt_error(DT_ERR_NOMEM, "rabenseifner: no memory");
        /* Blocks are indexed by new rank; [lo,hi) is the range still mine. */
        int lo = 0, hi = pof2;
        for (int m = pof2 / 2; m >= 1; m >>= 1) {
            int pnr = nr ^ m, peer = pnr < rem ? 2 * pnr + 1 : pnr + rem;
            int mid = lo + m;
            int klo = nr & m ? mid : lo, khi = nr & m ? hi : mid; /* kept */
            int slo = nr & m ? lo : mid, shi = nr & m ? mid : hi; /* sent */
            size_t k0 = dt_block_start(n, pof2, klo), k1 = dt_block_start(n, pof2, khi);
            size_t s0 = dt_block_start(n, pof2, slo), s1 = dt_block_start(n, pof2, shi);
            st = dt_p2p_exchange(c, peer, buf + s0 * es, (s1 - s0) * es, peer, tmp, (k1 - k0) * es, a->dtype, -1);
            if (st) return st;
            dt_reduce_into(buf + k0 * es, tmp, k1 - k0, a->dtype, a->op);
            lo = klo;
            hi = khi;
        }
        size_t o0 = dt_block_start(n, pof2, nr);
        dt_reduce_finish(buf + o0 * es, dt_block_count(n, pof2, nr), a->dtype, a->op, p);
        for (int m = 1; m < pof2; m <<= 1) {
            int pnr = nr ^ m, peer = pnr < rem ? 2 * pnr + 1 : pnr + rem;
            int base = nr & ~(m - 1), pbase = base ^ m;
            size_t m0 = dt_block_start(n, pof2, base), m1 = dt_block_start(n, pof2, base + m);
            size_t p0 = dt_block_start(n, pof2, pbase), p1 = dt_block_start(n, pof2, pbase + m);
            st = dt_p2p_exchange(c, peer, buf + m0 * es, (m1 - m0) * es, peer, buf + p0 * es, (p1 - p0) * es, a->dtype, -1);
            if (st) return st;
        }
    }
    if (r < 2 * rem) {
        if (r % 2) st = dt_p2p_exchange(c, r - 1, buf, bytes, -1, NULL, 0, a->dtype, -1);
        else st = dt_p2p_exchange(c, -1, NULL, 0, r + 1, buf, bytes, a->dtype, -1);
        if (st) return st;
    }
    return DT_OK;
}
