/* The fixtures' ten AdamW steps (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, as the fixture scripts run
 * torch.optim.AdamW): m's parameters stepped on one batch, each step's loss against f's "adamw_losses". Header-only. */
#ifndef DTRAIN_TESTS_ADAMW_STEPS_H
#define DTRAIN_TESTS_ADAMW_STEPS_H

#include "dtrain/io.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"

#include <math.h>

/* The worst step's relative loss error in *worst, and each step's loss in out (NULL: not kept; steps at most 64). */
static dt_status adamw_steps_err(dt_program *p, const dt_model *m, dt_safetensors *f, const int32_t *in, const int32_t *tg, int B, int T,
                                 int steps, double *worst, float *out) {
    float ref[64], own[64], *losses = out ? out : own;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.01f;
    dt_optim *o = NULL;
    dt_status st = steps <= 64 ? dt_safetensors_read(f, "adamw_losses", 1, &steps, 0, ref) : dt_error(DT_ERR_ARG, "more than 64 steps");
    if (!st) st = dt_optim_create(&oc, m->nparams, NULL, 0, &o);
    for (int s = 0; !st && s < steps; s++) {
        dt_program_zero_grad(p);
        if (!(st = dt_program_forward(p, in, tg, B, T, &losses[s]))) st = dt_program_backward(p, 1.0f);
        if (!st) dt_optim_step(o, m->params(m->self), m->grads(m->self), 1e-3f, 0);
    }
    *worst = 0;
    for (int s = 0; !st && s < steps; s++) *worst = fmax(*worst, fabs(losses[s] - ref[s]) / ref[s]);
    dt_optim_destroy(o);
    return st;
}

#endif
