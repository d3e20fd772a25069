/* A policy-gradient step with a learned baseline, as IMPALA and REINFORCE
 * take it: rows (records of rollout.h) with their advantages A and value
 * targets, shuffled into minibatches over epochs, each an engine step on
 * the loss - A log pi(a) + vf_coef (V - target)^2 / 2 - ent_coef H, each
 * row weighted by 1 / the minibatch's valid rows (A and the target held). */
#ifndef DTRAIN_RL_PG_STEP_H
#define DTRAIN_RL_PG_STEP_H

#include "dtrain/engine.h"
#include "dtrain/rl.h"
#include "policy.h"

typedef struct {
    const dt_rl_config *c;
    dt_policy *pol;    /* borrowed */
    dt_engine *e;      /* borrowed */
    int od, ad, K, continuous, cap, rows;
    const float *const *recs; /* this step's rows */
    const float *adv, *target;
    const uint8_t *valid;
    int *perm;
    float *mb_obs, *mb_act, *mb_w, *mb_adv, *mb_target, *dlogits, *dvalues, *dlogstd;
    dt_rl_terms terms;
} dt_pg_step;

/* Rows up to max_rows a step. */
dt_status dt_pg_step_init(dt_pg_step *s, const dt_rl_config *c, dt_policy *pol, dt_engine *e, int od, int ad, int max_rows);
void dt_pg_step_free(dt_pg_step *s);
/* M rows: recs[i] the record, adv, target and valid [M]; u (the update) seeds the shuffle. Sums the terms (pg, v,
 * entropy: means over the minibatches) into s->terms; *loss the minibatches' mean. */
dt_status dt_pg_step_run(dt_pg_step *s, int M, const float *const *recs, const float *adv, const float *target,
                         const uint8_t *valid, int u, float lr, double *loss);

#endif
