/* The median of a handful of timings, the figure a measurement repeated
 * a few times reports (the middle one, less moved by a busy moment). */
#include "dtrain/base.h"

#include <stdlib.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dt_median(double *v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
