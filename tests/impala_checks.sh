#!/bin/bash
# dtrain rl --algo impala: the actor-learner. Synchronous batches give the same run whatever number of actors
# produced them; it learns CartPole; an actor killed mid-run is named and the learner goes on with the others to the
# end; a killed learner takes its actors with it within a second; Pendulum's Gaussian learns through actors with
# normalised observations and its statistics are saved; bad settings are refused naming what is wrong.
# usage: impala_checks.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
imp=(--env cartpole --algo impala --print-every 0)

# sync: 1, 2 and 4 actors of the same 16 environments, weights refreshed every 3 updates: the same run
for a in 1 2 4; do
    "$DTRAIN" rl "${imp[@]}" --sync --actors $a --refresh 3 --total-steps 30720 --metrics "$dir/s$a.jsonl" > "$dir/s$a.out" 2>&1 ||
        fail "sync, $a actors: $(tail -2 "$dir/s$a.out")"
done
same=1
for a in 2 4; do
    for f in episodes mean_return policy_lag; do cmp -s <(field $f "$dir/s1.jsonl") <(field $f "$dir/s$a.jsonl") || same=0; done
done
l2=$(worst loss "$dir/s1.jsonl" "$dir/s2.jsonl" 60)
l4=$(worst loss "$dir/s1.jsonl" "$dir/s4.jsonl" 60)
lags=$(field policy_lag "$dir/s1.jsonl" | sort -u | tr '\n' ' ')
if [ $same = 1 ] && [ "$l2" != missing ] && [ "$l4" != missing ] && awk -v a="$l2" -v b="$l4" 'BEGIN{exit !(a <= 1e-5 && b <= 1e-5)}' &&
    [ "$lags" = "0 1 2 " ]; then
    ok "sync: 1, 2 and 4 actors give the same episodes and returns at each of 60 updates, losses within $l2 and $l4, policy lags $lags"
else fail "sync over actor counts: same=$same, losses $l2 $l4, lags '$lags'; $(tail -1 "$dir/s4.jsonl" | cut -c1-200)"; fi

# learning: CartPole's mean return over the last 100 episodes after 500k steps (sync: the same run on any machine's timing)
"$DTRAIN" rl "${imp[@]}" --sync --total-steps 500000 --save "$dir/cp.safetensors" > "$dir/learn.out" 2>&1
r=$(grep -o "mean return of the last 100 [0-9.-]*" "$dir/learn.out" | awk '{print $NF}')
[ -n "$r" ] && awk -v r="$r" 'BEGIN{exit !(r >= 400)}' && ok "learns CartPole: mean return $r after 500k steps (2 actors x 8 envs, sync)" ||
    fail "learning: $(tail -2 "$dir/learn.out")"
e=$("$DTRAIN" rl eval --policy "$dir/cp.safetensors" --env cartpole --episodes 3 --greedy 2>&1 | tail -1)
echo "$e" | grep -q "mean return over 3 episodes" && ok "rl eval plays the learner's saved policy: $e" || fail "rl eval: $e"

# an actor killed mid-run (asynchronous, 4 actors): named, and the learner goes on to the end with 3
"$DTRAIN" rl "${imp[@]}" --actors 4 --total-steps 2000000 --metrics "$dir/kill.jsonl" > "$dir/kill.out" 2> "$dir/kill.err" &
learner=$!
for ((i = 0; i < 2400; i++)); do [ "$(cat "$dir/kill.jsonl" 2> /dev/null | wc -l)" -ge 20 ] && break; sleep 0.05; done
victim=$(pgrep -P $learner -f "rl actor 2")
before=$(wc -l < "$dir/kill.jsonl")
[ -n "$victim" ] && kill -9 "$victim"
wait $learner
rc=$?
said=$(grep "actor 2" "$dir/kill.err" | head -1)
end=$(field env_steps "$dir/kill.jsonl" | tail -1)
after=$(wc -l < "$dir/kill.jsonl")
if [ -n "$victim" ] && [ $rc = 0 ] && echo "$said" | grep -q "killed by signal 9.*goes on with 3 of 4" && [ "${end:-0}" -ge 2000000 ] &&
    [ "$after" -gt "$before" ]; then
    ok "a killed actor: \"$said\"; the learner went on from update $before to $after ($end env steps)"
else fail "killed actor (pid ${victim:-none}): rc $rc, said '$said', $before -> $after rows, $end steps; $(tail -2 "$dir/kill.err")"; fi

# the learner killed: its actors end with it
"$DTRAIN" rl "${imp[@]}" --actors 2 --total-steps 100000000 --metrics "$dir/lk.jsonl" > /dev/null 2>&1 &
learner=$!
for ((i = 0; i < 2400; i++)); do [ -s "$dir/lk.jsonl" ] && break; sleep 0.05; done
actors=$(pgrep -P $learner -f "rl actor" | tr '\n' ' ')
kill -9 $learner
wait $learner 2> /dev/null
t0=$(date +%s.%N)
left=$actors
for ((i = 0; i < 100; i++)); do
    left=""
    # dead: gone, or a zombie its new parent has not reaped (a container's first process may never)
    for p in $actors; do [ "$(awk '{print $3}' /proc/$p/stat 2> /dev/null)" ] && [ "$(awk '{print $3}' /proc/$p/stat 2> /dev/null)" != Z ] && left="$left $p"; done
    [ -z "$left" ] && break
    sleep 0.01
done
secs=$(echo "$(date +%s.%N) - $t0" | bc)
[ -n "$actors" ] && [ -z "$left" ] && ok "the learner killed: its actors ($actors) gone within $secs s" ||
    fail "learner killed: actors '$actors', still alive '$left'"

# continuous actions: a Gaussian through 2 actors with normalised observations; the statistics saved with it
"$DTRAIN" rl --env pendulum --algo impala --total-steps 8192 --print-every 0 --save "$dir/pend.safetensors" > "$dir/pend.out" 2>&1 &&
    grep -q '"actor_logstd"' "$dir/pend.safetensors" && grep -q '"obs_rms.var"' "$dir/pend.safetensors" &&
    ok "pendulum: a Gaussian policy learned through actors, saved with actor_logstd and obs_rms" ||
    fail "pendulum: $(tail -2 "$dir/pend.out")"

refuse() { # WHAT EXPECTED ARGS...
    local what=$1 want=$2 out
    shift 2
    out=$("$DTRAIN" "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^update"; then ok "$what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else fail "$what: $(echo "$out" | tail -2)"; fi
}
refuse "impala over --nproc 2" "starts its own actors" rl "${imp[@]}" --nproc 2 --total-steps 1000
refuse "16 environments over 3 actors" "do not split evenly over 3 actors" rl "${imp[@]}" --actors 3 --total-steps 1000
refuse "--actors without impala" "IMPALA's" rl --env cartpole --actors 2 --total-steps 1000
refuse "--rho-bar 0" "--rho-bar" rl "${imp[@]}" --rho-bar 0 --total-steps 1000
refuse "an actor started by hand" "has no learner" rl actor 0
refuse "an unknown environment" "nosuchenv" rl --env nosuchenv --algo impala --total-steps 1000
echo "impala checks: $passed passed, $failed failed"
[ $failed = 0 ]
