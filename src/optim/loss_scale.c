/* Loss scaling for fp16 training, with DeepSpeed's semantics (its
 * DynamicLossScaler) so that a run moved between the two behaves alike:
 * the loss is multiplied by the scale before backward, the gradients are
 * divided by it after, and a step whose gradients overflowed (inf or NaN)
 * is skipped. Dynamic scaling starts high (2^16) and halves on an overflow
 * once `hysteresis` overflows have been absorbed (each absorbed one lowers
 * the count, a doubling refills it), doubles after `window` clean steps in a
 * row counted from the last overflow, and never goes below the floor: an
 * overflow at the floor is not an overflow any more but a broken run (a NaN
 * in the data, a diverged model), and ends it instead of looping. */
#include "dtrain/optim.h"

#include <math.h>
#include <stdio.h>

void dt_loss_scale_defaults(dt_loss_scale_config *c) {
    *c = (dt_loss_scale_config){ .scale = 65536.0, .dynamic = 1, .window = 1000, .hysteresis = 2, .min_scale = 1.0,
                                 .consecutive_hysteresis = 0 };
}

dt_status dt_loss_scale_check(const dt_loss_scale_config *c, const char *where) {
    const char *w = where ? where : "loss scale";
    if (!(c->scale > 0) || !isfinite(c->scale) || c->scale > 0x1p100)
        return dt_error(DT_ERR_ARG, "%s: the loss scale %g is not in (0, 2^100] (fp16.loss_scale / initial_scale_power)", w, c->scale);
    if (!c->dynamic) return DT_OK;
    if (c->window < 1) return dt_error(DT_ERR_ARG, "%s: fp16.loss_scale_window %d is below 1", w, c->window);
    if (c->hysteresis < 1) return dt_error(DT_ERR_ARG, "%s: fp16.hysteresis %d is below 1", w, c->hysteresis);
    if (!(c->min_scale > 0) || !isfinite(c->min_scale) || c->min_scale > c->scale)
        return dt_error(DT_ERR_ARG, "%s: fp16.min_loss_scale %g is not in (0, the initial scale %g]", w, c->min_scale, c->scale);
    return DT_OK;
}

void dt_loss_scale_init(dt_loss_scale *s, const dt_loss_scale_config *c) {
    *s = (dt_loss_scale){ .scale = c->scale, .iter = 0, .last_overflow = -1, .hysteresis = c->hysteresis };
}

dt_status dt_loss_scale_update(dt_loss_scale *s, const dt_loss_scale_config *c, int overflow, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!c->dynamic) {
        /* a static scale never moves; an overflow only skips the step */
        if (overflow && msg) snprintf(msg, cap, "OVERFLOW! Skipping step. Static loss scale: %.0f", s->scale);
        s->iter++;
        return DT_OK;
    }
    if (overflow) {
        if (c->hysteresis == 1 || s->hysteresis == 1) {
            if (s->scale <= c->min_scale)
                return dt_error(DT_ERR_NUMERIC, "step %lld: the gradients overflowed at the minimum loss scale %g: not an fp16 "
                                "overflow but non-finite values (a NaN in the data, or a diverged model); stopping",
                                (long long)s->iter + 1, s->scale);
            double next = fmax(s->scale / 2, c->min_scale);
            if (msg) snprintf(msg, cap, "OVERFLOW! Skipping step. Attempted loss scale: %.0f, reducing to %.0f", s->scale, next);
            s->scale = next;
        } else {
            if (msg)
                snprintf(msg, cap, "OVERFLOW! Skipping step. Attempted loss scale: %.0f, but hysteresis is %d. Reducing hysteresis to %d",
                         s->scale, s->hysteresis, s->hysteresis - 1);
            s->hysteresis--;
        }
        s->last_overflow = s->iter;
    } else {
        if (c->consecutive_hysteresis) s->hysteresis = c->hysteresis;
        int64_t stable = s->iter - s->last_overflow - 1;
        if (stable > 0 && stable % c->window == 0) {
            if (!c->consecutive_hysteresis) s->hysteresis = c->hysteresis;
            s->scale *= 2;
        }
    }
    s->iter++;
    return DT_OK;
}
