#!/bin/bash
# Seeing a run: a 2-rank DDP run with --report writes metrics (MFU, data time,
# I/O), a trace that a trace-event checker accepts (begins have ends, times
# per rank monotonic, bucket allreduces overlapping backward, exposed
# communication as in the metrics), and a report that headless Chromium
# renders without errors with every chart holding data. Bad paths give clear
# errors; a report that cannot be written only warns.
# --tensorboard's event files read back by TensorBoard's own reader
# (installed from PyPI into PYDIR if missing; said and not counted if it
# cannot be) hold every step's loss, validation loss and the rest. A metrics
# file that cannot take a row (a full disk) is said and kept to whole rows.
# usage: observability.sh DTRAIN CHECK_TRACE [PYDIR]
set -u
DTRAIN=$1
CHECK=$2
PYDIR=${3:-}
. "$(dirname "$0")/checks.sh"
head -c 200000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" --val "$dir/val.bin" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
# large enough (1.7 MB of gradients) for several DDP buckets after the first 1 MiB one
model=(--layers 2 --channels 128 --heads 4 --vocab 256 --max-seq 32 --seq 32 --batch 8 --threads 1 --data "$dir/train.bin"
       --val-data "$dir/val.bin" --eval-every 5 --eval-batches 2 --bucket-mb 0.25)
# the peak for MFU comes from the cache or is measured once; a fixed one keeps the test quick
export DTRAIN_PEAK_GFLOPS=50

run="$dir/run"
# (each rank's turn inside backward waits for the buckets issued so far: allreduces run during backward however busy the machine)
if DTRAIN_DDP_WAIT_IN_BACKWARD=1 "$DTRAIN" train --nproc 2 "${model[@]}" --steps 10 --report "$run" --save "$run/ck" --tensorboard "$dir/tb" > "$dir/out" 2> "$dir/err"; then
    ok "2-rank run with --report: $(grep -E '^report:' "$dir/out")"
else fail "2-rank run with --report: $(tail -3 "$dir/err")"; fi
for f in metrics.jsonl run.json trace.json report.html; do [ -s "$run/$f" ] || fail "$run/$f was not written"; done
grep -q 'MFU [0-9.]*%' "$dir/out" && ok "the progress line shows MFU: $(grep -m1 -o 'MFU [0-9.]*%' "$dir/out")" || fail "no MFU in: $(tail -2 "$dir/out")"
last=$(tail -1 "$run/metrics.jsonl")
for k in mfu model_gflops data_ms data_read_bytes ckpt_write_bytes comm_exposed_ms; do
    echo "$last" | grep -q "\"$k\":" || fail "metrics lack $k: $last"
done
echo "$last" | grep -q '"data_read_bytes":0,' && fail "no token bytes counted: $last" || ok "metrics carry MFU, data time and I/O"
grep -q '"ckpt_write_bytes":[[:space:]]*[1-9]' "$run/run.json" && ok "run.json has every rank's I/O, rank 0's checkpoint bytes counted" \
    || fail "run.json I/O: $(grep -A3 '"io"' "$run/run.json")"

# TensorBoard's own reader (its CRC checks included: a record whose checksum is wrong ends the reading) on the events
if ! python3 -c 'import tensorboard' 2> /dev/null && [ -n "$PYDIR" ]; then
    [ -d "$PYDIR/tensorboard" ] || python3 -m pip install -q --disable-pip-version-check --target "$PYDIR" tensorboard > "$dir/pip.log" 2>&1
    export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}
fi
if python3 -c 'import tensorboard' 2> /dev/null; then
    python3 - "$dir/tb" "$run/metrics.jsonl" > "$dir/tb.out" 2>&1 << 'PY'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
got = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
rows = [json.loads(l) for l in open(sys.argv[2])]
pairs = [("train/loss", "loss"), ("val/loss", "val_loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
         ("perf/tokens_per_s", "tok_per_s"), ("perf/mfu", "mfu")]
bad = []
for tag, key in pairs:
    want = {r["step"]: r[key] for r in rows if r.get(key) is not None}
    have = got.get(tag, {})
    if sorted(have) != sorted(want) or any(abs(have[s] - v) > 1e-4 * abs(v) + 1e-9 for s, v in want.items()):
        bad.append(f"{tag}: {sorted(have)} against {sorted(want)}")
print("; ".join(bad) if bad else f"{len(got['train/loss'])} steps of {len(got)} scalars, validation at {sorted(got['val/loss'])}")
sys.exit(1 if bad else 0)
PY
    [ $? = 0 ] && ok "--tensorboard: TensorBoard's EventAccumulator reads the metrics line's scalars: $(cat "$dir/tb.out")" ||
        fail "--tensorboard: $(tail -3 "$dir/tb.out")"
    # an image model's run (classify.c's trainer): its steps' loss, rate and norm, its evaluations' accuracy
    . "$(dirname "$0")/tiny_images.sh"
    tiny_images "$dir/img"
    if "$DTRAIN" train --model mlp --data "$dir/img" --epochs 2 --batch 32 --eval-every 10 --threads 1 --quiet \
        --metrics "$dir/img.jsonl" --tensorboard "$dir/tbimg" > "$dir/img.out" 2>&1; then
        python3 - "$dir/tbimg" "$dir/img.jsonl" > "$dir/tbimg.out" 2>&1 << 'PY'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
got = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
rows = [json.loads(l) for l in open(sys.argv[2])]
bad = []
for tag, key in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"), ("val/accuracy", "test_accuracy")]:
    # an epoch's line has no step: its last, at 16 steps an epoch (512 images, 32 a step)
    want = {r.get("step", 16 * r.get("epoch", 0)): r[key] for r in rows if key in r}
    have = got.get(tag, {})
    if not want or sorted(have) != sorted(want) or any(abs(have[s] - v) > 1e-4 * abs(v) + 1e-9 for s, v in want.items()):
        bad.append(f"{tag}: {sorted(have)} against {sorted(want)}")
print("; ".join(bad) if bad else f"{len(got['train/loss'])} steps, accuracy at {sorted(got['val/accuracy'])}")
sys.exit(1 if bad else 0)
PY
        [ $? = 0 ] && ok "--tensorboard, an image model: TensorBoard reads its metrics' scalars: $(cat "$dir/tbimg.out")" ||
            fail "--tensorboard, an image model: $(tail -3 "$dir/tbimg.out")"
    else
        fail "the image model's run: $(tail -2 "$dir/img.out")"
    fi
else
    echo "skip: the tensorboard package is not installed and could not be ($(tail -1 "$dir/pip.log" 2> /dev/null)); not counted"
fi

# the trace: a checker's reading of it
if "$CHECK" "$run/trace.json" "$run/metrics.jsonl" > "$dir/check" 2>&1; then ok "trace: $(tr '\n' ';' < "$dir/check")"
else fail "trace: $(cat "$dir/check")"; fi
grep -q '"name":"checkpoint write"' "$run/trace.json" && fail "the trace holds a checkpoint write outside steps 2-4" || true
grep -q '"algo":"' "$run/trace.json" && grep -q '"bytes":' "$run/trace.json" && ok "collectives carry algorithm and bytes" \
    || fail "collectives without algorithm or bytes"

# the page, rendered by a browser
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    fail "no headless browser: install Debian's chromium (make test does: scripts/install-deps.sh chromium)"
else
    render() { # the DOM after the page's scripts ran (its messages in $dir/dom.html.err)
        render_dom "$browser" "$1" "$dir/dom.html"
        cat "$dir/dom.html"
    }
    dom=$(render "$run/report.html")
    status=$(echo "$dom" | grep -o '<span id="render-status"[^>]*>[^<]*</span>')
    errs=$(echo "$dom" | grep -o '<pre id="errors">[^<]*</pre>')
    if echo "$status" | grep -q '>ok</span>' && [ "$errs" = '<pre id="errors"></pre>' ]; then ok "the report renders without errors"
    else fail "the report: status '$status', errors '$errs', browser: $(grep -i -m3 'console\|error' "$dir/dom.html.err")"; fi
    charts=$(echo "$status" | grep -o 'data-charts="[^"]*"' | sed 's/&quot;/"/g')
    # 10 steps, validation at 5 and 10: each chart's points, exactly; the timeline's at least one per traced unit
    for want in chart-loss:12 chart-lr:20 chart-throughput:20 chart-phases:50 chart-memory:12 table-rank-times:2 chart-timeline:24; do
        id=${want%:*}
        n=$(echo "$charts" | grep -o "\"$id\":[0-9]*" | cut -d: -f2)
        if [ "$id" = chart-timeline ]; then [ "${n:-0}" -ge "${want#*:}" ]; else [ "${n:-0}" = "${want#*:}" ]; fi \
            && ok "$id drawn with $n points" || fail "$id: ${n:-no} points, want ${want#*:} ($charts)"
    done
    echo "$dom" | grep -q '<th>precision</th><td>fp32</td>' && echo "$status" | grep -q 'hidden' &&
        ok "the Run card names the precision; the 'ok' status is hidden from readers" || fail "Run card precision or status: $status"
    echo "$dom" | grep -q 'rank 1 communication' || echo "$dom" | grep -q 'Timeline (2 ranks)' && ok "the timeline shows both ranks" \
        || fail "the timeline does not name 2 ranks"
    # a page that breaks is caught: a planted error must show
    sed 's/drawn\["chart-memory"\] = sets.length \* ranks.length;/& undefinedFunction();/' "$run/report.html" > "$dir/broken.html"
    render "$dir/broken.html" | grep -q '<span id="render-status"[^>]*>error</span>' && grep -q undefinedFunction "$dir/broken.html" &&
        ok "a script error in the page is reported" || fail "a planted script error went unseen"
    # an image model's page (run.json kind "images"): its Run card, loss, learning rate and norm, and test accuracy (2 epochs
    # of 16 steps, evaluated at 10, 16, 20, 30 and 32)
    . "$(dirname "$0")/tiny_images.sh"
    tiny_images "$dir/imgr"
    if "$DTRAIN" train --model mlp --data "$dir/imgr" --epochs 2 --batch 32 --eval-every 10 --threads 1 --quiet --report "$dir/imgrep" \
        > /dev/null 2> "$dir/imgrep.err"; then
        idom=$(render "$dir/imgrep/report.html")
        istatus=$(echo "$idom" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$istatus" | grep -q '>ok</span>' && echo "$istatus" | grep -q '"chart-loss":32' && echo "$istatus" | grep -q '"chart-lr":64' &&
            echo "$istatus" | grep -q '"chart-accuracy":5' && echo "$idom" | grep -q '<th>outcome</th><td>test accuracy [0-9.]*%' &&
            ok "an image model's report: its Run card, 32 steps' loss, learning rate and norm, 5 test accuracies" ||
            fail "an image model's report: $istatus $(echo "$idom" | grep -o '<pre id="errors">[^<]*')"
    else fail "an image model with --report: $(tail -2 "$dir/imgrep.err")"; fi
    # a pipeline's page: its bubble by step, every stage's memory and time (computing, waiting, idle), rows named by stage
    if "$DTRAIN" train --nproc 2 --pp 2 --grad-accum 4 "${model[@]}" --steps 6 --report "$dir/pp" > /dev/null 2> "$dir/pp.err"; then
        pdom=$(render "$dir/pp/report.html")
        pstatus=$(echo "$pdom" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$pstatus" | grep -q '>ok</span>' && echo "$pstatus" | grep -q '"chart-bubble":12' && echo "$pstatus" | grep -q '"chart-memory":12' &&
            echo "$pstatus" | grep -q '"table-rank-times":2' && echo "$pdom" | grep -q 'rank 1: stage 1' &&
            ok "a pipeline's report: the bubble (and the schedule's replay) by step, each stage's memory and times, rows by stage" ||
            fail "a pipeline's report: $pstatus $(echo "$pdom" | grep -o 'rank 1[^<]*' | head -3)"
    else fail "a pipeline run with --report: $(tail -2 "$dir/pp.err")"; fi
    # a compressed run's page: the bytes each step put on the wire and the ratio (dense before the start step)
    if "$DTRAIN" train --nproc 2 "${model[@]}" --steps 6 --compress powersgd --compress-start 2 --report "$dir/cz" > /dev/null 2> "$dir/cz.err"; then
        cstatus=$(render "$dir/cz/report.html" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$cstatus" | grep -q '>ok</span>' && echo "$cstatus" | grep -q '"chart-compression":12' &&
            ok "a compressed run's report: the bytes sent and the ratio by step" || fail "a compressed run's report: $cstatus"
    else fail "a compressed run with --report: $(tail -2 "$dir/cz.err")"; fi
    # a K-FAC run's page: preconditioning as its own phase (its factors made in forward and backward, its decompositions
    # and preconditioned gradients before the update), taken out of the others so the bars still stack to the step
    if "$DTRAIN" train --nproc 2 "${model[@]}" --steps 6 --optimizer kfac --lr 0.01 --report "$dir/kf" > /dev/null 2> "$dir/kf.err"; then
        kstatus=$(render "$dir/kf/report.html" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        split=$(python3 - "$dir/kf/metrics.jsonl" <<'EOF2'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
ok = len(rows) == 6 and all(r["precondition_in_forward_ms"] > 0 and r["precondition_in_backward_ms"] > 0 and
                            r["precondition_ms"] > r["precondition_in_forward_ms"] + r["precondition_in_backward_ms"] and
                            r["forward_ms"] >= r["precondition_in_forward_ms"] and r["backward_ms"] >= r["precondition_in_backward_ms"] and
                            r["optimizer_ms"] >= r["precondition_ms"] - r["precondition_in_forward_ms"] - r["precondition_in_backward_ms"]
                            for r in rows)
last = rows[-1]
print("ok" if ok else "bad", "%.1f ms of %.1f (%.1f in forward, %.1f in backward)" % (last["precondition_ms"], last["ms"],
      last["precondition_in_forward_ms"], last["precondition_in_backward_ms"]))
EOF2
)
        echo "$kstatus" | grep -q '>ok</span>' && echo "$kstatus" | grep -q '"chart-phases":36' && [ "${split%% *}" = ok ] &&
            ok "a K-FAC run's report: preconditioning its own phase (last step: ${split#* })" || fail "a K-FAC run's report: $kstatus $split"
    else fail "a K-FAC run with --report: $(tail -2 "$dir/kf.err")"; fi
    # a GRPO run's page: the mean reward and the KL by step
    head -40 /usr/share/common-licenses/GPL-3 | awk 'NF >= 3 && length($1 $2 $3) < 20 { print $1, $2, $3 }' > "$dir/prompts.txt"
    if "$DTRAIN" train --layers 2 --channels 128 --heads 4 --vocab 256 --max-seq 32 --seq 32 --batch 8 --threads 1 --steps 6 --grpo "$dir/prompts.txt" --reward contains:e --grpo-group 2 --report "$dir/rl" > /dev/null 2> "$dir/rl.err"; then
        rstatus=$(render "$dir/rl/report.html" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$rstatus" | grep -q '>ok</span>' && echo "$rstatus" | grep -q '"chart-reward":12' &&
            ok "a GRPO run's report: the reward and the KL by step" || fail "a GRPO run's report: $rstatus"
    else fail "a GRPO run with --report: $(tail -2 "$dir/rl.err")"; fi
    # a mixture of experts' page: each step's load (the worst layer's and the layers' average) and each evaluation's
    if "$DTRAIN" train "${model[@]}" --experts 4 --ffn 256 --steps 10 --report "$dir/moe" > /dev/null 2> "$dir/moe.err"; then
        mstatus=$(render "$dir/moe/report.html" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$mstatus" | grep -q '>ok</span>' && echo "$mstatus" | grep -q '"chart-experts":22' &&
            ok "a mixture of experts' report: 10 steps' load (worst layer, average) and 2 evaluations'" ||
            fail "a mixture of experts' report: $mstatus"
    else fail "a mixture of experts with --report: $(tail -2 "$dir/moe.err")"; fi
    # dtrain rl's page: the return curve, the losses and the throughput by environment steps (10 updates), and the
    # film of the trained policy's episode (the cart, the pole and the axle move)
    if "$DTRAIN" rl --env cartpole --nproc 2 --total-steps 5120 --print-every 0 --report "$dir/ppo" > /dev/null 2> "$dir/ppo.err"; then
        pdom=$(render "$dir/ppo/report.html")
        pstatus=$(echo "$pdom" | grep -o '<span id="render-status"[^>]*>[^<]*</span>' | sed 's/&quot;/"/g')
        echo "$pstatus" | grep -q '>ok</span>' && echo "$pstatus" | grep -q '"chart-return":10,"chart-rl-loss":30,"chart-rl-throughput":10,"film":3' &&
            echo "$pdom" | grep -q '<th>algorithm</th><td>PPO on CartPole-v1</td>' &&
            ok "dtrain rl's report: the return, losses and throughput by env steps, the settings, the film" ||
            fail "dtrain rl's report: $pstatus"
    else fail "dtrain rl with --report: $(tail -2 "$dir/ppo.err")"; fi
fi
grep -q '<script src=\|<link [^>]*href=.http\|@import\|url(http' "$run/report.html" && fail "the report loads something from outside" \
    || ok "the report is self-contained ($(wc -c < "$run/report.html") bytes)"

# dtrain report on its own, and its bad input
"$DTRAIN" report "$run" -o "$dir/again.html" > /dev/null 2>&1 && [ -s "$dir/again.html" ] && ok "dtrain report RUN_DIR -o FILE" \
    || fail "dtrain report RUN_DIR"
mkdir -p "$dir/empty"
"$DTRAIN" report "$dir/empty" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'no metrics there' "$dir/err" && ok "report on a directory without metrics: $(head -1 "$dir/err")" \
    || fail "report on an empty directory: exit $rc, $(cat "$dir/err")"
"$DTRAIN" report "$dir/nowhere" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q 'not a directory' "$dir/err" && ok "report on a missing directory: $(head -1 "$dir/err")" || fail "report on a missing directory: exit $rc"
echo '{"step":1,"loss":2}' > "$dir/empty/metrics.jsonl"; echo 'not json' >> "$dir/empty/metrics.jsonl"
"$DTRAIN" report "$dir/empty" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'line 2 is not a metrics record' "$dir/err" && ok "a damaged metrics line is named: $(head -1 "$dir/err")" \
    || fail "damaged metrics: exit $rc, $(cat "$dir/err")"

# damaged companions of the metrics: named, or (a stray end) ignored
cp "$run/metrics.jsonl" "$dir/empty/metrics.jsonl"
echo '{"traceEvents":[{"ph":"E",' > "$dir/empty/trace.json"
"$DTRAIN" report "$dir/empty" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'trace.json: not valid JSON' "$dir/err" && ok "a damaged trace.json is named: $(head -1 "$dir/err")" \
    || fail "damaged trace: exit $rc, $(cat "$dir/err")"
echo '{"traceEvents":[{"ph":"E","pid":0,"tid":1,"ts":5},{"ph":"B","pid":99999,"tid":-3,"ts":"x"},7]}' > "$dir/empty/trace.json"
"$DTRAIN" report "$dir/empty" > /dev/null 2> "$dir/err" && ok "a trace with stray and malformed events still gives a page" \
    || fail "stray trace events: $(cat "$dir/err")"
echo '[1,2' > "$dir/empty/run.json"
"$DTRAIN" report "$dir/empty" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'run.json: not valid JSON' "$dir/err" && ok "a damaged run.json is named: $(head -1 "$dir/err")" || fail "damaged run.json: exit $rc"

# --trace where nothing can be written: refused before training
"$DTRAIN" train "${model[@]}" --steps 2 --trace /nonexistent/dir/t.json > /dev/null 2> "$dir/err"; rc=$?
[ $rc -ne 0 ] && grep -q -- '--trace: /nonexistent/dir/t.json: cannot be written' "$dir/err" && ok "an unwritable --trace: $(head -1 "$dir/err")" \
    || fail "unwritable --trace: exit $rc, $(cat "$dir/err")"
"$DTRAIN" train "${model[@]}" --steps 2 --trace-steps 3:1 > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 2 ] && grep -q 'trace-steps' "$dir/err" && ok "--trace-steps 3:1 refused: $(head -1 "$dir/err")" || fail "--trace-steps 3:1: exit $rc"
# a report that cannot be written at the end warns; the training and its save stand
DTRAIN_CHARTJS=/nonexistent/chart.js "$DTRAIN" train "${model[@]}" --steps 3 --report "$dir/r2" --save "$dir/r2.bin" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 0 ] && [ -s "$dir/r2.bin" ] && grep -q 'the report was not written' "$dir/err" \
    && ok "an unwritable report warns, the run exits 0 and saves: $(grep -m1 'report was not' "$dir/err")" \
    || fail "unwritable report: exit $rc, $(cat "$dir/err")"

# the loss plot: no validation, no "red: validation" in the legend; a log axis over less than a decade has ticks
# below 3 where the losses end (2.3), not just the integers above
python3 -c "
import math
for s in range(1, 201): print('{\"step\":%d,\"loss\":%.4f}' % (s, 2.3 + 8.7 * math.exp(-s / 20)))" > "$dir/plot.jsonl"
"$DTRAIN" plot "$dir/plot.jsonl" -o "$dir/plot.svg" --log > /dev/null
low=$(grep -o 'text-anchor="end">[0-9.]*<' "$dir/plot.svg" | grep -o '[0-9.]*' | awk '$1 < 3' | wc -l)
! grep -q "validation" "$dir/plot.svg" && [ "$low" -ge 2 ] && ok "loss plot: the legend without validation; $low ticks below 3 on the log axis" ||
    fail "plot: $(grep -o 'blue[^<]*' "$dir/plot.svg"), ticks $(grep -o 'text-anchor="end">[0-9.]*<' "$dir/plot.svg" | tr '\n' ' ')"

# an image model's metrics (its steps, each epoch's summary, --eval-every's accuracy lines): its steps' losses, the
# other lines passed over
. "$(dirname "$0")/tiny_images.sh"
tiny_images "$dir/img"
"$DTRAIN" train --model mlp --data "$dir/img" --epochs 2 --eval-every 20 --threads 1 --metrics "$dir/img.jsonl" --quiet > /dev/null 2>&1
steps=$(grep -c '"loss":' "$dir/img.jsonl")
"$DTRAIN" plot "$dir/img.jsonl" -o "$dir/img.svg" > "$dir/out" 2>&1 && grep -q '"train_loss"' "$dir/img.jsonl" &&
    grep -q '"test_accuracy"' "$dir/img.jsonl" && [ "$steps" -ge 2 ] &&
    [ "$(grep -o '<polyline[^>]*' "$dir/img.svg" | grep -o '[0-9.]*,[0-9.]*' | wc -l)" = "$steps" ] &&
    ok "loss plot of an image model: its $steps steps' losses, its epochs' summaries and accuracy lines passed over" ||
    fail "image model plot: $(cat "$dir/out")"
printf '{"step":1,"loss":2.5}\n{"step":2,"accuracy":0.5}\n' > "$dir/bad.jsonl"
"$DTRAIN" plot "$dir/bad.jsonl" -o "$dir/bad.svg" > "$dir/out" 2>&1
[ $? = 1 ] && grep -q "line 2 has no numeric step and loss" "$dir/out" && [ ! -e "$dir/bad.svg" ] &&
    ok "loss plot: a line that is neither a step's loss nor an image model's summary is refused, naming it" ||
    fail "a bad metrics line: $(cat "$dir/out")"

# a metrics file that cannot take its next row (a limit on file sizes stands in for a full disk): said once, naming the
# file and the row's step; the run goes on to its end; the file keeps whole rows only (GPT-2, an image model, RL)
full_disk() { # NAME WHAT CMD...: CMD writes $dir/NAME.jsonl with files limited to 4 KiB
    local name=$1 what=$2
    shift 2
    (trap '' XFSZ; ulimit -f 4; "$@") > "$dir/$name.out" 2>&1
    local rc=$? said step last
    said=$(grep -c "metrics file $dir/$name.jsonl: cannot write the row of step" "$dir/$name.out")
    step=$(grep -o "cannot write the row of step [0-9]*" "$dir/$name.out" | grep -o '[0-9]*$')
    last=$(tail -1 "$dir/$name.jsonl" | grep -o '"step":[0-9]*' | grep -o '[0-9]*$')
    if [ $rc = 0 ] && [ "$said" = 1 ] && [ "$((last + 1))" = "$step" ] && [ "$(tail -c 1 "$dir/$name.jsonl" | od -An -tx1 | tr -d ' ')" = 0a ] &&
        python3 -c "import json, sys; [json.loads(l) for l in open(sys.argv[1])]" "$dir/$name.jsonl" 2> /dev/null; then
        ok "$what: a metrics row that cannot be written is said (step $step), the run ends well, $(wc -l < "$dir/$name.jsonl") whole rows kept (the last step $last's)"
    else fail "$what on a full disk: exit $rc, said $said times, $(tail -2 "$dir/$name.out"), last row: $(tail -c 80 "$dir/$name.jsonl")"; fi
}
full_disk full_gpt "GPT-2" "$DTRAIN" train "${model[@]}" --steps 40 --eval-every 0 --metrics "$dir/full_gpt.jsonl" --quiet
full_disk full_img "an image model" "$DTRAIN" train --model mlp --data "$dir/img" --epochs 1 --threads 1 --metrics "$dir/full_img.jsonl" --quiet
full_disk full_rl "reinforcement learning" "$DTRAIN" rl --env cartpole --total-steps 20480 --metrics "$dir/full_rl.jsonl"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
