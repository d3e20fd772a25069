#!/bin/bash
# Inference and serving. generate through the key/value cache gives the
# tokens of the no-cache path (greedy and sampled) on a byte-level model
# and on GPT-2 124M's shape; int8 runs. dtrain serve: its completion is
# generate's text; streamed = whole; stop and echo; eight prompts sent at
# once, and joining a running batch mid-way, each get their tokens alone;
# malformed requests (bad JSON, huge max_tokens, negative temperature, a
# prompt longer than the context, a 10 MB body, a slow client, unknown
# fields and endpoints) get a 4xx with a message and the server goes on;
# a client that leaves mid-stream frees its slot; logprobs (a Llama folder's
# prompt scored against transformers' log_softmax; decoded = prefilled;
# streamed = whole; the penalties and logit_bias each choice obeys); generate and serve with
# --nproc 2 --tp 2 give one process's text (a Llama's too: the cache, the
# no-cache path, --tp 2 and its server agree), and a tensor-parallel rank
# killed stops the server naming it; a port in use, a model
# that does not load and a bad --quantize are said before listening;
# SIGTERM finishes the requests in hand and exits 0 (a request that comes
# meanwhile gets 503); /v1/chat/completions is the completion of its
# messages by the documented template, whole and streamed, and by a
# model's own ChatML template where its tokenizer_config.json has one; OpenAI's Python
# client completes, streams and stops (installed from PyPI into PYDIR if
# missing; said and not counted if it cannot be).
# Under a sanitizer (SANITIZE given) a 2-layer model with GPT-2's
# vocabulary stands in for 124M, which would take most of an hour there.
# usage: serve_checks.sh DTRAIN FIXTURES [PYDIR] [SANITIZE]
set -u
DTRAIN=$1
FIX=$2
PYDIR=${3:-}
SANITIZE=${4:-}
HERE=$(dirname "$0")
. "$HERE/checks.sh"
trap 'kill $(jobs -p) 2> /dev/null; wait 2> /dev/null; rm -rf "$dir"' EXIT
# under TSan OpenMP stays on one thread (libgomp is not instrumented: TSan takes its hand-offs for races)
T=2
[ "$SANITIZE" = thread ] && T=1
export OMP_NUM_THREADS=$T

