# Sourced by the training test scripts: a scratch directory removed on exit,
# and the ok/fail counters every script reports with.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
ok() { echo "ok   $*"; passed=$((passed + 1)); }
# $dir/train.bin: the first 200000 bytes of the GPL as byte tokens (the training scripts' text); exits on failure.
gpl_tokens() {
    head -c 200000 /usr/share/common-licenses/GPL-3 > "$dir/text"
    "$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
}
# Damages FILE: N bytes (1) from OFFSET inverted, so that it surely changes (writing a fixed byte leaves a file alone
# where that byte was already there).
flip() { # FILE OFFSET [N]
    local f=$1 at=$2 n=${3:-1} i b
    for ((i = 0; i < n; i++)); do
        b=$(od -An -tu1 -j $((at + i)) -N1 "$f" | tr -d ' ')
        printf "\\$(printf '%03o' $((b ^ 255)))" | dd of="$f" bs=1 seek=$((at + i)) conv=notrunc 2> /dev/null
    done
}
# The DOM of the page FILE after its scripts ran, by headless BROWSER, into OUT (its messages in OUT.err); exits as
# chromium did, 124 past 120 s. Into a file, not a pipe: a helper chromium leaves behind keeps a pipe's write end
# open, and $(...) would wait on it with no limit (crashpad's handler runs in a session of its own, which timeout's
# signal to its process group does not reach); those left are ended here by the profile folder their arguments name.
render_dom() { # BROWSER FILE OUT
    local profile=$dir/browser-profile rc
    HOME="$dir" timeout -k 5 120 "$1" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$profile" \
        --virtual-time-budget=10000 --dump-dom "file://$2" > "$3" 2> "$3.err" < /dev/null
    rc=$?
    pkill -KILL -f -- "$profile" 2> /dev/null
    return $rc
}
# A tiny Llama fine-tuned on one chat that asks "2 + 3?" and calls add(2, 3) CALLS times (each result "5") before it
# answers "5.", by template KIND with the tools of FIXTURES/sft/FIX_prompts.json and its tokenizer TOKENIZER (eos EOS),
# exported as an HF folder DIR/model (tokenizer and template in it); DIR/request.json the chat request that asks the
# question with the tools, DIR/prompts.jsonl a GRPO prompt of it. Returns 1, saying so, when it could not be made.
tool_model() { # DIR FIXTURES FIX TOKENIZER KIND EOS CALLS [UNOFFERED: a tool left out of its chat's and prompt's tools]
    local m=$1 fix=$2/sft
    mkdir -p "$m"
    python3 -c 'import json, sys
cases = json.load(open(sys.argv[1]))
tools = [t for t in next(c["tools"] for c in cases["cases"] if c.get("tools")) if t["function"]["name"] != sys.argv[5]]
call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
msgs = [{"role": "user", "content": "2 + 3?"}]
turns = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "5"}] * int(sys.argv[4])
print(json.dumps({"messages": msgs + turns + [{"role": "assistant", "content": "5."}], "tools": tools}), file=open(sys.argv[2] + "/chat.jsonl", "w"))
print(json.dumps({"prompt": msgs, "tools": json.dumps(tools)}), file=open(sys.argv[2] + "/prompts.jsonl", "w"))
json.dump({"chat_template": cases["chat_template"], "eos_token": sys.argv[3]}, open(sys.argv[2] + "/tokenizer_config.json", "w"))
print(json.dumps({"messages": msgs, "tools": tools, "max_tokens": 64, "temperature": 0}), file=open(sys.argv[2] + "/request.json", "w"))' \
        "$fix/$3_prompts.json" "$m" "$6" "$7" "${8:-}" && cp "$fix/$4" "$m/tokenizer.json" &&
        "$DTRAIN" train --model llama-tiny --data "$m/chat.jsonl" --tokenizer "$m/tokenizer.json" --chat-template "$5" --layers 2 \
            --channels 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 2048 --max-seq 1024 --seq 1023 --batch 1 --steps 150 --lr 3e-3 \
            --threads 2 --quiet --save "$m/ck" > "$m/sft.log" 2>&1 && "$DTRAIN" ckpt export "$m/ck" "$m/model" > /dev/null 2>&1 &&
        cp "$m/tokenizer.json" "$m/tokenizer_config.json" "$m/model/" || { fail "fine-tuning a tool-calling model ($5): $(tail -2 "$m/sft.log")"; return 1; }
}
# FIELD's values in a metrics file, one a line.
field() { grep -o "\"$1\":[0-9.e+-]*" "$2" | cut -d: -f2; }
# The worst relative difference of FIELD between two metrics files, or "missing" unless each has N of them (20).
worst() { # FIELD A B [N]
    paste <(field "$1" "$2") <(field "$1" "$3") |
        awk -v n0="${4:-20}" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=n0) print "missing"; else print w}'
}
# One training run ("$DTRAIN" train "${common[@]}" ARGS) with its metrics in
# $dir/NAME.jsonl; a failed run is a failed check (the comparisons chained after
# it with && do not run): it says its last lines and returns 1.
run_metrics() { # NAME ARGS...
    local name=$1
    shift
    "$DTRAIN" train "${common[@]}" "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
        { fail "run $name: $(grep -v oversubscribed "$dir/$name.out" | tail -2)"; return 1; }
}
# A training run the caller's "${common[@]}" --batch 2 ARGS describe is
# refused before any step, with EXPECTED in what it says.
refused() { # WHAT EXPECTED ARGS...
    local what=$1 want=$2
    shift 2
    local out
    out=$("$DTRAIN" train "${common[@]}" --batch 2 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^step"; then ok "$what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else fail "$what: $(echo "$out" | tail -2)"; fi
}
# Rank 1 of a training job ("$DTRAIN" train ARGS, in the background)
# killed by SIGKILL WAIT seconds after its first step: the job ends within a
# second (the promise; 30x what it takes), and the first error another rank
# says names rank 1 and matches PATTERN (a grep pattern; "." for any). The
# first step is waited for (a busy machine may take long to start the ranks:
# a kill before they trained found them joining the world).
killed_rank1() { # WHAT WAIT PATTERN ARGS...
    local what=$1 wait=$2 pattern=$3 launcher victim="" t0 secs said p i
    shift 3
    rm -f "$dir/kill.jsonl"
    "$DTRAIN" train "$@" --metrics "$dir/kill.jsonl" > /dev/null 2> "$dir/kill.err" &
    launcher=$!
    for ((i = 0; i < 2400; i++)); do [ -s "$dir/kill.jsonl" ] && break; sleep 0.05; done
    sleep "$wait"
    for p in $(pgrep -P $launcher); do grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2> /dev/null && victim=$p; done
    if [ -z "$victim" ]; then
        fail "$what: rank 1 not found (steps taken: $(wc -l < "$dir/kill.jsonl" 2> /dev/null || echo none); $(head -c 300 "$dir/kill.err"))"
        kill $launcher; wait $launcher; return
    fi
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait $launcher
    secs=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
    said=$(grep "rank [0-9]*\] error" "$dir/kill.err" | grep -v "rank 1\] error" | awk -F '] error' '!seen[$1]++')
    if awk "BEGIN{exit !($secs < 1.0)}" && echo "$said" | grep -q "rank 1 (pid $victim) \(was killed by signal 9\|died\)" &&
        echo "$said" | grep -q "$pattern"; then
        ok "$what: the job ended after $secs s; $(echo "$said" | head -1)"
    else
        fail "$what: $secs s; $(cat "$dir/kill.err")"
    fi
}
# The planner's state of a second-order optimizer on the rank holding most, in MiB ("$DTRAIN" plan ARGS --json).
plan_precond_mib() {
    "$DTRAIN" plan "$@" --json 2> /dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["breakdown"]["memory"]["precond_state"] / 1048576)'
}
# Whether each pair of numbers (planned, measured ...) is within 5% of each other.
within5() { awk -v l="$*" 'BEGIN{n = split(l, x, " "); for (i = 1; i < n; i += 2) { r = x[i] > x[i+1] ? x[i] / x[i+1] - 1 : x[i+1] / x[i] - 1; if (!(r <= 0.05)) exit 1 } exit !(n >= 2 && n % 2 == 0)}'; }
# The MiB a one-step training run ("$DTRAIN" train ARGS --steps 1) says after WORDS ("decompositions", "its state").
logged_mib() { # WORDS ARGS...
    local words=$1
    shift
    "$DTRAIN" train "$@" --steps 1 2>&1 | grep -o "$words [0-9.]* MiB" | grep -o "[0-9.]*"
}
# A second-order optimizer under expert parallelism (soap_checks.sh, shampoo_checks.sh), with the caller's "${moe[@]}"
# (a mixture, 10 steps, --quiet): EP 2 on 2 ranks, on 4 (each expert on 2), and EP 2 x TP 2, its shared state against
# every rank all (GROUP-FLAG 1) bit for bit; saved at step 5 and resumed, the uninterrupted run's weights bit for bit; resumed
# without EP (a checkpoint unit a global expert's) its state loaded, not afresh, the losses within 1e-3 of EP 2's (a
# state lost or misplaced parts them far more); against DDP 2 said, not held; the planner's state on the fullest rank
# against the run's (WORDS before its MiB in the run's log).
ep_state_checks() { # NAME GROUP-FLAG WORDS
    local name=$1 group=$2 words=$3 w=missing a run_mib plan_mib loud=()
    ep_run() { local n=$1; shift; "$DTRAIN" train "${moe[@]}" "$@" --metrics "$dir/$n.jsonl" --save "$dir/$n" > "$dir/$n.out" 2>&1; }
    w10() { echo "$dir/$1/step-00000010/params.f32"; }
    if ep_run ep2 --nproc 2 --ep 2 --batch 2 && ep_run ep2_1 --nproc 2 --ep 2 --batch 2 "$group" 1 && cmp -s "$(w10 ep2)" "$(w10 ep2_1)"; then
        ok "$name, EP 2 on 2 ranks: shared against every rank all, the same weights bit for bit (loss $(field loss "$dir/ep2.jsonl" | head -1) -> $(field loss "$dir/ep2.jsonl" | tail -1))"
    else fail "$name, EP 2 on 2 ranks: $(grep -v oversubscribed "$dir/ep2_1.out" | tail -1)"; fi
    if ep_run ep4 --nproc 4 --ep 2 --batch 1 && ep_run ep4_1 --nproc 4 --ep 2 --batch 1 "$group" 1 && cmp -s "$(w10 ep4)" "$(w10 ep4_1)"; then
        ok "$name, EP 2 on 4 ranks (each expert on 2): shared against every rank all, the same weights bit for bit"
    else fail "$name, EP 2 on 4 ranks: $(grep -v oversubscribed "$dir/ep4_1.out" | tail -1)"; fi
    if ep_run eptp --nproc 4 --ep 2 --tp 2 --batch 2 && ep_run eptp_1 --nproc 4 --ep 2 --tp 2 --batch 2 "$group" 1 &&
        cmp -s "$(w10 eptp)" "$(w10 eptp_1)"; then
        ok "$name, EP 2 x TP 2 (the whole view keeps a rank's own experts): shared against every rank all, bit for bit (against EP 2, said: $(worst loss "$dir/ep2.jsonl" "$dir/eptp.jsonl" 10))"
    else fail "$name, EP 2 x TP 2: $(grep -v oversubscribed "$dir/eptp_1.out" | tail -1)"; fi
    if ep_run ep2_p --nproc 2 --ep 2 --batch 2 --save-every 5 --stop-after 5 && rm -rf "$dir/ep2_dp" && cp -r "$dir/ep2_p" "$dir/ep2_dp" &&
        "$DTRAIN" train --resume "$dir/ep2_p" --nproc 2 --ep 2 --quiet --metrics "$dir/ep2_r.jsonl" > "$dir/ep2_r.out" 2>&1 &&
        cmp -s "$(w10 ep2)" "$(w10 ep2_p)"; then
        ok "$name, EP 2 saved at step 5 and resumed: the uninterrupted run's weights bit for bit"
    else fail "$name, EP 2 resumed: $(grep -v oversubscribed "$dir/ep2_r.out" | tail -1)"; fi
    "$DTRAIN" train --resume "$dir/ep2_dp" --nproc 2 --ep 1 --quiet --metrics "$dir/ep2_dp.jsonl" > "$dir/ep2_dp.out" 2>&1 &&
        w=$(worst loss <(tail -5 "$dir/ep2.jsonl") "$dir/ep2_dp.jsonl" 5)
    if ! grep -q "afresh" "$dir/ep2_dp.out" && [ "$w" != missing ] && awk -v w="$w" 'BEGIN{exit !(w <= 1e-3)}'; then
        ok "$name, EP 2's checkpoint resumed on 2 ranks without EP: its state loaded (not afresh), its losses within $w of EP 2's (held to 1e-3)"
    else fail "$name, EP 2's checkpoint without EP: $w $(grep -v oversubscribed "$dir/ep2_dp.out" | tail -1)"; fi
    if ep_run dp2 --nproc 2 --batch 2; then ok "$name, EP 2 against DDP 2 (said, not held): losses within $(worst loss "$dir/dp2.jsonl" "$dir/ep2.jsonl" 10) over 10 steps"
    else fail "$name, DDP 2 on the mixture: $(tail -1 "$dir/dp2.out")"; fi
    for a in "${moe[@]}"; do [ "$a" = --quiet ] || loud+=("$a"); done
    run_mib=$(logged_mib "$words" "${loud[@]}" --nproc 2 --ep 2 --batch 2) plan_mib=$(plan_precond_mib "${loud[@]}" --nproc 2 --ep 2 --batch 2)
    if within5 "$plan_mib" "$run_mib"; then ok "$name, the planner with EP 2: $plan_mib MiB of state on the fullest rank (the run: $run_mib)"
    else fail "$name, the planner's memory with EP 2: $plan_mib MiB, the run's $run_mib"; fi
}
# A preconditioner under fp16 with a static loss scale of 1024 (divided out before it) against the same run in f32
# ("${common[@]}" ARGS, 30 steps: $dir/f32_30.jsonl, $dir/fp16_30.jsonl): the losses within TOL.
fp16_scaled() { # WHO TOL ARGS...
    local who=$1 tol=$2 l
    shift 2
    echo '{"fp16": {"enabled": true, "loss_scale": 1024}}' > "$dir/fp16_static.json"
    run_metrics f32_30 "$@" --steps 30 --save "$dir/f32_30" --save-every 30 &&
        run_metrics fp16_30 "$@" --steps 30 --config "$dir/fp16_static.json" --save "$dir/fp16_30" --save-every 30 || return 1
    l=$(worst loss "$dir/f32_30.jsonl" "$dir/fp16_30.jsonl" 30)
    if [ "$l" != missing ] && awk -v l="$l" -v t="$tol" 'BEGIN{exit !(l <= t)}'; then
        ok "$who under fp16 with a loss scale of 1024: the f32 run's losses within $l over 30 steps"
    else fail "$who under fp16 against f32: losses $l"; fi
}
# After fp16_scaled: the preconditioner's state file FILE of its two runs' checkpoints at step 30, by the mean |value|, within
# TOL relative: a loss scale left in the gradients multiplies their statistics (by up to 1024^2), which a loss can barely
# see where the update divides it away (SOAP's Adam in the eigenbasis).
fp16_state() { # WHO FILE TOL
    local a b mean='NF{s += $1 < 0 ? -$1 : $1; n++} END{if (n) printf "%.6g", s / n}'
    a=$(od -An -v -f "$dir/f32_30/step-00000030/$2" 2> /dev/null | tr -s ' ' '\n' | awk "$mean")
    b=$(od -An -v -f "$dir/fp16_30/step-00000030/$2" 2> /dev/null | tr -s ' ' '\n' | awk "$mean")
    if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" -v t="$3" 'BEGIN{d = (b - a) / a; exit !(a > 0 && d <= t && -d <= t)}'; then
        ok "$1 under fp16: its saved state's mean |value| $b against f32's $a"
    else fail "$1 under fp16: its saved state's mean |value| '$b' against f32's '$a'"; fi
}
# A preconditioner on compressed averages ("${common[@]}" ARGS, 30 steps, 2 ranks): PowerSGD before its start step
# gives the dense run's losses bit for bit (the codec's seam passes the average through), and PowerSGD at rank 4 from
# step 2 ends within 10% of the dense run's last loss (a broken average would not train).
codec_precond() { # WHO ARGS...
    local who=$1 l a b
    shift
    run_metrics cp_dense "$@" --steps 30 && run_metrics cp_before "$@" --steps 30 --compress powersgd --compress-start 1000 &&
        run_metrics cp_psgd "$@" --steps 30 --compress powersgd --compress-rank 4 --compress-start 2 || return 1
    l=$(worst loss "$dir/cp_dense.jsonl" "$dir/cp_before.jsonl" 30)
    if [ "$l" = 0 ]; then ok "$who with PowerSGD before its start: the dense run's losses bit for bit"
    else fail "$who with PowerSGD before its start against dense: losses $l"; fi
    a=$(field loss "$dir/cp_psgd.jsonl" | tail -1) b=$(field loss "$dir/cp_dense.jsonl" | tail -1)
    if awk -v a="$a" -v b="$b" 'BEGIN{exit !(a > 0 && a < 1.1 * b)}'; then ok "$who on PowerSGD 4's averages: last loss $a (dense $b)"
    else fail "$who on PowerSGD 4's averages: last loss $a (dense $b)"; fi
}
# A preconditioner whose norm, finiteness check and clipping are the gradients' before it (Shampoo's, SOAP's): 5 steps
# of the caller's "${common[@]}" ARGS without --grad-clip, with a clip above every norm (the same weights, bit for bit)
# and with one below (other weights); the first step's norm in each AdamW's (the gradients', not the directions').
raw_clip() { # WHO ARGS...
    local who=$1
    shift
    local c
    for c in 0 1e9 0.01; do
        run_metrics "clip_$c" "$@" --steps 5 --grad-clip "$c" --save "$dir/clip_$c" --save-every 5 || return
    done
    local plain=() skip=0 a # the caller's settings without the preconditioner's own flags
    for a in "${common[@]}"; do
        if [ $skip = 1 ]; then skip=0
        elif [[ $a == --shampoo-* || $a == --soap-* || $a == --precondition-* ]]; then skip=1
        else plain+=("$a"); fi
    done
    "$DTRAIN" train "${plain[@]}" "$@" --steps 1 --optimizer adamw --metrics "$dir/clip_adamw.jsonl" > "$dir/clip_adamw.out" 2>&1 ||
        { fail "$who: AdamW's step: $(tail -1 "$dir/clip_adamw.out")"; return; }
    local p=step-00000005/params.f32 n0 n1 na
    n0=$(field grad_norm "$dir/clip_0.jsonl" | head -1) n1=$(field grad_norm "$dir/clip_0.01.jsonl" | head -1)
    na=$(field grad_norm "$dir/clip_adamw.jsonl" | head -1)
    if cmp -s "$dir/clip_0/$p" "$dir/clip_1e9/$p" && ! cmp -s "$dir/clip_0/$p" "$dir/clip_0.01/$p" && [ -n "$na" ] && [ "$n0" = "$na" ] &&
        [ "$n1" = "$na" ]; then
        ok "$who: --grad-clip clips the gradients before it (step 1's norm $n0 with and without a clip of 0.01, AdamW's $na; 1e9 changes nothing)"
    else fail "$who with --grad-clip: step 1's norm $n0 unclipped, $n1 at 0.01, AdamW's $na (or the weights)"; fi
}
