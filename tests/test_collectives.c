/* Every collective x every algorithm that implements it x every dtype x
 * every op, counts 0, 1, primes and large (crossing channel chunks and
 * staging chunks), private and arena buffers, against a sequential
 * reduction computed locally. Run under `dtrain launch -n N` for N = 1..8.
 *
 * Inputs are small integers, so every correct reduction order gives exactly
 * the same bits and the comparison can be exact. A second part checks that
 * random floats give bit-identical results on every rank and every run. */
#include "dtrain/comm.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef DT_HAVE_MPI
#include <mpi.h>
#endif

static int passed, failed;
static dt_comm *world;

#define FAIL(...) do { failed++; fprintf(stderr, "rank %d: FAIL ", dt_comm_rank(world)); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } while (0)

static double value(int rank, size_t i, dt_op op) {
    if (op == DT_PROD) return (double)(1 + ((rank + i) % 3 == 0));      /* 1 or 2: products stay exact */
    return (double)((int)((rank * 7 + i * 3) % 11) - 5);               /* -5..5 */
}

static void put(void *b, size_t i, dt_dtype t, double v) {
    switch (t) {
    case DT_F32: ((float *)b)[i] = (float)v; break;
    case DT_F64: ((double *)b)[i] = v; break;
    case DT_BF16: ((uint16_t *)b)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)b)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    default: break;
    }
}

static double get(const void *b, size_t i, dt_dtype t) {
    switch (t) {
    case DT_F32: return ((const float *)b)[i];
    case DT_F64: return ((const double *)b)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)b)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)b)[i]);
    case DT_I32: return ((const int32_t *)b)[i];
    case DT_I64: return (double)((const int64_t *)b)[i];
    default: return NAN;
    }
}

/* The sequential reference, rounded the way the dtype stores it. */
static double expect_reduced(int p, size_t i, dt_dtype t, dt_op op) {
    double acc = value(0, i, op);
    for (int r = 1; r < p; r++) {
        double v = value(r, i, op);
        acc = op == DT_MAX ? fmax(acc, v) : op == DT_MIN ? fmin(acc, v) : op == DT_PROD ? acc * v : acc + v;
    }
    if (op == DT_AVG) {
        if (t == DT_I32 || t == DT_I64) acc = (double)((long long)acc / p);
        else if (t == DT_F64) acc = acc / p;
        else acc = (double)((float)acc / (float)p);
    }
    if (t == DT_BF16) acc = dt_bf16_to_f32(dt_f32_to_bf16((float)acc));
    if (t == DT_F16) acc = dt_f16_to_f32(dt_f32_to_f16((float)acc));
    return acc;
}

typedef struct { void *p; int arena; } buf;

static buf make(size_t bytes, int arena) {
    buf b = { NULL, arena };
    if (arena) { if (dt_comm_alloc(world, bytes + 64, &b.p)) b.p = NULL; }
    else b.p = malloc(bytes + 64);
    if (b.p) memset(b.p, 0xAB, bytes + 64);
    return b;
}
static void drop(buf b) { if (b.arena) dt_comm_free(world, b.p); else free(b.p); }

static const char *tag(dt_coll c, dt_algo a, dt_dtype t, dt_op op, size_t n, int arena, int root) {
    static char s[200];
    snprintf(s, sizeof s, "%s algo=%s %s %s count=%zu %s root=%d p=%d", dt_coll_name(c), dt_algo_name(a), dt_dtype_name(t),
             dt_op_name(op), n, arena ? "arena" : "private", root, dt_comm_size(world));
    return s;
}

/* One collective call, checked. */
static void check_one(dt_coll coll, dt_algo algo, dt_dtype t, dt_op op, size_t n, int arena, int root) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    size_t es = dt_dtype_size(t);
    size_t sn = n, rn = n;
    if (coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_SCATTER || coll == DT_COLL_ALLTOALL) sn = n * (size_t)p;
    if (coll == DT_COLL_ALLGATHER || coll == DT_COLL_GATHER || coll == DT_COLL_ALLTOALL) rn = n * (size_t)p;
    buf s = make(sn * es, arena), d = make(rn * es, arena);
    if (!s.p || !d.p) { FAIL("out of memory for %s", tag(coll, algo, t, op, n, arena, root)); return; }
    for (size_t i = 0; i < sn; i++) put(s.p, i, t, value(r, i, op));
    if (coll == DT_COLL_BROADCAST)
        for (size_t i = 0; i < rn; i++) put(d.p, i, t, r == root ? value(root, i, op) : 99);
    if (dt_comm_set_algo(world, coll, algo)) { FAIL("%s: set_algo: %s", tag(coll, algo, t, op, n, arena, root), dt_last_error()); return; }
    dt_status st;
    switch (coll) {
    case DT_COLL_ALLREDUCE: st = dt_comm_allreduce(world, s.p, d.p, n, t, op); break;
    case DT_COLL_REDUCE_SCATTER: st = dt_comm_reduce_scatter(world, s.p, d.p, n, t, op); break;
    case DT_COLL_ALLGATHER: st = dt_comm_allgather(world, s.p, d.p, n, t); break;
    case DT_COLL_BROADCAST: st = dt_comm_broadcast(world, d.p, n, t, root); break;
    case DT_COLL_REDUCE: st = dt_comm_reduce(world, s.p, d.p, n, t, op, root); break;
    case DT_COLL_ALLTOALL: st = dt_comm_alltoall(world, s.p, d.p, n, t); break;
    case DT_COLL_GATHER: st = dt_comm_gather(world, s.p, d.p, n, t, root); break;
    case DT_COLL_SCATTER: st = dt_comm_scatter(world, s.p, d.p, n, t, root); break;
    default: st = dt_comm_barrier(world); break;
    }
    if (st) {
        FAIL("%s: %s", tag(coll, algo, t, op, n, arena, root), dt_last_error());
        fprintf(stderr, "cannot continue after a failed collective\n");
        exit(1);
    }
    bool check = !((coll == DT_COLL_REDUCE || coll == DT_COLL_GATHER) && r != root);
    size_t bad = SIZE_MAX;
    double want = 0, got = 0;
    for (size_t i = 0; check && i < rn && bad == SIZE_MAX; i++) {
        switch (coll) {
        case DT_COLL_ALLREDUCE: case DT_COLL_REDUCE: want = expect_reduced(p, i, t, op); break;
        case DT_COLL_REDUCE_SCATTER: want = expect_reduced(p, (size_t)r * n + i, t, op); break;
        case DT_COLL_BROADCAST: want = value(root, i, op); break;
        case DT_COLL_ALLGATHER: case DT_COLL_GATHER: want = value((int)(i / n), i % n, op); break;
        case DT_COLL_ALLTOALL: want = value((int)(i / n), (size_t)r * n + i % n, op); break;
        case DT_COLL_SCATTER: want = value(root, (size_t)r * n + i, op); break;
        default: break;
        }
        got = get(d.p, i, t);
        if (got != want) bad = i;
    }
    /* Nothing may be written past the end of the output. */
    if (check && bad == SIZE_MAX && ((unsigned char *)d.p)[rn * es] != 0xAB) { bad = rn; got = -1; want = 0xAB; }
    if (bad != SIZE_MAX) FAIL("%s: element %zu is %g, expected %g", tag(coll, algo, t, op, n, arena, root), bad, got, want);
    else passed++;
    drop(s);
    drop(d);
}

