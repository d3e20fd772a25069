#!/bin/bash
# dt_comm_alltoallv (a mixture of experts' dispatch: every rank's counts gathered first) against Open MPI's
# MPI_Alltoallv on the same counts (each rank bytes / p to each rank), alternating in one invocation, ROUNDS rounds,
# medians of each round's median: on shared memory (WHERE shm: dtrain's own launcher, Open MPI's mpirun on this
# machine) or across the cluster rig's two machines (WHERE rig:RATE, e.g. rig:1gbit:100; 1 rank a machine, Open MPI
# as installed and with the TCP flags dtrain asks for, as bench/cluster_comm.sh does; needs root). Printed: each size's
# times and Open MPI's over dtrain's (above 1: dtrain is faster). MPI_COLL_BENCH_MULTIPLE=1 in mpi_coll_bench's
# environment (mpirun -x) starts Open MPI at MPI_THREAD_MULTIPLE, dtrain's level (its heartbeats' thread), which
# costs Open MPI itself about 0.1-0.3 us a small call across the rig; across the rig the table has that run too
# (openmpi-mt).
# usage: bench/alltoallv_mpi.sh [WHERE (shm)] [ROUNDS (3)] [SIZES (bytes a rank: 8 ... 64 MiB)] [NPROC (2; shm only)]
set -euo pipefail
where=${1:-shm}
rounds=${2:-3}
sizes=${3:-8,64,512,4096,32768,262144,2097152,16777216,67108864}
np=${4:-2}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
for b in "$build/dtrain" "$build/bench/alltoallv_bench" "$build/bench/mpi_coll_bench"; do
    [ -x "$b" ] || { echo "bench/alltoallv_mpi.sh: $b is not built (cmake --build build)" >&2; exit 2; }
done
out=$(mktemp)
mpi_args=(--op alltoallv --dtype f32 --sizes "$sizes" --reps 7 --warmup 2 --seconds 0.05)
if [ "${where%%:*}" = rig ]; then
    rate=${where#rig:}
    export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
    . "$here/../tests/cluster/rig.sh"
    why=$(rig_unavailable)
    [ -z "$why" ] || { echo "bench/alltoallv_mpi.sh: $why" >&2; exit 2; }
    trap 'rig_down > /dev/null 2>&1 || true; rm -f "$out"' EXIT
    rig_up 2 "$rate"
    np=2
    desc="2 machines (network namespaces) x 1 rank, links shaped to $rate"
    for ((r = 1; r <= rounds; r++)); do
        rig_mpirun -np 2 --map-by ppr:1:node "$build/bench/alltoallv_bench" "$sizes" 2> /dev/null | sed 's/^/dtrain /' >> "$out"
        rig_mpirun -np 2 --map-by ppr:1:node "$build/bench/mpi_coll_bench" "${mpi_args[@]}" 2> /dev/null | sed 's/^/openmpi /' >> "$out"
        rig_mpirun -np 2 --map-by ppr:1:node --mca btl_tcp_flags send,inplace,need-ack,need-csum,hetero-rdma \
            "$build/bench/mpi_coll_bench" "${mpi_args[@]}" 2> /dev/null | sed 's/^/openmpi-noput /' >> "$out"
        rig_mpirun -np 2 --map-by ppr:1:node -x MPI_COLL_BENCH_MULTIPLE=1 "$build/bench/mpi_coll_bench" "${mpi_args[@]}" 2> /dev/null |
            sed 's/^/openmpi-mt /' >> "$out"
    done
else
    trap 'rm -f "$out"' EXIT
    desc="$np ranks on this machine, shared memory"
    for ((r = 1; r <= rounds; r++)); do
        "$build/dtrain" launch -n "$np" "$build/bench/alltoallv_bench" "$sizes" 2> /dev/null | sed 's/^/dtrain /' >> "$out"
        mpirun --allow-run-as-root --oversubscribe -np "$np" "$build/bench/mpi_coll_bench" "${mpi_args[@]}" 2> /dev/null |
            sed 's/^/openmpi /' >> "$out"
    done
fi
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; $desc; alltoallv of f32, $rounds rounds alternating, medians"
python3 - "$out" << 'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, js = line.split(" ", 1)
    d = json.loads(js)
    rows.setdefault((d["bytes"], who), []).append(d["avg_us"])
whos = [w for w in ("openmpi", "openmpi-noput", "openmpi-mt") if any(k[1] == w for k in rows)]
print(f"{'bytes a rank':>12} {'dtrain us':>10} " + " ".join(f"{w + ' us':>17} {w + '/dtrain':>21}" for w in whos))
short = []
for b in sorted({k[0] for k in rows}):
    d = rows.get((b, "dtrain"))
    if not d or not all((b, w) in rows for w in whos):
        continue
    du, line = statistics.median(d), ""
    for w in whos:
        ou = statistics.median(rows[(b, w)])
        line += f" {ou:>17.2f} {ou / du:>20.2f}x"
        if ou < du:
            short.append(f"{b} B against {w} ({ou / du:.2f}x)")
    print(f"{b:>12} {du:>10.2f}{line}")
print("dtrain at least Open MPI at every size" if not short else "dtrain behind at: " + ", ".join(short))
PY
