#!/bin/bash
# dtrain rl from the command line: PPO on CartPole over 1 and 2 local ranks (and mpirun's) gives the same episodes and
# the same losses; the metrics rows carry env_steps and mean_return; --save writes the policy under PyTorch's names;
# Pendulum's continuous PPO saves its Gaussian and its observation statistics, which rl eval plays; bad settings are
# refused naming what is wrong; the asynchronous pool gives the synchronous run. PPO's (and REINFORCE's) run state (--save FILE writes FILE.state; --resume it): 10 updates and 10 more
# resumed give the uninterrupted run's metrics and policy bit for bit (CartPole; Pendulum's normalisers on 2 ranks); a
# run killed after a --save-every state goes on from it to the uninterrupted run's policy; what cannot be resumed (another
# setting, a damaged file, another algorithm's) is refused naming why; LunarLander (a physics world) resumes with its episodes restarted.
# usage: rl_checks.sh DTRAIN [MPIEXEC]
set -u
DTRAIN=$1
MPIEXEC=${2:-}
. "$(dirname "$0")/checks.sh"
short=(--env cartpole --envs 4 --total-steps 10240 --print-every 0)   # 20 updates of 4 x 128
"$DTRAIN" rl "${short[@]}" --metrics "$dir/one.jsonl" --save "$dir/one.safetensors" > "$dir/one.out" 2>&1 || fail "one process: $(tail -2 "$dir/one.out")"
"$DTRAIN" rl "${short[@]}" --nproc 2 --metrics "$dir/two.jsonl" > "$dir/two.out" 2>&1 || fail "2 ranks: $(tail -2 "$dir/two.out")"
rows=$(grep -c '"env_steps":[0-9]*,.*"mean_return":' "$dir/one.jsonl")
[ "$rows" = 20 ] && [ "$(field env_steps "$dir/one.jsonl" | tail -1)" = 10240 ] && ok "20 metrics rows with env_steps (10240 at the end) and mean_return" ||
    fail "metrics rows: $rows, $(tail -1 "$dir/one.jsonl")"
if cmp -s <(field mean_return "$dir/one.jsonl") <(field mean_return "$dir/two.jsonl") &&
    cmp -s <(field episodes "$dir/one.jsonl") <(field episodes "$dir/two.jsonl"); then
    ok "2 ranks: the same episodes and mean returns as one process at every update"
else fail "2 ranks' episodes differ: $(tail -1 "$dir/two.jsonl")"; fi
l=$(worst loss "$dir/one.jsonl" "$dir/two.jsonl" 20)
[ "$l" != missing ] && awk -v l="$l" 'BEGIN{exit !(l <= 1e-4)}' && ok "2 ranks: losses within $l of one process's" || fail "2 ranks' losses: $l"
grep -q '"actor.0.weight"' "$dir/one.safetensors" && grep -q '"critic.4.bias"' "$dir/one.safetensors" &&
    ok "--save: the actor and critic under PyTorch's names" || fail "--save: $(head -c 200 "$dir/one.safetensors")"
# rl eval plays the saved policy: the same episodes twice; a policy file of another width is refused naming the tensor
e1=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env cartpole --episodes 3 2>&1 | tail -1)
e2=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env cartpole --episodes 3 2>&1 | tail -1)
[ "$e1" = "$e2" ] && echo "$e1" | grep -q "mean return over 3 episodes" && ok "rl eval: $e1 (twice the same)" || fail "rl eval: $e1 / $e2"
out=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env cartpole --hidden 32 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "actor.0.weight" && ok "rl eval --hidden 32 on a width-64 policy refused: $(echo "$out" | head -1)" ||
    fail "rl eval of the wrong width: $out"
out=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env acrobot 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "Acrobot-v1" && ok "rl eval of a CartPole policy on Acrobot refused: $(echo "$out" | head -1)" ||
    fail "rl eval on another environment: $out"
# continuous actions: ppo_continuous_action.py's recipe (a Gaussian, normalised observations) on Pendulum
"$DTRAIN" rl --env pendulum --envs 2 --rollout-steps 64 --minibatches 2 --epochs 2 --total-steps 2560 --print-every 5 \
    --save "$dir/pend.safetensors" > "$dir/pend.out" 2>&1 || fail "pendulum: $(tail -2 "$dir/pend.out")"