static const dt_coll colls[] = { DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER, DT_COLL_BROADCAST,
                                 DT_COLL_REDUCE, DT_COLL_ALLTOALL, DT_COLL_GATHER, DT_COLL_SCATTER, DT_COLL_BARRIER };

/* The algorithms each collective must offer, written here rather than asked
 * of the library: an algorithm that set_algo stops accepting is a failure,
 * not a quiet skip. shm_direct needs every rank on one machine; hier several
 * machines with the same number of ranks on each, more than one (with one it
 * would be plain MPI). Only on the world: split communicators have no hier. */
#define A(x) (1u << DT_ALGO_##x)
static const unsigned offered[DT_COLL_COUNT] = {
    [DT_COLL_ALLREDUCE] = A(SHM_DIRECT) | A(RING) | A(TREE) | A(RD) | A(RABENSEIFNER) | A(HIER),
    [DT_COLL_REDUCE_SCATTER] = A(SHM_DIRECT) | A(RING) | A(PAIRWISE),
    [DT_COLL_ALLGATHER] = A(SHM_DIRECT) | A(RING) | A(RD) | A(BRUCK),
    [DT_COLL_BROADCAST] = A(SHM_DIRECT) | A(TREE),
    [DT_COLL_REDUCE] = A(SHM_DIRECT) | A(TREE),
    [DT_COLL_ALLTOALL] = A(SHM_DIRECT) | A(PAIRWISE),
    [DT_COLL_GATHER] = A(SHM_DIRECT) | A(TREE) | A(PAIRWISE),
    [DT_COLL_SCATTER] = A(SHM_DIRECT) | A(TREE) | A(PAIRWISE),
    [DT_COLL_BARRIER] = A(SHM_DIRECT) | A(TREE) | A(RD),
};
#undef A

static bool implements(dt_algo a, dt_coll c) {
    int p = dt_comm_size(world), nodes = dt_comm_nodes(world), local = dt_comm_local_size(world);
    bool want = offered[c] & (1u << a);
    if (a == DT_ALGO_SHM_DIRECT && p > 1 && local != p) want = false;
    if (a == DT_ALGO_HIER && !(nodes > 1 && p % nodes == 0 && local == p / nodes && local > 1)) want = false;
    dt_status st = dt_comm_set_algo(world, c, a);
    dt_comm_set_algo(world, c, DT_ALGO_AUTO);
    if (want && st) FAIL("%s must offer %s, but set_algo refuses it: %s", dt_coll_name(c), dt_algo_name(a), dt_last_error());
    if (!want && !st) FAIL("%s accepts %s, which this test's table does not list (add it, and its checks)", dt_coll_name(c), dt_algo_name(a));
    return want && !st;
}

