#!/bin/bash
# Mixed precision (--precision bf16 / fp16) against its oracles: PyTorch's
# torch.autocast bf16 on the same weights and batches (the curves in
# tests/fixtures/autocast_ref.txt, from scripts/make_autocast_fixture.py),
# dtrain's own fp32 over 200 steps; every strategy against one bf16 process
# with the global batch; fp16's loss scaler: a run that overflows skips the
# same steps on every rank with DeepSpeed's words, a NaN stops at the scale's
# floor naming the step, and a resumed run is bit for bit the uninterrupted
# one. Bad settings are named.
# usage: mixed_precision.sh DTRAIN FIXTURES [CASES]
# CASES: the fixture's models to compare with PyTorch (default: all; the
# ThreadSanitizer build gives "tiny": d6's 100 steps take it hours, and its
# numerics are checked by the Release and AddressSanitizer builds)
set -u
DTRAIN=$1
FIX=$2
CASES=${3:-all}
. "$(dirname "$0")/checks.sh"
gpl_tokens
losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2; }
# worst A B: the largest relative difference between two columns of numbers (or "missing" if not N rows)
worst() {
    paste <(echo "$1" | tr ' ' '\n' | grep .) <(echo "$2" | tr ' ' '\n' | grep .) |
        awk -v want="$3" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=want) print "missing"; else print w}'
}
within() { [ "$1" != missing ] && awk "BEGIN{exit !($1 <= $2)}"; }

# 1. Against PyTorch's autocast: each case of the fixture, dtrain bf16 and fp32
while read -r word name _ L _ C _ NH _ V _ T0 _ B _ T _ S _ LR _ WD _ SEED; do
    [ "$word" = case ] || continue
    [ "$CASES" = all ] || [[ " $CASES " == *" $name "* ]] || continue
    ref32=$(grep -A2 "^case $name " "$FIX/autocast_ref.txt" | grep '^fp32' | cut -d' ' -f2-)
    ref16=$(grep -A2 "^case $name " "$FIX/autocast_ref.txt" | grep '^bf16' | cut -d' ' -f2-)
    shape=(--layers "$L" --channels "$C" --heads "$NH" --vocab "$V" --max-seq "$T0")
    [ "$name" = d6 ] && shape=(--model d6)
    for p in fp32 bf16; do
        "$DTRAIN" train "${shape[@]}" --data "$dir/train.bin" --batch "$B" --seq "$T" --steps "$S" --lr "$LR" \
            --weight-decay "$WD" --seed "$SEED" --precision $p --threads 1 --quiet --metrics "$dir/$name.$p.jsonl" 2> "$dir/err" \
            || fail "$name $p: $(cat "$dir/err")"
    done
    w=$(worst "$ref16" "$(losses "$dir/$name.bf16.jsonl")" "$S")
    within "$w" 1e-2 && ok "$name bf16 vs torch.autocast bf16: worst relative loss difference $w over $S steps" \
        || fail "$name bf16 vs torch.autocast: $w"
    # the same weights and batches: step 1 agrees to f32 rounding; later steps drift apart by summation order
    # (6.6e-7 worst on d6 here in Release; 3e-4 in a Debug build, whose kernels sum in another order)
    w1=$(worst "${ref32%% *}" "$(losses "$dir/$name.fp32.jsonl" | head -1)" 1)
    w=$(worst "$ref32" "$(losses "$dir/$name.fp32.jsonl")" "$S")
    within "$w1" 1e-6 && within "$w" 1e-3 && ok "$name fp32 vs torch fp32 (same weights and batches): step 1 $w1, worst $w" \
        || fail "$name fp32 vs torch fp32: step 1 $w1, worst $w"
done < "$FIX/autocast_ref.txt"

# 2. bf16 against dtrain's fp32 over 200 steps of text (clipped at 1, as GPT-2 trains: unclipped, this model
# spikes near step 120 in fp32 and in bf16 alike, and the two curves part after the spike)
small=(--layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --data "$dir/train.bin" --threads 1 --quiet)
for p in fp32 bf16; do
    "$DTRAIN" train "${small[@]}" --steps 200 --lr 1e-3 --grad-clip 1 --precision $p --metrics "$dir/long.$p.jsonl" 2> /dev/null
done
w=$(worst "$(losses "$dir/long.fp32.jsonl")" "$(losses "$dir/long.bf16.jsonl")" 200)
within "$w" 2e-2 && ok "bf16 vs fp32 over 200 steps: worst relative loss difference $w" || fail "bf16 vs fp32 over 200 steps: $w"
# a 16-bit run is not the f32 one by another name
awk "BEGIN{exit !($w > 0)}" && ok "bf16 differs from fp32 (it rounds): $w" || fail "bf16 gave fp32's losses exactly"

