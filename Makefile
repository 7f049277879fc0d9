# One entry point for every task. `make demo` runs the main job on a built-in synthetic
# rollout log; `make test` builds everything from scratch in .venv and runs all tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.deps-stamp

.PHONY: demo test test-rust test-python stubtest build bench bench-quick clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Test and runtime dependencies: the torch, arrow, verl and ray extras are installed for the
# tests. verl goes in last and without its heavy runtime (--no-deps): the plug-in needs
# only the modules its core_algos and ray_trainer import, listed on the line before.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q "maturin>=1.8,<2" numpy pyarrow polars scipy matplotlib \
		"pytest>=8" "hypothesis>=6.100" "mypy>=1.10" torch
	$(PIP) install -q "ray[data]" tensordict omegaconf transformers codetiming orjson \
		torchdata datasets peft cachetools uvicorn fastapi
	$(PIP) install -q --no-deps verl==0.9.1
	touch $(STAMP)

build: $(STAMP)
	$(VENV)/bin/maturin develop --release -q

# The main job: advantages for a synthetic rollout log of a few hundred MB, then the
# diagnosis of its critic's value structure (figures in demo-data/diagnosis/).
demo: build
	$(PY) -m mpo_rs.demo
	$(VENV)/bin/mpo-rs diagnose demo-data/rollouts.parquet -o demo-data/diagnosis

# The pure-Rust crates (the PyO3 crate is tested through pytest).
test-rust:
	cargo test -p mpo-core -p mpo-logs --release -q

test-python: build
	$(PY) -m pytest -q

stubtest: build
	$(PY) -m mypy.stubtest mpo_rs._native

test: test-rust test-python stubtest

bench: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py

bench-quick: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py --quick

clean:
	cargo clean
	rm -rf $(VENV) .pytest_cache .hypothesis
