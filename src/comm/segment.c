/* The shared segment: one memfd per machine, mapped by every local rank.
 *
 * A memfd has no name in /dev/shm, so nothing can be left behind however the
 * job ends: the memory goes when the last process holding it goes. It is
 * mapped sparse and large (DTRAIN_SHM_SIZE, default 64 GiB of address space);
 * only pages that are touched cost memory. */
#include "comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SEG_MAGIC 0x6474726169e5e9ull

static dt_status map_fd(int fd, size_t size, dt_segment **out) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED)
        return dt_error(DT_ERR_SYS, "shared segment: mmap of %zu bytes failed: %s", size, strerror(errno));
    dt_segment *s = calloc(1, sizeof *s);
    if (!s) { munmap(p, size); return dt_error(DT_ERR_NOMEM, "shared segment: out of memory"); }
    s->hdr = p;
    s->base = p;
    s->size = size;
    s->fd = fd;
    s->refs = 1;
    *out = s;
    return DT_OK;
}

dt_status dt_segment_create(size_t size, int nprocs, dt_segment **out) {
    if (nprocs < 1 || nprocs > DT_MAX_LOCAL)
        return dt_error(DT_ERR_ARG, "shared segment: %d local ranks (at most %d on one machine)", nprocs, DT_MAX_LOCAL);
    if (size == 0) {
        const char *e = getenv("DTRAIN_SHM_SIZE");
        size = 64ull << 30;
        if (e && dt_parse_size(e, &size) != DT_OK) return DT_ERR_ARG;
    }
    /* Not close-on-exec: `dtrain launch` hands the fd to the programs it execs. */
    int fd = memfd_create("dtrain", 0);
    if (fd < 0) return dt_error(DT_ERR_SYS, "shared segment: memfd_create failed: %s", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return dt_error(DT_ERR_SYS, "shared segment: cannot size it to %zu bytes: %s", size, strerror(e));
    }
    dt_status st = map_fd(fd, size, out);
    if (st) { close(fd); return st; }
    seg_header *h = (*out)->hdr;
    h->magic = SEG_MAGIC;
    h->size = size;
    h->nprocs = nprocs;
    atomic_store(&h->heap_top, (sizeof(seg_header) + 4095) & ~(uint64_t)4095);
    return DT_OK;
}

dt_status dt_segment_attach(int fd, dt_segment **out) {
    seg_header probe;
    if (pread(fd, &probe, sizeof probe.magic + sizeof probe.size, 0) != (ssize_t)(sizeof probe.magic + sizeof probe.size))
        return dt_error(DT_ERR_SYS, "shared segment: fd %d is not readable: %s", fd, strerror(errno));
    if (probe.magic != SEG_MAGIC)
        return dt_error(DT_ERR_ARG, "shared segment: fd %d is not a dtrain segment", fd);
    return map_fd(fd, probe.size, out);
}

void dt_segment_release(dt_segment *s) {
    if (!s || --s->refs > 0) return;
    munmap(s->base, s->size);
    close(s->fd);
    free(s);
}

dt_status dt_segment_alloc(dt_segment *s, size_t bytes, uint64_t *off) {
    size_t align = bytes >= (1u << 16) ? 4096 : 64;
    uint64_t want = (bytes + align - 1) & ~(uint64_t)(align - 1);
    if (want < bytes) return dt_error(DT_ERR_ARG, "shared arena: size %zu overflows", bytes);
    uint64_t top = atomic_load(&s->hdr->heap_top), start;
    do {
        start = (top + align - 1) & ~(uint64_t)(align - 1);
        if (start + want > s->size || start + want < start) {
            char a[32], b[32];
            return dt_error(DT_ERR_NOMEM, "shared arena: %s requested, %s of the segment left (set DTRAIN_SHM_SIZE larger)",
                            dt_format_size(bytes, a, sizeof a), dt_format_size(s->size - top, b, sizeof b));
        }
    } while (!atomic_compare_exchange_weak(&s->hdr->heap_top, &top, start + want));
    *off = start;
    return DT_OK;
}

void dt_segment_free(dt_segment *s, uint64_t off, size_t bytes) {
    /* Whole pages inside the block go back to the system. */
    uint64_t lo = (off + 4095) & ~(uint64_t)4095, hi = (off + bytes) & ~(uint64_t)4095;
    if (hi > lo) fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo, (off_t)(hi - lo));
}

void dt_segment_abort(dt_segment *s, const char *fmt, ...) {
    /* Written before the claim, so the claimed window is one copy: a writer preempted there keeps the others waiting. */
    char msg[sizeof s->hdr->abort_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int32_t expect = 0;
    if (!atomic_compare_exchange_strong(&s->hdr->abort_state, &expect, 1)) return;
    memcpy(s->hdr->abort_msg, msg, sizeof msg);
    atomic_store(&s->hdr->abort_state, 2);
}

const char *dt_segment_abort_message(dt_segment *s) {
    int32_t st = atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire);
    if (st == 0) return NULL;
    /* The writer is a copy from done, unless a busy machine has taken its core (a suite beside another saw ranks
     * give up after a million loads and print no cause): yield to it, for up to a second in case it died there. */
    for (int i = 0; i < 1000 && st == 1; i++) st = atomic_load(&s->hdr->abort_state);
    for (double t0 = dt_time_now(); st == 1 && dt_time_now() - t0 < 1.0;) {
        sched_yield();
        st = atomic_load(&s->hdr->abort_state);
    }
    return st == 2 ? s->hdr->abort_msg : "job aborted";
}

char dt_segment_proc_state(dt_segment *s, int i) {
    pid_t pid = atomic_load(&s->hdr->proc[i].pid);
    char path[64], buf[256];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 'X' : 0; /* gone: reaped */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

bool dt_segment_proc_dead(dt_segment *s, int i) {
    pid_t pid = atomic_load(&s->hdr->proc[i].pid);
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    /* A killed process stays a zombie until its parent reaps it. */
    char st = dt_segment_proc_state(s, i);
    return st == 'Z' || st == 'X';
}
