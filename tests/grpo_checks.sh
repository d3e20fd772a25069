#!/bin/bash
# GRPO (--grpo PROMPTS --reward SPEC) in training runs of a tiny byte-level Llama from random weights: the same
# global batch gives one process's losses, rewards and KL over 10 steps (each loss within 1e-6 relative plus 1e-7)
# with 2 micro-batches, DDP 2 and ZeRO-2 on 2 ranks (the rollouts are drawn from each prompt's place in the stream,
# so every layout decodes the same completions); step 1's KL is 0 (the reference is the starting model); a reward
# program answering what the rule answers trains the same; a second iteration over a rollout reuses its rewards;
# the reward rises over 40 steps; TRL's other settings on DDP 2 (the entropy quantile over every rank's tokens); tool calls run by a program (--grpo-tools) on a model fine-tuned to call; and what
# cannot be is refused before any step.
# usage: grpo_checks.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/checks.sh"
# prompts: the first three words of some of the GPL's lines
awk 'NF >= 3 && length($1 $2 $3) < 24 { print $1, $2, $3 }' /usr/share/common-licenses/GPL-3 | head -n 40 > "$dir/prompts.txt"
shape=(--model llama-tiny --vocab 256 --layers 2 --channels 48 --heads 4 --kv-heads 2 --ffn 96 --max-seq 64 --seq 40
       --grpo "$dir/prompts.txt" --grpo-group 4 --completion-tokens 16 --lr 3e-3 --threads 1)
common=("${shape[@]}" --reward contains:e) # (--reward given again adds a function: runs with another set common to shape)
# The worst difference of FIELD over N steps between two runs (each within 1e-6 relative plus 1e-7): "w bad".
differs() { # FIELD A B N
    paste <(field "$1" "$2") <(field "$1" "$3") |
        awk -v n0="$4" 'BEGIN{w=0; n=0; bad=0} {d=$1-$2; if(d<0)d=-d; a=$1<0?-$1:$1; if(d>1e-6*a+1e-7)bad=1; if(d>w)w=d; n++}
                       END{if(n!=n0) print "missing", 1; else print w, bad}'
}
same() { # WHAT NAME
    local l r k
    l=$(differs loss "$dir/ref.jsonl" "$dir/$2.jsonl" 10)
    r=$(differs reward "$dir/ref.jsonl" "$dir/$2.jsonl" 10)
    k=$(differs kl "$dir/ref.jsonl" "$dir/$2.jsonl" 10)
    [ "${l#* }" = 0 ] && [ "${r#* }" = 0 ] && [ "${k#* }" = 0 ] && ok "$1: the losses over 10 steps within ${l% *}, rewards ${r% *}, KL ${k% *}" ||
        fail "$1: losses ${l% *}, rewards ${r% *}, KL ${k% *}"
}
run_metrics ref --batch 16 --steps 10 && ok "one process: 10 steps of 4 prompts x 4 completions" || fail "one process"
kl1=$(field kl "$dir/ref.jsonl" | head -1)
kls=$(field kl "$dir/ref.jsonl" | tail -1)
awk "BEGIN{exit !($kl1 == 0 && $kls > 0)}" && ok "step 1's KL is 0 (the reference is the starting model), step 10's $kls" || fail "KL: step 1 $kl1, step 10 $kls"
grep -q "GRPO: 40 prompts from .*prompts.txt, 4 completions each (of at most 16 tokens, temperature 1), 4 prompts a step over 1 rank, --reward contains:e; TRL's dapo loss, beta 0.04" "$dir/ref.out" &&
    ok "the start line says what trains ($(grep -m1 "^GRPO" "$dir/ref.out" | cut -c1-100)...)" || fail "start line: $(grep -m1 GRPO "$dir/ref.out")"
grep -q '^  step 1, prompt .*: completion "' "$dir/ref.out" && grep -q '^  step 10, prompt .*: completion "' "$dir/ref.out" &&
    ok "the first and the last rollouts' first completions are shown" || fail "completions shown: $(grep '^  step' "$dir/ref.out")"
for f in reward reward_std kl entropy completion_len clip_ratio frac_reward_zero_std rollout_s rollout_tok_per_s; do
    [ "$(field $f "$dir/ref.jsonl" | wc -l)" = 10 ] || fail "metrics: $f missing"
done
ok "the metrics carry reward, reward_std, kl, entropy, completion_len, clip_ratio, frac_reward_zero_std, rollout_s, rollout_tok_per_s"
run_metrics acc --batch 8 --grad-accum 2 --steps 10 && same "2 micro-batches of 8" acc
run_metrics ddp --batch 8 --nproc 2 --steps 10 && same "DDP 2" ddp
run_metrics z2 --batch 8 --nproc 2 --zero 2 --steps 10 && same "ZeRO-2 on 2 ranks" z2
# a group's completions copy its prompt's keys and values from the first's slot: the same bits as each reading it whole
DTRAIN_PREFIX_REUSE=off run_metrics whole --batch 16 --steps 10 &&
    for f in loss reward kl entropy; do cmp -s <(field $f "$dir/ref.jsonl") <(field $f "$dir/whole.jsonl") || { fail "prefix reuse: $f differs"; break; }; done &&
    awk -v on="$(field rollout_prompt_cached "$dir/ref.jsonl" | head -1)" -v off="$(field rollout_prompt_cached "$dir/whole.jsonl" | sort -u)" \
        'BEGIN{exit !(on >= 0.6 && off == 0)}' &&
    ok "prefix reuse: losses, rewards, KL and entropy of every prompt read whole, the same bits; $(field rollout_prompt_cached "$dir/ref.jsonl" | head -1) of step 1's prompt tokens copied" ||
    fail "prefix reuse: rollout_prompt_cached $(field rollout_prompt_cached "$dir/ref.jsonl" | head -1), read whole $(field rollout_prompt_cached "$dir/whole.jsonl" | sort -u | tr '\n' ' ')"
