/* The metrics file of a resumed run: the rows of steps after the checkpoint
 * were lost with the crash and are about to be run again, so they go before
 * the run appends; the file then reads as one run, each step once, in order. */
#include "dtrain/obs.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_metrics_truncate(const char *path, int last_step, int *dropped) {
    char *text = NULL;
    size_t len = 0;
    *dropped = 0;
    FILE *probe = fopen(path, "rb");
    if (!probe) return DT_OK; /* nothing written yet */
    fclose(probe);
    dt_status st = dt_file_read_text(path, (size_t)1 << 32, &text, &len);
    if (st) return st;
    char *out = malloc(len + 1);
    if (!out) { free(text); return dt_error(DT_ERR_NOMEM, "%s: out of memory", path); }
    size_t n = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t ll = end ? (size_t)(end - line) + 1 : strlen(line);
        int step = 0;
        /* rows start {"step":N (write_metrics); anything else is kept as it is */
        bool later = sscanf(line, "{\"step\":%d", &step) == 1 && step > last_step;
        if (later) (*dropped)++;
        else { memcpy(out + n, line, ll); n += ll; }
        line += ll;
    }
    free(text);
    st = *dropped ? dt_file_write_atomic(path, (const void *const[]){ out }, (const size_t[]){ n }, 1) : DT_OK;
    free(out);
    return st;
}
