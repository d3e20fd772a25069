#!/bin/bash
# K-FAC and Shampoo on the image models (dtrain train --model mlp | resnet:small), tiny images (8 x 8, from the GPL's
# text): K-FAC preconditions every Linear of the MLP and the ResNet's convolutions and head (said, with its layout);
# its distribution changes nothing: the MLP on 2 ranks x 4 (COMM-OPT and MEM-OPT) against one process x 8 over an
# epoch of 64 steps, losses within 1e-5, and MEM-OPT's lines those of COMM-OPT; the ResNet with --sync-bn likewise
# for its first 3 steps (after that batch-8 BatchNorm training parts by rounding alone: resnet_training.sh says
# why), MEM-OPT's weights COMM-OPT's bit for bit after an epoch; a K-FAC ResNet run cut and resumed takes the
# uninterrupted run's steps (its factors and decompositions in the checkpoint); Shampoo on the MLP, 2 ranks against
# one process; --eval-every's accuracy lines inside an epoch; ZeRO-2 refused.
# usage: kfac_images.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/tiny_images.sh"
tiny_images "$dir/img"
said=(--data "$dir/img" --epochs 1 --threads 1 --momentum 0.9)
common=("${said[@]}" --quiet)
within() { [ "$1" != missing ] && awk "BEGIN{exit !($1 <= $2)}"; }
steplines() { grep -h '"loss"' "$@"; }
# where two runs' step lines first part (a failure's detail)
first_apart() { diff <(steplines $1) <(steplines $2) | head -4 | tr '\n' ' '; }
# the worst relative difference of the first N losses of two metrics files ("missing" if fewer)
first_losses() { # A B N
    paste <(field loss "$1" | head -"$3") <(field loss "$2" | head -"$3") |
        awk -v n0="$3" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{print n == n0 ? w : "missing"}'
}

# the MLP: every Linear preconditioned, 2 ranks (both layouts) against one process
mlp=(--model mlp:32 --optimizer kfac --lr 0.05 --kfac-damping 0.01)
run_metrics mlp_one "${mlp[@]}" --batch 8
for w in 1 0.5; do
    run_metrics mlp_two_$w "${mlp[@]}" --batch 4 --nproc 2 --kfac-workers $w
    l=$(worst loss "$dir/mlp_one.jsonl" "$dir/mlp_two_$w.jsonl" 64)
    within "$l" 1e-5 && ok "MLP, K-FAC on 2 ranks x 4 (--kfac-workers $w) against one process x 8: 64 losses within $l" \
        || fail "MLP, 2 ranks, workers $w: losses $l"
done
[ "$(steplines "$dir/mlp_two_0.5.jsonl")" = "$(steplines "$dir/mlp_two_1.jsonl")" ] && ok "MLP: MEM-OPT's steps are COMM-OPT's" \
    || fail "MLP: MEM-OPT's steps differ from COMM-OPT's: $(first_apart "$dir/mlp_two_0.5.jsonl" "$dir/mlp_two_1.jsonl")"
"$DTRAIN" train "${said[@]}" "${mlp[@]}" --batch 8 --nproc 2 --kfac-workers 0.5 > "$dir/said" 2>&1
grep -q "K-FAC (MEM-OPT) preconditions 2 layers (2410 parameters) before sgd" "$dir/said" && grep -q "kfac over sgd lr 0.05" "$dir/said" \
    && ok "the MLP's K-FAC said: $(grep -o 'K-FAC (MEM-OPT) preconditions [^,]*' "$dir/said")" || fail "the MLP's K-FAC line: $(head -3 "$dir/said")"

# the ResNet: its convolutions and head; synchronised BatchNorm makes 2 ranks x 4 one process x 8
rn=(--model resnet:small --optimizer kfac --lr 0.02 --kfac-factor-every 2 --kfac-inv-every 4 --kfac-damping 0.01)
run_metrics rn_one "${rn[@]}" --batch 8
for w in 1 0.5; do
    run_metrics rn_two_$w "${rn[@]}" --batch 4 --nproc 2 --sync-bn --kfac-workers $w --save "$dir/rn_$w"
done
l=$(first_losses "$dir/rn_one.jsonl" "$dir/rn_two_1.jsonl" 3)
within "$l" 1e-5 && ok "ResNet, K-FAC on 2 ranks x 4 with --sync-bn against one process x 8: the first 3 losses within $l" \
    || fail "ResNet, 2 ranks against one process: $l"