# 2b. The 16-bit copy is made once a step and kept for the step's other micro-batches; an evaluation after a step
# reads the updated weights: the validation loss at step 3 (2 micro-batches a step) is that of its saved weights
# evaluated alone (--steps 0)
"$DTRAIN" train "${small[@]}" --steps 3 --lr 1e-2 --precision bf16 --batch 2 --grad-accum 2 --val-data "$dir/train.bin" \
    --eval-every 3 --eval-batches 2 --metrics "$dir/ev.jsonl" --save "$dir/ev.bin" 2> "$dir/err" || fail "bf16 eval run: $(cat "$dir/err")"
v1=$(grep -o '"val_loss":[0-9.]*' "$dir/ev.jsonl" | tail -1 | cut -d: -f2)
v2=$("$DTRAIN" train "${small[@]}" --model "$dir/ev.bin" --steps 0 --precision bf16 --batch 2 --val-data "$dir/train.bin" \
    --eval-batches 2 2> "$dir/err" | grep -o 'validation loss [0-9.]*' | cut -d' ' -f3)
[ -n "$v1" ] && [ -n "$v2" ] && [ "$(printf '%.6f' "$v1")" = "$v2" ] \
    && ok "bf16, 2 micro-batches a step: the validation loss at step 3 ($v1) is its saved weights' ($v2)" \
    || fail "bf16 evaluation after a step: '$v1' in the run, '$v2' from its weights ($(head -3 "$dir/err"))"

# 3. Every strategy in bf16 and fp16 against one process with the global batch. The ranks round what one
# process with batch 2 x 2 accumulation steps rounds (each use's weight gradient, per micro-batch; a
# power-of-two scale commutes with rounding), but DDP adds the tied embedding's input rows after averaging the
# head's part, one f32 rounding apart from one process (fp32 runs differ by ~2.4e-7 from that), and a 16-bit
# rounding that an f32 ulp tips over moves a value by a whole 16-bit ulp (bf16 2^-8, fp16 2^-11): the bound is
# 1e-4 (bf16 gives ~5e-5, fp16 ~4e-6). The four strategies give each other's losses exactly.
for p in bf16 fp16; do
    "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision $p --batch 2 --grad-accum 2 --metrics "$dir/one.$p.jsonl" 2> /dev/null
    for s in ddp zero1 zero2 zero3; do
        "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision $p --batch 2 --nproc 2 --strategy $s \
            --metrics "$dir/$s.$p.jsonl" 2> "$dir/err" || fail "$s $p: $(cat "$dir/err")"
        w=$(worst "$(losses "$dir/one.$p.jsonl")" "$(losses "$dir/$s.$p.jsonl")" 20)
        within "$w" 1e-4 && ok "$p $s on 2 ranks x 2 vs 1 x 2 x 2 accumulation: worst relative loss difference $w" || fail "$p $s: $w"
        [ "$s" = ddp ] || { [ "$(losses "$dir/$s.$p.jsonl")" = "$(losses "$dir/ddp.$p.jsonl")" ] \
            && ok "$p $s: the same 20 losses as ddp, digit for digit" || fail "$p $s differs from ddp"; }
    done
done

# 3a. ZeRO-3 gathering unit by unit (each rank its own parameters): the 16-bit copy is made for each unit as it
# runs and given back after, never whole; the same losses as ddp, and the copy held at most is a unit's
for p in bf16 fp16; do
    DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision $p --batch 2 --nproc 2 --zero 3 \
        --metrics "$dir/z3own.$p.jsonl" 2> "$dir/err" || fail "zero3 own parameters $p: $(cat "$dir/err")"
    [ "$(losses "$dir/z3own.$p.jsonl")" = "$(losses "$dir/ddp.$p.jsonl")" ] \
        && ok "$p zero3 with each rank's own parameters (16-bit copy per unit): ddp's 20 losses, digit for digit" \
        || fail "$p zero3 with own parameters differs from ddp"
done
# 6 blocks of C=256 (4.8M parameters, 9.2 MiB in 16 bits): the parameters' column is the f32 shard and the copy
params_mib() { grep -o '^  rank 0: [0-9.]*' "$1" | awk '{print $NF}'; }
for p in fp32 bf16; do
    DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train --layers 6 --channels 256 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 2 \
        --data "$dir/train.bin" --threads 1 --steps 2 --nproc 2 --zero 3 --precision $p > "$dir/z3mem.$p.out" 2> "$dir/err" \
        || fail "zero3 memory $p: $(cat "$dir/err")"
