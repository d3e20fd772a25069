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

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_split: NULL argument");
    *out = NULL;
    int p = c->size;
    int32_t mine[2] = { color < 0 ? -1 : color, key };
    int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)p);
    uint64_t *offs = calloc((size_t)p, sizeof(uint64_t));
    member *mem = malloc(sizeof(member) * (size_t)p);
    dt_comm *nc = NULL;
    dt_status st = (!all || !offs || !mem) ? dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory") : DT_OK;
    if (!st) st = dt_comm_allgather(c, mine, all, 2, DT_I32);
    int n = 0, me = -1;
    if (!st && color >= 0) {
        for (int j = 0; j < p; j++)
            if (all[2 * j] == color) mem[n++] = (member){ all[2 * j + 1], j };
        qsort(mem, (size_t)n, sizeof *mem, by_key);
        int nlocal = 0;
        for (int i = 0; i < n; i++) {
            if (mem[i].rank == c->rank) me = i;
            if (c->local_index[mem[i].rank] >= 0) nlocal++;
        }
        nc = calloc(1, sizeof *nc);
        if (!nc) st = dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory");
        else {
            nc->rank = me;
            nc->world_rank = c->world_rank;
            nc->size = n;
            nc->local_size = nlocal;
            st = dt_comm_alloc_tables(nc);
        }
        if (!st) {
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
            nc->node = c->node;
            nc->seg = c->seg;
            nc->oversubscribed = c->oversubscribed;
            nc->stall_timeout = c->stall_timeout;
            nc->transport = c->transport;
            nc->parent_world = c->parent_world ? c->parent_world : c;
            memcpy(nc->forced, c->forced, sizeof nc->forced);
            if (nc->seg) nc->seg->refs++;
            /* The first member on this machine makes the control block. */
            if (nc->seg && nc->local_size > 1 && nc->local_rank == 0) st = dt_group_create(nc, &offs[c->rank]);
        }
    }
    /* Everyone takes part, whatever happened above, or the others would hang. */
    dt_status st2 = all && offs ? dt_comm_allgather(c, &offs[c->rank], offs, 1, DT_I64) : st;
    if (!st) st = st2;
    if (!st && nc && nc->seg && nc->local_size > 1 && nc->local_rank != 0) {
        int leader_old = mem[0].rank;
        for (int i = 0; i < n; i++)
            if (c->local_index[mem[i].rank] >= 0) { leader_old = mem[i].rank; break; }
        st = dt_group_attach(nc, offs[leader_old]);
    }
    if (!st && nc && nc->local_size <= 1 && nc->size == 1) nc->transport = "self";
#ifdef DT_HAVE_MPI
    if (!st && (c->mpi || nc)) st = dt_mpi_split(c, color, key, nc);
#endif
    free(all);
    free(offs);
    free(mem);
    if (st) {
        if (nc) {
            nc->parent_world = nc->parent_world ? nc->parent_world : c;
            dt_comm_destroy(nc);
        }
        return st;
    }
    *out = nc;
    return DT_OK;
}
