/* The tools a GRPO rollout's completions call, run by the user's program (--grpo-tools cmd:COMMAND; grpo_tools.c). */
#ifndef DTRAIN_TRAIN_GRPO_TOOLS_H
#define DTRAIN_TRAIN_GRPO_TOOLS_H

#include "dtrain/data.h"

struct cJSON;
/* Whether spec is cmd:COMMAND, an error saying what it takes where not. */
dt_status dt_grpo_tools_check(const char *spec);
/* The results of calls (a JSON array of {"name", "arguments"}) by spec's program, one text each, into *results (n
 * strings, each and the array the caller's to free). */
dt_status dt_grpo_tools_run(const char *spec, const struct cJSON *calls, char ***results);

#endif
