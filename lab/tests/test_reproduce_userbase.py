"""A user env's base policy (`--demonstrator`, `--base-policy`; mpo_lab.reproduce.userbase):
cloned from the user's demonstrator as the built-in tasks' bases are from their noisy
oracles, or loaded from a policy file of the run's model; a file of another model is refused
naming the file and what differs; the cache key follows the demonstrator's code and the
file's digest; the console and results.json say where the arms start, "none: a random
initialisation" included."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from mpo_lab.reproduce.api import build_config
from mpo_lab.reproduce.budgets import command_line
from mpo_lab.reproduce.presets import FULL, QUICK
from mpo_lab.reproduce.sources import Demonstrator, SavedPolicy
from mpo_lab.reproduce.userbase import SCRATCH, base_description, base_lines, demonstrator_source
from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError, InvalidRolloutError

ROOT = Path(__file__).resolve().parents[1]
ENV = "examples.my_env:make"
DEMO = "examples.my_env:demonstrate"


@pytest.fixture(autouse=True)
def _from_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # `examples.my_env` is found from the repository root


# --------------------------------------------------------------------------- numpy only


def test_the_configuration_records_the_base_and_the_committed_ones_stay() -> None:
    scratch = build_config(ENV, budget="quick")
    cloned = build_config(ENV, budget="quick", demonstrator=DEMO)
    assert scratch.base is None and base_description(scratch, ENV) == SCRATCH
    assert cloned.base is not None and cloned.base.noise == ()
    assert cloned.base.source == demonstrator_source(DEMO) and isinstance(cloned.base.source, Demonstrator)
    # The budget's cloning settings, as a built-in task's base has them.
    assert (cloned.base.episodes, cloned.base.steps, cloned.base.lr) == (16, 3, QUICK.base.lr)  # type: ignore[union-attr]
    assert cloned.config_hash() != scratch.config_hash()
    assert base_description(cloned, ENV) == f"cloned from demonstrator {DEMO}"
    assert base_description(QUICK, "search") == "cloned from the built-in noisy oracle (eps 0)"
    assert base_description(QUICK, "frozen_lake") == "cloned from the built-in noisy oracle (eps 0.86)"
    assert command_line(cloned) == f"mpo-rs reproduce --quick --env {ENV} --demonstrator {DEMO}"
    # From scratch, the console says so and how to give a base.
    (line,) = base_lines(scratch)
    assert line.startswith(f"{ENV}: base policy none: a random initialisation: every arm starts from scratch")
    assert "--demonstrator" in line and "--base-policy" in line
    assert base_lines(cloned) == [f"{ENV}: base policy cloned from demonstrator {DEMO}"]
    # A module-level callable is named by module and qualname.
    from examples.my_env import demonstrate

    assert build_config(ENV, budget="quick", demonstrator=demonstrate) == cloned
    # The committed configurations are what they were (the built-in bases have no source).
    hashes = {name: build_config(None, budget=name).config_hash() for name in ("quick", "pilot", "full")}
    assert hashes == {"quick": "de862aa5fd65", "pilot": "9e9910685afa", "full": "ad912b7a54fc"}
    assert build_config(None, budget="full", device="cuda").config_hash() == "182feb2c7e91"


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"demonstrator": DEMO}, InvalidOptionError, "needs an env (--env module:factory)"),
        ({"base_policy": "x.pt"}, InvalidOptionError, "needs an env (--env module:factory)"),
        ({"env": ENV, "demonstrator": DEMO, "base_policy": "x.pt"}, InvalidOptionError, "give one"),
        ({"env": ENV, "demonstrator": "examples.my_env"}, InvalidConfigError, "expected module:callable"),
        ({"env": ENV, "demonstrator": "examples.my_env:nope"}, InvalidConfigError, "has no attribute 'nope'"),
        ({"env": ENV, "demonstrator": "examples.my_env:ASK"}, InvalidConfigError, "not a callable that returns"),
        ({"env": ENV, "demonstrator": "json:dumps"}, InvalidRolloutError, "demonstrator 'json:dumps' turn 0"),
        ({"env": ENV, "demonstrator": "math:sqrt"}, InvalidConfigError, "task seed"),
        ({"env": ENV, "base_policy": "no/such/file.pt"}, InvalidOptionError, "base policy 'no/such/file.pt'"),
    ],
)
def test_a_bad_base_is_a_typed_one_line_error(kwargs, error, says, tmp_path: Path, capsys) -> None:
    env = kwargs.pop("env", None)
    with pytest.raises(error, match=r"demonstrator|base_policy|base policy") as info:
        build_config(env, budget="quick", **kwargs)
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)
    if env is None:
        return
    from mpo_rs.cli import main

    out = tmp_path / "out"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]
    assert main(["reproduce", "--env", env, *flags, "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not out.exists()  # refused before the output directory is claimed


def _module(directory: Path, body: str) -> str:
    """A demonstrator module of its own (a new process's view of it: read afresh)."""
    from mpo_lab.reproduce import env

    (directory / "my_demo_xyz.py").write_text(body)
    env._SOURCES.clear()
    sys.modules.pop("my_demo_xyz", None)
    return "my_demo_xyz:act"


def test_the_base_key_follows_the_demonstrator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from mpo_lab.reproduce import base
    from mpo_lab.reproduce.userbase import load_demonstrator

    monkeypatch.syspath_prepend(str(tmp_path))
    # The built-in tasks' keys are the ones they always had (their base files stay cached).
    assert (base.base_key(QUICK, "search", 0), base.base_key(FULL, "frozen_lake", 3)) == (
        "f828abae5a41",
        "b5e715057e8a",
    )
    body = "def act(observations):\n    return [0, 4] if len(observations) < 2 else [1, 4]\n"
    first = build_config(ENV, budget="quick", demonstrator=_module(tmp_path, body))
    again = build_config(ENV, budget="quick", demonstrator=_module(tmp_path, body))
    assert base.base_key(first, ENV, 0) == base.base_key(again, ENV, 0)
    edited = build_config(ENV, budget="quick", demonstrator=_module(tmp_path, body.replace("< 2", "< 3")))
    assert base.base_key(edited, ENV, 0) != base.base_key(first, ENV, 0)
    assert edited.config_hash() != first.config_hash()
    other = build_config(ENV, budget="quick", demonstrator=DEMO)
    assert len({base.base_key(c, ENV, 0) for c in (first, edited, other, build_config(ENV, budget="quick"))}) == 4
    # A base made from the edited code under the old configuration is refused, not cloned.
    with pytest.raises(InvalidConfigError, match=r"its code is .* not the .* this configuration was made with"):
        load_demonstrator(first.base.source)  # type: ignore[union-attr, arg-type]
    # A policy file's digest is in the key too.
    a, b = SavedPolicy("p.pt", "aaaaaaaaaaaa"), SavedPolicy("p.pt", "bbbbbbbbbbbb")
    keys = {
        base.base_key(dataclasses.replace(other, base=dataclasses.replace(other.base, source=s)), ENV, 0)
        for s in (a, b)
    }  # type: ignore[arg-type]
    assert len(keys) == 2


def test_a_demonstrator_that_draws_gets_a_seeded_generator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from mpo_lab.reproduce.env import make_env
    from mpo_lab.reproduce.userbase import demonstrator_episodes

    monkeypatch.syspath_prepend(str(tmp_path))
    body = (
        "import numpy as np\n"
        "def act(observations, *, rng):\n"
        "    assert isinstance(rng, np.random.Generator)\n"
        "    return [1, 4 + int(rng.integers(4))]\n"
    )
    config = build_config(ENV, budget="quick", demonstrator=_module(tmp_path, body))  # played once here
    source = config.base.source  # type: ignore[union-attr]
    env = make_env(config.tasks[0])
    tokens = [demonstrator_episodes(env, source, range(16), np.random.default_rng([0, 1]))[0] for _ in range(2)]  # type: ignore[arg-type]
    assert tokens[0] == tokens[1] and len(set(tokens[0][2::3])) > 1  # the same draws, not one answer


# --------------------------------------------------------------------------- the bases themselves (torch)


def _cloning(config, **settings):
    return dataclasses.replace(config, base=dataclasses.replace(config.base, **settings))


def test_a_demonstrator_gives_a_base_above_chance(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from mpo_lab.reproduce.base import base_path, base_policy, held_out_success
    from mpo_lab.reproduce.env import task_chance

    torch.set_num_threads(1)
    config = _cloning(build_config(ENV, budget="quick", demonstrator=DEMO), episodes=48, steps=40, batch_size=16)
    policy, info = base_policy(config, ENV, 0, tmp_path)
    assert info["source"] == f"cloned from demonstrator {DEMO}" and "eps" not in info
    assert info["demo_success"] > 0.6  # the demonstrator asks twice: ~0.8 less its hasty quarter
    chance, _ = task_chance(config.tasks[0])
    success = held_out_success(policy, config, ENV, 0, 128)
    assert chance < 0.1 and success > chance + 0.3, (success, chance)
    saved = torch.load(base_path(tmp_path, ENV, 0), weights_only=True)
    assert saved["model"] == {"vocab_size": 8, "width": 32, "layers": 1, "heads": 2, "max_len": 4096}


def test_a_saved_policy_round_trip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from mpo_lab.reproduce.base import base_path, base_policy

    made, _ = base_policy(build_config(ENV, budget="quick", demonstrator=DEMO), ENV, 0, tmp_path / "first")
    path = base_path(tmp_path / "first", ENV, 0)
    written = path.read_bytes()
    config = build_config(ENV, budget="quick", base_policy=path)
    assert config.base is not None and config.base.source == SavedPolicy(str(path), config.base.source.digest)  # type: ignore[union-attr]
    assert base_description(config, ENV) == f"loaded from {path}"
    assert command_line(config).endswith(f"--base-policy {path}")
    for seed in (0, 1):  # every seed starts from the file
        policy, info = base_policy(config, ENV, seed, tmp_path / "second")
        assert all(torch.equal(v, made.state_dict()[k]) for k, v in policy.state_dict().items())
        assert info["source"] == f"loaded from {path}" and 0.0 <= info["held_out_success"] <= 1.0
    # Given its own run directory, the user's file is used and never written over.
    base_policy(config, ENV, 0, tmp_path / "first")
    assert path.read_bytes() == written
    # A bare state dict is a policy file too.
    bare = tmp_path / "bare.pt"
    torch.save(made.state_dict(), bare)
    policy, _ = base_policy(build_config(ENV, budget="quick", base_policy=bare), ENV, 3)
    assert all(torch.equal(v, made.state_dict()[k]) for k, v in policy.state_dict().items())


def test_a_policy_file_of_another_model_is_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from mpo_lab.reproduce.base import base_path, base_policy

    base_policy(build_config(ENV, budget="quick", demonstrator=DEMO), ENV, 0, tmp_path)
    path = base_path(tmp_path, ENV, 0)
    with pytest.raises(InvalidOptionError, match=r"vocab_size 8 in the file, 9 in this run's") as info:
        build_config(ENV, env_params={"num_values": 5}, budget="quick", base_policy=path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InvalidOptionError, match=r"width 32 in the file, 64 in this run's; layers 1 in the file, 2"):
        build_config(ENV, budget="small", base_policy=path)
    # Without the sizes reproduce records, the tensors say them.
    bare = tmp_path / "bare.pt"
    torch.save(torch.load(path, weights_only=True)["state"], bare)
    with pytest.raises(InvalidOptionError, match=r"'.*bare.pt': .*width 32 in the file, 64 in this run's"):
        build_config(ENV, budget="small", base_policy=bare)
    junk = tmp_path / "junk.pt"
    junk.write_text("not a policy")
    with pytest.raises(InvalidOptionError, match=r"not a policy file torch\.save wrote"):
        build_config(ENV, budget="quick", base_policy=junk)
    torch.save({"weights": [1, 2]}, junk)
    with pytest.raises(InvalidOptionError, match="holds a dict, not a state dict"):
        build_config(ENV, budget="quick", base_policy=junk)
    with pytest.raises(InvalidOptionError, match="a directory"):
        build_config(ENV, budget="quick", base_policy=tmp_path)
    # A file changed after the configuration was made is refused where it is loaded.
    copy = tmp_path / "copy.pt"
    copy.write_bytes(path.read_bytes())
    config = build_config(ENV, budget="quick", base_policy=copy)
    torch.save(torch.load(path, weights_only=True)["state"], copy)
    with pytest.raises(InvalidOptionError, match="changed since"):
        base_policy(config, ENV, 0)


def test_a_run_says_where_its_arms_start(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("matplotlib")
    from mpo_lab.reproduce import compare

    notes: list[str] = []
    result = compare(
        ENV, arms=("grpo",), budget="quick", out=tmp_path / "o", workers=1, demonstrator=DEMO, note=notes.append
    )
    assert f"{ENV}: base policy cloned from demonstrator {DEMO}" in notes
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["base"] == {ENV: f"cloned from demonstrator {DEMO}"}
    assert results["config"]["base"]["source"]["spec"] == DEMO
    (row,) = results["runs"]
    assert 0.0 <= row["base_success"] <= 1.0  # measured: the page's base column is no longer "scratch"
    assert result.results["base"] == results["base"]
    # Its gates: exploration measured on the base (no belief model: no ceiling, no premise).
    gates = results["gates"]["tasks"][ENV]
    assert gates["role"] == "user" and len(gates["base"]) == 1
    assert gates["base"][0]["entropy"] > 0 and gates["base"][0]["critic_ceiling"] != gates["base"][0]["critic_ceiling"]
    assert [g["gate"] for g in gates["judged"]] == ["learning", "exploration"]
    page = (tmp_path / "o" / "reproduction.md").read_text()
    assert f"starts from the same base policy, cloned from demonstrator {DEMO} (behaviour cloning" in page
