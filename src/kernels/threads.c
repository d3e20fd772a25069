/* One thread budget for OpenMP loops and BLAS: they never run at the same
 * time, so both get the whole budget, and together they never oversubscribe. */
#include "dtrain/kernels.h"

#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef DT_BLAS_BLIS
void bli_thread_set_num_threads(long n);
#define set_blas_threads(n) bli_thread_set_num_threads(n)
#else
void openblas_set_num_threads(int n);
#define set_blas_threads(n) openblas_set_num_threads(n)
#endif

static int threads = 1;

void dt_kernels_set_threads(int n) {
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    set_blas_threads(n);
}

int dt_kernels_threads(void) { return threads; }
