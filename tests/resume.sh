#!/bin/bash
# Full-state checkpoints: a run cut in two (10 steps, stop, --resume for 10
# more) is the uninterrupted 20-step run bit for bit (the losses as written,
# the final parameters and optimizer state byte for byte) for one process
# and for 2 DDP ranks, with AdamW (cosine schedule with warm-up) and SGD with
# momentum, with --shuffle (batches, or rows across a pass's end) and with gradient accumulation; a checkpoint of 2
# ranks resumes on 1 process and the reverse (same global batch, rows shuffled too) within 1e-6
# relative, and --resume without --grad-accum keeps the saved global batch on
# another layout (the accumulation derived, said) or refuses naming why; a save killed by SIGKILL leaves the previous checkpoint whole and
# resumable; a checkpoint of another model or optimizer, or a damaged or
# partial one, is refused naming the field or file, and nothing is written.
# usage: resume.sh DTRAIN [MPIRUN]
set -u
DTRAIN=$1
MPIRUN=${2:-}
. "$(dirname "$0")/checks.sh"
gpl_tokens
model=(--data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --threads 1 --quiet
       --steps 20 --lr 1e-3 --schedule cosine --warmup 5 --lr-min 1e-4)
losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2; }

# same NAME ARGS...: uninterrupted vs cut at step 10, byte for byte (run through ${launch[@]}, if set)
launch=()
same() {
    local name=$1
    shift
    local a=$dir/$name.a b=$dir/$name.b
    rm -rf "$a" "$b" "$a.jsonl" "$b.jsonl"
    "${launch[@]}" "$DTRAIN" train "${model[@]}" "$@" --save "$a" --metrics "$a.jsonl" > "$dir/out" 2>&1 || { fail "$name: the whole run: $(tail -3 "$dir/out")"; return; }
    "${launch[@]}" "$DTRAIN" train "${model[@]}" "$@" --save "$b" --metrics "$b.jsonl" --stop-after 10 > "$dir/out" 2>&1 ||
        { fail "$name: the first half: $(tail -3 "$dir/out")"; return; }
    [ "$(cat "$b/latest")" = step-00000010 ] || { fail "$name: the first half left $(cat "$b/latest")"; return; }
    "${launch[@]}" "$DTRAIN" train "${model[@]}" "$@" --save "$b" --metrics "$b.jsonl" --resume "$b" > "$dir/out" 2>&1 ||
        { fail "$name: the resumed half: $(tail -3 "$dir/out")"; return; }
    local sa=$a/step-00000020 sb=$b/step-00000020
    if [ "$(losses "$a.jsonl" | wc -l)" = 20 ] && [ "$(losses "$a.jsonl")" = "$(losses "$b.jsonl")" ] &&
       cmp -s "$sa/params.f32" "$sb/params.f32" && cmp -s "$sa/optim.f32" "$sb/optim.f32"; then
        ok "$name: 20 steps = 10 + resume 10: the same 20 losses, parameters and optimizer state byte for byte ($(losses "$a.jsonl" | tail -1))"
    else
        fail "$name: resumed run differs: losses $(losses "$a.jsonl" | tail -1) vs $(losses "$b.jsonl" | tail -1); $(cmp "$sa/params.f32" "$sb/params.f32" 2>&1)"
    fi
}
same adamw_1 --batch 4
same adamw_2ranks --batch 2 --nproc 2
same sgd_1 --batch 4 --optimizer sgd --momentum 0.9 --lr 0.05
same sgd_2ranks --batch 2 --nproc 2 --optimizer sgd --momentum 0.9 --lr 0.05
same shuffle_1 --batch 4 --shuffle 7
same shuffle_2ranks --batch 2 --nproc 2 --shuffle 7
# rows drawn one by one, over 3000 tokens (11 global batches a pass): the resumed half starts a new pass's draw
head -c 3000 "$dir/text" > "$dir/small.txt"
"$DTRAIN" tokenize --bytes "$dir/small.txt" "$dir/small.bin" > /dev/null
same shuffle_rows_2ranks --batch 2 --nproc 2 --shuffle 7 --shuffle-rows --data "$dir/small.bin"
"$DTRAIN" train "${model[@]}" --batch 4 --shuffle-rows > /dev/null 2> "$dir/err"
rc=$?
[ $rc -eq 2 ] && grep -q "give a seed" "$dir/err" && ok "--shuffle-rows without --shuffle: refused: $(head -1 "$dir/err" | cut -c1-100)" || fail "--shuffle-rows alone: exit $rc, $(head -2 "$dir/err")"
same accum_1 --batch 2 --grad-accum 2
same accum_2ranks --batch 1 --grad-accum 2 --nproc 2
same clip_2ranks --batch 2 --nproc 2 --grad-clip 0.5
same lamb_1 --batch 4 --optimizer lamb
if [ -n "$MPIRUN" ]; then
    # Open MPI leaks from plugins it has unloaded at exit (see tests/CMakeLists.txt): no leak check here.
    launch=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0
            "$MPIRUN" --oversubscribe -np 2)
    same mpirun_2ranks --batch 2
    launch=()
