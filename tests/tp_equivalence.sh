#!/bin/bash
# Tensor parallelism gives the losses (and gradient norms) of one process
# with the global batch, over 20 AdamW steps, within 1e-6 relative: TP 2 and
# TP 3 (6 heads), sequence parallelism, DP 2 x TP 2 on 4 ranks with DDP and with ZeRO-1, -2 and -3
# (and bf16/fp16 against one process in the same precision, within 1e-4: see there)
# on the DP axis, gradient accumulation, clipping (which needs the norm over
# the slices), recomputation, GPT-2's vocabulary 50257 and a byte-level 257
# (padded to 320: TP 3's last rank holds fewer rows), and DP 2 x TP 2 under
# mpirun on 2 pseudo-nodes (the placement keeps each TP group on one node).
# Bad layouts are refused before any work, naming the numbers.
# usage: tp_equivalence.sh DTRAIN [MPIEXEC]
set -u
DTRAIN=$1
MPIEXEC=${2:-}
. "$(dirname "$0")/checks.sh"
gpl_tokens
common=(--data "$dir/train.bin" --layers 2 --channels 48 --heads 6 --max-seq 64 --seq 64 --steps 20 --lr 1e-3 --threads 1 --quiet)
compare() { # WHAT REF FILE [LOSS_TOL NORM_TOL]
    local l n tl=${4:-1e-6} tn=${5:-1e-5}
    l=$(worst loss "$2" "$3") n=$(worst grad_norm "$2" "$3")
    if [ "$l" != missing ] && [ "$n" != missing ] && awk "BEGIN{exit !($l <= $tl && $n <= $tn)}"; then
        passed=$((passed + 1)); echo "ok   $1: worst relative difference over 20 steps: loss $l, gradient norm $n"
    else
        failed=$((failed + 1)); echo "FAIL $1: loss $l, norm $n"
    fi
}
run() { # NAME ARGS...: one training run into $dir/NAME.jsonl
    local name=$1
    shift
    "$DTRAIN" train "${common[@]}" "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
        { echo "  ($name: $(grep -v oversubscribed "$dir/$name.out" | tail -2))"; }
}

for vocab in 256 50257; do
    run ref --vocab $vocab --batch 4
    run tp2 --vocab $vocab --batch 4 --nproc 2 --tp 2 && compare "V $vocab: TP 2" "$dir/ref.jsonl" "$dir/tp2.jsonl"
    run tp3 --vocab $vocab --batch 4 --nproc 3 --tp 3 && compare "V $vocab: TP 3" "$dir/ref.jsonl" "$dir/tp3.jsonl"
done
run ref --vocab 257 --batch 4
run tp3 --vocab 257 --batch 4 --nproc 3 --tp 3 && compare "V 257 (padded 320, uneven rows): TP 3" "$dir/ref.jsonl" "$dir/tp3.jsonl"

run ref --vocab 256 --batch 4
for s in ddp zero1 zero2 zero3; do
    run dp2tp2 --vocab 256 --batch 2 --nproc 4 --tp 2 --strategy $s && compare "DP 2 x TP 2, $s" "$dir/ref.jsonl" "$dir/dp2tp2.jsonl"
done
# GPT-2's vocabulary makes a rank's gradients more than DDP's first bucket: wte's slice must wait for the
# embedding's rows before it is reduced (the tied rows are not deferred for a vocabulary slice)
run ref --vocab 50257 --batch 4
for s in ddp zero3; do
    run dp2tp2 --vocab 50257 --batch 2 --nproc 4 --tp 2 --strategy $s &&
        compare "V 50257, several buckets: DP 2 x TP 2, $s" "$dir/ref.jsonl" "$dir/dp2tp2.jsonl"
done
run ref --vocab 256 --batch 4
run sp2 --vocab 256 --batch 4 --nproc 2 --tp 2 --sp && compare "TP 2, sequence parallel" "$dir/ref.jsonl" "$dir/sp2.jsonl"
run sp4 --vocab 256 --batch 2 --nproc 4 --tp 2 --sp --strategy zero1 --recompute &&
    compare "DP 2 x TP 2, sequence parallel, ZeRO-1, recomputing" "$dir/ref.jsonl" "$dir/sp4.jsonl"
# mixed precision against one process in the same precision. A Linear's sum over the group and one process's
# over the whole row differ in f32's last bits; where that straddles a 16-bit rounding boundary the value moves by
# a 16-bit step, and the trajectories part as DDP's do against one process (mixed_precision.sh: 1e-4)
for prec in bf16 fp16; do
    run ref16 --vocab 256 --batch 4 --precision $prec
    run tp16 --vocab 256 --batch 4 --nproc 2 --tp 2 --precision $prec &&
        compare "$prec: TP 2" "$dir/ref16.jsonl" "$dir/tp16.jsonl" 1e-4 1e-3