cmp -s "$dir/rn_1/step-00000064/params.f32" "$dir/rn_0.5/step-00000064/params.f32" \
    && ok "ResNet: MEM-OPT's weights are COMM-OPT's after an epoch, bit for bit" || fail "ResNet: MEM-OPT's weights differ from COMM-OPT's: $(cmp "$dir/rn_1/step-00000064/params.f32" "$dir/rn_0.5/step-00000064/params.f32" 2>&1 | head -1); steps: $(first_apart "$dir/rn_two_1.jsonl" "$dir/rn_two_0.5.jsonl")"
"$DTRAIN" train "${said[@]}" "${rn[@]}" --batch 8 --steps 1 > "$dir/said" 2>&1
grep -q "K-FAC (COMM-OPT) preconditions 16 layers (.* parameters) before sgd.*(the BatchNorms)" "$dir/said" \
    && ok "the ResNet's K-FAC said: $(grep -o 'K-FAC (COMM-OPT) preconditions [^,]*' "$dir/said")" || fail "the ResNet's K-FAC line: $(head -3 "$dir/said")"

# cut and resumed: its factors and decompositions come back (decompositions every 4 steps: a lost one would show)
ck=("${rn[@]}" --batch 4 --nproc 2 --kfac-workers 0.5)
run_metrics ck_u "${ck[@]}"
run_metrics ck_1 "${ck[@]}" --save "$dir/ck" --stop-after 21
run_metrics ck_2 "${ck[@]}" --resume "$dir/ck"
[ "$(steplines "$dir/ck_u.jsonl" | wc -l)" = 64 ] && [ "$(steplines "$dir/ck_u.jsonl")" = "$(steplines "$dir/ck_1.jsonl" "$dir/ck_2.jsonl")" ] \
    && ok "ResNet K-FAC (MEM-OPT) cut at step 21 of 64 and resumed: every step as the uninterrupted run's" \
    || fail "ResNet K-FAC resumed differs from the uninterrupted run: $(steplines "$dir/ck_u.jsonl" | wc -l) lines; $(first_apart "$dir/ck_u.jsonl" "$dir/ck_1.jsonl $dir/ck_2.jsonl")"

# Shampoo over the MLP's tensors, its blocks shared by 2 ranks or held whole by each; against one process at
# --shampoo-eps 1e-6 within 5e-4 (2.2e-5 measured on both BLAS paths at lr 0.003; at lr 0.01 it reaches 1e-3 to 6e-3:
# shampoo_checks.sh says why, its inverse roots amplify a sum's order)
sh=(--model mlp:32 --optimizer shampoo --lr 0.003 --precondition-every 4 --shampoo-block 32 --shampoo-eps 1e-6)
run_metrics sh_one "${sh[@]}" --batch 8
run_metrics sh_two "${sh[@]}" --batch 4 --nproc 2
run_metrics sh_whole "${sh[@]}" --batch 4 --nproc 2 --shampoo-group 1
l=$(worst loss "$dir/sh_one.jsonl" "$dir/sh_two.jsonl" 64)
within "$l" 5e-4 && ok "MLP, Shampoo on 2 ranks x 4 against one process x 8: 64 losses within $l" || fail "Shampoo MLP: losses $l"
[ "$(steplines "$dir/sh_two.jsonl")" = "$(steplines "$dir/sh_whole.jsonl")" ] && ok "MLP, Shampoo: blocks shared by 2 ranks give the steps of blocks held whole" \
    || fail "MLP, Shampoo: shared blocks differ from whole ones: $(first_apart "$dir/sh_two.jsonl" "$dir/sh_whole.jsonl")"

# --eval-every: the test accuracy inside the epoch, with the seconds trained
run_metrics ev "${mlp[@]}" --batch 8 --eval-every 16
[ "$(grep -c '"test_accuracy"' "$dir/ev.jsonl")" = 4 ] && [ "$(grep -o '"epochs":0.2500,"test_accuracy":[0-9.]*,"train_s"' "$dir/ev.jsonl" | wc -l)" = 1 ] \
    && ok "--eval-every 16: test accuracy after steps 16, 32 and 48 and the epoch's end" || fail "--eval-every: $(grep test_accuracy "$dir/ev.jsonl")"

out=$("$DTRAIN" train "${common[@]}" "${mlp[@]}" --batch 4 --nproc 2 --zero 2 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "not with K-FAC, Shampoo or SOAP yet" && ok "K-FAC under ZeRO-2 refused: $(echo "$out" | grep -o 'not with K-FAC.*' | head -1)" \
    || fail "K-FAC under ZeRO-2: $(echo "$out" | tail -2)"
echo "kfac_images: $passed passed, $failed failed"
[ $failed -eq 0 ]
