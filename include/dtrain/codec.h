/* dtrain codec: gradients averaged over the data-parallel ranks in fewer bytes than they hold. DDP hands a codec each
 * bucket as its gradients are final, as the tensors of the model's table (their shapes: a codec sees matrices, not a
 * flat range); the codec runs the bucket's exchange in phases, each at most one nonblocking collective, and keeps what
 * it learns across steps per tensor (a residual for error feedback, PowerSGD's Q) where checkpoints can reach it.
 * See docs/architecture.md, "Gradient compression". */
#ifndef DTRAIN_CODEC_H
#define DTRAIN_CODEC_H

#include "dtrain/comm.h"
#include "dtrain/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_CODEC_NONE = 0, DT_CODEC_POWERSGD, DT_CODEC_TOPK, DT_CODEC_DGC, DT_CODEC_ONEBIT, DT_CODEC_ZEROONE } dt_codec_kind;

/* How top-k's and DGC's pairs travel: every rank's to every rank (one allgather); Ok-TopK's reduce then allgather
 * over balanced regions with a global threshold (Li and Hoefler 2022); hierarchical (top-k only): summed dense inside
 * each machine, each local rank's slice sparse between machines; auto: the cost model's pick, bucket by bucket. */
typedef enum { DT_SPARSE_AUTO = 0, DT_SPARSE_ALLGATHER, DT_SPARSE_OKTOPK, DT_SPARSE_HIER } dt_sparse_exchange;

typedef struct {
    dt_codec_kind kind;
    int rank;        /* PowerSGD: the approximation's rank R */
    int start;       /* the steps averaged whole before compression starts (0: from the first); 1-bit Adam's warm-up */
    float min_rate;  /* PowerSGD: a [n, m] matrix is compressed when (n + m) R x min_rate < n m, else sent whole */
    float density;   /* top-k, DGC: the share of a bucket's entries each rank sends, in (0, 1] */
    int warmup;      /* top-k, DGC: steps at each warm-up density (0.25, 0.0625, 0.015625, 0.004) from the start (0: none) */
    float momentum;  /* DGC: SGD's momentum, accumulated on each rank (momentum correction): the optimizer runs without */
    int nesterov;    /* DGC: SGD's Nesterov form of it */
    float clip;      /* DGC: each tensor's gradient clipped to this norm on its rank before it is accumulated (0: none) */
    float weight_decay; /* DGC: SGD's weight decay, added to the gradient before clipping and momentum (dt_codec_set_model) */
    dt_sparse_exchange exchange; /* top-k, DGC: how the pairs travel */
    int refresh;     /* Ok-TopK: steps between recomputing its regions and its global threshold (0: 32) */
    float beta1;     /* 1-bit Adam: Adam's beta1 (its momentum, which is what travels) */
    /* 0/1 Adam (start: the last step that may update the variance, DeepSpeed's var_freeze_step): the variance is
     * updated at steps spaced 1, 2, 4, ... apart, var_scaler updates at each spacing (its kappa: 16); past start the
     * ranks step alone and average their momenta every 1, 2, 4, ... steps, local_scaler steps at each interval
     * (32678), the interval at most local_clip (its H: 16) */
    int var_scaler, local_scaler, local_clip;
    uint64_t seed;   /* the first Q's values (the same on every rank) */
} dt_codec_config;

/* Each tensor's state across steps, as checkpoints and tests reach it: the residual (error feedback; DGC's accumulated
 * velocity; 1-bit Adam's worker error), the velocity (DGC's momentum u; 1-bit Adam's momentum m) and the server error
 * (1-bit Adam's, the entries of the chunks this rank reduces) are each rank's own, Q (PowerSGD) the same on every rank. */
typedef enum { DT_CODEC_RESIDUAL = 0, DT_CODEC_Q, DT_CODEC_VELOCITY, DT_CODEC_SERVER, DT_CODEC_NSTATES } dt_codec_state_kind;

/* What one step's exchanges sent: elements the tensors hold, elements that travelled, bytes on the wire. */
typedef struct {
    size_t before, after;
    double bytes;
    double received; /* bytes of the other ranks' payloads this rank received (the sparse exchanges'; 0: not counted) */
} dt_codec_stats;

typedef struct dt_codec dt_codec;

