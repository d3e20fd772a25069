/* Cache-line aligned allocation: keeps vector loads aligned and stops two
 * buffers from sharing a line. */
#include "dtrain/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void *dt_alloc_aligned(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void *dt_alloc_streamed(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < 4 * huge) return dt_alloc_aligned(bytes);
    void *p = NULL;
    size_t whole = (bytes + huge - 1) & ~(huge - 1);
    if (whole < bytes || posix_memalign(&p, huge, whole) != 0) return NULL;
    (void)madvise(p, whole, MADV_HUGEPAGE); /* advice: where the system has none to give, 4 KB pages as before */
    return p;
}

void dt_free_aligned(void *p) { free(p); }

void *dt_mem_zero_edges(void *p, size_t bytes, size_t *whole) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), s = (uintptr_t)p, e = s + bytes, a = (s + page - 1) & ~(page - 1),
              b = e & ~(page - 1);
    *whole = 0;
    if (b <= a) { memset(p, 0, bytes); return NULL; }
    memset(p, 0, a - s);
    memset((void *)b, 0, e - b);
    *whole = b - a;
    return (void *)a;
}

void dt_mem_release(void *p, size_t bytes) {
    size_t whole;
    void *a = dt_mem_zero_edges(p, bytes, &whole);
    if (whole) madvise(a, whole, MADV_DONTNEED);
}

size_t dt_mem_resident(const void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), s = (uintptr_t)p & ~(page - 1), e = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
    if (!bytes) return 0;
    size_t n = (e - s) / page, got = 0;
    unsigned char *v = malloc(n);
    if (!v || mincore((void *)s, e - s, v) != 0) { free(v); return bytes; } /* unknown: count it all */
    for (size_t i = 0; i < n; i++) got += v[i] & 1;
    free(v);
    /* the partial pages at the ends count whole: what the system holds for the range */
    return got * page < bytes ? got * page : bytes;
}

/* A 64-byte header before the block keeps the mapping's length (and the block 64-byte aligned). */
void *dt_alloc_zeroed(size_t bytes) {
    if (bytes > SIZE_MAX - 64) return NULL;
    void *m = mmap(NULL, bytes + 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    *(size_t *)m = bytes;
    return (char *)m + 64;
}

void dt_free_zeroed(void *p) {
    if (!p) return;
    char *m = (char *)p - 64;
    munmap(m, *(size_t *)m + 64);
}
