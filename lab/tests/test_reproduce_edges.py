"""`mpo-rs reproduce` at its edges: task seeds apart by construction for every accepted run
seed, the configuration hash following a user env's code, a user env's model sized for its
episodes, the protocol checked up front with one typed line, and a stop path that cannot
deadlock. Tiny budgets throughout (QUICK, one arm)."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpo_lab.reproduce import FULL, PILOT, QUICK, ReproduceConfig
from mpo_lab.seeds import (
    HELD_OUT,
    INDEX_LIMIT,
    MAX_RUN_SEED,
    PURPOSES,
    check_run_seeds,
    decode,
    keeps_first_layout,
    task_seeds,
)
from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError, InvalidRolloutError, MpoError

TESTS = Path(__file__).resolve().parent
EDGE = "edge_envs:make"


@pytest.fixture
def edge_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))  # edge_envs, for this process and its workers
    monkeypatch.chdir(TESTS)


def _workers_of(pid: int) -> list[int]:
    """The pids of the reproduce worker processes that ``pid`` started and that still run."""
    from mpo_lab.reproduce.pool import WORKER_TAG

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if WORKER_TAG.encode() in argv and str(pid).encode() in argv and state != "Z":
                found.append(int(entry.name))
    return found


# --------------------------------------------------------------------------- seeds


def test_run_seed_256_trains_on_no_held_out_task(monkeypatch: pytest.MonkeyPatch, edge_path: None) -> None:
    """Training task seeds were seed * 2**32 + k and the held-out ones 2**40 + k, so run seed
    256 trained on the evaluation tasks (the first one reset 12 times instead of 8)."""
    pytest.importorskip("torch")
    from mpo_lab.reproduce import run
    from mpo_lab.reproduce.api import build_config

    calls: list[tuple[bool, list[int]]] = []
    in_eval = [False]
    real_sample, real_evaluate = run.sample, run._evaluate

    def sample(*args, **kwargs):
        calls.append((in_eval[0], list(kwargs["seeds"])))
        return real_sample(*args, **kwargs)

    def evaluate(*args, **kwargs):
        in_eval[0] = True
        try:
            return real_evaluate(*args, **kwargs)
        finally:
            in_eval[0] = False

    monkeypatch.setattr(run, "sample", sample)
    monkeypatch.setattr(run, "_evaluate", evaluate)
    config = build_config(EDGE, arms=["grpo"], budget="quick", first_seed=256)  # no base policy to build
    run.run_one(config, "grpo", 256)
    trained = {s for held_out, seeds in calls if not held_out for s in seeds}
    evaluated = {s for held_out, seeds in calls if held_out for s in seeds}
    assert len(trained) == QUICK.budget.updates * QUICK.budget.tasks_per_update and evaluated
    assert not trained & evaluated
    assert {decode(s)[0] for s in trained} == {"train"} and {decode(s)[0] for s in evaluated} == {HELD_OUT}


def test_task_seeds_are_disjoint_by_construction_over_the_whole_accepted_range() -> None:
    # decode inverts task_seeds: a task seed names one (purpose, run seed, index), so no two
    # purposes and no two run seeds share a task. Exhaustive where the first layout holds
    # (run seeds below 1024, blocks below 2**11), its boundaries and the tagged layout's,
    # and random points of the whole range.
    blocks: dict[int, tuple[str, int]] = {}
    for s in range(1024):
        for p in PURPOSES:
            block = task_seeds(p, s, 0, 1)[0] // INDEX_LIMIT
            assert block not in blocks and block != 256, (p, s, blocks.get(block))
            blocks[block] = (p, s)
            assert decode(block * INDEX_LIMIT) == (p, s, 0)
    assert decode(256 * INDEX_LIMIT + 7) == (HELD_OUT, None, 7)
    edges = [0, 1, 255, 256, 257, 511, 512, 767, 768, 1023, 1024, 1025, 2047, 2048, 1 << 20, MAX_RUN_SEED - 1]
    rng = np.random.default_rng(0)
    points = [(s, k) for s in edges for k in (0, 1, INDEX_LIMIT - 1)]
    points += list(
        zip(rng.integers(0, MAX_RUN_SEED, 3000).tolist(), rng.integers(0, INDEX_LIMIT, 3000).tolist(), strict=True)
    )
    seen: dict[int, tuple[str, int, int]] = {}
    for s, k in points:
        for p in PURPOSES:
            seed = task_seeds(p, s, k, 1)[0]
            assert 0 <= seed < 2**64 and decode(seed) == (p, s, k)
            assert seen.setdefault(seed, (p, s, k)) == (p, s, k)
            assert decode(seed)[0] != HELD_OUT
    for k in (0, 1, INDEX_LIMIT - 1):
        assert decode(task_seeds(HELD_OUT, None, k, 1)[0]) == (HELD_OUT, None, k)
    # Ranges stay inside their block; the limits are refused.
    assert task_seeds("train", 3, INDEX_LIMIT - 2, 2)[-1] == 4 * INDEX_LIMIT - 1
    for bad in (
        (lambda: task_seeds("train", 3, INDEX_LIMIT - 1, 2)),
        (lambda: task_seeds("train", MAX_RUN_SEED, 0, 1)),
    ):
        with pytest.raises(InvalidConfigError):
            bad()
    with pytest.raises(InvalidConfigError):
        task_seeds("train", -1, 0, 1)
    with pytest.raises(InvalidConfigError):
        task_seeds(HELD_OUT, 0, 0, 1)
    assert decode(2**64) is None and decode(300 * INDEX_LIMIT) is None and decode(-1) is None


def test_committed_seeds_keep_their_tasks() -> None:
    """The committed runs' task seeds are those they were made with."""
    for config in (QUICK, FULL, PILOT):
        for s in config.seed_list:
            assert keeps_first_layout(s)
            assert task_seeds("train", s, 5, 1)[0] == s * 2**32 + 5
            assert task_seeds("demo", s, 0, 1)[0] == 2**41 + s * 2**32
            assert task_seeds("warmup", s, 0, 1)[0] == 2**42 + s * 2**32
    assert task_seeds(HELD_OUT, None, 0, 3) == range(2**40, 2**40 + 3)


