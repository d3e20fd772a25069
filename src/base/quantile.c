/* Quantiles of a handful of values: the median of timings (the figure a measurement repeated a few times reports, less
 * moved by a busy moment), an entropy quantile's threshold (GRPO's). */
#include "dtrain/base.h"

#include <math.h>
#include <stdlib.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dt_quantile(double *v, size_t n, double q) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, by_value);
    double pos = q * (double)(n - 1), lo = floor(pos);
    size_t i = (size_t)lo, j = i + 1 < n ? i + 1 : i;
    return v[i] + (v[j] - v[i]) * (pos - lo);
}

double dt_median(double *v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
