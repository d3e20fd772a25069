/* dtrain parallel layer: the strategies over the engine's seam (DDP, ZeRO 1/2/3) and the mesh; tensor, pipeline
 * and context parallelism have their own headers (pipeline.h, context.h). */
#ifndef DTRAIN_PARALLEL_H
#define DTRAIN_PARALLEL_H

#include "dtrain/codec.h"
#include "dtrain/comm.h"
#include "dtrain/strategy.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device mesh (mesh.c): the world as a grid of named axes, outermost first (world rank = the coordinates' mixed
 * radix), with a communicator along each axis (the ranks that differ only in that coordinate, ranked by it) and, for
 * any set of axes, the group of ranks that differ only along them. Collective over the world; the sizes must
 * multiply to its size; at most DT_MESH_MAX_AXES axes (room for the experts' "ep" beside the training mesh's). */
#define DT_MESH_MAX_AXES 8
typedef struct {
    const char *name; /* "dp", "tp", "pp", "cp", "ep" (kept as given: a literal, or a string that outlives the mesh) */
    int size;
} dt_mesh_axis;
typedef struct dt_mesh dt_mesh;
dt_status dt_mesh_create_axes(dt_comm *world, const dt_mesh_axis *axes, int n, dt_mesh **out);
void dt_mesh_destroy(dt_mesh *m);
int dt_mesh_axes(const dt_mesh *m);
const dt_mesh_axis *dt_mesh_axis_at(const dt_mesh *m, int k);
int dt_mesh_axis_index(const dt_mesh *m, const char *name); /* -1: none */
int dt_mesh_axis_coord(const dt_mesh *m, int k);
dt_comm *dt_mesh_axis_comm(const dt_mesh *m, int k);
/* The ranks that differ only along the n named axes, ranked by those coordinates (mixed radix in the mesh's order);
 * a new communicator (the caller destroys it). Collective over world. */
dt_status dt_mesh_group(const dt_mesh *m, dt_comm *world, const char *const *names, int n, dt_comm **out);

/* The training mesh: DP x PP x CP x TP as axes pp, dp, cp, tp (outermost first): TP innermost (consecutive ranks),
 * then CP, DP, and PP outermost. dp * tp * pp * cp must be the world's size. Its axes by dt_mesh_dim (an axis a
 * mesh lacks: size 1, coordinate 0, no communicator). */
typedef enum { DT_MESH_DP = 0, DT_MESH_TP, DT_MESH_PP, DT_MESH_CP, DT_MESH_DIMS } dt_mesh_dim;
dt_status dt_mesh_create(dt_comm *world, int dp, int tp, int pp, int cp, dt_mesh **out);
int dt_mesh_size(const dt_mesh *m, dt_mesh_dim d);
int dt_mesh_coord(const dt_mesh *m, dt_mesh_dim d);
dt_comm *dt_mesh_comm(const dt_mesh *m, dt_mesh_dim d);
/* The ranks holding the same part of the model, the group over dp and cp (ranked dp * CP + cp): context-parallel
 * ranks compute gradients of the same weights from different rows, so gradients are averaged over both axes. */
dt_comm *dt_mesh_replicas(const dt_mesh *m);

/* A weights file's whole model from a run whose model is split (TP slices,
 * PP stages; whole_model.c): on world's rank 0, *whole is the whole model
 * with the parameters the mesh's ranks hold (NULL on the others). Collective
 * over world, the mesh's; a sharded strategy materializes its parameters
 * first. */
dt_status dt_mesh_gather_gpt2(const dt_mesh *mesh, dt_comm *world, dt_gpt2 *part, dt_gpt2 **whole);

/* Tensor parallelism's collectives over the TP communicator tp, for the
 * model's part (dt_model_part.tp); tp must outlive the model. */
dt_tp_ops dt_tp_ops_over(dt_comm *tp);

/* A tensor-parallel group's tensors whole on each of its ranks (tp_whole.c), for what preconditions whole matrices
 * (K-FAC, Shampoo): model m is the rank's (its slices), tp its group. Collective over tp (it makes its own
 * communicator from it); m outlives it. */
typedef struct dt_tp_whole dt_tp_whole;
dt_status dt_tp_whole_create(const dt_model *m, dt_comm *tp, dt_tp_whole **out);
void dt_tp_whole_destroy(dt_tp_whole *w);
/* The whole model as a preconditioner sees it: the whole tensors at their places in the whole store (goffset), its
 * Linears whole, and an observer of them that is shown whole values (a row-parallel Linear's inputs and a
 * column-parallel one's output gradients gathered over the group: a collective inside forward and backward). */
