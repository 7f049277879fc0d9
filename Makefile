# One entry point for every task. `make demo` runs the main job on a built-in synthetic
# rollout log; `make test` builds everything from scratch in .venv and runs all tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.deps-stamp

.PHONY: check-format demo test test-rust test-fuzz test-python stubtest build bench bench-quick fuzz fuzz-build reproduce clean \
	format lint lint-rust lint-python

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Test and runtime dependencies: the torch, arrow, verl, ray, trl and openrlhf extras are
# installed for the tests. verl, TRL and OpenRLHF go in last and without their heavy runtime
# (--no-deps): the plug-in needs only the modules verl's core_algos and ray_trainer import,
# listed on the line before; TRL's GRPOTrainer needs accelerate besides them; OpenRLHF's
# ppo_utils need pylatexenc (its models need flash-attn and DeepSpeed: not installed).
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q "maturin>=1.8,<2" numpy pyarrow polars scipy matplotlib \
		"pytest>=8" "hypothesis>=6.100" "mypy>=1.10" "ruff~=0.17.0" torch
	$(PIP) install -q "ray[data]" tensordict omegaconf transformers codetiming orjson \
		torchdata datasets peft cachetools uvicorn fastapi accelerate pylatexenc
	$(PIP) install -q --no-deps verl==0.9.1 trl==1.16.0 openrlhf==0.11.2
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

# The fuzz crate (rust/fuzz) is outside the workspace; it shares target/ so the
# dependencies built for test-rust are reused. Its test is the short fuzz budget.
FUZZ_CARGO := cargo --quiet
FUZZ_FLAGS := --manifest-path rust/fuzz/Cargo.toml --release --target-dir target

test-fuzz:
	$(FUZZ_CARGO) test $(FUZZ_FLAGS)

test: test-rust test-fuzz test-python stubtest

# Formatting: rustfmt (rustfmt.toml; rust/fuzz is outside the workspace, so it is named)
# and ruff (pyproject.toml), then ruff's safe fixes.
format: $(STAMP)
	cargo fmt --all
	cargo fmt --manifest-path rust/fuzz/Cargo.toml
	$(PY) -m ruff format
	$(PY) -m ruff check --fix

# What CI checks before the tests: formatting, clippy with warnings denied (the lints are
# in Cargo.toml), ruff, mypy --strict and the extension's stubs against the extension.
lint: lint-rust lint-python stubtest

lint-rust:
	cargo fmt --all --check
	cargo fmt --manifest-path rust/fuzz/Cargo.toml --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(FUZZ_CARGO) clippy $(FUZZ_FLAGS) --all-targets -- -D warnings

# Formatting alone (quicker than lint: no clippy, no mypy).
check-format: $(STAMP)
	cargo fmt --all --check
	cargo fmt --manifest-path rust/fuzz/Cargo.toml --check
	$(PY) -m ruff format --check

# mypy's files and options are [tool.mypy] in pyproject.toml.
lint-python: $(STAMP)
	$(PY) -m ruff check
	$(PY) -m ruff format --check
	$(PY) -m mypy

# The daily fuzz run: >= 10^6 estimator inputs and >= 10^4 corrupt Parquet files (a new
# seed each day, printed so a failure can be replayed with FUZZ_SEED=...), then the
# hypothesis fuzzer of the Python API with more examples. Failing inputs are saved under
# rust/fuzz/artifacts/.
FUZZ_SEED      ?= $(shell date +%Y%m%d)
FUZZ_ESTIMATOR ?= 2000000
FUZZ_PARQUET   ?= 20000
FUZZ_EXAMPLES  ?= 400

fuzz-build:
	$(FUZZ_CARGO) build $(FUZZ_FLAGS) --bin fuzz-drive

fuzz: build fuzz-build
	target/release/fuzz-drive --seed $(FUZZ_SEED) --estimator $(FUZZ_ESTIMATOR) --parquet $(FUZZ_PARQUET)
	MPO_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/test_fuzz_api.py tests/test_fuzz_options.py tests/test_fuzz_rollout_log.py

bench: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py

bench-quick: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py --quick

# The paper's claims at toy scale (docs/reproduction.md): 37 arms x 12 seeds on the CPU in
# 2 worker processes (the committed run: 52.5 min on 2 cores); rewrites docs/reproduction.md
# and the figures under docs/img/reproduction/. The quick smoke test runs in `make test` (tests/test_reproduce.py).
reproduce: build
	$(VENV)/bin/mpo-rs reproduce --workers 2 --out reproduce-out --docs docs

clean:
	cargo clean
	rm -rf $(VENV) .pytest_cache .hypothesis
