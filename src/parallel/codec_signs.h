/* The error-compensated two-stage sign allreduce that 1-bit Adam (codec_onebit.c) and 0/1 Adam (codec_zeroone.c)
 * send their vectors by: a bucket's entries split into one chunk a rank; each rank's x plus its worker error e_w sent
 * as signs times a scale a segment (a tensor's part of a chunk), chunk j to rank j (one alltoall); rank j averages the
 * ranks' pieces in rank order, adds its server error e_s and sends the result the same way (one allgather). Both errors
 * are the codec's per-tensor states (DT_CODEC_RESIDUAL, DT_CODEC_SERVER), so checkpoints keep them. */
#ifndef DTRAIN_CODEC_SIGNS_H
#define DTRAIN_CODEC_SIGNS_H

#include "codec_internal.h"

typedef struct {
    int *t;              /* the table's tensors, in the bucket's order */
    size_t *at;          /* each one's first entry in the bucket's numbering (n + 1) */
    int n;
    size_t len, chunk;   /* the bucket's entries; a chunk's (the last ones shorter, maybe empty) */
    size_t *seg;         /* the segments' first entries, ascending, then len: every tensor's and chunk's start */
    int *first;          /* chunk j's segments: seg[first[j]] .. seg[first[j + 1]] */
    size_t slots, words; /* a message: a scale a segment (slots), then a chunk's signs, 32 a word */
    float *dense;        /* the bucket packed: a whole allreduce's; x, then e_w; the server's chunk; the result decoded */
    uint32_t *send, *recv, *all; /* the alltoall's blocks out and in; the allgather's (own block first) */
    int phase;           /* what is in flight (DT_SIGNS_*) */
} dt_signs_bucket;

/* A bucket's phase: idle; a whole allreduce, the alltoall or the allgather in flight; a step that sends nothing. */
enum { DT_SIGNS_IDLE, DT_SIGNS_WHOLE, DT_SIGNS_ALLTOALL, DT_SIGNS_ALLGATHER, DT_SIGNS_NONE };

/* A codec's buckets by number: its impl (1-bit Adam's, 0/1 Adam's). */
typedef struct {
    dt_signs_bucket *b;
    int nb;
} dt_signs_set;

/* Bucket b of codec k's set, made on its first exchange (first) over the table's tensors idx[0..n); refused while
 * an exchange of it is in flight. */
dt_status dt_signs_bucket_at(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, int first, dt_signs_bucket **out);
/* Bucket b's exchange (in flight) one stage on: after the alltoall the server's stage is issued (*out NULL: *req is
 * to wait for); else the signs sent are decoded into the bucket's dense (the average), and *out is the bucket for the
 * codec to read and set idle. */
dt_status dt_signs_next(dt_codec *k, dt_comm *comm, int b, dt_request **req, dt_signs_bucket **out);
/* The set's ops: the alltoall is the phase whose next issues a collective; the buffers given back; their bytes. */
int dt_signs_next_collective(const dt_codec *k, int b);
void dt_signs_destroy(dt_codec *k);
size_t dt_signs_work(const dt_codec *k);
size_t dt_signs_work_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at);

/* The bucket's tensors of store g packed into p->dense and averaged whole by one allreduce (summed: the caller divides). */
dt_status dt_signs_dense(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, const float *g, dt_request **req);
/* p->dense holds x: x + e_w sent as signs (e_w kept, the alltoall issued). */
dt_status dt_signs_send(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, dt_request **req);
/* Once the alltoall is done: this rank's chunk averaged plus e_s, sent again (e_s kept, the allgather issued). */
dt_status dt_signs_serve(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, dt_request **req);
/* Once the allgather is done: the average, the same on every rank, into p->dense. */
void dt_signs_decode(dt_signs_bucket *p, int np);

#endif
