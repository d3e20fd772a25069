/* What a gradient codec implements (the shell, codec.c, keeps its per-tensor state, its step count and statistics). */
#ifndef DTRAIN_CODEC_INTERNAL_H
#define DTRAIN_CODEC_INTERNAL_H

#include "dtrain/codec.h"

typedef struct {
    size_t impl_size;  /* the codec's own state (dt_codec.impl), made zeroed with the codec */
    int own_warmup;    /* takes every step's buckets, the ones before the start step too (1-bit Adam's warm-up) */
    dt_status (*check)(const dt_codec_config *c);
    /* floats of tensor t's state s (0: it has none) */
    size_t (*state_floats)(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s);
    /* first: bucket b's first exchange (its tensors to set up for) */
    dt_status (*start)(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req);
    dt_status (*next)(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done);
    int (*next_collective)(const dt_codec *k, int b);
    void (*destroy)(dt_codec *k);
    /* state kept per bucket, the same on every rank (Ok-TopK's regions and threshold), as 32-bit words; NULL: none */
    size_t (*shared_words)(const dt_codec *k);
    dt_status (*shared_io)(dt_codec *k, uint32_t *w, size_t n, int load);
    /* The bytes its buckets' buffers hold (exchanges, scratch): made so far (work), or for one bucket of nt tensors
     * t placed as at says (work_for: the planner's) */
    size_t (*work)(const dt_codec *k);
    size_t (*work_for)(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at);
} dt_codec_ops;

struct dt_codec {
    dt_codec_config c;
    const dt_codec_ops *ops;
    void *impl;                       /* the codec's own (its buckets): ops->impl_size bytes */
    const dt_tensor_info *t;
    int nt;
    float **state[DT_CODEC_NSTATES];  /* per tensor; NULL until made */
    int steps;
    dt_codec_stats now;               /* this step's, so far */
    dt_comm *comm;                    /* the one its buffers came from */
    const dt_model *model;            /* its parameters (DGC's weight decay; NULL: none given) */
    /* each bucket's tensors as its first exchange named them (a bucket holds the same ones every step) */
    struct { int *idx, n; } *buckets;
    int nbuckets;
};

/* *arr (of *n elements of size bytes) grown to hold element b, the new ones zeroed. */
dt_status dt_codec_grow(void **arr, int *n, size_t size, int b);
/* A bucket's tensors idx[0..n) end to end: *t a copy of idx, (*at)[i] tensor i's first entry in the bucket, (*at)[n] and
 * *len its entries (the caller frees *t and *at). */
dt_status dt_codec_layout(const dt_codec *k, const int *idx, int n, int **t, size_t **at, size_t *len);

extern const dt_codec_ops dt_codec_powersgd, dt_codec_topk, dt_codec_onebit, dt_codec_zeroone; /* top-k's serves DGC too (its rules: codec_dgc.c) */

/* DGC: tensor g's n entries, plus c->weight_decay times its parameters p (NULL: none), clipped to c->clip, into its
 * velocity u and accumulation v (momentum correction). */
void dt_dgc_accumulate(const dt_codec_config *c, const float *g, const float *p, float *u, float *v, size_t n);
/* The largest density any step of c sends (the warm-up's first, or c->density). */
float dt_codec_density_max(const dt_codec_config *c);

/* Tensor i's state s if made, else NULL. */
static inline float *dt_codec_state_held(const dt_codec *k, int i, dt_codec_state_kind s) { return k->state[s][i]; }

#endif
