#!/usr/bin/env python3
"""The planner against dtrain's own runs: for each layout, `dtrain plan --json`
and `dtrain train --report` with the same flags, then predicted against
measured peak resident memory (the largest rank) and step time (the median
step after the first two). Under expert parallelism a row is also planned at the run's own expert
load (--expert-load: the busiest rank's routed rows over the mean, which the routing decides): its step
time at the load's median over those steps, its memory at the most any step routed (the exchange's
buffers grow to it).

Rounds interleave the rows (every row once a round, the order reversed on odd
rounds) and each round plans a row just before running it: the plan times its
GEMMs on the machine as it is at that moment, so a VM that drifts moves plan
and run alike. A row's figures are the medians over the rounds of the plan,
the measurement and their error.

With --retime each plan times the job's shapes anew (its Linears, attention, the ranks' meeting: a copy of the
machine's cache without them), so that every round's plan sees the machine as its run does; without it the first plan of
a shape keeps its timings for every later round and row (a VM whose rate drifts then moves the run, not the plan).

usage: bench/plan_validate.py DTRAIN DATA [--steps N] [--rounds R] [--rows FILE] [--json FILE] [--retime]
A row is a line of train flags (without --data, --steps, --report); # comments. Without --rows: d6's
quick set (below); bench/plan_rows/ holds the rows of 124M, 350M and the mixes of docs/planner.md.
"""
import argparse, json, os, shlex, statistics, subprocess, sys, tempfile

