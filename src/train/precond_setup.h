/* The engine's preconditioner for --optimizer kfac, shampoo or soap, made alike for the language models' trainer
 * (run_setup.c) and the image models' (classify.c). */
#ifndef DTRAIN_PRECOND_SETUP_H
#define DTRAIN_PRECOND_SETUP_H

#include "dtrain/engine.h"
#include "dtrain/kfac.h"
#include "dtrain/parallel.h"
#include "dtrain/shampoo.h"
#include "dtrain/soap.h"
#include "dtrain/train.h"

typedef struct {
    dt_kfac *kfac;       /* --optimizer kfac */
    dt_shampoo *shampoo; /* --optimizer shampoo */
    dt_soap *soap;       /* --optimizer soap */
    dt_tp_whole *whole;  /* tensor parallelism's whole tensors, which they precondition (NULL: the rank's are whole) */
    dt_preconditioner pc, inner;
} dt_train_precond;

/* Over ec->model on ec->comm's ranks, set as ec->precond (neither asked: nothing). stages: a pipeline's (K-FAC's KL
 * clipping and skips span them; NULL: none); tp: the tensor-parallel group (NULL: none), whose slices it makes whole.
 * others: what the model's unpreconditioned parameters are, for the line rank 0 says ("embeddings, norms, head,
 * experts"). Collective over ec->comm and tp. */
dt_status dt_train_precond_create(const dt_train_config *c, dt_engine_config *ec, dt_comm *stages, dt_comm *tp, int rank,
                                  const char *others, dt_train_precond *out);
void dt_train_precond_destroy(dt_train_precond *p);
/* This rank's bytes of its state (their buffers, and tensor parallelism's whole tensors, are scratch: not counted). */
size_t dt_train_precond_bytes(const dt_train_precond *p);

#endif
