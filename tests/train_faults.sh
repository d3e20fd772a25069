#!/bin/bash
# Training under faults: a rank killed mid-training (the other stops within
# a second naming it, the launcher exits non-zero, the last checkpoint is
# whole and loads, no temporary file is left), and ranks started with
# different models or data (refused at start-up, saying what differs).
# usage: train_faults.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
gpl_tokens
model=(--layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --threads 1)

# A rank killed by signal 9 in the middle of training.
"$DTRAIN" train "${model[@]}" --data "$dir/train.bin" --nproc 2 --batch 4 --steps 100000 --save-every 3 \
    --save "$dir/ck.bin" > "$dir/out" 2> "$dir/err" &
launcher=$!
for ((i = 0; i < 300; i++)); do [ -s "$dir/ck.bin" ] && break; sleep 0.1; done
[ -s "$dir/ck.bin" ] || fail "no checkpoint after 30 s"
sleep 0.3
victim=""
for p in $(pgrep -P $launcher); do
    grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2>/dev/null && victim=$p
done
if [ -z "$victim" ]; then
    fail "rank 1 of the launcher (pid $launcher) not found"
    kill $launcher
else
    # the shared segment is a memfd: it has no name in /dev/shm, so nothing can be left there however the job ends
    grep -q "/memfd:dtrain" /proc/$victim/maps && ! grep -q " /dev/shm/" /proc/$victim/maps &&
        ok "the rank maps its segment from a memfd, nothing from /dev/shm" || fail "rank maps: $(grep -E 'memfd|shm' /proc/$victim/maps | head -3)"
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait $launcher
    rc=$?
    t1=$(date +%s.%N)
    secs=$(awk "BEGIN{print $t1 - $t0}")
    [ $rc -ne 0 ] && ok "launcher exited $rc" || fail "launcher exited 0 after a rank was killed"
    awk "BEGIN{exit !($secs < 1.0)}" && ok "the job ended ${secs} s after the kill" || fail "the job took $secs s to end"
    # rank 0 names rank 1 and its pid; whether it can also give the signal depends on whether the launcher
    # had reaped rank 1 when rank 0 looked (otherwise it says "died"); the launcher's own line gives it
    grep -q "rank 0.*rank 1 (pid $victim) \(was killed by signal 9\|died\)" "$dir/err" &&
        ok "rank 0 named the killed rank: $(grep -m1 'rank 0' "$dir/err")" || fail "rank 0 did not name rank 1: $(cat "$dir/err")"
    grep -q "launch: rank 1 (pid $victim) was killed by signal 9" "$dir/err" && ok "the launcher named it" ||
        fail "the launcher did not name rank 1: $(cat "$dir/err")"
    ls "$dir" | grep -q "ck.bin." && fail "a temporary checkpoint file was left: $(ls "$dir")" || ok "no temporary file left"
    "$DTRAIN" train --model "$dir/ck.bin" --data "$dir/train.bin" --batch 4 --seq 64 --steps 1 --threads 1 --quiet &&
        ok "the last checkpoint loads and trains" || fail "the last checkpoint does not load"
fi

# Ranks that disagree at start-up (rank 1 with another model, then other data).
run_mismatch() {
    local what=$1 word=$2; shift 2
    timeout 60 "$DTRAIN" launch -n 2 -- bash -c "$*" > "$dir/mout" 2> "$dir/merr"
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$word" "$dir/merr"; then ok "$what: $(grep -m1 "$word" "$dir/merr")"
    else fail "$what: exit $rc, messages: $(cat "$dir/merr")"; fi
}
cat /usr/share/common-licenses/GPL-2 > "$dir/text2" # other text, other length
"$DTRAIN" tokenize --bytes "$dir/text2" "$dir/other.bin" > /dev/null
common="$DTRAIN train --vocab 256 --max-seq 64 --seq 64 --heads 4 --threads 1 --steps 2 --quiet --data $dir/train.bin"
run_mismatch "different models" "rank 0 has a model with 2 layers, 64 channels.*rank 1 has 3 layers" \
    "if [ \$DTRAIN_RANK = 0 ]; then $common --layers 2 --channels 64; else $common --layers 3 --channels 64; fi"
run_mismatch "different data" "training tokens" \
    "if [ \$DTRAIN_RANK = 0 ]; then $common --layers 2 --channels 64; else $common --layers 2 --channels 64 --data $dir/other.bin; fi"
run_mismatch "different batch" "batch 4 x 64 x 1, rank 1 has 2 x 64 x 1" \
    "if [ \$DTRAIN_RANK = 0 ]; then $common --layers 2 --channels 64; else $common --layers 2 --channels 64 --batch 2; fi"
echo "train faults: $passed passed, $failed failed"
[ $failed -eq 0 ]
