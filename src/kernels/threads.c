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

#if defined(DT_OMP_SERIAL) && defined(_OPENMP)
/* ThreadSanitizer's build: libgomp is not instrumented, so TSan takes the hand-offs at its barriers for races (every
 * parallel loop would report one). There OpenMP and BLAS run one thread, from the start (a test that never sets the
 * threads too); the Release and ASan builds run them threaded, and TSan checks dtrain's own threads. */
__attribute__((constructor)) static void serial_openmp(void) {
    omp_set_num_threads(1);
    set_blas_threads(1);
}
#endif

void dt_kernels_set_threads(int n) {
    if (n <= 0) n = dt_cpu_allowed();
#ifdef DT_OMP_SERIAL
    n = 1;
#endif
    threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    set_blas_threads(n);
}

int dt_kernels_threads(void) { return threads; }
