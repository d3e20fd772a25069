/* What every run.json holds (a training run's, train/run_record.c; an RL run's, rl/rl_report.c): the report page
 * reads them; io/json_file.h writes them. */
#ifndef DTRAIN_OBS_RUN_JSON_H
#define DTRAIN_OBS_RUN_JSON_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>

/* "command": the command line as typed, its program named "dtrain". */
void dt_run_json_command(cJSON *j, int argc, char **argv);

#endif