static void matrix(void) {
    int p = dt_comm_size(world);
    const size_t small[] = { 0, 1, 2, 7, 13, 97, 1021 };
    for (size_t ci = 0; ci < sizeof colls / sizeof colls[0]; ci++) {
        dt_coll c = colls[ci];
        bool reduces = c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE || c == DT_COLL_REDUCE_SCATTER;
        bool rooted = c == DT_COLL_BROADCAST || c == DT_COLL_REDUCE || c == DT_COLL_GATHER || c == DT_COLL_SCATTER;
        for (int a = DT_ALGO_SHM_DIRECT; a < DT_ALGO_COUNT; a++) {
            if (!implements((dt_algo)a, c)) continue;
            if (c == DT_COLL_BARRIER) { check_one(c, (dt_algo)a, DT_F32, DT_SUM, 0, 0, 0); continue; }
            for (int t = 0; t < DT_DTYPE_COUNT; t++)
                for (int op = 0; op < (reduces ? DT_OP_COUNT : 1); op++)
                    for (size_t k = 0; k < sizeof small / sizeof small[0]; k++)
                        for (int arena = 0; arena < 2; arena++)
                            check_one(c, (dt_algo)a, (dt_dtype)t, (dt_op)op, small[k], arena, rooted ? (int)((k + 1) % p) : 0);
            /* Large: past the 64 KiB channel chunks and the 256 KiB staging chunks. */
            size_t big = c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE || c == DT_COLL_BROADCAST ? (9u << 20) / 8 + 3 : (5u << 20) / 4 / (size_t)p + 5;
            for (int arena = 0; arena < 2; arena++) {
                check_one(c, (dt_algo)a, DT_F32, DT_SUM, big, arena, rooted ? p - 1 : 0);
                if (reduces) check_one(c, (dt_algo)a, DT_BF16, DT_AVG, big / 3, arena, 0);
            }
            /* Past the 8 MiB streaming threshold, odd count: unaligned heads and tails. */
            if (a == DT_ALGO_SHM_DIRECT && (c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE)) {
                check_one(c, (dt_algo)a, DT_F32, DT_SUM, (8u << 20) / 4 + 5, 1, p - 1);
                check_one(c, (dt_algo)a, DT_F64, DT_MAX, (8u << 20) / 8 + 3, 1, 0);
                check_one(c, (dt_algo)a, DT_F32, DT_AVG, (8u << 20) / 4 + 5, 1, 0); /* DDP's gradients */
            }
        }
    }
    for (int k = 0; k < DT_COLL_COUNT; k++) dt_comm_set_algo(world, (dt_coll)k, DT_ALGO_AUTO);
}

/* Two ranks' bf16 average past the streaming threshold (shm_direct's vector kernel): any bit patterns, ties, NaNs and
 * infinities rounded as dt_f32_to_bf16 rounds (a + b) * 0.5 in f32, heads and tails unaligned. */
static void bf16_stream_rounding(void) {
    if (dt_comm_size(world) != 2) return;
    int r = dt_comm_rank(world);
    size_t n = (8u << 20) / 2 + 37;
    uint16_t *s = NULL, *d = NULL, *peer = malloc(n * sizeof *peer);
    if (dt_comm_alloc(world, (n + 8) * sizeof *s, (void **)&s) || dt_comm_alloc(world, (n + 8) * sizeof *d, (void **)&d) || !peer) {
        FAIL("bf16 stream: out of memory");
        return;
    }
    uint64_t seed[2] = { 7, 7 + 1000003 };
    for (int k = 0; k < 2; k++) {
        uint16_t *x = k == r ? s + 3 : peer; /* an odd offset: the kernel's head and tail */
        for (size_t i = 0; i < n; i++) {
            uint64_t v = dt_rng_next(&seed[k]);
            /* mostly ordinary values of nearby exponents (their sums round), now and then any pattern */
            x[i] = (uint16_t)(v % 7 ? 0x3f00 + (v >> 20) % 0x200 + ((v >> 40) & 1) * 0x8000 : v >> 48);
        }
    }
    dt_comm_set_algo(world, DT_COLL_ALLREDUCE, DT_ALGO_SHM_DIRECT);
    dt_status st = dt_comm_allreduce(world, s + 3, d + 3, n, DT_BF16, DT_AVG);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n && !st; i++) {
        const uint16_t *a = r == 0 ? s + 3 : peer, *b = r == 0 ? peer : s + 3;
        uint16_t want = dt_f32_to_bf16((dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i])) * 0.5f);
        bool nan = (want & 0x7fff) > 0x7f80 && (d[3 + i] & 0x7fff) > 0x7f80; /* a NaN's payload may come from either input */
        if (d[3 + i] != want && !nan && !bad++) first = i;
    }
    if (st) FAIL("bf16 stream: %s", dt_last_error());
    else if (bad) FAIL("bf16 stream: %zu of %zu values differ from f32 rounded once, the first at %zu", bad, n, first);
    else passed++;
    dt_comm_set_algo(world, DT_COLL_ALLREDUCE, DT_ALGO_AUTO);
    dt_comm_free(world, s);
    dt_comm_free(world, d);
    free(peer);
}

