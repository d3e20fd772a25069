/* Bruck allgather: in round k rank r sends the blocks it has gathered so far
 * (at most 2^k) to r - 2^k and receives as many from r + 2^k; a final local
 * rotation puts block j at position j.
 *
 * cost ⌈log2 p⌉α + n(p-1)/p β for any p, powers of two or not: auto picks it
 * for small allgathers off-node when p is not a power of two. */
#include "../comm_internal.h"

#include <string.h>

dt_status dt_bruck_run(dt_comm *c, const coll_args *a) {
    if (a->coll != DT_COLL_ALLGATHER)
        return dt_error(DT_ERR_UNSUPPORTED, "bruck does not implement %s", dt_coll_name(a->coll));
    int p = c->size, r = c->rank;
    size_t B = a->count * dt_dtype_size(a->dtype);
    /* work[i] holds the block of rank (r + i) mod p. */
    uint8_t *work = dt_comm_work(c, 0, B * (size_t)p);
    if (!work && B) return dt_error(DT_ERR_NOMEM, "bruck: no memory");
    if (B) memcpy(work, a->sendbuf, B);
    for (int d = 1; d < p; d <<= 1) {
        int n = d < p - d ? d : p - d;
        dt_status st = dt_p2p_exchange(c, (r - d + p) % p, work, (size_t)n * B,
                                       (r + d) % p, work + (size_t)d * B, (size_t)n * B, DT_F32, -1);
        if (st) return st;
    }
    for (int i = 0; i < p; i++) memcpy((uint8_t *)a->recvbuf + (size_t)((r + i) % p) * B, work + (size_t)i * B, B);
    return DT_OK;
}
