/* shm-direct: every collective on one machine, working straight on the
 * peers' buffers in the shared segment.
 *
 * Pull (allgather, broadcast, alltoall, gather, scatter, reduce_scatter, and
 * small reductions): each rank builds its own output from all inputs.
 * Push (large allreduce and reduce): rank r reduces slice r of the inputs in
 * rank order and writes it into every output, so each element is summed once,
 * the same way on every rank and every run, and each rank moves 2n bytes.
 *
 * Inputs reach peers in one of four ways, chosen the same on every rank
 * from what every rank's cell says:
 *  - inline: up to DT_CELL_INLINE bytes travel inside the arrival cell; no
 *    barrier after the call (cells are double-buffered);
 *  - zero-copy: buffers from dt_comm_alloc are read and written in place;
 *    one barrier at the end, so nobody reuses a buffer that a peer still reads;
 *  - by cross-memory attach (a collective that only copies, every rank able:
 *    cma.c): a peer's private input read straight into the output, one copy
 *    by the kernel; one barrier at the end;
 *  - staged: private buffers are copied through per-rank scratch in chunks of
 *    DT_SCRATCH_BYTES, two barriers per chunk.
 *
 * cost (p ranks, n bytes): α·(1 + barriers) + n·β_mem (push: 2n per rank;
 * staged adds 2n) + n·γ; auto picks it whenever all ranks share a machine. */
#include "../comm_internal.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define STREAM_BYTES DT_STREAM_BYTES

void dt_copy_out(uint8_t *dst, const uint8_t *src, size_t bytes, bool stream) {
#if defined(__x86_64__)
    if (stream) {
        size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        if (head > bytes) head = bytes;
        memcpy(dst, src, head);
        size_t i = head;
        for (; i + 64 <= bytes; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        memcpy(dst + i, src + i, bytes - i);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, bytes);
}

static size_t input_bytes(const coll_args *a, int p, int j) {
    size_t b = a->count * dt_dtype_size(a->dtype);
    switch (a->coll) {
    case DT_COLL_REDUCE_SCATTER: case DT_COLL_ALLTOALL: return b * (size_t)p;
    case DT_COLL_BROADCAST: return j == a->root ? b : 0;
    case DT_COLL_SCATTER: return j == a->root ? b * (size_t)p : 0;
    case DT_COLL_BARRIER: return 0;
    default: return b;
    }
}

static const void *my_input(const coll_args *a, int rank) {
    if (a->coll == DT_COLL_BROADCAST) return rank == a->root ? a->recvbuf : NULL;
    if (a->coll == DT_COLL_SCATTER && rank != a->root) return NULL;
    return a->sendbuf;
}

static bool uses_push(const coll_args *a) {
    return a->coll == DT_COLL_ALLREDUCE || a->coll == DT_COLL_REDUCE;
}

/* Pull: write this rank's part of the output that depends on bytes [lo,hi)
 * of every rank's input; in[j] points at byte lo of rank j's input. */
static void consume(dt_comm *c, const coll_args *a, const uint8_t *const *in, size_t lo, size_t hi) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype), B = a->count * es;
    uint8_t *out = a->recvbuf;
    switch (a->coll) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
        if (a->coll == DT_COLL_REDUCE && r != a->root) return;
        dt_reduce_many(out + lo, (const void *const *)in, p, (hi - lo) / es, a->dtype, a->op);
        dt_reduce_finish(out + lo, (hi - lo) / es, a->dtype, a->op, p);
        return;
    case DT_COLL_REDUCE_SCATTER: {
        size_t x0 = lo > r * B ? lo : r * B, x1 = hi < (r + 1) * B ? hi : (r + 1) * B;
        if (x0 >= x1) return;
        const void *srcs[DT_MAX_LOCAL];
        for (int j = 0; j < p; j++) srcs[j] = in[j] + (x0 - lo);
        dt_reduce_many(out + (x0 - r * B), srcs, p, (x1 - x0) / es, a->dtype, a->op);
        dt_reduce_finish(out + (x0 - r * B), (x1 - x0) / es, a->dtype, a->op, p);
        return;
    }
    case DT_COLL_ALLGATHER:
        for (int j = 0; j < p; j++) memmove(out + (size_t)j * B + lo, in[j], hi - lo);
        return;
    case DT_COLL_GATHER:
        if (r == a->root)
            for (int j = 0; j < p; j++) memmove(out + (size_t)j * B + lo, in[j], hi - lo);
        return;
    case DT_COLL_BROADCAST:
        if (r != a->root) memcpy(out + lo, in[a->root], hi - lo);
        return;
    case DT_COLL_ALLTOALL:
    case DT_COLL_SCATTER: {
        size_t x0 = lo > r * B ? lo : r * B, x1 = hi < (r + 1) * B ? hi : (r + 1) * B;
        if (x0 >= x1) return;
        if (a->coll == DT_COLL_SCATTER) { memmove(out + (x0 - r * B), in[a->root] + (x0 - lo), x1 - x0); return; }
        for (int j = 0; j < p; j++) memmove(out + (size_t)j * B + (x0 - r * B), in[j] + (x0 - lo), x1 - x0);
        return;
    }
    default: return;
    }
}

