# One entry point for every task. `make demo` runs the main job on a built-in synthetic
# rollout log (numpy, pyarrow and matplotlib only); `make test` builds everything from
# scratch in .venv, installs the test extras and the lab (lab/, the mpo-lab package) and
# runs all tests of both packages, the wheel's included.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.deps-stamp
# The lab (lab/, pure Python), installed editable beside the library for its tests and runs.
LAB_STAMP := $(VENV)/.lab-stamp
# What the main job needs: the build tool, pyarrow (the `arrow` reader) and the `plot` extra.
DEMO_STAMP := $(VENV)/.demo-deps-stamp
DEMO_DEPS  := "maturin>=1.8,<2" numpy pyarrow matplotlib

.PHONY: check-format demo build-demo wheel sdist test-wheel test test-rust test-fuzz test-python stubtest build bench bench-quick fuzz fuzz-build reproduce page build-lab clean \
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
	$(PIP) install -q $(DEMO_DEPS) polars scipy "setuptools>=68" \
		"pytest>=8" "hypothesis>=6.100" "mypy>=1.10" "ruff~=0.17.0" torch
	$(PIP) install -q "ray[data]" tensordict omegaconf transformers codetiming orjson \
		torchdata datasets peft cachetools uvicorn fastapi accelerate pylatexenc
	$(PIP) install -q --no-deps verl==0.9.1 trl==1.16.0 openrlhf==0.11.2
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PIP) install -q $(DEMO_DEPS)
	touch $(DEMO_STAMP)

# maturin develop installs into $VIRTUAL_ENV, else into a .venv it finds: name $(VENV).
DEVELOP := VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q

build: $(STAMP)
	$(DEVELOP)

# The lab on top of the library: its own dependencies are the library's extras, installed above.
$(LAB_STAMP): lab/pyproject.toml $(STAMP)
	$(PIP) install -q --no-deps --no-build-isolation -e ./lab
	touch $(LAB_STAMP)

build-lab: build $(LAB_STAMP)

build-demo: $(DEMO_STAMP)
	$(DEVELOP)

# The main job: advantages for a synthetic rollout log of a few hundred MB, then the
# diagnosis of its critic's value structure (figures in demo-data/diagnosis/). It installs
# only numpy, pyarrow and matplotlib, not the test extras.
demo: build-demo
	$(PY) -m mpo_rs.demo
	$(VENV)/bin/mpo-rs diagnose demo-data/rollouts.parquet -o demo-data/diagnosis

# The pure-Rust crates (the PyO3 crate is tested through pytest).
test-rust:
	cargo test -p mpo-core -p mpo-logs --release -q

# The library's tests, then the lab's (its own pytest configuration, in lab/).
test-python: build-lab
	$(PY) -m pytest -q --durations=15
	cd lab && ../$(PY) -m pytest -q --durations=10

stubtest: build
	$(PY) -m mypy.stubtest mpo_rs._native

# The fuzz crate (rust/fuzz) is outside the workspace; it shares target/ so the
# dependencies built for test-rust are reused. Its test is the short fuzz budget.
FUZZ_CARGO := cargo --quiet
FUZZ_FLAGS := --manifest-path rust/fuzz/Cargo.toml --release --target-dir target

test-fuzz:
	$(FUZZ_CARGO) test $(FUZZ_FLAGS)

test: test-rust test-fuzz test-python stubtest test-wheel

# The distributions, in dist/: an abi3 wheel (one per platform, CPython >= 3.11) and the
# sdist. The wheel's manylinux tag is the oldest glibc its symbols allow (maturin checks
# it, as auditwheel would); WHEEL_COMPAT=manylinux_2_28 (say) makes that a requirement.
DIST         ?= dist
WHEEL_COMPAT ?=
WHEEL_FLAGS  := --release --interpreter $(PY) --out $(DIST) $(if $(WHEEL_COMPAT),--compatibility $(WHEEL_COMPAT))

