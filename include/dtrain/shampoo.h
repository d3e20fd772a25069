/* dtrain Shampoo (Gupta, Koren and Singer 2018), as Meta's distributed_shampoo does it (Shi et al. 2023; the oracle,
 * scripts/make_shampoo_fixture.py): each tensor's dimensions of size 1 squeezed and its small ones merged (up to the
 * largest block), then cut into blocks of at most block x block; a block of order k keeps a factor a dimension,
 * L_i = beta2 L_i + (1 - beta2) (the gradient contracted with itself over every other dimension), and preconditions
 * the filtered gradient (the first moment at beta1, bias-corrected) by each factor's inverse 2k-th root, grafted onto
 * Adam's step size: the block's direction scaled to the norm of Adam's (second moment at beta2, epsilon graft_eps).
 * The roots come every `every` steps from `start` on, by LAPACK's symmetric eigen-decomposition in f32 (retried in f64)
 * of the bias-corrected factor plus eps I (its eigenvalues lifted to eps where below); before start the step is Adam's
 * (grafting alone). What it hands on is the search direction: the base optimizer is SGD, whose weight decay (added to
 * the direction) is distributed_shampoo's decoupled one and whose momentum its classic momentum.
 *
 * Distribution (its DDP mode): the blocks are assigned to the data-parallel ranks, greedily by cost (the largest to the
 * least loaded) of a group of ranks (distributed_shampoo's num_trainers_per_group: all of them, or consecutive groups
 * of `group` that each share the blocks out alike); a rank keeps only its blocks' factors, roots and moments, computes
 * their directions, and its group allgathers them (f32: what one rank holding every block computes, bit for bit; or
 * bf16, half the bytes). */
#ifndef DTRAIN_SHAMPOO_H
#define DTRAIN_SHAMPOO_H

#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float beta1, beta2; /* the filtered gradient's, the factors' and grafting's running averages: 0.9, 0.999 */
    float eps;          /* added to each factor's diagonal before its root: 1e-12 */
    float graft_eps;    /* Adam grafting's: 1e-8 */
    int block;          /* the largest block's side (max_preconditioner_dim): 1024 */
    int every;          /* the roots recomputed every N steps (precondition_frequency): 10 */
    int start;          /* the first step preconditioned (start_preconditioning_step); 0: every */
    dt_dtype wire;      /* the directions' allgather: DT_F32 or DT_BF16 */
    int group;          /* ranks sharing the blocks out; 0: all of them, 1: every rank computes every block */
} dt_shampoo_config;

typedef struct dt_shampoo dt_shampoo;

void dt_shampoo_defaults(dt_shampoo_config *c);
/* Out-of-range settings, named by their flags. */
dt_status dt_shampoo_check(const dt_shampoo_config *c);
/* Shampoo over the n tensors of a store (those of count 0 and a pipeline's tied copy left out), comm its
 * data-parallel ranks (NULL: one process; group must divide their number). Collective over comm. */
dt_status dt_shampoo_create(const dt_shampoo_config *c, const dt_tensor_info *tensors, int n, dt_comm *comm, dt_shampoo **out);
void dt_shampoo_destroy(dt_shampoo *s);
/* Collective: the step's averaged gradients (the whole store, the same on every rank) become the search directions, in
 * place. *skip: a root failed on some rank (named in a warning): the gradients are left as they were and the caller
 * skips the update, on every rank alike. */
dt_status dt_shampoo_step(dt_shampoo *s, float *grads, int *skip);
/* The engine's seam (strategy.h) over s. */
void dt_shampoo_preconditioner(dt_shampoo *s, dt_preconditioner *out);

/* What it holds: blocks (all ranks'), this rank's bytes of state (factors, roots, moments), the most any rank holds. */
int dt_shampoo_blocks(const dt_shampoo *s);
size_t dt_shampoo_state_bytes(const dt_shampoo *s);
size_t dt_shampoo_state_bytes_most(const dt_shampoo *s);
/* What Shampoo over the tensors would hold on ranks data-parallel ranks, without making it (the planner's): each
 * block's shape, size, owner (its rank in its group: ranks r with r % group == owner hold it; -1: an expert-parallel
 * rank's own expert's, on every rank) and state floats; *out malloc'd. */
typedef struct {
    int ndim, dim[4], owner;
    size_t numel, state_floats;
} dt_shampoo_block;
dt_status dt_shampoo_plan(const dt_shampoo_config *c, const dt_tensor_info *tensors, int n, int ranks, dt_shampoo_block **out, int *nb);
/* The merged shape of a tensor (squeezed, small dimensions merged up to block, the last ones first): its order. */
int dt_shampoo_merge(int ndim, const int *shape, int block, int *out);

#ifdef __cplusplus
}
#endif
#endif
