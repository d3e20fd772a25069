#!/bin/bash
# dtrain train --device cuda end to end on a machine without a GPU: the trainer's GPU path (the plugin it loads, the
# program's device, the engine's gpu strategy, a save, a resume) with the host's kernels in the GPU's place (a plugin
# of tests/gpu_host.c, named by DTRAIN_GPU_PLUGIN) gives the CPU trainer's losses, parameters and optimizer state bit
# for bit, also cut in two and resumed, in bf16 too, and a Llama's; two ranks with data parallelism give DDP's and one process's
# losses; what the GPU path does not run is refused by name; the real plugin, where
# there is no GPU, refuses clearly (where there is one, bench/gpu_check.sh checks it).
# usage: gpu_train.sh DTRAIN HOST_PLUGIN
set -u
DTRAIN=$1
HOST=$(realpath "$2")
. "$(dirname "$0")/checks.sh"
# Each dtrain here takes about a second: one that is stuck ends at 60 s (GPU_TRAIN_LIMIT; exit 124) and fails its own check by name,
# rather than holding the whole test until ctest's limit with nothing said. The threads of generate and serve (given
# no --threads) are 2, not every core: a many-core machine, or a CPU quota below its cores, would otherwise run teams
# of every core for each tiny step.
real_dtrain=$DTRAIN
DTRAIN=$dir/dtrain
printf '#!/bin/sh\nexec timeout -k 5 %s "%s" "$@"\n' "${GPU_TRAIN_LIMIT:-60}" "$real_dtrain" > "$DTRAIN"
chmod +x "$DTRAIN"
export OMP_NUM_THREADS=2
gpl_tokens
model=(--data "$dir/train.bin" --val-data "$dir/train.bin" --eval-every 3 --eval-batches 2 --layers 2 --channels 64 --heads 4
       --vocab 256 --max-seq 64 --seq 64 --batch 4 --threads 1 --quiet --steps 6 --lr 1e-3 --schedule cosine --warmup 2
       --grad-clip 1.0 --weight-decay 0.1 --grad-accum 2)
losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2; }

"$DTRAIN" train "${model[@]}" --save "$dir/cpu" --metrics "$dir/cpu.jsonl" > "$dir/out" 2>&1 || fail "the CPU run: $(tail -2 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${model[@]}" --device cuda --save "$dir/gpu" --metrics "$dir/gpu.jsonl" > "$dir/out" 2>&1 ||
    fail "the --device cuda run (host kernels): $(tail -2 "$dir/out")"
a=$dir/cpu/step-00000006 b=$dir/gpu/step-00000006
if [ "$(losses "$dir/cpu.jsonl" | wc -l)" = 6 ] && [ "$(losses "$dir/cpu.jsonl")" = "$(losses "$dir/gpu.jsonl")" ] &&
   [ "$(field val_loss "$dir/cpu.jsonl")" = "$(field val_loss "$dir/gpu.jsonl")" ] &&
   cmp -s "$a/params.f32" "$b/params.f32" && cmp -s "$a/optim.f32" "$b/optim.f32"; then
    ok "--device cuda on host kernels = the CPU trainer: 6 steps' losses, evaluations, saved parameters and AdamW state ($(losses "$dir/gpu.jsonl" | tail -1))"
else
    fail "--device cuda on host kernels differs: losses $(losses "$dir/cpu.jsonl" | tr '\n' ' ') vs $(losses "$dir/gpu.jsonl" | tr '\n' ' '); $(cmp "$a/params.f32" "$b/params.f32" 2>&1)"
fi

# generate --device cuda: the cache's decoder on the device (src/gpu/decode.c, host kernels here) draws the CPU
# decoder's tokens (sampled at temperature 1 from logits that agree to about 1e-6: a draw falls on the other side of
# a boundary about once in a million), over 90 tokens of a 64-position context (the window slides: its last half read again)
gen=(generate --model "$a" --ids --prompt "1,2,3,4,5" --tokens 90 --temperature 1 --top-k 0 --seed 7)
"$DTRAIN" "${gen[@]}" > "$dir/gc" 2> "$dir/out" || fail "generate on the CPU: $(tail -1 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" "${gen[@]}" --device cuda > "$dir/gg" 2> "$dir/out" || fail "generate --device cuda: $(tail -1 "$dir/out")"
[ "$(wc -w < "$dir/gc")" -ge 90 ] && [ "$(tr ' ' '\n' < "$dir/gc" | sort -u | wc -l)" -ge 20 ] && cmp -s "$dir/gc" "$dir/gg" &&
    ok "generate --device cuda on host kernels = the CPU decoder: 90 sampled tokens ($(cut -c1-40 "$dir/gg")...)" ||
    fail "generate --device cuda differs: $(head -c 200 "$dir/gc") vs $(head -c 200 "$dir/gg")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" "${gen[@]}" --device cuda --quantize int8 > "$dir/out" 2>&1
