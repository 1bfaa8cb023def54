# Two commands a new user needs (README): `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_SILENT := true

.PHONY: setup demo test test-fast lint format bench gpu-check gpu-rehearsal clean

# TORCH: which torch the venv gets (README, "Install"). pypi (default): PyPI's torch — on Linux the CUDA build, with
# CUDA's libraries (a 5.9 GB .venv); what CI and a GPU machine use, and all that a machine reaching only PyPI can get.
# cpu: the CPU-only wheels from TORCH_CPU_INDEX first (a far smaller .venv, for a machine without a GPU); an index
# that cannot be reached stops it within seconds, saying so, before anything is made. Takes effect on a new .venv.
TORCH ?= pypi
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ifeq ($(filter $(TORCH),pypi cpu),)
$(error TORCH=$(TORCH) — pypi (the default: PyPI's torch) or cpu (the CPU-only wheels from $(TORCH_CPU_INDEX)))
endif

$(BIN)/fedbench: pyproject.toml
ifeq ($(TORCH),cpu)
	@$(PY) -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)" $(TORCH_CPU_INDEX) \
		2>/dev/null || { echo "make: TORCH=cpu — $(TORCH_CPU_INDEX) cannot be reached from here (10 s); \
	use the default (make demo: PyPI's torch) or install torch from a reachable index first" >&2; exit 2; }
endif
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(TORCH),cpu)
	$(BIN)/pip install -q --timeout 30 --retries 1 --index-url $(TORCH_CPU_INDEX) torch torchvision
endif
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/fedbench

demo: setup   ## a default federation on the embedded digits data (no download)
	$(BIN)/fedbench rounds=20

test: lint   ## the linter, then the whole test suite
	$(BIN)/python -m pytest -q -n 2 --durations=15   # two workers: the suite takes about half the time on 2 cores; the slowest 15 listed

test-fast: lint   ## the linter, then the unit tests alone: no subprocess, run or compile (tests/conftest.py), for each edit
	FEDBENCH_TEST_FAST=1 $(BIN)/python -m pytest -q -n 2 -m "not slow" -rfE --durations=10   # -rfE: no list of the skipped

lint: setup   ## ruff: lint and format check (line length 120, pyproject.toml)
	$(BIN)/ruff check fedbench hydra_plugins tests scripts
	$(BIN)/ruff format --check fedbench hydra_plugins tests scripts

format: setup   ## ruff: fix what it can, then format
	$(BIN)/ruff check --fix fedbench hydra_plugins tests scripts
	$(BIN)/ruff format fedbench hydra_plugins tests scripts

bench: setup  ## executor throughput and fraction of the machine's FLOP bound
	$(BIN)/python scripts/bench.py

gpu-check: setup  ## on a GPU machine: env, equality, syncs, settings, clients sweep, memory, claims -> gpu_check_<time>/
	bash scripts/gpu_check.sh

# The GPU machine, rehearsed here: a venv with only the GPU image's packages (symlinked from .venv; REHEARSAL_PY=<a
# python with another torch> rehearses that torch), the travel kit of scripts/device_prep.sh, then the exact GPU
# command and the device benchmark (docs/gpu.md) in --cpu-smoke mode. Their reports: .rehearsal/out/report.txt and
# .rehearsal/bench/report.txt.
REHEARSAL_PY ?= $(BIN)/python
gpu-rehearsal: setup
	bash scripts/device_prep.sh
	$(REHEARSAL_PY) scripts/device_kit.py rehearsal-env .rehearsal/venv
	rm -rf .rehearsal/out
	env -u FEDBENCH_DATA PYTHON=.rehearsal/venv/bin/python bash scripts/gpu_check.sh --out .rehearsal/out --cpu-smoke --budget 900
	rm -rf .rehearsal/bench   # with a --variant, as the next window passes the keys of the fast paths
	env -u FEDBENCH_DATA PYTHON=.rehearsal/venv/bin/python bash scripts/gpu_check.sh --bench --out .rehearsal/bench --cpu-smoke --budget 900 --variant tf32on:hardware.tf32=true

clean:
	rm -rf outputs .cache .pytest_cache .rehearsal