grep -q "(Gaussian)" "$dir/pend.out" && grep -q "observations normalised, rewards scaled" "$dir/pend.out" &&
    grep -q '"actor_logstd"' "$dir/pend.safetensors" && grep -q '"obs_rms.var"' "$dir/pend.safetensors" &&
    ok "pendulum: a Gaussian policy on normalised observations, saved with actor_logstd and obs_rms" ||
    fail "pendulum's run or file: $(head -1 "$dir/pend.out")"
e1=$("$DTRAIN" rl eval --policy "$dir/pend.safetensors" --env pendulum --episodes 2 --greedy 2>&1 | tail -1)
echo "$e1" | grep -q "mean return over 2 episodes: -[0-9.]* (greedy" && ok "rl eval on pendulum: $e1" || fail "rl eval on pendulum: $e1"
# --film: the first episode (Pendulum's 200 steps) as an animated SVG, the rod moving a frame a step; a film that
# cannot be written is an error naming it
"$DTRAIN" rl eval --policy "$dir/pend.safetensors" --env pendulum --episodes 1 --greedy --film "$dir/pend.svg" > "$dir/film.out" 2>&1
frames=$(grep -o 'values="[^"]*"' "$dir/pend.svg" 2>/dev/null | tr -cd ';' | wc -c)
[ "$frames" = 200 ] && grep -q "film of episode 1: $dir/pend.svg" "$dir/film.out" && ok "rl eval --film: 201 frames of Pendulum" ||
    fail "rl eval --film: $frames frame gaps, $(tail -1 "$dir/film.out")"
