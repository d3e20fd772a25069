#!/bin/bash
# What tracing costs: the same `dtrain train --nproc NPROC` of GPT-2 MODEL,
# alternating without and with --trace (every step traced), ROUNDS times;
# prints each one's median ms/step (steps after the 2nd) with min-max and
# on/off. (Tracing off against a build without trace points:
# bench/compare_builds.sh OLD NEW d6 5 6 2.)
# usage: bench/trace_overhead.sh [DTRAIN (build/dtrain)] [MODEL (d6)] [NPROC (2)] [ROUNDS (5)] [STEPS (12)]
set -euo pipefail
dtrain=${1:-build/dtrain}
model=${2:-d6}
nproc=${3:-2}
rounds=${4:-5}
steps=${5:-12}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 30); do cat /usr/share/common-licenses/GPL-3; done > "$dir/text"
"$dtrain" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, batch 4 x 64, AdamW, $nproc ranks x 1 thread, $steps steps (first 2 not counted), $rounds rounds of off/on"
for r in $(seq 1 "$rounds"); do
    for mode in off on; do
        flags=()
        [ $mode = on ] && flags=(--trace "$dir/t.json" --trace-steps "1:$steps")
        "$dtrain" train --nproc "$nproc" --threads 1 --model "$model" --data "$dir/train.bin" --batch 4 --seq 64 --steps "$steps" \
            --quiet --metrics "$dir/m.$mode.$r" "${flags[@]}" 2> "$dir/err" || { cat "$dir/err"; exit 1; }
    done
done
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys, glob
d, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for mode in ("off", "on"):
    ms = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l)["ms"] for l in open(f"{d}/m.{mode}.{r}")][2:]
        ms.append(statistics.median(steps))
    res[mode] = ms
    print(f"tracing {mode:3}: {statistics.median(ms):8.1f} ms/step (rounds {min(ms):.1f}-{max(ms):.1f})")
print(f"on/off: {statistics.median(res['on']) / statistics.median(res['off']):.4f}")
PY
