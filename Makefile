# Two commands a new user needs (README): `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_SILENT := true

.PHONY: setup demo test lint format bench gpu-check gpu-rehearsal clean

$(BIN)/fedbench: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/fedbench

demo: setup   ## a default federation on the embedded digits data (no download)
	$(BIN)/fedbench rounds=20

test: lint   ## the linter, then the whole test suite
	$(BIN)/python -m pytest -q -n 2 --durations=15   # two workers: the suite takes about half the time on 2 cores; the slowest 15 listed

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
