#!/bin/bash
# Reinforcement learning on a language model: the demo's byte-level model of the King James Bible (make demo) trained
# by GRPO to speak of the LORD. Prompts: the first three words of every 25th verse; the reward: a program (an awk line)
# that gives 1 to a completion holding "LORD" and 0 to one without; 8 completions of 48 bytes a prompt, 4 prompts a
# step over 2 data-parallel ranks, the KL to the starting model held by beta 0.04. Prints the reward and KL every 10
# steps, then completions of the same prompts with the same seeds before and after (dtrain generate).
# usage: scripts/grpo_kjv.sh [BUILD_DIR] [STEPS (150)] [LR (1e-4)]
set -euo pipefail
build=${1:-build}
steps=${2:-150}
lr=${3:-1e-4}
dtrain=$build/dtrain
out=$build/grpo_kjv
mkdir -p "$out"
[ -s "$build/demo/kjv.bin" ] || scripts/demo.sh "$build" > /dev/null
bible -f Gen1:1-Rev22:21 | awk 'NR % 25 == 0 { print $2, $3, $4 }' > "$out/prompts.txt"
echo "== $(wc -l < "$out/prompts.txt") prompts (the first three words of every 25th verse); reward: 1 if the completion holds \"LORD\""
# the program reads {"prompt": ..., "completion": ...} a line and answers a number a line
reward='cmd:awk '\''{ sub(/.*"completion": /, ""); print (index($0, "LORD") > 0) }'\'''
"$dtrain" train --model "$build/demo/kjv.bin" --grpo "$out/prompts.txt" --reward "$reward" --shuffle 1 \
    --batch 16 --grad-accum 1 --nproc 2 --threads 1 --seq 64 --completion-tokens 48 --steps "$steps" --lr "$lr" \
    --print-every 10 --report "$out" --save "$out/grpo.bin" 2>&1 | grep -E "^(GRPO|step|  step|saved)"
echo "== reward and KL by step (metrics: $out/metrics.jsonl, report: $out/report.html)"
grep -o '"step":[0-9]*\|"reward":[0-9.]*\|"kl":[0-9.e-]*\|"rollout_tok_per_s":[0-9.]*' "$out/metrics.jsonl" | paste - - - - |
    awk -F'[:\t]' '$2 == 1 || $2 % 10 == 0 { printf "  step %4d  reward %.3f  kl %.4f  rollout %6.0f tok/s\n", $2, $4, $6, $8 }'
echo "== the same prompts and seeds, before (the demo's model) and after"
for p in "And the king" "Then said Jesus" "And it came" "Blessed are the"; do
    for m in kjv grpo; do
        f=$build/demo/kjv.bin
        [ $m = grpo ] && f=$out/grpo.bin
        printf '  %-5s ' "$m"
        "$dtrain" generate --model "$f" --prompt "$p" --tokens 48 --temperature 1 --seed 7 2> /dev/null | tr '\n' ' ' | cut -c1-80
        echo
    done
done
