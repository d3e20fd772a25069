#!/bin/bash
# ZeRO stages 1, 2 and 3 give the losses of one process with the global
# batch, over 20 steps within 1e-5 relative: 2 ranks x batch 2 and 4 x 1
# against 1 x 4, 3 ranks x 1 (shards of unequal size) against 1 x 3; AdamW,
# SGD with momentum, clipping (the global norm across shards), gradient
# accumulation, --recompute; the MLP; under mpirun with 2 pseudo-nodes. Each rank's optimizer state is
# its shard's (half of DDP's on 2 ranks). Sharded checkpoints resume byte for
# byte on their layout and continue the losses on others; damaged ones are
# named. LAMB and LARS on shards that cut tensors.
# usage: zero_equivalence.sh DTRAIN PSEUDO_NODES [MPIEXEC]
set -u
DTRAIN=$1
NODES=$2
MPIEXEC=${3:-}
. "$(dirname "$0")/checks.sh"
gpl_tokens
common=(--data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --steps 20
        --lr 1e-3 --threads 1 --quiet)
losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2; }
compare() { # what file reference [steps [tolerance]]
    local n=${4:-20} tol=${5:-1e-5} worst
    worst=$(paste <(losses "$3") <(losses "$2") |
            awk -v want="$n" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=want) print "missing"; else print w}')
    if [ "$worst" != missing ] && awk "BEGIN{exit !($worst <= $tol)}"; then ok "$1: worst relative loss difference $worst over $n"
    else fail "$1: worst relative loss difference $worst"; fi
}
run() { # name flags... : a run whose metrics go to $dir/name.jsonl
    local name=$1
    shift
    "$DTRAIN" train "${common[@]}" "$@" --metrics "$dir/$name.jsonl" 2> "$dir/$name.err" || fail "$name: $(tail -2 "$dir/$name.err")"
}
run ref --batch 4
run ref3 --batch 3
for z in 1 2 3; do
    run z$z-2 --nproc 2 --batch 2 --zero $z && compare "zero$z, 2 ranks x batch 2" "$dir/z$z-2.jsonl" "$dir/ref.jsonl"
    run z$z-3 --nproc 3 --batch 1 --zero $z && compare "zero$z, 3 ranks x batch 1 (unequal shards)" "$dir/z$z-3.jsonl" "$dir/ref3.jsonl"
    run z$z-4 --nproc 4 --batch 1 --zero $z && compare "zero$z, 4 ranks x batch 1" "$dir/z$z-4.jsonl" "$dir/ref.jsonl"
done
# each rank with its own copy of the parameters (what ranks on several machines do; on one machine they share one):
# stages 1 and 2 allgather the updated shards, stage 3 gathers each unit's tensors before its forward and backward
for z in 1 2 3; do
    DTRAIN_ZERO_PRIVATE_PARAMS=1 run p$z-3 --nproc 3 --batch 1 --zero $z &&
        compare "zero$z, own copies, 3 ranks x batch 1" "$dir/p$z-3.jsonl" "$dir/ref3.jsonl"
    DTRAIN_ZERO_PRIVATE_PARAMS=1 run pa$z --nproc 2 --batch 1 --grad-accum 2 --recompute --zero $z &&
        compare "zero$z, own copies, 2 ranks x 1 x 2 accumulation, --recompute" "$dir/pa$z.jsonl" "$dir/ref.jsonl"
done
DTRAIN_ZERO_PRIVATE_PARAMS=1 run pl3 --optimizer lamb --weight-decay 0.01 --batch 1 --nproc 3 --zero 3 --grad-clip 0.5 &&
    run pl1 --optimizer lamb --weight-decay 0.01 --batch 3 --grad-clip 0.5 &&
    compare "zero3, own copies, LAMB clipped, 3 ranks" "$dir/pl3.jsonl" "$dir/pl1.jsonl"
# shards larger than the parameters' allgather piece (4M floats): 10.7M parameters, 2 pieces per shard
big=(--layers 6 --channels 384 --heads 6 --steps 3)
run big1 "${big[@]}" --batch 4
run big2 "${big[@]}" --nproc 2 --batch 2 --zero 1 && compare "zero1 on 10.7M parameters (shards gathered in pieces)" "$dir/big2.jsonl" "$dir/big1.jsonl" 3
DTRAIN_ZERO_PRIVATE_PARAMS=1 run big3 "${big[@]}" --nproc 2 --batch 2 --zero 3 &&
    compare "zero3, own copies, on 10.7M parameters (tensors larger than pages)" "$dir/big3.jsonl" "$dir/big1.jsonl" 3
