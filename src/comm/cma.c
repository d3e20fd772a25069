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

/* n bytes between local memory and addr in local rank j's: process_vm_readv or process_vm_writev (one signature) */
static dt_status move(dt_comm *c, int j, void *local, uint64_t addr, size_t n, bool write, const char *what) {
    const char *verb = write ? "write" : "read";
    if (c->cma <= 0) /* the collective's agreement failed: this rank said in its cell that it cannot */
        return dt_error(DT_ERR_ARG, "%s: a %s by cross-memory attach on rank %d, which cannot make one", what, verb, c->rank);
    ssize_t (*op)(pid_t, const struct iovec *, unsigned long, const struct iovec *, unsigned long, unsigned long) =
        write ? process_vm_writev : process_vm_readv;
    pid_t pid = atomic_load(&c->seg->hdr->proc[c->proc_of[j]].pid);
    for (size_t done = 0; done < n;) {
        struct iovec mine = { (char *)local + done, n - done }, theirs = { (void *)(uintptr_t)(addr + done), n - done };
        ssize_t got = op(pid, &mine, 1, &theirs, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return dt_error(DT_ERR_SYS, "%s: a %s of rank %d's memory (pid %d, %zu bytes) by cross-memory attach: %s", what, verb,
                            c->local_members[j], (int)pid, n, got < 0 ? strerror(errno) : "nothing moved");
        done += (size_t)got;
    }
    return DT_OK;
}

dt_status dt_cma_read(dt_comm *c, int j, void *dst, uint64_t addr, size_t n, const char *what) { return move(c, j, dst, addr, n, false, what); }

dt_status dt_cma_write(dt_comm *c, int j, uint64_t addr, const void *src, size_t n, const char *what) {
    return move(c, j, (void *)src, addr, n, true, what);
}

static const uint64_t magic = 0x6d63206e69617274ull;

void dt_cma_register(seg_proc *me) { atomic_store(&me->cma_word, (uint64_t)(uintptr_t)&magic); }

/* A word of every other local rank's read and checked (a rank not registered yet: not now, tried again next time).
 * DTRAIN_CMA=0 turns it off. */
bool dt_cma_ready(dt_comm *c) {
    if (c->cma) return c->cma > 0;
    const char *off = getenv("DTRAIN_CMA");
    bool ok = !(off && !strcmp(off, "0"));
    for (int j = 0; ok && j < c->local_size; j++) {
        if (j == c->local_rank) continue;
        seg_proc *pr = &c->seg->hdr->proc[c->proc_of[j]];
        uint64_t seen = 0, addr = atomic_load(&pr->cma_word);
        if (!addr) return false;
        struct iovec to = { &seen, sizeof seen }, from = { (void *)(uintptr_t)addr, sizeof seen };
        ok = process_vm_readv(atomic_load(&pr->pid), &to, 1, &from, 1, 0) == (ssize_t)sizeof seen && seen == magic;
    }
    c->cma = ok ? 1 : -1;
    return ok;
}
