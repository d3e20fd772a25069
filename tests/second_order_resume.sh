#!/bin/bash
# A second-order optimizer's state in checkpoints (kfac.f32, shampoo.f32, soap.f32): a run stopped at step 10 and
# resumed gives the uninterrupted run's weights at step 20 bit for bit, for Shampoo (2 ranks, its blocks shared),
# K-FAC (4 ranks, MEM-OPT) and SOAP (one process, 2 ranks, DP 2 x PP 2), each with a preconditioning interval (3) that step 10
# falls inside, so the saved roots, decompositions and bases are the ones used; K-FAC under ZeRO-1, resumed by ZeRO-1
# and by DDP; on pipeline stages (each stage's own state, KEY-stageSofP.f32) K-FAC on DP 2 x PP 2 and Shampoo on PP 2;
# on 2 tensor-parallel ranks K-FAC, Shampoo and SOAP (the group's ranks hold the same whole tensors' state: one kfac
# entry in the manifest), K-FAC's also resumed by one process; SOAP saved under ZeRO-1 resumed by DDP. Across pipeline splits: K-FAC's saved on DP 2 x PP 2 resumed by
# one process, one process's on PP 2 and DP 2 x PP 2, TP 2 x PP 2's by one process (and by itself bit for bit),
# Shampoo's on PP 2 by one process and 2 ranks' on PP 2, each
# near the uninterrupted run's losses (K-FAC within 1e-5, Shampoo 1e-4); an interleaved stage's state resumed by its
# own layout bit for bit, by another afresh.
# Resharded: Shampoo's state saved with its blocks shared by groups of 2 of 4 ranks resumes shared by all 4 and held
# whole by each; SOAP's saved with its matrices shared by 2 ranks (on DP 2 x PP 2 too) resumes held whole by each; K-FAC's saved by MEM-OPT resumes as COMM-OPT and HYBRID (on DP 2 x PP 2 too); all bit for bit (their
# layouts compute alike). On another rank count (saved by 2 or 4 ranks, one process resumes with the global batch)
# the losses stay within 5e-4 of the uninterrupted run's. Without the state (a manifest without it, as older
# checkpoints) or with other units (another block size) the state starts afresh, said, and the weights differ; a
# damaged kfac.f32 is refused, naming it; ckpt info and verify show the files.
# usage: second_order_resume.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
gpl_tokens
base=(--data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 32 --threads 1 --quiet)
shampoo=(--optimizer shampoo --lr 3e-3 --shampoo-block 64 --precondition-every 3 --shampoo-eps 1e-6)
kfac=(--optimizer kfac --lr 0.01 --kfac-inv-every 3 --kfac-factor-every 2)
soap=(--optimizer soap --lr 3e-3 --precondition-every 3)
w20() { echo "$dir/$1/step-00000020/params.f32"; }
# NAME ARGS: the uninterrupted run to step 20, and NAME_p stopped at 10 (a copy of its checkpoint as NAME_c)
pair() {
    local name=$1
    shift
    "$DTRAIN" train "${base[@]}" "$@" --steps 20 --save "$dir/$name" --save-every 10 --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 &&
        "$DTRAIN" train "${base[@]}" "$@" --steps 10 --save "$dir/${name}_p" --save-every 10 > "$dir/${name}_p.out" 2>&1 &&
        cp -r "$dir/${name}_p" "$dir/${name}_c"
}
# NAME COPY ARGS: resume checkpoint COPY to step 20, its output in COPY.out
resume() {
    local copy=$2
    shift 2
    "$DTRAIN" train --resume "$dir/$copy" --steps 20 --threads 1 --quiet --metrics "$dir/$copy.jsonl" "$@" > "$dir/$copy.out" 2>&1
}
same() { # WHAT A B
    if [ -f "$2" ] && cmp -s "$2" "$3"; then ok "$1: the uninterrupted run's weights, bit for bit"
    else fail "$1: the weights differ ($(grep -v oversubscribed "${3%/step-*}.out" 2>/dev/null | tail -1))"; fi
}
copies() { # FROM TO...: copies of a checkpoint folder
    local from=$1
    shift
    for c in "$@"; do rm -rf "$dir/$c"; cp -r "$dir/$from" "$dir/$c"; done
}

pair sh "${shampoo[@]}" --nproc 2 --batch 4 || fail "Shampoo runs: $(tail -1 "$dir/sh.out")"
resume sh sh_p --nproc 2
same "Shampoo, 2 ranks, resumed at step 10" "$(w20 sh)" "$(w20 sh_p)"