fi

# across layouts: a checkpoint of 2 ranks x batch 2 goes on as 1 process x batch 4, and the reverse
# cross FROM_ARGS -- TO_ARGS: the resumed losses against the uninterrupted run of the first layout
cross() {
    local name=$1 from=() to=()
    shift
    while [ "$1" != -- ]; do from+=("$1"); shift; done
    shift
    to=("$@")
    local a=$dir/$name.a b=$dir/$name.b
    rm -rf "$a" "$b" "$a.jsonl" "$b.jsonl"
    "$DTRAIN" train "${model[@]}" "${from[@]}" --metrics "$a.jsonl" > /dev/null 2>&1 || { fail "$name: whole run"; return; }
    "$DTRAIN" train "${model[@]}" "${from[@]}" --save "$b" --metrics "$b.jsonl" --stop-after 10 > /dev/null 2>&1 || { fail "$name: first half"; return; }
    "$DTRAIN" train "${model[@]}" "${to[@]}" --resume "$b" --metrics "$b.jsonl" > "$dir/out" 2>&1 ||
        { fail "$name: resumed half: $(tail -3 "$dir/out")"; return; }
    local worst
    worst=$(paste <(losses "$a.jsonl") <(losses "$b.jsonl") |
            awk 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=20) print "missing"; else print w}')
    if [ "$worst" != missing ] && awk "BEGIN{exit !($worst <= 1e-6)}"; then
        ok "$name: worst relative loss difference $worst over 20 steps (10 saved, 10 resumed)"
    else
        fail "$name: worst relative loss difference $worst"
    fi
}
cross "2 ranks x batch 2 -> 1 process x batch 4" --nproc 2 --batch 2 -- --batch 4
cross "1 process x batch 4 -> 2 ranks x batch 2" --batch 4 -- --nproc 2 --batch 2
cross "2 ranks x batch 2 -> 1 process x batch 2 x 2 accumulation" --nproc 2 --batch 2 -- --batch 2 --grad-accum 2
cross "rows shuffled: 2 ranks x batch 2 -> 1 process x batch 4" --nproc 2 --batch 2 --shuffle 7 --shuffle-rows --data "$dir/small.bin" -- --batch 4 --data "$dir/small.bin"
# without --grad-accum the accumulation is derived so that the saved global batch is kept, on any layout
cross "2 ranks x batch 2 -> 1 process, accumulation derived" --nproc 2 --batch 2 -- --batch 2
cross "TP 2 x PP 2 x 2 micro-batches -> 2 DDP ranks, accumulation derived" --nproc 4 --tp 2 --pp 2 --batch 2 --grad-accum 2 -- --nproc 2 --batch 2
# a model in parts (stages, slices) lists the whole model's tensors in its manifest, as one process's does: every
# rank's own gathered, each once (ckpt info read only the first stage's before)
table() { python3 -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['tensors']))" "$1/step-00000002/manifest.json"; }
rm -rf "$dir/t1" "$dir/t4"
"$DTRAIN" train "${model[@]}" --batch 4 --steps 2 --save "$dir/t1" > /dev/null 2>&1
"$DTRAIN" train "${model[@]}" --nproc 4 --tp 2 --pp 2 --batch 2 --grad-accum 2 --steps 2 --save "$dir/t4" > /dev/null 2>&1
n1=$(table "$dir/t1" | python3 -c "import json, sys; print(len(json.load(sys.stdin)))" 2> /dev/null)
[ -n "$n1" ] && [ "$n1" -gt 0 ] && [ "$(table "$dir/t1")" = "$(table "$dir/t4")" ] &&
    ok "TP 2 x PP 2's manifest lists the whole model's $n1 tensors, as one process's" ||
    fail "TP 2 x PP 2's tensor table: $(table "$dir/t4" | cut -c1-100) against one process's ${n1:-?} tensors"