void dt_tp_whole_model(dt_tp_whole *w, dt_model *out);
/* Collective: every tensor of the rank's store local whole in whole (the whole store's layout); and back, this rank's
 * slices of whole into local. */
dt_status dt_tp_whole_gather(dt_tp_whole *w, const float *local, float *whole);
void dt_tp_whole_scatter(const dt_tp_whole *w, const float *whole, float *local);
/* inner (made over dt_tp_whole_model's view) as a preconditioner of the rank's slices: each step's gradients made
 * whole, preconditioned, and the rank's slices taken back; its state saved by the group's first rank. */
void dt_tp_whole_preconditioner(dt_tp_whole *w, const dt_preconditioner *inner, dt_preconditioner *out);
/* Expert parallelism's exchanges (dt_ep_ops) over the expert-parallel group's communicator. */
dt_ep_ops dt_ep_ops_over(dt_comm *ep);
/* A micro-batch's sums (dt_part_sums) over c: the ranks holding its other parts (stages, context-parallel ranks). */
dt_part_sums dt_part_sums_over(dt_comm *c);

/* Whether ZeRO's ranks of the data-parallel communicator dp keep one
 * shared copy of the parameters (zero.c): all of them on one machine, over
 * its shared memory, unless DTRAIN_ZERO_PRIVATE_PARAMS=1 gives each its own. */
int dt_zero_shares_params(dt_comm *dp);

typedef struct dt_ddp dt_ddp;

/* Moves the model's gradients into the communicator's shared arena (so
 * every allreduce is zero-copy), groups them into buckets in the order
 * backward produces them (the table's grad_unit; the first bucket_first
 * bytes, or bucket_bytes if smaller, then up to bucket_bytes each), and
 * hooks backward so that each bucket's nonblocking allreduce (average)
 * starts the moment its last gradient is written. A table tensor marked
 * input_rows is averaged early without its input rows, which are exchanged
 * at the end (the model must offer defer_input_rows and input_grad).
 * ZeRO-2/3 pass shards (rank r: [shard_offs[r], + shard_counts[r]), tiling
 * the store in rank order; the arrays must outlive d; NULL for DDP): each
 * bucket is then reduced to the owners of the shards it crosses instead of
 * allreduced, and once done, its other shards' parts go back (to a pool of
 * pages for two buckets where the store is in the shared arena, else to the
 * system): a rank holds only its shard of the averaged gradient and the
 * buckets in flight. Micro-steps that do not synchronise (gradient
 * accumulation) add up the whole gradient locally first, as PyTorch's
 * no_sync does. */
dt_status dt_ddp_create(dt_comm *c, const dt_model *m, size_t bucket_first, size_t bucket_bytes, const size_t *shard_offs,
                        const size_t *shard_counts, dt_ddp **out);
void dt_ddp_destroy(dt_ddp *d);
/* The entries of each bucket dt_ddp_create would make over m's table, in backward's order, and (last_unit, if not
 * NULL) the unit whose backward closes it: with a codec running (defer_rows false: no rows deferred) or dense DDP's
 * (true: a deferrable table's rows left to the end, its bucket closed by its earlier unit). How many buckets (the
 * arrays hold the first cap), or -1 out of memory. The planner's. */
int dt_ddp_bucket_lens(const dt_model *m, size_t bucket_first, size_t bucket_bytes, bool defer_rows, size_t *lens, int *last_unit,
                       int cap);

/* The optimizer in backward: with an elementwise optimizer (SGD, AdamW;
 * dt_optim_elementwise), each bucket is updated (params, gradients zeroed)
 * as soon as its allreduce is done, ranks taking turns at unit boundaries,
 * instead of by a dt_optim_step after finish. NULL turns it off. The
 * results are exactly dt_optim_step's. Not for gradient clipping, which
 * needs the global norm before any update. o covers [off, off+n) of the
 * store (everything for DDP; this rank's shard for ZeRO-1, which then
 * updates only that part of each bucket). */
dt_status dt_ddp_set_optimizer(dt_ddp *d, dt_optim *o, float *params, size_t off, size_t n);
/* The same for a slice of several runs of the store (dt_strategy.ranges), o's state holding them side by side in this
 * order (runs must live as long as d). */
dt_status dt_ddp_set_optimizer_runs(dt_ddp *d, dt_optim *o, float *params, const dt_store_range *runs, int nruns);
/* The gradients' type in the allreduce: DT_F32 (the default), or DT_BF16 /
 * DT_F16 (half the bytes; each bucket is narrowed in place before its
 * allreduce, which sums in f32 and rounds the average once, and widened
 * after). Without shards only. */
