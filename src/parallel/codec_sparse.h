/* A sparse codec's bucket as its two exchanges see it (codec_topk.c selects and runs the allgather; codec_oktopk.c
 * runs Ok-TopK's reduce then allgather): this rank's chosen (index, value) pairs, ascending, and where each of the
 * bucket's entries lives in the table. */
#ifndef DTRAIN_CODEC_SPARSE_H
#define DTRAIN_CODEC_SPARSE_H

#include "codec_internal.h"

#include <stdint.h>
#include <string.h>

typedef struct dt_oktopk dt_oktopk;
typedef struct dt_sparse_hier dt_sparse_hier;

/* The hierarchical exchange's groups: this rank's machine (node) and the ranks of the same local rank on every machine
 * (cross), split from the codec's communicator once. */
typedef struct {
    dt_comm *node, *cross;
    int made;
} dt_sparse_groups;

typedef struct {
    int *t;              /* the table's tensors, in the bucket's order */
    size_t *at;          /* each one's first entry in the bucket's numbering (n + 1: the last is len) */
    int n;
    size_t len, k, kmax; /* the bucket's entries, how many a rank sends this step, and at most */
    float *sample, *mag, *work; /* scratch: the strided sample's magnitudes; the candidates', and a copy to select in */
    size_t *cand;        /* the candidates' entries (ascending), cap of them */
    size_t cap;
    uint64_t *pairs;     /* this rank's k pairs (dt_sparse_pack), ascending by index; the allgather's: then every rank's */
    float *uval;         /* DGC: the chosen entries' velocities before they were zeroed (Ok-TopK may put them back) */
    dt_sparse_exchange exchange; /* this bucket's (auto resolved at its first exchange) */
    dt_oktopk *ok;       /* Ok-TopK's state across steps */
    dt_sparse_hier *hier; /* the hierarchical exchange's buffers */
    int busy;
} dt_sparse_bucket;

/* Where entry e of the bucket lives: tensor *i (advanced from where it is: entries come ascending) at index *j. */
static inline void dt_sparse_locate(const dt_sparse_bucket *p, size_t e, int *i, size_t *j) {
    while (e >= p->at[*i + 1]) (*i)++;
    *j = e - p->at[*i];
}

/* A pair as it travels: the entry's index in the low word, the value's bits in the high. */
static inline uint64_t dt_sparse_pack(uint32_t e, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (uint64_t)e | (uint64_t)bits << 32;
}

static inline float dt_sparse_value(uint64_t x) {
    uint32_t bits = (uint32_t)(x >> 32);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The k-th largest of x[0..n) (1 <= k <= n), x reordered. */
float dt_sparse_kth_largest(float *x, size_t n, size_t k);

/* The top kk of bucket p's entries [lo, hi) by the magnitude of their residual (ties: the earlier first) into
 * p->pairs[0..kk), ascending; their residuals (DGC: and velocities, kept in p->uval) zeroed. */
dt_status dt_sparse_choose(dt_codec *k, dt_sparse_bucket *p, size_t lo, size_t hi, size_t kk);

/* Whether comm spans machines that hold equal rank counts (collective: every rank of comm calls it). */
dt_status dt_sparse_hier_fits(dt_comm *comm, int *fits);
dt_status dt_sparse_groups_make(dt_comm *comm, dt_sparse_groups *gr);
void dt_sparse_groups_destroy(dt_sparse_groups *gr);
/* The hierarchical exchange (codec_hier.c): the bucket summed inside each machine (a reduce-scatter: each local rank a
 * slice), each slice's top k with its residual sent between machines (an allgather among the ranks of that slice),
 * the slices gathered back inside the machine. start packs the bucket and issues the first collective; next as
 * dt_codec_next. */
dt_status dt_sparse_hier_start(dt_codec *k, dt_sparse_groups *gr, dt_sparse_bucket *p, float *g, dt_request **req);
dt_status dt_sparse_hier_next(dt_codec *k, dt_sparse_groups *gr, dt_sparse_bucket *p, float *g, dt_request **req, int *done);
int dt_sparse_hier_next_collective(const dt_sparse_bucket *p);
void dt_sparse_hier_destroy(dt_sparse_hier *h);
/* The bytes of its buffers for a bucket of len entries sending at most kmax pairs, l ranks a machine on q machines:
 * the bucket packed, a slice of it, every machine's pairs for the slice; and those h holds (NULL: none yet). */
size_t dt_sparse_hier_bytes(size_t len, size_t kmax, int l, int q);
size_t dt_sparse_hier_held(const dt_sparse_hier *h, size_t len, size_t kmax);

/* Bucket p's pairs (chosen, their residuals zeroed) through Ok-TopK: start issues the first collective; next follows
 * each as dt_codec_next does, and at the end writes the average into g and puts back into the residual (and DGC's
 * velocity) what this rank chose and the global selection did not. */
dt_status dt_oktopk_start(dt_codec *k, dt_comm *comm, dt_sparse_bucket *p, dt_request **req);
dt_status dt_oktopk_next(dt_codec *k, dt_comm *comm, dt_sparse_bucket *p, float *g, dt_request **req, int *done);
int dt_oktopk_next_collective(const dt_sparse_bucket *p);
void dt_oktopk_destroy(dt_oktopk *o);
/* Its state across steps (the regions, the global threshold: the same on every rank) as 32-bit words for a checkpoint:
 * how many, written out, and read back (*used words; *out NULL where it had none; DT_ERR_IO where they make no state). */
size_t dt_oktopk_state_words(const dt_oktopk *o);
void dt_oktopk_state_out(const dt_oktopk *o, uint32_t *w);
dt_status dt_oktopk_state_in(const uint32_t *w, size_t n, dt_oktopk **out, size_t *used);
/* The entries its regions cover (a bucket's length). */
size_t dt_oktopk_entries(const dt_oktopk *o);

#endif