# the shard updated inside backward (the default, as DDP) and after it: the same bits
for z in 1 2 3; do
    DTRAIN_DDP_WAIT_IN_BACKWARD=1 run early$z --nproc 2 --batch 2 --zero $z --bucket-mb 0.016
    run late$z --nproc 2 --batch 2 --zero $z --bucket-mb 0.016 --step-at-end
    [ -s "$dir/early$z.jsonl" ] && [ "$(losses "$dir/early$z.jsonl")" = "$(losses "$dir/late$z.jsonl")" ] \
        && ok "zero$z: the shard updated inside backward gives the losses of the update after it, exactly" || fail "zero$z inside/after backward differ"
    early=$(grep -o '"updated_in_backward":[0-9.]*' "$dir/early$z.jsonl" | cut -d: -f2 | sort -n | head -1)
    awk "BEGIN{exit !(${early:-0} >= 0.5)}" && ok "zero$z: at least $early of each shard updated inside backward" \
        || fail "zero$z: at most ${early:-none} of the shard updated inside backward"
done
sgd=(--optimizer sgd --momentum 0.9 --lr 0.05)
run sgd1 "${sgd[@]}" --batch 4
run clip1b --grad-clip 0.5 --batch 3
for z in 1 2 3; do
    run sgd2-$z "${sgd[@]}" --nproc 2 --batch 2 --zero $z && compare "zero$z SGD momentum, 2 ranks" "$dir/sgd2-$z.jsonl" "$dir/sgd1.jsonl"
    run clip3-$z --grad-clip 0.5 --nproc 3 --batch 1 --zero $z && \
        compare "zero$z clipped at 0.5 (the global norm over 3 shards)" "$dir/clip3-$z.jsonl" "$dir/clip1b.jsonl"
done
grep -q '"grad_norm":0.4\|"grad_norm":0.5\|"grad_norm":[1-9]' "$dir/clip1b.jsonl" && ok "the clipped runs' norms reach the clip" \
    || fail "the clipping runs never clip: $(grep -o '"grad_norm":[0-9.]*' "$dir/clip1b.jsonl" | head -3)"
# LAMB and LARS: a shard cuts tensors, whose trust ratios must still come from the whole tensors' norms
for opt in lamb lars; do
    lr=1e-3; [ $opt = lars ] && lr="1 --trust-coef 0.02"
    run ${opt}1 --optimizer $opt --lr $lr --weight-decay 0.01 --batch 3
    for z in 1 2 3; do
        run ${opt}3-$z --optimizer $opt --lr $lr --weight-decay 0.01 --nproc 3 --batch 1 --zero $z &&
            compare "zero$z $opt, 3 ranks (shards cut tensors)" "$dir/${opt}3-$z.jsonl" "$dir/${opt}1.jsonl"
    done
done
for z in 1 2 3; do
    run acc$z --nproc 2 --batch 1 --grad-accum 2 --zero $z && compare "zero$z, 2 ranks x batch 1 x 2 accumulation" "$dir/acc$z.jsonl" "$dir/ref.jsonl"
    run rec$z --nproc 2 --batch 2 --recompute --zero $z && compare "zero$z with --recompute, 2 ranks" "$dir/rec$z.jsonl" "$dir/ref.jsonl"
done

# the optimizer state per rank: its shard's
loud=()
for a in "${common[@]}"; do [ "$a" = --quiet ] || loud+=("$a"); done
state() { grep -o 'optimizer state [0-9.]* MiB' "$1" | grep -o '[0-9.]*'; }
"$DTRAIN" train "${loud[@]}" --nproc 2 --batch 2 --steps 2 > "$dir/ddp.out" 2>&1
"$DTRAIN" train "${loud[@]}" --nproc 2 --batch 2 --steps 2 --zero 1 > "$dir/z.out" 2>&1
d=$(state "$dir/ddp.out"); z=$(state "$dir/z.out")
awk "BEGIN{exit !(${z:-0} > 0 && ${d:-0} > 0 && (${z:-0} * 2 - ${d:-0}) ^ 2 < 0.01)}" \
    && ok "optimizer state per rank: DDP $d MiB, zero1 on 2 ranks $z MiB" || fail "optimizer state: DDP '$d', zero1 '$z'"
