#!/bin/bash
# Two ways to run the same training, alternating in one run so that a busy
# machine slows both alike: `dtrain train --nproc NPROC` of GPT-2 MODEL with
# flags A, then with flags B, ROUNDS times; prints each one's median ms/step
# (steps after the 2nd) with min-max over rounds, and B/A.
#   tracing's cost:   bench/compare_flags.sh "" "--trace /tmp/t.json --trace-steps 1:1000"
#   ZeRO-1 vs DDP:    bench/compare_flags.sh "" "--zero 1"
# usage: bench/compare_flags.sh FLAGS_A FLAGS_B [DTRAIN (build/dtrain)] [MODEL (d6)] [NPROC (2)] [ROUNDS (5)] [STEPS (12)]
set -euo pipefail
a=$1
b=$2
dtrain=${3:-build/dtrain}
model=${4:-d6}
nproc=${5:-2}
rounds=${6:-5}
steps=${7:-12}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 30); do cat /usr/share/common-licenses/GPL-3; done > "$dir/text"
"$dtrain" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, batch 4 x 64, AdamW, $nproc ranks x 1 thread, $steps steps (first 2 not counted), $rounds rounds of A/B"
echo "# A: '$a'   B: '$b'"
for r in $(seq 1 "$rounds"); do
    for k in A B; do
        flags=$a
        [ $k = B ] && flags=$b
        # shellcheck disable=SC2086 # the flags are words
        "$dtrain" train --nproc "$nproc" --threads 1 --model "$model" --data "$dir/train.bin" --batch 4 --seq 64 --steps "$steps" \
            --quiet --metrics "$dir/m.$k.$r" $flags 2> "$dir/err" || { cat "$dir/err"; exit 1; }
    done
done
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for k in ("A", "B"):
    ms = [statistics.median([json.loads(l)["ms"] for l in open(f"{d}/m.{k}.{r}")][2:]) for r in range(1, rounds + 1)]
    med[k] = statistics.median(ms)
    print(f"{k}: {med[k]:8.1f} ms/step (rounds {min(ms):.1f}-{max(ms):.1f})")
print(f"B/A: {med['B'] / med['A']:.4f}")
PY
