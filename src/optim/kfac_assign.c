/* KAISA's work assignment (kfac.h): which rank decomposes each Linear's factors. */
#include "dtrain/kfac.h"

#include <stdlib.h>

/* The ranks form a grid of grad_workers rows by P = ranks / grad_workers columns (rank r at row r / P, column r % P);
 * a Linear's gradient workers are one column. Largest cost first (the lower index among equals), each goes to the
 * column with the least load, then to that column's least loaded rank (the first among equals). */
void dt_kfac_assign(const double *cost, int n, int ranks, int grad_workers, int *worker) {
    int P = ranks / grad_workers;
    double *load = calloc((size_t)ranks, sizeof *load);
    char *done = calloc((size_t)n + 1, 1);
    for (int step = 0; step < n && load && done; step++) {
        int pick = -1;
        for (int i = 0; i < n; i++)
            if (!done[i] && (pick < 0 || cost[i] > cost[pick])) pick = i;
        int col = 0;
        double best = 0;
        for (int c = 0; c < P; c++) {
            double s = 0;
            for (int r = c; r < ranks; r += P) s += load[r];
            if (c == 0 || s < best) best = s, col = c;
        }
        int w = col;
        for (int r = col; r < ranks; r += P)
            if (load[r] < load[w]) w = r;
        load[w] += cost[pick];
        worker[pick] = w;
        done[pick] = 1;
    }
    if (!load || !done)
        for (int i = 0; i < n; i++) worker[i] = i % ranks; /* out of memory for two small arrays: still a valid spread */
    free(load);
    free(done);
}
