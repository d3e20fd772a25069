// A delay line for the cluster rig: holds every packet netfilter queues to it
// (NFQUEUE) for a fixed time from its arrival, then lets it go, in arrival
// order. The rig's kernel has no netem (nor fq, whose departure times a BPF
// program could set), so a link's delay is made here, in user space, through
// libnetfilter_queue. Only the packet's id and arrival time cross into user
// space (the payload stays in the kernel), and one verdict releases every
// packet that is due at once.
// The rig queues packets where they enter a machine, which stamps them on
// arrival once any socket asks for receive timestamps (this program's own
// does): the hold runs from that stamp, so this process's wake-up, late by a
// varying 5-30 us, does not add to the delay.
// usage: delayline QUEUE HOLD_US
//   QUEUE    the NFQUEUE number the rig's rule sends packets to
//   HOLD_US  how long each packet is held after it arrived, in microseconds
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

// A timer wakes this process 15-30 us late on the VMs measured (and by more after idle spells), so the last
// SPIN_NS before a packet is due are spent polling: releases land within a few us of their time, and packets
// that arrive meanwhile are taken at once. Spinning happens only while packets are held.
#define SPIN_NS 40000
enum { RING = 1 << 16 }; // more than the queue may hold (its maxlen), so the ring never wraps over itself

typedef struct {
    uint32_t id[RING];
    int64_t due[RING];
    unsigned head, tail; // entries [head, tail) are held, oldest first
    int64_t hold_ns;
} line;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static int64_t now_ns(void) { // the clock of the kernel's arrival stamps
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data) {
    (void)msg;
    line *l = data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (l->tail - l->head >= RING) return nfq_set_verdict(qh, id, NF_DROP, 0, NULL); // cannot happen: maxlen < RING
    l->id[l->tail % RING] = id;
    struct timeval tv;
    int64_t arrived = nfq_get_timestamp(nfa, &tv) == 0 ? (int64_t)tv.tv_sec * 1000000000 + (int64_t)tv.tv_usec * 1000 : now_ns();
    l->due[l->tail % RING] = arrived + l->hold_ns;
    l->tail++;
    return 0;
}

// Releases every held packet that is due: ids rise in arrival order, so one batch verdict covers them.
static void release_due(struct nfq_q_handle *qh, line *l) {
    int64_t t = now_ns();
    unsigned last = l->head;
    while (last != l->tail && l->due[last % RING] <= t) last++;
    if (last == l->head) return;
    nfq_set_verdict_batch(qh, l->id[(last - 1) % RING], NF_ACCEPT);
    l->head = last;
}

static int run(struct nfq_handle *h, struct nfq_q_handle *qh, line *l) {
    static char buf[1 << 16] __attribute__((aligned));
    int fd = nfq_fd(h);
    while (!stop) {
        struct timespec wait = {0, 100000000}, *tw = &wait; // idle: look at the stop flag every 0.1 s
        if (l->head != l->tail) { // sleep until SPIN_NS before the oldest is due, then poll without sleeping
            int64_t left = l->due[l->head % RING] - SPIN_NS - now_ns();
            if (left < 0) left = 0;
            wait.tv_sec = left / 1000000000;
            wait.tv_nsec = left % 1000000000;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int r = ppoll(&p, 1, tw, NULL);
        if (r < 0 && errno != EINTR) return perror("delayline: ppoll"), 1;
        for (;;) { // everything that arrived, without blocking
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) break;
                if (errno == ENOBUFS) continue; // the kernel dropped what did not fit, as a full link's queue would
                return perror("delayline: recv"), 1;
            }
            nfq_handle_packet(h, buf, (int)n);
        }
        release_due(qh, l);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: delayline QUEUE HOLD_US\n");
        return 2;
    }
    static line l;
    l.hold_ns = (int64_t)(atof(argv[2]) * 1000);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); // wake-ups at the due time, not 50 us after it
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    struct nfq_handle *h = nfq_open();
    if (!h) return perror("delayline: nfq_open"), 1;
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)atoi(argv[1]), on_packet, &l);
    if (!qh) return fprintf(stderr, "delayline: queue %s cannot be bound (another listener, or no NFQUEUE)\n", argv[1]), 1;
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(qh, RING / 2) < 0)
        return fprintf(stderr, "delayline: the queue's mode cannot be set\n"), 1;
    nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO); // GSO frames whole, as the link carries them
    nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20);
    int one = 1;
    setsockopt(nfq_fd(h), SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    int stamps = socket(AF_INET, SOCK_DGRAM, 0); // asking for timestamps has the kernel stamp every packet received
    if (stamps < 0 || setsockopt(stamps, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) < 0)
        return perror("delayline: receive timestamps"), 1;
    int rc = run(h, qh, &l);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return rc;
}