done
p32=$(params_mib "$dir/z3mem.fp32.out") p16=$(params_mib "$dir/z3mem.bf16.out")
[ -n "$p32" ] && [ -n "$p16" ] && awk "BEGIN{exit !($p16 - $p32 <= 2.0 && $p16 >= $p32)}" \
    && ok "zero3 bf16: the 16-bit copy held at most is $(awk "BEGIN{print $p16 - $p32}") MiB of the whole model's 9.2 (a block's 1.5)" \
    || fail "zero3 bf16 holds the 16-bit copy whole: parameters $p16 MiB against fp32's $p32"

# 3a'. ZeRO-1 and 2 with each rank's own parameters keep the f32 master only in their shard: the 16-bit copy
# is allgathered after each update, and the f32 values the model reads (LayerNorms, embedding tables) are
# gathered from their owners as their unit runs, so the losses are ddp's, digit for digit
for p in bf16 fp16; do
    for z in 1 2; do
        DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision $p --batch 2 --nproc 2 --zero $z \
            --metrics "$dir/z${z}own.$p.jsonl" 2> "$dir/err" || fail "zero$z own parameters $p: $(cat "$dir/err")"
        [ "$(losses "$dir/z${z}own.$p.jsonl")" = "$(losses "$dir/ddp.$p.jsonl")" ] \
            && ok "$p zero$z with each rank's own parameters (f32 master in the shard only): ddp's 20 losses, digit for digit" \
            || fail "$p zero$z with own parameters differs from ddp"
    done
done
# resumed: each rank saved its slice of the parameters; the run goes on as the uninterrupted one
own=(--steps 8 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --zero 2)
DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train "${small[@]}" "${own[@]}" --save "$dir/ownfull" --metrics "$dir/ownfull.jsonl" 2> /dev/null
DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train "${small[@]}" "${own[@]}" --save "$dir/ownhalf" --stop-after 4 --metrics "$dir/owna.jsonl" 2> /dev/null
DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train "${small[@]}" "${own[@]}" --save "$dir/ownhalf" --resume "$dir/ownhalf" --metrics "$dir/ownb.jsonl" 2> /dev/null
[ -n "$(losses "$dir/ownfull.jsonl")" ] && [ "$(losses "$dir/ownfull.jsonl")" = "$(cat "$dir/owna.jsonl" "$dir/ownb.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)" ] \
    && cmp -s "$dir/ownfull/$(cat "$dir/ownfull/latest")/params.f32" "$dir/ownhalf/$(cat "$dir/ownhalf/latest")/params.f32" \
    && ok "bf16 zero2 with own parameters resumed at step 4: the uninterrupted run's losses and final weights" \
    || fail "bf16 zero2 with own parameters: the resumed run differs"

# 3b. 16-bit gradients on the wire (--grad-comm): half the bytes in every allreduce, the average rounded once
for g in fp32 bf16; do
    "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --grad-comm $g \
        --metrics "$dir/wire.$g.jsonl" --trace "$dir/wire.$g.json" --trace-steps 2:2 2> "$dir/err" || fail "--grad-comm $g: $(cat "$dir/err")"
done
bytes() { python3 -c "import json,sys; print(sum(e['args']['bytes'] for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('name') == 'allreduce' and e.get('ph') == 'B' and e.get('pid') == 0 and e['args'].get('bytes', 0) > 1024))" "$1"; }
b32=$(bytes "$dir/wire.fp32.json") b16=$(bytes "$dir/wire.bf16.json")
[ -n "$b32" ] && [ "$b32" -gt 0 ] && [ "$((2 * b16))" = "$b32" ] && ok "--grad-comm bf16: the gradients' allreduces move $b16 bytes a step, half of fp32's $b32" \
    || fail "allreduce bytes: fp32 $b32, bf16 $b16"
w=$(worst "$(losses "$dir/one.bf16.jsonl")" "$(losses "$dir/wire.bf16.jsonl")" 20)
within "$w" 1e-3 && ok "--grad-comm bf16 vs one bf16 process: worst relative loss difference $w" || fail "--grad-comm bf16: $w"
"$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --zero 1 --grad-comm bf16 \
    --metrics "$dir/wire1.jsonl" 2> /dev/null
[ "$(losses "$dir/wire1.jsonl")" = "$(losses "$dir/wire.bf16.jsonl")" ] && ok "--grad-comm bf16 under zero1: ddp's losses, digit for digit" \
    || fail "zero1 --grad-comm bf16 differs from ddp's"
