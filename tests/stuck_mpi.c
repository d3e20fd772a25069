/* A fault for the peers' guard (peers_guard.sh): preloaded into one rank
 * (DT_STUCK_RANK, Open MPI's rank variable), its MPI_Test calls go to MPI
 * until the DT_STUCK_AFTER-th, which never returns, as Open MPI 4.1's TCP
 * transport was seen to do after a write to a rank that died. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long calls;

int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status) {
    const char *me = getenv("OMPI_COMM_WORLD_RANK"), *rank = getenv("DT_STUCK_RANK"), *after = getenv("DT_STUCK_AFTER");
    if (me && rank && after && !strcmp(me, rank) && ++calls >= atol(after))
        for (;;) pause(); /* the process's other threads go on: the guard's is the one to end it */
    return PMPI_Test(req, flag, status);
}