# TRL's other settings (each against TRL in test_grpo), on DDP 2 as on one process: GSPO's sequence ratios with
# DAPO's clip-higher and the whole batch's standard deviation (every rank's rewards), a rollout trained twice; bnpo
# (each micro-batch's own tokens) against 2 micro-batches; --grpo-mask-truncated leaves out every completion of this
# byte-level model (it has no end of text: each runs to its length), so nothing trains
alike() { # WHAT A B [apart]: apart: A's losses must not be the default run's (ref)
    local l k
    l=$(differs loss "$dir/$2.jsonl" "$dir/$3.jsonl" 10)
    k=$(differs kl "$dir/$2.jsonl" "$dir/$3.jsonl" 10)
    [ "${l#* }" = 0 ] && [ "${k#* }" = 0 ] && { [ -z "${4:-}" ] || ! [ "$(field loss "$dir/$2.jsonl")" = "$(field loss "$dir/ref.jsonl")" ]; } &&
        ok "$1: the losses over 10 steps within ${l% *}, KL ${k% *}${4:+ (not the default run)}" || fail "$1: losses ${l% *}, KL ${k% *}"
}
gspo=(--steps 10 --grpo-iterations 2 --grpo-importance-sampling sequence --grpo-epsilon-high 0.28 --grpo-scale-rewards batch)
run_metrics gspo --batch 16 "${gspo[@]}" && run_metrics gspoddp --batch 8 --nproc 2 "${gspo[@]}" &&
    alike "GSPO's sequence ratios, clip-higher, the batch's standard deviation: DDP 2" gspo gspoddp apart
grep -q "epsilon 0.2, epsilon_high 0.28, a ratio a completion (GSPO), rewards scaled by the batch, 2 iterations a rollout" "$dir/gspo.out" &&
    ok "the start line names them" || fail "GSPO's start line: $(grep -m1 '^GRPO' "$dir/gspo.out")"
run_metrics topp --batch 16 --steps 10 --top-p 0.5 && run_metrics toppddp --batch 8 --nproc 2 --steps 10 --top-p 0.5 &&
    alike "--top-p 0.5 (the nucleus TRL's top_p samples): DDP 2" topp toppddp apart
grep -q "temperature 1, top-p 0.5)" "$dir/topp.out" || fail "--top-p's start line: $(grep -m1 '^GRPO' "$dir/topp.out")"
mp=(--steps 10 --min-p 0.05 --repetition-penalty 1.3)
run_metrics minp --batch 16 "${mp[@]}" && run_metrics minpddp --batch 8 --nproc 2 "${mp[@]}" &&
    alike "--min-p 0.05 --repetition-penalty 1.3 (TRL's min_p, repetition_penalty): DDP 2" minp minpddp apart
grep -q "temperature 1, min-p 0.05, repetition penalty 1.3)" "$dir/minp.out" || fail "--min-p's start line: $(grep -m1 '^GRPO' "$dir/minp.out")"
# the entropy quantile reads every rank's micro-batch together (TRL's gather): DDP 2 as one process, at a temperature
ent=(--steps 10 --temperature 0.7 --grpo-top-entropy-quantile 0.5)
run_metrics ent --batch 16 "${ent[@]}" && run_metrics entddp --batch 8 --nproc 2 "${ent[@]}" &&
    alike "--grpo-top-entropy-quantile 0.5 at --temperature 0.7: DDP 2" ent entddp apart
grep -q "temperature 0.7), .*, the policy term of the top 0.5 of tokens by entropy" "$dir/ent.out" ||
    fail "the entropy quantile's start line: $(grep -m1 '^GRPO' "$dir/ent.out")"
# vespo's weights and the off-policy mask are a completion's: DDP 2 as one process, a rollout trained twice (pi_old apart)
vo=(--steps 10 --grpo-iterations 2 --grpo-loss vespo --grpo-vespo 2,3,2.5,1.5 --grpo-off-policy-mask 0.001)
run_metrics vo --batch 16 "${vo[@]}" && run_metrics voddp --batch 8 --nproc 2 "${vo[@]}" &&
    alike "--grpo-loss vespo with the off-policy mask, 2 iterations a rollout: DDP 2" vo voddp apart
grep -q "TRL's vespo loss, .*, off-policy completions masked above 0.001" "$dir/vo.out" ||
    fail "vespo's start line: $(grep -m1 '^GRPO' "$dir/vo.out")"
