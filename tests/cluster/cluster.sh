#!/bin/bash
# dtrain across two machines for real: the rig (tests/cluster/rig.sh) makes 2
# network namespaces joined by a switch with shaped links, and Open MPI runs
# its daemons on each through a launch agent, so ranks on different machines
# talk over TCP. Checks the rig itself (host names, addresses, 2 nodes, the
# link's rate and delay), the collectives against the sequential reference on 2
# machines x 2 ranks, DDP, every ZeRO stage and EP 2 giving the local launch's
# losses, a killed rank, a stopped rank and a pulled cable named by the
# other machine in time, and that nothing is left behind.
# usage: cluster.sh DTRAIN TEST_COLLECTIVES TEST_FAULTS
# Exit 77 (skipped, with the reason) only where the rig cannot be made for
# want of root or tools; as root a rig that does not come up fails.
set -u
DTRAIN=$1
COLL=$2
FAULTS=$3
. "$(dirname "$0")/../checks.sh"
. "$(dirname "$0")/rig.sh"
rig_require
rig_up 2 1gbit 100 || { echo "FAIL: the rig did not come up"; exit 1; }

# the rig: its own host name and address on each machine, Open MPI sees 2 nodes
h1=$(rig_exec 1 hostname) h2=$(rig_exec 2 hostname)
a2=$(rig_exec 2 ip -4 -o addr show dev eth0 | awk '{print $4}')
[ "$h1" = "$RIG_PREFIX-1" ] && [ "$h2" = "$RIG_PREFIX-2" ] && [ "$a2" = "$RIG_NET.2/24" ] &&
    ok "each machine has its own host name and address ($h1, $h2 at $a2)" || fail "names or addresses: '$h1' '$h2' '$a2'"
nodes=$(rig_mpirun -np 4 --map-by ppr:2:node hostname 2> "$dir/err" | sort -u | tr '\n' ' ')
[ "$nodes" = "$RIG_PREFIX-1 $RIG_PREFIX-2 " ] && ok "Open MPI runs 2 ranks on each of 2 nodes: $nodes" || fail "Open MPI's nodes: '$nodes' $(head -c 300 "$dir/err")"

# the link is shaped: a plain TCP transfer of 64 MB from machine 1 to 2 runs no faster than the shaped 1 Gbit/s (an
# unshaped link carries tens of Gbit/s). A busy machine only slows it, so the cap is asserted and the figure printed
# (`make test-cluster` checks it within 10% on a quiet machine)
mbit=$(rig_rate)
awk -v r="${mbit:-0}" 'BEGIN { exit !(r > 0 && r < 1100) }' && ok "the link shaped to 1 Gbit/s carries TCP at $mbit Mbit/s" ||
    fail "the link's rate: ${mbit:-none} Mbit/s against at most 1000"

# the link's delay is there: 100 us asked one way (a TCP round trip's growth over the bare link's, halved). The delay
# line holds each packet from its arrival, so a busy machine only adds to it; at least half of it is asserted, and the
# figure printed (`make test-cluster` checks it within 10% on a quiet machine: timing is not asserted here)
got=$(rig_one_way)
awk -v d="$got" 'BEGIN { exit !(d > 50) }' &&
    ok "the link delayed 100 us one way: $got us (TCP round trip over the bare link's $RIG_RTT_BARE_US us)" ||
    fail "the link's delay: $got us one way against 100 (bare round trip $RIG_RTT_BARE_US us)"

# the collectives, every algorithm, against the sequential reference: 2 machines x 2 ranks
rig_mpirun -np 4 --map-by ppr:2:node "$COLL" > "$dir/out" 2>&1 && grep -qE "collectives on 4 ranks: [0-9]+ passed, 0 failed" "$dir/out" &&
    ok "collectives across 2 machines x 2 ranks: $(grep -oE '[0-9]+ passed, 0 failed' "$dir/out")" || fail "collectives: $(tail -5 "$dir/out")"

# Open MPI's TCP transport without its emulated put, which dtrain asks for (its handshake waits behind the other
# direction's bulk data); a user's own flags win
f=$(rig_mpirun -np 2 --map-by node "$COLL" tcp-flags 2> "$dir/err")
u=$(rig_mpirun -np 2 --map-by node --mca btl_tcp_flags send,put,inplace,need-ack,need-csum,hetero-rdma "$COLL" tcp-flags 2>> "$dir/err")
[[ $f == *"put off"* && $u == *"put on"* ]] && ok "Open MPI's TCP transport without put under dtrain ($f), the user's flags kept ($u)" ||
    fail "TCP flags: dtrain's '$f', with the user's '$u'; $(head -c 300 "$dir/err")"

