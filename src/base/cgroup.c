/* What this process's control groups allow it: memory and CPU time. Containers (Docker's --memory and --cpus,
 * Kubernetes' limits) and batch systems set them, and the machine's own figures (MemAvailable, the online cores) do
 * not show them: a job that sized itself by those would be killed for memory, or run a thread per core on a quota of
 * two and be throttled every period. */
#include "dtrain/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether a v1 line's controllers ("cpu,cpuacct") include ctl exactly (cpuset and cpuacct are not cpu). */
static bool has_controller(const char *list, const char *ctl) {
    size_t n = strlen(ctl);
    for (const char *p = list; p; p = strchr(p, ',')) {
        p += *p == ',';
        if (!strncmp(p, ctl, n) && (p[n] == ',' || p[n] == 0)) return true;
    }
    return false;
}

/* The number at the start of file (v1's "-1" and v2's "max" read as none: INFINITY); words: its first two. */
static double number_in(const char *dir, const char *file, double *second) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    char a[32] = "", b[32] = "";
    int got = f ? fscanf(f, "%31s %31s", a, b) : 0;
    if (f) fclose(f);
    if (second) *second = got == 2 ? atof(b) : 0;
    char *end;
    double v = strtod(a, &end);
    return got >= 1 && end != a && *end == 0 && v > 0 ? v : INFINITY;
}

/* A group's memory limit in bytes (v2's memory.max, v1's memory.limit_in_bytes). */
static double memory_of(const char *dir, bool v2) {
    return number_in(dir, v2 ? "memory.max" : "memory.limit_in_bytes", NULL);
}

/* A group's CPU quota in cores: the time it may run each period over the period (v2's cpu.max "quota period", v1's
 * cpu.cfs_quota_us and cpu.cfs_period_us). */
static double cpu_of(const char *dir, bool v2) {
    double period = 0, quota = v2 ? number_in(dir, "cpu.max", &period) : number_in(dir, "cpu.cfs_quota_us", NULL);
    if (!v2) period = number_in(dir, "cpu.cfs_period_us", NULL);
    return isfinite(quota) && isfinite(period) && period > 0 ? quota / period : INFINITY;
}

/* The tightest limit that read finds on the process's group and on every parent up to the hierarchy's root, under v2
 * (the one tree at root) or v1 (controller ctl's own tree, mounted at root/<its controllers>); a container's root
 * counts too, where /proc/self/cgroup names a group outside it. */
static double tightest(const char *root, const char *self, const char *ctl, double (*read)(const char *dir, bool v2)) {
    double best = INFINITY;
    FILE *f = fopen(self, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctls = c1 + 1;
        bool v2 = !*ctls; /* "0::/path" */
        if (!v2 && !has_controller(ctls, ctl)) continue;
        char *rel = c2 + 1, dir[4400];
        rel[strcspn(rel, "\n")] = 0;
        for (;;) { /* the group, each parent, then the root ("") */
            snprintf(dir, sizeof dir, "%s%s%s%s", root, v2 ? "" : "/", v2 ? "" : ctls, rel);
            best = fmin(best, read(dir, v2));
            char *slash = strrchr(rel, '/');
            if (!*rel || !slash) break;
            *slash = 0;
        }
    }
    if (f) fclose(f);
    return best;
}

/* A made tree for tests: DTRAIN_CGROUP_ROOT holds the groups and, in its file "self", what /proc/self/cgroup would say. */
static void where(const char **root, const char **self, char *buf, size_t cap) {
    const char *made = getenv("DTRAIN_CGROUP_ROOT");
    if (*root) return;
    *root = made && *made ? made : "/sys/fs/cgroup";
    snprintf(buf, cap, "%s/self", made && *made ? made : "");
    *self = made && *made ? buf : "/proc/self/cgroup";
}

size_t dt_cgroup_memory_limit(const char *root, const char *self) {
    char buf[4200];
    where(&root, &self, buf, sizeof buf);
    double v = tightest(root, self, "memory", memory_of);
    return v < (double)SIZE_MAX ? (size_t)v : SIZE_MAX;
}

double dt_cgroup_cpu_limit(const char *root, const char *self) {
    char buf[4200];
    where(&root, &self, buf, sizeof buf);
    double v = tightest(root, self, "cpu", cpu_of);
    return isfinite(v) ? v : 0;
}
