"""A benchmark's run with what else ran beside it: the machine's busy time
from /proc/stat (steal included: the hypervisor's other guests) minus the
run's own CPU time (its children's rusage), over the run's wall time, in
cores. Above LIMIT the run was disturbed (../shared/measuring.md: more than
~5-10% of a core): it is run again after a pause, up to TRIES times, and
the figure is kept for the report either way. A stray process that kept
both cores of the 2-core VM busy for half an hour made a validation's rows
read 30-50% slow before this check; every run of it would have said so."""
import os, subprocess, time

LIMIT = 0.10  # cores
TRIES = 3


def _busy_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    busy = sum(v[:8]) - v[3] - v[4]
    return busy / os.sysconf("SC_CLK_TCK")


def run(cmd, **kw):
    """(CompletedProcess, others' cores) of the last try"""
    for k in range(TRIES):
        t0, b0, c0 = time.monotonic(), _busy_seconds(), os.times()
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
        t1, b1, c1 = time.monotonic(), _busy_seconds(), os.times()
        own = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
        # /proc/stat ticks are 10 ms: a short run's figure carries two of them of slack
        others = max(0.0, (b1 - b0) - own - 0.02) / max(t1 - t0, 1e-9)
        if p.returncode != 0 or others <= LIMIT or k == TRIES - 1:
            return p, others
        time.sleep(5)
