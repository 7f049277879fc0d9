# One entry point for every task. `make demo` runs the main job on a built-in synthetic
# batch; `make test` builds everything from scratch in .venv and runs all tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.deps-stamp

.PHONY: demo test test-rust test-python stubtest build bench bench-quick clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Test and runtime dependencies (torch is the optional extra, installed for the tests).
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q "maturin>=1.8,<2" numpy pyarrow polars scipy matplotlib \
		"pytest>=8" "hypothesis>=6.100" "mypy>=1.10" torch
	touch $(STAMP)

build: $(STAMP)
	$(VENV)/bin/maturin develop --release -q

demo: build
	$(PY) -m mpo_rs.demo

test-rust:
	cargo test -p mpo-core --release -q

test-python: build
	$(PY) -m pytest -q

stubtest: build
	$(PY) -m mypy.stubtest mpo_rs._native --ignore-missing-stub

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