/* Random floats: every rank must hold the same bits, and a second run too. */
static void determinism(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    size_t n = 300007;
    float *in = malloc(n * sizeof *in), *o1 = malloc(n * sizeof *o1), *o2 = malloc(n * sizeof *o2), *o0 = malloc(n * sizeof *o0);
    unsigned s = 12345u + (unsigned)r * 7919u;
    for (size_t i = 0; i < n; i++) { s = s * 1103515245u + 12345u; in[i] = ((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 1e3f; }
    for (int a = DT_ALGO_SHM_DIRECT; a < DT_ALGO_COUNT; a++) {
        if (!implements((dt_algo)a, DT_COLL_ALLREDUCE)) continue;
        dt_comm_set_algo(world, DT_COLL_ALLREDUCE, (dt_algo)a);
        if (dt_comm_allreduce(world, in, o1, n, DT_F32, DT_SUM) || dt_comm_allreduce(world, in, o2, n, DT_F32, DT_SUM)) {
            FAIL("determinism %s: %s", dt_algo_name((dt_algo)a), dt_last_error());
            exit(1);
        }
        memcpy(o0, o1, n * sizeof *o0);
        dt_comm_set_algo(world, DT_COLL_BROADCAST, DT_ALGO_AUTO);
        if (dt_comm_broadcast(world, o0, n, DT_F32, 0)) { FAIL("broadcast: %s", dt_last_error()); exit(1); }
        if (memcmp(o1, o2, n * sizeof *o1)) FAIL("allreduce %s with p=%d: two runs differ", dt_algo_name((dt_algo)a), p);
        else if (memcmp(o1, o0, n * sizeof *o1)) FAIL("allreduce %s with p=%d: rank %d differs from rank 0", dt_algo_name((dt_algo)a), p, r);
        else passed++;
        /* Within float rounding of a double-precision reference. */
        double maxerr = 0;
        for (size_t i = 0; i < n; i += 97) {
            double ref = 0;
            for (int q = 0; q < p; q++) {
                unsigned sq = 12345u + (unsigned)q * 7919u;
                float v = 0;
                for (size_t k = 0; k <= i; k++) { sq = sq * 1103515245u + 12345u; if (k == i) v = ((float)(sq >> 8) / (float)(1u << 24) - 0.5f) * 1e3f; }
                ref += v;
                (void)v;
            }
            double e = fabs(o1[i] - ref);
            if (e > maxerr) maxerr = e;
            if (i > 3000) break; /* the reference regenerates the stream: keep it short */
        }
        if (maxerr > 1e-3 * p) FAIL("allreduce %s: error %g against the f64 sequential sum", dt_algo_name((dt_algo)a), maxerr);
        else passed++;
    }
    dt_comm_set_algo(world, DT_COLL_ALLREDUCE, DT_ALGO_AUTO);
    free(in); free(o1); free(o2); free(o0);
}

static void split_and_p2p(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    dt_comm *half = NULL, *none = NULL;
    if (dt_comm_split(world, r % 2, -r, &half)) { FAIL("split: %s", dt_last_error()); exit(1); }
    int hs = (p + 1 - r % 2) / 2;
    if (dt_comm_size(half) != hs) FAIL("split by parity: size %d, expected %d", dt_comm_size(half), hs);
    /* key -r reverses the order */
    int want_rank = hs - 1 - r / 2;
    if (dt_comm_rank(half) != want_rank) FAIL("split by parity: rank %d, expected %d", dt_comm_rank(half), want_rank);
    int64_t v = r, sum = 0, want = 0;
    for (int q = r % 2; q < p; q += 2) want += q;
    if (dt_comm_allreduce(half, &v, &sum, 1, DT_I64, DT_SUM)) FAIL("allreduce on a split: %s", dt_last_error());
    else if (sum != want) FAIL("allreduce on a split of parity %d: %lld, expected %lld", r % 2, (long long)sum, (long long)want);
    else passed++;
    if (dt_comm_split(world, r == 0 ? 0 : -1, 0, &none)) FAIL("split with color -1: %s", dt_last_error());
    else if ((r == 0) != (none != NULL)) FAIL("split with color -1 on rank %d gave %p", r, (void *)none);
    else passed++;
    dt_comm_destroy(none);
    dt_comm_destroy(half);
    /* A ring of sendrecv, large enough to need several channel chunks. */
    size_t n = 200003;
    int32_t *out = malloc(n * 4), *in = malloc(n * 4);
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)(r * 1000003 + (int)i);
    if (dt_comm_sendrecv(world, out, n, (r + 1) % p, in, n, (r - 1 + p) % p, DT_I32)) FAIL("sendrecv: %s", dt_last_error());
    else {
        int from = (r - 1 + p) % p;
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < n && bad == SIZE_MAX; i++) if (in[i] != (int32_t)(from * 1000003 + (int)i)) bad = i;
        if (bad != SIZE_MAX) FAIL("sendrecv: element %zu is %d", bad, in[bad]);
        else passed++;
    }
    free(out);
    free(in);
}

static void nonblocking(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    enum { K = 6 };
    size_t n = 50000;
    float *b[K];
    dt_request *q[K];
    for (int k = 0; k < K; k++) {
        b[k] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) b[k][i] = (float)(r + k);
        if (dt_comm_iallreduce(world, b[k], b[k], n, DT_F32, DT_SUM, &q[k])) { FAIL("iallreduce: %s", dt_last_error()); exit(1); }
    }
    /* A blocking call issued meanwhile runs after the queued ones. */
    int32_t one = 1, tot = 0;
    if (dt_comm_allreduce(world, &one, &tot, 1, DT_I32, DT_SUM) || tot != p) FAIL("blocking allreduce between nonblocking ones: %d", tot);
    for (int k = K - 1; k >= 0; k--) {
        if (dt_wait(q[k])) FAIL("wait: %s", dt_last_error());
        float want = (float)(p * (p - 1) / 2 + p * k);
        if (b[k][0] != want || b[k][n - 1] != want) FAIL("iallreduce %d: %g, expected %g", k, b[k][0], want);
        else passed++;
        free(b[k]);
    }
    int done = 0;
    dt_request *rq;
    int64_t x = r;
    if (dt_comm_ibroadcast(world, &x, 1, DT_I64, p - 1, &rq) == DT_OK) {
        while (!done) dt_test(rq, &done);
        dt_wait(rq);
        if (x != p - 1) FAIL("ibroadcast: %lld", (long long)x); else passed++;
    }
    /* ialltoall: block j of rank r holds r * 1000 + j, 3000 of them (past a channel's chunk on the larger worlds) */
    size_t m = 3000;
    int32_t *out = malloc(sizeof *out * m * (size_t)p), *in = malloc(sizeof *in * m * (size_t)p);
    for (int j = 0; j < p; j++)
        for (size_t i = 0; i < m; i++) out[(size_t)j * m + i] = r * 1000 + j + (int32_t)i;
    size_t bad = SIZE_MAX;
    if (dt_comm_ialltoall(world, out, in, m, DT_I32, &rq) || dt_wait(rq)) FAIL("ialltoall: %s", dt_last_error());
    for (int j = 0; j < p && bad == SIZE_MAX; j++)
        for (size_t i = 0; i < m; i++)
            if (in[(size_t)j * m + i] != j * 1000 + r + (int32_t)i) { bad = (size_t)j * m + i; break; }
    if (bad != SIZE_MAX) FAIL("ialltoall: element %zu is %d", bad, in[bad]); else passed++;
    free(out);
    free(in);
}