out=$("$DTRAIN" rl eval --policy "$dir/pend.safetensors" --env pendulum --episodes 1 --film /nonexistent/dir/f.svg 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "/nonexistent/dir/f.svg" && ok "a film that cannot be written is refused naming it" ||
    fail "rl eval --film to a missing folder: $out"
if [ -n "$MPIEXEC" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=2 \
        timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$DTRAIN" rl "${short[@]}" --metrics "$dir/mpi.jsonl" > "$dir/mpi.out" 2>&1 &&
        cmp -s <(field mean_return "$dir/one.jsonl") <(field mean_return "$dir/mpi.jsonl") &&
        ok "mpirun -np 2: the same mean returns as one process" || fail "mpirun: $(tail -2 "$dir/mpi.out")"
fi
# the asynchronous pool (--async T): each environment's steps are the synchronous pool's whatever batches they came back
# in. A batch of the whole pool: the one process's run bit for bit (metrics and policy); batches of 1 on 2 ranks (the
# policy's forward over other rows): the same episodes and mean returns at every update, losses within 1e-4
"$DTRAIN" rl "${short[@]}" --async 2 --async-batch 4 --metrics "$dir/aw.jsonl" --save "$dir/aw.safetensors" > "$dir/aw.out" 2>&1 &&
    cmp -s <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/one.jsonl") <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/aw.jsonl") &&
    cmp -s "$dir/one.safetensors" "$dir/aw.safetensors" && ok "--async 2, batches of the whole pool: the synchronous run's metrics and policy bit for bit" ||
    fail "--async with whole batches: $(tail -1 "$dir/aw.out")"
"$DTRAIN" rl "${short[@]}" --async 2 --async-batch 1 --nproc 2 --metrics "$dir/a1.jsonl" > "$dir/a1.out" 2>&1 || fail "--async on 2 ranks: $(tail -2 "$dir/a1.out")"
l=$(worst loss "$dir/one.jsonl" "$dir/a1.jsonl" 20)
if cmp -s <(field mean_return "$dir/one.jsonl") <(field mean_return "$dir/a1.jsonl") && cmp -s <(field episodes "$dir/one.jsonl") <(field episodes "$dir/a1.jsonl") &&
    [ "$l" != missing ] && awk -v l="$l" 'BEGIN{exit !(l <= 1e-4)}'; then
    ok "--async 2 --async-batch 1 on 2 ranks: the synchronous run's episodes and mean returns at every update, losses within $l"
else fail "--async batches of 1 on 2 ranks: losses $l, $(tail -1 "$dir/a1.jsonl" | cut -c1-150)"; fi
# REFUSED WHAT EXPECTED ARGS...: dtrain rl ARGS exits non-zero before any update, saying EXPECTED
refused_rl() {
    local what=$1 want=$2 out
    shift 2
    out=$("$DTRAIN" rl --print-every 1 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^update"; then ok "$what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else fail "$what: $(echo "$out" | tail -2)"; fi
}
refused_rl "an unknown environment" "'cartpool' is not one dtrain has: cartpole" --env cartpool
refused_rl "a report in a folder that cannot be made" "--report /nonexistent/dir/run: cannot make the directory" --report /nonexistent/dir/run
refused_rl "--norm-obs 2" "--norm-obs 2 is not valid" --norm-obs 2
refused_rl "3 environments over 2 ranks" "do not split evenly over 2 ranks" --envs 3 --nproc 2
refused_rl "--async under REINFORCE" "REINFORCE steps a synchronous one" --algo reinforce --async 2
refused_rl "--async-batch without --async" "give --async T" --async-batch 2
refused_rl "a batch larger than a rank's environments" "--async-batch 3: a receive takes 1 to a rank's 2 environments" --envs 4 --nproc 2 --async 1 --async-batch 3
refused_rl "fewer steps than one rollout" "less than one rollout" --total-steps 100
# a part of a rollout left over: the run takes the whole ones (CleanRL's rule) and says so
"$DTRAIN" rl --env cartpole --total-steps 2000 --print-every 0 > "$dir/part.out" 2> "$dir/part.err"
grep -q "the run takes 3 of them, 1536 env steps" "$dir/part.err" && grep -q "^done: 1536 env steps in 3 updates" "$dir/part.out" &&
    ok "--total-steps 2000 with rollouts of 512: said, and 1536 steps taken: $(grep -o 'ppo: .*' "$dir/part.err")" ||
    fail "--total-steps 2000: $(cat "$dir/part.err" "$dir/part.out" | tail -2)"
refused_rl "an algorithm dtrain lacks" "--algo dqn is not valid" --algo dqn
refused_rl "a minibatch count that does not divide the rollout" "does not split into 3 minibatches" --minibatches 3
# REINFORCE with a baseline: learns CartPole from whole episodes; rollouts shorter than an episode can be are warned of,
# and the steps of cut episodes are left out (the metrics' clipfrac says the fraction). Learning: the mean return of 100
# episodes reaches 300 (a random policy's is ~22) and ends above 100. Not the end alone: REINFORCE's variance lets a run
# fall back after it learned (seed 1 reached 352 and ended at 220 on an Intel Xeon's AVX-512, above 300 on Zen's; seeds 2
# and 3 ended at 498 and 499 there)
"$DTRAIN" rl --env cartpole --algo reinforce --total-steps 500000 --seed 1 --print-every 0 --metrics "$dir/rf.jsonl" > "$dir/rf.out" 2>&1
r=$(grep -o "mean return of the last 100 [0-9.-]*" "$dir/rf.out" | awk '{print $NF}')
best=$(field mean_return "$dir/rf.jsonl" | sort -g | tail -1)
left=$(field clipfrac "$dir/rf.jsonl" | tail -1)
[ -n "$r" ] && [ -n "$best" ] && awk -v r="$r" -v b="$best" 'BEGIN{exit !(b >= 300 && r >= 100)}' &&
    ok "reinforce learns CartPole: mean return $best at best, $r after 500k steps ($left of the last update's steps in cut episodes)" ||
    fail "reinforce: best mean return '$best'; $(tail -2 "$dir/rf.out")"
"$DTRAIN" rl --env cartpole --algo reinforce --rollout-steps 64 --total-steps 5120 --print-every 0 --metrics "$dir/rs.jsonl" > "$dir/rs.out" 2>&1
w=$(grep -o "rollouts of 64 steps are not longer.*" "$dir/rs.out")
left=$(field clipfrac "$dir/rs.jsonl" | awk '{s += $1} END {print s / NR}')
[ -n "$w" ] && awk -v l="$left" 'BEGIN{exit !(l > 0.1 && l < 1)}' && ok "reinforce with rollouts of 64 steps: warned ($w), $left of the steps left out on average" ||
    fail "reinforce short rollouts: '$w', left out $left"
refused_rl "reinforce over --nproc 2" "one process" --algo reinforce --nproc 2
refused_rl "--gae-lambda under reinforce" "--gae-lambda is PPO's" --algo reinforce --gae-lambda 0.9
# the run's state: CartPole (lr constant: the schedule of 10 updates is the first 10 of 20's)
st=(--env cartpole --envs 4 --rollout-steps 64 --no-anneal --print-every 0)
same_run() { # WHAT A B: the metrics (all but the speed) and the policy files bit for bit
    if [ "$(grep -c . "$dir/$2.jsonl")" = 20 ] && cmp -s <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/$2.jsonl") <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/$3.jsonl") &&
        cmp -s "$dir/$2.safetensors" "$dir/$3.safetensors"; then ok "$1: the metrics of 20 updates and the policy bit for bit"
    else fail "$1: $(tail -1 "$dir/$3.jsonl" | cut -c1-150) against $(tail -1 "$dir/$2.jsonl" | cut -c1-150)"; fi
}
"$DTRAIN" rl "${st[@]}" --total-steps 5120 --save "$dir/sa.safetensors" --metrics "$dir/sa.jsonl" > /dev/null 2>&1
"$DTRAIN" rl "${st[@]}" --total-steps 2560 --save "$dir/sb.safetensors" --metrics "$dir/sb.jsonl" > /dev/null 2>&1 &&
    "$DTRAIN" rl "${st[@]}" --total-steps 5120 --resume "$dir/sb.safetensors.state" --save "$dir/sb.safetensors" --metrics "$dir/sb.jsonl" > "$dir/sb.out" 2>&1
same_run "CartPole, 10 updates then 10 resumed" sa sb
rf=(--algo reinforce --env cartpole --envs 4 --rollout-steps 128 --no-anneal --print-every 0)
"$DTRAIN" rl "${rf[@]}" --total-steps 10240 --save "$dir/ra.safetensors" --metrics "$dir/ra.jsonl" > /dev/null 2>&1
"$DTRAIN" rl "${rf[@]}" --total-steps 5120 --save "$dir/rb.safetensors" --metrics "$dir/rb.jsonl" > /dev/null 2>&1 &&
    "$DTRAIN" rl "${rf[@]}" --total-steps 10240 --resume "$dir/rb.safetensors.state" --save "$dir/rb.safetensors" --metrics "$dir/rb.jsonl" > /dev/null 2>&1
same_run "REINFORCE on CartPole, 10 updates then 10 resumed" ra rb
pe=(--env pendulum --envs 4 --rollout-steps 64 --minibatches 4 --epochs 2 --no-anneal --print-every 0 --nproc 2)
"$DTRAIN" rl "${pe[@]}" --total-steps 5120 --save "$dir/pa.safetensors" --metrics "$dir/pa.jsonl" > /dev/null 2>&1
"$DTRAIN" rl "${pe[@]}" --total-steps 2560 --save "$dir/pb.safetensors" --metrics "$dir/pb.jsonl" > /dev/null 2>&1 &&
    "$DTRAIN" rl "${pe[@]}" --total-steps 5120 --resume "$dir/pb.safetensors.state" --save "$dir/pb.safetensors" --metrics "$dir/pb.jsonl" > /dev/null 2>&1
same_run "Pendulum on 2 ranks (observations and rewards normalised), 10 updates then 10 resumed" pa pb
# the asynchronous pool's state is the synchronous pool's: 10 updates and 10 resumed through it (whole batches) give the
# synchronous run, its state at the end too
"$DTRAIN" rl "${st[@]}" --async 2 --async-batch 4 --total-steps 2560 --save "$dir/ab.safetensors" --metrics "$dir/ab.jsonl" > /dev/null 2>&1 &&
    "$DTRAIN" rl "${st[@]}" --async 2 --async-batch 4 --total-steps 5120 --resume "$dir/ab.safetensors.state" --save "$dir/ab.safetensors" \
        --metrics "$dir/ab.jsonl" > "$dir/ab.out" 2>&1 || fail "--async resumed: $(tail -2 "$dir/ab.out")"
same_run "the asynchronous pool, 10 updates then 10 resumed" sa ab
cmp -s "$dir/sa.safetensors.state" "$dir/ab.safetensors.state" && ok "the asynchronous pool's run state at the end: the synchronous pool's bit for bit" ||
    fail "the asynchronous pool's run state differs from the synchronous pool's"
# killed after a state was saved (every 5 updates of a run far too long to finish first), whenever the kill lands:
# resumed to 10 updates past that state, it ends where a run of that length from the start does (the learning rate is
# constant, so the two runs' lengths do not change their steps; nothing here depends on when the kill came)
"$DTRAIN" rl "${st[@]}" --total-steps 100000000 --save "$dir/kb.safetensors" --save-every 5 > /dev/null 2>&1 &
pid=$!
for i in $(seq 600); do [ -f "$dir/kb.safetensors.state" ] && break; sleep 0.05; done
kill -9 $pid 2> /dev/null; wait $pid 2> /dev/null
at=$(grep -ao '"updates":[0-9]*' "$dir/kb.safetensors.state" | cut -d: -f2)
total=$(((${at:-0} + 10) * 256))
"$DTRAIN" rl "${st[@]}" --total-steps $total --save "$dir/ka.safetensors" > /dev/null 2>&1
"$DTRAIN" rl "${st[@]}" --total-steps $total --save "$dir/kb.safetensors" --resume "$dir/kb.safetensors.state" > "$dir/kb.out" 2>&1 &&
    cmp -s "$dir/ka.safetensors" "$dir/kb.safetensors" &&
    ok "killed with its state at update ${at:-?} (--save-every 5), resumed to update $((total / 256)): the uninterrupted run's policy bit for bit" ||
    fail "killed and resumed (state at update ${at:-?}): $(tail -1 "$dir/kb.out")"
refused_rl "--resume with another environment count" "the run was saved with envs 4; this one has 8" --envs 8 --rollout-steps 64 --total-steps 9000 --no-anneal --resume "$dir/sb.safetensors.state"
cp "$dir/sb.safetensors.state" "$dir/bad.state"
flip "$dir/bad.state" 2000
refused_rl "a damaged run state" "its check (CRC-32C) does not match" --rollout-steps 64 --total-steps 9000 --no-anneal --resume "$dir/bad.state"
# LunarLander: a Box2D world has no state to save, so a resumed run restarts each environment's episode from its saved
# stream (said); two resumes of one state are alike bit for bit, and each goes on to the end from the saved counters
ll=(--env lunarlander --envs 4 --rollout-steps 64 --no-anneal --print-every 0)
"$DTRAIN" rl "${ll[@]}" --total-steps 2560 --save "$dir/l0.safetensors" --save-every 5 --metrics "$dir/l0.jsonl" > /dev/null 2>&1
for r in la lb; do
    cp "$dir/l0.jsonl" "$dir/$r.jsonl"
    "$DTRAIN" rl "${ll[@]}" --total-steps 5120 --resume "$dir/l0.safetensors.state" --save "$dir/$r.safetensors" --metrics "$dir/$r.jsonl" > "$dir/$r.out" 2>&1
done
if grep -q "episode restarts" "$dir/la.out" && [ "$(grep -c . "$dir/la.jsonl")" = 20 ] && cmp -s "$dir/la.safetensors" "$dir/lb.safetensors" &&
    cmp -s <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/la.jsonl") <(sed 's/,"steps_per_s":[0-9.e+-]*//' "$dir/lb.jsonl"); then
    ok "LunarLander: 10 updates then 10 resumed with its episodes restarted (said), twice alike bit for bit"
else fail "LunarLander resumed: $(tail -2 "$dir/la.out")"; fi
refused_rl "a PPO state under IMPALA" "the run was saved with algo ppo; this one has impala" --algo impala --envs 4 --rollout-steps 64 \
    --actors 2 --total-steps 9000 --resume "$dir/sb.safetensors.state"
refused_rl "--resume of a run with nothing left" "nothing left to train" --rollout-steps 64 --total-steps 5120 --no-anneal --resume "$dir/sb.safetensors.state"
echo "rl checks: $passed passed, $failed failed"
[ "$failed" = 0 ]
