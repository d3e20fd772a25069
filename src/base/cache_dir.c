/* Where dtrain keeps what it can compute again (the machine's measured peak, tokenized fine-tuning data):
 * ${XDG_CACHE_HOME:-~/.cache}/dtrain, or a folder in it. */
#include "dtrain/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int dt_cache_dir(const char *sub, char *out, size_t cap, bool make) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache", home);
    else return -1;
    int n = sub ? snprintf(out, cap, "%s/dtrain/%s", base, sub) : snprintf(out, cap, "%s/dtrain", base);
    if (n < 0 || (size_t)n >= cap) return -1;
    if (!make) return 0;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", base);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/dtrain", base);
    if (mkdir(dir, 0755) && errno != EEXIST) return -1;
    if (sub && mkdir(out, 0755) && errno != EEXIST) return -1;
    return 0;
}