/* Uneven shards (rank 0 holds 9000 elements, rank r > 0 (2r+1) x 1000, rank 1 none when p > 2):
 * allgatherv and reduce_scatterv against the sequential result. */
static void per_rank_counts(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    size_t counts[16], total = 0, at = 0;
    for (int q = 0; q < p; q++) {
        /* the largest block first, so that a block placed at r * max instead of after its predecessors shows */
        counts[q] = q == 1 && p > 2 ? 0 : q == 0 ? 9000 : (size_t)(2 * q + 1) * 1000;
        total += counts[q];
    }
    for (int q = 0; q < r; q++) at += counts[q];
    double *mine = malloc((counts[r] + 1) * 8), *all = malloc(total * 8), *full = malloc(total * 8), *part = malloc((counts[r] + 1) * 8);
    for (size_t i = 0; i < counts[r]; i++) mine[i] = r * 1e6 + (double)i;
    for (size_t i = 0; i < total; i++) full[i] = (double)(r + 1) * (double)(i % 977);
    if (dt_comm_allgatherv(world, mine, all, counts, DT_F64)) FAIL("allgatherv: %s", dt_last_error());
    else {
        size_t bad = SIZE_MAX, k = 0;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < counts[q]; i++, k++) if (all[k] != q * 1e6 + (double)i && bad == SIZE_MAX) bad = k;
        if (bad != SIZE_MAX) FAIL("allgatherv: element %zu is %g", bad, all[bad]); else passed++;
    }
    /* the same blocks, each rank giving only its own count (rank 1's block NULL where empty) */
    void *got = NULL;
    size_t n = 0;
    if (dt_comm_allgatherv_alloc(world, counts[r] ? mine : NULL, counts[r], DT_F64, &got, &n)) FAIL("allgatherv_alloc: %s", dt_last_error());
    else if (n != total || memcmp(got, all, total * 8)) FAIL("allgatherv_alloc: %zu elements (of %zu), or other values", n, total);
    else passed++;
    free(got);
    if (dt_comm_reduce_scatterv(world, full, part, counts, DT_F64, DT_SUM)) FAIL("reduce_scatterv: %s", dt_last_error());
    else {
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < counts[r]; i++)
            if (part[i] != (double)p * (p + 1) / 2 * (double)((at + i) % 977) && bad == SIZE_MAX) bad = i;
        if (bad != SIZE_MAX) FAIL("reduce_scatterv: element %zu is %g", bad, part[bad]); else passed++;
    }
    free(mine); free(all); free(full); free(part);
}

/* alltoallv's blocks: from rank a to rank b (one large one, from 0 to the last, crossing many channel chunks; some
 * empty), and their elements. */
static size_t uneven(int a, int b, int p) {
    if (a == 0 && b == p - 1) return 300000;
    return (a * 7 + b * 13) % 5 == 0 ? 0 : (size_t)((a + 1) * (b + 2) * 331 % 4000);
}
static double uneven_value(int a, int b, size_t i) { return a * 1e7 + b * 1e5 + (double)(i % 99991); }
static size_t small_block(int a, int b, int p) { return uneven(a, b, p) % 7 + (a == b ? 3 : 0); }
static size_t medium_block(int a, int b, int p) { return (size_t)((a + 2 * b) % 3) * 2 + (size_t)(40 / p); }

/* alltoallv on world of blocks size(a, b, p) elements from rank a to rank b, their values shifted by shift, checked. */
static void sized_blocks(size_t (*size)(int, int, int), double shift, const char *what) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    size_t sc[16], rc[16], stotal = 0, cap = 0;
    for (int q = 0; q < p; q++) sc[q] = size(r, q, p), stotal += sc[q], cap += size(q, r, p);
    double *out = malloc((stotal + 1) * 8), *in = malloc((cap + 1) * 8);
    if (!out || !in) FAIL("alltoallv of %s: no memory", what);
    for (int q = 0, k = 0; out && q < p; q++)
        for (size_t i = 0; i < sc[q]; i++) out[k++] = uneven_value(r, q, i) + shift;
    if (out && in && dt_comm_alltoallv(world, out, sc, in, cap, rc, DT_F64)) FAIL("alltoallv of %s: %s", what, dt_last_error());
    else if (out && in) {
        size_t bad = SIZE_MAX, k = 0;
        for (int q = 0; q < p; q++) {
            if (rc[q] != size(q, r, p)) bad = k;
            for (size_t i = 0; i < size(q, r, p) && bad == SIZE_MAX; i++, k++)
                if (in[k] != uneven_value(q, r, i) + shift) bad = k;
        }
        if (bad != SIZE_MAX) FAIL("alltoallv of %s: element %zu is %g", what, bad, in[bad]); else passed++;
    }
    free(out), free(in);
}

/* alltoallv of the uneven blocks on c, the send buffer private or in the shared segment (arena), checked against the
 * blocks each rank knows the others send. */
