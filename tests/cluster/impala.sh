#!/bin/bash
# IMPALA's actors on another machine: the rig's two machines (rig.sh), the
# learner (rank 0) and one actor on machine 1, one actor on machine 2, their
# messages over MPI (dt_peers) under mpirun --enable-recovery. Checks that the
# synchronous run across the machines equals the local actors' update for
# update, also when saved and resumed; that an actor killed on machine 2 is named by the learner within its
# timeout and the run goes on to its end with the other; and that a killed
# learner ends the actors on both machines, each saying why.
# mpirun --enable-recovery exits 0 whatever its ranks do: the output is read.
# usage: impala.sh DTRAIN
# Exit 77 (skipped, with the reason) only where the rig cannot be made for
# want of root or tools; as root a rig that does not come up fails.
set -u
DTRAIN=$1
. "$(dirname "$0")/../checks.sh"
. "$(dirname "$0")/rig.sh"
rig_require
rig_up 2 1gbit || { echo "FAIL: the rig did not come up"; exit 1; }
imp=(rl --env cartpole --algo impala --print-every 0)
job() { rig_mpirun --enable-recovery -np 3 --map-by node "$DTRAIN" "${imp[@]}" "$@"; } # ranks 0 and 2 on machine 1, 1 on 2
rows() { cat "$1" 2> /dev/null | wc -l; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
rank_on() { # MACHINE RANK: that dtrain rank's pid
    local p
    for p in $(ip netns pids "$RIG_PREFIX-$1"); do
        grep -qz "^OMPI_COMM_WORLD_RANK=$2\$" /proc/$p/environ 2> /dev/null && grep -q dtrain /proc/$p/cmdline 2> /dev/null && echo $p
    done | head -1
}
wait_job() { # PID SECONDS: the job ended within them; else its ranks are killed (a hang fails the check, never the suite)
    local i q
    for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2> /dev/null || { wait "$1"; return 0; }; sleep 0.1; done
    for q in $(rank_on 1 0) $(rank_on 1 2) $(rank_on 2 1); do kill -9 "$q"; done
    kill "$1" 2> /dev/null
    wait "$1"
    return 1
}
wait_rows() { for ((i = 0; i < 1800; i++)); do [ "$(rows "$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }

# the synchronous run across the machines: the local actors' metrics, update for update (the rate aside)
strip() { sed 's/,"steps_per_s":[^,}]*//' "$1"; }
"$DTRAIN" "${imp[@]}" --sync --total-steps 20000 --metrics "$dir/local.jsonl" > /dev/null 2>&1
job --sync --total-steps 20000 --metrics "$dir/rig.jsonl" > "$dir/sync.out" 2> "$dir/sync.err"
placed=$(grep -o "0 on [^,]*, 1 on [^ ]*" "$dir/sync.err")
[ "$placed" = "0 on $RIG_PREFIX-2, 1 on $RIG_PREFIX-1" ] && [ -s "$dir/rig.jsonl" ] &&
    [ "$(strip "$dir/rig.jsonl")" = "$(strip "$dir/local.jsonl")" ] &&
    ok "IMPALA --sync with an actor on each machine: the local actors' $(rows "$dir/rig.jsonl") updates exactly (actor $placed)" ||
    fail "IMPALA --sync across machines ($placed): $(tail -1 "$dir/rig.jsonl" | cut -c1-120) vs $(tail -1 "$dir/local.jsonl" | cut -c1-120); $(grep -v PMIX "$dir/sync.err" | head -3)"

# resumed across the machines: 10 updates saved, then 10 more from the state (each actor given where its environments
# were), the local actors' uninterrupted 20 (--no-anneal: the rate does not depend on --total-steps)
"$DTRAIN" "${imp[@]}" --sync --no-anneal --total-steps 10240 --metrics "$dir/whole.jsonl" > /dev/null 2>&1
job --sync --no-anneal --total-steps 5120 --metrics "$dir/resumed.jsonl" --save "$dir/half.safetensors" > /dev/null 2> "$dir/half.err"
job --sync --no-anneal --total-steps 10240 --metrics "$dir/resumed.jsonl" --resume "$dir/half.safetensors.state" > "$dir/resume.out" 2> "$dir/resume.err"
[ "$(rows "$dir/resumed.jsonl")" = 20 ] && [ "$(strip "$dir/resumed.jsonl")" = "$(strip "$dir/whole.jsonl")" ] &&
    ok "IMPALA --sync across machines, 10 updates then 10 resumed: the local actors' uninterrupted 20 exactly" ||
    fail "IMPALA resumed across machines ($(rows "$dir/resumed.jsonl") rows): $(grep -v PMIX "$dir/resume.err" "$dir/half.err" | head -3)"

# an actor killed on machine 2: named by the learner (after its timeout, 5 s: the time is printed, not asserted), the run
# goes on to its end
rm -f "$dir/kill.jsonl"
job --actor-timeout 5 --total-steps 300000 --metrics "$dir/kill.jsonl" > "$dir/kill.out" 2> "$dir/kill.err" &
pid=$!
wait_rows "$dir/kill.jsonl" 20 || fail "the IMPALA run across machines did not reach 20 updates in 180 s: $(grep -v PMIX "$dir/kill.err" | head -3)"
victim=$(rank_on 2 1) t0=$(date +%s.%N) before=$(rows "$dir/kill.jsonl")
[ -n "$victim" ] && kill -9 "$victim"
for ((i = 0; i < 1200; i++)); do grep -q "goes on with 1 of 2 actors" "$dir/kill.err" && break; sleep 0.05; done
named=$(since "$t0")
ended=1
wait_job $pid 120 || ended=0
said=$(grep -m1 "goes on with" "$dir/kill.err")
end=$(tail -1 "$dir/kill.jsonl" | grep -o '"env_steps":[0-9]*' | cut -d: -f2)
[ $ended = 1 ] && [[ $said == *"actor 0 (rank 1 on $RIG_PREFIX-2, environments 0-7) has been silent for 5 s"* ]] && grep -q "^done: " "$dir/kill.out" && [ "${end:-0}" -ge 300000 ] &&
    [ "$(rows "$dir/kill.jsonl")" -gt "$before" ] &&
    ok "an actor killed on machine 2: named after $named s, the learner went on from update $before to the end ($end env steps): ${said#*warning: }" ||
    { fail "killed actor across machines (named after $named s, end ${end:-none}, the job $([ $ended = 1 ] && echo ended || echo "killed after 120 s")): ${said:-nothing said}; $(grep -iE "error|warn|fail" "$dir/kill.err" | grep -v PMIX | head -4)"
      echo "  its stderr's last lines (kept for the cause: once a segfault on machine 1, nothing named):"; grep -v PMIX "$dir/kill.err" | tail -15 | sed 's/^/  | /'; }

# the learner killed: the actors on both machines end (within a minute: a bound for a hang, not a timing), saying why
rm -f "$dir/learner.jsonl"
job --actor-timeout 5 --total-steps 100000000 --metrics "$dir/learner.jsonl" > "$dir/learner.out" 2> "$dir/learner.err" &
pid=$!
wait_rows "$dir/learner.jsonl" 20 || fail "the second IMPALA run did not reach 20 updates in 180 s"
learner=$(rank_on 1 0) t0=$(date +%s.%N)
[ -n "$learner" ] && kill -9 "$learner"
for ((i = 0; i < 1200; i++)); do [ -z "$(rank_on 1 2)$(rank_on 2 1)" ] && break; sleep 0.05; done
secs=$(since "$t0") left=$(rank_on 1 2)$(rank_on 2 1)
wait_job $pid 60
n=$(grep -c "the learner (rank 0) has been silent for 5 s: this actor ends" "$dir/learner.err")
[ -n "$learner" ] && [ -z "$left" ] && [ "$n" = 2 ] &&
    ok "the learner killed: both actors (one a machine) gone after $secs s, each saying the learner fell silent" ||
    fail "killed learner across machines: actors gone after $secs s, $n said so; $(grep -v PMIX "$dir/learner.err" | head -3)"

rig_down
left=$(ip netns list | grep -c "^$RIG_PREFIX-")
[ "$left" = 0 ] && ok "teardown: no namespace of the rig left" || fail "teardown left $left namespaces"
echo "cluster impala: $passed passed, $failed failed"
[ $failed -eq 0 ]
