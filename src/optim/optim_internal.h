/* Inside the optim layer: SOAP's per-matrix state, which dt_optim holds for --optimizer soap (soap.c). */
#ifndef DTRAIN_OPTIM_INTERNAL_H
#define DTRAIN_OPTIM_INTERNAL_H

#include "dtrain/comm.h"
#include "dtrain/optim.h"

#include <stdbool.h>

typedef struct dt_soap dt_soap;
/* Its statistics and bases for the spans' matrices (each whole: refused where a span cuts one), each kept and rotated by
 * one rank of comm (or of its groups of c->soap_group; NULL: this rank all), whose Adam moments are those of m and v
 * (the optimizer's buffers) there. */
dt_status dt_soap_create(const dt_optim_config *c, const dt_tensor_span *spans, int nspans, dt_comm *comm, float *m, float *v, dt_soap **out);
void dt_soap_destroy(dt_soap *s);
/* Step t (1-based) over the spans: p, g the slice's parameters and gradients; *sumsq the
 * gradients' sum of squares. Collective over its ranks: each steps its own matrices, then every rank gets them. */
dt_status dt_soap_step(dt_soap *s, const dt_optim_config *c, long t, float *p, float *g, float lr, double *sumsq);
size_t dt_soap_state_bytes(const dt_soap *s);
/* A line for the run's log: its matrices, how they are shared, the fullest rank's statistics and bases. */
void dt_soap_describe(const dt_soap *s, char *out, size_t n);
/* Its statistics and bases as checkpoints hold them (s NULL: none). */
void dt_soap_units(dt_soap *s, dt_state_units *out);

/* The ranks sharing a second-order optimizer's work (work_group.c): all of comm's (g 0), or consecutive groups of g
 * (split from it: *own), or none (g 1: *out NULL, each rank all); who and flag name it in the error where g does not
 * divide them. */
dt_status dt_optim_work_group(dt_comm *comm, int g, const char *who, const char *flag, dt_comm **out, bool *own);

#endif
