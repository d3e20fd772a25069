#!/bin/bash
# The GPU check, in one call on a lent GPU machine (docs/gpu.md records what it printed): the device, the GPU kernels
# against the CPU kernels, the model program on the GPU against the CPU (GPT-2 d6 and 124M, 20 steps, f32 and bf16),
# the training step's speed and where it goes (124M, T 1024: f32, TF32, bf16), dtrain train --device cuda against the
# CPU trainer and at 124M with a save, beside PyTorch's step (bf16 compiled; f32, TF32 eager) and llm.c's (bf16), and
# Hugging Face's decoding at batch 1 and 32 beside dtrain's GPU decoder (checked against the CPU decoder first). Each part prints its figures and goes on if another failed.
# The binaries come built (scripts/gpu-carry.sh packs DIR/gpu-bin.tar.xz; llm.c's train_gpt2cu and train_gpt2cu-cudnn
# beside it, from scripts/build-llmc.sh).
# PARTS (a comma list; all by default): open, kernels, lm, lmbf16, bench, benchbf16, train, trainbf16, ddp, trace, oom,
# llmc, torch (bf16 compiled), torchf32, plan (the planner's step against the runs'), gdecode (dtrain's decoder on the GPU against the CPU's, generate --device cuda),
# decode (dtrain's decoding speed and Hugging Face's generate, in the same call), cudnn (--attention cudnn: cuDNN's
# fused attention against the CPU's bf16 run and its training step's speed beside the others').
# usage: bench/gpu_check.sh [DIR] [PARTS]      (on the GPU machine, in the repository's root; the log goes to $OUT too)
set -u
dir=${1:-.gpu}
parts=,${2:-open,kernels,lm,lmbf16,bench,benchbf16,cudnn,train,trainbf16,ddp,trace,oom,plan,llmc,torch,torchf32,gdecode,decode},
want() { [[ $parts == *,$1,* ]]; }
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
part() { echo; echo "== $*  ($(date +%T))"; }
results=()
run() { # NAME COMMAND...: runs it, keeping whether it passed
  local name=$1
  shift
  "$@"
  local rc=$?
  results+=("$(printf '%-44s %s' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
}

part "the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
lscpu | grep -E "Model name|^CPU\(s\)"
root=/tmp/dtgpu
mkdir -p $root
tar -C $root -xJf "$dir/gpu-bin.tar.xz" || echo "no $dir/gpu-bin.tar.xz: run scripts/gpu-carry.sh first"
# cuBLAS, and what --attention cudnn and NCCL load (cuDNN, the runtime and NVRTC its frontend loads beside it, NCCL):
# PyTorch's wheels have them all; one search of the disk for the five
libs=$(find / \( -name libcublas.so.13 -o -name libcudnn.so.9 -o -name libcudart.so.13 -o -name libnvrtc.so.13 -o -name libnccl.so.2 \) \
  -not -path '/proc/*' 2>/dev/null)
dir_of() { dirname "$(grep -m1 "/$1\$" <<< "$libs")"; }
export LD_LIBRARY_PATH=$root/lib:/usr/local/cuda/lib64:$(dir_of libcublas.so.13):$(dir_of libcudnn.so.9):$(dir_of libcudart.so.13):$(dir_of libnvrtc.so.13):$(dir_of libnccl.so.2):${LD_LIBRARY_PATH:-}
echo "libraries from: $LD_LIBRARY_PATH"
bin=$root/bin
# random GPT-2 tokens in llm.c's token file (dtrain's too): a header of 256 int32 (magic 20240520, version 1, the
# count), then uint16 tokens
python3 -c '
import numpy as np
rng = np.random.default_rng(0)
for name in ("train", "val"):
    toks = rng.integers(0, 50257, 2_000_000, dtype=np.uint16)
    h = np.zeros(256, dtype=np.int32); h[0], h[1], h[2] = 20240520, 1, len(toks)
    with open(f"/tmp/llmc_{name}.bin", "wb") as f:
        f.write(h.tobytes()); f.write(toks.tobytes())
'

if want open; then
  part "--device cuda opens the GPU, refuses what it cannot do"
  run "test_gpu_open" $bin/test_gpu_open
fi
if want kernels; then
  part "every GPU kernel against its CPU kernel"
  run "test_gpu_kernels" $bin/test_gpu_kernels
fi
if want lm; then
  part "GPT-2 d6 on the GPU against the CPU, 20 steps, f32"
  run "test_gpu_lm d6" $bin/test_gpu_lm d6 4 64 20 tol=1e-5
  part "GPT-2 124M on the GPU against the CPU, 20 steps, f32"
  run "test_gpu_lm 124M" $bin/test_gpu_lm 124M 4 64 20 tol=1e-5
  part "Llama: llama-tiny (8 heads, 2 K/V heads, untied) and SmolLM-135M's shape on the GPU against the CPU, f32"
  run "test_gpu_lm llama-tiny" $bin/test_gpu_lm llama-tiny 4 64 20 tol=1e-5
  run "test_gpu_lm smollm-135m" $bin/test_gpu_lm smollm-135m 4 64 10 tol=1e-5
fi
if want lmbf16; then
  part "bf16 (autocast's mixed precision, the Linears on the tensor cores) on the GPU against the CPU's bf16, 20 steps, and the floor"
  bf=(tol=1e-3 bf16 gtol=5e-2 floor)
  run "test_gpu_lm d6 bf16" $bin/test_gpu_lm d6 4 64 20 "${bf[@]}"
  run "test_gpu_lm d6 bf16 T 256" $bin/test_gpu_lm d6 2 256 20 "${bf[@]}"
  run "test_gpu_lm d6 bf16 T 256 flash" $bin/test_gpu_lm d6 2 256 20 "${bf[@]}" flash
  run "test_gpu_lm 124M bf16" $bin/test_gpu_lm 124M 4 64 20 "${bf[@]}"
  run "test_gpu_lm 124M bf16 lr 3e-4" $bin/test_gpu_lm 124M 4 64 20 "${bf[@]}" lr=3e-4
  run "test_gpu_lm llama-tiny bf16" $bin/test_gpu_lm llama-tiny 4 64 20 "${bf[@]}"
fi
if want bench; then
  part "dtrain's training step: 124M, B 16, T 1024"
  run "gpu_lm_bench f32" $bin/gpu_lm_bench 124M 16 1024 10
  run "gpu_lm_bench tf32" $bin/gpu_lm_bench 124M 16 1024 10 tf32
fi
if want benchbf16; then
  part "dtrain's training step in bf16: 124M, T 1024, B 16 (attention's products f32; TF32; flash), B 32 and 64 (TF32)"
  run "gpu_lm_bench bf16" $bin/gpu_lm_bench 124M 16 1024 10 bf16
  run "gpu_lm_bench bf16,tf32" $bin/gpu_lm_bench 124M 16 1024 10 bf16,tf32
  run "gpu_lm_bench bf16,flash" $bin/gpu_lm_bench 124M 16 1024 10 bf16,flash
  run "gpu_lm_bench bf16,tf32 B 32" $bin/gpu_lm_bench 124M 32 1024 10 bf16,tf32
  run "gpu_lm_bench bf16,tf32 B 64" $bin/gpu_lm_bench 124M 64 1024 5 bf16,tf32
fi
if want cudnn; then
  part "--attention cudnn: cuDNN's fused attention (bf16) on the GPU against the CPU's bf16 (blockwise attention)"
  bf=(tol=1e-3 bf16 gtol=5e-2 floor cudnn)
  run "test_gpu_lm d6 bf16 T 256 cudnn" $bin/test_gpu_lm d6 2 256 20 "${bf[@]}"
  run "test_gpu_lm 124M bf16 T 1024 cudnn" $bin/test_gpu_lm 124M 1 1024 5 "${bf[@]}"
  run "test_gpu_lm llama-tiny bf16 T 256 cudnn" $bin/test_gpu_lm llama-tiny 2 256 20 "${bf[@]}"
  part "dtrain's training step in bf16 with cuDNN's attention: 124M, T 1024, B 16, 32, 64"
  run "gpu_lm_bench bf16,cudnn" $bin/gpu_lm_bench 124M 16 1024 10 bf16,cudnn
  run "gpu_lm_bench bf16,cudnn B 32" $bin/gpu_lm_bench 124M 32 1024 10 bf16,cudnn
  run "gpu_lm_bench bf16,cudnn B 64" $bin/gpu_lm_bench 124M 64 1024 5 bf16,cudnn
  run "train 124M --device cuda bf16 --attention cudnn" $bin/dtrain train --model 124M --data /tmp/llmc_train.bin \
    --val-data /tmp/llmc_val.bin --batch 16 --seq 1024 --steps 20 --lr 6e-4 --warmup 5 --eval-every 20 --eval-batches 1 \
    --device cuda --precision bf16 --attention cudnn
fi
if want train; then
  part "dtrain train --device cuda against dtrain train on the CPU: d6, B 4, T 64, 20 steps"
  common=(--model d6 --data /tmp/llmc_train.bin --val-data /tmp/llmc_val.bin --batch 4 --seq 64 --steps 20 --lr 1e-3 --quiet)
  run "train d6 cpu" $bin/dtrain train "${common[@]}" --threads 16 --metrics /tmp/cpu.jsonl
  run "train d6 --device cuda" $bin/dtrain train "${common[@]}" --device cuda --metrics /tmp/gpu.jsonl
  paste <(grep -o '"loss":[0-9.e+-]*' /tmp/cpu.jsonl | cut -d: -f2) <(grep -o '"loss":[0-9.e+-]*' /tmp/gpu.jsonl | cut -d: -f2) |
    awk '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; printf "step %2d  cpu %s  gpu %s  relative %.2e\n", NR, $1, $2, d}
         END {printf "worst %.2e over %d steps\n", w, NR}'
  part "the same for Llama: llama-tiny, B 4, T 64, 20 steps"
  common[1]=llama-tiny
  run "train llama-tiny cpu" $bin/dtrain train "${common[@]}" --vocab 50257 --threads 16 --metrics /tmp/lcpu.jsonl
  run "train llama-tiny --device cuda" $bin/dtrain train "${common[@]}" --vocab 50257 --device cuda --metrics /tmp/lgpu.jsonl
  paste <(grep -o '"loss":[0-9.e+-]*' /tmp/lcpu.jsonl | cut -d: -f2) <(grep -o '"loss":[0-9.e+-]*' /tmp/lgpu.jsonl | cut -d: -f2) |
    awk '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END {printf "llama-tiny: worst %.2e over %d steps\n", w, NR}'
  part "dtrain train --device cuda: 124M, B 16, T 1024, 20 steps, an evaluation and a save"
  train=(--model 124M --data /tmp/llmc_train.bin --val-data /tmp/llmc_val.bin --batch 16 --seq 1024 --steps 20 --lr 6e-4
         --warmup 5 --eval-every 20 --eval-batches 1 --device cuda)
  run "train 124M --device cuda" $bin/dtrain train "${train[@]}" --save /tmp/gpt2-124M.bin
  run "train 124M --device cuda --tf32" $bin/dtrain train "${train[@]}" --tf32
  part "the saved weights evaluated on the CPU"
  run "eval on the CPU" $bin/dtrain train --model /tmp/gpt2-124M.bin --val-data /tmp/llmc_val.bin --batch 16 --seq 1024 --steps 0 \
    --eval-batches 1 --threads 16
fi
if want trainbf16; then
  part "dtrain train --device cuda --precision bf16 --tf32: 124M, B 16, T 1024, 20 steps, an evaluation"
  run "train 124M --device cuda bf16" $bin/dtrain train --model 124M --data /tmp/llmc_train.bin --val-data /tmp/llmc_val.bin --batch 16 \
    --seq 1024 --steps 20 --lr 6e-4 --warmup 5 --eval-every 20 --eval-batches 1 --device cuda --precision bf16 --tf32
fi
if want ddp; then
  part "data parallelism on the GPU: --nproc 2 --device cuda (two ranks share it) against one process with the global batch, d6"
  ddp=(--model d6 --data /tmp/llmc_train.bin --seq 64 --steps 20 --lr 1e-3 --quiet --device cuda)
  run "train d6 --nproc 2 --device cuda" $bin/dtrain train "${ddp[@]}" --batch 4 --nproc 2 --metrics /tmp/ddp.jsonl
  run "train d6 B 8 --device cuda" $bin/dtrain train "${ddp[@]}" --batch 8 --metrics /tmp/one.jsonl
  paste <(grep -o '"loss":[0-9.e+-]*' /tmp/one.jsonl | cut -d: -f2) <(grep -o '"loss":[0-9.e+-]*' /tmp/ddp.jsonl | cut -d: -f2) |
    awk '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END {printf "2 ranks against one process: worst %.2e over %d steps\n", w, NR}'
fi
if want trace; then
  part "--trace on the GPU: 124M, B 16, T 1024, steps 2-3: each unit's milliseconds from the device's events"
  run "train 124M --trace" $bin/dtrain train --model 124M --data /tmp/llmc_train.bin --batch 16 --seq 1024 --steps 3 --device cuda --quiet \
    --trace /tmp/trace.json --trace-steps 2:3
  python3 -c '
import json, collections, sys
t = json.load(open("/tmp/trace.json"))["traceEvents"]
open_, ms = {}, collections.defaultdict(float)
for e in (e for e in t if e.get("tid") == 5 and e.get("ph") in "BE"):  # in time order, each span its B then its E
    if e["ph"] == "B": open_[0] = e
    else: ms[open_[0]["name"].replace("block ", "block#").split("#")[0]] += (e["ts"] - open_[0]["ts"]) / 1e3 / 2
print("GPU track, a step: " + ", ".join("%s %.1f ms" % kv for kv in ms.items()))'
fi
if want oom; then
  part "a model that does not fit the GPU: refused before the first step, naming the sizes"
  $bin/dtrain train --model 1558M --data /tmp/llmc_train.bin --batch 64 --seq 1024 --steps 1 --device cuda
  rc=$?
  echo "exit $rc"
  results+=("$(printf '%-44s %s' "1558M B 64 refused" "$([ $rc = 1 ] && echo ok || echo "FAILED (exit $rc)")")")
fi
if want plan; then
  part "the planner on the GPU (plan --device cuda: a step timed with 1 and 2 layers) against train --device cuda's steps"
  run "plan against the runs" bash bench/gpu_plan_check.sh $bin/dtrain /tmp/llmc_train.bin
fi
if want llmc; then
  # scripts/build-llmc.sh builds both: llm.c's own attention kernels, and cuDNN's fused attention (its fastest path)
  for exe in train_gpt2cu train_gpt2cu-cudnn; do
    part "llm.c's $exe: 124M (d12, random init), B 16, T 1024, bf16$([ $exe = train_gpt2cu ] && echo ", no cuDNN" || echo ", cuDNN's attention")"
    if [ -x "$dir/$exe" ]; then
      run "llm.c $exe" bash -c "cd /tmp && timeout 150 $PWD/$dir/$exe -e d12 -i /tmp/llmc_train.bin -j /tmp/llmc_val.bin \
        -b 16 -t 1024 -x 20 -v 1000 -m 2 -s 0 -h 0 > $out/$exe.log 2>&1"
      grep -E "^step|total average|rror" "$out/$exe.log" | tail -6
    else
      echo "no $dir/$exe (scripts/build-llmc.sh)"
    fi
  done
fi
export PYTHONUNBUFFERED=1
if want torch; then
  part "PyTorch: the same model and batch, bf16 autocast, torch.compile"
  run "torch bf16 compiled" python3 bench/torch_gpt2_gpu.py --mode bf16 --compile --steps 10
fi
if want torchf32; then
  part "PyTorch: the same model and batch, f32 and TF32, eager"
  run "torch f32 eager" python3 bench/torch_gpt2_gpu.py --mode f32 --steps 5
  run "torch tf32 eager" python3 bench/torch_gpt2_gpu.py --mode tf32 --steps 5
fi
if want gdecode; then
  part "decoding on the GPU against the CPU decoder: 3 slots, prompts over 2 steps, then steps of one row a slot, f32"
  run "test_gpu_decode d6" $bin/test_gpu_decode d6 40 tol=1e-5
  run "test_gpu_decode 124M" $bin/test_gpu_decode 124M 40 tol=1e-5
  run "test_gpu_decode llama-tiny" $bin/test_gpu_decode llama-tiny 40 tol=1e-5
  run "test_gpu_decode smollm-135m" $bin/test_gpu_decode smollm-135m 20 tol=1e-5
  part "dtrain generate --device cuda against the CPU: d6 (random weights), 200 tokens sampled at temperature 1"
  $bin/dtrain train --model d6 --data /tmp/llmc_train.bin --batch 1 --seq 64 --steps 1 --quiet --save /tmp/d6.bin > /dev/null 2>&1
  gen=(generate --model /tmp/d6.bin --ids --prompt "10,20,30,40" --tokens 200 --temperature 1 --top-k 0 --seed 7)
  run "generate cpu" bash -c "$bin/dtrain ${gen[*]} > /tmp/gen_cpu.txt"
  run "generate --device cuda" bash -c "$bin/dtrain ${gen[*]} --device cuda > /tmp/gen_gpu.txt"
  cmp /tmp/gen_cpu.txt /tmp/gen_gpu.txt && echo "the same $(wc -w < /tmp/gen_gpu.txt) tokens: $(cut -c1-60 /tmp/gen_gpu.txt)..." ||
    { echo "they differ:"; head -c 300 /tmp/gen_cpu.txt; echo; head -c 300 /tmp/gen_gpu.txt; echo; results+=("generate tokens FAILED"); }
fi
if want decode; then
  part "decoding speed: dtrain's GPU decoder and Hugging Face generate (GPT-2 124M, random weights, 16-token prompts, 128 new tokens, greedy)"
  run "gpu_decode_bench" $bin/gpu_decode_bench 124M 1 32
  run "HF generate" python3 bench/torch_gpt2_gpu.py --decode
fi

part "summary"
printf '%s\n' "${results[@]}"
