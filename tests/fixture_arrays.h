/* Named f32 arrays from a fixture in the DTFX format the PyTorch scripts
 * write (scripts/fixture_arrays.py): "DTFX", then per array a u32 name
 * length, the name, a u32 dimension count, the u32 dimensions and the
 * values. For the tests that compare with PyTorch; header-only. */
#ifndef DTRAIN_TESTS_FIXTURE_ARRAYS_H
#define DTRAIN_TESTS_FIXTURE_ARRAYS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FX_MAX = 128 };
static struct { char name[48]; size_t n; float *v; } fx_arr[FX_MAX];
static int fx_n;

/* 0 when the whole file was read. */
static int fx_load(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "DTFX", 4)) { if (f) fclose(f); return -1; }
    uint32_t len;
    while (fx_n < FX_MAX && fread(&len, 4, 1, f) == 1) {
        uint32_t nd, d;
        size_t n = 1;
        if (len >= sizeof fx_arr[0].name || fread(fx_arr[fx_n].name, 1, len, f) != len || fread(&nd, 4, 1, f) != 1) break;
        fx_arr[fx_n].name[len] = 0;
        for (uint32_t i = 0; i < nd; i++) {
            if (fread(&d, 4, 1, f) != 1) { fclose(f); return -1; }
            n *= d;
        }
        fx_arr[fx_n].n = n;
        fx_arr[fx_n].v = malloc(n * sizeof(float));
        if (!fx_arr[fx_n].v || fread(fx_arr[fx_n].v, sizeof(float), n, f) != n) { fclose(f); return -1; }
        fx_n++;
    }
    int rest = fgetc(f) != EOF;
    fclose(f);
    return rest ? -1 : 0;
}

/* The array called name (its length in *n); a missing one ends the test. */
static const float *fx_get(const char *name, size_t *n) {
    for (int i = 0; i < fx_n; i++)
        if (!strcmp(fx_arr[i].name, name)) { if (n) *n = fx_arr[i].n; return fx_arr[i].v; }
    printf("FAIL: the fixture has no %s\n", name);
    exit(1);
}

/* The largest |a - b| over the largest |b| (1 where b is all zero): how far a is from the fixture's b. */
static inline double fx_rel_max(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d = e < 0 ? (-e > d ? -e : d) : (e > d ? e : d);
        m = b[i] < 0 ? (-b[i] > m ? -b[i] : m) : (b[i] > m ? b[i] : m);
    }
    return d / (m > 0 ? m : 1);
}

static void fx_free(void) {
    for (int i = 0; i < fx_n; i++) free(fx_arr[i].v);
    fx_n = 0;
}

#endif
