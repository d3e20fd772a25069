#!/bin/bash
# Ways to run the same training, alternating in one run so that a busy
# machine slows them alike: `dtrain train --nproc NPROC` of GPT-2 MODEL with
# flags A, then B (then C ...), ROUNDS times; prints each one's median
# ms/step (steps after the 2nd) with min-max over rounds, and its ratio to A.
#   tracing's cost:   bench/compare_flags.sh "" "--trace /tmp/t.json --trace-steps 1:1000"
#   ZeRO against DDP: bench/compare_flags.sh "" "--zero 1" "--zero 2" "--zero 3"
# usage: bench/compare_flags.sh [-d DTRAIN (build/dtrain)] [-m MODEL (d6)] [-n NPROC (2)] [-r ROUNDS (5)] [-s STEPS (12)]
#                               FLAGS_A FLAGS_B [FLAGS_C ...]
set -euo pipefail
dtrain=build/dtrain model=d6 nproc=2 rounds=5 steps=12
while getopts d:m:n:r:s: o; do
    case $o in d) dtrain=$OPTARG ;; m) model=$OPTARG ;; n) nproc=$OPTARG ;; r) rounds=$OPTARG ;; s) steps=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { sed -n 's/^# usage: //p; s/^#  *\(FLAGS_A.*\)/  \1/p' "$0"; exit 2; }
sets=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 30); do cat /usr/share/common-licenses/GPL-3; done > "$dir/text"
"$dtrain" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, batch 4 x 64, AdamW, $nproc ranks x 1 thread, $steps steps (first 2 not counted), $rounds rounds"
for k in "${!sets[@]}"; do echo "# $k: '${sets[$k]}'"; done
for r in $(seq 1 "$rounds"); do
    for k in "${!sets[@]}"; do
        # shellcheck disable=SC2086 # the flags are words
        "$dtrain" train --nproc "$nproc" --threads 1 --model "$model" --data "$dir/train.bin" --batch 4 --seq 64 --steps "$steps" \
            --quiet --metrics "$dir/m.$k.$r" ${sets[$k]} 2> "$dir/err" || { cat "$dir/err"; exit 1; }
    done
done
python3 - "$dir" "$rounds" "${#sets[@]}" <<'PY'
import json, statistics, sys
d, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
med = []
for k in range(n):
    ms = [statistics.median([json.loads(l)["ms"] for l in open(f"{d}/m.{k}.{r}")][2:]) for r in range(1, rounds + 1)]
    med.append(statistics.median(ms))
    print(f"{k}: {med[k]:8.1f} ms/step (rounds {min(ms):.1f}-{max(ms):.1f})   /0: {med[k] / med[0]:.4f}")
PY