# the entropy bonus is a micro-batch's mean (TRL's per device): DDP 2 as 2 micro-batches; it raises the entropy
run_metrics bonus --batch 8 --grad-accum 2 --steps 10 --grpo-entropy-coef 2 &&
    run_metrics bonusddp --batch 8 --nproc 2 --steps 10 --grpo-entropy-coef 2 &&
    alike "--grpo-entropy-coef 2: DDP 2 against 2 micro-batches" bonus bonusddp apart
# adaptive: the coefficient moves by every rank's entropy (the byte model's 5.5 nats, below the target 6: it rises)
ad=(--steps 10 --grpo-entropy-coef 0.5 --grpo-adaptive-entropy 6,0.1,0,1.2)
run_metrics adapt --batch 8 --grad-accum 2 "${ad[@]}" && run_metrics adaptddp --batch 8 --nproc 2 "${ad[@]}" &&
    alike "--grpo-adaptive-entropy 6,0.1,0,1.2: DDP 2 against 2 micro-batches" adapt adaptddp apart
coefs=$(field entropy_coef "$dir/adaptddp.jsonl" | tr '\n' ' ')
[ "$(field entropy_coef "$dir/adaptddp.jsonl" | head -3 | tr '\n' ' ')" = "0.6 0.7 0.8 " ] &&
    [ "$(field entropy_coef "$dir/adaptddp.jsonl" | tail -1)" = 1.2 ] && ok "the coefficient rises by 0.1 a step to its cap: $coefs" ||
    fail "the adaptive coefficient: $coefs"
e0=$(field entropy "$dir/acc.jsonl" | tail -1) e1=$(field entropy "$dir/bonus.jsonl" | tail -1)
awk "BEGIN{exit !($e1 > $e0)}" && ok "the bonus keeps the entropy higher: step 10's $e1 against $e0 without it" ||
    fail "the entropy bonus: step 10's entropy $e1 against $e0 without it"
run_metrics bnpo --batch 8 --grad-accum 2 --steps 10 --grpo-loss bnpo && run_metrics bnpoddp --batch 8 --nproc 2 --steps 10 --grpo-loss bnpo &&
    alike "--grpo-loss bnpo: DDP 2 against 2 micro-batches (every completion here 16 tokens: dapo's too)" bnpo bnpoddp
run_metrics trunc --batch 16 --steps 3 --grpo-mask-truncated
[ "$(field loss "$dir/trunc.jsonl" | awk '$1 != 0 { bad = 1 } END { print NR == 3 && !bad }')" = 1 ] &&
    ok "--grpo-mask-truncated: completions that never end (no end of text) leave the loss (0 each step)" ||
    fail "--grpo-mask-truncated: losses $(field loss "$dir/trunc.jsonl" | tr '\n' ' ')"
# a program that answers what the rule does (1 when the completion holds an "e") trains the same
# (the text after "completion": with JSON's \u00XX escapes of control bytes, whose hex digits may hold an "e", removed)
common=("${shape[@]}")
run_metrics cmd --batch 16 --steps 10 --reward "cmd:sed -e 's/.*\"completion\": \"//' -e 's/\\\\u[0-9a-f]\{4\}//g' | awk '{print (index(\$0, \"e\") > 0)}'" &&
    same "--reward cmd:PROGRAM answering as contains:e" cmd
# several reward functions (TRL's reward_funcs), summed by --reward-weights: contains:e twice at 0.5 each is contains:e
# (its losses exactly); contains:e and count:e at 1 and 0.25 log each one's mean (reward_1, reward_2), whose weighted
# sum is the reward
run_metrics two --batch 16 --steps 10 --reward contains:e --reward contains:e --reward-weights 0.5,0.5 && same "--reward twice at 0.5 each" two
# GDPO's normalize_then_sum: each function in its group, their sum over every rank's completions: DDP 2 as one process
gd=(--steps 10 --reward contains:e --reward count:e --reward-weights 1,0.25 --grpo-multi-objective normalize_then_sum)
run_metrics gdpo --batch 16 "${gd[@]}" && run_metrics gdpoddp --batch 8 --nproc 2 "${gd[@]}" &&
    alike "--grpo-multi-objective normalize_then_sum (GDPO), two functions: DDP 2" gdpo gdpoddp apart
run_metrics mix --batch 16 --steps 3 --reward contains:e --reward count:e --reward-weights 1,0.25
sums=$(paste <(field reward "$dir/mix.jsonl") <(field reward_1 "$dir/mix.jsonl") <(field reward_2 "$dir/mix.jsonl") |
       awk '{ d = $1 - ($2 + 0.25 * $3); if (d < 0) d = -d; if (d > 1e-5 || $3 < $2) bad = 1 } END { print NR == 3 && !bad }')
[ "$sums" = 1 ] && grep -q -- "--reward contains:e x 1 + --reward count:e x 0.25; TRL's dapo loss" "$dir/mix.out" &&
    ok "--reward contains:e --reward count:e --reward-weights 1,0.25: each step's reward is reward_1 + 0.25 reward_2 ($(field reward_2 "$dir/mix.jsonl" | head -1) e's a completion at step 1)" ||
    fail "several rewards: $(paste -d/ <(field reward "$dir/mix.jsonl") <(field reward_1 "$dir/mix.jsonl") <(field reward_2 "$dir/mix.jsonl") | tr '\n' ' ') $(grep -m1 '^GRPO' "$dir/mix.out")"
