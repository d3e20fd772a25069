/* The machine's cache of measured rates (obs/peak.c): the plan's timings at the shapes it priced are kept to the newest
 * 1024 ("plan_..." keys, most recently written first), the machine's own rates always; a cache in a scratch
 * XDG_CACHE_HOME. */
#include "dtrain/obs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;
#define EXPECT(cond, ...) do { if (!(cond)) { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

int main(void) {
    char dir[] = "/tmp/dtrain-peak-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("XDG_CACHE_HOME", dir, 1);
    EXPECT(!dt_peak_save_rate("memory_gbs_2_cores", 12.5), "saving a rate: %s", dt_last_error());
    char key[64];
    for (int i = 0; i < 1100; i++) {
        snprintf(key, sizeof key, "plan_shape_%d", i);
        EXPECT(!dt_peak_save_rate(key, i + 1), "saving %s: %s", key, dt_last_error());
    }
    double v = 0;
    int plan = 0;
    for (int i = 0; i < 1100; i++) {
        snprintf(key, sizeof key, "plan_shape_%d", i);
        plan += dt_peak_lookup(key, &v);
    }
    EXPECT(dt_peak_lookup("memory_gbs_2_cores", &v) && v == 12.5, "the machine's own rate kept: %g", v);
    EXPECT(dt_peak_lookup("plan_shape_1099", &v) && v == 1100, "the newest shape kept");
    EXPECT(!dt_peak_lookup("plan_shape_0", &v) && !dt_peak_lookup("plan_shape_75", &v), "the oldest shapes pushed out");
    EXPECT(dt_peak_lookup("plan_shape_76", &v), "the 1024th newest kept");
    EXPECT(plan == 1024, "%d shapes kept (1024)", plan);
    char path[128];
    snprintf(path, sizeof path, "%s/dtrain/peak.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/dtrain", dir);
    remove(path);
    remove(dir);
    printf("%s: %d plan shapes kept of 1100 written, the machine's rate kept\n", failed ? "FAILED" : "ok", plan);
    return failed != 0;
}