static void uneven_blocks(dt_comm *c, int arena, const char *how) {
    int p = dt_comm_size(c), r = dt_comm_rank(c);
    size_t sc[16], rc[16], stotal = 0, cap = 0;
    for (int q = 0; q < p; q++) sc[q] = uneven(r, q, p), stotal += sc[q], cap += uneven(q, r, p);
    double *out = NULL, *in = malloc((cap + 1) * 8);
    if (arena ? dt_comm_alloc(c, (stotal + 1) * 8, (void **)&out) : !(out = malloc((stotal + 1) * 8))) {
        FAIL("alltoallv %s: no memory", how);
        free(in);
        return;
    }
    for (int q = 0, k = 0; q < p; q++)
        for (size_t i = 0; i < sc[q]; i++) out[k++] = uneven_value(r, q, i);
    if (dt_comm_alltoallv(c, out, sc, in, cap, rc, DT_F64)) FAIL("alltoallv %s: %s", how, dt_last_error());
    else {
        size_t bad = SIZE_MAX, k = 0;
        for (int q = 0; q < p; q++) {
            if (rc[q] != uneven(q, r, p)) bad = k;
            for (size_t i = 0; i < uneven(q, r, p) && bad == SIZE_MAX; i++, k++)
                if (in[k] != uneven_value(q, r, i)) bad = k;
        }
        if (bad != SIZE_MAX) FAIL("alltoallv %s: element %zu is %g", how, bad, in[bad]); else passed++;
    }
    if (arena) dt_comm_free(c, out);
    else free(out);
    free(in);
}

/* alltoallv against the blocks each rank knows the others send: a large block read from a private buffer (by the
 * kernel where the ranks may, else by point to point: a communicator made with DTRAIN_CMA=0) or in place from the
 * shared segment; small blocks in one round; a rank without room fails every rank alike. */
static void uneven_alltoall(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    uneven_blocks(world, 0, "from private buffers");
    uneven_blocks(world, 1, "from the shared segment");
    /* rank 0 alone may not read the others' memory: every rank sees it in the cells and none reads that way */
    dt_comm *pairs = NULL;
    if (r == 0) setenv("DTRAIN_CMA", "0", 1);
    if (dt_comm_split(world, 0, r, &pairs)) FAIL("split: %s", dt_last_error());
    else {
        uneven_blocks(pairs, 0, "by point to point (rank 0 with DTRAIN_CMA=0)");
        size_t n = 100000;
        double *mine = malloc(n * 8), *all = malloc(n * 8 * (size_t)p), bad = 0;
        for (size_t i = 0; i < n; i++) mine[i] = uneven_value(r, 0, i);
        if (dt_comm_allgather(pairs, mine, all, n, DT_F64)) FAIL("allgather, rank 0 with DTRAIN_CMA=0: %s", dt_last_error());
        else {
            for (size_t i = 0; i < n * (size_t)p; i++) bad += all[i] != uneven_value((int)(i / n), 0, i % n);
            if (bad) FAIL("allgather, rank 0 with DTRAIN_CMA=0: %g elements wrong", bad); else passed++;
        }
        /* one rank's data to the others (rank 1 can read, rank 0 cannot: it must not) */
        for (int root = 0; root < 2 && p > 1; root++) {
            for (size_t i = 0; i < n; i++) mine[i] = r == root ? uneven_value(root, 1, i) : 0;
            bad = 0;
            if (dt_comm_broadcast(pairs, mine, n, DT_F64, root)) FAIL("broadcast from %d, rank 0 with DTRAIN_CMA=0: %s", root, dt_last_error());
            else {
                for (size_t i = 0; i < n; i++) bad += mine[i] != uneven_value(root, 1, i);
                if (bad) FAIL("broadcast from %d, rank 0 with DTRAIN_CMA=0: %g elements wrong", root, bad); else passed++;
            }
        }
        /* the root's buffer in the segment, the others' private: a root that cannot write into them leaves them whole
         * to their readers */
        double *seg = NULL;
        if (dt_comm_alloc(pairs, n * 8, (void **)&seg)) FAIL("alloc: %s", dt_last_error());
        else {
            double *buf = r == 0 ? seg : mine;
            for (size_t i = 0; i < n; i++) buf[i] = r == 0 ? uneven_value(0, 2, i) : 0;
            bad = 0;
            if (dt_comm_broadcast(pairs, buf, n, DT_F64, 0)) FAIL("broadcast from the segment to private buffers: %s", dt_last_error());
            else {
                for (size_t i = 0; i < n; i++) bad += buf[i] != uneven_value(0, 2, i);
                if (bad) FAIL("broadcast from the segment to private buffers: %g elements wrong", bad); else passed++;
            }
            dt_comm_free(pairs, seg);
        }
        free(mine), free(all);
    }
    unsetenv("DTRAIN_CMA");
    dt_comm_destroy(pairs);
    size_t sc[16], rc[16], stotal = 0, cap = 0;
    for (int q = 0; q < p; q++) sc[q] = uneven(r, q, p), stotal += sc[q], cap += uneven(q, r, p);
    double *out = malloc((stotal + 1) * 8), *in = malloc((cap + 1) * 8);
    /* small blocks (every rank's whole sendbuf rides with the counts: one round), a rank's block to itself too; then
     * blocks of 300-500 bytes a rank twice: across machines the first goes pair by pair (its row's room is the small
     * call's most), the second rides (its room the first's) */
    sized_blocks(small_block, 0.5, "small blocks");
    sized_blocks(medium_block, 0.25, "medium blocks, first");
    sized_blocks(medium_block, 0.75, "medium blocks, again");
    /* the nonblocking one, its counts known both ways: the blocks received in reverse rank order (displacements), then
     * one block to every rank (an allgatherv: every send displacement 0) */
    size_t sd[16], rd[16], at = 0, zero[16] = { 0 }, gc[16], gtotal = 0, mine = (size_t)(r + 1) * 1001 % 3000;
    for (int q = p - 1; q >= 0; q--) rc[q] = uneven(q, r, p), rd[q] = at, at += rc[q];
    for (int q = 0, k = 0; q < p; q++) sd[q] = (size_t)k, k += (int)sc[q];
    for (int q = 0, k = 0; q < p; q++) /* out as first filled: rank q's block at sd[q] */
        for (size_t i = 0; i < sc[q]; i++) out[k++] = uneven_value(r, q, i);
    dt_request *req = NULL;
    dt_status ist = dt_comm_ialltoallv(world, out, sc, sd, in, rc, rd, DT_F64, &req);
    if (!ist && req) ist = dt_wait(req);
    if (ist) FAIL("ialltoallv: %s", dt_last_error());
    else {
        size_t bad = SIZE_MAX;
        for (int q = 0; q < p && bad == SIZE_MAX; q++)
            for (size_t i = 0; i < rc[q] && bad == SIZE_MAX; i++)
                if (in[rd[q] + i] != uneven_value(q, r, i)) bad = rd[q] + i;
        if (bad != SIZE_MAX) FAIL("ialltoallv: element %zu is %g", bad, in[bad]); else passed++;
    }
    for (int q = 0; q < p; q++) gc[q] = (size_t)(q + 1) * 1001 % 3000, gtotal += gc[q], sc[q] = mine;
    double *all = malloc((gtotal + 1) * 8), *one = malloc((mine + 1) * 8);
    for (size_t i = 0; i < mine; i++) one[i] = uneven_value(r, r, i) - 1;
    ist = dt_comm_ialltoallv(world, one, sc, zero, all, gc, NULL, DT_F64, &req);
    if (!ist && req) ist = dt_wait(req);
    if (ist) FAIL("ialltoallv as an allgatherv: %s", dt_last_error());
    else {
        size_t bad = SIZE_MAX, k = 0;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < gc[q]; i++, k++)
                if (bad == SIZE_MAX && all[k] != uneven_value(q, q, i) - 1) bad = k;
        if (bad != SIZE_MAX) FAIL("ialltoallv as an allgatherv: element %zu is %g", bad, all[bad]); else passed++;
    }
    free(all), free(one);
    for (int q = 0; q < p; q++) sc[q] = uneven(r, q, p);
    if (p >= 2) {
        size_t tight = r == 1 ? cap - 1 : cap;
        dt_status st = cap ? dt_comm_alltoallv(world, out, sc, in, tight, rc, DT_F64) : DT_ERR_ARG;
        char want[128];
        snprintf(want, sizeof want, "rank 1 would receive %zu elements into room for %zu", cap, cap - 1);
        if (r == 1 && !(st && strstr(dt_last_error(), want))) FAIL("alltoallv without room: %s", st ? dt_last_error() : "accepted");
        else if (r != 1 && !(st && strstr(dt_last_error(), "rank 1 would receive"))) FAIL("alltoallv, rank 1 without room: %s", st ? dt_last_error() : "accepted");
        else if (dt_comm_barrier(world)) FAIL("a barrier after a refused alltoallv: %s", dt_last_error());
        else passed++;
    }
    free(out), free(in);
}

