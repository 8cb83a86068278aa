# shardwise — the two entry points a newcomer needs (README.md):
#   make demo   install what is missing, build the binary, generate on a synthetic model, plan, profile
#   make test   install what is missing, build (CUDA when nvcc exists) + a sanitizer build, run every test
# Each step prints one line with its time; its output goes to a log, shown when it fails.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
GPU_BUILD ?= build-gpu
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

SHELL := /bin/bash
# The steps share build folders and use every core: one at a time, in order.
.NOTPARALLEL:
.PHONY: all deps build build-asan test test-fast demo install gpu-build clean

# $(STEP) LABEL LOG COMMAND...: runs COMMAND with its output in LOG and prints "LABEL ... N s"; when it
# fails, the log's last 60 lines (or, with FAIL_FILTER set to a command, the log through it).
# $(STEP_FN) defines the function alone, for a recipe that sets variables before calling `step`.
STEP = $(STEP_FN) step
STEP_FN = step() { \
  local label=$$1 log=$$2 t0=$$(date +%s); shift 2; \
  mkdir -p "$$(dirname "$$log")"; \
  printf '%s ... ' "$$label"; \
  if "$$@" > "$$log" 2>&1; then echo "$$(( $$(date +%s) - t0 )) s"; return 0; fi; \
  echo "failed after $$(( $$(date +%s) - t0 )) s (log: $$log)"; \
  if [ -n "$${FAIL_FILTER:-}" ]; then eval "$$FAIL_FILTER" < "$$log"; else tail -60 "$$log"; fi; \
  return 1; \
};

# Numbered when they run as the steps of `make test` ($(call num,$(N_X)) is "[k/n] " or nothing).
test: N_DEPS = [1/5]
test: N_BUILD = [2/5]
test: N_ASAN = [3/5]
num = $(if $(1),$(1) )

all: build

deps:
	@$(STEP) "$(call num,$(N_DEPS))Debian packages (scripts/install_deps.sh)" $(BUILD)/deps.log ./scripts/install_deps.sh

build: deps
	@$(STEP) "$(call num,$(N_BUILD))configure $(BUILD)/" $(BUILD).configure.log \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=AUTO -DSHARDWISE_PYTHON=ON $(CMAKE_FLAGS)
	@echo "    $$(sed -n 's/^-- shardwise: //p' $(BUILD).configure.log | paste -sd '|' | sed 's/|/ | /g')"
	@$(STEP) "$(call num,$(N_BUILD))build $(BUILD)/ ($(JOBS) jobs; log: $(BUILD).build.log)" $(BUILD).build.log \
	  cmake --build $(BUILD) -j $(JOBS)

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only; benchmarks off).
build-asan: deps
	@$(STEP) "$(call num,$(N_ASAN))configure $(ASAN_BUILD)/ (ASan + UBSan, CPU only)" $(ASAN_BUILD).configure.log \
	  cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDWISE_SANITIZE=ON -DSHARDWISE_CUDA=OFF -DSHARDWISE_BENCH=OFF
	@$(STEP) "$(call num,$(N_ASAN))build $(ASAN_BUILD)/ ($(JOBS) jobs; log: $(ASAN_BUILD).build.log)" $(ASAN_BUILD).build.log \
	  cmake --build $(ASAN_BUILD) -j $(JOBS)

# A failed ctest run shows everything but the lines of the tests that passed (failures with their output,
# then the summary); the whole run is in the log.
CTEST_FAILURES = grep -Ev '^ *(Start +[0-9]+:|[0-9]+/[0-9]+ Test +\#[0-9]+: .* Passed)'
# The last line that counts tests ("100% tests passed, 0 tests failed out of 312"), and one line per
# test skipped (no GPU, no node), with the reason the test printed where it gave one.
CTEST_SUMMARY = sed -n -e 's/^\([0-9]*% tests passed.*\)/    \1/p' -e 's/^.*: skipped: /    skipped: /p' \
  -e 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$$/    skipped: \1/p'

test: build build-asan
	@$(STEP_FN) FAIL_FILTER="$(CTEST_FAILURES)"; \
	  step "[4/5] tests ($(BUILD)/; log: $(BUILD)/test.log)" $(BUILD)/test.log \
	  ctest --test-dir $(BUILD) -j $(JOBS) --output-on-failure
	@$(CTEST_SUMMARY) $(BUILD)/test.log
	@$(STEP_FN) FAIL_FILTER="$(CTEST_FAILURES)"; \
	  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1; \
	  step "[5/5] tests under ASan + UBSan ($(ASAN_BUILD)/; log: $(ASAN_BUILD)/test.log)" $(ASAN_BUILD)/test.log \
	  ctest --test-dir $(ASAN_BUILD) -j $(JOBS) --output-on-failure
	@$(CTEST_SUMMARY) $(ASAN_BUILD)/test.log

# Only the main build's tests (quick iteration), with ctest's own output.
test-fast: build
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure

# Installs bin/shardwise and the Python package (lib/python3.X/dist-packages) under PREFIX, then prints
# where they are and what to set to use them.
install: build
	@$(STEP) "install into $(PREFIX)" $(BUILD)/install.log cmake --install $(BUILD) --prefix $(PREFIX)
	@sed -n '/^shardwise installed under/,$$p' $(BUILD)/install.log

# The demo builds only the shardwise binary (no tests, benchmarks or Python; CUDA only where a GPU is),
# in its own folder, and installs what is missing as its first step.
DEMO_BUILD ?= build-demo
demo:
	@./scripts/demo.sh $(DEMO_BUILD) $(JOBS)

# Portable binaries for the GPU machine (static OpenBLAS/yaml-cpp/libstdc++, sm_90), see docs/GPU_MACHINE.md.
gpu-build: deps
	@cmake -S . -B $(GPU_BUILD) -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=ON -DSHARDWISE_CUDA_ARCHS=90 -DSHARDWISE_PORTABLE=ON -DSHARDWISE_BENCH=ON $(CMAKE_FLAGS) > $(GPU_BUILD).configure.log 2>&1 || (cat $(GPU_BUILD).configure.log; exit 1)
	@cmake --build $(GPU_BUILD) -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(GPU_BUILD) $(DEMO_BUILD) *.configure.log *.build.log