/* "powersgd" -> DT_CODEC_POWERSGD, "topk", "dgc", "onebit", "zeroone" ("none": DT_CODEC_NONE); DT_ERR_ARG naming the codecs otherwise. */
dt_status dt_codec_parse(const char *s, dt_codec_kind *out);
const char *dt_codec_name(dt_codec_kind k);
/* The cost model's seconds for k pairs a rank over P ranks on a link of alpha seconds a message and beta a byte: the
 * allgather at its best (log2 P rounds, k (P - 1) pairs received) and Ok-TopK (four collectives, two of them P - 1
 * exchanges; about k (P - 1) / P pairs reduced and as many gathered). auto takes Ok-TopK where it is faster: never
 * on 2 ranks (the same pairs in more rounds). */
void dt_codec_sparse_times(double P, double k, double alpha, double beta, double *gather, double *oktopk);
/* The hierarchical exchange's seconds for a bucket of n entries and k pairs a rank, q machines of l ranks: a
 * reduce-scatter and an allgather of the dense bucket inside the machine (ia, ib), an allgather of k / l pairs a rank
 * between machines (xa, xb) at log2 q rounds. */
double dt_codec_hier_time(double l, double q, double n, double k, double ia, double ib, double xa, double xb);
/* "auto", "allgather", "oktopk", "hier" -> dt_sparse_exchange; DT_ERR_ARG naming them otherwise. */
dt_status dt_codec_parse_exchange(const char *s, dt_sparse_exchange *out);
const char *dt_codec_exchange_name(dt_sparse_exchange e);
/* Checks c (the rank, the start) and makes a codec over the table t[0..nt). */
dt_status dt_codec_create(const dt_codec_config *c, const dt_tensor_info *t, int nt, dt_codec **out);
void dt_codec_destroy(dt_codec *k);
/* Whether the codec takes this step's buckets: from the start step on (before it they are averaged whole, by their
 * owner), or from the first where the codec runs its own warm-up (1-bit Adam: Adam's, which tracks the momentum). */
int dt_codec_active(const dt_codec *k);
/* Bucket b (a number that names it across steps), the table's tensors idx[0..n) of the gradient store g, averaged over
 * comm: start issues the first collective (*req; NULL where none is needed), next is called once *req is done and issues
 * the next (*done 0) or finishes the average in place (*done 1). *collective says whether next issues a collective:
 * every rank must then call it at the same point of its sequence of collectives (DDP: in bucket order). The same idx
 * every step for a b. */
dt_status dt_codec_start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, dt_request **req);
dt_status dt_codec_next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done);
int dt_codec_next_collective(const dt_codec *k, int b);
/* A step's exchanges are done: the statistics are this step's, the step count advances. */
void dt_codec_end_step(dt_codec *k, dt_codec_stats *s);
/* Tensor i's state s (*n floats); made on first use (a residual of zeros; a Q as given: the caller fills it, and no
 * first Q is drawn for it). NULL where the tensor has none (a Q of a tensor sent whole) or out of memory (*n 0). */
float *dt_codec_state(dt_codec *k, int i, dt_codec_state_kind s, size_t *n);
/* Checkpoints: whether there is state to keep (a step was taken by the codec: every state exists), the floats of every
 * tensor's state s in the table's order, and copying them out to buf (load 0) or in from it (load 1). */
int dt_codec_has_state(const dt_codec *k);
size_t dt_codec_state_size(const dt_codec *k, dt_codec_state_kind s);
/* Bytes of every state held (0 before the codec's first step, or with k NULL): a run's memory counts them with its
 * communication buffers. */
size_t dt_codec_state_bytes(const dt_codec *k);
/* Bytes of its buckets' buffers (their exchanges and scratch: 1-bit Adam's packed bucket and signs, PowerSGD's P and Q,
 * top-k's pairs and candidates) made so far (k NULL: 0); and what the buckets of nt tensors t would make placed as at says
 * (the planner's: top-k's per bucket, the sparse exchange the one auto would pick; the others see the model as one
 * bucket, a run's several adding a few words each). */