# ZeRO-2 and 3 reduce each bucket to its shards' owners in 16 bits: half the bytes of their f32 reductions, and
# the average of the same two 16-bit values rounded once, so DDP's losses (digit for digit, or within 1e-5 where
# the sums are cut elsewhere)
rbytes() { python3 -c "import json,sys; print(sum(e['args']['bytes'] for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('name') == 'reduce' and e.get('ph') == 'B' and e.get('pid') == 0 and e['args'].get('bytes', 0) > 1024))" "$1"; }
for z in 2 3; do
    for g in fp32 bf16; do
        "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --zero $z --grad-comm $g \
            --metrics "$dir/wirez$z.$g.jsonl" --trace "$dir/wirez$z.$g.json" --trace-steps 2:2 2> "$dir/err" \
            || fail "--zero $z --grad-comm $g: $(cat "$dir/err")"
    done
    r32=$(rbytes "$dir/wirez$z.fp32.json") r16=$(rbytes "$dir/wirez$z.bf16.json")
    [ -n "$r32" ] && [ "$r32" -gt 0 ] && [ "$((2 * r16))" = "$r32" ] \
        && ok "--grad-comm bf16 --zero $z: the gradients' reductions move $r16 bytes a step, half of fp32's $r32" \
        || fail "--zero $z reduce bytes: fp32 $r32, bf16 $r16"
    w=$(worst "$(losses "$dir/wire.bf16.jsonl")" "$(losses "$dir/wirez$z.bf16.jsonl")" 20)
    within "$w" 1e-5 && ok "--grad-comm bf16 --zero $z vs ddp's: worst relative loss difference $w" || fail "--grad-comm bf16 --zero $z: $w"
done

# 3c. Memory: what forward keeps for backward is 16-bit under bf16 (each block's activations, its input and res2
# included, and the logits), so it is about half of fp32's; sizes, not timings
kept() { grep -o 'kept from forward for backward (rank 0): [0-9.]*' "$1" | awk '{print $NF}'; }
for p in fp32 bf16; do
    "$DTRAIN" train --layers 6 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 16 --attention blockwise \
        --data "$dir/train.bin" --threads 1 --steps 1 --precision $p > "$dir/mem.$p.out" 2> "$dir/err" || fail "memory $p: $(cat "$dir/err")"
done
k32=$(kept "$dir/mem.fp32.out") k16=$(kept "$dir/mem.bf16.out")
[ -n "$k32" ] && [ -n "$k16" ] && awk "BEGIN{exit !($k16 <= 0.55 * $k32 && $k16 > 0)}" \
    && ok "activations kept for backward: bf16 $k16 MiB, fp32 $k32 MiB ($(awk "BEGIN{printf \"%.3f\", $k16 / $k32}")x)" \
    || fail "activations kept for backward: bf16 '$k16' vs fp32 '$k32' MiB (want <= 0.55x)"

# MFU's peak is the GEMM the run multiplies with: a bf16 run on a bf16 GEMM (twice sgemm's rate) against that
# GEMM's rate, so it stays below 100% (against sgemm's, d6 read about 145%)
"$DTRAIN" train --model d6 --data "$dir/train.bin" --batch 4 --seq 64 --steps 3 --threads 1 --precision bf16 \
    --metrics "$dir/mfu.jsonl" > "$dir/mfu.out" 2> "$dir/err" || fail "d6 bf16 for MFU: $(cat "$dir/err")"
m=$(grep -o '"mfu":[0-9.]*' "$dir/mfu.jsonl" | tail -1 | cut -d: -f2)
[ -n "$m" ] && awk "BEGIN{exit !($m > 0 && $m <= 1)}" && ok "d6 bf16: MFU $m, $(grep -o 'MFU against [^;]*' "$dir/mfu.out")" \
    || fail "d6 bf16 MFU '$m' ($(grep -o 'MFU against [^;]*' "$dir/mfu.out"))"

# 3d. The 16-bit gradient store (--grad-store bf16): the averaged gradients are kept in bf16 until the update.
# Every strategy gives the others' losses digit for digit, with the bucket pool or without it (each bucket's f32
# pages punched out instead), and one process's within the bound of 3 (the rounding is --grad-comm's, plus one
# more of the embedding's rows, added in f32 and rounded once)
for s in ddp zero1 zero2 zero3; do
    "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --strategy $s --grad-store bf16 \
        --metrics "$dir/gs.$s.jsonl" 2> "$dir/err" || fail "--grad-store bf16 $s: $(cat "$dir/err")"
    [ "$s" = ddp ] || { [ "$(losses "$dir/gs.$s.jsonl")" = "$(losses "$dir/gs.ddp.jsonl")" ] \
        && ok "--grad-store bf16 $s: ddp's 20 losses, digit for digit" || fail "--grad-store bf16 $s differs from ddp"; }
