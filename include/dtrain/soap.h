/* dtrain SOAP (Vyas et al. 2024; pytorch_optimizer's SOAP is the oracle, scripts/make_soap_fixture.py): Adam in the
 * eigenbases of each matrix's Shampoo statistics. A matrix G [r, c] keeps L = E[G G^T] and R = E[G^T G] (running
 * averages at shampoo_beta, or beta2) and their bases QL, QR (the first from LAPACK's eigen-decomposition, then every
 * precond_every steps one power iteration and a QR); Adam's first moment lives in the weights' coordinates, its second
 * in the rotated ones (QL^T G QR); a side longer than precond_max_dim stays unrotated, vectors are plain Adam. Its
 * first step only measures.
 *
 * It is a preconditioner on the engine's seam (strategy.h), SGD under it: what it hands on is Adam's step direction
 * (bias-corrected) times (1 - lr weight_decay), so that SGD's update with the same weight decay, p - lr (d + wd p),
 * is SOAP's decoupled one, (p - lr step)(1 - lr wd). As a preconditioner it runs wherever the engine has whole
 * gradients: DDP, ZeRO-1, each pipeline stage's tensors, tensor parallelism's slices made whole (tp_whole.c).
 *
 * Distribution: on data-parallel replicas each matrix it rotates is kept by one rank of the group (KAISA's greedy on
 * its FLOPs, as distributed Shampoo's blocks), which alone holds its statistics, bases and moments and computes its
 * direction; the directions are then allgathered (f32: every rank's the same bit for bit). Vectors and matrices with
 * no side short enough to rotate are plain Adam on every rank. */
#ifndef DTRAIN_SOAP_H
#define DTRAIN_SOAP_H

#include "dtrain/comm.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_soap dt_soap;

/* SOAP with c's settings (betas, eps, weight decay, precond_every, precond_max_dim, shampoo_beta, soap_group) over the
 * n tensors of a store (those of count 0 and a pipeline's tied copy left out; a tensor of two dimensions is a matrix),
 * comm its data-parallel ranks (NULL: one process; soap_group must divide their number). Collective over comm. */
dt_status dt_soap_create(const dt_optim_config *c, const dt_tensor_info *tensors, int n, dt_comm *comm, dt_soap **out);
void dt_soap_destroy(dt_soap *s);
/* Collective: the step's averaged gradients (the whole store, the same on every rank) become its directions, in place,
 * at the step's learning rate lr. *skip: 2 on its first step, which only measures (the caller leaves the weights as
 * they are), else 0. A basis whose decomposition fails stays as it was (said, naming the tensor and the step). */
dt_status dt_soap_step(dt_soap *s, float *grads, float lr, int *skip);
/* The engine's seam over s. */
void dt_soap_preconditioner(dt_soap *s, dt_preconditioner *out);

/* This rank's bytes of state (statistics, bases, moments); the most any rank of its group holds. */
size_t dt_soap_state_bytes(const dt_soap *s);
size_t dt_soap_state_bytes_most(const dt_soap *s);
/* A line for the run's log: its matrices, how they are shared, the fullest rank's state. */
void dt_soap_describe(const dt_soap *s, char *out, size_t n);

/* Its shared work: the rank of a group of `ranks` that keeps and rotates each span's matrix (owner[i]; -1: one every
 * rank steps, a vector or a matrix with no side short enough to rotate), greedily by its cost (the largest first, to
 * the least loaded rank), the cost being its FLOPs a step (its statistics, three rotations, its bases' refresh spread
 * over their interval) in cost[i]; the floats its owner holds of it (L, QL, R, QR, Adam's moments) in floats[i] (any
 * of them NULL: not asked). The run's and the planner's. */
void dt_soap_assign(const dt_optim_config *c, const dt_tensor_span *spans, int n, int ranks, int *owner, double *cost, size_t *floats);
/* The spans SOAP steps of a store's tensors (count 0 and a pipeline's tied copy left out): *out malloc'd, *n of them. */
dt_status dt_soap_spans(const dt_tensor_info *tensors, int n, dt_tensor_span **out, int *count);

#ifdef __cplusplus
}
#endif
#endif
