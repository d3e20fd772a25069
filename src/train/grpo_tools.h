/* The tools a GRPO rollout's completions call, run by the user's program (--grpo-tools cmd:COMMAND, a process a round
 * of calls, or proc:COMMAND, one kept running over the run; grpo_tools.c). */
#ifndef DTRAIN_TRAIN_GRPO_TOOLS_H
#define DTRAIN_TRAIN_GRPO_TOOLS_H

#include "dtrain/data.h"

struct cJSON;
typedef struct dt_grpo_tools dt_grpo_tools;
/* Whether spec is cmd:COMMAND or proc:COMMAND, an error saying what it takes where not. */
dt_status dt_grpo_tools_check(const char *spec);
/* The tools of spec (proc: its program started now). */
dt_status dt_grpo_tools_create(const char *spec, dt_grpo_tools **out);
/* The results of calls (a JSON array of {"name", "arguments", "completion"}) by the program, one text each, into
 * *results (n strings, each and the array the caller's to free). */
dt_status dt_grpo_tools_run(dt_grpo_tools *t, const struct cJSON *calls, char ***results);
/* proc: its program's input closed, and it waited for a moment, then killed. */
void dt_grpo_tools_destroy(dt_grpo_tools *t);

#endif