wheel: $(DEMO_STAMP)
	rm -f $(DIST)/mpo_rs-*.whl
	$(VENV)/bin/maturin build $(WHEEL_FLAGS)

sdist: $(DEMO_STAMP)
	rm -f $(DIST)/mpo_rs-*.tar.gz
	$(VENV)/bin/maturin sdist --out $(DIST)

# The wheel as a user gets it: a bare venv with numpy and pyarrow, no Rust on PATH, the
# smoke tests run from outside the checkout (so the source tree is not what is imported);
# then the sdist is built into a wheel offline, which shows it carries everything needed.
test-wheel: wheel sdist
	tests/smoke/run.sh $(PYTHON) $(DIST) $(VENV)

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

# The daily fuzz run: >= 10^6 estimator inputs, 2 x 10^5 GiGPO inputs and >= 10^4 corrupt Parquet files (a new
# seed each day, printed so a failure can be replayed with FUZZ_SEED=...), then the
# hypothesis fuzzers of the Python API and of `reproduce --env` with more examples, and
# FUZZ_STOPS stops of `reproduce` across its phases, and mpo_rs.testing's invariants on
# mpo_rs itself under the kit's `fuzz` profile (1000 examples per invariant). Failing inputs are saved under
# rust/fuzz/artifacts/.
FUZZ_SEED      ?= $(shell date +%Y%m%d)
FUZZ_ESTIMATOR ?= 2000000
FUZZ_GIGPO     ?= 200000
FUZZ_PARQUET   ?= 20000
FUZZ_EXAMPLES  ?= 400
# Stops of `mpo-rs reproduce --workers 2` across its phases (lab/tests/test_fuzz_reproduce.py).
FUZZ_STOPS     ?= 60

fuzz-build:
	$(FUZZ_CARGO) build $(FUZZ_FLAGS) --bin fuzz-drive

fuzz: build-lab fuzz-build
	target/release/fuzz-drive --seed $(FUZZ_SEED) --estimator $(FUZZ_ESTIMATOR) --gigpo $(FUZZ_GIGPO) --parquet $(FUZZ_PARQUET)
	MPO_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) MPO_FUZZ_STOPS=$(FUZZ_STOPS) FUZZ_SEED=$(FUZZ_SEED) \
		$(PY) -m pytest -q tests/test_fuzz_api.py tests/test_fuzz_objects.py tests/test_fuzz_options.py tests/test_fuzz_rollout_log.py
	cd lab && MPO_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) MPO_FUZZ_STOPS=$(FUZZ_STOPS) FUZZ_SEED=$(FUZZ_SEED) \
		../$(PY) -m pytest -q tests/test_fuzz_reproduce.py tests/test_fuzz_envs.py
	MPO_RS_TESTING_PROFILE=fuzz $(PY) -m pytest -q tests/test_testing_kit.py -k hold

bench: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py

bench-quick: build
	PYTHON=$(PYTHON) benches/setup_env.sh .venv-bench
	.venv-bench/bin/python benches/run_all.py --quick

# The lab's committed run (lab/docs/reproduction.md): the instrument configuration, 27 arms x
# 5 seeds on the tasks that passed their gates, on the CPU in 2 worker processes (156 min on
# 2 cores), read by the pilots' gates; rewrites lab/docs/reproduction.md, its figures under
# lab/docs/img/reproduction/, its tables under lab/docs/full/ and lab/README.md's summary.
# Its smoke test: mpo-lab reproduce --config instrument-quick (minutes). `make page` renders
# the committed page again from its records (seconds).
reproduce: build-lab
	$(VENV)/bin/mpo-lab reproduce --config instrument --gates lab/docs/instrument/gates.json --workers 2 \
		--out reproduce-out --docs lab/docs

page: build-lab
	$(VENV)/bin/mpo-lab page lab/docs

clean:
	cargo clean
	rm -rf $(VENV) .venv-wheel $(DIST) .pytest_cache .hypothesis
