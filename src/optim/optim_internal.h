/* Inside the optim layer: what its second-order optimizers share. */
#ifndef DTRAIN_OPTIM_INTERNAL_H
#define DTRAIN_OPTIM_INTERNAL_H

#include "dtrain/comm.h"
#include "dtrain/optim.h"

#include <stdbool.h>

/* The ranks sharing a second-order optimizer's work (work_group.c): all of comm's (g 0), or consecutive groups of g
 * (split from it: *own), or none (g 1: *out NULL, each rank all); who and flag name it in the error where g does not
 * divide them. */
dt_status dt_optim_work_group(dt_comm *comm, int g, const char *who, const char *flag, dt_comm **out, bool *own);

#endif