done
w=$(worst "$(losses "$dir/one.bf16.jsonl")" "$(losses "$dir/gs.ddp.jsonl")" 20)
within "$w" 1e-4 && ok "--grad-store bf16 vs one bf16 process: worst relative loss difference $w" || fail "--grad-store bf16 vs one process: $w"
w=$(worst "$(losses "$dir/wire.bf16.jsonl")" "$(losses "$dir/gs.ddp.jsonl")" 20)
within "$w" 1e-4 && ok "--grad-store bf16 vs --grad-comm bf16 (f32 store): worst relative loss difference $w" || fail "--grad-store vs --grad-comm: $w"
for s in ddp zero2; do
    DTRAIN_ZERO_NO_POOL=1 "$DTRAIN" train "${small[@]}" --steps 20 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --strategy $s \
        --grad-store bf16 --metrics "$dir/gsnp.$s.jsonl" 2> "$dir/err" || fail "--grad-store bf16 $s without the pool: $(cat "$dir/err")"
    [ "$(losses "$dir/gsnp.$s.jsonl")" = "$(losses "$dir/gs.ddp.jsonl")" ] && ok "--grad-store bf16 $s without the bucket pool: the same losses" \
        || fail "--grad-store bf16 $s without the pool differs"
done
# a run resumed with the 16-bit store is the uninterrupted one (it holds nothing between steps)
gs=(--steps 8 --lr 1e-3 --precision bf16 --batch 2 --nproc 2 --strategy zero2 --grad-store bf16)
"$DTRAIN" train "${small[@]}" "${gs[@]}" --metrics "$dir/gsfull.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" "${gs[@]}" --save "$dir/gsck" --stop-after 4 --metrics "$dir/gsa.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" "${gs[@]}" --resume "$dir/gsck" --metrics "$dir/gsb.jsonl" 2> /dev/null
[ -n "$(losses "$dir/gsfull.jsonl")" ] && [ "$(losses "$dir/gsfull.jsonl")" = "$(cat "$dir/gsa.jsonl" "$dir/gsb.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)" ] \
    && ok "--grad-store bf16 zero2 resumed at step 4: the uninterrupted run's 8 losses" || fail "--grad-store resume differs"

# Model states on the mixed-precision formula (2 ranks, each rank's columns: parameters with the 16-bit copy,
# gradients, optimizer state; measured from resident pages): DDP 16 bytes a parameter (2 + 2 + 12), ZeRO-2
# 2 + 14/N, ZeRO-1 4 + 12/N (the whole averaged gradient, only the optimizer state sharded); an f32 store holds 4
states() { awk '/^  rank 0:/ {gsub(/,/, ""); print $3, $4, $5}' "$1"; }
psi() { grep -o '[0-9.]*M parameters' "$1" | awk '{print $1 * 1e6 / 1048576}'; }
for s in ddp zero1 zero2 zero3; do
    for g in fp32 bf16; do
        [ $s != ddp ] && [ $g = fp32 ] && continue
        "$DTRAIN" train --layers 6 --channels 256 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 2 --data "$dir/train.bin" \
            --threads 1 --steps 2 --nproc 2 --strategy $s --precision bf16 --grad-store $g > "$dir/st.$s.$g.out" 2> "$dir/err" \
            || fail "model states $s $g: $(cat "$dir/err")"
    done
done
P=$(psi "$dir/st.ddp.bf16.out")
read -r p g o <<< "$(states "$dir/st.ddp.fp32.out")"
awk "BEGIN{exit !($g >= 3.9 * $P)}" && ok "an f32 store: ddp holds $g MiB of gradients, 4 bytes a parameter" || fail "f32 store: $g MiB of grads for $P Mi parameters"
read -r p g o <<< "$(states "$dir/st.ddp.bf16.out")"
awk "BEGIN{t = $p + $g + $o; exit !(t <= 16.8 * $P && t >= 15.2 * $P && $g <= 2.1 * $P)}" \
    && ok "--grad-store bf16 ddp: $p + $g + $o MiB = $(awk "BEGIN{printf \"%.2f\", ($p + $g + $o) / $P}") bytes a parameter (16)" \
    || fail "--grad-store bf16 ddp: $p + $g + $o MiB for $P Mi parameters (want 16 bytes each, gradients 2)"
read -r p g o <<< "$(states "$dir/st.zero2.bf16.out")"
awk "BEGIN{t = $p + $g + $o; exit !(t <= 9.45 * $P && t >= 8.55 * $P)}" \
    && ok "--grad-store bf16 zero2: $p + $g + $o MiB = $(awk "BEGIN{printf \"%.2f\", ($p + $g + $o) / $P}") bytes a parameter (2 + 14/2 = 9)" \
    || fail "--grad-store bf16 zero2: $p + $g + $o MiB for $P Mi parameters (want 9 bytes each)"