refused "weights that do not match the rewards" "2 weights for 1 --reward functions" --reward contains:e --reward-weights 1,2
common=("${shape[@]}" --reward contains:e)
run_metrics it2 --batch 16 --steps 4 --grpo-iterations 2 --grpo-loss grpo
r=($(field reward "$dir/it2.jsonl"))
c=($(field clip_ratio "$dir/it2.jsonl"))
[ "${#r[@]}" = 4 ] && [ "${r[0]}" = "${r[1]}" ] && [ "${r[2]}" = "${r[3]}" ] && [ "${c[0]}" = 0.000000 ] &&
    ok "--grpo-iterations 2: each rollout trains 2 steps (rewards ${r[*]}; clip ratios ${c[*]})" || fail "--grpo-iterations 2: rewards ${r[*]:-none}, clip ${c[*]:-none}"
run_metrics learn --batch 16 --steps 40
r=($(field reward "$dir/learn.jsonl"))
awk -v a="${r[*]:0:10}" -v b="${r[*]:30:10}" 'BEGIN{n=split(a,x," "); split(b,y," "); for(i=1;i<=n;i++){s+=x[i]; t+=y[i]} exit !(n == 10 && t/10 > s/10 + 0.2)}' &&
    ok "the reward rises: mean $(echo "${r[*]:0:10}" | awk '{for(i=1;i<=NF;i++)s+=$i; printf "%.3f", s/NF}') over the first 10 steps, $(echo "${r[*]:30:10}" | awk '{for(i=1;i<=NF;i++)s+=$i; printf "%.3f", s/NF}') over the last 10" ||
    fail "the reward did not rise: ${r[*]:-none}"
refused "tensor parallelism" "not with tensor, pipeline or context parallelism" --nproc 2 --tp 2
refused "ZeRO-3" "not with zero3" --nproc 2 --zero 3
refused "GDPO with the batch's scaling" "scaled over the whole batch already" --grpo-multi-objective normalize_then_sum --grpo-scale-rewards batch
refused "a vespo shape of three numbers" "--grpo-vespo" --grpo-loss vespo --grpo-vespo 1,2,3
refused "LoRA" "not with LoRA" --lora-rank 4
refused "--data beside --grpo" "not with --data" --data "$dir/prompts.txt"
refused "rows that are not whole groups" "must be whole groups" --grpo-group 3
refused "a missing --reward" "--reward SPEC is required" --reward "" --grpo-group 2
refused "an unknown reward" "--reward regex:x: contains:WORD" --reward regex:x --grpo-group 2
refused "--chat-template-kwargs that is not JSON" "--chat-template-kwargs {x: not JSON" --chat-template-kwargs "{x" --grpo-group 2
refused "--chat-template-kwargs of a key it does not read" "holds 'tools': enable_thinking" --chat-template-kwargs '{"tools": []}' --grpo-group 2
"$DTRAIN" train --model llama-tiny --vocab 256 --reward contains:e --steps 1 > "$dir/noprompts.out" 2>&1
[ $? -ne 0 ] && grep -q "give the prompts with --grpo FILE" "$dir/noprompts.out" && ok "--reward without --grpo refused" || fail "--reward alone: $(tail -1 "$dir/noprompts.out")"
refused "a missing prompts file" "--grpo $dir/none.txt" --grpo "$dir/none.txt" --grpo-group 2
: > "$dir/empty.txt"
refused "an empty prompts file" "no prompts" --grpo "$dir/empty.txt" --grpo-group 2
printf '{"prompt": "a"}\n{"text": "b"}\n' > "$dir/bad.jsonl"
refused "a .jsonl line without a prompt" "bad.jsonl:2: no \"prompt\" text" --grpo "$dir/bad.jsonl" --grpo-group 2
printf 'The\n\0b\n' > "$dir/nul.txt"
refused "a NUL byte in the prompts file" "nul.txt: byte 4 is a NUL" --grpo "$dir/nul.txt" --grpo-group 2
printf '{"prompt": "a\\u0000b"}\n' > "$dir/nul.jsonl"
refused "a NUL (\\u0000) in a .jsonl prompt" "nul.jsonl:1: holds a NUL character" --grpo "$dir/nul.jsonl" --grpo-group 2
printf '{"prompt": "caf\351"}\n' > "$dir/latin1.jsonl"
refused "a .jsonl prompt in Latin-1" "latin1.jsonl:1: byte 15 of the line (0xe9) starts no UTF-8" --grpo "$dir/latin1.jsonl" --grpo-group 2
printf '{"prompt": [{"role": "user", "content": "hi"}]}\n' > "$dir/chat.jsonl"
refused "a conversational prompt without a tokenizer and a template" "chat.jsonl:1: a conversational prompt needs a tokenizer and a chat template" \
    --grpo "$dir/chat.jsonl" --grpo-group 2
