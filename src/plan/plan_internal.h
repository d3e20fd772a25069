/* The plan layer's own: what its files share and no other layer calls. */
#ifndef DT_PLAN_INTERNAL_H
#define DT_PLAN_INTERNAL_H

#include "dtrain/plan.h"

/* This machine as the planner prices it (this_machine.c): measured once per CPU and cached, the communication's
 * calibration, the memory it can give. */
dt_status dt_plan_this_machine(dt_plan_hardware *h);

#endif
