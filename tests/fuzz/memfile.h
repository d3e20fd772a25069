/* The loaders read paths: a fuzz input becomes a file in memory (a memfd)
 * named by /proc/self/fd/N, rewritten for every input, so nothing touches
 * the disk and runs stay fast. */
#ifndef DT_FUZZ_MEMFILE_H
#define DT_FUZZ_MEMFILE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to memory file k (0..3) and returns its path. */
static inline const char *dt_fuzz_file(int k, const uint8_t *data, size_t n) {
    static int fd[4] = { -1, -1, -1, -1 };
    static char path[4][64];
    if (fd[k] < 0) {
        fd[k] = memfd_create("dtrain-fuzz", 0);
        snprintf(path[k], sizeof path[k], "/proc/self/fd/%d", fd[k]);
    }
    if (ftruncate(fd[k], 0) != 0 || (n && pwrite(fd[k], data, n, 0) != (ssize_t)n)) return "/nonexistent";
    return path[k];
}

#endif