grep -q "weights identical on all 2 ranks" "$dir/z.out" && ok "zero1: $(grep -o 'weights identical.*' "$dir/z.out")" \
    || fail "zero1 replica check: $(tail -3 "$dir/z.out")"
# What a rank holds, measured (the pages the system keeps), on 10.7M parameters (41 MiB a store),
# against DDP's whole stores, within 5%: stage 2's gradients and stage 3's gradients and
# parameters are half on 2 ranks; on one machine stages 1-3 keep one shared copy of the
# parameters, a rank's share of it half; with their own copies, stages 1 and 2 hold it whole
held() { grep -o "rank $2: [0-9.]*, [0-9.]*" "$1" | sed 's/.*: //; s/,//'; } # file rank -> "params grads"
"$DTRAIN" train "${loud[@]}" "${big[@]}" --steps 2 --nproc 2 --batch 2 > "$dir/bigd.out" 2>&1
read -r dp dg <<< "$(held "$dir/bigd.out" 0)"
for mode in shared own; do
    for z in 1 2 3; do
        env=(); [ $mode = own ] && env=(DTRAIN_ZERO_PRIVATE_PARAMS=1)
        env "${env[@]}" "$DTRAIN" train "${loud[@]}" "${big[@]}" --steps 2 --nproc 2 --batch 2 --zero $z > "$dir/big$z.out" 2>&1
        want_p=0.5; [ $mode = own ] && [ $z -lt 3 ] && want_p=1
        want_g=0.5; [ $z = 1 ] && want_g=1
        for rk in 0 1; do
            read -r zp zg <<< "$(held "$dir/big$z.out" $rk)"
            awk "BEGIN{g=${zg:-0}/(${dg:-1}*$want_g); p=${zp:-0}/(${dp:-1}*$want_p); exit !(g > 0.95 && g < 1.05 && p > 0.95 && p < 1.05)}" \
                && ok "zero$z ($mode parameters) rank $rk holds parameters $zp MiB, gradients $zg MiB (DDP: $dp, $dg)" \
                || fail "zero$z ($mode) rank $rk holds parameters '$zp', gradients '$zg' MiB (DDP: '$dp', '$dg'): $(tail -3 "$dir/big$z.out")"
        done
    done
done

# Stages 2 and 3 lend each bucket's pages outside the shard from a small pool instead of faulting in
# fresh ones every step: the same bits as without it (DTRAIN_ZERO_NO_POOL=1), with small buckets that
# wrap around the pool; and the pool is there, counted with the communication buffers
buffers() { grep -o "rank $2: [0-9.]*, [0-9.]*, [0-9.]*, [0-9.]*" "$1" | sed 's/.*, //'; } # file rank -> MiB
for z in 2 3; do
    run pool$z --nproc 3 --batch 1 --zero $z --bucket-mb 0.016
    DTRAIN_ZERO_NO_POOL=1 run nopool$z --nproc 3 --batch 1 --zero $z --bucket-mb 0.016
    [ -s "$dir/pool$z.jsonl" ] && [ "$(losses "$dir/pool$z.jsonl")" = "$(losses "$dir/nopool$z.jsonl")" ] \
        && ok "zero$z: buckets in the pool's pages give the losses of fresh pages, exactly" || fail "zero$z: pooled and fresh pages differ"
    DTRAIN_ZERO_NO_POOL=1 "$DTRAIN" train "${loud[@]}" "${big[@]}" --steps 2 --nproc 2 --batch 2 --zero $z > "$dir/nopool$z.out" 2>&1
    b1=$(buffers "$dir/big$z.out" 1); b0=$(buffers "$dir/nopool$z.out" 1)
    awk "BEGIN{exit !(${b1:-0} > ${b0:-0} + 1)}" && ok "zero$z rank 1's buffers: $b1 MiB with the pool, $b0 MiB without" \
        || fail "zero$z: buffers '$b1' MiB with the pool, '$b0' without"