rm -rf "$dir/g"
"$DTRAIN" train "${model[@]}" --nproc 2 --batch 2 --steps 4 --save "$dir/g" > /dev/null 2>&1
"$DTRAIN" train --resume "$dir/g" --steps 5 --metrics "$dir/g.jsonl" > "$dir/out" 2>&1
grep -q "1 data-parallel rank x --batch 2: gradient accumulation 2 (was 1) keeps the saved global batch of 4 samples" "$dir/out" &&
    ok "--resume alone on 1 process from 2 ranks: $(grep -o 'gradient accumulation 2.*' "$dir/out")" || fail "accumulation not said: $(head -3 "$dir/out")"
"$DTRAIN" train --resume "$dir/g" --steps 5 --nproc 3 > /dev/null 2> "$dir/err"
rc=$?
[ $rc -eq 2 ] && grep -q "global batch of 4 samples, which does not split over 3 data-parallel ranks" "$dir/err" &&
    ok "--resume on 3 ranks of a global batch of 4: refused: $(head -1 "$dir/err" | cut -c1-120)" || fail "3 ranks: exit $rc, $(head -2 "$dir/err")"
"$DTRAIN" train --resume "$dir/g" --steps 5 --nproc 2 --batch 4 > /dev/null 2> "$dir/err"
rc=$?
[ $rc -eq 2 ] && grep -q "which 2 data-parallel ranks at --batch 4 do not make; --batch 2 keeps it" "$dir/err" &&
    ok "--batch 4 on 2 ranks of a global batch of 4: refused, naming --batch 2" || fail "--batch 4 on 2 ranks: exit $rc, $(head -2 "$dir/err")"

# SIGKILL in the middle of a save: the previous checkpoint stays whole and resumes.
big=(--data "$dir/train.bin" --model d6 --vocab 256 --seq 32 --batch 1 --threads 1 --quiet --steps 1000 --save-every 1)
ck=$dir/killed
"$DTRAIN" train "${big[@]}" --save "$ck" > "$dir/kill.out" 2>&1 &
pid=$!
killed=0
for _ in $(seq 1 3000); do
    # a checkpoint exists, and the next one is being written
    if [ -s "$ck/latest" ] && compgen -G "$ck/.tmp-step-*" > /dev/null; then kill -9 $pid; killed=1; break; fi
    sleep 0.01
