/* Cross-memory attach between the ranks on this machine (process_vm_readv): a rank copies a peer's private memory
 * straight into its own, one copy by the kernel, where shared memory would take two (the sender's into the segment,
 * the receiver's out of it). Open MPI's shared-memory transport moves its large messages the same way. A sandbox may
 * forbid it (seccomp, Yama's ptrace scope), even one way only: each rank tries once, and a collective reads by it
 * only where every rank's cell says it can. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "comm_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

dt_status dt_cma_read(dt_comm *c, int j, void *dst, uint64_t addr, size_t n, const char *what) {
    if (c->cma <= 0) /* the collective's agreement failed: this rank said in its cell that it cannot */
        return dt_error(DT_ERR_ARG, "%s: a read by cross-memory attach on rank %d, which cannot make one", what, c->rank);
    pid_t pid = atomic_load(&c->seg->hdr->proc[c->proc_of[j]].pid);
    for (size_t done = 0; done < n;) {
        struct iovec to = { (char *)dst + done, n - done }, from = { (void *)(uintptr_t)(addr + done), n - done };
        ssize_t got = process_vm_readv(pid, &to, 1, &from, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return dt_error(DT_ERR_SYS, "%s: reading rank %d's data (pid %d, %zu bytes) by process_vm_readv: %s", what, c->local_members[j],
                            (int)pid, n, got < 0 ? strerror(errno) : "nothing read");
        done += (size_t)got;
    }
    return DT_OK;
}

dt_status dt_cma_write(dt_comm *c, int j, uint64_t addr, const void *src, size_t n, const char *what) {
    if (c->cma <= 0) return dt_error(DT_ERR_ARG, "%s: a write by cross-memory attach on rank %d, which cannot make one", what, c->rank);
    pid_t pid = atomic_load(&c->seg->hdr->proc[c->proc_of[j]].pid);
    for (size_t done = 0; done < n;) {
        struct iovec from = { (char *)src + done, n - done }, to = { (void *)(uintptr_t)(addr + done), n - done };
        ssize_t put = process_vm_writev(pid, &from, 1, &to, 1, 0);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0)
            return dt_error(DT_ERR_SYS, "%s: writing rank %d's data (pid %d, %zu bytes) by process_vm_writev: %s", what, c->local_members[j],
                            (int)pid, n, put < 0 ? strerror(errno) : "nothing written");
        done += (size_t)put;
    }
    return DT_OK;
}

static const uint64_t magic = 0x6d63206e69617274ull;

void dt_cma_register(seg_proc *me) { atomic_store(&me->cma_word, (uint64_t)(uintptr_t)&magic); }

/* A word of every other local rank's read and checked. DTRAIN_CMA=0 turns it off. */
bool dt_cma_ready(dt_comm *c) {
    if (c->cma) return c->cma > 0;
    const char *off = getenv("DTRAIN_CMA");
    bool ok = !(off && !strcmp(off, "0"));
    for (int j = 0; ok && j < c->local_size; j++) {
        if (j == c->local_rank) continue;
        seg_proc *pr = &c->seg->hdr->proc[c->proc_of[j]];
        uint64_t seen = 0, addr = atomic_load(&pr->cma_word);
        struct iovec to = { &seen, sizeof seen }, from = { (void *)(uintptr_t)addr, sizeof seen };
        ok = addr && process_vm_readv(atomic_load(&pr->pid), &to, 1, &from, 1, 0) == (ssize_t)sizeof seen && seen == magic;
    }
    c->cma = ok ? 1 : -1;
    return ok;
}
