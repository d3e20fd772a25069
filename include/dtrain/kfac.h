/* dtrain K-FAC (Martens and Grosse 2015; Ba, Grosse and Martens 2017): each Linear's gradient preconditioned by the
 * inverse of its Kronecker-factored curvature, A = E[a a^T] of its inputs (with a 1 appended for a bias) and
 * G = E[g g^T] of its output gradients, distributed as KAISA does it (Pauloski et al., SC'21). The semantics are
 * kfac-pytorch's KFACPreconditioner's (the oracle, scripts/make_kfac_fixture.py): running averages that start
 * at the identity, the eigen-decomposition method with the eigenvalues' outer product plus damping (or the inverse
 * method), KL clipping over every preconditioned Linear, SGD or AdamW on the result.
 *
 * What it reads of the model: its linear observer and list (model.h's dt_linear_event, dt_linear_layer): each Linear's
 * input and output gradient, each convolution's patches and output gradient (its factors over every position, scaled
 * as kfac-pytorch's Conv2d), and where their weights are. A Linear made of several parts (Llama's q, k and v; gate
 * and up) is, as Hugging Face's modules are, one layer a part: one A shared, a G each. What the model does not list
 * (a language model's embedding, norms, head and experts; a ResNet's BatchNorms) keeps its plain gradient (said once).
 *
 * Distribution (KAISA): the W data-parallel ranks form a grid of gw rows (gw = max(1, W x workers) "gradient
 * workers" a Linear) by W / gw columns. Each Linear (its A and its Gs together) is assigned to one rank, greedily
 * by cost (largest first, to the least loaded column, then its least loaded rank); the factors' upper triangles are
 * summed onto that rank as each micro-batch's are made (inside forward and backward), which alone keeps the
 * running averages and decomposes them; the decompositions go to the ranks of its column, which precondition its
 * gradient and send it along their rows. workers 1 (COMM-OPT): every rank holds every decomposition; 1 / W
 * (MEM-OPT): each rank its own Linears', and the gradients travel. */
#ifndef DTRAIN_KFAC_H
#define DTRAIN_KFAC_H

#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_KFAC_EIGEN = 0, DT_KFAC_INVERSE } dt_kfac_method;

/* The factors' scale. KFAC_PYTORCH: kfac-pytorch's, the oracle's: G of the mean loss's output gradients (so it carries
 * 1 / examples^2), a convolution's patches and gradients each divided by its positions (1 / positions^2 on both
 * factors). FISHER: the empirical Fisher's, as Grosse and Martens's KFC and the original KFAC-Pytorch
 * (batch_averaged) scale them: G of each example's own loss gradients (times positions^2 for a convolution), a
 * convolution's patches divided by its positions once, so A x G = positions x E[a a^T] x E[g g^T] per example and the
 * damping is measured against curvature of order one. Against kfac-pytorch's: A x positions, G x examples^2 x
 * positions^4, which decides what a given damping does. */
typedef enum { DT_KFAC_SCALE_KFAC_PYTORCH = 0, DT_KFAC_SCALE_FISHER } dt_kfac_scale;

/* A micro-batch's factors travel to their workers while backward goes on: at most this many reductions under way at
 * once, each with its own buffer of the largest factor's upper triangle (on more than one rank). */
#define DT_KFAC_IN_FLIGHT 4

typedef struct {
    float damping;       /* added to the eigenvalues' products (eigen) or to each factor's diagonal (inverse): 0.001 */
    float factor_decay;  /* running averages: F = decay F + (1 - decay) F_new: 0.95 */
    float kl_clip;       /* the update scaled by min(1, sqrt(kl_clip / |sum v . g lr^2|)); 0: off. 0.001 */
    int factor_every;    /* factors updated on steps 0, k, 2k, ...: 1 */
    int inv_every;       /* decompositions on steps 0, k, 2k, ...: 1 */
    float workers;       /* KAISA's gradient worker fraction, in (0, 1]: 1 COMM-OPT, 1 / ranks MEM-OPT, between HYBRID */
    dt_kfac_method method;
    dt_kfac_scale scale; /* kfac-pytorch's (the default) or the Fisher's */
} dt_kfac_config;