def test_run_seeds_outside_the_accepted_range_are_refused(tmp_path: Path, capsys) -> None:
    check_run_seeds(MAX_RUN_SEED - 1, 1)
    for first, count in ((MAX_RUN_SEED - 1, 2), (MAX_RUN_SEED, 1), (-1, 1), (0, 0), (True, 1), (1.5, 1)):
        with pytest.raises(InvalidOptionError):
            check_run_seeds(first, count)
    assert ReproduceConfig(**{**QUICK.__dict__, "first_seed": MAX_RUN_SEED - 1}).seed_list == (MAX_RUN_SEED - 1,)
    with pytest.raises(InvalidOptionError, match="below 16777216"):
        QUICK.with_overrides(first_seed=MAX_RUN_SEED - 1, seeds=2)
    from mpo_rs.cli import main

    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--first-seed", str(MAX_RUN_SEED), "--out", str(out)]) == 2
    assert "run seeds must be below" in capsys.readouterr().err and not out.exists()


# --------------------------------------------------------------------------- the configuration hash


VAULT = (Path(__file__).resolve().parents[1] / "examples" / "my_env.py").read_text()


def _forget(module: str) -> None:
    """What a new process knows of ``module``: nothing (its code is read again)."""
    from mpo_lab.reproduce import env

    env._SOURCES.clear()
    env.load_env_factory.cache_clear()
    sys.modules.pop(module, None)


