# dtrain: `make` builds into build/, `make demo` installs what is missing and
# runs the main job, `make test` runs the suite. CMake does the real work.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps demo test test-sanitize test-mpich test-blis bench-mpi clean

all: $(BUILD)/Makefile
	cmake --build $(BUILD) -j$(JOBS)

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

deps:
	@scripts/install-deps.sh

# The main job: a byte-level GPT trained on the King James Bible by 2 ranks (~2 minutes).
demo: deps all
	@scripts/install-deps.sh bible-kjv dataset-fashion-mnist
	scripts/demo.sh $(BUILD)

test: deps all
	cd $(BUILD) && ctest --output-on-failure

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer.
test-sanitize: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDT_SANITIZE=address && cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DDT_SANITIZE=thread && cmake --build build-tsan -j$(JOBS)
	cd build-tsan && ctest --output-on-failure

# The suite with dtrain built against MPICH instead of Open MPI.
test-mpich: deps
	@scripts/install-deps.sh mpich libmpich-dev
	cmake -S . -B build-mpich -DMPI_C_COMPILER=mpicc.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpirun.mpich && cmake --build build-mpich -j$(JOBS)
	cd build-mpich && ctest --output-on-failure

# The suite with BLIS instead of OpenBLAS (-DDT_BLAS=blis).
test-blis: deps
	@scripts/install-deps.sh libblis-openmp-dev
	cmake -S . -B build-blis -DDT_BLAS=blis && cmake --build build-blis -j$(JOBS)
	cd build-blis && ctest --output-on-failure

# dtrain against Open MPI and MPICH, same invocation each.
bench-mpi: all
	bench/compare_mpi.sh

clean:
	rm -rf $(BUILD) build-asan build-tsan build-mpich build-blis