[ $? = 2 ] && grep -q "device cuda runs the cache's decoder on one GPU in f32" "$dir/out" && ok "generate --device cuda --quantize int8: refused by name" ||
    fail "generate --device cuda --quantize int8: $(tail -1 "$dir/out")"

# serve --device cuda: four requests at once (continuous batching on the device's decoder), each the CPU server's
# text for its seed
serve_four() { # NAME PLUGIN ARGS...: a server of $a with ARGS, four requests sent at once into $dir/NAME.1-4, then stopped
    local name=$1 plugin=$2 port="" srv s cpids=()
    shift 2
    DTRAIN_GPU_PLUGIN=$plugin "$DTRAIN" serve "$a" --port 0 --slots 4 --budget 64 "$@" > "$dir/$name.srv" 2>&1 &
    srv=$!
    for _ in $(seq 200); do
        port=$(grep -o 'listening on http://[^ ]*' "$dir/$name.srv" | grep -o '[0-9]*$')
        [ -n "$port" ] || ! kill -0 $srv 2> /dev/null && break
        sleep 0.1
    done
    for s in 1 2 3 4; do
        curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -d "{\"prompt\":\"The \",\"max_tokens\":30,\"temperature\":1,\"seed\":$s}" \
            > "$dir/$name.$s" &
        cpids+=($!)
    done
    wait "${cpids[@]}"
    kill -TERM $srv 2> /dev/null
    # a server that does not stop fails by name within 20 s, not the test's limit later with nothing said
    for _ in $(seq 200); do kill -0 $srv 2> /dev/null || break; sleep 0.1; done
    kill -0 $srv 2> /dev/null && { kill -KILL $srv; fail "serve ($name) still running 20 s after SIGTERM"; }
    wait $srv
}
serve_four scpu ""
serve_four sgpu "$HOST" --device cuda
same=0
completion() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$1" 2> /dev/null; }
for s in 1 2 3 4; do
    t=$(completion "$dir/sgpu.$s")
    [ ${#t} -ge 10 ] && [ "$t" = "$(completion "$dir/scpu.$s")" ] && same=$((same + 1))
done
[ $same = 4 ] && grep -q "f32 weights on GPU 0" "$dir/sgpu.srv" &&
    ok "serve --device cuda on host kernels: 4 requests at once, each the CPU server's text for its seed" ||
    fail "serve --device cuda: $same of 4 requests equal the CPU server's; $(head -1 "$dir/sgpu.srv"); $(head -c 200 "$dir/sgpu.1")"
# a decoder that does not fit the GPU (64 slots' cache in 1 MiB): refused before anything is asked of it, naming the sizes
DTRAIN_GPU_HOST_FREE_MB=1 DTRAIN_GPU_PLUGIN=$HOST timeout 60 "$DTRAIN" serve "$a" --port 0 --slots 64 --device cuda > "$dir/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q -- "--device cuda: decoding this model needs .* GiB of the GPU (the f32 weights .*the cache of 64 slots of 64 positions" "$dir/out" &&
    ! grep -q listening "$dir/out" && ok "serve --device cuda, a GPU with 1 MiB free: refused before listening, naming the cache" ||
    fail "serve --device cuda on a small GPU: exit $rc: $(tail -1 "$dir/out")"
# plan --device cuda: the bytes the pre-flight counts (train's refusal says them) and a step timed; what it does not
# plan, said
pl=(--layers 2 --channels 512 --heads 8 --vocab 256 --max-seq 64 --seq 64 --batch 4 --precision bf16) # a layer 0.05 GiB: a layer miscounted shows
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" plan "${pl[@]}" --device cuda --json > "$dir/plan.json" 2> "$dir/out" || fail "plan --device cuda: $(tail -1 "$dir/out")"
DTRAIN_GPU_HOST_FREE_MB=1 DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${pl[@]}" --data "$dir/train.bin" --steps 1 --device cuda > "$dir/out" 2>&1
want=$(grep -o 'needs [0-9.]* GiB' "$dir/out" | grep -o '[0-9.]*')
got=$(python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); print("%.2f %d" % (o["total"] / 2**30, o["step_ms"] > 0))' "$dir/plan.json" 2> /dev/null)
[ -n "$want" ] && [ "$got" = "$want 1" ] && ok "plan --device cuda on host kernels: the pre-flight's $want GiB, a step timed" ||
    fail "plan --device cuda: '$got' against the pre-flight's '$want GiB'"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" plan "${pl[@]}" --device cuda --nproc 2 > "$dir/out" 2>&1
[ $? = 2 ] && grep -q "plans one GPU's step; 2 ranks" "$dir/out" && ok "plan --device cuda --nproc 2: said, not priced" ||
    fail "plan --device cuda --nproc 2: $(tail -1 "$dir/out")"

# bf16 (autocast's mixed precision; the Linears' products bf16 on the device): the CPU's bf16 run bit for bit. B 1:
# 64 tokens, one block of the CPU's 16-bit head (which sums its weight gradient a block of tokens at a time; the
# host's stand-in, in one product: the same sums where there is one block)
"$DTRAIN" train "${model[@]}" --batch 1 --precision bf16 --save "$dir/cb.bin" --metrics "$dir/cb.jsonl" > "$dir/out" 2>&1 ||
    fail "bf16 on the CPU: $(tail -2 "$dir/out")"
"$DTRAIN" train "${model[@]}" --batch 1 --metrics "$dir/c1.jsonl" > "$dir/out" 2>&1 || fail "f32 at B 1 on the CPU: $(tail -2 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${model[@]}" --batch 1 --precision bf16 --device cuda --save "$dir/gb.bin" --metrics "$dir/gb.jsonl" > "$dir/out" 2>&1 ||
    fail "bf16 --device cuda: $(tail -2 "$dir/out")"
if [ "$(losses "$dir/cb.jsonl" | wc -l)" = 6 ] && [ "$(losses "$dir/cb.jsonl")" = "$(losses "$dir/gb.jsonl")" ] &&
   [ "$(losses "$dir/cb.jsonl")" != "$(losses "$dir/c1.jsonl")" ] && cmp -s "$dir/cb.bin" "$dir/gb.bin"; then
    ok "--precision bf16 --device cuda on host kernels = the CPU's bf16 run (not its f32): 6 losses and the saved weights ($(losses "$dir/gb.jsonl" | tail -1))"
else
    fail "bf16 on the device differs: $(losses "$dir/cb.jsonl" | tr '\n' ' ') vs $(losses "$dir/gb.jsonl" | tr '\n' ' ')"
fi

# --attention blockwise: the device's flash attention (each row's log-sum-exp kept), the CPU's blockwise kernels (128
# tokens: one block of the CPU's 16-bit head, as above)
fl=(--layers 2 --channels 128 --heads 4 --vocab 256 --max-seq 128 --seq 128 --batch 1 --steps 3 --data "$dir/train.bin" --precision bf16
    --attention blockwise --threads 1)
"$DTRAIN" train "${fl[@]}" --quiet --metrics "$dir/fc.jsonl" > "$dir/out" 2>&1 || fail "blockwise bf16 on the CPU: $(tail -2 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${fl[@]}" --device cuda --metrics "$dir/fg.jsonl" > "$dir/out" 2>&1 || fail "flash --device cuda: $(tail -2 "$dir/out")"
[ "$(losses "$dir/fc.jsonl" | wc -l)" = 3 ] && [ "$(losses "$dir/fc.jsonl")" = "$(losses "$dir/fg.jsonl")" ] &&
    grep -q "attention on the GPU: flash" "$dir/out" &&
    ok "--attention blockwise --precision bf16 --device cuda: flash attention on host kernels = the CPU's blockwise, 3 losses" ||
    fail "flash on the device: $(losses "$dir/fc.jsonl" | tr '\n' ' ') vs $(losses "$dir/fg.jsonl" | tr '\n' ' '); $(grep attention "$dir/out")"

# --attention cudnn: cuDNN's fused attention (on host kernels its arithmetic's stand-in: the CPU's blockwise attention,
# each d(q|k|v) rounded to bf16, which GPT-2's q|k|v Linear rounds anyway), the same 3 losses as the CPU's blockwise;
# without --device cuda or in f32, refused by name
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${fl[@]}" --attention cudnn --device cuda --metrics "$dir/fn.jsonl" > "$dir/out" 2>&1 ||
    fail "cudnn --device cuda: $(tail -2 "$dir/out")"
[ "$(losses "$dir/fc.jsonl")" = "$(losses "$dir/fn.jsonl")" ] && grep -q "attention on the GPU: cuDNN's fused attention" "$dir/out" &&
    ok "--attention cudnn --precision bf16 --device cuda: its path on host kernels = the CPU's blockwise, 3 losses" ||
    fail "cudnn on the device: $(losses "$dir/fc.jsonl" | tr '\n' ' ') vs $(losses "$dir/fn.jsonl" | tr '\n' ' '); $(grep attention "$dir/out")"
for bad in "--attention cudnn" "--attention cudnn --device cuda --precision fp32"; do
    DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${fl[@]}" $bad > "$dir/out" 2>&1
    [ $? = 2 ] && grep -q -- "--attention cudnn is cuDNN's fused attention on the GPU, in 16 bits: it needs --device cuda and --precision bf16" "$dir/out" &&
        ok "train ... $bad: refused by name" || fail "$bad: $(tail -2 "$dir/out")"
done

# in f32 without --tf32 there is no flash attention: said, the run goes on with the probabilities
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${fl[@]}" --precision fp32 --device cuda > "$dir/out" 2>&1 &&
    grep -q "attention on the GPU: T x T probabilities kept, products in f32 (--attention blockwise takes flash attention in a bf16 or --tf32 run" "$dir/out" &&
    ok "--attention blockwise in f32 without --tf32: the T x T probabilities, and the run says why" ||
    fail "blockwise in f32: $(grep -h 'attention\|error' "$dir/out")"

# where the T x T probabilities would not fit (a GPU with 100 MiB free; 150 with them), flash attention, said so
fit=(--layers 2 --channels 128 --heads 4 --vocab 256 --max-seq 1024 --seq 1024 --batch 2 --steps 1 --data "$dir/train.bin" --precision bf16 --threads 1)
DTRAIN_GPU_PLUGIN=$HOST DTRAIN_GPU_HOST_FREE_MB=100 "$DTRAIN" train "${fit[@]}" --device cuda > "$dir/out" 2>&1 &&
    grep -q "attention on the GPU: flash .*would not fit the GPU" "$dir/out" &&
    DTRAIN_GPU_PLUGIN=$HOST DTRAIN_GPU_HOST_FREE_MB=200 "$DTRAIN" train "${fit[@]}" --device cuda > "$dir/out2" 2>&1 &&
    grep -q "attention on the GPU: T x T probabilities kept, products in f32" "$dir/out2" &&
    ok "T 1024 on a GPU with 100 MiB free: flash attention (the T x T probabilities would not fit); with 200, they are kept" ||
    fail "the flash fallback: $(grep -h 'attention\|error' "$dir/out" "$dir/out2")"

# the Llama family (rotary positions, RMSNorm, SwiGLU, 2 K/V heads for 8, an untied head)
llama=(--model llama-tiny --vocab 256 --data "$dir/train.bin" --seq 64 --batch 4 --threads 1 --quiet --steps 4 --lr 1e-3 --grad-clip 1.0)
"$DTRAIN" train "${llama[@]}" --metrics "$dir/lc.jsonl" --save "$dir/lc.safetensors" > "$dir/out" 2>&1 || fail "llama on the CPU: $(tail -2 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${llama[@]}" --device cuda --metrics "$dir/lg.jsonl" --save "$dir/lg.safetensors" > "$dir/out" 2>&1 ||
    fail "llama --device cuda: $(tail -2 "$dir/out")"
if [ "$(losses "$dir/lc.jsonl" | wc -l)" = 4 ] && [ "$(losses "$dir/lc.jsonl")" = "$(losses "$dir/lg.jsonl")" ] && cmp -s "$dir/lc.safetensors" "$dir/lg.safetensors"; then
    ok "llama-tiny --device cuda on host kernels = the CPU trainer: 4 losses and the saved weights ($(losses "$dir/lg.jsonl" | tail -1))"
else
    fail "llama-tiny --device cuda differs: $(losses "$dir/lc.jsonl" | tr '\n' ' ') vs $(losses "$dir/lg.jsonl" | tr '\n' ' ')"
fi

# a Hugging Face Llama folder (sharded safetensors, 2 K/V heads for 4, untied, rope theta 500000) trained from its
# weights on the device: the CPU's losses and saved weights
folder=$(dirname "$0")/fixtures/llama/gqa_folder
python3 -c "
import struct, sys
toks = [(i * 37) % 64 for i in range(20000)]
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, len(toks), *[0] * 253) + struct.pack('<%dH' % len(toks), *toks))" "$dir/hf.bin"
hf=(--model "$folder" --data "$dir/hf.bin" --seq 32 --batch 4 --steps 4 --lr 1e-3 --threads 1 --quiet)
"$DTRAIN" train "${hf[@]}" --metrics "$dir/hc.jsonl" --save "$dir/hc.safetensors" > "$dir/out" 2>&1 || fail "the HF folder on the CPU: $(tail -1 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${hf[@]}" --device cuda --metrics "$dir/hg.jsonl" --save "$dir/hg.safetensors" > "$dir/out" 2>&1 ||
    fail "the HF folder --device cuda: $(tail -1 "$dir/out")"
[ "$(losses "$dir/hc.jsonl" | wc -l)" = 4 ] && [ "$(losses "$dir/hc.jsonl")" = "$(losses "$dir/hg.jsonl")" ] &&
    cmp -s "$dir/hc.safetensors" "$dir/hg.safetensors" &&
    ok "a Hugging Face Llama folder fine-tuned with --device cuda on host kernels = on the CPU: 4 losses and the saved weights" ||
    fail "HF folder on the device: $(losses "$dir/hc.jsonl" | tr '\n' ' ') vs $(losses "$dir/hg.jsonl" | tr '\n' ' ')"

# cut at step 3 and resumed on the device: the state goes back to it
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${model[@]}" --device cuda --save "$dir/cut" --metrics "$dir/cut.jsonl" --stop-after 3 > "$dir/out" 2>&1 &&
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${model[@]}" --device cuda --save "$dir/cut" --metrics "$dir/cut.jsonl" --resume "$dir/cut" > "$dir/out" 2>&1 ||
    fail "the cut --device cuda run: $(tail -2 "$dir/out")"
if [ "$(losses "$dir/cut.jsonl")" = "$(losses "$dir/cpu.jsonl")" ] && cmp -s "$a/params.f32" "$dir/cut/step-00000006/params.f32" &&
   cmp -s "$a/optim.f32" "$dir/cut/step-00000006/optim.f32"; then
    ok "--device cuda, 3 steps + --resume 3: the uninterrupted CPU run's losses, parameters and AdamW state bit for bit"
else
    fail "--device cuda resumed differs: $(losses "$dir/cut.jsonl" | tr '\n' ' ') vs $(losses "$dir/cpu.jsonl" | tr '\n' ' ')"
fi

# data parallelism, two ranks each with its "GPU" (the gradients staged through the host and averaged by dtrain's
# allreduce): CPU DDP's losses and one process's with the global batch; the replicas' weights checked equal
dp=(--data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 64 --threads 1 --steps 6 --lr 1e-3
    --grad-clip 1.0)
"$DTRAIN" train "${dp[@]}" --batch 4 --nproc 2 --quiet --metrics "$dir/ddp.jsonl" > "$dir/out" 2>&1 || fail "CPU DDP: $(tail -2 "$dir/out")"
"$DTRAIN" train "${dp[@]}" --batch 8 --quiet --metrics "$dir/one.jsonl" > "$dir/out" 2>&1 || fail "one process: $(tail -2 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${dp[@]}" --batch 4 --nproc 2 --device cuda --metrics "$dir/gddp.jsonl" > "$dir/out" 2>&1 ||
    fail "--nproc 2 --device cuda: $(tail -2 "$dir/out")"
w1=$(worst loss "$dir/ddp.jsonl" "$dir/gddp.jsonl" 6) w2=$(worst loss "$dir/one.jsonl" "$dir/gddp.jsonl" 6)
if grep -q "weights identical on all 2 ranks" "$dir/out" && grep -q "2 ranks, sharing a GPU or on several machines: gradients averaged through host memory" "$dir/out" &&
    awk -v a="$w1" -v b="$w2" 'BEGIN { exit !(a != "missing" && b != "missing" && a <= 1e-6 && b <= 1e-6) }'; then
    ok "--nproc 2 --device cuda (sharing GPU 0: through host memory, said): CPU DDP's losses within $w1, one process's with the global batch within $w2; the replicas agree"
else
    fail "--nproc 2 --device cuda: against DDP $w1, against one process $w2; $(grep -c identical "$dir/out") replica lines"
fi

# --trace: the GPU's work on its own track, from the device's events: each step's units forward, backward in reverse,
# then the update (llama-tiny: 4 blocks)
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${llama[@]}" --device cuda --steps 3 --trace "$dir/trace.json" > "$dir/out" 2>&1 ||
    fail "--trace on the device: $(tail -1 "$dir/out")"
got=$(python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['traceEvents']
gpu = [e['args']['name'] for e in t if e.get('ph') == 'M' and e.get('name') == 'thread_name' and e.get('tid') == 5]
spans = [e['name'] for e in t if e.get('tid') == 5 and e.get('ph') == 'B']
units = ['embedding'] + ['block %d' % l for l in range(4)] + ['head']
step = ['forward ' + u for u in units] + ['backward ' + u for u in reversed(units)] + ['optimizer']
print('ok' if gpu == ['GPU'] and spans == step * 3 else 'track %s, %d spans: %s' % (gpu, len(spans), spans[:14]))" "$dir/trace.json")
[ "$got" = ok ] && ok "--trace --device cuda: a GPU track with each step's 6 units forward, 6 backward and the update, 3 steps" ||
    fail "--trace on the device: $got"

# --report: run.json names the GPU (its memory, attention's form), and the page says so and draws the GPU track
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${llama[@]}" --device cuda --steps 3 --report "$dir/rep" > "$dir/out" 2>&1 ||
    fail "--report on the device: $(tail -1 "$dir/out")"
got=$(python3 -c "
import json, sys
d = json.load(open(sys.argv[1])).get('device') or {}
ok = d.get('kind') == 'cuda' and 'host' in d.get('name', '') and d.get('ordinal') == 0 and d.get('memory_total_bytes', 0) > 0 and d.get('attention') == 'T x T probabilities'
print('ok' if ok else 'device: %s' % d)" "$dir/rep/run.json")
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ "$got" != ok ]; then fail "--report on the device: run.json's $got"
elif [ -z "$browser" ]; then fail "no headless browser: install Debian's chromium (make test does: scripts/install-deps.sh chromium)"
else
    render_dom "$browser" "$dir/rep/report.html" "$dir/dom.html"
    dom=$(cat "$dir/dom.html")
    echo "$dom" | grep -q '<span id="render-status"[^>]*>ok</span>' && echo "$dom" | grep -q '<pre id="errors"></pre>' &&
        echo "$dom" | grep -q "<th>GPU</th><td>the host (CPU kernels in the GPU's place) (cuda:0): 0.00 of 1024.00 GiB in use" &&
        ok "--report --device cuda: run.json names the GPU, the page's Run card says it and renders without errors" ||
        fail "--report on the device: $(echo "$dom" | grep -o '<span id="render-status"[^>]*>[^<]*</span>\|<th>GPU</th><td>[^<]*' | head -2)"
fi

# a model whose last parameter is NaN: the device's step stops the run naming the step (nothing saved), or with
# --on-nonfinite skip skips every step, as on the CPU
"$DTRAIN" train "${model[@]}" --steps 1 --save "$dir/good.bin" > /dev/null 2>&1 || fail "making a model"
python3 -c "
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read()); b[-4:] = struct.pack('<f', float('nan')); open(sys.argv[2], 'wb').write(b)" "$dir/good.bin" "$dir/nan.bin"
nan=(--model "$dir/nan.bin" --data "$dir/train.bin" --seq 64 --batch 4 --threads 1 --device cuda)
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${nan[@]}" --steps 3 --save "$dir/nan-out.bin" > "$dir/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "step 1: the loss is NaN; stopping without saving" "$dir/out" && [ ! -e "$dir/nan-out.bin" ] &&
    ok "--device cuda, a NaN loss: the run stops at step 1, nothing saved" || fail "NaN on the device: exit $rc: $(tail -1 "$dir/out")"
DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${nan[@]}" --steps 3 --on-nonfinite skip --metrics "$dir/nan.jsonl" > "$dir/out" 2>&1
rc=$?
[ $rc = 0 ] && [ "$(grep -c '"skipped":true' "$dir/nan.jsonl")" = 3 ] && ok "--device cuda --on-nonfinite skip: 3 steps skipped, the run ends" ||
    fail "skip on the device: exit $rc: $(tail -1 "$dir/out")"

# what the GPU path does not run yet: refused, by name, before anything trains
refused() { # WHAT ARGS...: exits 1 naming WHAT
    local what=$1
    shift
    DTRAIN_GPU_PLUGIN=$HOST "$DTRAIN" train "${model[@]}" --device cuda "$@" > "$dir/out" 2>&1
    local rc=$?
    if [ $rc = 1 ] && grep -q -- "--device cuda: .*$what" "$dir/out"; then ok "--device cuda $*: refused, naming $what"
    else fail "--device cuda $*: exit $rc: $(tail -1 "$dir/out")"; fi
}
refused "fp16" --precision fp16
refused "--recompute" --recompute
refused "sgd" --optimizer sgd
refused "LoRA" --lora-rank 4
refused "ZeRO" --nproc 2 --strategy zero2
refused "a mixture of experts" --model mixtral-tiny
"$DTRAIN" train "${model[@]}" --device cuda:x > "$dir/out" 2>&1
[ $? = 2 ] && grep -q "expected cpu, cuda or cuda:N" "$dir/out" && ok "--device cuda:x: a usage error naming the forms" ||
    fail "--device cuda:x: $(tail -1 "$dir/out")"

# a model that does not fit the GPU: refused before anything is asked of it, naming what it needs and what is free
DTRAIN_GPU_PLUGIN=$HOST DTRAIN_GPU_HOST_FREE_MB=1 "$DTRAIN" train "${model[@]}" --device cuda > "$dir/out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q -- "--device cuda: this model at B 4 x T 64 needs .* GiB of the GPU (parameters, gradients and AdamW's moments .*activations .*has 0.00 GiB free" "$dir/out"; then
    ok "a GPU with 1 MiB free: refused before the first step ($(grep -o 'needs [0-9.]* GiB' "$dir/out"))"
else
    fail "a GPU with 1 MiB free: exit $rc: $(tail -1 "$dir/out")"
fi

# the real plugin (or a build without one) where there is no GPU: a clear error, nothing trained
if [ -e /dev/nvidiactl ]; then
    ok "a GPU is here: bench/gpu_check.sh checks the real plugin"
else
    "$DTRAIN" train "${model[@]}" --device cuda > "$dir/out" 2>&1
    rc=$?
    if [ $rc = 1 ] && grep -qE -- "--device cuda: (no usable NVIDIA GPU here|this dtrain was built without CUDA|the GPU plugin .* does not load)" "$dir/out" &&
       ! grep -q '"loss"' "$dir/out"; then
        ok "--device cuda without a GPU: refused ($(grep -o -- '--device cuda: [^(]*' "$dir/out" | head -1))"
    else
        fail "--device cuda without a GPU: exit $rc: $(tail -1 "$dir/out")"
    fi
    # generate, serve and plan alike: the error, and nothing generated, served or planned first
    for cmd in "generate --model $a --ids --prompt 1,2,3 --tokens 5" "serve $a --port 0" "plan ${model[*]}"; do
        # shellcheck disable=SC2086
        timeout 60 "$DTRAIN" $cmd --device cuda > "$dir/out" 2>&1
        rc=$?
        if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -qE -- "--device cuda: (no usable NVIDIA GPU here|this dtrain was built without CUDA|the GPU plugin .* does not load)" "$dir/out" &&
           ! grep -qE '^1,2,3|listening|step time' "$dir/out"; then
            ok "${cmd%% *} --device cuda without a GPU: refused before any output"
        else
            fail "${cmd%% *} --device cuda without a GPU: exit $rc: $(head -c 300 "$dir/out")"
        fi
    done
fi
echo "gpu_train: $passed passed, $failed failed"
[ $failed -eq 0 ]
