/* Which CPU this is: every figure names it (machines here differ: Zen 3
 * with AVX2, Zen 4 with AVX-512), and the MFU peak cache is kept per model. */
#include "dtrain/base.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dt_cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return out;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = 0;
        snprintf(out, cap, "%s", colon);
        break;
    }
    fclose(f);
    return out;
}

/* Whether /proc/cpuinfo's flags list flag (avx512_bf16, f16c, ...): what the
 * kernel says this CPU can do, as the user would check it. */
bool dt_cpu_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char *line = NULL; /* getline: a flags line has no length limit worth guessing */
    size_t cap = 0, n = strlen(flag);
    bool found = false;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "flags", 5)) continue;
        for (char *p = strstr(line, flag); p && !found; p = strstr(p + 1, flag))
            found = (p == line || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\n' || p[n] == 0);
        break; /* the first processor's flags */
    }
    free(line);
    fclose(f);
    return found;
}

/* The quota's whole cores: OpenMP's teams meet at a barrier after every parallel loop, and a thread throttled for the
 * rest of a period holds the others there, so 2.5 cores' worth runs 2 threads, not 3 (and never fewer than 1). */
static long quota_cores(void) {
    double q = dt_cgroup_cpu_limit(NULL, NULL);
    return q <= 0 ? 0 : q < 1 ? 1 : (long)q;
}

int dt_cpu_cores(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN), q = quota_cores();
    if (online < 1) online = 1;
    return (int)(q && q < online ? q : online);
}

int dt_cpu_allowed(void) {
    cpu_set_t set;
    int cores = dt_cpu_cores(), mask = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : cores;
    return mask < cores ? mask : cores;
}
