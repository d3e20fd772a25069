#!/bin/bash
# The small ResNet trained by dtrain train on tiny images (8 x 8, from the
# GPL's text): with --sync-bn, 2 ranks with batch 4 compute what one process
# with batch 8 computes (BatchNorm's statistics over the same 8 images):
# with the weights held still (lr 1e-30), every one of 64 batches' loss
# (forward: the statistics) and gradient norm (backward: the sums of the
# output gradient) within 1e-5, and the same test accuracy (the running
# averages); trained, the first 3 steps within 1e-5. Not more steps: batch-8
# BatchNorm training is chaotic here, as in PyTorch (its own f32 and f64
# runs of this ResNet on Fashion-MNIST part by 6e-6 at step 8 and 6e-4 at
# step 12; dtrain's 1- and 2-thread runs part likewise), so a summation
# order alone moves later losses by more than 1e-5. Without --sync-bn
# each rank normalises by its own 4 images and the losses differ. A run
# cut and resumed from its checkpoint is the uninterrupted run. Bad
# settings are named.
# usage: resnet_training.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/tiny_images.sh"
tiny_images "$dir/img"
col() { grep '"step"' "$1" | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2; }
# worst FILE FILE N KEY: the largest relative difference of KEY over the first N steps ("missing" if fewer)
worst() {
    paste <(col "$1" "$4" | head -"$3") <(col "$2" "$4" | head -"$3") |
        awk -v want="$3" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=want) print "missing"; else print w}'
}
within() { [ "$1" != missing ] && awk "BEGIN{exit !($1 <= $2)}"; }
# expect_error WHAT PATTERN ARGS...: dtrain train ARGS fails (not by a signal) with PATTERN in its message
expect_error() {
    local what=$1 pat=$2
    shift 2
    "$DTRAIN" train "$@" > /dev/null 2> "$dir/err"
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pat" "$dir/err" && ok "$what: $(head -c 160 "$dir/err")" \
        || fail "$what: rc $rc, $(cat "$dir/err")"
}
rn=(--model resnet:small --data "$dir/img" --epochs 1 --optimizer sgd --momentum 0.9 --threads 1 --quiet)

# 1. synchronised BatchNorm: 2 ranks x 4 = one process x 8
for lr in 1e-30 0.005; do
    "$DTRAIN" train "${rn[@]}" --lr $lr --batch 8 --metrics "$dir/one.$lr.jsonl" 2> "$dir/err" || fail "one process: $(cat "$dir/err")"
    "$DTRAIN" train "${rn[@]}" --lr $lr --batch 4 --nproc 2 --sync-bn --metrics "$dir/sync.$lr.jsonl" 2> "$dir/err" \
        || fail "--sync-bn: $(cat "$dir/err")"
done
wl=$(worst "$dir/one.1e-30.jsonl" "$dir/sync.1e-30.jsonl" 64 loss) wg=$(worst "$dir/one.1e-30.jsonl" "$dir/sync.1e-30.jsonl" 64 grad_norm)
within "$wl" 1e-5 && within "$wg" 1e-5 \
    && ok "--sync-bn, 2 ranks x 4 vs one process x 8, 64 batches on still weights: losses within $wl, gradient norms $wg" \
    || fail "--sync-bn vs one process on still weights: losses $wl, gradient norms $wg"
acc() { grep -o '"test_accuracy":[0-9.]*' "$1" | cut -d: -f2; }
a1=$(acc "$dir/one.1e-30.jsonl") a2=$(acc "$dir/sync.1e-30.jsonl")
[ -n "$a1" ] && [ "$a1" = "$a2" ] && ok "--sync-bn: the same running averages, the same test accuracy as one process ($a2)" \
    || fail "--sync-bn test accuracy '$a2' vs one process '$a1'"
w=$(worst "$dir/one.0.005.jsonl" "$dir/sync.0.005.jsonl" 3 loss)
within "$w" 1e-5 && ok "--sync-bn trained (SGD, momentum 0.9, lr 0.005): the first 3 steps' losses within $w" \
    || fail "--sync-bn trained: $w over 3 steps"

# 2. per-rank BatchNorm (the default) normalises 4 images, not 8: not the one process's losses
"$DTRAIN" train "${rn[@]}" --lr 1e-30 --batch 4 --nproc 2 --metrics "$dir/local.jsonl" 2> "$dir/err" || fail "per-rank BatchNorm: $(cat "$dir/err")"
w=$(worst "$dir/one.1e-30.jsonl" "$dir/local.jsonl" 64 loss)
[ "$w" != missing ] && awk "BEGIN{exit !($w > 1e-3)}" && ok "per-rank BatchNorm differs from one process x 8 ($w), as it should" \
    || fail "per-rank BatchNorm gave the one process's losses ($w): is BatchNorm synchronised by default?"

