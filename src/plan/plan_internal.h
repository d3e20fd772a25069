/* The plan layer's own: what its files share and no other layer calls. */
#ifndef DT_PLAN_INTERNAL_H
#define DT_PLAN_INTERNAL_H

#include "dtrain/plan.h"

/* This machine as the planner prices it (this_machine.c): measured once per CPU and cached, the communication's
 * calibration, the memory it can give. */
dt_status dt_plan_this_machine(dt_plan_hardware *h);

/* Timings at a job's shapes here (job_timings.c), each measured once a process. The FLOP/s of a Linear of M tokens, N
 * outputs and K inputs as the model runs it (lp: the precision; work_floats: the 16-bit path's scratch), 0 if it could
 * not be timed. */
double dt_plan_time_linear(int M, int N, int K, int threads, dt_dtype lp, size_t work_floats);
/* procs one-thread ranks on `cores` cores: their Linear's time over procs / cores times one alone's, at least 1. */
double dt_plan_time_shared(int M, int N, int K, dt_dtype lp, size_t work_floats, int procs, int cores);
/* n ranks meeting after each Linear: seconds a meeting adds (0 if it could not be timed). */
double dt_plan_time_meeting(int M, int N, int K, dt_dtype lp, size_t work_floats, int n);
/* The 16-bit head's work besides its GEMMs (at rate rhead): seconds a token. */
double dt_plan_time_head_lp(int M, int V, int C, size_t work_floats, int threads, dt_dtype dt, double rhead);

#endif