/* Two ranks, f32 sum or average, outputs too big for cache: one pass that
 * reads both inputs and streams both outputs, keeping four memory streams
 * busy at once. The average is (a+b)*0.5, which equals dt_reduce_finish's
 * (a+b)/2 bit for bit (halving is exact), so DDP's gradients take this path
 * too. False when the outputs' alignments differ (then the general path runs). */
static bool push_two_f32_stream(float *o0, float *o1, const float *a, const float *b, size_t n, float scale) {
#if defined(__x86_64__)
    if (((uintptr_t)o0 & 15) != ((uintptr_t)o1 & 15) || ((uintptr_t)o0 & 3)) return false;
    size_t i = 0;
    for (; i < n && ((uintptr_t)(o0 + i) & 15); i++) o0[i] = o1[i] = (a[i] + b[i]) * scale;
    __m128 s = _mm_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m128 x0 = _mm_mul_ps(_mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)), s);
        __m128 x1 = _mm_mul_ps(_mm_add_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4)), s);
        _mm_stream_ps(o0 + i, x0);
        _mm_stream_ps(o1 + i, x0);
        _mm_stream_ps(o0 + i + 4, x1);
        _mm_stream_ps(o1 + i + 4, x1);
    }
    for (; i < n; i++) o0[i] = o1[i] = (a[i] + b[i]) * scale;
    _mm_sfence();
    return true;
#else
    (void)o0; (void)o1; (void)a; (void)b; (void)n; (void)scale;
    return false;
#endif
}

/* The same for bf16 (AVX2): widened, added and scaled in f32, rounded to nearest even as dt_f32_to_bf16 does (NaNs
 * kept quiet), 16 values a turn. False without AVX2 or where the outputs' alignments differ. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void push_two_bf16_avx2(uint16_t *o0, uint16_t *o1, const uint16_t *a, const uint16_t *b,
                                                                size_t n, float scale) {
    size_t i = 0;
    for (; i < n && ((uintptr_t)(o0 + i) & 31); i++) o0[i] = o1[i] = dt_f32_to_bf16((dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i])) * scale);
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), abs = _mm256_set1_epi32(0x7fffffff),
                  inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x400000);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + i + 8 * h))), 16);
            __m256i y = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + i + 8 * h))), 16);
            __m256i u = _mm256_castps_si256(_mm256_mul_ps(_mm256_add_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(y)), s));
            __m256i up = _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            /* the value in the high half, sign-extended: packs_epi32 then keeps its 16 bits exactly */
            r[h] = _mm256_srai_epi32(_mm256_blendv_epi8(up, _mm256_or_si256(u, quiet), nan), 16);
        }
        __m256i out = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), 0xd8);
        _mm256_stream_si256((__m256i *)(o0 + i), out);
        _mm256_stream_si256((__m256i *)(o1 + i), out);
    }
    for (; i < n; i++) o0[i] = o1[i] = dt_f32_to_bf16((dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i])) * scale);
    _mm_sfence();
}
#endif

static bool push_two_bf16_stream(uint16_t *o0, uint16_t *o1, const uint16_t *a, const uint16_t *b, size_t n, float scale) {
#if defined(__x86_64__)
    if (((uintptr_t)o0 & 31) != ((uintptr_t)o1 & 31) || ((uintptr_t)o0 & 1) || !__builtin_cpu_supports("avx2")) return false;
    push_two_bf16_avx2(o0, o1, a, b, n, scale);
    return true;
#else
    (void)o0; (void)o1; (void)a; (void)b; (void)n; (void)scale;
    return false;
#endif
}

/* Push: reduce elements [e0,e1) (this rank's slice) from in[] and store the
 * result into every non-NULL out[]. */
