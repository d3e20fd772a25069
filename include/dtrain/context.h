/* dtrain context parallelism: a sequence split over the ranks of a group,
 * attention over all of it by passing keys and values around the ring
 * (ring attention, Liu et al. 2023; ring_attention.c). */
#ifndef DTRAIN_CONTEXT_H
#define DTRAIN_CONTEXT_H

#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/pipeline.h" /* the wire codec (dt_pp_wire) attention's messages may travel in */

#ifdef __cplusplus
extern "C" {
#endif

/* The load-balanced split (Llama 3's, Striped Attention's idea): a
 * sequence of T positions in 2N chunks of T/(2N); rank r of N holds chunks r
 * and 2N-1-r, so every rank has as much causal work as any other. A rank's
 * rows are its two chunks, in that order: 2 Tc rows a sequence. The same
 * description serves ring attention and the all-to-all (Ulysses) one. */
typedef struct {
    dt_comm *cp;        /* the context-parallel group, N ranks */
    int B, T, C, NH;    /* sequences, the whole sequence's positions, channels, heads */
    double *waited;     /* NULL, or += the seconds spent waiting on the group (traffic compute did not hide) */
    dt_pp_wire wire;    /* the ring's blocks and their gradients, or the all-to-all's trades, on the wire: f32, bf16 or int8
                         * (a scale a row: of C for the ring, of a rank's head channels for the all-to-all) */
    int ranks;          /* the group's size where cp is NULL: the planner sizes the work space with no group (0: cp's) */
} dt_cp_config;
/* The group's size: cp's, or ranks without one. */
int dt_cp_ranks(const dt_cp_config *c);
/* Rows per chunk, T / (2N); 0 (and an error) when it does not divide. */
int dt_ring_chunk_rows(const dt_cp_config *c);
/* The first position of this rank's chunk i (0 or 1). */
int dt_ring_chunk_pos(const dt_cp_config *c, int rank, int i);
/* Floats of work space forward and backward need: 5 B x 2Tc x 2C (two
 * key/value blocks and three of their gradients: computed, sent, arriving),
 * one block's output, and a coded wire's two messages (out, in). */
size_t dt_ring_work_floats(const dt_cp_config *c);

/* Causal attention of this rank's rows over the whole sequence: qkv
 * [B, 2Tc, 3C] (q, k, v of this rank's rows); out [B, 2Tc, C]; lse
 * [B, 2, NH, Tc] kept for backward. Keys and values go around the ring
 * (to rank r+1, from r-1) while each rank attends to the block in hand;
 * the blocks' results merge by their log-sum-exp. Collective over cp. */
dt_status dt_ring_attention_forward(const dt_cp_config *c, float *out, float *lse, const float *qkv, float *work);
/* dqkv [B, 2Tc, 3C] += the gradient of this rank's rows: each key/value
 * block's gradient follows it around the ring a step behind (sent under the
 * next block's compute), every rank adding its share, and reaches its owner
 * after a whole turn. Collective over cp. */
dt_status dt_ring_attention_backward(const dt_cp_config *c, float *dqkv, const float *dout, const float *out, const float *qkv,
                                     const float *lse, float *work);

/* All-to-all attention (DeepSpeed-Ulysses, Jacobs et al. 2023; ulysses.c):
 * an all-to-all trades this rank's rows of every head for every row of
 * NH/N heads; each rank runs whole-sequence attention on its heads, and a
 * second all-to-all trades back. Rows as the ring's (load-balanced): the
 * same loader serves both. NH and C divisible by N. lse: [B, NH/N, T], the
 * same count as the ring's. Work: dt_ulysses_work_floats. */
size_t dt_ulysses_work_floats(const dt_cp_config *c);
dt_status dt_ulysses_attention_forward(const dt_cp_config *c, float *out, float *lse, const float *qkv, float *work);
dt_status dt_ulysses_attention_backward(const dt_cp_config *c, float *dqkv, const float *dout, const float *out, const float *qkv,
                                        const float *lse, float *work);

/* Context parallelism for a model (context_parallel.c): its dt_cp_ops
 * over a group, by ring or all-to-all, owning the work space they need. */
typedef enum { DT_CP_RING = 0, DT_CP_ULYSSES } dt_cp_impl;
const char *dt_cp_impl_name(dt_cp_impl i);
/* --cp-impl auto: the one that leaves less traffic exposed on n ranks of tl
 * positions each, heads heads a rank (all-to-all needs them divisible by n),
 * at flops (attention's rate, per second), link and mem (bytes per second
 * between ranks and to memory). Per channel: the ring's passes of 8 tl
 * bytes (keys and values, f32) hide under a block's compute, about 2 tl^2
 * flops forward and 5 backward; what does not hide is exposed, n - 1 times
 * a pass, and the last gradient pass and the merges (24 tl bytes of memory
 * traffic a step) are exposed whole. All-to-all moves 48 (n-1)/n tl bytes
 * (q, k, v, out forward; those, dout and the three gradients backward) with
 * nothing to hide under, and attends in one pass. Measured on a 2-core
 * Zen 3 (CP 2): all-to-all 5-7% ahead at 512 and 1024 positions, the two
 * within 1% at 2048 and 8192; on a CPU (link = mem) this picks all-to-all
 * wherever the heads split. At a GPU's rate over a link slower than its
 * memory, long sequences a rank favour the ring. */
dt_cp_impl dt_cp_choose(int n, int heads, int tl, double flops, double link, double mem);
typedef struct dt_cp dt_cp;
/* wire: what the ring's blocks or the all-to-all's trades travel in (--cp-wire) */
dt_status dt_cp_create(dt_comm *cp, dt_cp_impl impl, dt_pp_wire wire, dt_cp **out);
void dt_cp_destroy(dt_cp *c);
const dt_cp_ops *dt_cp_model_ops(dt_cp *c);
/* Seconds in attention (compute and the traffic it did not hide) since the
 * last call; *waited: of them, waiting on the group (the ring's passes that
 * compute did not hide; every all-to-all). */
double dt_cp_attention_seconds(dt_cp *c, double *waited);

#ifdef __cplusplus
}
#endif
#endif
