/* Logging to stderr with a rank prefix, so interleaved output of many ranks
 * stays attributable. */
#include "dtrain/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static int log_rank = -1;
static dt_log_level log_level = DT_LOG_INFO;

void dt_log_set_rank(int rank) { log_rank = rank; }
void dt_log_set_level(dt_log_level level) { log_level = level; }

void dt_log(dt_log_level level, const char *fmt, ...) {
    if (level > log_level) return;
    static const char *names[] = { "error", "warning", "info", "debug" };
    char line[2048];
    int n;
    if (log_rank >= 0)
        n = snprintf(line, sizeof line, "dtrain[rank %d] %s: ", log_rank, names[level]);
    else
        n = snprintf(line, sizeof line, "dtrain %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* One write per line so lines of different ranks do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