static void push_slice(const coll_args *a, int p, uint8_t *const *in, uint8_t *const *out, size_t e0, size_t e1,
                       bool stream) {
    size_t es = dt_dtype_size(a->dtype);
    if (p == 2 && !stream && out[0] && out[1] &&
        dt_reduce_pair_to2(out[0] + e0 * es, out[1] + e0 * es, in[0] + e0 * es, in[1] + e0 * es, e1 - e0, a->dtype, a->op))
        return;
    if (p == 2 && stream && out[0] && out[1] && a->dtype == DT_F32 && (a->op == DT_SUM || a->op == DT_AVG) &&
        push_two_f32_stream((float *)out[0] + e0, (float *)out[1] + e0, (const float *)in[0] + e0, (const float *)in[1] + e0, e1 - e0,
                            a->op == DT_AVG ? 0.5f : 1.0f))
        return;
    if (p == 2 && stream && out[0] && out[1] && a->dtype == DT_BF16 && (a->op == DT_SUM || a->op == DT_AVG) &&
        push_two_bf16_stream((uint16_t *)out[0] + e0, (uint16_t *)out[1] + e0, (const uint16_t *)in[0] + e0, (const uint16_t *)in[1] + e0,
                             e1 - e0, a->op == DT_AVG ? 0.5f : 1.0f))
        return;
    _Alignas(64) uint8_t acc[16384];
    size_t blk = sizeof acc / es;
    const void *srcs[DT_MAX_LOCAL];
    for (size_t e = e0; e < e1; e += blk) {
        size_t m = e1 - e < blk ? e1 - e : blk;
        for (int j = 0; j < p; j++) srcs[j] = in[j] + e * es;
        dt_reduce_many(acc, srcs, p, m, a->dtype, a->op);
        dt_reduce_finish(acc, m, a->dtype, a->op, p);
        for (int j = 0; j < p; j++)
            if (out[j]) dt_copy_out(out[j] + e * es, acc, m * es, stream);
    }
#if defined(__x86_64__)
    if (stream) _mm_sfence(); /* streamed stores must land before the barrier says done */
#endif
}

static uint64_t seg_off(dt_comm *c, const void *p, size_t bytes) {
    if (!p || !bytes || !dt_segment_contains(c->seg, p, bytes)) return 0;
    return (uint64_t)((const char *)p - c->seg->base);
}

static dt_status run_staged(dt_comm *c, const coll_args *a, size_t maxin) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype);
    const uint8_t *mine = my_input(a, r);
    size_t myin = input_bytes(a, p, r);
    uint8_t *scr[DT_MAX_LOCAL];
    for (int j = 0; j < p; j++) scr[j] = c->scratch + (size_t)j * DT_SCRATCH_BYTES;
    bool stream = a->count * es >= STREAM_BYTES;
    if (uses_push(a)) {
        size_t chunk = DT_SCRATCH_BYTES / es;
        bool all = a->coll == DT_COLL_ALLREDUCE;
        uint8_t *out[DT_MAX_LOCAL];
        for (int j = 0; j < p; j++) out[j] = (all || j == a->root) ? scr[j] : NULL;
        for (size_t e = 0; e < a->count; e += chunk) {
            size_t m = a->count - e < chunk ? a->count - e : chunk;
            memcpy(scr[r], mine + e * es, m * es);
            dt_status st = dt_group_step(c);
            if (st) return st;
            push_slice(a, p, scr, out, dt_block_start(m, p, r), dt_block_start(m, p, r) + dt_block_count(m, p, r), false);
            if ((st = dt_group_step(c))) return st;
            if (out[r]) dt_copy_out((uint8_t *)a->recvbuf + e * es, scr[r], m * es, stream);
        }
#if defined(__x86_64__)
        if (stream) _mm_sfence();
#endif
        return DT_OK;
    }
    const uint8_t *in[DT_MAX_LOCAL];
    for (size_t lo = 0; lo < maxin; lo += DT_SCRATCH_BYTES) {
        size_t hi = maxin - lo < DT_SCRATCH_BYTES ? maxin : lo + DT_SCRATCH_BYTES;
        if (myin > lo) memcpy(scr[r], mine + lo, (myin < hi ? myin : hi) - lo);
        dt_status st = dt_group_step(c);
        if (st) return st;
        for (int j = 0; j < p; j++) in[j] = scr[j];
        consume(c, a, in, lo, hi);
        if ((st = dt_group_step(c))) return st;
    }
    return DT_OK;
}

/* The collectives whose outputs only copy inputs (pull): a peer's private input may be read by cross-memory attach,
 * its address in the cell's input offset with this flag (user addresses leave the top bit clear), where every rank's
 * output offset has the flag (each can read the others). */
