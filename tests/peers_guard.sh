#!/bin/bash
# IMPALA under mpirun with one rank stuck inside an MPI call (stuck_mpi.so preloaded: its MPI_Test never returns after
# a few hundred or thousand calls, as Open MPI 4.1's TCP transport can after a write to a rank that died). Every call of the
# peers' is bounded by their guard (the actor timeout): a stuck learner ends saying so and its actors then end, the
# learner silent; a stuck actor ends saying so and the learner names it and goes on to the end of the run.
# usage: peers_guard.sh DTRAIN STUCK_MPI_SO MPIEXEC (Open MPI's: --enable-recovery keeps the job past a death)
set -u
DTRAIN=$1 SHIM=$2 MPIEXEC=$3
. "$(dirname "$0")/checks.sh"
"$MPIEXEC" --version 2>&1 | grep -qE "Open MPI|OpenRTE" || { echo "SKIP: $MPIEXEC is not Open MPI's (--enable-recovery)"; exit 77; }
job() { # STUCK_RANK AFTER OUT ARGS...: the job's seconds on stdout
    local rank=$1 after=$2 out=$3 t0
    shift 3
    t0=$(date +%s.%N)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 \
        timeout 120 "$MPIEXEC" --enable-recovery --oversubscribe -np 3 -x LD_PRELOAD="$SHIM" -x DT_STUCK_RANK=$rank \
        -x DT_STUCK_AFTER=$after "$DTRAIN" rl --env cartpole --algo impala --print-every 0 --actor-timeout 3 "$@" > "$out" 2>&1
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}
stuck="has been inside one MPI call"

# the learner stuck: it ends after 3 s inside the call, naming the rank it was talking to; both actors end, saying why
s=$(job 0 3000 "$dir/learner.out" --total-steps 100000000)
n=$(grep -c "the learner (rank 0) has been silent for 3 s: this actor ends" "$dir/learner.out")
grep -q "rank 0 $stuck (a message with rank [12]) for more than 3 s" "$dir/learner.out" && [ "$n" = 2 ] &&
    ok "a learner stuck inside MPI ends after its 3 s, and both actors end, the learner silent (the job: $s s)" ||
    fail "stuck learner ($s s, $n actors said so): $(grep -v PMIX "$dir/learner.out" | head -4)"

# an actor stuck: it ends so, the learner names it silent and goes on with the other to the run's end
s=$(job 2 300 "$dir/actor.out" --total-steps 300000)
grep -q "rank 2 $stuck (a message with rank 0) for more than 3 s" "$dir/actor.out" &&
    grep -q "actor 1 (rank 2 on .*) has been silent for 3 s; the learner goes on with 1 of 2 actors" "$dir/actor.out" &&
    grep -q "^done: 3[0-9]\{5\} env steps" "$dir/actor.out" &&
    ok "an actor stuck inside MPI ends after its 3 s; the learner names it and runs to the end (the job: $s s)" ||
    fail "stuck actor ($s s): $(grep -v PMIX "$dir/actor.out" | head -4)"
echo "peers guard: $passed passed, $failed failed"
[ $failed -eq 0 ]
