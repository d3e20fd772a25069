/* A JSON document written as a file (json_file.h). */
#include "json_file.h"
#include "dtrain/io.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_json_write_file(cJSON *j, int indented, const char *path) {
    char *text = !j ? NULL : indented ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    const void *parts[2] = { text, "\n" };
    size_t sizes[2] = { strlen(text), 1 };
    dt_status st = dt_file_write_atomic(path, parts, sizes, 2);
    free(text);
    return st;
}
