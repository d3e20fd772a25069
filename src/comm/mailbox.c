/* A mailbox: messages one way between the two ranks of a communicator on
 * one machine, through slots in the shared arena. The sender copies a
 * message into the next free slot and goes on: it waits only while every
 * slot still holds a message the receiver has not released. The receiver
 * reads a message where it lies (no copy out) and releases the slot when its
 * computation has read it. There is no rendezvous, no chunking and no
 * progress thread: a pipeline stage hands its neighbour an activation at
 * memory speed and computes on, whatever the neighbour is doing. Waits are
 * the collectives' (spin, yield, sleep; a dead peer or a stall named). */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

/* The counters on cache lines of their own: each is written by one side only. */
typedef struct {
    _Alignas(64) _Atomic uint64_t posted; /* messages put (the sender's) */
    _Alignas(64) _Atomic uint64_t taken;  /* messages released (the receiver's) */
} box_hdr;

struct dt_mailbox {
    dt_comm *c;
    box_hdr *h;
    uint8_t *data; /* slots x bytes */
    size_t bytes, stride, block; /* a message, a slot (whole cache lines), the shared block */
    int slots, sender, peer; /* this rank sends (1) or receives (0); the other's local index */
    uint64_t got;            /* receiver: messages handed out so far */
};

dt_status dt_mailbox_create(dt_comm *c, int sender, size_t bytes, int slots, dt_mailbox **out) {
    *out = NULL;
    if (!c || dt_comm_size(c) != 2 || sender < 0 || sender > 1 || slots < 1 || !bytes)
        return dt_error(DT_ERR_ARG, "mailbox: a two-rank communicator, a sender 0 or 1, slots and bytes above 0");
    dt_mailbox *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "mailbox: out of memory");
    m->c = c, m->bytes = bytes, m->slots = slots, m->sender = dt_comm_rank(c) == sender;
    m->stride = (bytes + 63) & ~(size_t)63;
    m->block = sizeof(box_hdr) + m->stride * (size_t)slots;
    void *p = NULL;
    /* collective; fresh pages read as zeros: both counters start at 0 */
    dt_status st = dt_comm_alloc_shared(c, m->block, &p);
    if (st) { free(m); return st; }
    m->h = p;
    m->data = (uint8_t *)p + sizeof(box_hdr);
    m->peer = c->local_index[1 - dt_comm_rank(c)];
    *out = m;
    return DT_OK;
}

void dt_mailbox_destroy(dt_mailbox *m) {
    if (!m) return;
    /* the receiver reads last: its side gives the pages back */
    if (!m->sender) dt_segment_free(m->c->seg, (uint64_t)((uint8_t *)m->h - (uint8_t *)m->c->seg->base), m->block);
    free(m);
}

static uint8_t *slot(const dt_mailbox *m, uint64_t k) { return m->data + (size_t)(k % (uint64_t)m->slots) * m->stride; }

static bool has_room(void *arg) {
    dt_mailbox *m = arg;
    return atomic_load_explicit(&m->h->posted, memory_order_relaxed) - atomic_load_explicit(&m->h->taken, memory_order_acquire) <
           (uint64_t)m->slots;
}

static bool has_mail(void *arg) {
    dt_mailbox *m = arg;
    return atomic_load_explicit(&m->h->posted, memory_order_acquire) > m->got;
}

/* A put or get, shown as the send or receive it is (in floats: the pipeline's messages are) to a rank that stops
 * in it or after it; waiting, if cond does not hold yet. */
static dt_status transfer(dt_mailbox *m, wait_cond cond) {
    dt_comm *c = m->c;
    int other = 1 - dt_comm_rank(c);
    coll_args a = { .coll = DT_COLL_SENDRECV, .dtype = DT_F32, .count = m->bytes / sizeof(float), .root = m->sender ? other : -1,
                    .source = m->sender ? -1 : other };
    /* as point-to-point calls are: seq 0, which no collective's descriptor is compared with */
    call_desc saved = c->cur;
    uint64_t seq = c->seq;
    c->seq = 0;
    c->cur = (call_desc){ .coll = DT_COLL_SENDRECV, .dtype = DT_F32, .count = a.count };
    dt_activity_p2p(c, &a, 1);
    dt_status st = cond(m) ? DT_OK : dt_shm_wait(c, cond, m, m->peer);
    dt_activity_p2p(c, &a, 0);
    c->cur = saved;
    c->seq = seq;
    return st;
}

dt_status dt_mailbox_put(dt_mailbox *m, const void *buf) {
    if (!m->sender) return dt_error(DT_ERR_ARG, "mailbox: put on the receiving side");
    dt_status st = transfer(m, has_room);
    if (st) return st;
    uint64_t k = atomic_load_explicit(&m->h->posted, memory_order_relaxed);
    memcpy(slot(m, k), buf, m->bytes);
    atomic_store_explicit(&m->h->posted, k + 1, memory_order_release);
    dt_shm_notify(m->c, m->peer);
    return DT_OK;
}

dt_status dt_mailbox_get(dt_mailbox *m, const void **buf) {
    *buf = NULL;
    if (m->sender) return dt_error(DT_ERR_ARG, "mailbox: get on the sending side");
    if (m->got - atomic_load_explicit(&m->h->taken, memory_order_relaxed) >= (uint64_t)m->slots)
        return dt_error(DT_ERR_ARG, "mailbox: %d messages held, none released", m->slots);
    dt_status st = transfer(m, has_mail);
    if (st) return st;
    *buf = slot(m, m->got++);
    return DT_OK;
}

void dt_mailbox_release(dt_mailbox *m) {
    if (m->sender) return;
    uint64_t t = atomic_load_explicit(&m->h->taken, memory_order_relaxed);
    if (t == m->got) return; /* nothing held */
    atomic_store_explicit(&m->h->taken, t + 1, memory_order_release);
    dt_shm_notify(m->c, m->peer);
}
