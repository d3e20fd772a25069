#!/bin/bash
# Expert parallelism's speed on a Mixtral-shaped small model (8 SwiGLU experts, top-2, grouped-query attention), in
# one run: dtrain's EP 2 (2 ranks, 1 thread each) against dtrain on one process with 2 threads and the same global
# batch, DDP 2 (every rank all experts), and PyTorch's Mixtral (transformers, eager) with its MoE blocks made
# expert-parallel over gloo's all_to_all_single (bench/torch_moe_ep.py), the same weights, shapes and tokens. Prints
# each one's median step and tokens/s, and the bytes EP's exchanges moved against tokens x k x hidden x 4 bytes x
# (EP-1)/EP x 4 exchanges (2 forward, 2 backward) a layer.
# usage: bench/moe_ep.sh [DTRAIN] (the baselines' venv: scripts/make-baselines-venv.sh)
set -eu
DTRAIN=${1:-build/dtrain}
PY=${PYTHON:-.venv-baselines/bin/python}
[ -x "$PY" ] || { echo "no $PY: scripts/make-baselines-venv.sh makes it (or set PYTHON)"; exit 1; }
dir=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "files kept in $dir"
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
# uniform random bytes (as torch_llama.py's synthetic batch): each token routes as its own, so the experts' load is near
# even, as a trained Mixtral's is (text's frequent bytes would send most rows to a few experts of an untrained router)
head -c 400000 /dev/urandom > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
B=4 T=128 C=256 F=896 L=4 E=8 K=2 STEPS=${STEPS:-12}
shape=(--model llama-tiny --experts $E --experts-top-k $K --vocab 256 --layers $L --channels $C --heads 8 --kv-heads 2 --ffn $F
       --max-seq $T --seq $T --lr 1e-5 --quiet --data "$dir/train.bin")
# one model for all: a step of training saved, exported as Mixtral's folder
"$DTRAIN" train "${shape[@]}" --steps 1 --batch 1 --save "$dir/ck" > /dev/null
"$DTRAIN" ckpt export "$dir/ck" "$dir/hf" > /dev/null
run=(--model "$dir/hf" --data "$dir/train.bin" --seq $T --steps $STEPS --lr 1e-5 --quiet)
med() { grep -o "\"$1\":[0-9.e+-]*" "$2" | cut -d: -f2 | tail -n +3 | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
"$DTRAIN" train "${run[@]}" --batch $((2 * B)) --threads 2 --metrics "$dir/one.jsonl" > /dev/null
"$DTRAIN" train "${run[@]}" --batch $B --nproc 2 --threads 1 --metrics "$dir/ddp.jsonl" > /dev/null
"$DTRAIN" train "${run[@]}" --batch $B --nproc 2 --ep 2 --threads 1 --metrics "$dir/ep.jsonl" > /dev/null
"$PY" bench/torch_moe_ep.py --folder "$dir/hf" --data "$dir/train.bin" --ep 2 --batch $B --seq $T --steps $STEPS --threads 1 > "$dir/torch.jsonl"
tok=$((2 * B * T))
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "load max/mean (layers' average, EP 2's last step): $(grep -o '"expert_load_max_mean_avg":[0-9.]*' "$dir/ep.jsonl" | tail -1 | cut -d: -f2)"
echo "Mixtral-shaped: C $C, $E experts of $F (top-$K), $L layers, 8 heads (2 K/V), T $T; global batch $((2 * B)) x $T; $cpu, $(nproc) cores"
lvl="the CPU's level" # (dtrain sets OPENBLAS_CORETYPE to it where OpenBLAS's own pick is lower)
blas=${OPENBLAS_CORETYPE:-$lvl}
aten=$("$PY" -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
echo "kernels: OpenBLAS $blas; PyTorch $aten (scripts/avx2-paths.sh holds both to AVX2)"
printf "%-44s %10s %10s %8s\n" layout "step ms" "tok/s" "vs one"
one=$(med ms "$dir/one.jsonl")
for x in "one process, 2 threads:one" "DDP 2 (1 thread a rank):ddp" "EP 2 (1 thread a rank):ep" "PyTorch EP 2 over gloo (1 thread a rank):torch"; do
    name=${x%%:*} f=${x##*:}
    ms=$(med ms "$dir/$f.jsonl")
    printf "%-44s %10.1f %10.0f %7.2fx\n" "$name" "$ms" "$(awk "BEGIN{print $tok / ($ms / 1e3)}")" "$(awk "BEGIN{print $one / $ms}")"
done
ep=$(med ms "$dir/ep.jsonl") th=$(med ms "$dir/torch.jsonl")
echo "dtrain's MFU (model FLOPs against the sgemm peak of the threads): one process $(med mfu "$dir/one.jsonl"), EP 2 $(med mfu "$dir/ep.jsonl"); PyTorch's EP 2 at the same FLOPs: $(awk "BEGIN{printf \"%.3f\", $(med mfu "$dir/ep.jsonl") * $ep / $th}")"
echo "EP 2 against PyTorch's EP 2: $(awk "BEGIN{printf \"%.2f\", $th / $ep}")x faster"
bytes=$(grep -o '"expert_exchange_bytes":[0-9]*' "$dir/ep.jsonl" | tail -1 | cut -d: -f2)
uniform=$(awk "BEGIN{print $tok * $K * $C * 4 * 0.5 * 4 * $L}")
echo "EP 2's exchanges, last step: $bytes bytes (both ranks; (C+1) floats a row where a weight rides along); tokens x k x C x 4 B x (EP-1)/EP x 4 exchanges x $L layers = $uniform if each rank's choices split evenly between the ranks ($(awk "BEGIN{printf \"%.3f\", $bytes / $uniform}")x)"
echo "PyTorch's exchanges, rank 0, last step: $(grep -o '"a2a_bytes":[0-9]*' "$dir/torch.jsonl" | tail -1 | cut -d: -f2) bytes (forward only: autograd's backward exchanges are not counted)"