typedef struct dt_kfac dt_kfac;

void dt_kfac_defaults(dt_kfac_config *c);
/* Checks the settings for ranks data-parallel ranks (workers x ranks a whole number dividing ranks); where names the
 * source ("--kfac-workers"). */
dt_status dt_kfac_check(const dt_kfac_config *c, int ranks);
/* K-FAC over model m's Linears (m->linears; none: nothing to precondition, the caller says whether that is right), comm
 * its data-parallel ranks (NULL: one process); sets m's linear observer (one at a time: the caller leaves it to this).
 * Collective over comm (it makes its own communicators). */
dt_status dt_kfac_create(const dt_kfac_config *c, const dt_model *m, dt_comm *comm, dt_kfac **out);
void dt_kfac_destroy(dt_kfac *k);
/* A step of accum micro-batches starts (their factors are averaged), its output gradients carrying loss_scale (fp16's;
 * 0: none). Under a loss scale a factor's share that is not finite (the scale's overflow) is left out; without one it
 * is kept, and the decomposition that fails on it names the Linear. */
void dt_kfac_begin(dt_kfac *k, int accum, double loss_scale);
/* Collective: the step begun is skipped before dt_kfac_step (the loss scale overflowed): its reductions land, the
 * factors keep their finite shares (a share that is not finite is left out), the decompositions stay, the step is not
 * counted. */
dt_status dt_kfac_drop(dt_kfac *k);
/* Collective: the step's averaged gradients (the program's store, whole on every rank) preconditioned in place, at
 * learning rate lr (KL clipping's). *skip: a decomposition failed on some rank (named in a warning): the gradients
 * are left as they were and the caller skips the update, on every rank alike. */
dt_status dt_kfac_step(dt_kfac *k, float *grads, float lr, int *skip);
/* The engine's seam (strategy.h) over k. */
void dt_kfac_preconditioner(dt_kfac *k, dt_preconditioner *out);
/* A pipeline's stages (each with its own K-FAC over its own Linears; the caller's, outliving k): KL clipping sums over
 * all of their Linears, and a decomposition failing on one skips the step on all. Every stage's K-FAC steps alike. */
void dt_kfac_set_stages(dt_kfac *k, dt_comm *stages);

/* What it holds: preconditioned Linears (layers, a part each), their parameters, and this rank's bytes of factors and
 * decompositions (its share; the transient buffers not counted). */
int dt_kfac_layers(const dt_kfac *k);
size_t dt_kfac_params(const dt_kfac *k);
size_t dt_kfac_state_bytes(const dt_kfac *k);
/* The most state bytes any rank holds; "COMM-OPT", "HYBRID" or "MEM-OPT" (one process: COMM-OPT). */
size_t dt_kfac_state_bytes_most(const dt_kfac *k);
const char *dt_kfac_layout(const dt_kfac *k);

/* What K-FAC over these layers (a model's list: no weights needed) would hold on ranks data-parallel ranks, without
 * making it (the planner's): each preconditioned Linear's input side n (with a bias's 1), its parts' output sides, its
 * worker and its decompositions' floats (held by the ranks r with r % columns == worker % columns); *out malloc'd. */
typedef struct {
    int n, nparts, out[4], worker;
    size_t inv_floats;
} dt_kfac_linear;
dt_status dt_kfac_plan(const dt_kfac_config *c, const dt_linear_layer *layers, int nlayers, int ranks, dt_kfac_linear **out, int *n,
                       int *columns);

/* KAISA's assignment of n Linears of the given costs to ranks ranks with grad_workers gradient workers a Linear
 * (dividing ranks): worker[i], the rank that decomposes Linear i. */
void dt_kfac_assign(const double *cost, int n, int ranks, int grad_workers, int *worker);

#ifdef __cplusplus
}
#endif
#endif