done
run ref16 --vocab 50257 --batch 4 --precision bf16
run tp16 --vocab 50257 --batch 2 --nproc 4 --tp 2 --sp --strategy zero1 --precision bf16 &&
    compare "bf16, V 50257: DP 2 x TP 2, sequence parallel, ZeRO-1" "$dir/ref16.jsonl" "$dir/tp16.jsonl" 1e-4 1e-3
# the 16-bit gradient store (--grad-store bf16) with TP: the same layout's f32 store with bf16 reductions, to the
# digit (clipped: the norm over the slices reads the 16-bit store); V 50257 for several buckets and wte's slices
for s in ddp zero2; do
    run gc --vocab 50257 --batch 2 --nproc 4 --tp 2 --strategy $s --precision bf16 --grad-clip 0.5 --grad-comm bf16
    run gs --vocab 50257 --batch 2 --nproc 4 --tp 2 --strategy $s --precision bf16 --grad-clip 0.5 --grad-store bf16 &&
        compare "--grad-store bf16, V 50257: DP 2 x TP 2, $s (against its f32 store with --grad-comm bf16)" "$dir/gc.jsonl" "$dir/gs.jsonl" 0 0
done
run acc --vocab 256 --batch 2 --grad-accum 2 --nproc 2 --tp 2 && compare "TP 2, batch 2 x 2 accumulation" "$dir/ref.jsonl" "$dir/acc.jsonl"
run recompute --vocab 256 --batch 4 --nproc 2 --tp 2 --recompute && compare "TP 2, recomputing" "$dir/ref.jsonl" "$dir/recompute.jsonl"
run clip1 --vocab 256 --batch 4 --grad-clip 0.5
run clip2 --vocab 256 --batch 2 --nproc 4 --tp 2 --strategy zero1 --grad-clip 0.5 &&
    compare "DP 2 x TP 2, ZeRO-1, clipped at 0.5" "$dir/clip1.jsonl" "$dir/clip2.jsonl"