pair sh4 "${shampoo[@]}" --nproc 4 --batch 2 --shampoo-group 2 || fail "Shampoo 4 ranks: $(tail -1 "$dir/sh4.out")"
copies sh4_c sh4_g4 sh4_g1
resume sh4 sh4_g4 --nproc 4 --shampoo-group 4
same "Shampoo saved by groups of 2, resumed shared by all 4 ranks" "$(w20 sh4)" "$(w20 sh4_g4)"
resume sh4 sh4_g1 --nproc 4 --shampoo-group 1
same "Shampoo saved by groups of 2, resumed held whole by every rank" "$(w20 sh4)" "$(w20 sh4_g1)"

# saved by ranks, resumed by one process with the global batch of 8: the gradients' sums come in another order
on_one() { # WHAT NAME: NAME's step-10 checkpoint resumed by one process, its last 10 losses against NAME's
    copies "$2_c" "$2_one"
    resume "$2" "$2_one" --nproc 1 --batch 8
    local w
    w=$(worst loss <(tail -10 "$dir/$2.jsonl") "$dir/$2_one.jsonl" 10)
    if [ "$w" != missing ] && awk -v w="$w" 'BEGIN{exit !(w <= 5e-4)}'; then ok "$1, resumed by one process: losses within $w of the uninterrupted run's"
    else fail "$1, resumed by one process: losses differ by $w ($(tail -1 "$dir/$2_one.out"))"; fi
}
on_one "Shampoo saved by 2 ranks" sh

# without the state, or with other units: afresh, said, and not the uninterrupted run
copies sh_c sh_old sh_block
python3 - "$dir/sh_old/step-00000010/manifest.json" <<'EOF'
import json, sys
p = sys.argv[1]
j = json.load(open(p))
del j["units"]
json.dump(j, open(p, "w"))
EOF
resume sh sh_old --nproc 2
if grep -q "no shampoo state saved.*starts afresh" "$dir/sh_old.out" && ! cmp -s "$(w20 sh)" "$(w20 sh_old)"; then
    ok "a checkpoint without Shampoo's state: afresh, said, and the weights differ from the uninterrupted run's"
else fail "no state: $(tail -2 "$dir/sh_old.out")"; fi
resume sh sh_block --nproc 2 --shampoo-block 32
if grep -q "saved shampoo state is 57 units.*starts afresh" "$dir/sh_block.out" && [ -f "$(w20 sh_block)" ]; then
    ok "resumed with --shampoo-block 32: $(grep -o "the saved shampoo state is [^:]*" "$dir/sh_block.out")"
else fail "other units: $(tail -2 "$dir/sh_block.out")"; fi

pair kf "${kfac[@]}" --nproc 4 --batch 2 --kfac-workers 0.25 || fail "K-FAC runs: $(tail -1 "$dir/kf.out")"
copies kf_c kf_comm kf_hybrid
resume kf kf_p --nproc 4
same "K-FAC MEM-OPT, 4 ranks, resumed at step 10" "$(w20 kf)" "$(w20 kf_p)"
resume kf kf_comm --nproc 4 --kfac-workers 1
same "K-FAC saved by MEM-OPT, resumed as COMM-OPT" "$(w20 kf)" "$(w20 kf_comm)"
resume kf kf_hybrid --nproc 4 --kfac-workers 0.5
same "K-FAC saved by MEM-OPT, resumed as HYBRID" "$(w20 kf)" "$(w20 kf_hybrid)"

on_one "K-FAC saved by 4 ranks" kf

# tensor parallelism: the group's ranks hold the same whole-tensor state, its first saves it; resumed on 2
# tensor-parallel ranks bit for bit, and K-FAC's by one process within 5e-4
pair ktp "${kfac[@]}" --nproc 2 --tp 2 --batch 8 || fail "K-FAC TP 2 runs: $(tail -1 "$dir/ktp.out")"
copies ktp_c ktp_r
n=$(python3 -c 'import json, sys; print(sum(u["key"] == "kfac" for u in json.load(open(sys.argv[1]))["units"]))' "$dir/ktp_c/step-00000010/manifest.json")
[ "$n" = 1 ] && ok "2 tensor-parallel ranks: K-FAC's state saved once (the group's first rank)" || fail "2 tensor-parallel ranks: K-FAC's state in the manifest $n times"
resume ktp ktp_r --nproc 2 --tp 2
same "K-FAC on 2 tensor-parallel ranks, resumed at step 10" "$(w20 ktp)" "$(w20 ktp_r)"
on_one "K-FAC saved by 2 tensor-parallel ranks" ktp
pair shtp "${shampoo[@]}" --nproc 2 --tp 2 --batch 8 || fail "Shampoo TP 2 runs: $(tail -1 "$dir/shtp.out")"
copies shtp_c shtp_r
resume shtp shtp_r --nproc 2 --tp 2
same "Shampoo on 2 tensor-parallel ranks, resumed at step 10" "$(w20 shtp)" "$(w20 shtp_r)"

