# The cluster rig: K "machines" on one box, each a network namespace with a
# UTS namespace of its own (its host name) and an address on a switch, a
# bridge in a namespace of its own, so that no packet of the rig touches the
# box's own interfaces. The links' rate is shaped with tc (tbf). Open MPI
# reaches the machines through tests/cluster/netns-agent.sh instead of ssh,
# so each runs its own daemon: ranks on different machines talk over TCP,
# ranks on the same one over shared memory.
# Sourced; every function's state is in RIG_* variables; rig_down runs on
# exit whatever happens (and is safe to run twice).
#   rig_up K [RATE] [US] machines $RIG_PREFIX-1..K (RATE: tbf rate on each link, e.g. 1gbit; US: one-way delay;
#                        RATE:US names both; $RIG_BURST: tbf's bucket, 256kb unless given: what an idle link sends
#                        at the veth's own speed before the rate holds; $RIG_QUEUE: how long a packet may wait
#                        in tbf's queue before it is dropped, 50ms unless given)
#   rig_delay US         every machine's incoming packets held US microseconds (one way), measured
#   rig_rate             a TCP transfer's rate from machine 1 to 2 now, in Mbit/s
#   rig_one_way          the one-way delay now: half a TCP round trip's growth over the bare link's, in us
#   rig_mpirun ARGS...   mpirun from machine 1 over all of them (a host file of their names)
#   rig_down             every process in the namespaces killed, the namespaces removed
RIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RIG_PREFIX=${RIG_PREFIX:-dtm$$}
RIG_NET=${RIG_NET:-10.213.$(( $$ % 250 ))}
RIG_K=0
RIG_DELAYLINE=${RIG_DELAYLINE:-$RIG_DIR/../../build/tests/delayline}

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

# A test's start: exits 77 (skipped, saying why) where the rig cannot be made for want of root or tools; as root a
# rig that cannot be made is a failure (exit 1).
rig_require() {
    local why
    why=$(rig_unavailable)
    [ -z "$why" ] && return 0
    if [ "$(id -u)" != 0 ]; then echo "SKIP: $why"; exit 77; fi
    echo "FAIL: the rig cannot start as root: $why"
    exit 1
}

