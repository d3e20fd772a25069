/* This process's resident memory, from /proc/self/status: now (VmRSS) and
 * at its peak (VmHWM). */
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>

/* A size from /proc/self/status ("VmRSS", "VmHWM"), in bytes; 0 if unknown. */
static size_t status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%zu", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

size_t dt_resident_memory(void) { return status_bytes("VmRSS"); }

size_t dt_peak_memory(void) { return status_bytes("VmHWM"); }