# ZeRO-1 (each rank writes its shard of optim.f32) resumed by ZeRO-1, and by DDP
pair kz "${kfac[@]}" --nproc 2 --batch 4 --kfac-workers 0.5 --zero 1 || fail "K-FAC ZeRO-1 runs: $(tail -1 "$dir/kz.out")"
copies kz_c kz_ddp
resume kz kz_p --nproc 2 --zero 1
same "K-FAC under ZeRO-1, resumed at step 10" "$(w20 kz)" "$(w20 kz_p)"
resume kz kz_ddp --nproc 2 --strategy ddp
same "K-FAC saved under ZeRO-1, resumed under DDP" "$(w20 kz)" "$(w20 kz_ddp)"

pair so1 "${soap[@]}" --batch 8 || fail "SOAP runs: $(tail -1 "$dir/so1.out")"
resume so1 so1_p
same "SOAP, one process, resumed at step 10" "$(w20 so1)" "$(w20 so1_p)"
pair so2 "${soap[@]}" --nproc 2 --batch 4 || fail "SOAP 2 ranks: $(tail -1 "$dir/so2.out")"
copies so2_c so2_whole
resume so2 so2_p --nproc 2
same "SOAP, 2 ranks (its matrices shared), resumed at step 10" "$(w20 so2)" "$(w20 so2_p)"
resume so2 so2_whole --nproc 2 --soap-group 1
same "SOAP saved with its matrices shared by 2 ranks, resumed held whole by each" "$(w20 so2)" "$(w20 so2_whole)"
# the last stage's optimizer leaves the tied token table's copy out: its state is still saved (it was not)
pair sopp "${soap[@]}" --nproc 4 --pp 2 --batch 4 || fail "SOAP DP 2 x PP 2 runs: $(tail -1 "$dir/sopp.out")"
resume sopp sopp_p --nproc 4 --pp 2 --batch 4 --soap-group 1
same "SOAP on DP 2 x PP 2 (shared), resumed at step 10 held whole by each rank" "$(w20 sopp)" "$(w20 sopp_p)"
# a preconditioner over SGD: on 2 tensor-parallel ranks (the whole matrices, saved by the group's first) and under ZeRO-1
pair sotp "${soap[@]}" --nproc 2 --tp 2 --batch 8 || fail "SOAP TP 2 runs: $(tail -1 "$dir/sotp.out")"
resume sotp sotp_p --nproc 2 --tp 2
same "SOAP on 2 tensor-parallel ranks, resumed at step 10" "$(w20 sotp)" "$(w20 sotp_p)"
pair soz "${soap[@]}" --nproc 2 --batch 4 --zero 1 || fail "SOAP ZeRO-1 runs: $(tail -1 "$dir/soz.out")"
copies soz_c soz_ddp
resume soz soz_ddp --nproc 2 --strategy ddp
same "SOAP saved under ZeRO-1 (shared by 2), resumed under DDP" "$(w20 soz)" "$(w20 soz_ddp)"

# pipeline stages: each stage's own state (KEY-stageSofP.f32, written by the stage's first data-parallel rank)
pair kpp "${kfac[@]}" --nproc 4 --pp 2 --batch 2 --grad-accum 2 --kfac-workers 0.5 || fail "K-FAC DP 2 x PP 2 runs: $(tail -1 "$dir/kpp.out")"
copies kpp_c kpp_comm
resume kpp kpp_p --nproc 4 --pp 2 --grad-accum 2
same "K-FAC on DP 2 x PP 2 (MEM-OPT), resumed at step 10" "$(w20 kpp)" "$(w20 kpp_p)"
resume kpp kpp_comm --nproc 4 --pp 2 --grad-accum 2 --kfac-workers 1
same "K-FAC saved on DP 2 x PP 2 by MEM-OPT, resumed as COMM-OPT" "$(w20 kpp)" "$(w20 kpp_comm)"
pair shpp "${shampoo[@]}" --nproc 2 --pp 2 --batch 2 --grad-accum 4 || fail "Shampoo PP 2 runs: $(tail -1 "$dir/shpp.out")"
resume shpp shpp_p --nproc 2 --pp 2 --grad-accum 4
same "Shampoo on 2 pipeline stages, resumed at step 10" "$(w20 shpp)" "$(w20 shpp_p)"

