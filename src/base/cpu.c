/* Which CPU this is: every figure names it (machines here differ: Zen 3
 * with AVX2, Zen 4 with AVX-512), and the MFU peak cache is kept per model. */
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>

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
