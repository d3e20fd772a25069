/* The page pool of sharded gradients (ddp.c, for ZeRO-2/3 and a 16-bit
 * gradient store): in a step that synchronises, each bucket's whole pages
 * outside this rank's shard borrow the pages of a small ring in the shared
 * arena, instead of faulting fresh pages in and punching them out again
 * (5 us a page against 0.8). The ring holds any two consecutive buckets'
 * pages: the one in flight and the one backward writes. Internal to
 * src/parallel. */
#ifndef DT_PARALLEL_GRAD_POOL_H
#define DT_PARALLEL_GRAD_POOL_H

#include "dtrain/comm.h"

#include <stdbool.h>
#include <stddef.h>

/* [off, off + count) of the gradient store, in elements */
typedef struct { size_t off, count; } dt_pool_range;
typedef struct dt_grad_pool dt_grad_pool;

/* A pool over store[0, n) for nb buckets, bucket k's ranges nranges[k] of
 * `ranges` (bucket after bucket), lending the whole pages of each outside
 * [s0, s1). Collective. *out is NULL, and there is no pool, unless every
 * rank's store is in the arena at the same page phase (the reductions are
 * then cut at the same page edges on every rank), or with
 * DTRAIN_ZERO_NO_POOL. A pool's pages come when first lent, and stay. */
dt_status dt_grad_pool_create(dt_comm *c, float *store, size_t n, size_t s0, size_t s1, const dt_pool_range *ranges,
                              const int *nranges, int nb, dt_grad_pool **out);
/* Gives the pages back first if any are lent. */
void dt_grad_pool_destroy(dt_grad_pool *p);
/* The store's first page edge at or after element i, and the last at or before it (elements). */
size_t dt_grad_pool_edge_up(const dt_grad_pool *p, size_t i);
size_t dt_grad_pool_edge_down(const dt_grad_pool *p, size_t i);
/* Where element i of bucket k is while lent: the pool's page it borrows, or its own. */
float *dt_grad_pool_where(const dt_grad_pool *p, int k, size_t i);
/* The last bucket in [from, k) whose borrowed pages bucket k's would take, or -1: its reductions must be done
 * before bucket k is lent. */
int dt_grad_pool_blocker(const dt_grad_pool *p, int k, int from);
/* Bucket k's pages borrow the pool's, zeroed (backward adds into them); buckets are lent in order. */
dt_status dt_grad_pool_lend(dt_grad_pool *p, int k);
/* Buckets lent since the last give-back (0 with no pool). */
int dt_grad_pool_lent(const dt_grad_pool *p);
/* The store's pages outside the shard are its own again (holes, mostly); nothing to do with no pool or nothing lent. */
dt_status dt_grad_pool_give_back(dt_grad_pool *p);
/* Bytes of the pool resident (0 with no pool). */
size_t dt_grad_pool_resident(const dt_grad_pool *p);

#endif
