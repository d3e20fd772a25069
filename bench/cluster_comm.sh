#!/bin/bash
# Collectives across two machines of the cluster rig (tests/cluster/rig.sh:
# network namespaces on a switch, links shaped to RATE, RATE:US for a one-way
# delay of US microseconds too), dtrain against Open
# MPI's own MPI_Allreduce between the same namespaces, alternating in one
# invocation (ROUNDS rounds, medians): time, busbw, busbw as a share of the
# link's rate, and Open MPI's time over dtrain's (above 1: dtrain is faster),
# for Open MPI as installed and as dtrain sets it up (TCP flags without put). Needs root; the rig is removed at the end whatever happens.
# usage: bench/cluster_comm.sh [RATE (1gbit:100)] [RANKS_PER_MACHINE (1)] [ROUNDS (3)] [OP (allreduce)]
set -euo pipefail
rate=${1:-1gbit:100}
ppn=${2:-1}
rounds=${3:-3}
op=${4:-allreduce}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
. "$here/../tests/cluster/rig.sh"
why=$(rig_unavailable)
[ -z "$why" ] || { echo "bench/cluster_comm.sh: $why" >&2; exit 2; }
rig_up 2 "$rate"
sizes=8,1K,64K,1M,4M,16M,64M
bytes=8,1024,65536,1048576,4194304,16777216,67108864
out=$(mktemp)
np=$((2 * ppn))
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; 2 machines (network namespaces) x $ppn rank(s), links shaped to $rate (tbf${RIG_DELAY_US:+; one-way delay measured $RIG_DELAY_US us}), $op f32 sum, $rounds rounds alternating, medians"
for ((r = 1; r <= rounds; r++)); do
    rig_mpirun -np $np --map-by ppr:$ppn:node "$build/dtrain" bench comm --op "$op" --sizes "$sizes" --json 2> /dev/null | sed 's/^/dtrain /' >> "$out"
    rig_mpirun -np $np --map-by ppr:$ppn:node "$build/bench/mpi_coll_bench" --op "$op" --dtype f32 --redop sum --sizes "$bytes" \
        --reps 7 --warmup 2 --seconds 0.05 2> /dev/null | sed 's/^/openmpi /' >> "$out"
    # Open MPI as dtrain sets it up: its TCP send/receive pipeline, without the emulated put (src/comm/mpi_transport.c)
    rig_mpirun -np $np --map-by ppr:$ppn:node --mca btl_tcp_flags send,inplace,need-ack,need-csum,hetero-rdma \
        "$build/bench/mpi_coll_bench" --op "$op" --dtype f32 --redop sum --sizes "$bytes" \
        --reps 7 --warmup 2 --seconds 0.05 2> /dev/null | sed 's/^/openmpi-noput /' >> "$out"
done
python3 - "$out" "$rate" <<'PY'
import json, re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, js = line.split(" ", 1)
    d = json.loads(js)
    rows.setdefault((d["bytes"], who), []).append(d)
m = re.match(r"([0-9.]+)([kmg]?)bit", sys.argv[2].lower())
link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 / 1e9  # GB/s
print("# OMPI: Open MPI's MPI_Allreduce as installed; OMPI-np: the same with the TCP flags dtrain asks for (no put)")
print(f"{'bytes':>10} {'dtrain algo':>11} {'us':>10} {'busbw GB/s':>10} {'of link':>8} | {'OMPI us':>9} {'of link':>8} {'OMPI/dtrain':>11}"
      f" | {'OMPI-np us':>10} {'of link':>8} {'OMPI-np/dtrain':>14}")
for b in sorted({k[0] for k in rows}):
    d, o, n = rows.get((b, "dtrain"), []), rows.get((b, "openmpi"), []), rows.get((b, "openmpi-noput"), [])
    if not d or not o or not n:
        continue
    du, db = statistics.median(x["avg_us"] for x in d), statistics.median(x["busbw_gbs"] for x in d)
    ou, ob = statistics.median(x["avg_us"] for x in o), statistics.median(x["busbw_gbs"] for x in o)
    nu, nb = statistics.median(x["avg_us"] for x in n), statistics.median(x["busbw_gbs"] for x in n)
    print(f"{b:>10} {d[0]['algo']:>11} {du:>10.1f} {db:>10.3f} {db / link:>7.0%} | {ou:>9.1f} {ob / link:>7.0%} {ou / du if du else 0:>10.2f}x"
          f" | {nu:>10.1f} {nb / link:>7.0%} {nu / du if du else 0:>13.2f}x")
PY
rm -f "$out"