#define CMA_ADDR (1ull << 63)
/* the root's share of a broadcast into a private output, at least: below, its system call costs more than the copy it
 * saves (Intel Xeon, 2 ranks: 8 KiB 1.36 us shared against 1.04 alone, 32 KiB 1.65 against 1.96) */
#define CMA_SHARE (16u << 10)

static bool copies(const coll_args *a) {
    return a->coll == DT_COLL_ALLGATHER || a->coll == DT_COLL_GATHER || a->coll == DT_COLL_BROADCAST || a->coll == DT_COLL_ALLTOALL ||
           a->coll == DT_COLL_SCATTER;
}

/* What rank j of p writes into its output (pull collectives) */
static size_t output_bytes(const coll_args *a, int p, int j) {
    size_t b = a->count * dt_dtype_size(a->dtype);
    switch (a->coll) {
    case DT_COLL_ALLGATHER: case DT_COLL_ALLTOALL: return b * (size_t)p;
    case DT_COLL_GATHER: return j == a->root ? b * (size_t)p : 0;
    case DT_COLL_BROADCAST: return j == a->root ? 0 : b;
    default: return b;
    }
}

static bool overlaps(const void *x, size_t nx, const void *y, size_t ny) {
    uintptr_t a = (uintptr_t)x, b = (uintptr_t)y;
    return nx && ny && a < b + ny && b < a + nx;
}

/* len bytes at offset off of rank j's input into dst: this rank's own by a copy, one in the segment likewise, another's
 * private one by the kernel */
static dt_status pull(dt_comm *c, const coll_args *a, int j, const uint8_t *const *in, const uint64_t *addr, size_t off, uint8_t *dst,
                      size_t len) {
    const uint8_t *own = j == c->rank ? my_input(a, j) : in[j];
    if (!len) return DT_OK;
    if (own) {
        memmove(dst, own + off, len);
        return DT_OK;
    }
    return dt_cma_read(c, j, dst, addr[j] + off, len, dt_coll_name(a->coll));
}

/* A broadcast shared between the root and its readers: the root writes the first B/p bytes (whole cache lines) of
 * each reader's output that says where it lies (in[j] in the segment, addr[j] private where the root can write
 * there), and each reader reads the rest at the same time: the root's core copies too, not only the readers'. */
static dt_status bcast_shared(dt_comm *c, const coll_args *a, const uint8_t *const *in, const uint64_t *addr, bool root_can) {
    int p = c->size, r = c->rank, root = a->root;
    size_t B = a->count * dt_dtype_size(a->dtype), share = (B / (size_t)p) & ~(size_t)63;
    dt_status st = DT_OK;
    if (r == root) {
        for (int k = 1; !st && share && k < p; k++) {
            int j = (r + k) % p;
            if (in[j]) memcpy((uint8_t *)in[j], a->recvbuf, share);
            else if (addr[j] && root_can && share >= CMA_SHARE) st = dt_cma_write(c, j, addr[j], a->recvbuf, share, "broadcast");
        }
        return st;
    }
    size_t from = share && (in[r] || (addr[r] && root_can && share >= CMA_SHARE)) ? share : 0;
    return pull(c, a, root, in, addr, from, (uint8_t *)a->recvbuf + from, B - from);
}

/* Pull by cross-memory attach: each rank copies what its output holds straight out of the others' inputs, one copy
 * a byte, each from the next rank on (the ranks do not all read one at once); a barrier, so that no rank reuses an
 * input another still reads. */
static dt_status run_cma(dt_comm *c, const coll_args *a, const uint8_t *const *in, const uint64_t *addr) {
    int p = c->size, r = c->rank, root = a->root;
    size_t B = a->count * dt_dtype_size(a->dtype);
    uint8_t *out = a->recvbuf;
    dt_status st = DT_OK;
    switch (a->coll) {
    case DT_COLL_ALLGATHER: case DT_COLL_GATHER: case DT_COLL_ALLTOALL:
        if (a->coll == DT_COLL_GATHER && r != root) break;
        for (int k = 1; !st && k <= p; k++) {
            int j = (r + k) % p;
            st = pull(c, a, j, in, addr, a->coll == DT_COLL_ALLTOALL ? (size_t)r * B : 0, out + (size_t)j * B, B);
        }
        break;
    case DT_COLL_BROADCAST: st = bcast_shared(c, a, in, addr, true); break;
    case DT_COLL_SCATTER: st = pull(c, a, root, in, addr, (size_t)r * B, out, B); break;
    default: break;
    }
    return st ? st : dt_group_step(c);
}

