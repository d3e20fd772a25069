/* run.json's shared parts (run_json.h). */
#include "run_json.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt_run_json_command(cJSON *j, int argc, char **argv) {
    char cmd[8192] = "";
    for (int i = 0; argv && i < argc && argv[i]; i++) {
        size_t n = strlen(cmd);
        snprintf(cmd + n, sizeof cmd - n, "%s%s", i ? " " : "", i == 0 ? "dtrain" : argv[i]);
    }
    cJSON_AddStringToObject(j, "command", cmd);
}
