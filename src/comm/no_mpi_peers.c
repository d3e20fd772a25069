/* Peers (see comm.h) in a build without MPI: nothing to reach. */
#include "dtrain/comm.h"
#include "dtrain/base.h"

#include <stddef.h>

dt_status dt_peers_create(dt_peers **out) {
    *out = NULL;
    return dt_error(DT_ERR_ARG, "this dtrain was built without MPI: actors on other machines need libopenmpi-dev and a rebuild");
}
void dt_peers_destroy(dt_peers *p) { (void)p; }
void dt_peers_lost(dt_peers *p) { (void)p; }
dt_status dt_peers_guard(dt_peers *p, double seconds) { (void)p; (void)seconds; return DT_OK; }
int dt_peers_rank(const dt_peers *p) { (void)p; return 0; }
int dt_peers_size(const dt_peers *p) { (void)p; return 1; }
dt_status dt_peers_send(dt_peers *p, int peer, int tag, const void *buf, size_t bytes, dt_peer_msg **out) {
    (void)p; (void)peer; (void)tag; (void)buf; (void)bytes;
    *out = NULL;
    return dt_error(DT_ERR_ARG, "peers: no MPI in this build");
}
dt_status dt_peers_recv(dt_peers *p, int peer, int tag, void *buf, size_t bytes, dt_peer_msg **out) {
    return dt_peers_send(p, peer, tag, buf, bytes, out);
}
void dt_peers_say(dt_peers *p, int peer, int tag, const void *buf, size_t bytes) { (void)p; (void)peer; (void)tag; (void)buf; (void)bytes; }
int dt_peers_done(dt_peer_msg **m) { (void)m; return 1; }
void dt_peers_drop(dt_peer_msg **m) { *m = NULL; }