/* Nonblocking point to point: a ring exchange of messages far larger than
 * a channel (both halves of one isendrecv progress together), then a pair
 * of isend/irecv to the same neighbours, waited for together. */
static void nonblocking_p2p(void) {
    int p = dt_comm_size(world), r = dt_comm_rank(world), next = (r + 1) % p, prev = (r - 1 + p) % p;
    size_t n = 1 << 20;
    int32_t *out = malloc(n * 4), *in = malloc(n * 4), *in2 = malloc(64);
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)(r * 7919 + (int)i);
    dt_request *q[3] = { NULL, NULL, NULL };
    int32_t token = r * 11;
    if (dt_comm_isendrecv(world, out, n, next, in, n, prev, DT_I32, &q[0])) FAIL("isendrecv: %s", dt_last_error());
    /* small ones fit the channel, so posted separately they cannot block each other */
    if (dt_comm_isend(world, &token, 1, DT_I32, next, &q[1]) || dt_comm_irecv(world, in2, 1, DT_I32, prev, &q[2]))
        FAIL("isend/irecv: %s", dt_last_error());
    if (dt_waitall(q, 3)) FAIL("waitall: %s", dt_last_error());
    else {
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < n && bad == SIZE_MAX; i++) if (in[i] != (int32_t)(prev * 7919 + (int)i)) bad = i;
        if (bad != SIZE_MAX || in2[0] != prev * 11 || q[0] || q[1] || q[2]) FAIL("nonblocking p2p: element %zu, token %d", bad, in2[0]);
        else passed++;
    }
    free(out); free(in); free(in2);
}

/* A mailbox between ranks 0 and 1 (a pipeline's link): 9 messages through 2
 * slots arrive whole and in order, read where they lie, while the sender
 * runs ahead as far as the slots allow; put on the receiving side and get
 * on the sending side are refused; so is a mailbox between two machines
 * (MPI pseudo-nodes). The other ranks only take part in the split. */
