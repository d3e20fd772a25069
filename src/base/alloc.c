/* Cache-line aligned allocation: keeps vector loads aligned and stops two
 * buffers from sharing a line. */
#include "dtrain/base.h"

#include <stdlib.h>

void *dt_alloc_aligned(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void dt_free_aligned(void *p) { free(p); }
