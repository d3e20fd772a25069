/* The learner's record of its actors (actors.c), shared with the part that
 * reaches actors on other machines (actors_remote.c). */
#ifndef DTRAIN_RL_ACTORS_INTERNAL_H
#define DTRAIN_RL_ACTORS_INTERNAL_H

#include "actors.h"

#include <poll.h>

typedef struct {
    int alive, greeted; /* greeted: an actor on another machine was sent its settings */
    int full;    /* slots it said are full, not yet taken */
    int next;    /* the slot take gives next: an actor fills its slots in turn, the learner takes and frees them in turn */
    int pid, fd; /* a local actor's process and socket */
    /* an actor on another machine (rank i + 1): its slots' receives (done[s]: slot s arrived), control byte, weights */
    dt_peer_msg *slot_in[DT_ACTOR_SLOTS], *ctl_in, *ready_in, *w_out;
    int done[DT_ACTOR_SLOTS];
    /* what the learner owes it (weights newer than it has, slots freed, an answer to its heartbeat), written only in
     * reply to a message of its (credit): see actors_remote.c */
    int owed, frees, answer, credit;
    char ctl, host[DT_ACTOR_HOST];
    float *wbuf;  /* [version (int64)][parameters], in flight while w_out is */
    double heard;     /* when it was last heard from */
    double credit_at; /* when its credit was given */
} actor;

struct dt_rl_actors {
    dt_actor_shared *h;
    int na, live, last;
    actor *a;
    struct pollfd *p; /* take's, one an actor */
    dt_peers *peers;  /* NULL: local actors */
    double timeout;
    int lost_any;
};

/* The actors on the job's other ranks told the settings (h, written) and ready, each within the start's limit. */
dt_status dt_actors_remote_start(dt_rl_actors *a);
/* Waits a little, then hears each live actor (one gone is the caller's lost to say and leave out: why "silent" or
 * what it said), answering what it sent with what it is owed. */
void dt_actors_remote_wait(dt_rl_actors *a, void (*lost)(dt_rl_actors *, int, const char *));
void dt_actors_remote_tell(dt_rl_actors *a, int i, char c);
/* The slot take gave last of actor i's free again: its receive posted anew, the actor told. */
void dt_actors_remote_release(dt_rl_actors *a, int i);
/* The weights in h sent to each live actor (after the one in flight, if any). */
void dt_actors_remote_publish(dt_rl_actors *a);
/* An actor left out: its messages dropped. */
void dt_actors_remote_forget(dt_rl_actors *a, int i);
/* Every live actor heard once more (one silent for the timeout: lost), then told the end (it finalizes MPI only when no
 * rank was lost), the messages dropped. */
void dt_actors_remote_end(dt_rl_actors *a, void (*lost)(dt_rl_actors *, int, const char *));

#endif
