/* A text file read whole (manifests, configs, metrics, traces, lines of data), with a size
 * cap so that a wrong path to a huge file fails instead of filling memory. */
#include "dtrain/io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

dt_status dt_file_read_text(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return dt_error(DT_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)sb.st_size > max_bytes) {
        fclose(f);
        return dt_error(DT_ERR_IO, "%s: %lld bytes, over the %zu MiB this file may have", path, (long long)sb.st_size, max_bytes >> 20);
    }
    char *t = malloc((size_t)sb.st_size + 1);
    size_t got = t ? fread(t, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (!t) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %lld bytes", path, (long long)sb.st_size);
    if (got != (size_t)sb.st_size) { free(t); return dt_error(DT_ERR_IO, "%s: cannot read", path); }
    t[got] = 0;
    *out = t;
    if (len) *len = got;
    return DT_OK;
}

dt_status dt_file_read_lines(const char *path, size_t max_bytes, char **out, size_t *len) {
    size_t n = 0;
    dt_status st = dt_file_read_text(path, max_bytes, out, &n);
    const char *nul = st ? NULL : memchr(*out, 0, n);
    if (nul) {
        st = dt_error(DT_ERR_IO, "%s: byte %zu is a NUL: a file of lines is text", path, (size_t)(nul - *out));
        free(*out);
        *out = NULL;
        n = 0;
    }
    if (len) *len = n;
    return st;
}