done
wait $pid 2> /dev/null
if [ $killed = 1 ]; then
    last=$(cat "$ck/latest")
    tmp=$(compgen -G "$ck/.tmp-step-*" | head -1)
    step=${last#step-}
    step=$((10#$step))
    if [ -f "$ck/$last/manifest.json" ] && [ -n "$tmp" ]; then ok "killed during the save of $(basename "$tmp"): latest still names $last, whole"
    else fail "after the kill: latest '$last', temporary '$tmp'"; fi
    if "$DTRAIN" train "${big[@]}" --steps $((step + 2)) --save "$ck" --resume "$ck" > "$dir/out" 2>&1 &&
       [ "$(cat "$ck/latest")" = "$(printf 'step-%08d' $((step + 2)))" ] && ! compgen -G "$ck/.tmp-step-*" > /dev/null; then
        ok "it resumes from step $step to $((step + 2)), and the killed save's temporary is gone"
    else
        fail "resume after the kill: $(tail -3 "$dir/out"); latest $(cat "$ck/latest"); $(ls -a "$ck" | tr '\n' ' ')"
    fi
else
    fail "the save never started: $(tail -3 "$dir/kill.out")"
fi

# Bad checkpoints: a clear error naming what differs, and nothing written.
# refuse NAME PATTERN ARGS...: exit 2, the pattern on stderr, the checkpoint directory unchanged
good=$dir/adamw_1.b
refuse() {
    local name=$1 pat=$2
    shift 2
    local before
    before=$(cd "$good" && find . -type f -exec md5sum {} + | sort)
    "$DTRAIN" train "${model[@]}" --batch 4 --save "$good" --resume "$good" "$@" > "$dir/out" 2> "$dir/err"
    local rc=$?
    local after
    after=$(cd "$good" && find . -type f -exec md5sum {} + | sort)
    if [ $rc -ne 0 ] && grep -qE -- "$pat" "$dir/err" && [ "$before" = "$after" ]; then ok "$name: $(grep -E -- "$pat" "$dir/err" | head -1)"
    else fail "$name: exit $rc, stderr: $(head -c 300 "$dir/err"); unchanged: $([ "$before" = "$after" ] && echo yes || echo no)"; fi
}
refuse "another shape" "model.num_layers is 2, this run's model has 3" --layers 3
refuse "another optimizer" "optimizer.kind is 'adamw', this run uses sgd" --optimizer sgd
refuse "nothing left" "at step 20, and --steps is 20: nothing left" --steps 20
cp -r "$good" "$dir/saved"
restore() { rm -rf "$good"; cp -r "$dir/saved" "$good"; }
flip "$good/step-00000020/params.f32" 1000
refuse "a damaged parameter file" "params.f32: its contents hash to .*damaged" --steps 30
restore
truncate -s 1000 "$good/step-00000020/optim.f32"
refuse "a truncated optimizer file" "optim.f32: 1000 bytes, the manifest says" --steps 30
restore
rm "$good/step-00000020/manifest.json"
refuse "a missing manifest" "manifest.json: cannot open" --steps 30
restore
echo step-00000007 > "$good/latest"
refuse "latest naming a missing step" "step-00000007/manifest.json: cannot open" --steps 30
restore
"$DTRAIN" train "${model[@]}" --batch 4 --resume "$dir/nowhere" > /dev/null 2> "$dir/err"
grep -q "nowhere/latest: cannot open" "$dir/err" && ok "no such checkpoint: $(head -1 "$dir/err")" || fail "no such checkpoint: $(head -2 "$dir/err")"
"$DTRAIN" train "${model[@]}" --batch 4 --save "$dir/text" > /dev/null 2> "$dir/err"
grep -q "exists and is not a directory" "$dir/err" && ok "--save onto a file: $(head -1 "$dir/err")" || fail "--save onto a file: $(head -2 "$dir/err")"

# Another run's checkpoint is never replaced silently: refused naming its step, kept whole; --overwrite replaces it
small=(--data "$dir/train.bin" --layers 1 --channels 32 --heads 2 --vocab 256 --max-seq 32 --seq 32 --batch 2 --threads 1 --quiet)
rm -rf "$dir/keep"
"$DTRAIN" train "${small[@]}" --steps 5 --save "$dir/keep" > /dev/null 2>&1
sum=$(cat "$dir/keep/step-00000005/params.f32" | md5sum)
"$DTRAIN" train "${small[@]}" --steps 3 --save "$dir/keep" > /dev/null 2> "$dir/err"
rc=$?
if [ $rc -eq 2 ] && grep -q "already holds a checkpoint (step 5): --resume .*keep goes on from it; --overwrite" "$dir/err" &&
    [ "$(cat "$dir/keep/latest")" = step-00000005 ] && [ "$(md5sum < "$dir/keep/step-00000005/params.f32")" = "$sum" ]; then
    ok "a new run onto another run's checkpoint: refused, exit 2, the checkpoint whole: $(head -c 120 "$dir/err")"
else fail "a new run onto another run's checkpoint: exit $rc, latest $(cat "$dir/keep/latest"), $(head -c 300 "$dir/err")"; fi
"$DTRAIN" train "${small[@]}" --steps 3 --save "$dir/keep" --overwrite > /dev/null 2>&1 && [ "$(cat "$dir/keep/latest")" = step-00000003 ] &&
    ok "--overwrite replaces it (latest step-00000003)" || fail "--overwrite: latest $(cat "$dir/keep/latest")"
"$DTRAIN" train "${small[@]}" --steps 6 --save "$dir/keep" --resume "$dir/keep" > /dev/null 2>&1 && [ "$(cat "$dir/keep/latest")" = step-00000006 ] &&
    ok "--resume DIR --save DIR goes on in place" || fail "resume in place: latest $(cat "$dir/keep/latest")"
for bad in model.pt weights.pth; do
    "$DTRAIN" train "${small[@]}" --steps 1 --save "$dir/$bad" > /dev/null 2> "$dir/err"
    rc=$?
    [ $rc -eq 2 ] && [ ! -e "$dir/$bad" ] && grep -q "the name decides what is written" "$dir/err" && ok "--save $bad refused, nothing made" ||
        fail "--save $bad: exit $rc, $(ls -d "$dir/$bad" 2>&1) $(head -c 200 "$dir/err")"
done

# --keep-last 2 keeps two checkpoints; ckpt verify names a damaged one (exit 1) and a resume goes on from the newest
# whole one, saying so, to the uninterrupted run's losses
rm -rf "$dir/kl" "$dir/kl.jsonl" "$dir/klw.jsonl"
"$DTRAIN" train "${small[@]}" --steps 9 --metrics "$dir/klw.jsonl" > /dev/null 2>&1
"$DTRAIN" train "${small[@]}" --steps 6 --save-every 3 --keep-last 2 --save "$dir/kl" --metrics "$dir/kl.jsonl" > /dev/null 2>&1
kept=$(ls "$dir/kl" | grep -c '^step-')
"$DTRAIN" ckpt verify "$dir/kl" > "$dir/v1" 2>&1; rc1=$?
flip "$dir/kl/step-00000006/optim.f32" 100
"$DTRAIN" ckpt verify "$dir/kl" > "$dir/v2" 2>&1; rc2=$?
[ "$kept" = 2 ] && [ $rc1 = 0 ] && [ $rc2 = 1 ] && grep -q "step-00000006: DAMAGED: .*optim.f32" "$dir/v2" && grep -q "step-00000003: whole" "$dir/v2" &&
    ok "--keep-last 2 keeps $kept; ckpt verify: whole (exit 0), then step 6's optim.f32 damaged (exit 1): $(grep -c whole "$dir/v2") whole" ||
    fail "keep-last/verify: kept $kept, exit $rc1 then $rc2: $(cat "$dir/v1" "$dir/v2")"
"$DTRAIN" train --resume "$dir/kl" --steps 9 --metrics "$dir/kl.jsonl" > /dev/null 2> "$dir/err"
if grep -q "going on from .*step-00000003, the newest whole checkpoint (steps 4 to 6 run again)" "$dir/err" &&
    [ "$(losses "$dir/klw.jsonl")" = "$(losses "$dir/kl.jsonl")" ] && [ "$(ls "$dir/kl" | grep -c '^step-')" = 2 ]; then
    ok "a resume whose latest is damaged goes on from step 3, said, to the uninterrupted run's 9 losses (--keep-last kept on resume)"
else fail "fallback resume: $(head -c 300 "$dir/err"); losses $(losses "$dir/kl.jsonl" | tr '\n' ' ') vs $(losses "$dir/klw.jsonl" | tr '\n' ' ')"; fi

# A resumed run's metrics: the rows of the lost steps are removed, not repeated (steps 1..6 once each, in order)
rm -rf "$dir/m1" "$dir/m2" "$dir/m.jsonl"
"$DTRAIN" train "${small[@]}" --steps 3 --save "$dir/m1" --metrics "$dir/m.jsonl" > /dev/null 2>&1
"$DTRAIN" train "${small[@]}" --steps 6 --resume "$dir/m1" --save "$dir/m2" --metrics "$dir/m.jsonl" > /dev/null 2>&1 # the work lost
"$DTRAIN" train "${small[@]}" --steps 6 --resume "$dir/m1" --save "$dir/m1" --metrics "$dir/m.jsonl" > /dev/null 2>&1
steps=$(grep -o '"step":[0-9]*' "$dir/m.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "1 2 3 4 5 6 " ] && ok "metrics after a resume from step 3 over rows 4-6: steps $steps" || fail "metrics after resume: steps $steps"

# --resume DIR alone goes on with the settings the checkpoint stores (data, shape, batch, optimizer, schedule, threads,
# validation), from any directory, bit for bit; a flag given overrides and a change of meaning is named
own=(--data "$dir/train.bin" --val-data "$dir/train.bin" --eval-every 4 --eval-batches 2 --layers 2 --channels 32 --heads 2
     --vocab 256 --max-seq 32 --seq 16 --batch 3 --threads 1 --optimizer sgd --momentum 0.9 --lr 0.05 --schedule cosine --warmup 2
     --shuffle 7 --steps 10 --quiet)
rm -rf "$dir/whole" "$dir/cut" "$dir/w.jsonl" "$dir/c.jsonl"
"$DTRAIN" train "${own[@]}" --save "$dir/whole" --metrics "$dir/w.jsonl" > /dev/null 2>&1
"$DTRAIN" train "${own[@]}" --save "$dir/cut" --stop-after 5 --metrics "$dir/c.jsonl" > /dev/null 2>&1
(cd / && "$DTRAIN" train --resume "$dir/cut" --metrics "$dir/c.jsonl" > "$dir/out" 2>&1)
if [ "$(losses "$dir/w.jsonl")" = "$(losses "$dir/c.jsonl")" ] && [ "$(grep -c val_loss "$dir/c.jsonl")" = 3 ] &&
    cmp -s "$dir/whole/step-00000010/params.f32" "$dir/cut/step-00000010/params.f32" &&
    cmp -s "$dir/whole/step-00000010/optim.f32" "$dir/cut/step-00000010/optim.f32"; then
    ok "--resume DIR alone, from another directory: the uninterrupted run's 10 losses, validations and state, byte for byte"
else fail "--resume DIR alone: $(tail -3 "$dir/out")"; fi
"$DTRAIN" train --resume "$dir/cut" --steps 12 --lr 0.01 > /dev/null 2> "$dir/err"
grep -q "saved with --lr 0.05, resumed with 0.01" "$dir/err" && grep -q "schedule ran over 10 steps, now over 12" "$dir/err" &&
    ok "a flag given overrides the stored one, and the change is named: $(head -1 "$dir/err" | cut -c1-100)" ||
    fail "override named: $(head -c 400 "$dir/err")"

echo "resume: $passed passed, $failed failed"
[ $failed -eq 0 ]