import undisturbed

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
--model d6 --seq 1024 --max-seq 1024 --batch 1 --nproc 2 --cp 2
--model d6 --seq 256 --batch 4 --recompute
--model d6 --seq 256 --batch 4 --precision bf16
--model d6 --seq 256 --batch 4 --precision fp16
--model d6 --seq 256 --batch 4 --nproc 2 --precision bf16 --zero 1
--model d6 --seq 256 --batch 4 --nproc 2 --precision bf16 --zero 1 --grad-store bf16
--model d6 --seq 256 --batch 2 --grad-accum 2 --nproc 2 --precision bf16 --zero 1 --grad-store bf16
"""


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# the job's own timings in the machine's cache: its "plan_" keys (src/obs/peak.c keeps them apart so); what is measured
# once a CPU stays
JOB_TIMINGS = "plan_"


def plan_retimed(cmd):
    """cmd run with a copy of the machine's cache that holds none of the job's timings"""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "dtrain"))
        try:
            c = json.load(open(os.path.join(home, "dtrain", "peak.json")))
        except (OSError, ValueError):
            c = {}
        c = {k: v for k, v in c.items() if not k.startswith(JOB_TIMINGS)}
        json.dump(c, open(os.path.join(d, "dtrain", "peak.json"), "w"))
        return run(cmd, env=dict(os.environ, XDG_CACHE_HOME=d))


def measure(dtrain, data, flags, steps):
    with tempfile.TemporaryDirectory() as d:
        p, others = undisturbed.run([dtrain, "train", "--data", data, "--steps", str(steps), "--report", d, "--quiet"] + flags)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
        r = json.load(open(os.path.join(d, "run.json")))
        ranks = r.get("memory_per_rank") or [{"peak_rss": r["memory_bytes"]["peak_rss"]}]
        peak = max(x["peak_rss"] for x in ranks)
        lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
        ms = [x["ms"] for x in lines]
        # expert parallelism: the busiest rank's routed rows over its group's mean, over the same steps as the time
        load = [x["expert_rank_load_max_mean"] for x in (lines[2:] if len(lines) > 3 else lines) if "expert_rank_load_max_mean" in x]
        # and over every step, the most: the buffers grow to the most rows a step routed to a rank, and keep that room
        most = max((x["expert_rank_load_max_mean"] for x in lines if "expert_rank_load_max_mean" in x), default=None)
        # the rows the busiest rank keeps over its layers, the most a step had (older builds: none, balanced)
        rows = max((x.get("expert_rank_rows_max_mean", 1.0) for x in lines if "expert_rank_load_max_mean" in x), default=None)
        return (peak, statistics.median(ms[2:] if len(ms) > 3 else ms), others, statistics.median(load) if load else None, most, rows), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rows")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--retime", action="store_true", help="each plan times the job's shapes anew")
    a = ap.parse_args()
    text = open(a.rows).read() if a.rows else QUICK
    rows = [l.split("#")[0].strip() for l in text.splitlines()]
    rows = [r for r in rows if r]
    got = {r: [] for r in rows}  # per round: (plan bytes, plan ms, peak, ms)
    why = {}
    for k in range(a.rounds):
        for r in (rows if k % 2 == 0 else rows[::-1]):
            flags = shlex.split(r) + ["--threads", "1"] if "--threads" not in r else shlex.split(r)
            p = (plan_retimed if a.retime else run)([a.dtrain, "plan", "--data", a.data, "--json"] + flags)
            if p.returncode != 0:
                why[r] = "plan refused: " + p.stderr.strip()
                continue
            plan = json.loads(p.stdout)
            m, err = measure(a.dtrain, a.data, flags, a.steps)
            if m is None:
                why[r] = "run failed: " + err
                continue
            # the plan assumes the experts' load balanced; planned again at the run's own (the routing's, which no plan
            # can know before the run): a row's error at that load besides
            at_load = mem_at_load = None
            if m[3] is not None:
                q = run([a.dtrain, "plan", "--data", a.data, "--json", "--expert-load", "%.4f" % max(1.0, m[3])] + flags)
                at_load = json.loads(q.stdout)["step_ms"] if q.returncode == 0 else None
                # memory at the most any step routed (what the buffers grew to)
                q = run([a.dtrain, "plan", "--data", a.data, "--json", "--expert-load",
                         "%.4f,%.4f" % (max(1.0, m[4]), max(1.0, m[5]))] + flags)
                mem_at_load = json.loads(q.stdout)["total"] if q.returncode == 0 else None
            got[r].append((plan["total"], plan["step_ms"], m[0], m[1], plan["breakdown"], m[2], m[3], at_load, m[4], mem_at_load, m[5]))
        print(f"# round {k + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    out = []
    med = statistics.median
    # the measured step's own spread over the rounds ((max - min) / median): how far this machine moves one row's run
    print(f"| layout | memory plan MB | measured MB | error | step plan ms | measured ms | error (median of {a.rounds}) | "
          "measured spread | others' cores | at the run's expert load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        g = got[r]
        if not g:
            print(f"| {r} | {why.get(r, 'not run')} |")
            continue
        pm, pt, mm, mt = (med(x[i] for x in g) for i in range(4))
        em, et = med((x[0] - x[2]) / x[2] for x in g), med((x[1] - x[3]) / x[3] for x in g)
        spread = (max(x[3] for x in g) - min(x[3] for x in g)) / mt
        others = max(x[5] for x in g)  # the most any round's run shared the machine with
        loaded = [x for x in g if x[7] is not None]
        load_col = (f"{med(x[7] for x in loaded):.1f} ms at {med(x[6] for x in loaded):.3f}: "
                    f"{100*med((x[7] - x[3]) / x[3] for x in loaded):+.1f}%; {med(x[9] for x in loaded)/1e6:.1f} MB at the most, "
                    f"{med(x[8] for x in loaded):.3f} (kept rows {med(x[10] for x in loaded):.3f}): "
                    f"{100*med((x[9] - x[2]) / x[2] for x in loaded):+.1f}%") if loaded else ""
        out.append({"layout": r, "plan_bytes": pm, "peak_rss": mm, "plan_ms": pt, "ms": mt, "mem_err": em, "time_err": et,
                    "rounds": len(g), "ms_spread": spread, "per_round": [list(x[:4]) for x in g], "breakdown": g[-1][4], "others_cores": others,
                    "expert_rank_load": med(x[6] for x in loaded) if loaded else None,
                    "plan_ms_at_load": med(x[7] for x in loaded) if loaded else None,
                    "time_err_at_load": med((x[7] - x[3]) / x[3] for x in loaded) if loaded else None,
                    "expert_rank_load_most": med(x[8] for x in loaded) if loaded else None,
                    "expert_rank_rows_most": med(x[10] for x in loaded) if loaded else None,
                    "mem_err_at_load": med((x[9] - x[2]) / x[2] for x in loaded) if loaded else None})
        print(f"| {r} | {pm/1e6:.1f} | {mm/1e6:.1f} | {100*em:+.1f}% | {pt:.1f} | {mt:.1f} | {100*et:+.1f}% | {100*spread:.1f}% | {others:.2f}{' DISTURBED' if others > undisturbed.LIMIT else ''} | {load_col} |",
              flush=True)
    if out:
        me = [abs(x["mem_err"]) for x in out]
        te = [abs(x["time_err"]) for x in out]
        print(f"\nmemory: mean |error| {100*statistics.mean(me):.1f}%, max {100*max(me):.1f}%; "
              f"step time: mean |error| {100*statistics.mean(te):.1f}%, max {100*max(te):.1f}% ({len(out)} rows)")
        tl = [abs(x["time_err_at_load"] if x["time_err_at_load"] is not None else x["time_err"]) for x in out]
        if any(x["time_err_at_load"] is not None for x in out):
            ml = [abs(x["mem_err_at_load"] if x["mem_err_at_load"] is not None else x["mem_err"]) for x in out]
            print(f"with expert parallelism's rows planned at the run's expert load (time: its median, memory: its most): "
                  f"step time mean |error| {100*statistics.mean(tl):.1f}%, max {100*max(tl):.1f}%; memory mean |error| "
                  f"{100*statistics.mean(ml):.1f}%, max {100*max(ml):.1f}%")
        if a.rounds > 1:
            sp = [x["ms_spread"] for x in out]
            print(f"the measured step's spread over the rounds: mean {100*statistics.mean(sp):.1f}%, max {100*max(sp):.1f}%")
        bad = [x["layout"] for x in out if x["others_cores"] > undisturbed.LIMIT]
        if bad:
            print(f"{len(bad)} row(s) ran beside other work (over {undisturbed.LIMIT} of a core, after {undisturbed.TRIES} tries): "
                  "their times say more about the machine than the plan")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
