/* ZeRO's shards of the flat store (zero_shards.c). Without expert parallelism one region, the whole store, cut over
 * the data-parallel ranks. With it two: the tensors every data-parallel rank holds, cut over all of them, and this
 * rank's own experts, cut over the ranks holding the same ones (dt_engine_config.expert_comm). A region's tensors
 * lie between the other region's in the store (layer by layer), so a region has its own flat order, the
 * concatenation of its runs of the store, and the shards cut that order. */
#ifndef DTRAIN_ZERO_SHARDS_H
#define DTRAIN_ZERO_SHARDS_H

#include "dtrain/parallel.h"
#include "dtrain/strategy.h"

typedef struct { size_t off, n, v; } dt_zero_seg; /* the store's [off, off + n) at v of its region's order */

typedef struct {
    dt_comm *comm;          /* the ranks that share it out; NULL: this rank alone holds it */
    dt_zero_seg *segs;
    int nsegs;
    size_t total;
    size_t *offs, *counts;  /* each rank's shard (of comm), in the region's order */
    size_t off, n;          /* this rank's */
} dt_zero_region;

typedef struct {
    dt_zero_region r[2];
    int nr;                 /* 1: r[0] is the whole store in its own order (a shard is one run); 2: with experts */
    size_t tail_off, tail_n; /* the store's end that no region holds: a pipeline's last stage's tied copy, left out
                              * (dt_zero_shards_create's leave_copy), else none */
    int *region;            /* per tensor: its region */
    size_t *tv;             /* per tensor: where it starts in its region's order */
    dt_store_range *runs;   /* this rank's shards as runs of the store, region after region */
    int nruns;
} dt_zero_shards;

/* leave_copy: a last stage's tied copy at the store's end (its gradient goes to the first stage, whose values come
 * back after each update) is in no region: no rank keeps its gradient, optimizer state or update. */
dt_status dt_zero_shards_create(const dt_engine_config *c, bool leave_copy, dt_zero_shards *s);
void dt_zero_shards_destroy(dt_zero_shards *s);
int dt_zero_region_size(const dt_zero_region *g);
int dt_zero_region_rank(const dt_zero_region *g);
/* Floats [v, v + n) of region g's order between the store (elements of size bytes at store) and buf: out copies
 * them into buf, else from it. */
void dt_zero_region_copy(const dt_zero_region *g, char *store, char *buf, size_t v, size_t n, size_t size, int out);
/* Where the store's float at off (one of region g's) is in g's order. */
size_t dt_zero_region_at(const dt_zero_region *g, size_t off);
/* DDP's reductions to each shard's owner by region (stages 2 and 3; ddp.c): set once, after dt_ddp_set_experts. */
dt_status dt_ddp_set_region_shards(dt_ddp *d, const dt_zero_shards *sh);
/* The piece of tensor t in rank r's shard (r of its region's comm): the store's [*a, *b). */
void dt_zero_piece(const dt_zero_shards *s, const dt_tensor_info *tensors, int t, int r, size_t *a, size_t *b);

#endif
