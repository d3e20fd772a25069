/* dtrain pipeline parallelism: the schedules (pipeline_schedule.c) as
 * explicit lists of actions per stage, and the runner that executes a
 * stage's list on a model part (pipeline.c). */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include "dtrain/comm.h"
#include "dtrain/strategy.h"
#include "dtrain/model.h"
#include "dtrain/program.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ZB1: ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
 * backward split into B (input gradients, on the critical path) and W
 * (weight gradients), W deferred to fill 1F1B's bubble, at most p
 * micro-batches in flight on any stage (1F1B's most). */
/* INTERLEAVED: Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): the
 * model in p x v chunks, stage s holding chunks s, s+p, .., s+(v-1)p, the
 * micro-batches through the stages v times (stage p-1 hands chunk j's
 * output to stage 0's chunk j+1); the bubble shrinks to (p-1)/(vm+p-1). */
typedef enum { DT_PP_GPIPE = 0, DT_PP_1F1B, DT_PP_ZB1, DT_PP_INTERLEAVED } dt_pp_kind;
/* "gpipe", "1f1b", "zb1", "interleaved"; -1 for a name that is not a schedule. */
int dt_pp_kind_parse(const char *name);
const char *dt_pp_kind_name(dt_pp_kind k);

/* A message between neighbours: micro-batch m's activations (forward) or
 * their gradient (backward), to or from stage peer. */
typedef struct {
    int peer;  /* -1: none */
    int grad;  /* 0: activations, 1: their gradient */
    int micro;
    int chunk; /* the receiver's chunk (interleaved; else 0) */
} dt_pp_msg;

/* One step of a stage's list: compute (F, B or W of micro-batch micro, in
 * activation slot slot; W only where backward is split), or
 * communication: a send, a receive, or both at once (they progress
 * together: neighbours that exchange never wait on each other's order). */
typedef enum { DT_PP_F = 0, DT_PP_B, DT_PP_W, DT_PP_COMM } dt_pp_op;
typedef struct {
    dt_pp_op op;
    int micro, slot;       /* F, B, W */
    int chunk;             /* F, B: which of the stage's chunks (interleaved; else 0) */
    int last;              /* B (W where backward is split): the stage's last gradient computation of the step (data
                            * parallelism synchronises there) */
    dt_pp_msg send, recv;  /* COMM: peer -1 where a half is absent */
} dt_pp_action;

typedef struct {
    dt_pp_kind kind;
    int stages, micro;     /* p, m */
    int virt;              /* v: chunks per stage (1 but for interleaved) */
    dt_pp_action **act;    /* per stage */
    int *n;                /* actions per stage */
    int *slots;            /* activation slots per stage: micro-batches in flight at most */
    int *areas;            /* [stage * virt + chunk]: micro-batches holding that chunk's activations at most (a
                            * model of several chunks keeps each chunk's apart: dt_program_set_slots) */
    int async;             /* sends are posted and left to progress (waited for before the next send to the same
                            * neighbour and at the step's end); else each waits for its receiver */
} dt_pp_schedule;

/* The schedule for p stages, v chunks each (1 but for interleaved) and m
 * micro-batches: each stage's forwards and backwards in the kind's order
 * (GPipe: all forwards, then all backwards; 1F1B: p-1-s forwards to warm
 * up, then one forward and one backward in turn, then the rest of the
 * backwards; ZB1: 1F1B's forwards and B's, a W before a forward that would
 * put more than p micro-batches in flight and before each B of the
 * cool-down, the rest at the end; INTERLEAVED: Megatron's order over the
 * v m (chunk, micro-batch) pairs, p micro-batches through each chunk in
 * turn, 2(p-1-s) + (v-1)p forwards to warm up, then 1F1B; m a multiple of
 * p), each receive just before the computation that needs it, each send
 * just after the one that made it (GPipe, 1F1B: a send followed by a
 * receive merged into one exchange; ZB1, INTERLEAVED: sends posted and left
 * to progress, so a W runs while its stage's gradient travels and two
 * stages sending to each other both go on); then checked by
 * dt_pp_schedule_check. Backwards (and W's) of a chunk run in micro-batch
 * order on every stage, so each gradient adds up in the order one process
 * adds it. */
dt_status dt_pp_schedule_create(dt_pp_kind kind, int stages, int virt, int micro, dt_pp_schedule **out);
void dt_pp_schedule_destroy(dt_pp_schedule *s);
/* Stage s's areas[j] of such a schedule without building it (the planner's count); -1 for a schedule the arguments
 * cannot make or out of memory. */
int dt_pp_chunk_areas(dt_pp_kind kind, int stages, int virt, int micro, int s, int *areas);
/* Runs every stage's list against the others with sends that wait for
 * their receiver (the worst a transport may do): fails naming the stages
 * and actions that would wait forever, or a message received as another
 * (which micro-batch or direction). */
dt_status dt_pp_schedule_check(const dt_pp_schedule *s);
/* The lists as a table, one row per stage, one column per time unit of a
 * simulated run where a forward takes 1 and a backward 2, or B and W 1 each
 * (communication free): F3 a forward of micro-batch 3, B3 its backward, W3
 * its weight gradients, "." idle; then the bubble this gives each stage and
 * theory's: (p-1)/(m+p-1) for GPipe and 1F1B, ZB-H1's (p-1)/(3m+p-1) for m >= p. */
void dt_pp_schedule_print(const dt_pp_schedule *s, FILE *out);
/* The idle fraction of that simulated run, over all stages. */
double dt_pp_schedule_bubble(const dt_pp_schedule *s);
/* The same with each action taking what d gives it: every stage's actions
 * in list order, stage after stage (communication's ignored: transfers are
 * free). With a step's measured durations, a replay of that step: what the
 * stages' own speeds left idle. -1 if it cannot run. */
double dt_pp_schedule_bubble_replay(const dt_pp_schedule *s, const double *d);

/* ---- the runner (pipeline.c): one stage of a pipeline over a part of the model program (any family) ---- */

/* A stage boundary's wire (pp_wire.c): f32, bf16 (nearest even) or int8 (an absmax scale a row of channels), the
 * same for activations and their gradients. A message is dt_pp_wire_words 32-bit words for n floats in rows of row. */
typedef enum { DT_PP_WIRE_F32 = 0, DT_PP_WIRE_BF16, DT_PP_WIRE_INT8 } dt_pp_wire;
dt_status dt_pp_wire_parse(const char *s, dt_pp_wire *out);
const char *dt_pp_wire_name(dt_pp_wire w);
size_t dt_pp_wire_words(dt_pp_wire w, size_t n, size_t row);
void dt_pp_wire_encode(dt_pp_wire w, const float *x, size_t n, size_t row, void *out);
void dt_pp_wire_decode(dt_pp_wire w, const void *in, size_t n, size_t row, float *x);

/* Micro-batch k's tokens and targets [B*T]: every stage asks for each in
 * order (its loader stays with the others'); the first stage reads the
 * tokens, the last the targets. */
typedef dt_status (*dt_pp_batch_fn)(void *ctx, int micro, const int32_t **tokens, const int32_t **targets);
typedef struct {
    dt_comm *pp;            /* the stages of this pipeline, ranked by stage */
    dt_program *model;      /* this stage's part of the model program: units [ua, ub) */
    dt_pp_kind kind;
    int virt;               /* interleaved: chunks per stage (0 or 1: one) */
    int micro, B, T;        /* micro-batches per step, each B x T */
    dt_pp_batch_fn batch;
    void *batch_ctx;
    dt_pp_wire wire;        /* what crosses a boundary (the stream's rows: the model's channels) */
} dt_pipeline_config;
typedef struct dt_pipeline dt_pipeline;
/* Builds the schedule, gives the model its activation slots and, where
 * the first and last stages hold the tied wte's two copies, subscribes to
 * its hooks: the last stage's head gradient of wte goes to the first stage
 * (added before the first stage's last embedding backward, so data
 * parallelism reduces the sum), and after each update the first stage's
 * wte goes back to the last. Create it before the engine (its hooks then
 * come before a data-parallel strategy's). Collective over pp. */
dt_status dt_pipeline_create(const dt_pipeline_config *c, dt_pipeline **out);
void dt_pipeline_destroy(dt_pipeline *p);
/* Forward only (evaluation): n batches from batch(ctx, k, ...) through the
 * stages in order; the last stage sums their mean losses (*loss_sum, *nloss;
 * 0 elsewhere). Collective over the stages. */
dt_status dt_pipeline_forward_only(dt_pipeline *p, int n, dt_pp_batch_fn batch, void *ctx, double *loss_sum, int *nloss);
/* The bytes this stage holds for messages beside its activations: the tied wte's gradient on its way from the last
 * stage to the first (0 on a stage without it); a run's "buffers", which the planner prices alike. */
size_t dt_pipeline_buffer_bytes(const dt_pipeline *p);
/* Whether messages go through mailboxes in the shared arena (every stage on one machine), not point to point. */
int dt_pipeline_mailboxes(const dt_pipeline *p);
/* What the engine runs (dt_engine_config.schedule). */
const dt_micro_schedule *dt_pipeline_schedule(dt_pipeline *p);
const dt_pp_schedule *dt_pipeline_actions(const dt_pipeline *p);
/* The last step on this stage: seconds in forwards, backwards (B) and
 * weight gradients (W, zb1 only). */
void dt_pipeline_times(const dt_pipeline *p, double *fwd, double *bwd, double *wgt);
/* The last step's bubble: the share of the schedule's span (the longest
 * stage's, from the step's start) that the stages did not compute (waiting
 * for a neighbour, or the transfer itself), the mean over them: theory's
 * (p-1)/(m+p-1) when stages are balanced and communication is free. *model:
 * the step replayed in the schedule's simulator with each action's measured
 * duration (dt_pp_schedule_bubble_replay): theory for the stages as fast as
 * they ran, so that bubble - model is what waiting and transfers added.
 * Collective over the stages. */
dt_status dt_pipeline_bubble(dt_pipeline *p, double *bubble, double *model);

#ifdef __cplusplus
}
#endif
#endif
