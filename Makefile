# shardwise — the two entry points a newcomer needs (README.md):
#   make demo   install what is missing, build the binary, generate on a synthetic model, plan, profile
#   make test   install what is missing, build (CUDA when nvcc exists) + a sanitizer build, run every test
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
GPU_BUILD ?= build-gpu
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all deps build build-asan test test-fast demo install gpu-build clean

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

# Installs bin/shardwise and the Python package (lib/python3.X/dist-packages) under PREFIX.
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX) > $(BUILD).install.log 2>&1 || (cat $(BUILD).install.log; exit 1)
	@echo "installed $(PREFIX)/bin/shardwise and the Python package under $(PREFIX)/$$(sed -n 's/^SHARDWISE_PYTHON_INSTALL_DIR:STRING=//p' $(BUILD)/CMakeCache.txt)"

# The demo builds only the shardwise binary (no tests, benchmarks or Python; CUDA only where a GPU is).
DEMO_BUILD ?= build-demo
demo: deps
	@./scripts/demo.sh $(DEMO_BUILD) $(JOBS)

# Portable binaries for the GPU machine (static OpenBLAS/yaml-cpp/libstdc++, sm_90), see docs/GPU_MACHINE.md.
gpu-build: deps
	@cmake -S . -B $(GPU_BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=ON -DSHARDWISE_CUDA_ARCHS=90 -DSHARDWISE_PORTABLE=ON -DSHARDWISE_BENCH=ON $(CMAKE_FLAGS) > $(GPU_BUILD).configure.log 2>&1 || (cat $(GPU_BUILD).configure.log; exit 1)
	@cmake --build $(GPU_BUILD) -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(GPU_BUILD) $(DEMO_BUILD) *.configure.log *.build.log *.install.log
