#!/bin/bash
# The bridge to Gymnasium (--env gym:ID): a bridged pool's rollout equals Gymnasium's own vector environment's (next-step
# autoreset, the same seeds and actions) bit for bit, for a discrete, a continuous and a one-hot (Discrete observation)
# environment; PPO learns CartPole through it and its 2 ranks give one process's curve; rl eval plays a bridged policy;
# an id Gymnasium cannot make (its error shown), a Python without gymnasium, an action outside the space, a non-finite
# observation (the episode dropped, the run going on) and a killed worker (named within a second) are each handled.
# Gymnasium comes from PyPI into PYDIR when this Python lacks it; when it cannot be had, said and not counted.
# usage: gym_bridge.sh DTRAIN GYM_ROLLOUT [PYDIR]
set -u
DTRAIN=$1
ROLLOUT=$2
PYDIR=${3:-}
. "$(dirname "$0")/checks.sh"
if ! python3 -c 'import gymnasium' 2> /dev/null && [ -n "$PYDIR" ]; then
    [ -d "$PYDIR/gymnasium" ] || python3 -m pip install -q --disable-pip-version-check --target "$PYDIR" gymnasium > "$dir/pip.log" 2>&1
    export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -c 'import gymnasium' 2> /dev/null; then
    echo "skip: the gymnasium package is not installed and could not be ($(tail -1 "$dir/pip.log" 2> /dev/null)); not counted"
    exit 0
fi

# Gymnasium's SyncVectorEnv (next-step autoreset) with the rollout's seeds and actions, compared record by record
cat > "$dir/compare.py" << 'PY'
import sys
import numpy as np
import gymnasium as gym
env_id, n, seed, T, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
v = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
sp = v.single_observation_space
od = sp.n if isinstance(sp, gym.spaces.Discrete) else int(np.prod(sp.shape))
act = v.single_action_space
def flat(o):
    if isinstance(sp, gym.spaces.Discrete):
        x = np.zeros((n, od), np.float32); x[np.arange(n), o] = 1; return x
    return np.asarray(o, np.float32).reshape(n, od)