# 2b. --init: the trained small ResNet's torchvision state dict (tests/fixtures) starts the run: on still weights its
# losses are not the random initialisation's; a state dict with a misshaped tensor is refused naming it
fix=$(cd "$(dirname "$0")" && pwd)/fixtures
"$DTRAIN" train "${rn[@]}" --lr 1e-30 --batch 8 --init "$fix/resnet_small.safetensors" --metrics "$dir/init.jsonl" 2> "$dir/err" \
    || fail "--init: $(cat "$dir/err")"
w=$(worst "$dir/one.1e-30.jsonl" "$dir/init.jsonl" 64 loss)
[ "$w" != missing ] && awk "BEGIN{exit !($w > 1e-2)}" && ok "--init loads the state dict: its losses differ from the random start's ($w)" \
    || fail "--init gave the random start's losses ($w)"

# 2d. checkpoints: a run cut by --stop-after and resumed takes the uninterrupted run's steps (loss, lr and gradient norm
# of every step, to the printed digits) and its test accuracy after each epoch; in one process across an epoch's end
# (cosine schedule), on 2 ranks with ZeRO-1's optimizer in slices, and on 2 ranks with PowerSGD (its residuals and Q in
# the checkpoint); BatchNorm's running averages are saved beside
# the parameters (damaged, they are named); a checkpoint of another model kind or batch is refused naming what differs
steplines() { grep -h '"step"' "$@"; }
accs() { grep -ho '"test_accuracy":[0-9.]*' "$@"; }
ck=(--model resnet:small --data "$dir/img" --epochs 2 --threads 1 --quiet)
for layout in "one --batch 8 --optimizer sgd --momentum 0.9 --lr 0.005 --schedule cosine --warmup 5|70" \
              "zero1 --batch 4 --nproc 2 --strategy zero1 --optimizer adamw --lr 0.002|40" \
              "powersgd --batch 4 --nproc 2 --optimizer adamw --lr 0.002 --compress powersgd --compress-rank 2 --compress-start 5|40"; do
    set -- ${layout%|*}
    name=$1 cut=${layout#*|}
    shift
    rm -rf "$dir/ck"
    "$DTRAIN" train "${ck[@]}" "$@" --metrics "$dir/ck.u.jsonl" 2> "$dir/err" || fail "$name uninterrupted: $(cat "$dir/err")"
    "$DTRAIN" train "${ck[@]}" "$@" --save "$dir/ck" --stop-after "$cut" --metrics "$dir/ck.1.jsonl" 2> "$dir/err" \
        || fail "$name cut at $cut: $(cat "$dir/err")"
    "$DTRAIN" train "${ck[@]}" "$@" --resume "$dir/ck" --metrics "$dir/ck.2.jsonl" 2> "$dir/err" || fail "$name resumed: $(cat "$dir/err")"
    n=$(steplines "$dir/ck.u.jsonl" | wc -l)
    [ "$n" -gt "$cut" ] && [ "$(steplines "$dir/ck.u.jsonl")" = "$(steplines "$dir/ck.1.jsonl" "$dir/ck.2.jsonl")" ] \
        && [ "$(accs "$dir/ck.u.jsonl")" = "$(accs "$dir/ck.1.jsonl" "$dir/ck.2.jsonl")" ] \
        && ok "checkpoint ($name): cut at step $cut of $n and resumed, every step and epoch's accuracy as the uninterrupted run's" \
        || fail "checkpoint ($name): the resumed run differs from the uninterrupted one"
done
# SIGTERM to the launcher: every rank finishes its step and the checkpoint is saved (exit 143); the resumed run goes
# on from the next step (5 steps of it: ThreadSanitizer's build takes minutes for the whole run)
rm -rf "$dir/cks"
sig=(--model resnet:small --data "$dir/img" --epochs 40 --threads 1 --batch 4 --nproc 2 --optimizer adamw --save "$dir/cks")
"$DTRAIN" train "${sig[@]}" --metrics "$dir/sig.1.jsonl" > /dev/null 2> "$dir/sig.err" &
pid=$!
for ((i = 0; i < 200; i++)); do [ "$(grep -c '"step"' "$dir/sig.1.jsonl" 2> /dev/null)" -ge 3 ] && break; sleep 0.05; done
kill -TERM $pid
wait $pid
rc=$?
saved=$(sed 's/step-0*//' "$dir/cks/latest" 2> /dev/null)
"$DTRAIN" train "${sig[@]}" --resume "$dir/cks" --stop-after 5 --quiet --metrics "$dir/sig.2.jsonl" 2> "$dir/err"
rc2=$?
first=$(grep -m1 -o '"step":[0-9]*' "$dir/sig.2.jsonl" | cut -d: -f2)
[ $rc -eq 143 ] && grep -q "stopped by signal 15.*; saved" "$dir/sig.err" && [ -n "$saved" ] && [ $rc2 -eq 0 ] \
    && [ "$first" = "$((saved + 1))" ] && [ "$(grep -c '"step"' "$dir/sig.2.jsonl")" -eq 5 ] \
    && ok "SIGTERM: exit 143, saved at step $saved; resumed from step $first" \
    || fail "SIGTERM to a ResNet run: exit $rc, saved '$saved', resumed exit $rc2 from '$first': $(cat "$dir/sig.err" "$dir/err")"
last=$(cat "$dir/ck/latest")
"$DTRAIN" ckpt info "$dir/ck" > "$dir/info" 2>&1 && grep -q "model: resnet, depth 0, image_channels 1, image_height 8" "$dir/info" \
    && ok "ckpt info names the ResNet: $(grep '^model' "$dir/info")" || fail "ckpt info: $(cat "$dir/info")"
head -c 20000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/tokens.bin" > /dev/null
expect_error "a ResNet checkpoint resumed by GPT-2's trainer" "model.kind is 'resnet', this run trains gpt2" \
    --data "$dir/tokens.bin" --layers 1 --channels 32 --heads 2 --vocab 256 --max-seq 16 --seq 16 --resume "$dir/ck" --quiet
expect_error "a ResNet checkpoint resumed with another global batch" "2 per step" \
    "${ck[@]}" --batch 2 --optimizer adamw --resume "$dir/ck"
cp "$dir/ck/$last/buffers.f32" "$dir/buffers.bak"
flip "$dir/ck/$last/buffers.f32" 12
expect_error "damaged BatchNorm running averages" "buffers.f32: its contents hash" \
    "${ck[@]}" --epochs 3 --batch 4 --nproc 2 --strategy zero1 --optimizer adamw --lr 0.002 --resume "$dir/ck"
# progress for image models: step lines as GPT-2's, every --print-every steps (50 by default) and the last
"$DTRAIN" train --model resnet:small --data "$dir/img" --epochs 2 --batch 16 --threads 1 --print-every 8 > "$dir/out" 2>&1
lines=$(grep -cE "^epoch [12]/2 step [0-9]+/64 loss [0-9.]+ .* img/s ETA" "$dir/out")
[ "$lines" = 8 ] && grep -q "^epoch 2/2 step 64/64" "$dir/out" && ok "resnet:small prints its progress: 8 step lines over 2 epochs of 32 steps" ||
    fail "image progress: $lines step lines: $(head -5 "$dir/out")"
expect_error "--save with the MLP" "checkpoints are built for the ResNets" --model mlp --data "$dir/img" --epochs 1 --save "$dir/ck2"

# 2c. the Horovod-style benchmark: its lines for 1 and 2 workers and the 2 independent runs beside them (the format
# only: no figure is asserted)
"$DTRAIN" bench train --model resnet:small --synthetic --nproc 1,2 --batch 8 --steps 2 --warmup 1 --threads 1 > "$dir/bench" 2> "$dir/err"
rc=$?
num='[0-9][0-9.]* +-[0-9][0-9.]*'
[ $rc -eq 0 ] && [ "$(grep -c "^Img/sec per worker: $num\$" "$dir/bench")" -eq 3 ] && grep -q "^Total img/sec on 2 workers: $num" "$dir/bench" \
    && grep -q "^== dtrain, independent 1-worker runs side by side, 2 workers" "$dir/bench" \
    && grep -q "of the independent runs' (the machine's ceiling for 2 workers)" "$dir/bench" \
    && ok "bench train --synthetic: Horovod's lines for 1 and 2 workers and for 2 independent runs" \
    || fail "bench train --synthetic: rc $rc, $(cat "$dir/bench" "$dir/err")"

# 3. bad settings, named
expect_error "resnet18 on 8x8 images" "8x8" --model resnet18 --data "$dir/img" --epochs 1 --quiet
expect_error "an unknown ResNet" "resnet101" --model resnet101 --data "$dir/no-such-dir" --epochs 1 --quiet  # named before any data is read
expect_error "--sync-bn with the MLP" "no BatchNorm" --model mlp --data "$dir/img" --epochs 1 --sync-bn --quiet
expect_error "--init with a misshaped tensor" "conv1.weight" --model resnet:small --data "$dir/img" --epochs 1 --quiet \
    --init "$fix/resnet_small_misshaped.safetensors"
expect_error "--init with the MLP" "the MLP starts" --model mlp --data "$dir/img" --epochs 1 --quiet --init "$fix/resnet_small.safetensors"
expect_error "--sync-bn with GPT-2" "no BatchNorm" --data "$dir/img/train-images-idx3-ubyte.gz" --sync-bn --quiet
echo "resnet training: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