done

# the MLP on the same engine
. "$(dirname "$0")/tiny_images.sh"
tiny_images "$dir/img"
mlp=(--model mlp:32 --data "$dir/img" --epochs 3 --lr 1e-3 --threads 1 --quiet)
"$DTRAIN" train "${mlp[@]}" --batch 32 --metrics "$dir/mlp1.jsonl" || fail "MLP, one process"
for z in 1 2 3; do
    "$DTRAIN" train "${mlp[@]}" --nproc 2 --batch 16 --zero $z --metrics "$dir/mlp2-$z.jsonl" &&
        compare "zero$z MLP, 2 ranks x batch 16" "$dir/mlp2-$z.jsonl" "$dir/mlp1.jsonl" 48 || fail "zero$z MLP run"
done

if [ -n "$MPIEXEC" ]; then
    for z in 1 2 3; do
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=$NODES \
            "$MPIEXEC" --oversubscribe -np 2 "$DTRAIN" train "${common[@]}" --batch 2 --zero $z --metrics "$dir/mpi$z.jsonl" 2> "$dir/mpi$z.err" &&
            compare "zero$z under mpirun, 2 ranks on $NODES pseudo-node(s)" "$dir/mpi$z.jsonl" "$dir/ref.jsonl" || fail "zero$z mpirun: $(tail -3 "$dir/mpi$z.err")"
    done
fi

# sharded checkpoints: each rank writes its slice of optim.f32; they resume on any layout.
# The same layout: the state after 10 + 10 steps is byte for byte that of 20 in one go.
for z in 1 2 3; do
    run whole$z --nproc 2 --batch 2 --zero $z --save "$dir/one$z"
    run half$z --nproc 2 --batch 2 --zero $z --save "$dir/two$z" --stop-after 10
    run rest$z --nproc 2 --batch 2 --zero $z --save "$dir/two$z" --resume "$dir/two$z"
    for f in params.f32 optim.f32; do
        cmp -s "$dir/one$z/step-00000020/$f" "$dir/two$z/step-00000020/$f" && ok "zero$z resumed on its own layout: $f byte for byte" \
            || fail "zero$z resume: $f differs"
    done
done
grep -q '"pieces"' "$dir/one1/step-00000020/manifest.json" && ok "the manifest lists each rank's piece of optim.f32" || fail "no pieces in the manifest"
# Another layout at each cut: zero3 on 4 ranks, zero1 on 2, one process, DDP on 2, against one process throughout
run c1 --nproc 4 --batch 1 --zero 3 --save "$dir/chain" --stop-after 5
run c2 --nproc 2 --batch 2 --zero 1 --save "$dir/chain" --resume "$dir/chain" --stop-after 5
run c3 --batch 4 --save "$dir/chain" --resume "$dir/chain" --stop-after 5
run c4 --nproc 2 --batch 2 --save "$dir/chain" --resume "$dir/chain"
cat "$dir/c1.jsonl" "$dir/c2.jsonl" "$dir/c3.jsonl" "$dir/c4.jsonl" > "$dir/chain.jsonl"
compare "zero3 x4 -> zero1 x2 -> 1 process -> ddp x2, 5 steps each (1e-6)" "$dir/chain.jsonl" "$dir/ref.jsonl" 20 1e-6
run c5 --nproc 2 --batch 2 --zero 2 --save "$dir/chain2" --stop-after 10
run c6 --nproc 4 --batch 1 --zero 3 --save "$dir/chain2" --resume "$dir/chain2"
cat "$dir/c5.jsonl" "$dir/c6.jsonl" > "$dir/chain2.jsonl"
compare "zero2 x2 -> zero3 x4, 10 steps each (1e-6)" "$dir/chain2.jsonl" "$dir/ref.jsonl" 20 1e-6
# ZeRO-3 with a copy per rank (ranks on several machines) holds only its slice of the parameters
# between steps: each rank writes its slice of params.f32 too, nothing gathered; the same layout
# resumes byte for byte, one process continues the trajectory, and a damaged slice is named
p3=(--nproc 3 --batch 1 --zero 3)
DTRAIN_ZERO_PRIVATE_PARAMS=1 run pwhole "${p3[@]}" --save "$dir/pone"
DTRAIN_ZERO_PRIVATE_PARAMS=1 run phalf "${p3[@]}" --save "$dir/ptwo" --stop-after 10
DTRAIN_ZERO_PRIVATE_PARAMS=1 run prest "${p3[@]}" --save "$dir/ptwo" --resume "$dir/ptwo"
for f in params.f32 optim.f32; do
    cmp -s "$dir/pone/step-00000020/$f" "$dir/ptwo/step-00000020/$f" && ok "zero3, own copies, resumed on its own layout: $f byte for byte" \
        || fail "zero3 own copies resume: $f differs"