static void mailbox(void) {
    int r = dt_comm_rank(world);
    dt_comm *pair = NULL;
    if (dt_comm_split(world, r < 2 ? 0 : -1, r, &pair)) { FAIL("mailbox split: %s", dt_last_error()); return; }
    if (!pair) return;
    dt_mailbox *m = NULL;
    size_t n = 100003; /* not a multiple of a cache line */
    dt_status st = dt_mailbox_create(pair, 0, n * 4, 2, &m);
    if (dt_comm_local_size(pair) < 2) {
        if (st == DT_ERR_ARG && !m && strstr(dt_last_error(), "this machine")) passed++;
        else FAIL("a mailbox across machines: %s", st ? dt_last_error() : "accepted");
        dt_comm_destroy(pair);
        return;
    }
    if (st) { FAIL("mailbox: %s", dt_last_error()); dt_comm_destroy(pair); return; }
    int32_t *msg = malloc(n * 4);
    const void *got = NULL;
    int bad = -1, refused = r == 0 ? dt_mailbox_get(m, &got) != DT_OK : dt_mailbox_put(m, msg) != DT_OK;
    for (int k = 0; k < 9 && bad < 0; k++) {
        if (r == 0) {
            for (size_t i = 0; i < n; i++) msg[i] = (int32_t)(k * 1000003 + (int)i);
            if (dt_mailbox_put(m, msg)) bad = k;
        } else {
            if (k % 3 == 0) usleep(20000); /* a slow receiver: the sender fills both slots and waits */
            if (dt_mailbox_get(m, &got)) { bad = k; break; }
            const int32_t *v = got;
            for (size_t i = 0; i < n && bad < 0; i++) if (v[i] != (int32_t)(k * 1000003 + (int)i)) bad = k;
            dt_mailbox_release(m);
        }
    }
    if (bad >= 0 || !refused) FAIL("mailbox rank %d: message %d wrong or failed (%s); wrong side refused: %d", r, bad, dt_last_error(), refused);
    else passed++;
    free(msg);
    dt_mailbox_destroy(m);
    dt_comm_destroy(pair);
}

static void bad_arguments(void) {
    float x = 0;
    struct { dt_status st; const char *what; } cases[] = {
        { dt_comm_allreduce(world, NULL, &x, 1, DT_F32, DT_SUM), "NULL sendbuf" },
        { dt_comm_allreduce(world, &x, &x, 1, (dt_dtype)42, DT_SUM), "unknown dtype" },
        { dt_comm_allreduce(world, &x, &x, 1, DT_F32, (dt_op)42), "unknown op" },
        { dt_comm_allreduce(world, &x, &x, SIZE_MAX / 2, DT_F32, DT_SUM), "count overflow" },
        { dt_comm_broadcast(world, &x, 1, DT_F32, dt_comm_size(world)), "root out of range" },
        { dt_comm_allgather(world, &x, &x, SIZE_MAX / 3, DT_F64), "allgather count overflow" },
        { dt_comm_set_algo(world, DT_COLL_BROADCAST, DT_ALGO_RING), "ring broadcast" },
        { dt_comm_split(world, 0, 0, NULL), "split to NULL" },
        { dt_comm_allgatherv(world, &x, &x, NULL, DT_F32), "allgatherv without counts" },
        { dt_comm_isendrecv(world, &x, 1, -1, &x, 1, -1, DT_F32, &(dt_request *){ NULL }), "isendrecv with no peer" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].st == DT_OK) FAIL("bad argument accepted: %s", cases[i].what);
        else if (strlen(dt_last_error()) < 10) FAIL("bad argument %s: message too short", cases[i].what);
        else passed++;
    }
}

/* `test_collectives tcp-flags`, run under Open MPI's mpirun across machines: the TCP flags Open MPI took, read
 * through MPI_T after dtrain initialised MPI. dtrain asks for them without put (mpi_transport.c) unless the
 * user set them; prints "btl_tcp_flags 0x...: put on|off". */
static int tcp_flags(void) {
#if defined(DT_HAVE_MPI) && defined(OPEN_MPI)
    if (dt_comm_init(&world)) return fprintf(stderr, "init: %s\n", dt_last_error()), 1;
    int provided, idx, count;
    unsigned flags = 0;
    MPI_T_cvar_handle h;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS || MPI_T_cvar_get_index("btl_tcp_flags", &idx) != MPI_SUCCESS ||
        MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS || MPI_T_cvar_read(h, &flags) != MPI_SUCCESS)
        return fprintf(stderr, "btl_tcp_flags cannot be read through MPI_T (is Open MPI's TCP transport loaded?)\n"), 1;
    MPI_T_cvar_handle_free(&h);
    MPI_T_finalize();
    /* 0x2 is Open MPI's MCA_BTL_FLAGS_PUT (opal/mca/btl/btl.h) */
    if (dt_comm_rank(world) == 0) printf("btl_tcp_flags 0x%x: put %s\n", flags, flags & 0x2 ? "on" : "off");
    dt_comm_destroy(world);
    return 0;
#else
    fprintf(stderr, "tcp-flags: this build has no Open MPI\n");
    return 1;
#endif
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "tcp-flags")) return tcp_flags();
    if (dt_comm_init(&world)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    matrix();
    determinism();
    bf16_stream_rounding();
    split_and_p2p();
    nonblocking();
    if (dt_comm_size(world) <= 16) per_rank_counts();
    if (dt_comm_size(world) <= 16) uneven_alltoall();
    nonblocking_p2p();
    if (dt_comm_size(world) >= 2) mailbox();
    bad_arguments();
    int32_t f = failed, fsum = 0, ps = passed, psum = 0;
    if (dt_comm_allreduce(world, &f, &fsum, 1, DT_I32, DT_SUM) || dt_comm_allreduce(world, &ps, &psum, 1, DT_I32, DT_SUM)) {
        fprintf(stderr, "rank %d: final tally failed: %s\n", dt_comm_rank(world), dt_last_error());
        return 1;
    }
    if (dt_comm_rank(world) == 0) printf("collectives on %d ranks: %d passed, %d failed\n", dt_comm_size(world), psum, fsum);
    dt_comm_destroy(world);
    return fsum ? 1 : 0;
}
