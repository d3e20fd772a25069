/* dtrain ckpt verify: every file of a checkpoint against its manifest (size
 * and hashes, read a chunk at a time), for each step a folder keeps
 * (--keep-last); a resume falls back to the newest whole one with them. */
#include "dtrain/train.h"
#include "checkpoint_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int newest_first(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

int dt_ckpt_steps(const char *dir, int *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < cap;) {
        char *end;
        long s = strncmp(e->d_name, "step-", 5) ? -1 : strtol(e->d_name + 5, &end, 10);
        if (s >= 0 && s <= 1000000000 && !*end) steps[n++] = (int)s;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, newest_first);
    return n;
}

dt_status dt_checkpoint_verify_step(const char *sub, FILE *out) {
    char s[4400], mpath[4500];
    cJSON *j;
    dt_status st = dt_ckpt_open_latest(sub, s, mpath, &j);
    if (st) return st;
    double np = 0, nb = 0;
    if (!(st = dt_ckpt_count(j, "model", "parameters", mpath, 1e15, &np)) && (st = dt_ckpt_count(j, "optimizer", "buffers", mpath, 2, &nb)))
        nb = 1, st = DT_OK; /* an optimizer without the key: one buffer (SGD's momentum) */
    if (!st) st = dt_ckpt_verify_file(s, j, "params.f32", 1, (size_t)np, NULL);
    if (!st) st = dt_ckpt_verify_file(s, j, "optim.f32", nb > 0 ? (int)nb : 1, (size_t)np, NULL);
    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "files"), "buffers.f32");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(bf, "bytes");
    if (!st && cJSON_IsNumber(bytes)) st = dt_ckpt_verify_file(s, j, "buffers.f32", 1, (size_t)(bytes->valuedouble / sizeof(float)), NULL);
    char more[512] = "";
    if (!st) st = dt_ckpt_codec_verify(s, j, more, sizeof more);
    if (!st) st = dt_ckpt_units_verify(s, j, more, sizeof more);
    if (!st && out) fprintf(out, "%s: whole (%.0f parameters; params.f32, optim.f32%s%s match the manifest's sizes and hashes)\n", s, np,
                            cJSON_IsNumber(bytes) ? ", buffers.f32" : "", more);
    cJSON_Delete(j);
    return st;
}

dt_status dt_checkpoint_verify(const char *dir, FILE *out) {
    int steps[256], n = dt_ckpt_steps(dir, steps, 256), bad = 0;
    if (n == 0) return dt_checkpoint_verify_step(dir, out); /* one step's folder, or an error naming what is missing */
    char sub[4400], first[1024] = "";
    for (int i = 0; i < n; i++) {
        snprintf(sub, sizeof sub, "%s/step-%08d", dir, steps[i]);
        if (!dt_checkpoint_verify_step(sub, out)) continue;
        if (!bad++) snprintf(first, sizeof first, "%s", dt_last_error());
        fprintf(out, "%s: DAMAGED: %s\n", sub, dt_last_error());
    }
    return bad ? dt_error(DT_ERR_IO, "%d of %d checkpoint%s in %s damaged (first: %s)", bad, n, n == 1 ? "" : "s", dir, first) : DT_OK;
}
