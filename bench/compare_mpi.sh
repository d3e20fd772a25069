#!/bin/sh
# dtrain's allreduce against Open MPI and MPICH on this machine, each pair
# measured in the same invocation (alternating rounds). Installs MPICH if
# missing (as root) and builds the MPICH baseline program.
set -e
cd "$(dirname "$0")/.."
scripts/install-deps.sh mpich libmpich-dev
make -s
if [ ! -x build/bench/mpi_coll_bench_mpich ] || [ bench/mpi_coll_bench.c -nt build/bench/mpi_coll_bench_mpich ]; then
    mpicc.mpich -O2 -o build/bench/mpi_coll_bench_mpich bench/mpi_coll_bench.c
fi
sizes=${SIZES:-8,1K,64K,1M,16M,64M,256M}
for np in ${NPROC:-2 4}; do
    for lib in mpi mpich; do
        for buffers in arena private; do
            build/dtrain bench comm --op allreduce --nproc "$np" --sizes "$sizes" --buffers "$buffers" \
                --baseline "$lib" --rounds "${ROUNDS:-2}" --reps 5
        done
    done
done
