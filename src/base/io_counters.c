/* I/O counters: what this process read from token files and wrote to (or
 * read from) checkpoints, in bytes and seconds, for the metrics and the
 * trace (the per-rank view Darshan gives of a job's I/O). */
#include "dtrain/base.h"

#include <pthread.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t io_bytes[DT_IO_COUNT];
static double io_seconds[DT_IO_COUNT];

void dt_io_count(dt_io_kind k, size_t bytes, double seconds) {
    if ((unsigned)k >= DT_IO_COUNT) return;
    pthread_mutex_lock(&mu);
    io_bytes[k] += bytes;
    io_seconds[k] += seconds;
    pthread_mutex_unlock(&mu);
}

void dt_io_get(dt_io_kind k, uint64_t *bytes, double *seconds) {
    pthread_mutex_lock(&mu);
    *bytes = (unsigned)k < DT_IO_COUNT ? io_bytes[k] : 0;
    *seconds = (unsigned)k < DT_IO_COUNT ? io_seconds[k] : 0;
    pthread_mutex_unlock(&mu);
}
