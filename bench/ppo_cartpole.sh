#!/bin/bash
# PPO on CartPole-v1, 500k env steps, seeds 1-5: dtrain rl against CleanRL's ppo.py (PyTorch, one thread), one after
# the other on this machine. Per seed: the final mean return of the last 100 episodes and the wall time until it first
# reached 475 (dtrain's from its metrics; CleanRL's from its episodes and its SPS lines). CleanRL's ppo.py wants
# Gymnasium 0.29 (its episode statistics come in final_info); its folder and packages:
#   fetch github:vwxyzjn/cleanrl (or git clone), then
#   .venv-baselines/bin/pip install --target /tmp/gym029 gymnasium==0.29.1 tyro tensorboard
# usage: bench/ppo_cartpole.sh DTRAIN CLEANRL_PPO_PY [PYTHONPATH_FOR_GYM029] [SEEDS]
set -u
DTRAIN=$1
PPO=$2
GYMPATH=${3:-/tmp/gym029}
SEEDS=${4:-"1 2 3 4 5"}
PY=$(cd "$(dirname "$0")/.." && pwd)/.venv-baselines/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "PPO on CartPole-v1, 500k steps, on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "%-6s %-8s %12s %16s %10s\n" seed who "final mean" "time to 475 (s)" "total (s)"
for s in $SEEDS; do
    t0=$(date +%s.%N)
    "$DTRAIN" rl --env cartpole --total-steps 500000 --seed "$s" --print-every 0 --metrics "$out/d$s.jsonl" > /dev/null || exit 1
    t1=$(date +%s.%N)
    python3 - "$out/d$s.jsonl" "$s" "$(awk "BEGIN{print $t1 - $t0}")" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hit = next((r["env_steps"] / r["steps_per_s"] for r in rows if r["mean_return"] >= 475), None)
print("%-6s %-8s %12.2f %16s %10.1f" % (sys.argv[2], "dtrain", rows[-1]["mean_return"], "%.2f" % hit if hit else "never", float(sys.argv[3])))
PY
    t0=$(date +%s.%N)
    (cd "$out" && PYTHONPATH=$GYMPATH OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PY" -u "$PPO" --seed "$s" --total-timesteps 500000 --no-cuda \
        > "$out/c$s.txt" 2>&1) || { echo "CleanRL failed: $(tail -3 "$out/c$s.txt")"; exit 1; }
    t1=$(date +%s.%N)
    python3 - "$out/c$s.txt" "$s" "$(awk "BEGIN{print $t1 - $t0}")" <<'PY'
import re, sys
ret, sps, hit = [], None, None
for line in open(sys.argv[1]):
    m = re.match(r"global_step=(\d+), episodic_return=\[?([-0-9.e]+)", line)
    if m:
        ret.append(float(m.group(2)))
        last = ret[-100:]
        if hit is None and sps and len(ret) >= 1 and sum(last) / len(last) >= 475:
            hit = int(m.group(1)) / sps
    m = re.match(r"SPS: (\d+)", line)
    if m: sps = int(m.group(1))
final = sum(ret[-100:]) / len(ret[-100:])
print("%-6s %-8s %12.2f %16s %10.1f" % (sys.argv[2], "cleanrl", final, "%.2f" % hit if hit else "never", float(sys.argv[3])))
PY
done
