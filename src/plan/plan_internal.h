/* The plan layer's own: what its files share and no other layer calls. */
#ifndef DT_PLAN_INTERNAL_H
#define DT_PLAN_INTERNAL_H

#include "dtrain/plan.h"

/* This machine as the planner prices it (this_machine.c): measured once per CPU and cached, the communication's
 * calibration, the memory it can give. */
dt_status dt_plan_this_machine(dt_plan_hardware *h);

/* A 16-bit gradient store on a data-parallel axis (--grad-store; without that axis the gradients stay f32). */
static inline int dt_plan_lp_store(const dt_plan_job *j) { return j->grad_store != DT_F32 && j->grad_store && j->dp > 1; }
/* Gradients reduced in 16 bits: --grad-comm's, or a 16-bit store's (the wire is its type). */
static inline int dt_plan_lp_wire(const dt_plan_job *j) { return (j->grad_comm != DT_F32 && j->grad_comm) || dt_plan_lp_store(j); }

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
