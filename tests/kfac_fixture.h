/* What the K-FAC tests against kfac-pytorch share (scripts/make_kfac_fixture.py): a fixture's settings as dtrain's.
 * Header-only. */
#ifndef DTRAIN_TESTS_KFAC_FIXTURE_H
#define DTRAIN_TESTS_KFAC_FIXTURE_H

#include "fixture_checks.h"

#include "dtrain/kfac.h"
#include "dtrain/optim.h"

#include <string.h>

/* The fixture's "kfac" settings j: K-FAC's, its optimizer's (SGD with its momentum or AdamW, no weight decay), the
 * learning rate and the steps. */
static inline void kfac_fixture_settings(const cJSON *j, dt_kfac_config *kc, dt_optim_config *oc, float *lr, int *steps) {
    dt_kfac_defaults(kc);
    kc->damping = (float)fixture_number(j, "damping");
    kc->factor_decay = (float)fixture_number(j, "factor_decay");
    kc->kl_clip = (float)fixture_number(j, "kl_clip");
    kc->factor_every = (int)fixture_number(j, "factor_update_steps");
    kc->inv_every = (int)fixture_number(j, "inv_update_steps");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(j, "compute_method"), *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    kc->method = cJSON_IsString(method) && !strcmp(method->valuestring, "inverse") ? DT_KFAC_INVERSE : DT_KFAC_EIGEN;
    bool sgd = cJSON_IsString(opt) && !strcmp(opt->valuestring, "sgd");
    dt_optim_defaults(sgd ? DT_OPT_SGD : DT_OPT_ADAMW, oc);
    if (sgd) oc->momentum = (float)fixture_number(j, "momentum");
    oc->weight_decay = 0;
    *lr = (float)fixture_number(j, "lr");
    *steps = (int)fixture_number(j, "steps");
}

#endif
