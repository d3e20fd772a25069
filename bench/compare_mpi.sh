#!/bin/sh
# dtrain's allreduce against Open MPI and MPICH on this machine, each pair
# measured in the same invocation (alternating rounds). Installs MPICH if
# missing (as root) and builds the MPICH baseline program.
set -e
cd "$(dirname "$0")/.."
scripts/install-deps.sh mpich libmpich-dev
# a fresh configure finds mpicc.mpich and builds the MPICH baseline program
cmake -S . -B build > /dev/null
make -s
sizes=${SIZES:-8,1K,64K,1M,16M,64M,256M}
for np in ${NPROC:-2 4}; do
    for lib in mpi mpich; do
        for buffers in arena private; do
            build/dtrain bench comm --op allreduce --nproc "$np" --sizes "$sizes" --buffers "$buffers" \
                --baseline "$lib" --rounds "${ROUNDS:-2}" --reps 5
        done
    done
done