# conversational prompts through a template (their tokens against apply_chat_template's: test_sft): a run of 2 steps
# with Llama 3.1's, its rollouts shown as completions of the rendered prompt, a reward program reading their messages
mkdir -p "$dir/tok" && cp "$(dirname "$0")/fixtures/sft/llama3_tokenizer.json" "$dir/tok/tokenizer.json" # (no tokenizer_config.json)
printf '{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}\n{"prompt": [{"role": "user", "content": "Say yes."}]}\n' > "$dir/chat2.jsonl"
"$DTRAIN" train --model llama-tiny --vocab 2006 --layers 2 --channels 48 --heads 4 --kv-heads 2 --ffn 96 --max-seq 128 --seq 96 \
    --tokenizer "$dir/tok/tokenizer.json" --chat-template llama3.1 --grpo "$dir/chat2.jsonl" --grpo-group 2 \
    --chat-template-kwargs '{"date_string": "01 Jan 2025"}' \
    --reward "cmd:tee -a $dir/chat2.seen | awk '{ print (index(\$0, \"e\") > 0) }'" \
    --batch 4 --completion-tokens 8 --steps 2 --threads 1 > "$dir/chat2.out" 2>&1 && grep -q "GRPO: 2 prompts from" "$dir/chat2.out" &&
    grep -qF 'step 1, prompt <|begin_of_text|><|start_header_id|>system<|end_header_id|>' "$dir/chat2.out" &&
    grep -qF 'Today Date: 01 Jan 2025' "$dir/chat2.out" &&
    [ "$(grep -cF '{"prompt": [{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}], "completion": [{"role": "assistant", "content": "' \
        "$dir/chat2.seen")" = 4 ] && [ "$(wc -l < "$dir/chat2.seen")" = 8 ] &&
    ok "conversational prompts by Llama 3.1's template (--chat-template-kwargs' date): 2 steps, the reward program reading their messages" ||
    fail "conversational prompts: $(tail -2 "$dir/chat2.out")"
# with tools a prompt is rendered by the template's training form, as TRL's GRPOTrainer renders it then (Qwen 3's: an
# earlier answer keeps its think block, which the template drops before the last query): test_sft holds its text
mkdir -p "$dir/qtok" && cp "$(dirname "$0")/fixtures/sft/tokenizer.json" "$dir/qtok/tokenizer.json"
printf '{"prompt": [{"role": "user", "content": "Yes?"}, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again?"}], "tools": []}\n' > "$dir/q3.jsonl"
q3_run() { # NAME ARGS...: one step of Qwen 3's prompt from a random model
    local name=$1
    shift
    "$DTRAIN" train --model llama-tiny --vocab 2000 --layers 1 --channels 32 --heads 2 --kv-heads 2 --ffn 64 --max-seq 96 --seq 96 \
        --tokenizer "$dir/qtok/tokenizer.json" --chat-template qwen3 --grpo "$dir/q3.jsonl" --grpo-group 2 --reward contains:e \
        --batch 2 --completion-tokens 4 --steps 1 --threads 1 "$@" > "$dir/$name.out" 2>&1
}
q3_run q3gen && q3_run q3tools --grpo-tools 'cmd:cat' && ! grep -qx '</think>' "$dir/q3gen.out" &&
    [ "$(grep -A3 -x '<|im_start|>assistant' "$dir/q3tools.out" | grep -cx '</think>')" = 1 ] &&
    ok "--grpo-tools: a prompt's earlier answer by Qwen 3's training form (its empty think block kept; without tools, dropped)" ||
    fail "GRPO prompts' form with tools: $(grep -A4 'step 1, prompt' "$dir/q3tools.out" | head -8)"
# the reward program's lines keep a float a float, as json.dumps writes it (an earlier call's {"x": 2.0}, not 2)
printf '%s\n' '{"prompt": [{"role": "user", "content": "Scale 2."}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "scale", "arguments": {"x": 2.0, "k": 3}}}]}, {"role": "tool", "name": "scale", "content": "4.0"}, {"role": "user", "content": "Again?"}]}' > "$dir/q3f.jsonl"
q3_run q3float --max-seq 160 --seq 160 --grpo "$dir/q3f.jsonl" --reward "cmd:tee -a $dir/q3f.seen | awk '{ print 1 }'"
[ "$(grep -cF '"arguments":{"x":2.0,"k":3}' "$dir/q3f.seen" 2> /dev/null)" = 2 ] &&
    ok "the reward program reads an earlier call's arguments as written ({\"x\":2.0,\"k\":3}, a float kept)" ||
    fail "floats in the reward's lines: $(head -c 600 "$dir/q3f.seen" 2> /dev/null) $(tail -1 "$dir/q3float.out")"
# ---- tools (--grpo-tools): a model fine-tuned on one chat that calls add twice (each result "5") and then answers
# (Llama 3.1's template, its tools in the prompt's line) rolls out the calls; the program runs them (one {"name",
# "arguments"} line in, a result line out), each result goes in as the template writes it and the completion goes on;
# the reward program reads the answers with their calls and the results; DDP 2 gives one process's losses, rewards and
# completions; --grpo-tool-turns 1 stops after one round (the results' tokens unscored: test_grpo) ----
m="$dir/calls"
tool_model "$m" "$(dirname "$0")/fixtures" llama3_1 llama3_tokenizer.json llama3.1 "<|eot_id|>" 2
tools_run() { # NAME ARGS...: 2 steps of 2 completions of each prompt with the tool-calling model
    local name=$1
    shift
    "$DTRAIN" train --model "$m/model" --grpo "$m/prompts.jsonl" --grpo-group 2 --seq 1000 --completion-tokens 160 --steps 2 --threads 1 \
        --grpo-tools "cmd:tee -a $m/$name.calls | awk '{ print 5 }'" --reward "cmd:tee -a $m/$name.seen | awk '{ print length(\$0) % 3 }'" \
        --metrics "$m/$name.jsonl" "$@" > "$m/$name.out" 2>&1
}
want_call='{"name": "add", "arguments": {"a": 2, "b": 3}, "completion": [0-7]}'
# the completions' numbers of a run's calls: a completion that called in two rounds gives its number twice, the same
# Whether every step of a metrics file that made calls logged tool_failures 1 (a step without calls logs 0), and one did.
all_failed() { paste <(field tool_calls "$1") <(field tool_failures "$1") | awk '$1 > 0 { n++; if ($2 != "1.0000") bad = 1 } END { exit !(n > 0 && !bad) }'; }
numbers() { grep -o '"completion": [0-9]*' "$1" | cut -d' ' -f2 | sort -n | uniq -c | awk '{ printf "%s%dx%d", (NR > 1 ? " " : ""), $2, $1 }'; }
turn='"tool_calls":[{"type":"function","function":{"name":"add","arguments":{"a":2,"b":3}}}]},{"role":"tool","name":"add","content":"5"},{"role":"assistant","content":"'
if tools_run one --batch 4; then
    calls=$(grep -c . "$m/one.calls")
    turns=$(grep -cF "$turn" "$m/one.seen")
    twice=$(grep -cF "$turn\",$turn" "$m/one.seen") # (a call, its result, a call with no text, its result, an answer)
    logged=$(field tool_calls "$m/one.jsonl" | awk '{ s += $1 * 4 } END { printf "%d", s + 0.5 }') # (a step's mean over its 4)
    [ "$calls" -gt 0 ] && [ "$(grep -cx "$want_call" "$m/one.calls")" = "$calls" ] && [ "$turns" -gt 0 ] && [ "$twice" -gt 0 ] &&
        numbers "$m/one.calls" | grep -q "x2" && ! numbers "$m/one.calls" | grep -q "x[3-9]" &&
        grep -q "GRPO: a completion's tool calls (Llama 3.1's form) run by --grpo-tools cmd:.*, as many rounds as a row holds" "$m/one.out" &&
        [ "$logged" = "$calls" ] && [ "$(field tool_failures "$m/one.jsonl" | sort -u)" = 0.0000 ] &&
        ok "--grpo-tools: $calls calls of add(2, 3) in 8 completions (the metrics' tool_calls too; completion x calls: $(numbers "$m/one.calls")), each run by the program; $turns completions went on after a result ($twice after two), the reward reading the calls, the results and the answers" ||
        fail "--grpo-tools: calls '$(head -2 "$m/one.calls")' (completion x calls: $(numbers "$m/one.calls"); logged $logged), reward lines '$(head -c 900 "$m/one.seen")'"
    tools_run ddp --nproc 2 --batch 2
    l=$(differs loss "$m/one.jsonl" "$m/ddp.jsonl" 2)
    r=$(differs reward "$m/one.jsonl" "$m/ddp.jsonl" 2)
    [ "${l#* }" = 0 ] && [ "${r#* }" = 0 ] && [ "$(sort "$m/ddp.calls" | uniq -c)" = "$(sort "$m/one.calls" | uniq -c)" ] &&
        [ "$(sort "$m/ddp.seen")" = "$(sort "$m/one.seen")" ] &&
        ok "--grpo-tools on DDP 2: one process's calls, completions, rewards and losses (within ${l% *})" || fail "--grpo-tools DDP 2: losses ${l% *}, rewards ${r% *}"
    # a turn after a tool's result finds the completion's earlier turns in its slot: only the result is read
    DTRAIN_PREFIX_REUSE=off tools_run whole --batch 4
    cached=$(field rollout_prompt_cached "$m/one.jsonl" | tr '\n' ' ')
    cmp -s <(field loss "$m/one.jsonl") <(field loss "$m/whole.jsonl") && cmp -s "$m/one.seen" "$m/whole.seen" &&
        [ "$(field rollout_prompt_cached "$m/whole.jsonl" | sort -u)" = 0.0000 ] && awk -v c="${cached%% *}" 'BEGIN { exit !(c >= 0.6) }' &&
        ok "--grpo-tools: the losses and completions of every turn's prompt read whole, the same bits; the prompt tokens a cache slot gave: $cached" ||
        fail "--grpo-tools, prefix reuse: cached $cached, losses $(field loss "$m/one.jsonl" | tr '\n' ' ') against $(field loss "$m/whole.jsonl" | tr '\n' ' ')"
    tools_run once --batch 4 --grpo-tool-turns 1
    [ "$(grep -c . "$m/once.calls")" = "$(grep -cF "$turn" "$m/once.seen")" ] && ! grep -q '"role":"tool".*"role":"tool"' "$m/once.seen" &&
        [ "$(grep -c . "$m/once.calls")" -lt "$calls" ] &&
        ok "--grpo-tool-turns 1: one round of calls a completion ($(grep -c . "$m/once.calls") calls, each followed by one answer; $calls without it)" ||
        fail "--grpo-tool-turns 1: $(grep -c . "$m/once.calls") calls, $(grep -cF "$turn" "$m/once.seen") completions with a result"
    # proc: one program for the run (each rank's own, started once), a result line written a call as it reads them:
    # the calls, rewards and losses of cmd:'s program a round, on one process and on DDP 2
    printf 'echo started >> "$1/$2.starts"\nwhile read -r l; do echo "$l" >> "$1/$2.calls"; echo 5; done\n' > "$m/tool.sh"
    tools_run proc --batch 4 --grpo-tools "proc:sh $m/tool.sh $m proc"
    tools_run procddp --nproc 2 --batch 2 --grpo-tools "proc:sh $m/tool.sh $m procddp"
    l=$(differs loss "$m/one.jsonl" "$m/proc.jsonl" 2)
    r=$(differs reward "$m/one.jsonl" "$m/proc.jsonl" 2)
    l2=$(differs loss "$m/one.jsonl" "$m/procddp.jsonl" 2)
    [ "${l#* }" = 0 ] && [ "${r#* }" = 0 ] && [ "${l2#* }" = 0 ] && [ "$(grep -c . "$m/proc.starts")" = 1 ] &&
        [ "$(grep -c . "$m/procddp.starts")" = 2 ] && [ "$(sort "$m/proc.calls")" = "$(sort "$m/one.calls")" ] &&
        [ "$(sort "$m/procddp.calls")" = "$(sort "$m/one.calls")" ] &&
        ok "--grpo-tools proc: one program a rank for the whole run ($(grep -c . "$m/proc.calls") calls over 2 steps): cmd:'s calls, rewards and losses, on DDP 2 too" ||
        fail "--grpo-tools proc: losses ${l% *} / ${l2% *}, rewards ${r% *}, starts $(grep -c . "$m/proc.starts" 2> /dev/null) / $(grep -c . "$m/procddp.starts" 2> /dev/null): $(tail -1 "$m/proc.out")"
    tools_run procdies --batch 4 --grpo-tools "proc:read l; exit 3"
    [ $? -ne 0 ] && grep -q -- "--grpo-tools proc:read l; exit 3: it ended after 0 of [0-9]* result lines (exited with status 3)" "$m/procdies.out" &&
        ok "--grpo-tools proc: a program that ends mid-run: the run ends naming it and its status" || fail "a proc program that dies: $(tail -1 "$m/procdies.out")"
    # a result {"error": ...} is a failed call (TRL's where a tool raises): the model reads it, the metrics count it
    tools_run fails --batch 4 --grpo-tool-turns 1 --grpo-tools "cmd:tee -a $m/fails.calls | sed 's/.*/{\"error\": \"busy\"}/'"
    erred='{"role":"tool","name":"add","content":"{\"error\": \"busy\"}"}'
    [ "$(grep -c . "$m/fails.calls")" -gt 0 ] && [ "$(grep -cF "$erred" "$m/fails.seen")" = "$(grep -c . "$m/fails.calls")" ] &&
        all_failed "$m/fails.jsonl" &&
        ok "--grpo-tools: a program's {\"error\": ...} results, each read by the model, counted in the metrics' tool_failures (1 of 1)" ||
        fail "--grpo-tools' failed calls: tool_failures $(field tool_failures "$m/fails.jsonl" | tr '\n' ' '), $(grep -c . "$m/fails.calls") calls"
    # every end the model's generation_config.json lists ends a completion (TRL's eos_token_ids: Llama 3.1's <|eom_id|>
    # after a built-in call): listing "{", the answers' first token (their call's opening), ends each there, kept and
    # scored, with no call to run; an id beyond the vocabulary is refused naming the file
    open=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["vocab"]["{"])' "$m/model/tokenizer.json")
    echo "{\"eos_token_id\": [$open, 0]}" > "$m/model/generation_config.json"
    tools_run ends --batch 4
    [ ! -s "$m/ends.calls" ] && [ "$(field completion_len "$m/ends.jsonl" | awk '$1 != 1 { bad = 1 } END { print NR && !bad }')" = 1 ] &&
        [ "$(field tool_calls "$m/ends.jsonl" | awk '$1 != 0 { bad = 1 } END { print NR && !bad }')" = 1 ] &&
        ok "generation_config.json's eos_token_id [$open, 0]: every completion ends at its first token, '{' (completion_len 1, no calls)" ||
        fail "GRPO and generation_config's ends: completion_len $(field completion_len "$m/ends.jsonl" | tr '\n' ' '), calls '$(head -1 "$m/ends.calls" 2> /dev/null)': $(tail -1 "$m/ends.out")"
    echo '{"eos_token_id": [1, 99999999]}' > "$m/model/generation_config.json"
    tools_run badends --batch 4
    [ $? -ne 0 ] && grep -q "generation_config.json: eos_token_id holds a number, not a token id of the model's" "$m/badends.out" &&
        ok "GRPO: a generation_config.json whose eos_token_id is no token refused naming it" || fail "GRPO, bad generation_config: $(tail -1 "$m/badends.out")"
    rm "$m/model/generation_config.json"