cat /usr/share/common-licenses/* | tr -s ' ' > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
"$DTRAIN" train --data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 16 --steps 400 \
    --lr 3e-3 --threads $T --quiet --save "$dir/byte.bin" > /dev/null 2>&1 || { echo "FAIL: training the byte model"; exit 1; }
big=(--model 124M) long=400 leavetok=900
[ -n "$SANITIZE" ] && big=(--layers 2 --channels 128 --heads 2 --vocab 50257 --max-seq 512) long=150 leavetok=500
"$DTRAIN" train --data "$dir/train.bin" "${big[@]}" --seq 32 --batch 1 --steps 1 --lr 1e-9 --threads $T --quiet \
    --save "$dir/g124.bin" > /dev/null 2>&1 || { echo "FAIL: making GPT-2 124M's shape"; exit 1; }
BPE=("$FIX/bpe/encoder.json" "$FIX/bpe/vocab.bpe")

# ---- generate: the cache against the no-cache path ----
gen() { "$DTRAIN" generate "$@" 2> /dev/null; }
for m in byte g124; do
    extra=() name="a byte-level model"
    [ $m = g124 ] && extra=(--bpe "${BPE[@]}") name="${big[*]}"
    for how in "--temperature 0" "--temperature 1 --seed 5"; do
        # shellcheck disable=SC2086
        a=$(gen --model "$dir/$m.bin" --prompt "The " --tokens 40 $how "${extra[@]}")
        # shellcheck disable=SC2086
        b=$(gen --model "$dir/$m.bin" --prompt "The " --tokens 40 $how "${extra[@]}" --no-cache)
        [ ${#a} -gt 20 ] && [ "$a" = "$b" ] && ok "generate, $name ($how): the cache's 40 tokens are the no-cache path's ('$(echo "$a" | head -c 40 | tr -d '\n')...')" ||
            fail "generate, $name ($how): '$a' against '$b'"
    done
done
# the repetition penalty (Hugging Face's): the batcher's (cache) and the windows' paths alike, and not the plain text
a=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 40 --temperature 0 --repetition-penalty 1.5)
b=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 40 --temperature 0 --repetition-penalty 1.5 --no-cache)
c=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 40 --temperature 0)
[ ${#a} -gt 20 ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] &&
    ok "generate --repetition-penalty 1.5: the cache's text is the no-cache path's, not the plain one ('$(echo "$a" | head -c 30 | tr -d '\n')...')" ||
    fail "--repetition-penalty: '$a' against '$b' (plain '$c')"
q=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 40 --temperature 0 --quantize int8)
f=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 40 --temperature 0)
[ ${#q} -eq 44 ] && ok "generate --quantize int8: 40 bytes ('$(echo "$q" | tr -d '\n')'; f32: '$(echo "$f" | tr -d '\n')')" || fail "int8: '$q'"

# ---- serve ----
start() { # NAME ARGS...: a server on a free port: sets port and spid
    local name=$1 i
    shift
    "$DTRAIN" serve "$@" --port 0 > "$dir/$name.out" 2> "$dir/$name.err" &
    spid=$!
    port=""
    for i in $(seq 200); do
        port=$(grep -o 'listening on http://[^ ]*' "$dir/$name.out" | grep -o '[0-9]*$')
        [ -n "$port" ] && return 0
        kill -0 $spid 2> /dev/null || break
        sleep 0.1
    done
    fail "serve $name did not start: $(cat "$dir/$name.err")"
    return 1
}
post() { curl -s -m 600 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d "$1"; }
text() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")'; }
streamed() { # the streamed events' text joined, then the finish reason
    python3 -c '
import json, sys
t, r = "", None
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        c = json.loads(line[6:])["choices"][0]
        t += c["text"]; r = c["finish_reason"] or r
print(json.dumps([t, r]))'
}

start byte "$dir/byte.bin" --threads $T --slots 8 --upload-timeout 2 || exit 1
[ "$(curl -s "http://127.0.0.1:$port/health")" = '{"status":"ok"}' ] && ok "GET /health" || fail "health"
g=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 30 --temperature 0)
s=$(post '{"prompt":"The ","max_tokens":30,"temperature":0}' | text)
[ "The $s" = "$g" ] && ok "a completion is generate's text ('$s')" || fail "completion '$s' against generate '$g'"
gp=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 30 --temperature 0 --repetition-penalty 1.5)
sp=$(post '{"prompt":"The ","max_tokens":30,"temperature":0,"repetition_penalty":1.5}' | text)
[ "The $sp" = "$gp" ] && ok "with repetition_penalty 1.5 too ('$sp')" || fail "repetition_penalty: '$sp' against generate '$gp'"
st=$(curl -s -N "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"The ","max_tokens":30,"temperature":0,"stream":true}' | streamed)
[ "$st" = "$(python3 -c 'import json,sys; print(json.dumps([sys.argv[1], "length"]))' "$s")" ] &&
    ok "streamed as server-sent events: the same text, finish_reason length" || fail "stream: $st against '$s'"
t=$(post '{"prompt":"The ","max_tokens":40,"temperature":0.7,"seed":4}' | text)
stop=${t:10:2} before=$(python3 -c 'import sys; print(sys.argv[1][:sys.argv[1].find(sys.argv[2])], end="")' "$t" "$stop")
sp=$(post "{\"prompt\":\"The \",\"max_tokens\":40,\"temperature\":0.7,\"seed\":4,\"stop\":[\"zzz\",\"$stop\"]}")
[ "$(echo "$sp" | text)" = "$before" ] && echo "$sp" | grep -q '"finish_reason":"stop"' &&
    ok "stop '$stop': the text before it ('$before' of '$t'), finish_reason stop" || fail "stop '$stop' in '$t': $sp"
[ "$(post '{"prompt":"The ","max_tokens":5,"temperature":0,"echo":true}' | text)" = "The ${s:0:5}" ] && ok "echo: the prompt, then the completion" || fail "echo"

# eight prompts with their own sampling: alone, all at once, and joining a running batch
req() { echo "{\"prompt\":\"$1\",\"max_tokens\":24,\"temperature\":$2,\"top_k\":$3,\"top_p\":$4,\"seed\":$5}"; }
reqs=("$(req 'The ' 0 0 1 0)" "$(req 'GNU' 1 0 1 7)" "$(req 'a' 0.7 20 1 3)" "$(req 'You may' 1 0 0.9 11)"
      "$(req 'This License' 0 0 1 0)" "$(req 'the' 1.2 5 1 99)" "$(req 'program ' 0.5 0 0.5 1)" "$(req 'x' 1 40 1 42)")
for i in "${!reqs[@]}"; do post "${reqs[$i]}" | text > "$dir/alone.$i"; done
for i in "${!reqs[@]}"; do post "${reqs[$i]}" | text > "$dir/together.$i" & done
wait_posts() { local p; for p in $(jobs -p); do [ "$p" != "$spid" ] && wait "$p"; done; }
wait_posts
same=0
for i in "${!reqs[@]}"; do cmp -s "$dir/alone.$i" "$dir/together.$i" && [ -s "$dir/alone.$i" ] && same=$((same + 1)); done
[ $same = 8 ] && ok "eight requests at once: each gets its tokens alone ('$(cat "$dir/alone.3")', ...)" || fail "at once: $same of 8 the same"
kill -TERM $spid; wait $spid

start g124 "$dir/g124.bin" --bpe "${BPE[@]}" --threads $T --slots 4 --upload-timeout 1 || exit 1
long="{\"prompt\":\"The\",\"max_tokens\":$long,\"temperature\":1,\"seed\":3}"
reqs=("$(req 'The ' 0 0 1 0)" "$(req 'ab' 1 0 1 7)" "$(req 'a' 0.7 20 1 3)")
for i in "${!reqs[@]}"; do post "${reqs[$i]}" | text > "$dir/alone.$i"; done
post "$long" | text > "$dir/long" &
sleep 1
for i in "${!reqs[@]}"; do post "${reqs[$i]}" | text > "$dir/joined.$i" & done
wait_posts
same=0
for i in "${!reqs[@]}"; do cmp -s "$dir/alone.$i" "$dir/joined.$i" && [ -s "$dir/alone.$i" ] && same=$((same + 1)); done
[ $same = 3 ] && ok "${big[*]}: three requests joining a running one mid-way (it asked for $long tokens) get their tokens alone" || fail "joined: $same of 3"
# a completion that takes longer than the connections' idle timeout (--upload-timeout 1: 6 s) still arrives whole: the
# server stopped (SIGSTOP) for 7 s while the request runs, so no machine is too fast for it
post "$long" > "$dir/slow" &
running=0
for _ in $(seq 200); do curl -s "http://127.0.0.1:$port/metrics" | grep -q '^dtrain_batch_running 1' && running=1 && break; sleep 0.05; done
kill -STOP $spid; sleep 7; kill -CONT $spid
wait_posts
[ $running = 1 ] && python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(r["choices"][0]["finish_reason"] != "length" or r["usage"]["completion_tokens"] != json.loads(sys.argv[1])["max_tokens"])' \
    "$long" < "$dir/slow" 2> /dev/null &&
    ok "a completion held past the idle timeout (the server stopped 7 s mid-way) arrives whole" ||
    fail "a completion held past the idle timeout (seen running: $running): '$(head -c 200 "$dir/slow")'"
# a client that leaves mid-stream: its job ends (cancelled), the slot is free again
python3 "$HERE/serve_client.py" leave "$port" "{\"prompt\":\"The\",\"max_tokens\":$leavetok,\"stream\":true}" > "$dir/left"
sleep 1
m=$(curl -s "http://127.0.0.1:$port/metrics")
c=$(echo "$m" | awk '$1=="dtrain_requests_cancelled_total"{print $2}') r=$(echo "$m" | awk '$1=="dtrain_batch_running"{print $2}')
[ "$c" = 1 ] && [ "$r" = 0 ] && ok "a client that leaves mid-stream: its request cancelled, no request running after" ||
    fail "left: cancelled $c, running $r (its first event: $(cat "$dir/left"))"
rss() { awk '$1=="VmRSS:"{print $2}' "/proc/$1/status"; }
rss_f32=$(rss $spid)
# SIGTERM with a request in hand: a request that comes while it runs is turned away with 503 (the server still listens)
curl -s -N "http://127.0.0.1:$port/v1/completions" -d "{\"prompt\":\"The\",\"max_tokens\":$leavetok,\"stream\":true}" > "$dir/held" &
cpid=$!
for _ in $(seq 300); do grep -q '^data: ' "$dir/held" && break; sleep 0.1; done
kill -TERM $spid
for _ in $(seq 100); do grep -q "stopping: finishing" "$dir/g124.out" && break; sleep 0.05; done
late=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"The","max_tokens":2}')
kill $cpid; wait $cpid 2> /dev/null # the held request's client leaves: the drain ends
wait $spid
rc=$?
[ "${late##* }" = 503 ] && echo "$late" | grep -q "shutting down" && [ $rc = 0 ] &&
    ok "a request while a SIGTERM drains the one in hand: 503 '$(echo "${late% *}" | head -c 90)', exit 0" ||
    fail "a request while draining: '$late', exit $rc"
# int8: the f32 model is freed once quantized (the decoder keeps nothing of it); the completion is generate's
start g124q "$dir/g124.bin" --bpe "${BPE[@]}" --threads $T --slots 4 --quantize int8 || exit 1
gq=$(gen --model "$dir/g124.bin" --bpe "${BPE[@]}" --prompt "The" --tokens 12 --temperature 0 --quantize int8)
sq=$(post '{"prompt":"The","max_tokens":12,"temperature":0}' | text)
rss_q=$(rss $spid)
# (a sanitizer's shadow and its quarantine of freed blocks are resident too: only the text is compared there)
[ -n "$SANITIZE" ] && rss_f32=$((rss_q * 3))
[ "The$sq" = "$gq" ] && [ "$rss_q" -lt $((rss_f32 / 2)) ] &&
    ok "serve --quantize int8: generate's text; resident $((rss_q / 1024)) MB against f32's $((rss_f32 / 1024)) MB" ||
    fail "int8 serve: '$sq' against '$gq'; resident $rss_q kB against f32's $rss_f32 kB"
kill -TERM $spid; wait $spid

# ---- tensor-parallel serving: rank 0 serves, rank 1 follows; a killed rank stops the server, named ----
tg=$(gen --model "$dir/byte.bin" --prompt "The " --tokens 30 --temperature 0 --nproc 2 --tp 2)
[ "$tg" = "$g" ] && ok "generate --nproc 2 --tp 2: one process's greedy text ('${tg:0:30}')" || fail "generate --tp 2: '$tg' against '$g'"
start tp "$dir/byte.bin" --threads 1 --slots 4 --nproc 2 --tp 2 || exit 1
r=$(post '{"prompt":"The ","max_tokens":30,"temperature":0}' | text)
[ "$r" = "$s" ] && ok "serve --nproc 2 --tp 2: one process's completion" || fail "serve --tp 2: '$r' against '$s'"
# prefix reuse over a part: n choices copy the first's prompt, a repeat keeps its slots' (the followers copy theirs);
# every text that of a server reading each prompt whole (DTRAIN_PREFIX_REUSE=off), and the cached tokens counted
choices() { python3 -c 'import json,sys; o=json.load(sys.stdin); print(json.dumps([[c["text"] for c in o["choices"]], o["usage"]["prompt_tokens_details"]["cached_tokens"]]))'; }
nreq='{"prompt":"In the beginning God created","max_tokens":20,"temperature":0.9,"seed":11,"n":3}'
c1=$(post "$nreq" | choices); c2=$(post "$nreq" | choices)
held=$(curl -s "http://127.0.0.1:$port/metrics" | grep '^dtrain_prompt_tokens_cached_total' | grep -o '[0-9]*$')
c3=$(post "${nreq%\}},\"cache_salt\":\"tenant-b\"}" | choices) # (vLLM's: another tenant's prompts reuse nothing of these)
nosalt=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"x","cache_salt":""}')
[ "$c3" = "${c1%,*}, 0]" ] && [ "${nosalt##* }" = 400 ] && echo "$nosalt" | grep -q "'cache_salt' must be a non-empty string" &&
    ok "cache_salt: the same texts, none of the prompt from another salt's slots; an empty one 400" ||
    fail "cache_salt: $c3 against $c1; '$nosalt'"
tpid=$spid tport=$port
DTRAIN_PREFIX_REUSE=off start tpoff "$dir/byte.bin" --threads 1 --slots 4 --nproc 2 --tp 2 || exit 1
o1=$(post "$nreq" | choices); o2=$(post "$nreq" | choices)
kill -TERM $spid; wait $spid
spid=$tpid port=$tport
[ "${c1%,*}" = "${o1%,*}" ] && [ "${c2%,*}" = "${o1%,*}" ] && [ "${o2%,*}" = "${o1%,*}" ] && [ "${c1##*, }" = "0]" ] &&
    [ "${c2##*, }" = "27]" ] && [ "${o2##*, }" = "0]" ] && [ "$held" = 135 ] &&
    ok "serve --tp 2, n 3 twice: the texts of prompts read whole; cached tokens 0 then 27, 135 in all (27 x 5)" ||
    fail "serve --tp 2, prefix reuse: $c1 then $c2 against $o1 then $o2 (read whole); $held cached"
for p in $(pgrep -P "$spid"); do grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2> /dev/null && kill -9 "$p"; done
wait "$spid"
rc=$?
said=$(grep -m1 "rank 1" "$dir/tp.err")
[ $rc != 0 ] && [ -n "$said" ] && ! pgrep -P "$spid" > /dev/null && ok "rank 1 of a tensor-parallel server killed: the server stops (exit $rc): $said" ||
    fail "tp rank killed: rc $rc, $(tail -3 "$dir/tp.err")"

# ---- a Llama (rotary positions, RMSNorm, SwiGLU, 4 heads over 2 K/V heads, an untied head) decodes from the same spec ----
"$DTRAIN" train --model llama-tiny --data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 256 \
    --max-seq 64 --seq 64 --batch 16 --steps 300 --lr 3e-3 --threads $T --quiet --save "$dir/llama" > /dev/null 2>&1 ||
    fail "training the byte-level Llama"
la=$(gen --model "$dir/llama" --prompt "The " --tokens 40 --temperature 0)
lb=$(gen --model "$dir/llama" --prompt "The " --tokens 40 --temperature 0 --no-cache)
lt=$(gen --model "$dir/llama" --prompt "The " --tokens 40 --temperature 0 --nproc 2 --tp 2)
[ ${#la} -gt 20 ] && [ "$la" = "$lb" ] && [ "$la" = "$lt" ] &&
    ok "generate, a Llama: the cache's 40 tokens are the no-cache path's and --tp 2's ('$(echo "$la" | head -c 40 | tr -d '\n')')" ||
    fail "generate, a Llama: cache '$la', no cache '$lb', --tp 2 '$lt'"
start llama "$dir/llama" --threads 1 --slots 4 --nproc 2 --tp 2 || exit 1
r=$(post '{"prompt":"The ","max_tokens":40,"temperature":0}' | text)
[ "The $r" = "$la" ] && ok "serve a Llama, --nproc 2 --tp 2: generate's text" || fail "serve a Llama: '$r' against '$la'"
kill -TERM $spid; wait $spid

# ---- logprobs: transformers' log-probabilities of the fixture's Llama folder; the decoder's steps against its prefill ----
start hflp "$FIX/llama/gqa_folder" --threads 1 --slots 2 || exit 1
r=$(python3 "$HERE/serve_logprobs.py" hf "$FIX/llama/gqa.safetensors" "$port" 2>&1)
python3 -c 'import json,sys; w,t,n,p=json.loads(sys.argv[1]); sys.exit(not (w <= 1e-5 and t == n and p == n))' "$r" 2> /dev/null &&
    ok "logprobs of a Llama folder's prompt (echo, max_tokens 0; vLLM's prompt_logprobs, their ranks) against transformers' log_softmax [worst relative, top 5 agree, tokens, prompt_logprobs agree]: $r" ||
    fail "logprobs against transformers: $r"
kill -TERM $spid; wait $spid
start lp "$dir/byte.bin" --threads 1 --slots 2 || exit 1
r=$(python3 "$HERE/serve_logprobs.py" same "$port" "The " 2>&1)
[ "${r%%:*}" = ok ] && ok "logprobs: $r" || fail "logprobs: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"user","content":"a"}],"top_logprobs":2}')
[ "${r##* }" = 400 ] && echo "$r" | grep -q '"param":"top_logprobs"' && ok "a chat's top_logprobs without logprobs: 400 naming it" ||
    fail "top_logprobs without logprobs: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"user","content":"a"}],"echo":true}')
[ "${r##* }" = 400 ] && echo "$r" | grep -q '"param":"echo"' && ok "a chat's echo (vLLM's): 400 naming it" || fail "a chat's echo: $r"
kill -TERM $spid; wait $spid

# ---- bad requests: a 4xx with a message each; the server serves on ----
start bad "$dir/byte.bin" --threads 1 --slots 2 --upload-timeout 2 || exit 1
head -c 10000000 /dev/zero | tr '\0' a > "$dir/big"
while IFS='|' read -r what want body; do
    if [ "$body" = BIG ]; then r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" --data-binary @"$dir/big")
    elif [ "$body" = LATIN1 ]; then # a prompt in Latin-1, not UTF-8: 0xe9 ('é') starts no character
        r=$(printf '{"prompt": "caf\351 au lait"}' | curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" --data-binary @-)
        echo "$r" | grep -q 'byte 15 of 26 (0xe9)' || r="$r (the message does not name byte 15, 0xe9)"
    elif [ "$body" = CHUNKED ]; then
        r=$(head -c 3000000 "$dir/big" | curl -s -w ' %{http_code}' -H 'Transfer-Encoding: chunked' "http://127.0.0.1:$port/v1/completions" --data-binary @-)
    else r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d "$body"); fi
    code=${r##* } msg=$(echo "${r% *}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["message"])' 2> /dev/null)
    [ "$code" = "$want" ] && [ -n "$msg" ] && ok "$what: $code '$msg'" || fail "$what: $r"
done << 'EOF'
bad JSON|400|{"prompt": "The
not an object|400|[1, 2]
no prompt|400|{"max_tokens": 3}
huge max_tokens|400|{"prompt": "The", "max_tokens": 1000000000}
negative temperature|400|{"prompt": "The", "temperature": -0.5}
a prompt longer than the context|400|{"prompt": "0123456789012345678901234567890123456789012345678901234567890123456789"}
top_p 0|400|{"prompt": "The", "top_p": 0}
min_p above 1|400|{"prompt": "The", "min_p": 1.5}
repetition_penalty 0|400|{"prompt": "The", "repetition_penalty": 0}
n 0|400|{"prompt": "The", "n": 0}
n 129 (above OpenAI's 128)|400|{"prompt": "The", "n": 129}
best_of 2 (not supported)|400|{"prompt": "The", "best_of": 2}
vLLM's min_tokens above max_tokens|400|{"prompt": "The", "max_tokens": 2, "min_tokens": 3}
vLLM's stop_token_ids beyond the vocabulary|400|{"prompt": "The", "stop_token_ids": [5, 256]}
vLLM's guided_json (not supported)|400|{"prompt": "The", "guided_json": {"type": "object"}}
vLLM's include_stop_str_in_output (not supported)|400|{"prompt": "The", "include_stop_str_in_output": true}
ignore_eos not a boolean|400|{"prompt": "The", "ignore_eos": 1}
vLLM's chat_template (not supported)|400|{"prompt": "The", "chat_template": "{{ x }}"}
vLLM's continue_final_message (not supported)|400|{"prompt": "The", "continue_final_message": true}
logprobs above 20|400|{"prompt": "The", "logprobs": 21}
vLLM's prompt_logprobs above 20|400|{"prompt": "The", "prompt_logprobs": 21}
vLLM's prompt_logprobs in a stream|400|{"prompt": "The", "prompt_logprobs": 1, "stream": true}
cache_salt not a string|400|{"prompt": "The", "cache_salt": 7}
skip_special_tokens not a boolean|400|{"prompt": "The", "skip_special_tokens": "no"}
logprobs true (the chat API's form) on a completion|400|{"prompt": "The", "logprobs": true}
max_tokens -1|400|{"prompt": "The", "max_tokens": -1}
presence_penalty above 2|400|{"prompt": "The", "presence_penalty": 2.5}
logit_bias of a token beyond the vocabulary|400|{"prompt": "The", "logit_bias": {"300": 1}}
logit_bias naming no token id|400|{"prompt": "The", "logit_bias": {"x": 1}}
logit_bias above 100|400|{"prompt": "The", "logit_bias": {"5": 101}}
logit_bias naming a token twice|400|{"prompt": "The", "logit_bias": {"5": 1, "05": 2}}
response_format json_object (no guided decoding)|400|{"prompt": "The", "response_format": {"type": "json_object"}}
stream_options without a stream|400|{"prompt": "The", "stream_options": {"include_usage": true}}
a token id beyond the vocabulary|400|{"prompt": [1, 2, 300]}
a NUL in the prompt (JSON's \u0000)|400|{"prompt": "The\u0000 end"}
two JSON values|400|{"prompt": "The"} {"prompt": "A"}
a prompt not in UTF-8|400|LATIN1
a 10 MB body|413|BIG
a 3 MB body sent in chunks (no length)|413|CHUNKED
EOF
# chat: the messages by the documented template are the completion of its text (with its stop at the next turn),
# whole and streamed; a role it does not take is a 400 naming it
msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"The "},{"role":"assistant","content":"GNU"},{"role":"user","content":"a"}]'
chat=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$msgs,\"max_tokens\":8,\"temperature\":0}")
plain=$(post '{"prompt":"Be brief.\n\nUser: The \nAssistant: GNU\nUser: a\nAssistant:","max_tokens":8,"temperature":0,"stop":"\nUser:"}' | text)
cw=$(echo "$chat" | python3 -c 'import json,sys; c=json.load(sys.stdin); m=c["choices"][0]["message"]; assert c["object"]=="chat.completion" and m["role"]=="assistant"; print(m["content"], end="")')
cs=$(curl -s -N "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$msgs,\"max_tokens\":8,\"temperature\":0,\"stream\":true}" |
     python3 -c '
import json, sys
t = ""
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        c = json.loads(line[6:]); assert c["object"] == "chat.completion.chunk"; t += c["choices"][0]["delta"].get("content") or ""
print(t, end="")')
[ -n "$cw" ] && [ "$cw" = "$plain" ] && [ "$cs" = "$cw" ] && ok "/v1/chat/completions: the template's completion ('$cw'), streamed alike" ||
    fail "chat: '$cw' / streamed '$cs' against the template's completion '$plain': $chat"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"tool","content":"x"}]}')
echo "$r" | grep -q "role 'tool'" && [ "${r##* }" = 400 ] && ok "a chat message of role tool: 400 naming it" || fail "chat role tool: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"tools":[]}}')
echo "$r" | grep -q "'chat_template_kwargs' holds 'tools': enable_thinking" && [ "${r##* }" = 400 ] &&
    ok "chat_template_kwargs other than enable_thinking and date_string: 400 naming it" || fail "chat_template_kwargs tools: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"date_string":5}}')
echo "$r" | grep -q "holds 'date_string'" && [ "${r##* }" = 400 ] && ok "chat_template_kwargs date_string not a text: 400 naming it" ||
    fail "chat_template_kwargs date_string 5: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$msgs,\"max_tokens\":8,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":false}}")
[ "${r##* }" = 200 ] && echo "$r" | grep -qF "\"content\":$(printf '%s' "$cw" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')" &&
    ok "enable_thinking false on a template without thinking changes nothing: 200, the same answer" || fail "enable_thinking false: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$msgs,\"max_tokens\":8,\"temperature\":0,\"chat_template_kwargs\":{\"date_string\":\"01 Jan 2025\"}}")
[ "${r##* }" = 200 ] && echo "$r" | grep -qF "\"content\":$(printf '%s' "$cw" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')" &&
    ok "date_string on a template without a date changes nothing: 200, the same answer" || fail "date_string: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt": ["The", "A"]}')
echo "$r" | grep -q "several prompts: one prompt a request" && [ "${r##* }" = 400 ] && ok "two prompts in one request: 400, one prompt a request" ||
    fail "two prompts: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "The\\u0000 end", "max_tokens": 2}')
[ "${r##* }" = 200 ] && echo "$r" | grep -q '"prompt_tokens":13' && ok "an escaped backslash before u0000 is text: 200, its 13 bytes" ||
    fail "an escaped backslash before u0000: $r"
r=$(python3 "$HERE/serve_client.py" slow "$port" 4)
[ "${r%% *}" = 408 ] && ok "a slow client (a byte a second): ${r%% *} ${r#* }" || fail "slow client: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/nothing")
[ "${r##* }" = 404 ] && ok "an unknown endpoint: 404" || fail "unknown endpoint: $r"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions")
[ "${r##* }" = 405 ] && ok "GET /v1/completions: 405" || fail "GET completions: $r"
[ "$(post '{"prompt":"The ","max_tokens":30,"temperature":0}' | text)" = "$s" ] && ok "after all that the server serves: the same completion" ||
    fail "the server after bad requests"
m=$(curl -s "http://127.0.0.1:$port/metrics")
e4=$(echo "$m" | awk '$1=="dtrain_http_errors_total{class=\"4xx\"}"{print $2}')
[ "$e4" -ge 15 ] && ok "/metrics counts the $e4 error responses" || fail "metrics 4xx: $e4"

# ---- faults said before listening; SIGTERM drains ----
out=$("$DTRAIN" serve "$dir/byte.bin" --port "$port" 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "port $port on 127.0.0.1 is in use" && ok "a port in use: $(echo "$out" | tail -1)" || fail "port in use: $out"
printf 'not a model' > "$dir/junk.bin"
out=$("$DTRAIN" serve "$dir/junk.bin" --port 0 2>&1)
[ $? = 1 ] && ! echo "$out" | grep -q listening && ok "a model that does not load: $(echo "$out" | tail -1)" || fail "junk model: $out"
out=$("$DTRAIN" serve "$dir/byte.bin" --quantize int4 2>&1)
[ $? = 2 ] && ok "--quantize int4: $(echo "$out" | tail -1)" || fail "quantize int4: $out"
post '{"prompt":"The","max_tokens":60,"temperature":1}' > "$dir/inflight" &
cpid=$!
sleep 0.2
kill -TERM $spid
wait $spid
rc=$?
wait $cpid
[ $rc = 0 ] && grep -q '"finish_reason":"length"' "$dir/inflight" && grep -q "served" "$dir/bad.out" &&
    ok "SIGTERM: the request in hand finished ($(text < "$dir/inflight" | wc -c) bytes), exit 0: $(tail -1 "$dir/bad.out")" ||
    fail "SIGTERM: rc $rc, $(cat "$dir/inflight") $(tail -2 "$dir/bad.out")"

# ---- --context N: each slot holds N positions (today's models read 32k-128k: 8 slots of Qwen3-0.6B's 40960 in f32
# are 75 GB); a longer request is a 400 naming it, one that fits gets the tokens it gets with the model's context ----
if start ctx "$dir/byte.bin" --threads $T --context 16; then
    r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt":"01234567890123456789","max_tokens":3}')
    c=$(post '{"prompt":"The ","max_tokens":12,"temperature":0}' | text)
    grep -q "context 16)" "$dir/ctx.out" && grep -q "a request holds 16 positions (--context N: up to the model's 64)" "$dir/ctx.out" &&
        [ "${r##* }" = 400 ] && echo "$r" | grep -q "context (--context) holds 16 tokens" && [ ${#c} = 12 ] && [ "${s#"$c"}" != "$s" ] &&
        ok "--context 16: said at start, a 20-token prompt refused, a completion of 4 + 12 tokens the first of the 30 above ('$c')" ||
        fail "--context 16: $r; '$c' against '$s'; $(head -2 "$dir/ctx.out")"
    kill $spid
    wait $spid 2> /dev/null
fi

# ---- a model whose tokenizer_config.json has a chat template (ChatML): chats by it, the answer ending at <|im_end|> (its
# context 1024 tokens: room for a prompt with tools) ----
mkdir -p "$dir/chatml"
"$DTRAIN" train --model llama-tiny --data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 2048 \
    --max-seq 1024 --seq 64 --batch 4 --steps 1 --lr 1e-30 --threads $T --quiet --save "$dir/chatml_ck" > /dev/null 2>&1 &&
    "$DTRAIN" ckpt export "$dir/chatml_ck" "$dir/chatml" > /dev/null 2>&1 && cp "$FIX/sft/tokenizer.json" "$FIX/sft/tokenizer_config.json" "$dir/chatml/" ||
    fail "making the ChatML model folder"
if start chatml "$dir/chatml" --threads 1 --slots 2; then
    grep -q "chats by the model's ChatML template" "$dir/chatml.err" && ok "serve says it renders chats by the model's ChatML template" ||
        fail "no ChatML line: $(cat "$dir/chatml.err")"
    msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"The "},{"role":"assistant","content":"GNU"},{"role":"user","content":"a"}]'
    chat=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$msgs,\"max_tokens\":8,\"temperature\":0}")
    cml='<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nThe <|im_end|>\n<|im_start|>assistant\nGNU<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n'
    want=$(post "{\"prompt\":\"$cml\",\"max_tokens\":8,\"temperature\":0,\"stop\":\"<|im_end|>\"}")
    pa=$(echo "$chat" | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["usage"]["prompt_tokens"], c["choices"][0]["message"]["content"])')
    pb=$(echo "$want" | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["usage"]["prompt_tokens"], c["choices"][0]["text"])')
    [ -n "$pa" ] && [ "$pa" = "$pb" ] && ok "/v1/chat/completions by ChatML: the completion of the template's text ($pa tokens in, then the answer)" ||
        fail "ChatML chat '$pa' against the template's completion '$pb': $chat"
    # the chat's next turn: its prompt starts with the last one's, which the slot it left holds (prefix reuse)
    next=$(echo "$chat" | python3 -c 'import json,sys; m=json.loads(sys.argv[1]); m += [{"role":"assistant","content":json.load(sys.stdin)["choices"][0]["message"]["content"]},{"role":"user","content":"b"}]; print(json.dumps(m))' "$msgs")
    turn2=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":$next,\"max_tokens\":4,\"temperature\":0}" |
        python3 -c 'import json,sys; u=json.load(sys.stdin)["usage"]; print(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])')
    [ -n "$turn2" ] && [ "${turn2#* }" -ge "${pa%% *}" ] && [ "${turn2#* }" -lt "${turn2% *}" ] &&
        ok "a chat's next turn: ${turn2#* } of its ${turn2% *} prompt tokens from the cache (the last turn's prompt was ${pa%% *})" ||
        fail "a chat's next turn: prompt and cached tokens '$turn2' (the last turn's prompt ${pa%% *})"
    # a special token drawn (<|im_start|>, id 1, made likeliest by logit_bias) leaves its text out unless
    # skip_special_tokens is false (vLLM's default and switch); its logprobs entry names it either way
    sp=$(for skip in '' ',"skip_special_tokens":false'; do
        post "{\"prompt\":\"The \",\"max_tokens\":3,\"logit_bias\":{\"1\":100},\"logprobs\":0$skip}" |
            python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(json.dumps([c["text"], c["logprobs"]["tokens"]]))'
    done | tr '\n' ' ')
    [ "$sp" = '["", ["<|im_start|>", "<|im_start|>", "<|im_start|>"]] ["<|im_start|><|im_start|><|im_start|>", ["<|im_start|>", "<|im_start|>", "<|im_start|>"]] ' ] &&
        ok "a special token's text left out (skip_special_tokens not given: vLLM's default), kept with false: $sp" ||
        fail "skip_special_tokens: $sp"
    r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}')
    echo "$r" | grep -q "'tools': this model's chat template (ChatML) renders no tool calls" && [ "${r##* }" = 400 ] &&
        ok "tools for a ChatML model: 400 naming its template" || fail "tools for ChatML: $r"
    kill -TERM $spid; wait $spid
fi
# ---- the same model with Qwen 3's template (tests/fixtures/sft/qwen3_prompts.json holds it): chats by it, thinking off
# ending the prompt with an empty think block; an answer that does not open with <think> is all content, whole and
# streamed alike (the split of one that does: test_sft) ----
mkdir -p "$dir/qwen3" && cp "$dir/chatml/"* "$dir/qwen3/"
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["chat_template"]; json.dump({"chat_template": t, "eos_token": "<|endoftext|>"}, open(sys.argv[2], "w"))' \
    "$FIX/sft/qwen3_prompts.json" "$dir/qwen3/tokenizer_config.json"
if start qwen3 "$dir/qwen3" --threads 1 --slots 2; then
    grep -q "chats by the model's Qwen 3 (thinking" "$dir/qwen3.err" && ok "serve says it renders chats by the model's Qwen 3 template" ||
        fail "no Qwen 3 line: $(cat "$dir/qwen3.err")"
    body='{"messages":[{"role":"user","content":"The "}],"max_tokens":8,"temperature":0,"chat_template_kwargs":{"enable_thinking":false}'
    chat=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "$body}")
    streamed=$(curl -s -N "http://127.0.0.1:$port/v1/chat/completions" -d "$body,\"stream\":true}" | python3 -c '
import json, sys
t, r = "", 0
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        d = json.loads(line[6:])["choices"][0]["delta"]; t += d.get("content") or ""; r += "reasoning_content" in d
print(r, t, end="")')
    q3='<|im_start|>user\nThe <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
    want=$(post "{\"prompt\":\"$q3\",\"max_tokens\":8,\"temperature\":0,\"stop\":\"<|im_end|>\"}")
    pa=$(echo "$chat" | python3 -c 'import json,sys; c=json.load(sys.stdin); m=c["choices"][0]["message"]; print(c["usage"]["prompt_tokens"], "reasoning_content" in m, m["content"])')
    pb=$(echo "$want" | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["usage"]["prompt_tokens"], False, c["choices"][0]["text"])')
    [ -n "$pa" ] && [ "$pa" = "$pb" ] && [ "$streamed" = "0 ${pa#* False }" ] &&
        ok "/v1/chat/completions by Qwen 3's template, thinking off: the completion of its text, no reasoning, streamed alike ($pa)" ||
        fail "Qwen 3 chat '$pa' (streamed '$streamed') against the template's completion '$pb': $chat"
    # with tools: the prompt the template's with them (the fixture's last case: an earlier call and its results), the
    # answer the completion of its text (this model calls nothing: content, no tool_calls)
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["cases"][-1]; print(json.dumps({"messages": c["messages"], "tools": c["tools"],
        "max_tokens": 8, "temperature": 0, "chat_template_kwargs": {"enable_thinking": c["enable_thinking"]}})); print(json.dumps({"prompt": c["text"],
        "max_tokens": 8, "temperature": 0, "stop": "<|im_end|>"}))' "$FIX/sft/qwen3_prompts.json" > "$dir/tools.json"
    chat=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "$(sed -n 1p "$dir/tools.json")")
    want=$(post "$(sed -n 2p "$dir/tools.json")")
    pa=$(echo "$chat" | python3 -c 'import json,sys; c=json.load(sys.stdin); m=c["choices"][0]["message"]; print(c["usage"]["prompt_tokens"], "tool_calls" in m, m["content"])')
    pb=$(echo "$want" | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["usage"]["prompt_tokens"], False, c["choices"][0]["text"])')
    [ -n "$pa" ] && [ "$pa" = "$pb" ] && [ "${pa%% *}" -gt 200 ] &&
        ok "/v1/chat/completions with tools by Qwen 3's template: the completion of its text with them ($pa)" ||
        fail "Qwen 3 chat with tools '$pa' against the template's completion '$pb': $chat"
    tools='"tools":[{"type":"function","function":{"name":"f"}}]'
    streamed=$(curl -s -N "http://127.0.0.1:$port/v1/chat/completions" -d "$(sed -n 1p "$dir/tools.json" | sed 's/}$/, "stream": true}/')" | python3 -c '
import json, sys
t, calls, fin = "", 0, None
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        c = json.loads(line[6:])["choices"][0]; t += c["delta"].get("content") or ""; calls += "tool_calls" in c["delta"]; fin = c["finish_reason"] or fin
print(fin, calls, t, end="")')
    wf=$(echo "$chat" | python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(c["finish_reason"], 0, c["message"]["content"], end="")')
    [ -n "$wf" ] && [ "$streamed" = "$wf" ] && ok "the same with tools streamed: the same text and finish ($streamed)" ||
        fail "streamed with tools '$streamed' against whole '$wf'"
    r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$tools,\"tool_choice\":\"required\"}")
    echo "$r" | grep -q "'tool_choice' is not supported by this server (auto or none)" && [ "${r##* }" = 400 ] && ok "tool_choice required: 400 naming it" ||
        fail "tool_choice required: $r"
    kill -TERM $spid; wait $spid
fi

# ---- a model fine-tuned on one chat whose answer calls a tool (tool_model), by Llama 3.1's template (JSON calls) and by
# Qwen 2.5's (Hermes's <tool_call> blocks): asked the chat's question with its tools, it answers the call, which the server reads
# into OpenAI's tool_calls, whole and streamed alike (finish_reason tool_calls, no content) ----
for form in "llama3.1 llama3_1 llama3_tokenizer.json <|eot_id|>" "qwen2.5 qwen2_5 tokenizer.json <|im_end|>"; do
    read -r kind fix tokf eot <<< "$form"
    m="$dir/calls_$fix"
    tool_model "$m" "$FIX" "$fix" "$tokf" "$kind" "$eot" 1 || continue
    if start "calls_$fix" "$m/model" --threads 1 --slots 2; then
        r=$(python3 "$HERE/serve_client.py" calls "$port" "$(cat "$m/request.json")" 2>&1)
        want='["tool_calls", [["add", "{\"a\": 2, \"b\": 3}"]], null]'
        [ "$r" = "[$want, $want]" ] && ok "fine-tuned on a chat with a call by $kind's template, served: the call in tool_calls, whole and streamed ($r)" ||
            fail "$kind's tool call served: $r"
        kill -TERM $spid; wait $spid
    fi
    [ "$kind" = llama3.1 ] || continue
    # generation_config.json's eos_token_id end an answer too (Llama 3.1's <|eom_id|> beside <|eot_id|>): listing the
    # answer's first token ("{", its call's opening) ends it there, empty; an id beyond the vocabulary is refused
    open=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["vocab"]["{"])' "$m/model/tokenizer.json")
    echo "{\"eos_token_id\": [$open, 0]}" > "$m/model/generation_config.json"
    if start "ends_$fix" "$m/model" --threads 1 --slots 2; then
        r=$(python3 "$HERE/serve_client.py" calls "$port" "$(cat "$m/request.json")" 2>&1)
        [ "$r" = '[["stop", [], ""], ["stop", [], null]]' ] &&
            ok "generation_config.json's eos_token_id [$open, 0]: the answer ends at its first token, '{' ($r)" || fail "generation_config's ends: $r"
        kill -TERM $spid; wait $spid
    fi
    echo '{"eos_token_id": [1, 99999999]}' > "$m/model/generation_config.json"
    "$DTRAIN" serve "$m/model" --port 0 --threads 1 > "$dir/badgen.out" 2>&1
    [ $? -ne 0 ] && grep -q "generation_config.json: eos_token_id holds a number, not a token id of the model's" "$dir/badgen.out" &&
        ok "a generation_config.json whose eos_token_id is no token: refused naming it" || fail "bad generation_config: $(tail -1 "$dir/badgen.out")"
    rm "$m/model/generation_config.json"
done

# ---- OpenAI's Python client ----
if ! python3 -c 'import openai' 2> /dev/null && [ -n "$PYDIR" ]; then
    [ -d "$PYDIR/openai" ] || python3 -m pip install -q --disable-pip-version-check --target "$PYDIR" openai > "$dir/pip.log" 2>&1
    export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}
fi
if python3 -c 'import openai' 2> /dev/null; then
    start openai "$dir/byte.bin" --threads 1 --slots 2 || exit 1
    r=$(python3 "$HERE/serve_client.py" openai "$port" "The " 2>&1)
    w=$(echo "$r" | sed -n 1p) sm=$(echo "$r" | sed -n 2p) sp=$(echo "$r" | sed -n 3p) ch=$(echo "$r" | sed -n 4p) lq=$(echo "$r" | sed -n 5p) su=$(echo "$r" | sed -n 6p) nc=$(echo "$r" | sed -n 7p)
    [ "$w" = "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "${s:0:20}")" ] && [ "$sm" = "$w" ] && echo "$sp" | grep -q '^\[true, "stop"' &&
        ok "the openai package: completions.create whole $w, streamed the same, stop: $sp" || fail "openai client: $r"
    # [role, whole, streamed, finish, first delta's role, last finish]: the chat's text streamed alike
    python3 -c 'import json,sys; c=json.loads(sys.argv[1]); sys.exit(not (c[0]=="assistant" and c[1]==c[2] and c[3] in ("stop","length") and c[4]=="assistant" and c[5]==c[3]))' "$ch" &&
        ok "the openai package: chat.completions.create whole and streamed alike: $ch" || fail "openai chat: $ch"
    # [the first prompt token's logprob, the prompt's tokens, the rest below 0, a chat's tokens, their alternatives' counts]
    python3 -c 'import json,sys; c=json.loads(sys.argv[1]); sys.exit(not (c[0] is None and c[1]==4 and c[2] and c[3]==5 and c[4]==[2]*5))' "$lq" &&
        ok "the openai package: a prompt's logprobs (echo, max_tokens 0) and a chat's top_logprobs: $lq" || fail "openai logprobs: $lq"
    [ "$su" = "[0, 7, true]" ] && ok "the openai package: stream_options include_usage, [last chunk's choices, its completion_tokens, the others' usage null]: $su" ||
        fail "openai stream usage: $su"
    [ "$nc" = "[[0, 1, 2], 12]" ] && ok "the openai package: n 3, [the choices' indices, the tokens drawn]: $nc" || fail "openai n: $nc"
    kill -TERM $spid; wait $spid
else
    echo "skip: the openai package is not installed and could not be ($(tail -1 "$dir/pip.log" 2> /dev/null)); not counted"
fi
echo "$passed passed, $failed failed"
[ $failed = 0 ]
