#!/bin/bash
# The planner on a GPU against the runs it plans: for each job, `dtrain plan --device cuda --json` (a step timed with
# the model's one and two layers at the job's batch, the pre-flight's count of its bytes), then `dtrain train
# --device cuda` for 12 steps: the run's median step (steps 3-12, "ms" in its metrics) against the plan's step_ms, and
# the plan's bytes against the GPU memory the run says it holds. The issue's goal: the step within 10%.
# usage: bench/gpu_plan_check.sh DTRAIN TRAIN.bin     (on the GPU machine; bench/gpu_check.sh's plan part runs it;
#        PLAN_JOBS, one job's flags a line, in place of the list below)
set -u
dtrain=$1
data=$2
jobs=(
  "--model d6 --batch 8 --seq 256"
  "--model 124M --batch 16 --seq 1024"
  "--model 124M --batch 16 --seq 1024 --tf32"
  "--model 124M --batch 16 --seq 1024 --precision bf16 --tf32"
  "--model 124M --batch 32 --seq 1024 --precision bf16 --tf32"
  "--model 350M --batch 8 --seq 1024 --precision bf16 --tf32"
  "--model 124M --batch 16 --seq 1024 --precision bf16 --tf32 --attention blockwise"
  "--model 124M --batch 16 --seq 1024 --precision bf16 --attention cudnn"
  "--model llama-tiny --vocab 50257 --batch 16 --seq 256"
)
[ -n "${PLAN_JOBS:-}" ] && mapfile -t jobs <<< "$PLAN_JOBS"
printf '%-72s %10s %10s %8s %10s %10s\n' "job" "plan ms" "run ms" "error" "plan GiB" "run GiB"
worst=0
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  plan=$("$dtrain" plan $j --device cuda --json 2> /tmp/plan.err)
  rm -f /tmp/plan_run.jsonl
  # shellcheck disable=SC2086
  if ! "$dtrain" train $j --data "$data" --steps 12 --lr 1e-4 --device cuda --metrics /tmp/plan_run.jsonl > /tmp/plan_run.out 2>&1; then
    printf '%-72s the run failed: %s\n' "$j" "$(tail -1 /tmp/plan_run.out)"
    worst=100
    continue
  fi
  row=$(python3 - "$plan" <<'EOF'
import json, statistics, sys, re
try:
    p = json.loads(sys.argv[1])
except Exception:
    print("no plan"); sys.exit()
ms = [json.loads(l)["ms"] for l in open("/tmp/plan_run.jsonl") if '"ms"' in l][2:]
run = statistics.median(ms) if ms else float("nan")
out = open("/tmp/plan_run.out").read()
m = re.search(r"([0-9.]+) GiB of its memory in use", out)
err = (p.get("step_ms", float("nan")) - run) / run * 100 if ms else float("nan")
print("%10.1f %10.1f %+7.1f%% %10.2f %10s" % (p.get("step_ms", float("nan")), run, err, p["total"] / 2**30, m.group(1) if m else "?"))
EOF
)
  printf '%-72s %s\n' "$j" "$row"
  e=$(echo "$row" | awk '{gsub("%","",$3); e=$3+0; if (e<0) e=-e; print e}')
  worst=$(awk -v a="$worst" -v b="$e" 'BEGIN {print (b > a ? b : a)}')
done
echo "worst step error: ${worst}% (the goal: 10%)"
awk -v w="$worst" 'BEGIN {exit !(w <= 10)}'