# DDP and every ZeRO stage across 2 machines: the local launch's losses, digit for digit
head -c 100000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
model=(--layers 2 --channels 64 --heads 2 --vocab 256 --max-seq 32 --seq 32 --batch 2 --threads 1 --data "$dir/train.bin" --steps 8 --quiet)
losses() { grep -o '"loss":[0-9.e+-]*' "$1"; }
for s in ddp zero1 zero2 zero3; do
    "$DTRAIN" train "${model[@]}" --nproc 2 --strategy $s --metrics "$dir/local.$s" > /dev/null 2>&1
    rig_mpirun -np 2 --map-by node "$DTRAIN" train "${model[@]}" --strategy $s --metrics "$dir/rig.$s" > "$dir/out" 2>&1
    [ -s "$dir/rig.$s" ] && [ "$(losses "$dir/rig.$s")" = "$(losses "$dir/local.$s")" ] &&
        ok "$s across 2 machines: the local launch's 8 losses ($(losses "$dir/rig.$s" | tail -1))" ||
        fail "$s across 2 machines: $(losses "$dir/rig.$s" | tail -1) vs $(losses "$dir/local.$s" | tail -1); $(tail -3 "$dir/out")"
done

# expert parallelism across 2 machines (4 experts, top-2, EP 2): each layer's dispatch and combine are alltoallv's
# over the link, and the losses are the local launch's
ep=(--experts 4 --experts-top-k 2 --ep 2)
"$DTRAIN" train "${model[@]}" "${ep[@]}" --nproc 2 --metrics "$dir/local.ep" > /dev/null 2>&1
rig_mpirun -np 2 --map-by node "$DTRAIN" train "${model[@]}" "${ep[@]}" --metrics "$dir/rig.ep" > "$dir/out" 2>&1
[ -s "$dir/rig.ep" ] && [ "$(losses "$dir/rig.ep")" = "$(losses "$dir/local.ep")" ] &&
    ok "EP 2 across 2 machines: the local launch's 8 losses ($(losses "$dir/rig.ep" | tail -1))" ||
    fail "EP 2 across 2 machines: $(losses "$dir/rig.ep" | tail -1) vs $(losses "$dir/local.ep" | tail -1); $(tail -3 "$dir/out")"

# a link that drops 1% of the TCP frames it carries, one in every 100 (tc netem is not in this kernel; the switch drops
# them with nftables): training completes with the local launch's losses
rig_loss 10
rig_mpirun -np 2 --map-by node "$DTRAIN" train "${model[@]}" --metrics "$dir/lossy" > "$dir/out" 2>&1
read -r drops through <<< "$(rig_loss_counts)"
rig_loss 0
[ "${drops:-0}" -gt 0 ] && [ "$(losses "$dir/lossy")" = "$(losses "$dir/local.ddp")" ] &&
    ok "a link dropping 1% ($drops of $((drops + through)) frames): DDP completes with the local launch's 8 losses" ||
    fail "lossy link (${drops:-0} dropped): $(losses "$dir/lossy" | tail -1) vs $(losses "$dir/local.ddp" | tail -1); $(tail -3 "$dir/out")"

# a rank killed on machine 2 (rank 3 of 2 x 2): a rank on machine 1 names it within a second (mpirun ends the job at
# the first death, so one report in time is what can be asked)
# the same with the others in an alltoallv (an expert dispatch), where every rank waits on the other machine
for mode in kill kill-alltoallv; do
    rig_mpirun -np 4 --map-by ppr:2:node "$FAULTS" $mode > "$dir/out" 2> "$dir/err"
    line=$(grep -E "^rank [01]: error after" "$dir/out" | head -1)
    t=$(echo "$line" | sed 's/.*error after \([0-9.]*\) s.*/\1/')
    echo "$line" | grep -q "rank 3" && awk "BEGIN{exit !(${t:-9} < 1.0)}" && ok "$mode: a rank killed on machine 2, named by machine 1 after $t s" ||
        fail "$mode: killed rank across machines: $(head -c 400 "$dir/out") / mpirun: $(grep -v '^ *$' "$dir/err" | head -c 600)"
done