def action(t, i, j):
    if isinstance(act, gym.spaces.Discrete): return (t * 7 + i * 3 + t // 5) % act.n
    lo, hi = np.float32(act.low.reshape(-1)[j]), np.float32(act.high.reshape(-1)[j])
    return lo + (hi - lo) * np.float32((t * 7 + i * 3 + j) % 9) / np.float32(8)
data = open(path, "rb").read()
at = 0
def take(dtype, count):
    global at
    x = np.frombuffer(data, dtype, count, at); at += x.nbytes; return x
o, _ = v.reset(seed=[seed + i for i in range(n)])
bad = 0 if np.array_equal(take(np.float32, n * od), flat(o).reshape(-1)) else 1
ended, flags = np.zeros(n, bool), 0
for t in range(T):
    if isinstance(act, gym.spaces.Discrete): a = np.array([action(t, i, 0) for i in range(n)])
    else: a = np.array([[action(t, i, j) for j in range(act.shape[0])] for i in range(n)], np.float32)
    o, r, te, tr, _ = v.step(a)
    got_o, got_r = take(np.float32, n * od), take(np.float32, n)
    got_te, got_tr, got_reset = take(np.uint8, n), take(np.uint8, n), take(np.uint8, n)
    if not np.array_equal(got_o, flat(o).reshape(-1)) or not np.array_equal(got_r, np.asarray(r, np.float32)): bad += 1
    if not (np.array_equal(got_te, te) and np.array_equal(got_tr, tr) and np.array_equal(got_reset, ended)): bad += 1
    flags += int(te.sum() + tr.sum())
    ended = te | tr
print(f"{T} steps of {n}: {bad} records differ, {flags} episode ends")
sys.exit(1 if bad or at != len(data) else 0)
PY
for spec in "CartPole-v1 4 700" "Pendulum-v1 3 450" "FrozenLake-v1 3 300"; do
    set -- $spec
    if "$ROLLOUT" "gym:$1" "$2" 5 "$3" "$dir/roll.bin" > "$dir/roll.out" 2>&1 && out=$(python3 "$dir/compare.py" "$1" "$2" 5 "$3" "$dir/roll.bin" 2>&1); then
        ok "gym:$1 through the bridge = Gymnasium's SyncVectorEnv bit for bit: $out"
    else fail "gym:$1: $(tail -2 "$dir/roll.out") $out"; fi
done

# PPO learns CartPole through the bridge; 2 ranks (each its own workers) give one process's episodes and losses
short=(--env gym:CartPole-v1 --envs 4 --total-steps 10240 --print-every 0)
"$DTRAIN" rl "${short[@]}" --metrics "$dir/one.jsonl" --save "$dir/one.safetensors" > "$dir/one.out" 2>&1 || fail "one process: $(tail -2 "$dir/one.out")"
"$DTRAIN" rl "${short[@]}" --nproc 2 --metrics "$dir/two.jsonl" > "$dir/two.out" 2>&1 || fail "2 ranks: $(tail -2 "$dir/two.out")"
l=$(worst loss "$dir/one.jsonl" "$dir/two.jsonl" 20)
cmp -s <(field episodes "$dir/one.jsonl") <(field episodes "$dir/two.jsonl") && [ "$l" != missing ] &&
    awk -v l="$l" 'BEGIN{exit !(l <= 1e-4)}' && ok "bridged, 2 ranks: the same episodes as one process, losses within $l" ||
    fail "bridged 2 ranks: losses $l, $(tail -1 "$dir/two.jsonl")"
"$DTRAIN" rl --env gym:CartPole-v1 --total-steps 100000 --seed 1 --print-every 0 > "$dir/learn.out" 2>&1
ret=$(grep -o 'mean return of the last 100 [0-9.]*' "$dir/learn.out" | awk '{print $NF}')
[ -n "$ret" ] && awk -v r="$ret" 'BEGIN{exit !(r >= 150)}' && ok "PPO on gym:CartPole-v1, 100k steps: mean return $ret (at least 150)" ||
    fail "PPO through the bridge: $(tail -2 "$dir/learn.out")"
e=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env gym:CartPole-v1 --episodes 3 2>&1 | tail -1)
echo "$e" | grep -q "mean return over 3 episodes" && ok "rl eval of a bridged policy: $e" || fail "rl eval bridged: $e"
out=$("$DTRAIN" rl eval --policy "$dir/one.safetensors" --env gym:CartPole-v1 --film "$dir/f.svg" 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "no picture" && ok "rl eval --film of a bridged environment refused: $out" || fail "film bridged: $out"

# bad input
refused_bridge() { # WHAT EXPECTED ARGS...
    local what=$1 want=$2 out
    shift 2
    out=$("$DTRAIN" rl --total-steps 512 --print-every 0 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want"; then ok "$what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else fail "$what: $(echo "$out" | tail -2)"; fi
}
refused_bridge "an id Gymnasium cannot make" "Gymnasium cannot make NoSuchEnv-v0: NameNotFound" --env gym:NoSuchEnv-v0
mkdir -p "$dir/nogym/gymnasium"
echo 'raise ImportError("planted: no gymnasium here")' > "$dir/nogym/gymnasium/__init__.py"
PYTHONPATH=$dir/nogym${PYTHONPATH:+:$PYTHONPATH} refused_bridge "a Python without gymnasium" "cannot import gymnasium with .*planted" --env gym:CartPole-v1
refused_bridge "a missing interpreter" "did not start" --env gym:CartPole-v1 --python "$dir/no-such-python"
for e in CartPole-v1 Pendulum-v1; do
    out=$("$ROLLOUT" "gym:$e" 2 1 1 bad-action 2>&1)
    [ $? = 0 ] && echo "$out" | grep -q "outside its space\|is not in its space" && ok "gym:$e: an action outside the space refused: $out" ||
        fail "gym:$e bad action: $out"
done
# a non-finite observation: named, the episode dropped, the run goes on (an environment of the test's own, by module)
cat > "$dir/nanenv.py" << 'PY'
import numpy as np
import gymnasium as gym
class NanEnv(gym.Env):
    """CartPole whose every third episode gives a NaN observation at its fifth step."""
    def __init__(self):
        self.inner = gym.make("CartPole-v1")
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space
        self.episode = 0
    def reset(self, seed=None, options=None):
        self.episode, self.t = self.episode + 1, 0
        return self.inner.reset(seed=seed)
    def step(self, a):
        self.t += 1
        o, r, te, tr, info = self.inner.step(a)
        if self.episode % 3 == 0 and self.t == 5: o = np.full_like(o, np.nan)
        return o, r, te, tr, info
class DictEnv(gym.Env):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Discrete(2)})
    action_space = gym.spaces.Discrete(2)