size_t dt_codec_work_bytes(const dt_codec *k);
/* Whether codec c runs with the optimizer kind opt (a dt_optim_kind), clipping at grad_clip (0: none) and a loss
 * scale: 1-bit Adam is Adam's and sends its momentum (no gradient whole to clip, unscaled); DGC corrects SGD's momentum
 * on each rank from the first step. Said by flag where not (train and plan alike). */
dt_status dt_codec_check_optimizer(const dt_codec_config *c, int opt, float grad_clip, int loss_scaled);
/* Whether codec c runs under the strategy of that name ("ddp", "zero1", ..; NULL: data parallelism's): 0/1 Adam's
 * local steps need each rank's whole optimizer state, which ZeRO shards. */
dt_status dt_codec_check_strategy(const dt_codec_config *c, const char *strategy);
/* Where the planner puts a codec: on ranks ranks over nodes machines (of equal counts), in buckets of lens[0..nbuckets)
 * entries (dt_ddp_bucket_lens; none: the model as one). */
typedef struct {
    int ranks, nodes;
    const size_t *lens;
    int nbuckets;
} dt_codec_place;
size_t dt_codec_work_bytes_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at);
dt_status dt_codec_state_io(dt_codec *k, dt_codec_state_kind s, float *buf, int load);
/* State a codec keeps per bucket, the same on every rank (Ok-TopK's regions and global threshold), as floats holding
 * 32-bit words: how many (0: none), and copying them out (load 0: n must be the size) or in (load 1: a checkpoint's,
 * held until each bucket's first exchange; DT_ERR_IO where they describe no state). */
size_t dt_codec_shared_size(const dt_codec *k);
dt_status dt_codec_shared_io(dt_codec *k, float *buf, size_t n, int load);
/* The model whose parameters DGC's weight decay reads (m->params(m->self), called at each bucket: a store that moves,
 * ZeRO's shared one, is followed; dt_ddp_set_codec gives its own). m must outlive the codec's use. */
void dt_codec_set_model(dt_codec *k, const dt_model *m);
/* A sparse codec's density at step (counted from the run's first): the warm-up's, then c->density. */
double dt_codec_density_at(const dt_codec_config *c, int step);
/* The settings a codec's state depends on (a checkpoint's is resumed only by the same). */
const dt_codec_config *dt_codec_get_config(const dt_codec *k);
/* The steps taken (compressed or not), and setting it (a resumed run). 1-bit Adam: from the start step on the optimizer
 * takes the averaged momentum in the gradient's place, with its variance frozen (dt_optim_freeze_variance). */
int dt_codec_steps(const dt_codec *k);
void dt_codec_set_steps(dt_codec *k, int steps);

/* 0/1 Adam (Lu et al. 2022, DeepSpeed's ZeroOneAdam; codec_zeroone.c). What step t (1 the run's first) does: up to
 * c->start, the gradient averaged whole where the variance is updated and in one bit an entry elsewhere (the momentum
 * and, at variance steps, the variance take it); past it, no exchange: each rank steps from its own gradient and
 * accumulates its steps' momenta, and at the end of each interval (sync) the accumulations are averaged in one bit and
 * every rank's weights and momentum made one (dt_codec_zeroone_sync). */
typedef struct {
    int local;      /* t > c->start: the ranks step alone */
    int variance;   /* the variance is updated (the gradient averaged whole) */
    long nvar;      /* the variance's updates up to and including step t, as planned (the optimizer counts those run) */
    int sync;       /* a local step that ends its interval */
} dt_zeroone_step;
void dt_codec_zeroone_at(const dt_codec_config *c, long t, dt_zeroone_step *out);
/* Of steps 1..steps, those that average the gradient whole (*whole: the variance's) and those that send signs (*signs:
 * the momentum's, and the local intervals' ends), as dt_codec_zeroone_at has them, counted by the plan's stretches (not
 * step by step: a planner asks it for every layout it weighs). */
void dt_codec_zeroone_mix(const dt_codec_config *c, long steps, long *whole, long *signs);
/* The interval's accumulation u (a store laid out as the gradients', the codec's buckets' tensors) averaged over comm in
 * one bit an entry, in place, every rank blocking until done; what it sent added to *s. The codec's buckets must have
 * run one step. */
dt_status dt_codec_zeroone_sync(dt_codec *k, float *u, dt_codec_stats *s);

#ifdef __cplusplus
}
#endif
#endif
