/* What a GPT-2 run checks before any work (run_checks.c). */
#ifndef DT_TRAIN_RUN_CHECKS_H
#define DT_TRAIN_RUN_CHECKS_H

#include "dtrain/train.h"

/* What every rank must agree on, compared against rank 0's. */
typedef struct {
    /* the model's shape as words (dt_train_shape_model): T, V, Vp, L, NH, C, the family's number, K/V heads, head and
     * MLP widths, untied, the rope's original length, then the norms' epsilon and the rotary numbers' bits, then the
     * experts, top-k, whether their weights are renormalised, the shared expert's width, the router, its groups, which layers
     * are mixtures (every, the first dense) and the dense layers' MLP width */
    int32_t model[26];
    int32_t batch, seq, steps, grad_accum, optimizer, eval_every;
    int64_t train_tokens, val_tokens;
    float lr;
    char strategy[16];        /* the parallel strategy's name (ddp, zero1, ...) */
    int32_t precision;        /* dt_dtype */
    int32_t mesh[4], pp_schedule; /* dp, tp, pp, cp as laid out; the pipeline's schedule (dt_pp_kind) */
    int32_t pp_wire;          /* what crosses its stage boundaries (dt_pp_wire) */
    int32_t cp_wire;          /* what ring attention's blocks travel as (dt_pp_wire) */
} dt_train_shape;

/* Settings that would do nothing (a warning) or contradict each other (an error); fills in what --steps 0 implies. */
dt_status dt_train_check_settings(dt_train_config *c, int nranks);
/* --grpo's settings against the rest (grpo_run.c): what it cannot run with, said before any work. */
dt_status dt_train_check_grpo(const dt_train_config *c);
/* Every rank's shape against rank 0's: the first difference, naming the rank. */
dt_status dt_train_check_same(dt_comm *w, const dt_train_shape *mine);
/* c (its defaults resolved) into s->model: numbers only, so that ranks of separate processes compare it (a
 * family is its number in dt_family_find's order, never a pointer). */
void dt_train_shape_model(dt_train_shape *s, const dt_gpt2_config *c);

#endif
