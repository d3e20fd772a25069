/* Atomic file replacement: the old file stays whole until the new one is on
 * disk, so a crash or a full disk during a save never loses the last good
 * checkpoint. */
#include "dtrain/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

dt_status dt_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return dt_error(DT_ERR_ARG, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i];
        size_t left = sizes[i];
        while (left) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int e = errno;
                close(fd);
                unlink(tmp);
                return dt_error(DT_ERR_IO, "%s: write failed: %s (the previous file is untouched)", path, strerror(e));
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return dt_error(DT_ERR_IO, "%s: fsync failed: %s (the previous file is untouched)", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return dt_error(DT_ERR_IO, "%s: rename failed: %s (the previous file is untouched)", path, strerror(e));
    }
    return DT_OK;
}