dt_status dt_shm_direct_run(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    if (c->local_size != p)
        return dt_error(DT_ERR_UNSUPPORTED, "shm_direct needs every rank on one machine (%d of %d are here)", c->local_size, p);
    size_t es = dt_dtype_size(a->dtype);
    size_t maxin = 0;
    for (int j = 0; j < p; j++) {
        size_t b = input_bytes(a, p, j);
        if (b > maxin) maxin = b;
    }
    const uint8_t *mine = my_input(a, r);
    size_t myin = input_bytes(a, p, r);
    size_t outb = a->coll == DT_COLL_ALLREDUCE || (a->coll == DT_COLL_REDUCE && r == a->root) ? a->count * es : 0;
    bool small = maxin <= DT_CELL_INLINE;
    /* a copy too large for the cells: this rank says whether it can read the others by cross-memory attach (in its
     * output offset, which a copy does not use) and, where its input is private, where that lies */
    bool can = !small && copies(a) && dt_cma_ready(c);
    uint64_t soff = seg_off(c, mine, myin), roff = can ? CMA_ADDR : seg_off(c, a->recvbuf, outb);
    if (can && !soff && myin && !overlaps(mine, myin, a->recvbuf, output_bytes(a, p, r))) soff = (uintptr_t)mine | CMA_ADDR;
    /* a broadcast's reader has no input: its input offset says where its output lies, for the root's share */
    if (!small && a->coll == DT_COLL_BROADCAST && r != a->root) {
        size_t B = a->count * es;
        soff = seg_off(c, a->recvbuf, B);
        if (!soff) soff = (uintptr_t)a->recvbuf | CMA_ADDR;
    }
    dt_cell_publish(c, small ? mine : NULL, small ? myin : 0, soff, roff);
    dt_status st = dt_cell_wait_all(c);
    if (st || maxin == 0) return st;

    const uint8_t *in[DT_MAX_LOCAL];
    if (small) {
        for (int j = 0; j < p; j++) in[j] = dt_cell_of(c, j)->data;
        consume(c, a, in, 0, maxin);
        return DT_OK;
    }
    /* Zero-copy when every buffer that peers must touch is in the segment; a copy by cross-memory attach where every
     * input is there or has its address published */
    bool zc = true, cma = copies(a);
    uint64_t addr[DT_MAX_LOCAL];
    for (int j = 0; j < p; j++) {
        shm_cell *cell = dt_cell_of(c, j);
        uint64_t so = atomic_load_explicit(&cell->off[0], memory_order_relaxed);
        uint64_t ro = atomic_load_explicit(&cell->off[1], memory_order_relaxed);
        bool seg = so && !(so & CMA_ADDR);
        if (input_bytes(a, p, j) && !seg) zc = false;
        if ((input_bytes(a, p, j) && !so) || !(ro & CMA_ADDR)) cma = false;
        if (uses_push(a) && (a->coll == DT_COLL_ALLREDUCE || j == a->root) && !ro) zc = false;
        in[j] = seg ? (const uint8_t *)dt_segment_ptr(c->seg, so) : NULL;
        addr[j] = so & CMA_ADDR ? so & ~CMA_ADDR : 0;
    }
    if (!zc && cma) return run_cma(c, a, in, addr);
    if (!zc) return run_staged(c, a, maxin);
    if (uses_push(a)) {
        uint8_t *out[DT_MAX_LOCAL];
        for (int j = 0; j < p; j++) {
            uint64_t ro = atomic_load_explicit(&dt_cell_of(c, j)->off[1], memory_order_relaxed);
            out[j] = (a->coll == DT_COLL_ALLREDUCE || j == a->root) ? dt_segment_ptr(c->seg, ro) : NULL;
        }
        size_t e0 = dt_block_start(a->count, p, r);
        push_slice(a, p, (uint8_t *const *)in, out, e0, e0 + dt_block_count(a->count, p, r), a->count * es >= STREAM_BYTES);
    } else if (a->coll == DT_COLL_BROADCAST) {
        uint64_t ro = atomic_load_explicit(&dt_cell_of(c, a->root)->off[1], memory_order_relaxed);
        if ((st = bcast_shared(c, a, in, addr, (ro & CMA_ADDR) != 0))) return st;
    } else {
        consume(c, a, in, 0, maxin);
    }
    return dt_group_step(c);
}
