/* The engine's preconditioner for --optimizer kfac or shampoo, made alike for the language models' trainer
 * (run_setup.c) and the image models' (classify.c). */
#ifndef DTRAIN_PRECOND_SETUP_H
#define DTRAIN_PRECOND_SETUP_H

#include "dtrain/engine.h"
#include "dtrain/kfac.h"
#include "dtrain/shampoo.h"
#include "dtrain/train.h"

typedef struct {
    dt_kfac *kfac;       /* --optimizer kfac */
    dt_shampoo *shampoo; /* --optimizer shampoo */
    dt_preconditioner pc;
} dt_train_precond;

/* Over ec->model on ec->comm's ranks, set as ec->precond (neither asked: nothing). stages: a pipeline's (K-FAC's KL
 * clipping and skips span them; NULL: none). others: what the model's unpreconditioned parameters are, for the line
 * rank 0 says ("embeddings, norms, head, experts"). Collective over ec->comm. */
dt_status dt_train_precond_create(const dt_train_config *c, dt_engine_config *ec, dt_comm *stages, int rank, const char *others,
                                  dt_train_precond *out);
void dt_train_precond_destroy(dt_train_precond *p);
/* This rank's bytes of its state. */
size_t dt_train_precond_bytes(const dt_train_precond *p);

#endif
