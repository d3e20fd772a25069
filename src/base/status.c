/* Error reporting: one message per thread, set where the failure is
 * understood and read where it is reported. */
#include "dtrain/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *dt_last_error(void) { return last_error[0] ? last_error : "no error"; }

/* Formatted aside first, so that a message may wrap the previous one
 * (dt_error(st, "%s: %s", path, dt_last_error())). */
dt_status dt_error(dt_status s, const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return s;
}

const char *dt_status_name(dt_status s) {
    switch (s) {
    case DT_OK: return "ok";
    case DT_ERR_ARG: return "bad argument";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_SYS: return "system error";
    case DT_ERR_PEER: return "peer failure";
    case DT_ERR_MISMATCH: return "collective mismatch";
    case DT_ERR_IO: return "i/o error";
    case DT_ERR_UNSUPPORTED: return "unsupported";
    case DT_ERR_NUMERIC: return "numeric";
    }
    return "unknown status";
}