# Namespaces of PREFIX, their processes killed, removed; no state needed (the reaper calls it too).
rig_remove() {
    local prefix=$1 m pids t
    for m in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$prefix-"); do
        pids=$(ip netns pids "$m" 2> /dev/null)
        [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    done
    # until none is left: a daemon that forked as the first kill went out (Open MPI's, once, outlived the test) is
    # killed on the next round
    for m in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$prefix-"); do
        for ((t = 0; t < 50; t++)); do
            pids=$(ip netns pids "$m" 2> /dev/null)
            [ -z "$pids" ] && break
            kill -9 $pids 2> /dev/null
            sleep 0.1
        done
        ip netns del "$m" 2> /dev/null
    done
}

rig_up() {
    local k=$1 rate=${2:-} delay=${3:-} i m
    [[ $rate == *:* ]] && delay=${rate#*:} rate=${rate%%:*} # RATE:US, as the benchmarks name a link
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
            ip netns exec "$m" tc qdisc add dev eth0 root tbf rate "$rate" burst "${RIG_BURST:-256kb}" latency "${RIG_QUEUE:-50ms}" || return 1
            ip netns exec "$RIG_PREFIX-sw" tc qdisc add dev "${RIG_PREFIX}v$i" root tbf rate "$rate" burst "${RIG_BURST:-256kb}" latency "${RIG_QUEUE:-50ms}" || return 1
        fi
        # every machine knows the others by name
        RIG_HOSTS="${RIG_HOSTS:-}$RIG_NET.$i $m"$'\n'
    done
    RIG_HOSTFILE=$(mktemp)
    for ((i = 1; i <= k; i++)); do echo "$RIG_PREFIX-$i slots=64" >> "$RIG_HOSTFILE"; done
    [ -z "$delay" ] || rig_delay "$delay"
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

# The median round trip, in microseconds, of a 1-byte TCP ping-pong from machine 1 to machine 2 (400 of them, a
# millisecond apart, after 100 to warm up), as an application sees it.
rig_rtt() {
    local port=$((20000 + RANDOM % 20000)) srv
    rig_exec 2 python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$RIG_NET.2', $port)); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = c.recv(64)
    if not b: break
    c.sendall(b)" &
    srv=$!
    rig_exec 1 python3 -c "
import socket, statistics, time
for _ in range(50):
    try: s = socket.create_connection(('$RIG_NET.2', $port)); break
    except OSError: time.sleep(0.1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for i in range(500):
    t0 = time.perf_counter(); s.sendall(b'x'); s.recv(64); t.append((time.perf_counter() - t0) * 1e6); time.sleep(0.001)
print('%.1f' % statistics.median(t[100:]))"
    wait $srv
}

# The rate, in Mbit/s, of a plain TCP transfer of 64 MB from machine 1 to machine 2, as an application sees it.
rig_rate() {
    local port=$((20000 + RANDOM % 20000)) srv
    rig_exec 2 python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('$RIG_NET.2', $port)); s.listen(1)
s.settimeout(60)  # a sender that never came: no figure, not a hang
c, _ = s.accept(); c.settimeout(60); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.time()
    n += len(b)
print('%.1f' % (n * 8 / (time.time() - t0) / 1e6))" &
    srv=$!
    rig_exec 1 python3 -c "
import socket, time
for _ in range(50):
    try: s = socket.create_connection(('$RIG_NET.2', $port)); break
    except OSError: time.sleep(0.1)
b = b'x' * (1 << 20)
for _ in range(64): s.sendall(b)
s.close()"
    wait $srv
}

# (Re)starts each machine's delay line holding packets HOLD us (their pids in RIG_DL_PIDS).
rig_delaylines() {
    local hold=$1 i
    if [ -n "${RIG_DL_PIDS:-}" ]; then
        kill $RIG_DL_PIDS 2> /dev/null
        for ((i = 0; i < 50; i++)); do kill -0 $RIG_DL_PIDS 2> /dev/null || break; sleep 0.05; done
    fi
    RIG_DL_PIDS=""
    for ((i = 1; i <= RIG_K; i++)); do
        ip netns exec "$RIG_PREFIX-$i" "$RIG_DELAYLINE" 0 "$hold" &
        RIG_DL_PIDS="$RIG_DL_PIDS $!"
        disown $! # the teardown kills it: no job notice
    done
    sleep 0.2
}

rig_one_way() { awk -v r="$(rig_rtt)" -v b="$RIG_RTT_BARE_US" 'BEGIN { printf "%.1f", (r - b) / 2 }'; }

# A delay of US microseconds one way on every link (this kernel has no netem): each machine's packets from the
# switch go through netfilter's queue 0 to a delay line (tests/cluster/delayline.c) that holds each from its
# arrival stamp. The verdict's own path adds a little, and a packet due at once still waits for the line's
# wake-up, so the hold is set by measuring (rig_one_way) and corrected by what it misses, three times. Sets
# RIG_DELAY_US (the one-way delay measured at the end) and RIG_RTT_BARE_US.
rig_delay() {
    local us=$1 i hold got round
    [ -n "${RIG_DELAYLINE:-}" ] && [ -x "$RIG_DELAYLINE" ] ||
        { echo "rig: a delay needs the delay line (libnetfilter-queue-dev, then build/tests/delayline; RIG_DELAYLINE='${RIG_DELAYLINE:-}')" >&2; return 1; }
    command -v iptables > /dev/null || { echo "rig: a delay needs iptables (Debian's iptables)" >&2; return 1; }
    RIG_RTT_BARE_US=$(rig_rtt)
    for ((i = 1; i <= RIG_K; i++)); do
        ip netns exec "$RIG_PREFIX-$i" iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0 || return 1
    done
    hold=$us
    for round in 1 2 3; do
        rig_delaylines "$hold"
        got=$(rig_one_way)
        [ $round = 3 ] || hold=$(awk -v h="$hold" -v u="$us" -v g="$got" 'BEGIN { h += u - g; printf "%.1f", h < 0 ? 0 : h }')
    done
    RIG_DELAY_US=$got
    awk -v g="$got" -v u="$us" 'BEGIN { exit !(g > 1.1 * u || g < 0.9 * u) }' &&
        echo "rig: the links' delay measured $got us one way against $us asked (the delay line's floor is its own wake-up, 25-35 us on the VMs measured)" >&2
    return 0
}

# The switch drops PER_MILLE of every 1000 TCP frames it forwards, both directions (netem's loss is not in every
# kernel; nftables' counters are). 0 lifts it. The dropped frames are spread evenly by a counter, not drawn at
# random: a run of 600 frames at 1% drew none once in a CI run, and a check that no frame was lost proves nothing.
# Frames are the veths' GSO frames, so a drop loses a burst of segments: by bytes the same fraction, harsher on TCP
# than single-segment loss.
rig_loss() {
    local sw=$RIG_PREFIX-sw
    ip netns exec "$sw" nft delete table bridge rig 2> /dev/null
    [ "$1" = 0 ] && return
    ip netns exec "$sw" nft -f - << NFT
table bridge rig {
    chain forward {
        type filter hook forward priority 0;
        meta l4proto tcp numgen inc mod $((1000 / $1)) == $((500 / $1)) counter drop
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
    RIG_DL_PIDS="" RIG_DELAY_US="" RIG_RTT_BARE_US=""
    rig_remove "$RIG_PREFIX"
    [ -n "${RIG_HOSTFILE:-}" ] && rm -f "$RIG_HOSTFILE"
    RIG_K=0
}
