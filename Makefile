# shardwise — the two entry points a newcomer needs (README.md):
#   make demo   install what is missing, build, plan-free CPU generation on a synthetic model
#   make test   install what is missing, build (CUDA when nvcc exists) + a sanitizer build, run every test
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
GPU_BUILD ?= build-gpu
CMAKE_FLAGS ?=

.PHONY: all deps build build-asan test test-fast demo gpu-build clean

all: build

deps:
	@./scripts/install_deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=AUTO -DSHARDWISE_PYTHON=ON $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || (cat $(BUILD).configure.log; exit 1)
	@echo "building $(BUILD)/ (log: $(BUILD).build.log)"
	@cmake --build $(BUILD) -j $(JOBS) > $(BUILD).build.log 2>&1 || (tail -60 $(BUILD).build.log; exit 1)

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only; benchmarks off).
build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDWISE_SANITIZE=ON -DSHARDWISE_CUDA=OFF -DSHARDWISE_BENCH=OFF > $(ASAN_BUILD).configure.log 2>&1 || (cat $(ASAN_BUILD).configure.log; exit 1)
	@echo "building $(ASAN_BUILD)/ (log: $(ASAN_BUILD).build.log)"
	@cmake --build $(ASAN_BUILD) -j $(JOBS) > $(ASAN_BUILD).build.log 2>&1 || (tail -60 $(ASAN_BUILD).build.log; exit 1)

test: build build-asan
	@echo "== tests ($(BUILD)) =="
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure
	@echo "== tests under ASan/UBSan ($(ASAN_BUILD)) =="
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 ctest -j $(JOBS) --output-on-failure

# Only the main build's tests (quick iteration).
test-fast: build
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure

demo: build
	@./scripts/demo.sh $(BUILD)

# Portable binaries for the GPU machine (static OpenBLAS/yaml-cpp/libstdc++, sm_90), see DEVICE.md.
gpu-build: deps
	@cmake -S . -B $(GPU_BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=ON -DSHARDWISE_PORTABLE=ON -DSHARDWISE_BENCH=ON $(CMAKE_FLAGS) > $(GPU_BUILD).configure.log 2>&1 || (cat $(GPU_BUILD).configure.log; exit 1)
	@cmake --build $(GPU_BUILD) -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(GPU_BUILD) *.configure.log *.build.log