# train ranks across the machines, found by machine and rank
rank_pid() { # MACHINE: the dtrain rank running there
    local p
    for p in $(ip netns pids "$RIG_PREFIX-$1"); do
        grep -qz '^OMPI_COMM_WORLD_RANK=' /proc/$p/environ 2> /dev/null && grep -q dtrain /proc/$p/cmdline 2> /dev/null && echo $p
    done | head -1
}
# start_train: a long run on both machines in the background; its output in $dir/job.*
start_train() {
    # each rank's output also in a file written on its own machine: a machine cut off cannot send it to mpirun.
    # The last job's output goes first: the wait below read its "step 5" before the new job's redirection (in the
    # background) had emptied the file, and pulled the cable before any rank of the new one existed ("gone after 0.0 s")
    rm -rf "$dir/ranks" "$dir/job.out" "$dir/job.err"
    rig_mpirun -np 2 --map-by node --output-filename "$dir/ranks" "$DTRAIN" train "${model[@]:0:${#model[@]}-3}" --steps 1000000 "$@" \
        > "$dir/job.out" 2> "$dir/job.err" &
    job=$!
    # the fault goes in once the job runs, however long a busy machine takes to start it; started says whether it did
    # within 3 minutes
    started=0
    for ((i = 0; i < 1800; i++)); do grep -q "^step 5/" "$dir/job.out" && started=1 && break; sleep 0.1; done
    [ $started = 1 ] || fail "the training job across the machines did not reach step 5 in 180 s: $(tail -3 "$dir/job.err")"
}
# finish_job T0 LIMIT: waits for both dtrain ranks to end (at most LIMIT s; secs: their time since T0), then for
# mpirun (whose daemon on an unreachable machine is Open MPI's to wait for: ended after 5 s more)
finish_job() {
    local t0=$1 limit=$2
    for ((i = 0; i < limit * 10; i++)); do [ -z "$(rank_pid 1)$(rank_pid 2)" ] && break; sleep 0.1; done
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    for ((i = 0; i < 50; i++)); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    kill -0 $job 2> /dev/null && { kill -9 $job; rig_down_jobs; }
    wait $job 2> /dev/null
}
rig_down_jobs() { # every process of the machines but the delay lines
    local i p
    for i in 1 2; do
        for p in $(ip netns pids "$RIG_PREFIX-$i"); do [[ " $RIG_DL_PIDS " == *" $p "* ]] || kill -9 "$p" 2> /dev/null; done
    done
}

# a rank stopped (SIGSTOP) on machine 2: the heartbeat (4 s) names it on machine 1 within 6 s, load allowing
start_train
victim=$(rank_pid 2)
t0=$(date +%s.%N)
[ -n "$victim" ] && kill -STOP "$victim"
for ((i = 0; i < 100; i++)); do grep -q "rank 1 has sent no heartbeat" "$dir/job.err" && break; sleep 0.1; done
named=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
finish_job "$t0" 20
kill -CONT "$victim" 2> /dev/null
grep -qE "rank 1 has sent no heartbeat for [0-9.]+ s \(stopped by SIGSTOP" "$dir/job.err" && awk -v s="$named" 'BEGIN { exit !(s < 6) }' &&
    awk -v s="$secs" 'BEGIN { exit !(s < 15) }' &&
    ok "a rank stopped on machine 2: named by machine 1's heartbeat after $named s, the ranks gone after $secs s" ||
    fail "stopped rank across machines (named after ${named} s, gone after ${secs} s): $(grep -i "rank" "$dir/job.err" | head -3)"

# the cable pulled in the middle of the run: every rank exits naming the unreachable peer (the heartbeat, 4 s; the
# stall timeout, 300 s, is the backstop), within 10 s
start_train
t0=$(date +%s.%N)
ip -n "$RIG_PREFIX-2" link set eth0 down
finish_job "$t0" 40
ip -n "$RIG_PREFIX-2" link set eth0 up
cat "$dir/job.err" $(find "$dir/ranks" -name stderr) > "$dir/cable.err" 2> /dev/null
grep -qE "rank 0: .*rank 1 has sent no heartbeat" "$dir/cable.err" && grep -qE "rank 1: .*rank 0 has sent no heartbeat" "$dir/cable.err" &&
    awk -v s="$secs" 'BEGIN { exit !(s < 10) }' &&
    ok "the cable pulled: both ranks gone in $secs s, each naming the other: $(grep -m1 -E "rank 1: " "$dir/cable.err" | cut -c1-160)" ||
    fail "pulled cable (ranks gone after ${secs} s): $(grep -E "rank [01]: " "$dir/cable.err" | head -4)"

# nothing left behind: no namespace of the rig, no process in it
rig_down
left=$(ip netns list | grep -c "^$RIG_PREFIX-")
[ "$left" = 0 ] && ok "teardown: no namespace of the rig left" || fail "teardown left $left namespaces"
echo "cluster: $passed passed, $failed failed"
[ $failed -eq 0 ]