done
"$DTRAIN" ckpt info "$dir/ptwo" > "$dir/pinfo" 2>&1
grep -q 'params.f32: sharded' "$dir/pinfo" && [ "$(grep -c '"fnv1a64"' "$dir/ptwo/step-00000020/manifest.json")" = 6 ] \
    && ok "zero3, own copies: the manifest hashes each rank's slice of params.f32 and optim.f32 (6 pieces)" \
    || fail "zero3 own copies manifest: $(grep -A2 params.f32 "$dir/pinfo")"
run pone1 --batch 3 --resume "$dir/ptwo" --save "$dir/ptwo" --steps 30
cat "$dir/prest.jsonl" "$dir/pone1.jsonl" | tail -n 20 > "$dir/pchain.jsonl"
run pref --batch 3 --steps 30
tail -n 20 "$dir/pref.jsonl" > "$dir/pref20.jsonl"
compare "zero3 own copies x3 -> 1 process, 10 steps each (1e-6)" "$dir/pchain.jsonl" "$dir/pref20.jsonl" 20 1e-6
cp -r "$dir/pone" "$dir/pbad"
flip "$dir/pbad/step-00000020/params.f32" 200000
"$DTRAIN" train "${common[@]}" --batch 3 --steps 30 --resume "$dir/pbad" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'params.f32: floats \[40192, 80384)' "$dir/err" && ok "a damaged slice of params.f32 is named: $(grep -m1 'params.f32' "$dir/err")" \
    || fail "damaged params slice: exit $rc, $(cat "$dir/err")"
# dtrain ckpt info / export on a sharded checkpoint
"$DTRAIN" ckpt info "$dir/one1" > "$dir/info" 2>&1 && grep -q 'step 20, saved by 2 ranks under zero1' "$dir/info" && grep -q 'piece 1 (rank 1' "$dir/info" \
    && ok "ckpt info: $(head -1 "$dir/info" | sed 's|.*/||')" || fail "ckpt info: $(head -3 "$dir/info")"
"$DTRAIN" ckpt export "$dir/one1" "$dir/one1.safetensors" > /dev/null 2>&1 && "$DTRAIN" ckpt export "$dir/one1" "$dir/one1.bin" > /dev/null 2>&1 \
    && "$DTRAIN" train --model "$dir/one1.safetensors" --data "$dir/train.bin" --seq 64 --steps 1 --threads 1 --quiet \
    && cmp -s <(tail -c +1025 "$dir/one1.bin" | head -c 16384) <(head -c 16384 "$dir/one1/step-00000020/params.f32") \
    && ok "ckpt export: a safetensors file that trains, and an llm.c file whose wte is params.f32's" || fail "ckpt export"
"$DTRAIN" ckpt info "$dir/nowhere" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'nowhere/latest: cannot open' "$dir/err" && ok "ckpt info on a missing directory: exit 1, named" || fail "ckpt info nowhere: $rc"
# a damaged piece is named
cp -r "$dir/one1" "$dir/bad"
flip "$dir/bad/step-00000020/optim.f32" 100
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --zero 1 --steps 30 --resume "$dir/bad" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'optim.f32: floats \[0, ' "$dir/err" && ok "a damaged piece is refused: $(grep -m1 'optim.f32' "$dir/err")" \
    || fail "damaged piece: exit $rc, $(cat "$dir/err")"
truncate -s 1000 "$dir/bad/step-00000020/optim.f32"
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --zero 1 --steps 30 --resume "$dir/bad" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'optim.f32: 1000 bytes' "$dir/err" && ok "a short optim.f32 is refused: $(grep -m1 'optim.f32' "$dir/err")" \
    || fail "short optim.f32: exit $rc, $(cat "$dir/err")"

