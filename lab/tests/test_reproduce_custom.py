"""`mpo-rs reproduce --env module:factory` and `mpo_lab.reproduce.compare`: the protocol on a
user's MultiTurnEnv (examples/my_env.py). A bad spec is a typed one-line error; --arms runs
only the arms chosen and refuses unknown keys; the configuration hash, and so the output
directory's resume rule, follows the env spec and its parameters; a tiny run writes the
same report, which says what it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpo_lab.reproduce import FULL, PILOT, QUICK
from mpo_lab.reproduce.api import build_config
from mpo_lab.reproduce.budgets import arm_keys, command_line
from mpo_lab.reproduce.env import load_env_factory, make_env
from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError

ROOT = Path(__file__).resolve().parents[1]
ENV = "examples.my_env:make"


@pytest.fixture(autouse=True)
def _from_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # `examples.my_env` is found from the repository root, as the docs' command runs it.
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("examples.my_env", "expected module:factory"),
        (":make", "expected module:factory"),
        ("examples.my_env:", "expected module:factory"),
        ("no_such_module_xyz:make", "no module named 'no_such_module_xyz'"),
        ("examples.my_env:nope", "has no attribute 'nope'"),
        ("os:sep", "not a callable"),
        ("builtins:dict", "not a MultiTurnEnv: it has no vocab_size, action_tokens, max_turns, reset, step"),
        ("json:dumps", "calling it with {} failed: TypeError"),
    ],
)
def test_a_bad_env_spec_is_a_typed_one_line_error(spec: str, says: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(InvalidConfigError, match="env ") as info:
        build_config(spec, budget="quick")
    assert says in str(info.value) and "\n" not in str(info.value)
    from mpo_rs.cli import main

    out = tmp_path / "out"
    assert main(["reproduce", "--env", spec, "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not out.exists()  # refused before the output directory is claimed


def test_env_values_and_params_are_checked(tmp_path: Path, capsys) -> None:
    with pytest.raises(InvalidConfigError, match="unexpected keyword argument 'colour'"):
        build_config(ENV, env_params={"colour": 1}, budget="quick")
    with pytest.raises(InvalidConfigError, match="vocab_size must be an int >= 1, got 0"):
        build_config(ENV, env_params={"num_values": -4}, budget="quick")
    with pytest.raises(InvalidOptionError, match="needs an env"):
        build_config(None, env_params={"num_values": 5})
    from mpo_rs.cli import main

    assert main(["reproduce", "--env", ENV, "--env-param", "5", "--quick", "--out", str(tmp_path / "o")]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_arms_subset_and_unknown_keys() -> None:
    config = build_config(ENV, arms=["mpo", "ppo"], budget="quick")
    assert [a.key for a in config.arms] == ["ppo", "mpo"]  # the configuration's order
    assert build_config(ENV, arms="mpo, ppo", budget="quick") == config
    assert {a.task for a in config.arms} == {ENV} and [t.name for t in config.tasks] == [ENV]
    # The default on a user env: Table 1's arms, retargeted; the knobs are the committed arms'.
    default = build_config(ENV, budget="quick")
    main = FULL.arm("mpo").task
    assert [a.key for a in default.arms] == [a.key for a in FULL.arms if a.study == "table1" and a.task == main]
    assert default.base is None  # no oracle to clone on a user env
    for arm in default.arms:
        committed = QUICK.arm(arm.key)
        assert arm.estimator == committed.estimator and arm.ratio == committed.ratio
    with pytest.raises(InvalidOptionError, match=r"unknown arm\(s\) 'guess_mpo'; known: grpo, gspo, ppo") as info:
        build_config(ENV, arms=["mpo", "guess_mpo"], budget="quick")
    assert "mpo_beta0" in str(info.value) and "guess_ppo" not in str(info.value)
    with pytest.raises(InvalidOptionError, match=r"unknown arm\(s\) 'bogus'; known: .*guess_mpo"):
        build_config(None, arms=["bogus"])
    assert build_config(None, arms=["guess_mpo"]).arms == (FULL.arm("guess_mpo"),)
    assert "guess_mpo" in arm_keys() and "guess_mpo" not in arm_keys(ENV)


def test_the_committed_configurations_stay_as_they_were() -> None:
    assert build_config(None, budget="full") == FULL
    assert build_config(None, budget="quick") == QUICK
    assert command_line(FULL) == "mpo-rs reproduce" and command_line(QUICK) == "mpo-rs reproduce --quick"
    small = build_config(None, budget="small")
    assert small.budget.updates == FULL.budget.updates // 4 and small.model == FULL.model
    assert small.config_hash() not in (FULL.config_hash(), QUICK.config_hash())
    assert build_config(None, budget="pilot") == PILOT and command_line(PILOT) == "mpo-rs reproduce --budget pilot"
    with pytest.raises(InvalidOptionError, match="unknown budget 'huge'; known: quick, small, pilot, full"):
        build_config(None, budget="huge")


def test_the_hash_follows_the_env_spec_and_its_params() -> None:
    base = build_config(ENV, budget="quick")
    hashes = {
        base.config_hash(),
        build_config(ENV, env_params={"num_values": 5}, budget="quick").config_hash(),
        build_config(ENV, env_params={"num_values": 5, "max_turns": 6}, budget="quick").config_hash(),
        build_config("examples.my_env:Vault", budget="quick").config_hash(),
        build_config(None, budget="quick").config_hash(),
        build_config(ENV, arms=["mpo", "ppo"], budget="quick").config_hash(),
        build_config(ENV, seeds=2, budget="quick").config_hash(),
    }
    assert len(hashes) == 7
    assert build_config(ENV, budget="quick").config_hash() == base.config_hash()  # stable
    assert build_config(ENV, budget="quick", workers=7).config_hash() == base.config_hash()  # scheduling only
    # Parameters in any order are the same env.
    one = build_config(ENV, env_params={"num_values": 5, "max_turns": 6}, budget="quick")
    two = build_config(ENV, env_params={"max_turns": 6, "num_values": 5}, budget="quick")
    assert one.config_hash() == two.config_hash()
    assert command_line(one) == (
        "mpo-rs reproduce --quick --env examples.my_env:make --env-param max_turns=6 --env-param num_values=5"
    )


def test_a_callable_is_named_by_module_and_qualname() -> None:
    from examples.my_env import make

    assert build_config(make, budget="quick").tasks == build_config(ENV, budget="quick").tasks
    assert load_env_factory(ENV) is make
    with pytest.raises(InvalidConfigError, match="lambda or a local function"):
        build_config(lambda: make(), budget="quick")
    env = make_env(build_config(ENV, env_params={"num_values": 3}, budget="quick").tasks[0])
    assert (env.vocab_size, env.action_tokens) == (7, 2)


def test_chance_of_a_user_env_is_estimated() -> None:
    pytest.importorskip("torch")
    from mpo_lab.reproduce.env import task_chance

    spec = build_config(ENV, budget="quick").tasks[0]
    value, how = task_chance(spec)
    # By hand: a random turn answers with prob 1/8 (ANSWER, then one of the 4 digit ids among 8),
    # and a random answer is right with prob 1/4; 4 turns.
    exact = sum((1 - 1 / 8) ** t * (1 / 8) * (1 / 4) for t in range(4))
    assert "256 episodes" in how and abs(value - exact) < 3 * (exact * (1 - exact) / 256) ** 0.5 + 1e-9
    assert task_chance(QUICK.task("key_door"))[1] == "exact"


def test_user_env_end_to_end_with_an_arm_subset_and_resume(tmp_path: Path, capsys) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    from mpo_rs.cli import main

    out = tmp_path / "mine"
    argv = ["reproduce", "--env", ENV, "--arms", "mpo,grpo", "--quick", "--seeds", "2", "--out", str(out)]
    assert main([*argv, "--workers", "2"]) == 0
    # No base policy given: the run says plainly that its arms start from scratch.
    assert f"{ENV}: base policy none: a random initialisation: every arm starts from scratch" in capsys.readouterr().err
    runs = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted((r["arm"], r["seed"]) for r in runs) == [("grpo", 0), ("grpo", 1), ("mpo", 0), ("mpo", 1)]
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == [
        "grpo-seed0.json",
        "grpo-seed1.json",
        "mpo-seed0.json",
        "mpo-seed1.json",
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["confirmatory"]["comparisons"] == [
        {"metric": "auc_success", "a": "mpo", "b": "grpo"},
        {"metric": "final_success", "a": "mpo", "b": "grpo"},
    ]
    assert [(c["what"], c["metric"]) for c in results["confirmatory_comparisons"]] == [
        ("MPO - GRPO", "auc_success"),
        ("MPO - GRPO", "final_success"),
    ]
    assert results["chance"][ENV]["how"].startswith("uniformly random tokens")
    assert results["base"] == {ENV: "none: a random initialisation"}
    page = (out / "reproduction.md").read_text()
    assert page.startswith("# Does MPO help on `examples.my_env:make`? The reproduction's protocol on a user")
    assert page.splitlines()[0].endswith("(smoke test)")
    assert "**A run on a user environment**, `examples.my_env:make`" in page
    assert "**This is a smoke test**" in page
    assert "`make reproduce` rewrites" not in page and "(this configuration)" not in page
    summary = page.split("## Summary\n\n", 1)[1].split("\n## ", 1)[0]
    assert summary.startswith("**Bottom line.** 2 comparisons were fixed in advance")
    assert "| `examples.my_env:make` | MPO - GRPO |" in summary  # the confirmatory comparisons' table names the task
    assert "| `examples.my_env:make` |" in summary.split("| task | chance | seeds |", 1)[1]
    assert "## Does MPO help on my task?" in page
    assert "mpo-rs reproduce --env examples.my_env:make --arms mpo,ppo,grpo --budget small" in page
    assert "Rerun: `mpo-rs reproduce --quick --env examples.my_env:make --arms grpo,mpo --seeds 2 --out DIR`" in page

    # The same command resumes every run; another parameter is another configuration, refused there.
    assert main(argv) == 0
    assert "resuming: 4 of 4 runs already finished" in capsys.readouterr().err
    # The page's wall time is this start's, and says that it leaves the resumed runs out.
    page = (out / "reproduction.md").read_text()
    assert "for 4 runs (" in page and "of which 4 were finished by an earlier start and resumed" in page
    assert json.loads((out / "results.json").read_text())["meta"]["resumed"] == 4
    assert main([*argv, "--env-param", "num_values=5"]) == 2
    assert "another configuration" in capsys.readouterr().err


def test_compare_returns_the_paired_results(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("matplotlib")
    from mpo_lab.reproduce import compare

    result = compare(ENV, arms=("mpo", "ppo"), seeds=2, budget="quick", out=tmp_path / "api", workers=1)
    assert result.page.is_file() and result.config.arms[0].task == ENV
    primary, final = result.confirmatory  # the plan's two metrics, the primary first
    assert (primary.metric, final.metric) == ("auc_success", "final_success")
    assert (final.what, final.n) == ("MPO - PPO", 2)
    # A user env has no base policy whose gates the run could measure: no verdict.
    assert {primary.verdict, final.verdict} == {"no verdict"}
    assert result.results["gates"]["tasks"][ENV]["role"] == "user"
    assert result.results["config_hash"] == result.config.config_hash()
