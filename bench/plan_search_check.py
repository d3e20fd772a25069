#!/usr/bin/env python3
"""`dtrain plan --search` against the runs it ranks: the top K layouts the search
predicts for a command (same global batch), each then trained ROUNDS times
(the layouts interleaved, the order reversed on odd rounds; the median step
after the first two, then the median over rounds), and the two orders side by
side, with Kendall's tau-b between them (the plan's ties, layouts that share a
rank within --ties, count for neither). Then each pair of layouts by round: the
runs order a pair when one of them was faster in every round (the rounds
interleave the layouts, so the machine's drift moves both alike), and those
pairs are set against the plan's order; and each pair the plan orders
(different ranks) against the runs' medians.

usage: bench/plan_search_check.py DTRAIN DATA [--top 5] [--rounds 2] [--steps 6] -- TRAIN FLAGS...
e.g.   bench/plan_search_check.py build/dtrain train.bin -- --model 124M --nproc 2 --batch 4 --seq 128 --threads 1
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

import undisturbed


def step_ms(dtrain, data, flags, steps):
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.jsonl")
        p, others = undisturbed.run([dtrain, "train", "--data", data, "--steps", str(steps), "--quiet", "--metrics", m] + flags)
        if others > undisturbed.LIMIT:
            print(f"# disturbed: {others:.2f} of a core ran beside {' '.join(flags)}", file=sys.stderr, flush=True)
        if p.returncode != 0:
            return None, (p.stderr.strip().splitlines() or ["failed"])[-1]
        ms = [json.loads(l)["ms"] for l in open(m) if l.strip()]
        return statistics.median(ms[2:] if len(ms) > 3 else ms), None


def kendall_tau(a, b):
    """tau-b: ties (layouts the plan prices the same) count for neither order"""
    c = d = ta = tb = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            if x == 0 and y == 0: continue
            if x == 0: ta += 1
            elif y == 0: tb += 1
            elif x * y > 0: c += 1
            else: d += 1
    den = ((c + d + ta) * (c + d + tb)) ** 0.5
    return (c - d) / den if den else 1.0


def main():
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("data")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    p = subprocess.run([a.dtrain, "plan", "--data", a.data, "--search", "--json"] + rest, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("plan --search: " + p.stderr.strip())
    fits = json.loads(p.stdout)["fits"][:a.top]
    got = [[] for _ in fits]
    for k in range(a.rounds):
        order = list(range(len(fits))) if k % 2 == 0 else list(range(len(fits)))[::-1]
        for i in order:
            ms, err = step_ms(a.dtrain, a.data, rest + fits[i]["flags"].split(), a.steps)
            if ms is None:
                sys.exit(f"{fits[i]['flags']}: {err}")
            got[i].append(ms)
        print(f"# round {k + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    meas = [statistics.median(g) for g in got]
    mrank = {i: r + 1 for r, i in enumerate(sorted(range(len(fits)), key=lambda i: meas[i]))}
    print(f"# dtrain plan --search {' '.join(rest)}: its top {len(fits)} layouts, each trained {a.rounds} times "
          f"({a.steps} steps, median after 2)")
    rank = [f.get("rank", i + 1) for i, f in enumerate(fits)]
    print("| predicted rank | layout | predicted ms | measured ms | measured rank |")
    print("|---|---|---|---|---|")
    for i, f in enumerate(fits):
        print(f"| {rank[i]}{'=' if rank.count(rank[i]) > 1 else ''} | {f['layout']} | {f['step_ms']:.0f} | {meas[i]:.0f} | {mrank[i]} |")
    tau = kendall_tau([f["step_ms"] for f in fits], meas)
    taur = kendall_tau(rank, meas)
    same = all(mrank[i] == i + 1 for i in range(len(fits)))
    print(f"\nKendall's tau-b between the orders: {tau:+.2f} (the plan's ranks, its ties within "
          f"{100 * json.loads(p.stdout).get('ties', 0):g}%: {taur:+.2f}); the same order: {'yes' if same else 'no'}; "
          f"the predicted fastest measured {mrank[0]}{'st' if mrank[0] == 1 else 'th'}")
    print("\nper round (ms): " + "; ".join(f"{i + 1}: " + " ".join(f"{x:.0f}" for x in g) for i, g in enumerate(got)))
    agree, against, tied, loose = [], [], [], []
    for i in range(len(fits)):
        for j in range(i + 1, len(fits)):
            faster = sum(got[i][r] < got[j][r] for r in range(a.rounds))
            pair = f"{i + 1}-{j + 1}"
            if 0 < faster < a.rounds or a.rounds < 2:
                loose.append(f"{pair} ({faster} of {a.rounds})")
                continue
            plan = rank[i] - rank[j]
            (tied if plan == 0 else agree if (plan < 0) == (faster == a.rounds) else against).append(pair)
    print(f"pairs the runs order (one faster in all {a.rounds} rounds): {len(agree) + len(against) + len(tied)} of "
          f"{len(fits) * (len(fits) - 1) // 2}; the plan orders {len(agree)} the same way ({' '.join(agree) or '-'}), "
          f"{len(against)} the other ({' '.join(against) or '-'}), ranks alike {len(tied)} ({' '.join(tied) or '-'}); "
          f"not ordered by the runs: {', '.join(loose) or '-'}")
    ordered = [(i, j) for i in range(len(fits)) for j in range(i + 1, len(fits)) if rank[i] != rank[j]]
    wrong = [f"{i + 1}-{j + 1}" for i, j in ordered if (rank[i] < rank[j]) != (meas[i] < meas[j])]
    print(f"pairs the plan orders (different ranks): {len(ordered)}; the runs' medians the other way: {len(wrong)} "
          f"({' '.join(wrong) or '-'})")
    if not against and not wrong:
        print("verdict: agrees (no pair the runs order in every round is ordered the other way by the plan, and no pair "
              "the plan orders goes the other way in the runs' medians)")
    else:
        print(f"verdict: does not agree ({len(against)} pair(s) the runs order in every round ordered the other way by the "
              f"plan: {' '.join(against) or '-'}; {len(wrong)} pair(s) the plan orders the other way in the runs' medians: "
              f"{' '.join(wrong) or '-'})")


if __name__ == "__main__":
    sys.exit(main())