def test_a_resumed_env_run_refuses_an_edited_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash covered module:factory and its parameters only: an edited env's runs were
    resumed as if they were the new env's."""
    pytest.importorskip("torch")
    from mpo_lab.reproduce.api import build_config, run_config
    from mpo_lab.reproduce.env import make_env
    from mpo_lab.reproduce.output import claim_output_dir
    from mpo_lab.reproduce.run import _save_run, finished_runs

    module = "vault_edited"
    (tmp_path / f"{module}.py").write_text(VAULT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _forget(module)
    spec = f"{module}:make"
    before = build_config(spec, arms=["grpo"], budget="quick")
    out = tmp_path / "out"
    claim_output_dir(out, before.config_hash(), overwrite=False)
    _save_run(out, before, {"arm": "grpo", "seed": 0, "curve": [], "evals": [], "wall_s": 1.0})
    assert len(finished_runs(before, out)) == 1
    listing = sorted(p.relative_to(out) for p in out.rglob("*"))

    (tmp_path / f"{module}.py").write_text(VAULT.replace("else random.Random", "else random.Random") + "\n# edited\n")
    _forget(module)
    after = build_config(spec, arms=["grpo"], budget="quick")
    assert after.tasks[0].code != before.tasks[0].code and after.config_hash() != before.config_hash()
    assert finished_runs(after, out) == {}
    with pytest.raises(InvalidOptionError, match="made from other code") as info:
        run_config(after, out)
    assert spec in str(info.value) and "\n" not in str(info.value)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == listing
    # A process whose env module is another than the configuration's refuses to run it.
    with pytest.raises(InvalidConfigError, match=r"not the \w+ this configuration was made with"):
        make_env(before.tasks[0])
    # The built-in tasks' hashes are what they were: no code identity is added to them.
    assert QUICK.tasks[0].identity() == {"name": "key_door", "params": (("max_turns", 3), ("action_tokens", 4))}


def test_a_declared_version_is_part_of_the_code_identity(edge_path: None) -> None:
    from mpo_lab.reproduce.api import build_config

    codes = {
        build_config(EDGE, env_params=p, budget="quick").tasks[0].code for p in ({}, {"version": 1}, {"version": 2})
    }
    assert len(codes) == 3


# --------------------------------------------------------------------------- a user env's size


def test_an_env_with_long_observations_runs(edge_path: None) -> None:
    """4 turns of 100-token observations ended the run with "TinyCausalLM: position 306 is
    beyond max_len=256", after --out was claimed."""
    pytest.importorskip("torch")
    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.run import run_one

    config = build_config(EDGE, env_params={"obs_len": 100}, arms=["grpo"], budget="quick")
    result = run_one(config, "grpo", 0)
    assert len(result["curve"]) == QUICK.budget.updates
    assert max(row["turns"] for row in result["curve"]) > 2  # episodes of > 256 tokens were played


def test_an_env_beyond_the_model_is_refused_before_out(edge_path: None, tmp_path: Path, capsys) -> None:
    from mpo_rs.cli import main

    out = tmp_path / "out"
    for params, says in (
        (["obs_len=2000"], "tokens long, more than the 4096 the model takes"),
        (["max_turns=3000"], "at least 9000 tokens, more than reproduce's model takes (4096)"),
        (["vocab_size=10000000000000"], "vocab_size 10000000000000 is more than reproduce's model takes"),
    ):
        argv = ["reproduce", "--env", EDGE, *(a for p in params for a in ("--env-param", p)), "--quick"]
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and EDGE in err, err
        assert not out.exists()


# --------------------------------------------------------------------------- the protocol, up front


BAD_ENVS = [
    (["done_kind=array"], "returned done=array([False, False]) (ndarray), not a bool"),
    (["done_kind=str"], "returned done='no' (str), not a bool"),
    (["max_turns=99999999999999999999999"], "max_turns must be below 2**63, got 99999999999999999999999"),
    (["raise_in=step"], "raised ZeroDivisionError: integer division or modulo by zero"),
    (["raise_in=reset"], "reset(1099511627776) raised ValueError: cannot reset"),
    (["raise_in=init"], "failed: RuntimeError: the factory failed"),
    (["reward_kind=str"], "returned the reward '1.0' (str), not a number"),
    (["reward_kind=bool"], "returned the reward True (bool), not a number"),
    (["reward_kind=nan"], "returned the reward nan, not finite"),
    (["reward_kind=huge"], "not finite"),
    (["reward_kind=list"], "(list), not a number"),
    (["obs_kind=floats"], "an observation that is not a list of int token ids: [0.5]"),
    (["obs_kind=2d"], "an observation that is not a list of int token ids: array([[0, 0], [0, 0]])"),
    (["obs_kind=too_big"], "an observation whose token 0 is 1000000, outside [0, 8) (vocab_size)"),
    (["obs_kind=str"], "not a list of int token ids: 'abc'"),
    (["reset_kind=empty"], "reset(1099511627776) returned no tokens"),
    (["reset_kind=none"], "reset(1099511627776) returned an observation that is not a list"),
    (["result_kind=pair"], "not (observation, reward, done)"),
    (["action_tokens=true"], "action_tokens must be an int >= 1, got True"),
    (['vocab_size="8"'], "vocab_size must be an int >= 1, got '8'"),
    (["vocab_size=0"], "vocab_size must be an int >= 1, got 0"),
]


@pytest.mark.parametrize(("params", "says"), BAD_ENVS, ids=[p[0] for p, _ in BAD_ENVS])
def test_a_bad_env_is_one_typed_line_before_out(params: list[str], says: str, edge_path: None, tmp_path: Path, capsys):
    """A numpy array as done, vocab_size=10**13, max_turns=10**23, an env that raises, a
    reward "1.0": tracebacks, or accepted. Now one typed line naming the env, the call and
    the value, before --out is claimed."""
    from mpo_lab.reproduce.api import build_config

    kwargs = {}
    for p in params:
        key, _, text = p.partition("=")
        try:  # as the command line reads --env-param: JSON, else a string
            kwargs[key] = json.loads(text)
        except ValueError:
            kwargs[key] = text
    with pytest.raises(MpoError) as info:
        build_config(EDGE, env_params=kwargs, budget="quick")
    assert says in str(info.value) and f"env {EDGE!r}" in str(info.value), str(info.value)
    assert "\n" not in str(info.value)
    from mpo_rs.cli import main

    out = tmp_path / "out"
    assert (
        main(
            ["reproduce", "--env", EDGE, *(a for p in params for a in ("--env-param", p)), "--quick", "--out", str(out)]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_checks_accept_what_the_protocol_allows(edge_path: None) -> None:
    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.env import make_env

    for params in ({"done_kind": "numpy"}, {"reward_kind": "numpy"}, {"reward_kind": "int"}, {"obs_kind": "array"}):
        env = make_env(build_config(EDGE, env_params=params, budget="quick").tasks[0])
        env.reset(5)
        observation, reward, done = env.step([0, 1])
        assert type(observation) is list and type(reward) is float and type(done) is bool


def test_an_env_that_raises_mid_run_ends_it_with_one_typed_line(edge_path: None, tmp_path: Path) -> None:
    # It passes the probe (the first tasks), then raises on a later training task: in a worker.
    pytest.importorskip("torch")
    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.run import run_all

    params = {"raise_in": "step", "raise_from_index": 6}
    config = build_config(EDGE, env_params=params, arms=["grpo"], seeds=2, budget="quick")
    started = time.monotonic()
    with pytest.raises(InvalidRolloutError, match="raised ZeroDivisionError") as info:
        run_all(config, tmp_path / "out", workers=2)
    assert "\n" not in str(info.value) and "of seed" in str(info.value)
    assert time.monotonic() - started < 120
    assert _workers_of(os.getpid()) == []


def test_an_episode_that_never_ends_is_cut_off_at_max_turns(edge_path: None) -> None:
    pytest.importorskip("torch")
    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.run import run_one

    config = build_config(EDGE, env_params={"never_done": True, "max_turns": 3}, arms=["grpo"], budget="quick")
    result = run_one(config, "grpo", 0)
    assert all(row["turns"] == 3 for row in result["curve"])


# --------------------------------------------------------------------------- the stop path


def test_a_stop_handler_raises_nothing_and_the_workers_are_reaped() -> None:
    """Ctrl-C hung `reproduce --workers 2` once in eight: the handler raised inside the
    process pool's locks and the pool's shutdown waited on them. Now a stop only records
    the signal; the main thread then kills and reaps the workers and raises the stop."""
    from mpo_lab.reproduce import run

    seen: list[int] = []

    def finished(i: int, result: float) -> None:
        seen.append(i)
        if len(seen) == 1:
            handler = signal.getsignal(signal.SIGINT)
            assert callable(handler)
            handler(signal.SIGINT, None)  # what a Ctrl-C runs: it must not raise here

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        run._run_in_pool(2, [1.0, 4.0, 9.0, 16.0] * 8, list(range(32)), finished, math.sqrt)
    assert getattr(info.value, "signum", None) == signal.SIGINT and run._stop_code(info.value) == 130
    assert time.monotonic() - started < 60 and len(seen) < 32
    assert _workers_of(os.getpid()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
