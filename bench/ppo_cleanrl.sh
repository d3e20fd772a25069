#!/bin/bash
# PPO against CleanRL (PyTorch, one thread), seeds 1-5, one run after the other on this machine:
#   cartpole: dtrain rl --env cartpole against ppo.py, 500k env steps, the target a mean return of 475;
#   pendulum: dtrain rl --env pendulum (and with --trunc-as-term, CleanRL's handling of the time limit) against
#             ppo_continuous_action.py, 1M env steps, the target -200;
#   lunarlander: dtrain rl --env lunarlander against ppo.py, both with RL Zoo's settings for LunarLander (16 envs x
#             1024 steps, minibatches of 64, 4 epochs, gamma 0.999, lambda 0.98, lr 3e-4 constant, the value loss
#             not clipped), 1.5M env steps, the target 200 (CleanRL's on LunarLander-v2: pip install box2d there).
# Per seed: the final mean return of the last 100 episodes and the wall time until it first reached the target
# (dtrain's from its metrics; CleanRL's from its episodes and its SPS lines). CleanRL's scripts want Gymnasium 0.29
# (their episode statistics come in final_info); the folder and packages:
#   fetch github:vwxyzjn/cleanrl (or git clone), then
#   .venv-baselines/bin/pip install --target /tmp/gym029 gymnasium==0.29.1 tyro tensorboard
# usage: bench/ppo_cleanrl.sh DTRAIN CLEANRL_DIR [cartpole|pendulum|lunarlander] [PYTHONPATH_FOR_GYM029] [SEEDS]
# (CLEANRL_DIR "-": dtrain's runs only)
set -u
DTRAIN=$1
CLEANRL=$2
ENV=${3:-cartpole}
GYMPATH=${4:-/tmp/gym029}
SEEDS=${5:-"1 2 3 4 5"}
settings=() cleanrl_settings=()
case $ENV in
cartpole) script=ppo.py; id=CartPole-v1; steps=500000; target=475; variants=("") ;;
pendulum) script=ppo_continuous_action.py; id=Pendulum-v1; steps=1000000; target=-200; variants=("" "--trunc-as-term") ;;
lunarlander) script=ppo.py; id=LunarLander-v2; steps=1500000; target=200; variants=("")
    settings=(--envs 16 --rollout-steps 1024 --minibatches 256 --epochs 4 --gamma 0.999 --gae-lambda 0.98 --ent-coef 0.01
              --lr 3e-4 --no-anneal --no-clip-vloss)
    cleanrl_settings=(--num-envs 16 --num-steps 1024 --num-minibatches 256 --update-epochs 4 --gamma 0.999 --gae-lambda 0.98
                      --ent-coef 0.01 --learning-rate 3e-4 --no-anneal-lr --no-clip-vloss) ;;
*) echo "bench/ppo_cleanrl.sh: environment '$ENV' is not cartpole, pendulum or lunarlander" >&2; exit 2 ;;
esac
PPO=$CLEANRL/cleanrl/$script
[ -f "$PPO" ] || PPO=$CLEANRL/$script
[ -f "$PPO" ] || [ "$CLEANRL" = - ] || { echo "bench/ppo_cleanrl.sh: no $script in $CLEANRL" >&2; exit 2; }
PY=$(cd "$(dirname "$0")/.." && pwd)/.venv-baselines/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "PPO on $id, $steps steps, on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "%-6s %-24s %12s %18s %10s\n" seed who "final mean" "time to $target (s)" "total (s)"
for s in $SEEDS; do
    for v in "${variants[@]}"; do
        t0=$(date +%s.%N)
        "$DTRAIN" rl --env "$ENV" "${settings[@]}" --total-steps $steps --seed "$s" $v --print-every 0 --metrics "$out/d$s.jsonl" > /dev/null || exit 1
        t1=$(date +%s.%N)
        python3 - "$out/d$s.jsonl" "$s" "$(awk "BEGIN{print $t1 - $t0}")" "$target" "dtrain $v" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hit = next((r["env_steps"] / r["steps_per_s"] for r in rows if r["episodes"] and r["mean_return"] >= float(sys.argv[4])), None)
print("%-6s %-24s %12.2f %18s %10.1f" % (sys.argv[2], sys.argv[5], rows[-1]["mean_return"], "%.2f" % hit if hit else "never",
                                         float(sys.argv[3])))
PY
    done
    [ "$CLEANRL" = - ] && continue
    t0=$(date +%s.%N)
    (cd "$out" && PYTHONPATH=$GYMPATH OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PY" -u "$PPO" --env-id $id --seed "$s" \
        "${cleanrl_settings[@]}" --total-timesteps $steps --no-cuda > "$out/c$s.txt" 2>&1) || { echo "CleanRL failed: $(tail -3 "$out/c$s.txt")"; exit 1; }
    t1=$(date +%s.%N)
    python3 - "$out/c$s.txt" "$s" "$(awk "BEGIN{print $t1 - $t0}")" "$target" <<'PY'
import re, sys
ret, sps, hit = [], None, None
for line in open(sys.argv[1]):
    m = re.match(r"global_step=(\d+), episodic_return=\[?([-0-9.e]+)", line)
    if m:
        ret.append(float(m.group(2)))
        last = ret[-100:]
        if hit is None and sps and sum(last) / len(last) >= float(sys.argv[4]):
            hit = int(m.group(1)) / sps
    m = re.match(r"SPS: (\d+)", line)
    if m: sps = int(m.group(1))
final = sum(ret[-100:]) / len(ret[-100:])
print("%-6s %-24s %12.2f %18s %10.1f" % (sys.argv[2], "cleanrl", final, "%.2f" % hit if hit else "never", float(sys.argv[3])))
PY
done