# across pipeline splits: the stages' units one after another are the whole model's, so a checkpoint of one split
# resumes on another (each stored piece's sizes checked against the whole run's); no "afresh", and the last 10
# losses within TOL of the uninterrupted run's: K-FAC's 1e-5 (2.1e-7 here; started afresh they part by 6e-4),
# Shampoo's 1e-4 (its roots at eps 1e-6 magnify the stages' other sums: 6.7e-6 here; afresh 2e-2)
split() { # WHAT TOL NAME COPY ARGS: NAME's step-10 checkpoint (as COPY) resumed with ARGS
    local what=$1 tol=$2 name=$3 copy=$4 w
    shift 4
    copies "${name}_c" "$copy"
    resume "$name" "$copy" "$@"
    w=$(worst loss <(tail -10 "$dir/$name.jsonl") "$dir/$copy.jsonl" 10)
    if [ "$w" != missing ] && ! grep -q afresh "$dir/$copy.out" && awk -v w="$w" -v t="$tol" 'BEGIN{exit !(w <= t)}'; then
        ok "$what: losses within $w of the uninterrupted run's"
    else fail "$what: losses $w ($(grep -v oversubscribed "$dir/$copy.out" | tail -1))"; fi
}
split "K-FAC saved on DP 2 x PP 2, resumed by one process" 1e-5 kpp kpp_one --nproc 1 --batch 8 --grad-accum 1
pair k1 "${kfac[@]}" --batch 8 || fail "K-FAC one-process runs: $(tail -1 "$dir/k1.out")"
split "K-FAC saved by one process, resumed on 2 pipeline stages" 1e-5 k1 k1_pp --nproc 2 --pp 2 --batch 2 --grad-accum 4
split "K-FAC saved by one process, resumed on DP 2 x PP 2 (MEM-OPT)" 1e-5 k1 k1_dppp --nproc 4 --pp 2 --batch 2 --grad-accum 2 --kfac-workers 0.5
split "Shampoo saved on 2 pipeline stages, resumed by one process" 1e-4 shpp shpp_one --nproc 1 --batch 8 --grad-accum 1
split "Shampoo saved by 2 ranks, resumed on 2 pipeline stages" 1e-4 sh sh_pp --nproc 2 --pp 2 --batch 2 --grad-accum 4
pair ktpp "${kfac[@]}" --nproc 4 --tp 2 --pp 2 --batch 2 --grad-accum 4 || fail "K-FAC TP 2 x PP 2 runs: $(tail -1 "$dir/ktpp.out")"
copies ktpp_c ktpp_r
resume ktpp ktpp_r --nproc 4 --tp 2 --pp 2 --grad-accum 4
same "K-FAC on 2 tensor-parallel ranks x 2 pipeline stages, resumed at step 10" "$(w20 ktpp)" "$(w20 ktpp_r)"
split "K-FAC saved on TP 2 x PP 2, resumed by one process" 1e-5 ktpp ktpp_one --nproc 1 --batch 8 --grad-accum 1
# an interleaved stage's layers are not one run of the model's (KEY-stageSofP-chunksC): its own layout resumes it bit for
# bit, another split starts afresh, said
il=(--layers 4 --nproc 2 --pp 2 --pp-schedule interleaved --batch 2 --grad-accum 4)
pair kil "${kfac[@]}" "${il[@]}" || fail "K-FAC interleaved runs: $(tail -1 "$dir/kil.out")"
copies kil_c kil_one
resume kil kil_p "${il[@]}"
same "K-FAC on 2 interleaved stages of 2 chunks, resumed at step 10" "$(w20 kil)" "$(w20 kil_p)"
resume kil kil_one --nproc 1 --batch 8 --grad-accum 1
grep -q "no kfac state saved.*afresh" "$dir/kil_one.out" && ok "K-FAC saved on interleaved stages, resumed by one process: afresh, said" ||
    fail "an interleaved checkpoint on one process: $(tail -1 "$dir/kil_one.out")"

# what ckpt shows, and a damaged file
info=$("$DTRAIN" ckpt info "$dir/kf" 2>&1)
if echo "$info" | grep -q "^kfac.f32: 8 units" && "$DTRAIN" ckpt verify "$dir/sh" 2>&1 | grep -q "shampoo.f32 match"; then
    ok "ckpt info: $(echo "$info" | grep '^kfac.f32'); ckpt verify checks shampoo.f32"
else fail "ckpt info/verify: $(echo "$info" | tail -2)"; fi
python3 -c "f = open('$dir/kf_c/step-00000010/kfac.f32', 'r+b'); f.seek(400); f.write(b'xyz'); f.close()"
if resume kf kf_c --nproc 4; then fail "a damaged kfac.f32 accepted"
elif grep -q "kfac.f32: floats .* hash to" "$dir/kf_c.out"; then ok "a damaged kfac.f32 refused: $(grep -m1 -o 'kfac.f32: floats [^(]*' "$dir/kf_c.out")"
else fail "damaged kfac.f32: $(tail -2 "$dir/kf_c.out")"; fi
echo "second-order resume checks: $passed passed, $failed failed"
[ "$failed" = 0 ]
