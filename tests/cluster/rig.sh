# The cluster rig: K "machines" on one box, each a network namespace with a
# UTS namespace of its own (its host name) and an address on a switch, a
# bridge in a namespace of its own, so that no packet of the rig touches the
# box's own interfaces. The links' rate is shaped with tc (tbf). Open MPI
# reaches the machines through tests/cluster/netns-agent.sh instead of ssh,
# so each runs its own daemon: ranks on different machines talk over TCP,
# ranks on the same one over shared memory.
# Sourced; every function's state is in RIG_* variables; rig_down runs on
# exit whatever happens (and is safe to run twice).
#   rig_up K [RATE]      machines $RIG_PREFIX-1..K (RATE: tbf rate on each link, e.g. 1gbit; default none)
#   rig_mpirun ARGS...   mpirun from machine 1 over all of them (a host file of their names)
#   rig_down             every process in the namespaces killed, the namespaces removed
RIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RIG_PREFIX=${RIG_PREFIX:-dtm$$}
RIG_NET=${RIG_NET:-10.213.$(( $$ % 250 ))}
RIG_K=0

# Why the rig cannot start here, or nothing.
rig_unavailable() {
    [ "$(id -u)" = 0 ] || { echo "the cluster rig needs root (network namespaces)"; return; }
    command -v ip > /dev/null || { echo "the cluster rig needs ip (Debian's iproute2)"; return; }
    command -v unshare > /dev/null || { echo "the cluster rig needs unshare (util-linux)"; return; }
    command -v tc > /dev/null || { echo "the cluster rig needs tc (Debian's iproute2)"; return; }
    command -v nft > /dev/null || { echo "the cluster rig needs nft (Debian's nftables) for a lossy link"; return; }
    ip netns add "${RIG_PREFIX}-probe" 2> /dev/null || { echo "network namespaces cannot be made here (ip netns add failed)"; return; }
    ip netns del "${RIG_PREFIX}-probe"
}

# Namespaces of PREFIX, their processes killed, removed; no state needed (the reaper calls it too).
rig_remove() {
    local prefix=$1 m pids t
    for m in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$prefix-"); do
        pids=$(ip netns pids "$m" 2> /dev/null)
        [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    done
    for m in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$prefix-"); do
        for ((t = 0; t < 50; t++)); do [ -z "$(ip netns pids "$m" 2> /dev/null)" ] && break; sleep 0.1; done
        ip netns del "$m" 2> /dev/null
    done
}

rig_up() {
    local k=$1 rate=${2:-} i m
    trap rig_down EXIT
    trap 'rig_down; exit 130' INT
    trap 'rig_down; exit 143' TERM
    # a test killed by SIGKILL runs no trap: a reaper outside it removes the rig once the test's process is gone
    (setsid bash -c ". '$RIG_DIR/rig.sh'; while kill -0 $$ 2> /dev/null; do sleep 0.5; done; rig_remove '$RIG_PREFIX'" \
        > /dev/null 2>&1 < /dev/null &)
    ip netns add "$RIG_PREFIX-sw" || return 1
    ip -n "$RIG_PREFIX-sw" link add br0 type bridge && ip -n "$RIG_PREFIX-sw" link set br0 up || return 1
    for ((i = 1; i <= k; i++)); do
        m=$RIG_PREFIX-$i
        ip netns add "$m" || return 1
        RIG_K=$i
        ip link add "${RIG_PREFIX}v$i" type veth peer name eth0 netns "$m" || return 1
        ip link set "${RIG_PREFIX}v$i" netns "$RIG_PREFIX-sw" || return 1
        ip -n "$RIG_PREFIX-sw" link set "${RIG_PREFIX}v$i" master br0 up || return 1
        ip -n "$m" addr add "$RIG_NET.$i/24" dev eth0 && ip -n "$m" link set eth0 up && ip -n "$m" link set lo up || return 1
        if [ -n "$rate" ]; then # both directions: the machine's egress, and the switch's port towards it
            ip netns exec "$m" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms || return 1
            ip netns exec "$RIG_PREFIX-sw" tc qdisc add dev "${RIG_PREFIX}v$i" root tbf rate "$rate" burst 256kb latency 50ms || return 1
        fi
        # every machine knows the others by name
        RIG_HOSTS="${RIG_HOSTS:-}$RIG_NET.$i $m"$'\n'
    done
    RIG_HOSTFILE=$(mktemp)
    for ((i = 1; i <= k; i++)); do echo "$RIG_PREFIX-$i slots=64" >> "$RIG_HOSTFILE"; done
}

# COMMAND in machine I (under its host name).
rig_exec() {
    local i=$1
    shift
    ip netns exec "$RIG_PREFIX-$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$RIG_PREFIX-$i" "$@"
}

# mpirun over the machines, started on machine 1: Open MPI's own daemons on each, TCP between them.
rig_mpirun() {
    rig_exec 1 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_plm_rsh_agent="$RIG_DIR/netns-agent.sh" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
        OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 \
        OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
        mpirun --hostfile "$RIG_HOSTFILE" "$@"
}

# The switch drops PER_MILLE of every 1000 TCP frames it forwards, at random, both directions (netem's loss is
# not in every kernel; nftables' random numbers are). 0 lifts it. Frames are the veths' GSO frames, so a
# drop loses a burst of segments: by bytes the same fraction, harsher on TCP than single-segment loss.
rig_loss() {
    local sw=$RIG_PREFIX-sw
    ip netns exec "$sw" nft delete table bridge rig 2> /dev/null
    [ "$1" = 0 ] && return
    ip netns exec "$sw" nft -f - << NFT
table bridge rig {
    chain forward {
        type filter hook forward priority 0;
        meta l4proto tcp numgen random mod 1000 < $1 counter drop
        counter
    }
}
NFT
}

# "DROPPED SEEN": frames the switch dropped and frames it let through since rig_loss.
rig_loss_counts() {
    ip netns exec "$RIG_PREFIX-sw" nft list table bridge rig | grep -o 'packets [0-9]*' | awk '{printf "%s ", $2}'
}

rig_down() {
    rig_remove "$RIG_PREFIX"
    [ -n "${RIG_HOSTFILE:-}" ] && rm -f "$RIG_HOSTFILE"
    RIG_K=0
}