read -r p g o <<< "$(states "$dir/st.zero1.bf16.out")"
awk "BEGIN{t = $p + $g + $o; exit !(t <= 10.5 * $P && t >= 9.5 * $P)}" \
    && ok "--grad-store bf16 zero1: $p + $g + $o MiB = $(awk "BEGIN{printf \"%.2f\", ($p + $g + $o) / $P}") bytes a parameter (4 + 12/2 = 10)" \
    || fail "--grad-store bf16 zero1: $p + $g + $o MiB for $P Mi parameters (want 10 bytes each)"

# accumulating, no step pools: the pool's pages never come, and its buffers are the f32 store's (the pool lent bucket 0
# as the store was set up, and those pages stayed: 311 MB of 124M's machine)
bufs() { awk '/^  rank 0:/ {gsub(/,/, ""); print $6}' "$1"; }
for g in fp32 bf16; do
    "$DTRAIN" train --layers 6 --channels 256 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 1 --grad-accum 2 --data "$dir/train.bin" \
        --threads 1 --steps 2 --nproc 2 --zero 1 --precision bf16 --grad-store $g > "$dir/acc.$g.out" 2> "$dir/err" \
        || fail "accumulating, --grad-store $g: $(cat "$dir/err")"
done
[ -n "$(bufs "$dir/acc.bf16.out")" ] && [ "$(bufs "$dir/acc.bf16.out")" = "$(bufs "$dir/acc.fp32.out")" ] \
    && ok "--grad-store bf16 accumulating: buffers $(bufs "$dir/acc.bf16.out") MiB, as the f32 store's (no pool pages)" \
    || fail "--grad-store bf16 accumulating: buffers $(bufs "$dir/acc.bf16.out") MiB against the f32 store's $(bufs "$dir/acc.fp32.out")"

# each rank's own parameters (as across machines): ZeRO-2's f32 master is its shard, so 2 + 14/2 again
DTRAIN_ZERO_PRIVATE_PARAMS=1 "$DTRAIN" train --layers 6 --channels 256 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 2 \
    --data "$dir/train.bin" --threads 1 --steps 2 --nproc 2 --zero 2 --precision bf16 --grad-store bf16 > "$dir/st.own2.out" 2> "$dir/err" \
    || fail "model states zero2 own parameters: $(cat "$dir/err")"
read -r p g o <<< "$(states "$dir/st.own2.out")"
awk "BEGIN{t = $p + $g + $o; exit !(t <= 9.45 * $P && t >= 8.55 * $P)}" \
    && ok "--grad-store bf16 zero2, each rank's own parameters: $p + $g + $o MiB = $(awk "BEGIN{printf \"%.2f\", ($p + $g + $o) / $P}") bytes a parameter (9)" \
    || fail "--grad-store bf16 zero2 own parameters: $p + $g + $o MiB for $P Mi parameters (want 9 bytes each)"

