#!/bin/bash
# Two builds of dtrain, the same training benchmark, alternating in one run
# (old, new, new, old, ...) so that a busy machine slows both alike:
# `dtrain bench train --nproc 1,2` (the engine, 1 rank and 2 data-parallel
# ranks, 1 thread each) ROUNDS times per build; prints each build's median
# ms/step with min-max, and new/old.
# Each DTRAIN must sit beside its own build (bench train runs the dtrain of
# its directory). usage:
#   bench/compare_builds.sh OLD_DTRAIN NEW_DTRAIN [MODEL (d6)] [ROUNDS (5)] [STEPS (6)] [NPROC (1,2)] [TRAIN_FLAGS]
# (TRAIN_FLAGS: more flags for dtrain train, e.g. "--strategy zero2")
set -euo pipefail
old=$1
new=$2
model=${3:-d6}
rounds=${4:-5}
steps=${5:-6}
nproc=${6:-1,2}
flags=${7:-}
out=$(mktemp)
trap 'rm -f "$out" "$out.run" "$out.err"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, batch 4 x 64, AdamW, 1 thread per rank, ranks $nproc${flags:+, $flags}, $steps steps after 2 warm-up, $rounds rounds per build"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order=(old new); else order=(new old); fi
    for b in "${order[@]}"; do
        bin=$old
        [ "$b" = new ] && bin=$new
        if ! "$bin" bench train --model "$model" --nproc "$nproc" --steps "$steps" --warmup 2 --json ${flags:+--train-flags "$flags"} > "$out.run" 2> "$out.err"; then
            echo "$bin bench train failed:" >&2
            cat "$out.err" >&2
            exit 1
        fi
        sed "s/^/$b /" "$out.run" >> "$out"
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
ms = {}
for line in open(sys.argv[1]):
    build, js = line.split(" ", 1)
    d = json.loads(js)
    ms.setdefault((build, d["nproc"]), []).append(d["ms"])
print(f"{'ranks':>5} {'old ms/step (min-max)':>26} {'new ms/step (min-max)':>26} {'new/old':>8}")
for n in sorted({k[1] for k in ms}):
    o, w = ms.get(("old", n), []), ms.get(("new", n), [])
    if not o or not w:
        continue
    mo, mw = statistics.median(o), statistics.median(w)
    print(f"{n:>5} {mo:>10.1f} ({min(o):.1f}-{max(o):.1f}) {mw:>10.1f} ({min(w):.1f}-{max(w):.1f}) {mw / mo:>8.3f}")
PY