# a job that would not fit this machine is refused before it allocates, naming the stages that would
DTRAIN_MEMORY_AVAILABLE=1M "$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'ddp needs [0-9.]* [MG]iB on this machine (2 ranks x .*available; --zero 1 needs .*; --zero 3 needs' "$dir/err" \
    && ok "too big for the machine: $(grep -m1 'needs' "$dir/err" | cut -c1-200)" || fail "memory refusal: exit $rc, $(head -2 "$dir/err")"
grep -q -- '--batch 1 with 2x the --grad-accum (the same global batch) needs .*; --recompute needs' "$dir/err" &&
    [ "$(grep -c 'ddp needs' "$dir/err")" = 1 ] && ok "... suggesting smaller micro-batches and --recompute, said once" ||
    fail "memory refusal's suggestions or repetition: $(cat "$dir/err")"
# the same job with 10% more than the refusal said --zero 1 needs (the process's own size is in it: a sanitizer's build is
# larger, so no fixed figure)
need=$(grep -o -- '--zero 1 needs [0-9.]* MiB' "$dir/err" | head -1 | awk '{print $4}')
avail=$(awk -v n="${need:-0}" 'BEGIN{printf "%d", n * 1.1 + 1}')
DTRAIN_MEMORY_AVAILABLE=${avail}M "$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 --zero 1 > /dev/null 2> "$dir/err" \
    && [ -n "$need" ] && ok "the same job with $avail MiB available (--zero 1 needs $need) runs" || fail "a job that fits was refused (--zero 1 needs ${need:-?} MiB, $avail available): $(head -2 "$dir/err")"

