/* Inside the optim layer: SOAP's per-matrix state, which dt_optim holds for --optimizer soap (soap.c). */
#ifndef DTRAIN_OPTIM_INTERNAL_H
#define DTRAIN_OPTIM_INTERNAL_H

#include "dtrain/optim.h"

#include <stdbool.h>

typedef struct dt_soap dt_soap;
/* Its statistics and bases for the spans' matrices (each whole: refused where a span cuts one). */
dt_status dt_soap_create(const dt_optim_config *c, const dt_tensor_span *spans, int nspans, dt_soap **out);
void dt_soap_destroy(dt_soap *s);
/* Step t (1-based) over the spans: p, g, m, v the slice's parameters, gradients and Adam's moments; *sumsq the
 * gradients' sum of squares. */
dt_status dt_soap_step(dt_soap *s, const dt_optim_config *c, long t, float *p, float *g, float *m, float *v, float lr, double *sumsq);
size_t dt_soap_state_bytes(const dt_soap *s);
/* Its statistics and bases as checkpoints hold them (s NULL: none). */
void dt_soap_units(dt_soap *s, dt_state_units *out);

#endif