dt_status dt_ddp_set_wire(dt_ddp *d, dt_dtype t);
/* Expert parallelism: the table's DT_GROUP_EXPERT tensors (an expert-parallel rank's own experts) average over ec, the
 * ranks holding the same experts (NULL: no other rank does), as a share 1/ep: each expert's gradient holds the tokens
 * of the ep ranks that route to it, so the divisor is still the data-parallel ranks'. Not with shards or a 16-bit store. */
dt_status dt_ddp_set_experts(dt_ddp *d, dt_comm *ec, int ep);
/* A pipeline's last stage holds a copy of the tied token table whose gradient has gone to the first stage (which owns
 * it) and is zero here before the buckets reduce: they leave it out (no wte-sized allreduce of zeros each step). DDP's,
 * which updates everything but the copy; without shards, a 16-bit store or a codec (whose buckets borrow pooled pages
 * or hold the codec's tensors), where it changes nothing. Before dt_ddp_set_codec. */
dt_status dt_ddp_leave_out_tied_copy(dt_ddp *d);
/* A codec (codec.h) averages the buckets from its start step on, each bucket's tensors handed to it as backward
 * finishes them (a tied embedding's rows are then not deferred: the codec sees its whole gradient). Once, right after
 * create; d does not own k, and hands it the model's parameters (dt_codec_set_model). With shards every rank decodes
 * a bucket whole, keeps its shard and gives the rest back. Not with experts spread over ranks or 16-bit gradients. */
dt_status dt_ddp_set_codec(dt_ddp *d, dt_codec *k);
/* The 16-bit gradient store (t: DT_BF16 or DT_F16; once, right after
 * create, never with the optimizer in backward): the gradients travel in t
 * (the wire), and once a bucket's reduction ends, the part of its average
 * in [off, off+n) (the optimizer's window) is copied into a dense 16-bit
 * array, dt_ddp_grad_store's, and its f32 pages go back to the pool: the
 * f32 store holds only the buckets in flight (micro-steps that do not
 * synchronise still add up in f32 pages). The optimizer reads the array
 * after finish, and zeroes it. Model states: 2 bytes of gradient per
 * parameter of the window instead of 4 of the whole model. */
dt_status dt_ddp_set_grad_store(dt_ddp *d, dt_dtype t, size_t off, size_t n);
/* The 16-bit store (window [off, off+n) of dt_ddp_set_grad_store), its type in *t; NULL if none. */
uint16_t *dt_ddp_grad_store(dt_ddp *d, dt_dtype *t);
/* Bytes of gradients resident on this rank: the f32 store's pages (measured) and the 16-bit store's. */
size_t dt_ddp_grads_held(const dt_ddp *d);
/* Before a micro-step: sync DT_MICRO_ACCUMULATE (0) for the gradient-accumulation micro-steps that do not synchronise,
 * DT_MICRO_SYNC (1) for the last, DT_MICRO_FORWARD for a pipeline's forward alone (it touches no gradient); lr: the
 * step's learning rate, for the optimizer in backward. */
void dt_ddp_begin(dt_ddp *d, int sync, float lr);
/* Waits for the step's allreduces (and with the optimizer in backward,
 * finishes the update); r->exposed_ms gets the time spent waiting
 * (communication that backward did not hide), of which
 * r->exposed_in_backward_ms inside backward; r->norm the L2 norm of the
 * averaged gradients in the optimizer's window when it ran in backward,
 * else -1. */
dt_status dt_ddp_finish(dt_ddp *d, dt_sync_result *r);
/* Data parallelism and ZeRO's stages as the engine's strategies (dt_strategy_find names them "ddp", "zero1".."zero3"). */
extern const dt_strategy dt_strategy_ddp, dt_strategy_zero1, dt_strategy_zero2, dt_strategy_zero3;
int dt_ddp_buckets(const dt_ddp *d);
/* The communication buffers it holds beside the gradients (the embedding's rows, the tokens, ZeRO's bucket pool). */
size_t dt_ddp_buffer_bytes(const dt_ddp *d);
/* The share of the parameters that the last step updated inside backward
 * (0 without the optimizer in backward). */
double dt_ddp_updated_in_backward(const dt_ddp *d);
/* Data parallelism keeps every replica's weights identical: a hash of p[0..n)
 * compared across the ranks of c (one allgather). Fails naming the first rank
 * that differs; *hash gets this rank's. */
dt_status dt_ddp_check_replicas(dt_comm *c, const float *p, size_t n, uint64_t *hash);
/* The same with experts spread over ranks: the shared tensors over c, this rank's experts over ec (NULL: none holds
 * the same ones); p the store's values of size bytes each (f32, or a 16-bit copy). */
dt_status dt_ddp_check_groups(dt_comm *c, dt_comm *ec, const dt_model *m, const void *p, size_t size, uint64_t *hash);

#ifdef __cplusplus
}
#endif
#endif
