/* Atomic file replacement: the old file stays whole until the new one is on
 * disk, so a crash or a full disk during a save never loses the last good
 * checkpoint. */
#include "dtrain/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Removes path.tmp.PID files that a save killed part-way left behind (the
 * process PID is gone): each is as large as the model. */
static void remove_stale_temporaries(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, sizeof dir, "/");
    size_t bl = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".tmp.", 5)) continue;
        char *end;
        long pid = strtol(e->d_name + bl + 5, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (unlink(full) == 0) dt_log(DT_LOG_INFO, "removed %s, left by a save that was killed", full);
    }
    closedir(d);
}

dt_status dt_file_check_writable(const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return dt_error(DT_ERR_ARG, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot be written (%s): checked before training so that no work is lost",
                                path, strerror(errno));
    close(fd);
    unlink(tmp);
    return DT_OK;
}

int dt_file_same(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

dt_status dt_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return dt_error(DT_ERR_ARG, "%s: path too long", path);
    remove_stale_temporaries(path);
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