# ZeRO-3 on one machine (one shared f32 copy) makes the 16-bit copy unit by unit too, so its parameters are the
# f32 shard (4/2 bytes a parameter) and a unit's copy, not the whole 16-bit model (2 more)
read -r p g o <<< "$(states "$dir/st.zero3.bf16.out")"
awk "BEGIN{t = $p + $g + $o; exit !(t <= 8.4 * $P && $p <= 2.5 * $P)}" \
    && ok "--grad-store bf16 zero3: $p + $g + $o MiB = $(awk "BEGIN{printf \"%.2f\", ($p + $g + $o) / $P}") bytes a parameter (at most 16/2 = 8; parameters $(awk "BEGIN{printf \"%.2f\", $p / $P}"): the shard and a unit's 16-bit copy)" \
    || fail "--grad-store bf16 zero3: $p + $g + $o MiB for $P Mi parameters (want at most 8 bytes each, parameters at most 2.5)"

# 4. fp16 that overflows: a scale of 2^24 halves down on every rank alike, in DeepSpeed's words
echo '{"fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 4}}' > "$dir/f16.json"
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --batch 2 --nproc 2 --metrics "$dir/ov.jsonl" \
    > /dev/null 2> "$dir/ov.err" || fail "overflowing fp16 run: $(tail -3 "$dir/ov.err")"
r0=$(grep -o 'OVERFLOW! Rank 0 .*' "$dir/ov.err" | sed 's/Rank 0 //')
r1=$(grep -o 'OVERFLOW! Rank 1 .*' "$dir/ov.err" | sed 's/Rank 1 //')
n=$(echo "$r0" | grep -c 'Attempted loss scale')
skipped=$(grep -c '"skipped":true' "$dir/ov.jsonl")
[ "$n" -ge 3 ] && [ "$r0" = "$r1" ] && [ "$n" = "$skipped" ] \
    && ok "fp16 overflow: $n skipped steps, the same on both ranks: $(echo "$r0" | sed -n 2p)" \
    || fail "fp16 overflow: rank 0 said $n, rank 1 $(echo "$r1" | grep -c Attempted), metrics $skipped skipped"
grep -q 'reducing to 16777216\|reducing to 8388608' "$dir/ov.err" && grep -q '"loss_scale":131072' "$dir/ov.jsonl" \
    && ok "the scale halves from 2^24 and is in the metrics" || fail "scale: $(grep -o '"loss_scale":[0-9]*' "$dir/ov.jsonl" | tr '\n' ' ')"
# doubling after 4 clean steps
grep -o '"loss_scale":[0-9]*' "$dir/ov.jsonl" | cut -d: -f2 | awk 'NR>1 && $1==2*p {d=1} {p=$1} END{exit !d}' \
    && ok "the scale doubles after loss_scale_window clean steps" || fail "no doubling: $(grep -o '"loss_scale":[0-9]*' "$dir/ov.jsonl" | tr '\n' ' ')"

# a static scale (loss_scale > 0) never moves
echo '{"fp16": {"enabled": true, "loss_scale": 128}}' > "$dir/static.json"
"$DTRAIN" train "${small[@]}" --config "$dir/static.json" --steps 5 --lr 1e-3 --metrics "$dir/static.jsonl" 2> /dev/null
[ "$(grep -o '"loss_scale":[0-9]*' "$dir/static.jsonl" | sort -u)" = '"loss_scale":128' ] && [ "$(grep -c loss_scale "$dir/static.jsonl")" = 5 ] \
    && ok "a static loss scale of 128 stays 128" || fail "static scale: $(grep -o '"loss_scale":[0-9]*' "$dir/static.jsonl" | tr '\n' ' ')"

# 5. Resumed fp16 runs are the uninterrupted one, scaler included
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --save "$dir/full" --metrics "$dir/full.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --save "$dir/half" --stop-after 12 \
    --metrics "$dir/a.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --save "$dir/half" --resume "$dir/half" \
    --metrics "$dir/b.jsonl" 2> /dev/null
pick() { grep -o '"loss":[0-9.]*\|"loss_scale":[0-9.]*\|skipped' "$@" | tr '\n' ' '; }
[ "$(pick "$dir/full.jsonl")" = "$(cat "$dir/a.jsonl" "$dir/b.jsonl" | pick)" ] \
    && cmp -s "$dir/full/latest" "$dir/half/latest" && cmp -s "$dir/full/$(cat "$dir/full/latest")/params.f32" "$dir/half/$(cat "$dir/half/latest")/params.f32" \
    && ok "fp16 resumed at step 12: losses, scales, skips and final weights identical (at 24: $(grep -o '"scale":[[:space:]]*[0-9.e+]*' "$dir/half/$(cat "$dir/half/latest")/manifest.json" | tr -d '[:space:]'))" \
    || fail "fp16 resume differs: $(pick "$dir/full.jsonl") | $(cat "$dir/a.jsonl" "$dir/b.jsonl" | pick)"

# the same on 2 ranks: rank 0 reads the scaler and the other ranks get it
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --batch 2 --nproc 2 --metrics "$dir/full2.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --batch 2 --nproc 2 --save "$dir/half2" --stop-after 12 \
    --metrics "$dir/a2.jsonl" 2> /dev/null
"$DTRAIN" train "${small[@]}" --config "$dir/f16.json" --steps 24 --lr 1e-3 --batch 2 --nproc 2 --resume "$dir/half2" \
    --metrics "$dir/b2.jsonl" 2> "$dir/b2.err"
[ "$(pick "$dir/full2.jsonl")" = "$(cat "$dir/a2.jsonl" "$dir/b2.jsonl" | pick)" ] && [ "$(grep -c OVERFLOW "$dir/b2.err")" -ge 2 ] \
    && ok "fp16 on 2 ranks resumed at step 12: losses, scales and skips identical (both ranks skip after the resume too)" \
    || fail "2-rank fp16 resume differs: $(pick "$dir/full2.jsonl") | $(cat "$dir/a2.jsonl" "$dir/b2.jsonl" | pick)"
"$DTRAIN" ckpt info "$dir/half" | grep -q '^precision: fp16 (loss scale [0-9]* after 24 steps)$' \
    && ok "ckpt info: $("$DTRAIN" ckpt info "$dir/half" | grep '^precision')" || fail "ckpt info: $("$DTRAIN" ckpt info "$dir/half" | head -5)"

# 6. A NaN is not an overflow: the scale reaches its floor and the run stops naming the step
"$DTRAIN" train "${small[@]}" --steps 1 --save "$dir/good.bin" > /dev/null 2>&1
python3 - "$dir/good.bin" "$dir/nan.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[-4:] = struct.pack("<f", float("nan"))  # ln_f.bias[C-1]
open(sys.argv[2], "wb").write(b)
PY
"$DTRAIN" train "${small[@]}" --model "$dir/nan.bin" --steps 100 --precision fp16 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q "step 18: the gradients overflowed at the minimum loss scale 1" "$dir/err" \
    && ok "NaN under fp16 stops at the floor: $(grep 'step 18' "$dir/err" | head -c 120)" || fail "NaN under fp16: exit $rc, $(tail -2 "$dir/err")"

# 7. Bad settings
"$DTRAIN" train "${small[@]}" --precision fp8 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- '--precision fp8 is not valid: expected fp32, bf16 or fp16' "$dir/err" && ok "--precision fp8 refused" \
    || fail "--precision fp8: exit $rc, $(cat "$dir/err")"
echo '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}' > "$dir/both.json"
"$DTRAIN" train "${small[@]}" --config "$dir/both.json" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q '"fp16.enabled" and "bf16.enabled" are both true' "$dir/err" && ok "fp16 and bf16 both enabled refused" \
    || fail "both enabled: exit $rc, $(cat "$dir/err")"
"$DTRAIN" train --model mlp --precision bf16 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'image models train in fp32 only' "$dir/err" && ok "--precision with the MLP refused" || fail "mlp bf16: exit $rc, $(cat "$dir/err")"
for bad in "--precision fp32 --grad-store bf16|--grad-store bf16 needs --precision bf16" \
           "--precision bf16 --grad-store bf16 --nproc 2 --optimizer lamb|--grad-store bf16 takes --optimizer sgd or adamw" \
           "--precision bf16 --grad-store bf16 --nproc 2 --grad-comm fp16|--grad-comm fp16 with --grad-store bf16"; do
    # shellcheck disable=SC2086
    "$DTRAIN" train "${small[@]}" --steps 2 ${bad%%|*} > /dev/null 2> "$dir/err"; rc=$?
    [ $rc -eq 2 ] && grep -q -- "${bad#*|}" "$dir/err" && ok "${bad%%|*}: refused ($(grep -m1 -o 'error: .*' "$dir/err" | head -c 90))" \
        || fail "${bad%%|*}: exit $rc, $(cat "$dir/err")"
done
# one process has no reduction: --grad-store is said to do nothing there, as --grad-comm is
"$DTRAIN" train "${small[@]:0:$((${#small[@]} - 1))}" --steps 2 --precision bf16 --grad-store bf16 > "$dir/one.out" 2> "$dir/err"; rc=$?
[ $rc -eq 0 ] && grep -q 'grad-store bf16 does nothing on one rank' "$dir/err" && grep -q 'averaged gradients in f32' "$dir/one.out" \
    && ok "--grad-store bf16 on one rank: $(grep -o 'does nothing.*' "$dir/err")" || fail "--grad-store on one rank: exit $rc, $(cat "$dir/err")"
# DeepSpeed's data_types.grad_accum_dtype is --grad-store
echo '{"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}}' > "$dir/gacc.json"
"$DTRAIN" train "${small[@]:0:$((${#small[@]} - 1))}" --config "$dir/gacc.json" --steps 2 --nproc 2 > "$dir/gacc.out" 2> "$dir/err"
grep -q 'averaged gradients in 16 bits (--grad-store)' "$dir/gacc.out" && ok "data_types.grad_accum_dtype bf16 keeps the gradients in bf16" \
    || fail "data_types.grad_accum_dtype: $(cat "$dir/err" "$dir/gacc.out" | head -5)"
echo '{"data_types": {"grad_accum_dtype": "fp8"}}' > "$dir/gacc.json"
"$DTRAIN" train "${small[@]}" --config "$dir/gacc.json" --steps 2 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q '"data_types.grad_accum_dtype" must be' "$dir/err" && ok "grad_accum_dtype fp8 refused, naming the key" \
    || fail "grad_accum_dtype fp8: exit $rc, $(cat "$dir/err")"
echo "mixed precision: $passed passed, $failed failed"
[ $failed -eq 0 ]