else
    fail "--grpo-tools: $(tail -2 "$m/one.out")"
fi
# a call of a tool the prompt's line does not offer (a model fine-tuned on the chat with add left out of its tools) is
# answered "not found" (TRL's), the program not asked
u="$dir/unoffered"
if tool_model "$u" "$(dirname "$0")/fixtures" llama3_1 llama3_tokenizer.json llama3.1 "<|eot_id|>" 1 add; then
    m=$u tools_run plus --batch 4 --grpo-tool-turns 1
    notfound='{"role":"tool","name":"add","content":"{\"error\": \"Tool add not found.\"}"}'
    n=$(grep -cF "$notfound" "$u/plus.seen" 2> /dev/null)
    [ "${n:-0}" -gt 0 ] && [ ! -s "$u/plus.calls" ] && all_failed "$u/plus.jsonl" &&
        ok "--grpo-tools: $n completions' calls of add, which the prompt does not offer, answered 'Tool add not found.' (tool_failures 1), the program not run" ||
        fail "--grpo-tools, a tool not offered: $(tail -1 "$u/plus.out"); ${n:-0} answered, the program's calls '$(head -1 "$u/plus.calls" 2> /dev/null)', tool_failures $(field tool_failures "$u/plus.jsonl" | tr '\n' ' ')"
