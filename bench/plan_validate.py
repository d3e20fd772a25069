#!/usr/bin/env python3
"""The planner against dtrain's own runs: for each layout, `dtrain plan --json`
and `dtrain train --report` with the same flags, then predicted against
measured peak resident memory (the largest rank) and step time (the median
step after the first two).

usage: bench/plan_validate.py DTRAIN DATA [--steps N] [--rows FILE] [--quick]
A row is a line of train flags (without --data, --steps, --report); # comments.
"""
import argparse, json, os, shlex, statistics, subprocess, sys, tempfile

QUICK = """
--model d6 --seq 256 --batch 4
--model d6 --seq 256 --batch 4 --nproc 2
--model d6 --seq 256 --batch 4 --nproc 2 --zero 1
--model d6 --seq 256 --batch 4 --nproc 2 --zero 2
--model d6 --seq 256 --batch 4 --nproc 2 --zero 3
--model d6 --seq 256 --batch 4 --nproc 2 --tp 2
--model d6 --seq 256 --batch 4 --nproc 2 --pp 2 --grad-accum 4
--model d6 --seq 256 --batch 4 --nproc 2 --pp 2 --grad-accum 4 --pp-schedule gpipe
--model d6 --seq 256 --batch 4 --nproc 2 --pp 2 --grad-accum 4 --pp-schedule zb1
--model d6 --seq 1024 --batch 1 --nproc 2 --cp 2
--model d6 --seq 256 --batch 4 --recompute
--model d6 --seq 256 --batch 4 --precision bf16
--model d6 --seq 256 --batch 4 --nproc 2 --precision bf16 --zero 1
"""


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def measure(dtrain, data, flags, steps):
    with tempfile.TemporaryDirectory() as d:
        p = run([dtrain, "train", "--data", data, "--steps", str(steps), "--report", d, "--quiet"] + flags)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
        r = json.load(open(os.path.join(d, "run.json")))
        ranks = r.get("memory_per_rank") or [{"peak_rss": r["memory_bytes"]["peak_rss"]}]
        peak = max(x["peak_rss"] for x in ranks)
        ms = [json.loads(l)["ms"] for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
        return (peak, statistics.median(ms[2:] if len(ms) > 3 else ms)), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    text = open(a.rows).read() if a.rows else QUICK
    rows = [l.split("#")[0].strip() for l in text.splitlines()]
    rows = [r for r in rows if r]
    out = []
    print("| layout | memory plan MB | measured MB | error | step plan ms | measured ms | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        flags = shlex.split(r) + ["--threads", "1"] if "--threads" not in r else shlex.split(r)
        p = run([a.dtrain, "plan", "--data", a.data, "--json"] + flags)
        if p.returncode != 0:
            print(f"| {r} | plan refused: {p.stderr.strip()} |")
            continue
        plan = json.loads(p.stdout)
        m, err = measure(a.dtrain, a.data, flags, a.steps)
        if m is None:
            print(f"| {r} | run failed: {err} |")
            continue
        pm, pt = plan["total"], plan["step_ms"]
        em, et = (pm - m[0]) / m[0], (pt - m[1]) / m[1]
        out.append({"layout": r, "plan_bytes": pm, "peak_rss": m[0], "plan_ms": pt, "ms": m[1], "mem_err": em, "time_err": et,
                    "breakdown": plan["breakdown"]})
        print(f"| {r} | {pm/1e6:.1f} | {m[0]/1e6:.1f} | {100*em:+.1f}% | {pt:.1f} | {m[1]:.1f} | {100*et:+.1f}% |", flush=True)
    if out:
        me = [abs(x["mem_err"]) for x in out]
        te = [abs(x["time_err"]) for x in out]
        print(f"\nmemory: mean |error| {100*statistics.mean(me):.1f}%, max {100*max(me):.1f}%; "
              f"step time: mean |error| {100*statistics.mean(te):.1f}%, max {100*max(te):.1f}% ({len(out)} rows)")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
