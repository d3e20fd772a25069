#!/usr/bin/env python3
"""Context parallelism in a trace (dtrain train --cp N --trace FILE): per
rank, the blocks' forward and backward time (what the split balances), the
ring's key/value passes in flight (`sendrecv` on the progress thread, from
the post to the last byte) and the part of them the rank waited for after
its block's compute (`ring wait`): hidden = 1 - waited / in flight. With
all-to-all attention, its exchanges (all waited for).
usage: bench/cp_trace.py TRACE.json"""
import json
import sys


def spans(events):
    """(pid, name) -> total ms, pairing each thread's B and E in order."""
    stacks, total = {}, {}
    for e in sorted((e for e in events if e.get("ph") in "BE"), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"])
        if e["ph"] == "B":
            stacks.setdefault(key, []).append(e)
        elif stacks.get(key):
            b = stacks[key].pop()
            k = (e["pid"], b["name"])
            total[k] = total.get(k, 0.0) + (e["ts"] - b["ts"]) / 1e3
    return total


def main(path):
    d = json.load(open(path))
    t = spans(d["traceEvents"] if isinstance(d, dict) else d)
    ranks = sorted({p for p, _ in t})
    blocks = {p: sum(v for (q, n), v in t.items() if q == p and n.startswith(("forward block", "backward block"))) for p in ranks}
    print("%-6s %12s %14s %14s %10s %16s" % ("rank", "blocks ms", "in flight ms", "waited ms", "hidden", "all-to-all ms"))
    for p in ranks:
        fl, w, a = t.get((p, "sendrecv"), 0.0), t.get((p, "ring wait"), 0.0), t.get((p, "all-to-all attention"), 0.0)
        print("%-6d %12.1f %14.1f %14.1f %9.1f%% %16.1f" % (p, blocks[p], fl, w, 100 * (1 - w / fl) if fl else 0.0, a))
    lo, hi = min(blocks.values()), max(blocks.values())
    print("blocks' time, slowest rank over fastest: %.3f" % (hi / lo if lo else 0.0))


if __name__ == "__main__":
    main(sys.argv[1])
