/* The metrics file of a resumed run: the rows of steps after the checkpoint
 * were lost with the crash and are about to be run again, so they go before
 * the run appends; the file then reads as one run, each step once, in order. */
#include "dtrain/obs.h"
#include "dtrain/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Where the file's whole rows end (after its last newline; 0 where it has none), read back from its end. */
static off_t whole_rows_end(int fd, off_t size) {
    char buf[4096];
    for (off_t end = size; end > 0;) {
        off_t from = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
        ssize_t n = pread(fd, buf, (size_t)(end - from), from);
        if (n <= 0) return size; /* unreadable: left as it is */
        for (ssize_t i = n - 1; i >= 0; i--)
            if (buf[i] == '\n') return from + i + 1;
        end = from;
    }
    return 0;
}

/* Cuts a partial last row off (a write that stopped inside it), so the file holds whole rows that plot and report read. */
static void cut_partial_row(const char *path) {
    int fd = open(path, O_RDWR);
    struct stat st;
    if (fd < 0) return;
    off_t keep = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? whole_rows_end(fd, st.st_size) : -1;
    if (keep >= 0 && keep < st.st_size && ftruncate(fd, keep) != 0)
        dt_log(DT_LOG_WARN, "metrics file %s: its last row is cut short: %s", path, strerror(errno));
    close(fd);
}

bool dt_metrics_flush(FILE **f, const char *path, long step) {
    if (!*f) return true;
    int err = fflush(*f) != 0 ? errno : ferror(*f) ? EIO : 0;
    if (!err) return true;
    dt_log(DT_LOG_WARN, "metrics file %s: cannot write the row of step %ld: %s; the file ends before it (the run goes on)",
           path ? path : "(unnamed)", step, strerror(err));
    fclose(*f); /* which may write more of the row: cut it after */
    *f = NULL;
    if (path) cut_partial_row(path);
    return false;
}
