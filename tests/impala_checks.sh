#!/bin/bash
# dtrain rl --algo impala: the actor-learner. Synchronous batches give the same run whatever number of actors
# produced them; it learns CartPole; an actor killed mid-run is named and the learner goes on with the others to the
# end; a killed learner takes its actors with it within a second; Pendulum's Gaussian learns through actors with
# normalised observations and its statistics are saved; the run's state resumes (synchronous: bit for bit, also after a
# kill); bad settings are refused naming what is wrong.
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

# each actor's environments through an asynchronous pool (2 threads, batches of half an actor's): the same run's
# episodes and returns, losses within 1e-5
"$DTRAIN" rl "${imp[@]}" --sync --actors 2 --refresh 3 --total-steps 30720 --async 2 --metrics "$dir/sa2.jsonl" > "$dir/sa2.out" 2>&1 ||
    fail "actors with asynchronous pools: $(tail -2 "$dir/sa2.out")"
la=$(worst loss "$dir/s2.jsonl" "$dir/sa2.jsonl" 60)
if cmp -s <(field episodes "$dir/s2.jsonl") <(field episodes "$dir/sa2.jsonl") && cmp -s <(field mean_return "$dir/s2.jsonl") <(field mean_return "$dir/sa2.jsonl") &&
    [ "$la" != missing ] && awk -v a="$la" 'BEGIN{exit !(a <= 1e-5)}'; then
    ok "sync, 2 actors stepping asynchronous pools (--async 2): the same episodes and returns at each of 60 updates, losses within $la"
else fail "actors with asynchronous pools: losses $la; $(tail -1 "$dir/sa2.jsonl" | cut -c1-200)"; fi

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

# the run's state (--save FILE writes FILE.state, --resume it): the learner's and each actor's environments as the learner
# last took them, with the weights the actors hold (refreshed every 3 updates: update 9's act in update 11). Synchronous:
# 10 updates and 10 resumed give the uninterrupted run's metrics and policy bit for bit
same_run() { # WHAT A B: 20 metrics rows (all but the speed), the policy files and the states at the end bit for bit
    if [ "$(grep -c . "$dir/$3.jsonl")" = 20 ] && cmp -s <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/$2.jsonl") <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/$3.jsonl") &&
        cmp -s "$dir/$2.safetensors" "$dir/$3.safetensors" && cmp -s "$dir/$2.safetensors.state" "$dir/$3.safetensors.state"; then
        ok "$1: the metrics of 20 updates, the policy and the state at the end bit for bit"
    else fail "$1: $(tail -1 "$dir/$3.jsonl" | cut -c1-150) against $(tail -1 "$dir/$2.jsonl" | cut -c1-150)"; fi
}
resumed() { # NAME TOTAL ARGS...: half the run, then resumed to TOTAL steps
    local name=$1 total=$2
    shift 2
    "$DTRAIN" rl "$@" --total-steps $((total / 2)) --save "$dir/$name.safetensors" --metrics "$dir/$name.jsonl" > /dev/null 2>&1 &&
        "$DTRAIN" rl "$@" --total-steps $total --resume "$dir/$name.safetensors.state" --save "$dir/$name.safetensors" \
            --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 || fail "$name resumed: $(tail -2 "$dir/$name.out")"
}
st=(--env cartpole --algo impala --print-every 0 --sync --refresh 3 --no-anneal)
"$DTRAIN" rl "${st[@]}" --total-steps 10240 --save "$dir/ra.safetensors" --metrics "$dir/ra.jsonl" > /dev/null 2>&1
resumed rb 10240 "${st[@]}"
same_run "sync CartPole, 10 updates then 10 resumed (weights refreshed every 3)" ra rb
pe=(--env pendulum --algo impala --print-every 0 --sync --actors 4 --envs 8 --no-anneal)
"$DTRAIN" rl "${pe[@]}" --total-steps 5120 --save "$dir/pa.safetensors" --metrics "$dir/pa.jsonl" > /dev/null 2>&1
resumed pb 5120 "${pe[@]}"
same_run "sync Pendulum over 4 actors (observations and rewards normalised), 10 updates then 10 resumed" pa pb
# killed after a state was saved (every 5 updates of a run far too long to finish), whenever the kill lands: resumed to 10
# updates past that state, it ends where a run of that length from the start does
"$DTRAIN" rl "${st[@]}" --total-steps 100000000 --save "$dir/kb.safetensors" --save-every 5 > /dev/null 2>&1 &
learner=$!
for i in $(seq 600); do [ -f "$dir/kb.safetensors.state" ] && break; sleep 0.05; done
kill -9 $learner
wait $learner 2> /dev/null
at=$(grep -ao '"updates":[0-9]*' "$dir/kb.safetensors.state" | cut -d: -f2)
total=$(((${at:-0} + 10) * 512))
"$DTRAIN" rl "${st[@]}" --total-steps $total --save "$dir/kc.safetensors" > /dev/null 2>&1
"$DTRAIN" rl "${st[@]}" --total-steps $total --save "$dir/kb.safetensors" --resume "$dir/kb.safetensors.state" > "$dir/kb.out" 2>&1 &&
    [ -n "$at" ] && cmp -s "$dir/kb.safetensors" "$dir/kc.safetensors" &&
    ok "killed with its state at update ${at:-?} (--save-every 5), resumed to update $((total / 512)): the uninterrupted run's policy bit for bit" ||
    fail "killed and resumed (state at update ${at:-?}): $(tail -1 "$dir/kb.out")"
# asynchronous: the actors go on from the rollouts the learner took last (which ones depends on timing: not bit for bit)
resumed as 10240 --env cartpole --algo impala --print-every 0 --actors 4
took=$(grep -ao '"actor_rollouts":\[[0-9,]*\]' "$dir/as.safetensors.state")
[ "$(grep -c . "$dir/as.jsonl")" = 20 ] && [ "$(field env_steps "$dir/as.jsonl" | tail -1)" = 10240 ] && [ -n "$took" ] &&
    ok "asynchronous, 4 actors: resumed at update 10 and went on to 10240 steps (its state's $took)" ||
    fail "asynchronous resumed: $(tail -1 "$dir/as.jsonl" | cut -c1-150)"

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
refuse "an actor's batch above its environments" "--async-batch 9: a receive takes 1 to an actor's 8 environments" rl "${imp[@]}" \
    --async 1 --async-batch 9 --total-steps 1000
refuse "--resume with another actor count" "the run was saved with actors 4; this one has 2" rl "${pe[@]}" --actors 2 --total-steps 9000 \
    --resume "$dir/pb.safetensors.state"
refuse "an IMPALA state under PPO" "the run was saved with algo impala; this one has ppo" rl --env pendulum --envs 8 --rollout-steps 32 \
    --total-steps 9000 --resume "$dir/pb.safetensors.state"
refuse "--resume of a run with nothing left" "nothing left to train" rl "${st[@]}" --total-steps 10240 --resume "$dir/rb.safetensors.state"
echo "impala checks: $passed passed, $failed failed"
[ $failed = 0 ]
