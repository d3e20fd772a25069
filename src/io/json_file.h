/* A JSON document written as a file (json_file.c): run.json, the MFU peak's cache, an HF folder's config.json,
 * PEFT's adapter_config.json. */
#ifndef DTRAIN_IO_JSON_FILE_H
#define DTRAIN_IO_JSON_FILE_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>

/* j (indented, or on one line) and a newline into path atomically (dt_file_write_atomic); j is deleted either way. */
dt_status dt_json_write_file(cJSON *j, int indented, const char *path);

#endif
