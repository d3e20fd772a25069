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

/* The job's whole model as a table (no weights): its tensors into *m; NULL if it cannot be made. The caller destroys it. */
dt_program *dt_plan_model_table(const dt_plan_job *j, dt_model *m);
/* An allreduce of `bytes` over n ranks (the ring's 2(n-1)/n of the bytes each way, and the reduction): seconds. */
static inline double dt_plan_allreduce(double bytes, int n, double alpha, double beta, double gamma) {
    return n > 1 ? 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes * beta + (double)(n - 1) / n * bytes * gamma : 0;
}
/* A gather (or a reduce-scatter, with gamma) of `bytes` in all over n ranks. */
static inline double dt_plan_gather(double bytes, int n, double alpha, double beta) {
    return n > 1 ? (n - 1) * alpha + (double)(n - 1) / n * bytes * beta : 0;
}

/* Timings at a job's shapes here (job_timings.c), each measured once a process. The FLOP/s of a Linear of M tokens, N
 * outputs and K inputs as the model runs it (lp: the precision; work_floats: the 16-bit path's scratch), 0 if it could
 * not be timed. */
double dt_plan_time_linear(int M, int N, int K, int threads, dt_dtype lp, size_t work_floats);
/* procs one-thread ranks on `cores` cores: their Linear's time over procs / cores times one alone's, at least 1. */
double dt_plan_time_shared(int M, int N, int K, dt_dtype lp, size_t work_floats, int procs, int cores);
/* n ranks meeting after each Linear: seconds a meeting adds (0 if it could not be timed). */
double dt_plan_time_meeting(int M, int N, int K, dt_dtype lp, size_t work_floats, int n);
/* n ranks meeting 20 ms or more of the Linear's work apart: their waits over their work (0 if it could not be timed). */
double dt_plan_time_straggle(int M, int N, int K, dt_dtype lp, size_t work_floats, int n);
/* Causal attention's FLOP/s on one thread over sequences of T positions (the rate at 1024 beyond it), heads of d
 * channels (0 if it could not run). */
double dt_plan_time_attention(int T, int d);
/* LAPACK's symmetric eigen-decomposition of n x n with its vectors: seconds here (0 if it could not run). */
double dt_plan_time_eigen(int n, int threads);
/* A second-order optimizer (job->kfac_on, shampoo_on, or SOAP: second_order.c): its state on the rank holding most
 * (bytes; *scratch, its transient buffers beside it); a step's compute and communication for it on that rank (seconds, at its intervals' average; rate: a rank's
 * GEMM FLOP/s, threads its threads, slow its compute's slowdown beside the other ranks; overlap: the seconds of forward and
 * backward that K-FAC's factor reductions run beside). */
double dt_plan_second_order_bytes(const dt_plan_job *j, double *scratch);
void dt_plan_second_order_time(const dt_plan_job *j, const dt_plan_hardware *h, double rate, int threads, double slow, double overlap,
                               double *compute, double *comm);
/* The 16-bit head's work besides its GEMMs (at rate rhead): seconds a token. */
double dt_plan_time_head_lp(int M, int V, int C, size_t work_floats, int threads, dt_dtype dt, double rhead);

#endif
