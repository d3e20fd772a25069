/* dt_comm_split: ranks with the same color form a new communicator, ordered
 * by (key, old rank). The new communicator gets its own control block in
 * the machine's segment, made by its first member on each machine; the
 * offset travels to the others through the parent. */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct { int32_t key, rank; } member;

static int by_key(const void *x, const void *y) {
    const member *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

#ifdef DT_HAVE_MPI
dt_status dt_mpi_split(dt_comm *parent, int color, int key, dt_comm *child);
#endif

/* The members of color (all: every rank's color and key), ordered by (key, old rank). */
static int members_of(const dt_comm *c, const int32_t *all, int color, member *mem) {
    int n = 0;
    for (int j = 0; j < c->size; j++)
        if (all[2 * j] == color) mem[n++] = (member){ all[2 * j + 1], j };
    qsort(mem, (size_t)n, sizeof *mem, by_key);
    return n;
}

/* The child's machines and its members on this one: where each is in the machine's segment. */
static void place_members(const dt_comm *c, const member *mem, int n, dt_comm *nc) {
    int li = 0;
    bool nodes_seen[4096] = { false };
    nc->nodes = 0;
    for (int i = 0; i < n; i++) {
        int old = mem[i].rank;
        nc->node_of[i] = c->node_of[old];
        if (c->node_of[old] < 4096 && !nodes_seen[c->node_of[old]]) { nodes_seen[c->node_of[old]] = true; nc->nodes++; }
        if (c->local_index[old] >= 0) {
            if (old == c->rank) nc->local_rank = li;
            nc->local_members[li] = i;
            nc->proc_of[li] = c->proc_of[c->local_index[old]];
            nc->local_index[i] = li++;
        } else {
            nc->local_index[i] = -1;
        }
    }
}

/* The child communicator of the n members mem (this rank among them), its tables and what it inherits from c; the
 * first member on this machine makes its control block (its offset in *off). */
static dt_status make_child(dt_comm *c, const member *mem, int n, uint64_t *off, dt_comm **out) {
    int nlocal = 0, me = -1;
    for (int i = 0; i < n; i++) {
        if (mem[i].rank == c->rank) me = i;
        if (c->local_index[mem[i].rank] >= 0) nlocal++;
    }
    dt_comm *nc = *out = calloc(1, sizeof *nc);
    if (!nc) return dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory");
    nc->rank = me;
    nc->world_rank = c->world_rank;
    nc->size = n;
    nc->local_size = nlocal;
    dt_status st = dt_comm_alloc_tables(nc);
    if (st) return st;
    place_members(c, mem, n, nc);
    nc->node = c->node;
    nc->seg = c->seg;
    nc->oversubscribed = c->oversubscribed;
    nc->stall_timeout = c->stall_timeout;
    nc->transport = c->transport;
    nc->parent_world = c->parent_world ? c->parent_world : c;
    memcpy(nc->forced, c->forced, sizeof nc->forced);
    if (nc->seg) nc->seg->refs++;
    return nc->seg && nc->local_size > 1 && nc->local_rank == 0 ? dt_group_create(nc, off) : DT_OK;
}

/* A member other than the machine's first attaches to the control block its first member made (offs: every rank's). */
static dt_status attach_child(const dt_comm *c, const member *mem, int n, const uint64_t *offs, dt_comm *nc) {
    int leader_old = mem[0].rank;
    for (int i = 0; i < n; i++)
        if (c->local_index[mem[i].rank] >= 0) { leader_old = mem[i].rank; break; }
    return dt_group_attach(nc, offs[leader_old]);
}

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_split: NULL argument");
    *out = NULL;
    int p = c->size, n = 0;
    int32_t mine[2] = { color < 0 ? -1 : color, key };
    int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)p);
    uint64_t *offs = calloc((size_t)p, sizeof(uint64_t));
    member *mem = malloc(sizeof(member) * (size_t)p);
    dt_comm *nc = NULL;
    dt_status st = (!all || !offs || !mem) ? dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory") : DT_OK;
    if (!st) st = dt_comm_allgather(c, mine, all, 2, DT_I32);
    if (!st && color >= 0) {
        n = members_of(c, all, color, mem);
        st = make_child(c, mem, n, &offs[c->rank], &nc);
    }
    /* Everyone takes part, whatever happened above, or the others would hang. */
    dt_status st2 = all && offs ? dt_comm_allgather(c, &offs[c->rank], offs, 1, DT_I64) : st;
    if (!st) st = st2;
    if (!st && nc && nc->seg && nc->local_size > 1 && nc->local_rank != 0) st = attach_child(c, mem, n, offs, nc);
    if (!st && nc && nc->local_size <= 1 && nc->size == 1) nc->transport = "self";
#ifdef DT_HAVE_MPI
    if (!st && (c->mpi || nc)) st = dt_mpi_split(c, color, key, nc);
#endif
    free(all);
    free(offs);
    free(mem);
    if (st && nc) {
        nc->parent_world = nc->parent_world ? nc->parent_world : c;
        dt_comm_destroy(nc);
    }
    if (st) return st;
    *out = nc;
    return DT_OK;
}