# kill -9 of a rank while the ranks save every step: the job ends naming it; the
# latest checkpoint is whole and resumes, and the next save clears the killed save's temporary
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --zero 1 --steps 100000 --save-every 1 --save "$dir/killed" > /dev/null 2> "$dir/kerr" &
launcher=$!
for ((i = 0; i < 300; i++)); do [ -s "$dir/killed/latest" ] && break; sleep 0.1; done
sleep 0.5
victim=""
for p in $(pgrep -P $launcher); do grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2>/dev/null && victim=$p; done
if [ -z "$victim" ]; then fail "rank 1 of the zero1 job not found"; kill $launcher
else
    kill -9 "$victim"; wait $launcher; rc=$?
    [ $rc -ne 0 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$dir/kerr" \
        && ok "zero1 job with a rank killed while saving: exit $rc, naming it" || fail "killed zero1 job: exit $rc: $(head -3 "$dir/kerr")"
    step=$("$DTRAIN" ckpt info "$dir/killed" 2>&1 | grep -o 'step [0-9]*,' | head -1 | tr -dc 0-9)
    if [ -n "$step" ] && "$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --zero 1 --steps $((step + 2)) --resume "$dir/killed" \
        --save "$dir/killed" > /dev/null 2> "$dir/err"; then
        left=$(ls -a "$dir/killed" | grep -c '^\.tmp-' || true)
        [ "$left" = 0 ] && ok "the latest checkpoint (step $step) was whole and resumed; no temporary left" \
            || fail "temporaries left: $(ls -a "$dir/killed")"
    else fail "resume after the kill: step '$step', $(head -3 "$dir/err")"; fi
fi

# kill -9 of a rank while zero3 trains (its ranks spend most of a step in the parameters'
# gathers and the gradients' reductions): rank 0 stops naming the rank and the collective it was in
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --zero 3 --steps 100000 > /dev/null 2> "$dir/k3err" &
launcher=$!
victim=""; survivor=""
for ((i = 0; i < 600 && (${#victim} == 0 || ${#survivor} == 0); i++)); do # the ranks, once started (up to 60 s)
    sleep 0.1
    for p in $(pgrep -P $launcher); do
        grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2>/dev/null && victim=$p
        grep -qz '^DTRAIN_RANK=0$' /proc/$p/environ 2>/dev/null && survivor=$p
    done
done
sleep 0.5 # into the training steps (anywhere will do: the message names whatever collective rank 0 was in)
if [ -z "$victim" ] || [ -z "$survivor" ]; then fail "the ranks of the zero3 job not found"; kill $launcher
else
    t0=$(date +%s.%N); kill -9 "$victim"; wait $launcher; rc=$?; t1=$(date +%s.%N)
    secs=$(awk "BEGIN{print $t1 - $t0}")
    # the time is reported, not asserted (a hang would stop at ctest's timeout)
    [ $rc -ne 0 ] && ! kill -0 "$survivor" 2> /dev/null \
        && grep -q "rank 0.*rank 1 (pid $victim).*\(in\|after\) [a-z_]* #[0-9]*\|rank 0: stopping \(in\|after\) [a-z_]* #[0-9]* .*rank 1 (pid $victim)" "$dir/k3err" \
        && ok "zero3, rank 1 killed: the job ended in $secs s, exit $rc: $(grep -m1 'rank 0' "$dir/k3err" | sed 's/.*error: //')" \
        || fail "zero3 kill: exit $rc after $secs s: $(cat "$dir/k3err")"
fi

# ranks started with different stages: refused at start-up, saying what differs
timeout 60 "$DTRAIN" launch -n 2 -- bash -c "if [ \$DTRAIN_RANK = 0 ]; then $DTRAIN train ${common[*]} --batch 2 --steps 2 --zero 1; \
    else $DTRAIN train ${common[*]} --batch 2 --steps 2; fi" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank 0 runs strategy zero1, rank 1 runs ddp' "$dir/err" \
    && ok "different --zero on the ranks: $(grep -m1 'runs strategy' "$dir/err")" || fail "different --zero: exit $rc, $(head -3 "$dir/err")"
timeout 60 "$DTRAIN" launch -n 2 -- bash -c "$DTRAIN train ${common[*]} --batch 2 --steps 2 --zero \$((DTRAIN_RANK + 2))" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank 0 runs strategy zero2, rank 1 runs zero3' "$dir/err" \
    && ok "--zero 2 and 3 on the ranks: $(grep -m1 'runs strategy' "$dir/err")" || fail "--zero 2 vs 3: exit $rc, $(head -3 "$dir/err")"

"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 --zero 1 --save "$dir/w.bin" > /dev/null 2>&1 && [ -s "$dir/w.bin" ] \
    && ok "zero1 saves the weights (--save FILE.bin)" || fail "zero1 --save FILE.bin"
# zero3 gathers the whole model for a weights file: the same file as one process's
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 --zero 3 --save "$dir/w3.bin" > /dev/null 2>&1 &&
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 --save "$dir/wd.bin" > /dev/null 2>&1 && cmp -s "$dir/w3.bin" "$dir/wd.bin" \
    && ok "zero3 --save FILE.bin writes DDP's file byte for byte" || fail "zero3 --save FILE.bin differs from DDP's"
# DeepSpeed's config: the stage, the bucket size in elements; the keys for its own buffers named as ignored
printf '{"zero_optimization": {"stage": 3, "reduce_bucket_size": 20000, "overlap_comm": true, "stage3_prefetch_bucket_size": 1}}' > "$dir/ds.json"
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --config "$dir/ds.json" --metrics "$dir/ds.jsonl" > /dev/null 2> "$dir/err" &&
    compare "the config's zero_optimization.stage 3" "$dir/ds.jsonl" "$dir/ref.jsonl" || fail "config stage 3: $(cat "$dir/err")"
[ "$(grep -c 'zero_optimization.overlap_comm is accepted and ignored\|zero_optimization.stage3_prefetch_bucket_size is accepted and ignored' "$dir/err")" = 2 ] \
    && ! grep -q reduce_bucket_size "$dir/err" && ok "the config's ignored keys are named: $(grep -m1 -o 'zero_optimization.overlap_comm is accepted and ignored' "$dir/err")" \
    || fail "ignored keys: $(cat "$dir/err")"
"$DTRAIN" train "${common[@]}" --nproc 2 --batch 2 --steps 2 --zero 4 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- '--zero' "$dir/err" && ok "--zero 4 refused: $(head -1 "$dir/err")" || fail "--zero 4: exit $rc, $(cat "$dir/err")"
echo "zero: $passed passed, $failed failed"
[ $failed -eq 0 ]