fi
# the same by Qwen 2.5's template (Hermes's <tool_call> blocks, its results in a user turn of <tool_response>)
q="$dir/calls_qwen"
if tool_model "$q" "$(dirname "$0")/fixtures" qwen2_5 tokenizer.json qwen2.5 "<|im_end|>" 2 &&
    "$DTRAIN" train --model "$q/model" --grpo "$q/prompts.jsonl" --grpo-group 2 --batch 4 --seq 1000 --completion-tokens 256 --steps 2 \
        --threads 1 --grpo-tools "cmd:tee -a $q/calls | awk '{ print 5 }'" --reward "cmd:tee -a $q/seen | awk '{ print 1 }'" \
        --metrics "$q/run.jsonl" > "$q/run.out" 2>&1; then
    calls=$(grep -c . "$q/calls")
    [ "$calls" -gt 0 ] && [ "$(grep -cx "$want_call" "$q/calls")" = "$calls" ] && [ "$(grep -cF "$turn\",$turn" "$q/seen")" -gt 0 ] &&
        ok "--grpo-tools by Qwen 2.5's template: $calls calls of add(2, 3) in 8 completions, $(grep -cF "$turn\",$turn" "$q/seen") going on after two results" ||
        fail "--grpo-tools by Qwen 2.5's: calls '$(head -2 "$q/calls")', reward lines '$(head -c 900 "$q/seen")'"
