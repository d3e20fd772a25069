#!/bin/bash
# A real result of fine-tuning: the demo's byte-level model of the King James Bible (make demo) taught an instruction
# with LoRA adapters and supervised fine-tuning on pairs this script builds from Debian's bible-kjv: "Shout: " and the
# start of a verse (its first words, up to 24 bytes) -> the same words in capitals and a newline, the loss on the
# answer only; every 20th verse held out. Prints the held-out loss before and after, and greedy answers to held-out
# verses from the model alone and with the adapters merged (dtrain generate --lora).
# usage: scripts/lora_sft_kjv.sh [BUILD_DIR] [STEPS (2000)]
set -euo pipefail
build=${1:-build}
steps=${2:-2000}
dtrain=$build/dtrain
out=$build/lora_kjv
mkdir -p "$out"
[ -s "$build/demo/kjv.bin" ] || scripts/demo.sh "$build" > /dev/null
# "Ge1:1 In the beginning God created ..." -> {"prompt": "Shout: In the beginning God\n", "completion": "IN THE BEGINNING GOD\n"}
bible -f Gen1:1-Rev22:21 | awk -v out="$out" '{
    $1 = ""; sub(/^ /, ""); gsub(/[\\"]/, ""); s = "";
    for (i = 1; i <= NF && length(s) + length($i) + 1 <= 24; i++) s = s (i > 1 ? " " : "") $i;
    line = sprintf("{\"prompt\": \"Shout: %s\\n\", \"completion\": \"%s\\n\"}", s, toupper(s));
    print line > (out "/" (NR % 20 == 0 ? "val" : "train") ".jsonl") }'
echo "== $(wc -l < "$out/train.jsonl") verses to train on, $(wc -l < "$out/val.jsonl") held out"
ask() { # MODEL [ADAPTERS]: greedy answers to held-out verses
    sed -n '1p;100p;400p;900p;1400p' "$out/val.jsonl" | sed 's/.*"prompt": "Shout: \(.*\)\\n", "completion".*/\1/' |
        while read -r words; do
            printf '  Shout: %-26s -> ' "$words"
            "$dtrain" generate --model "$1" ${2:+--lora "$2"} --prompt "Shout: $words
" --tokens 30 --temperature 0 2>/dev/null | tail -n +2 | head -1
        done
}
common=(--model "$build/demo/kjv.bin" --data "$out/train.jsonl" --val-data "$out/val.jsonl" --seq 64 --eval-batches 64 --threads 2
        --lora-rank 16 --lora-alpha 32 --lora-targets c_attn,c_proj,c_fc)
echo "== the demo's model alone: held-out $("$dtrain" train "${common[@]}" --batch 16 --steps 0 2>&1 | grep -o 'loss [0-9.]*' | tail -1)"
ask "$build/demo/kjv.bin"
rm -rf "$out/ck"
echo "== LoRA (rank 16 on every Linear) on the pairs: $steps steps of 16"
"$dtrain" train "${common[@]}" --batch 16 --steps "$steps" --lr 3e-3 --schedule cosine --warmup 20 --eval-every 500 \
    --save "$out/ck" --metrics "$out/metrics.jsonl" --quiet
grep -o '"step":[0-9]*,.*"val_loss":[0-9.]*' "$out/metrics.jsonl" | sed 's/"step":\([0-9]*\),.*"val_loss":\([0-9.]*\)/  step \1: held-out loss \2/'
echo "== with the adapters (dtrain generate --lora $out/ck)"
ask "$build/demo/kjv.bin" "$out/ck"
