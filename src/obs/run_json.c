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

dt_status dt_run_json_write(cJSON *j, const char *path) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(text);
    const void *parts[2] = { text, "\n" };
    size_t sizes[2] = { n, 1 };
    dt_status st = dt_file_write_atomic(path, parts, sizes, 2);
    free(text);
    return st;
}