else
    fail "--grpo-tools by Qwen 2.5's: $(tail -2 "$q/run.out" 2> /dev/null)"
fi
"$DTRAIN" train --model "$m/model" --grpo "$m/prompts.jsonl" --grpo-group 2 --batch 2 --seq 1000 --completion-tokens 96 --steps 1 \
    --threads 1 --grpo-tools "cmd:cat > /dev/null" --reward contains:e > "$m/silent.out" 2>&1
[ $? -ne 0 ] && grep -q -- "--grpo-tools cmd:cat > /dev/null: 0 result lines for 2 calls" "$m/silent.out" &&
    ok "a tool program that answers nothing: the run ends naming it" || fail "a silent tool program: $(tail -2 "$m/silent.out")"
refused "--grpo-tools that is not cmd: or proc:" "--grpo-tools run.sh: cmd:COMMAND (a program a round" --grpo-tools run.sh --grpo-group 2
refused "--grpo-tools without a template that renders tool calls" "renders tool calls" --grpo-tools "cmd:cat" --grpo-group 2
"$DTRAIN" train --model llama-tiny --vocab 256 --grpo-tools cmd:cat --steps 1 > "$dir/notools.out" 2>&1
[ $? -ne 0 ] && grep -q "give the prompts with --grpo FILE" "$dir/notools.out" && ok "--grpo-tools without --grpo refused" ||
    fail "--grpo-tools alone: $(tail -1 "$dir/notools.out")"
head -c 300 /usr/share/common-licenses/GPL-3 | tr '\n' ' ' > "$dir/long.txt"
refused "a prompt longer than a row" "long.txt:1: the prompt is 300 tokens" --grpo "$dir/long.txt" --grpo-group 2
# the boundary: a row of --seq 40 holds a 39-byte prompt and a completion token, not a 40-byte one
head -c 40 "$dir/long.txt" > "$dir/edge40.txt"
refused "a prompt as long as a row" "edge40.txt:1: the prompt is 40 tokens" --grpo "$dir/edge40.txt" --grpo-group 2
head -c 39 "$dir/long.txt" > "$dir/edge39.txt"
"$DTRAIN" train "${common[@]}" --batch 2 --grpo "$dir/edge39.txt" --grpo-group 2 --steps 1 > "$dir/edge39.out" 2>&1 &&
    grep -q "^step 1/1" "$dir/edge39.out" && ok "a prompt one token shorter than a row trains" || fail "a 39-byte prompt: $(tail -2 "$dir/edge39.out")"
refused "a reward program that fails" "--reward cmd:exit 7: exited with status 7" --reward "cmd:exit 7" --grpo-group 2
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