if [ -n "$MPIEXEC" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=2 \
        "$MPIEXEC" --oversubscribe -np 4 "$DTRAIN" train "${common[@]:0:${#common[@]}-1}" --vocab 256 --batch 2 --tp 2 \
        --metrics "$dir/mpi.jsonl" > "$dir/mpi.out" 2>&1
    compare "mpirun, 2 pseudo-nodes, DP 2 x TP 2" "$dir/ref.jsonl" "$dir/mpi.jsonl"
    place=$(grep -o "mesh pp 1 x dp 2 x tp 2.*" "$dir/mpi.out")
    if [ "$place" = "mesh pp 1 x dp 2 x tp 2 (tp innermost): rank (pp, dp, tp) node: 0 (0, 0, 0) 0, 1 (0, 0, 1) 0, 2 (0, 1, 0) 1, 3 (0, 1, 1) 1" ] &&
        ! grep -q "spans machines" "$dir/mpi.out"; then
        passed=$((passed + 1)); echo "ok   placement: $place"
    else
        failed=$((failed + 1)); echo "FAIL placement: '$place' $(grep spans "$dir/mpi.out")"
    fi
fi

# checkpoints: a TP layout writes its slices into the whole model's files, and any layout goes on from any other's:
# TP 2 -> one process -> DP 2 with ZeRO-1 -> TP 2, 5 steps each, give one process's 20 losses
ck="$dir/ck"
mkdir -p "$ck"
run ref --vocab 256 --batch 4 --save "$ck/ref"
run c1 --vocab 256 --batch 4 --nproc 2 --tp 2 --steps 5 --save "$ck/a" &&
run c2 --vocab 256 --batch 4 --steps 10 --resume "$ck/a" --save "$ck/b" &&
run c3 --vocab 256 --batch 2 --nproc 2 --strategy zero1 --steps 15 --resume "$ck/b" --save "$ck/c" &&
run c4 --vocab 256 --batch 4 --nproc 2 --tp 2 --steps 20 --resume "$ck/c" --save "$ck/d"
cat "$dir"/c[1-4].jsonl > "$dir/chain.jsonl"
compare "resharded TP 2 -> 1 process -> DP 2 ZeRO-1 -> TP 2" "$dir/ref.jsonl" "$dir/chain.jsonl"
# DP 2 x TP 2 with ZeRO-3 (parameters in slices of slices) -> DP 2 x TP 2 with ZeRO-1
run z3 --vocab 256 --batch 2 --nproc 4 --tp 2 --strategy zero3 --steps 10 --save "$ck/e" &&
run z1 --vocab 256 --batch 2 --nproc 4 --tp 2 --strategy zero1 --steps 20 --resume "$ck/e" --save "$ck/f"
cat "$dir/z3.jsonl" "$dir/z1.jsonl" > "$dir/chain2.jsonl"
compare "DP 2 x TP 2 ZeRO-3 saved, ZeRO-1 resumed" "$dir/ref.jsonl" "$dir/chain2.jsonl"
# export: the TP-saved checkpoint's weights are the one process's, to rounding that 20 AdamW steps amplify (weights
# up to ~1; DDP's 2 ranks against one process, measured the same way: 4e-5)
"$DTRAIN" ckpt export "$ck/d" "$dir/tp.bin" > /dev/null && "$DTRAIN" ckpt export "$ck/ref" "$dir/one.bin" > /dev/null
diff=$(python3 -c "
import array, sys
a, b = array.array('f'), array.array('f')
a.frombytes(open(sys.argv[1], 'rb').read()); b.frombytes(open(sys.argv[2], 'rb').read())
print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else 'sizes differ')" "$dir/tp.bin" "$dir/one.bin")
if awk "BEGIN{exit !(\"$diff\" + 0 <= 1e-4)}" 2> /dev/null && [ "$diff" != "sizes differ" ]; then
    passed=$((passed + 1)); echo "ok   ckpt export of the TP 2 checkpoint: largest weight difference from one process's $diff"
else
    failed=$((failed + 1)); echo "FAIL ckpt export: $diff"
fi
# a damaged slice: named by the file and the floats whose hash is wrong, nothing trained
flip "$ck/f/step-00000020/params.f32" $((4 * 30000)) 4
out=$("$DTRAIN" train "${common[@]}" --vocab 256 --batch 2 --nproc 4 --tp 2 --steps 25 --resume "$ck/f" 2>&1)
if echo "$out" | grep -q "params.f32: floats \[18000, 36000) hash to" && ! echo "$out" | grep -q '^step'; then
    passed=$((passed + 1)); echo "ok   a damaged slice: $(echo "$out" | grep -m1 'hash to')"
else
    failed=$((failed + 1)); echo "FAIL damaged slice: $(echo "$out" | tail -3)"
fi

# bad layouts: refused before any work, naming the numbers
refused() { # WHAT EXPECTED ARGS...
    local what=$1 want=$2
    shift 2
    local out
    out=$("$DTRAIN" train "${common[@]}" --vocab 256 --batch 2 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^step"; then
        passed=$((passed + 1)); echo "ok   $what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else
        failed=$((failed + 1)); echo "FAIL $what: $(echo "$out" | tail -2)"
    fi
}
refused "--tp 4 over 6 heads" "--tp 4 does not divide the 6 attention heads" --nproc 4 --tp 4
refused "--tp 3 on 4 ranks" "--tp 3 x --pp 1 = 3 does not divide the job's 4 ranks" --nproc 4 --tp 3
refused "--dp 3 --tp 2 on 4 ranks" "--dp 3 x --tp 2 x --pp 1 = 6, but the job has 4 ranks" --nproc 4 --dp 3 --tp 2
refused "--sp with --seq 64 over 3 ranks" "--sp: --seq 64 does not split into --tp 3 parts" --nproc 3 --tp 3 --sp
refused "--sp without --tp" "--sp splits the sequence over the tensor-parallel ranks" --sp
refused "--tp 2 on an image model" "--tp 2: not with an image model" --model mlp --nproc 2 --tp 2
# a rank killed in the middle of a layer: the other names it and the collective it was in (or, when
# the death is seen between two collectives, the one it last finished), within a second
# (after the first step, however long a busy machine takes to start the ranks)
"$DTRAIN" train "${common[@]}" --vocab 256 --batch 4 --nproc 2 --tp 2 --steps 1000000 --metrics "$dir/kill.jsonl" > /dev/null 2> "$dir/kill.err" &
launcher=$!
for ((i = 0; i < 1200; i++)); do [ -s "$dir/kill.jsonl" ] && break; sleep 0.05; done
sleep 0.5
victim=""
for p in $(pgrep -P $launcher); do grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2> /dev/null && victim=$p; done
if [ -z "$victim" ]; then
    failed=$((failed + 1)); echo "FAIL rank 1 of the TP job not found"; kill $launcher
else
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait $launcher
    secs=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
    said=$(grep -m1 "rank 0\] error" "$dir/kill.err")
    if awk "BEGIN{exit !($secs < 1.0)}" && echo "$said" | grep -q "rank 1 (pid $victim) \(was killed by signal 9\|died\)" &&
        echo "$said" | grep -q "\(in\|after\) allreduce #"; then
        passed=$((passed + 1)); echo "ok   a TP rank killed: the job ended after $secs s; $said"
    else
        failed=$((failed + 1)); echo "FAIL killed TP rank: $secs s; $(cat "$dir/kill.err")"
    fi
fi
echo "tp: $passed passed, $failed failed"
[ $failed -eq 0 ]