gym.register("NanEnv-v0", entry_point=NanEnv, max_episode_steps=500)
gym.register("DictEnv-v0", entry_point=DictEnv)
PY
export PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH}
refused_bridge "a Dict observation space" "neither a Box nor a Discrete" --env gym:nanenv:DictEnv-v0
"$ROLLOUT" gym:nanenv:NanEnv-v0 3 5 300 "$dir/nan.bin" > "$dir/nanroll.out" 2>&1
out=$(python3 - "$dir/nan.bin" << 'PY'
import sys
import numpy as np
d = np.fromfile(sys.argv[1], np.uint8)
n, od, rec = 3, 4, 3 * 4 * 4 + 3 * 4 + 3 * 3
obs = [d[:n * od * 4].view(np.float32)]
flags_prev, drops = np.zeros(n, bool), 0
for t in range((len(d) - n * od * 4) // rec):
    r = d[n * od * 4 + t * rec:n * od * 4 + (t + 1) * rec]
    obs.append(r[:n * od * 4].view(np.float32))
    te, tr, reset = r[n * od * 4 + 12:][:3], r[n * od * 4 + 15:][:3], r[n * od * 4 + 18:][:3]
    drops += int(np.sum(reset.astype(bool) & ~flags_prev))
    flags_prev = (te | tr).astype(bool)
finite = all(np.isfinite(o).all() for o in obs)
print(f"{drops} episodes dropped in {t + 1} steps, every observation finite: {finite}")
sys.exit(0 if finite and drops > 0 else 1)
PY
)
[ $? = 0 ] && ok "a NaN observation never reaches the caller: $out" || fail "NaN observations in the rollout: $out $(tail -1 "$dir/nanroll.out")"
"$DTRAIN" rl --env gym:nanenv:NanEnv-v0 --envs 2 --total-steps 4096 --print-every 0 > "$dir/nan.out" 2>&1
rc=$?
drops=$(grep -c "non-finite observation or reward at step 5 of its episode: the episode is dropped" "$dir/nan.out")
[ $rc = 0 ] && [ "$drops" -ge 1 ] && grep -q "^done:" "$dir/nan.out" && ok "a NaN observation: $drops episodes dropped and named, the run finished" ||
    fail "NaN observation (rc $rc, $drops drops): $(tail -2 "$dir/nan.out")"
# a worker killed: the run ends naming it within a second
"$DTRAIN" rl --env gym:CartPole-v1 --envs 2 --env-workers 2 --total-steps 100000000 --print-every 1 > "$dir/kill.out" 2>&1 &
job=$!
for i in $(seq 300); do grep -q "^update" "$dir/kill.out" && break; sleep 0.1; done
victim=$(pgrep -P $job -f gym_worker.py | tail -1)
if [ -n "$victim" ]; then
    t0=$(date +%s.%N)
    kill -9 "$victim"
    for i in $(seq 50); do kill -0 $job 2> /dev/null || break; sleep 0.05; done
    took=$(echo "$(date +%s.%N) - $t0" | bc)
    wait $job
    rc=$?
    grep -q "bridge worker 1 (pid $victim, environments 1-1) was killed by signal 9" "$dir/kill.out" && [ $rc != 0 ] &&
        awk -v t="$took" 'BEGIN{exit !(t < 1)}' && ok "a killed bridge worker named in ${took}s: $(grep -o 'gym:.*signal 9' "$dir/kill.out")" ||
        fail "killed worker (rc $rc, ${took}s): $(tail -2 "$dir/kill.out")"
else
    kill $job; wait $job
    fail "no bridge worker found to kill: $(tail -2 "$dir/kill.out")"
fi
[ -z "$(pgrep -f "gym_worker.py.*CartPole" | xargs -r ps -o ppid= -p | grep -w $job)" ] && ok "no worker left after the run" || fail "workers left"

echo "gym_bridge: $passed passed, $failed failed"
[ "$failed" = 0 ]
