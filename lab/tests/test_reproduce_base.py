"""Where the arms start and how the results will be analysed: the base policy of a (task,
seed) is made once, cached and shared by every arm of the seed; the critic warm-up runs for
the critic arms only and gives each the same critic; the analysis plan's hash and its seed
sizing."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

from mpo_lab.reproduce.config import (
    ARMS,
    BASE_BAND,
    TABLE1_TASKS,
    TASK_PREFIX,
    BasePolicy,
    CriticWarmup,
)
from mpo_lab.reproduce.plan import COMPARISONS, PLAN, seeds_for_half_width, sizing
from mpo_lab.reproduce.presets import CONFIGS, FULL, PILOT, QUICK
from mpo_lab.reproduce.stats import t_quantile
from mpo_rs.exceptions import InvalidConfigError

# --------------------------------------------------------------------------- the plan (numpy only)


def test_plan_hash_is_stable_and_changes_with_the_plan():
    digest = PLAN.plan_hash()
    assert len(digest) == 12 and digest == PLAN.plan_hash()
    # The same in a fresh interpreter with another hash seed: canonical JSON, no set order.
    code = "from mpo_lab.reproduce.plan import PLAN; print(PLAN.plan_hash())"
    env = {"PYTHONHASHSEED": "12345", **{k: v for k, v in __import__("os").environ.items() if k != "PYTHONHASHSEED"}}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert other.stdout.strip() == digest
    for change in (
        {"alpha": 0.01},
        {"target_half_width": 0.04},
        {"max_seeds": PLAN.max_seeds + 1},
        {"metrics": PLAN.metrics[::-1]},
        {"comparisons": PLAN.comparisons[:-1]},
    ):
        assert dataclasses.replace(PLAN, **change).plan_hash() != digest, change


def test_plan_is_what_the_configurations_run():
    PLAN.check(FULL)
    PLAN.check(PILOT)
    assert FULL.budget.eval_tasks * FULL.budget.eval_samples >= 256 == PLAN.final_episodes
    assert not set(FULL.seed_list) & set(PILOT.seed_list)
    # FULL never reaches the pilot's seeds, even at the cap.
    assert FULL.first_seed + PLAN.max_seeds <= PILOT.first_seed
    with pytest.raises(InvalidConfigError, match="pilot's seeds"):
        PLAN.check(dataclasses.replace(FULL, first_seed=PILOT.first_seed))
    with pytest.raises(InvalidConfigError, match="256"):
        PLAN.check(dataclasses.replace(FULL, budget=dataclasses.replace(FULL.budget, eval_tasks=16)))
    # Table 1 on every task of the committed configurations (a newer task comes in through a
    # candidate first), the relatives, beta and lambda on the main task; Holm over both metrics.
    claims = {c.claim for c in COMPARISONS}
    assert claims == {"table1", "relatives", "beta", "lambda"}
    assert {c.task for c in COMPARISONS if c.claim == "table1"} == set(TABLE1_TASKS) < set(TASK_PREFIX)
    assert len(PLAN.confirmatory()) == 2 * len(COMPARISONS) and PLAN.alpha == 0.05 and PLAN.correction == "holm"


def test_seeds_for_half_width_is_the_smallest_n():
    for sd in (0.02, 0.05, 0.1, 0.2, 0.3):
        n = seeds_for_half_width(sd, 0.05)
        assert t_quantile(n - 1) * sd / math.sqrt(n) <= 0.05
        assert n == 2 or t_quantile(n - 2) * sd / math.sqrt(n - 1) > 0.05
    assert seeds_for_half_width(0.0, 0.05) == 2
    assert seeds_for_half_width(0.3, 0.05, cap=10) == 10
    assert seeds_for_half_width(math.nan, 0.05, cap=10) == 10
    with pytest.raises(InvalidConfigError):
        seeds_for_half_width(math.nan, 0.05)


def test_sizing_from_pilot_rows():
    rng = np.random.default_rng(0)
    seeds = PILOT.seed_list
    rows = []
    spread = {c.b: 0.02 * (i + 1) for i, c in enumerate(COMPARISONS) if c.claim == "table1"}
    for s in seeds:
        shared = rng.random()  # a seed effect every arm shares: it cancels in the pairs
        for arm in ARMS:
            rows.append({"arm": arm.key, "seed": s, "auc_success": shared + spread.get(arm.key, 0.0) * rng.normal()})
    result = sizing(rows)
    by_b = {p["b"]: p for p in result.per_comparison}
    assert set(by_b) == {c.b for c in COMPARISONS if c.claim == "table1"}
    for c in COMPARISONS:
        if c.claim != "table1":
            continue
        d = [
            next(r["auc_success"] for r in rows if r["arm"] == c.a and r["seed"] == s)
            - next(r["auc_success"] for r in rows if r["arm"] == c.b and r["seed"] == s)
            for s in seeds
        ]
        assert by_b[c.b]["sd"] == pytest.approx(np.std(d, ddof=1))
    needed = max(seeds_for_half_width(p["sd"], 0.05) for p in result.per_comparison)
    assert result.needed == max(needed, PLAN.min_seeds)
    assert result.seeds == min(result.needed, PLAN.max_seeds) and result.capped == (result.needed > PLAN.max_seeds)
    assert result.plan_hash == PLAN.plan_hash()
    # Identical arms: sd 0, the plan's least seeds.
    flat = [{"arm": a.key, "seed": s, "auc_success": 0.5} for a in ARMS for s in seeds]
    assert sizing(flat).seeds == PLAN.min_seeds
    with pytest.raises(InvalidConfigError, match="pilot seeds"):
        sizing([{"arm": a.key, "seed": 1001, "auc_success": 0.5} for a in ARMS])


# --------------------------------------------------------------------------- base policies and warm-up

torch = pytest.importorskip("torch")


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# A small configuration whose critic has something to fit: GuessNumber's random guesses
# succeed about a quarter of the time.
SMALL = dataclasses.replace(
    QUICK,
    base=BasePolicy(noise=QUICK.base.noise, episodes=16, steps=4, batch_size=8, lr=3e-3),  # type: ignore[union-attr]
    warmup=CriticWarmup(episodes=32, steps=6, batch_size=8),
)


def test_base_policy_is_shared_by_the_arms_of_a_seed_and_cached(tmp_path, monkeypatch):
    from mpo_lab.reproduce import base
    from mpo_lab.reproduce.run import starting_models

    arm_a, arm_b, other_task = SMALL.arm("guess_grpo"), SMALL.arm("guess_mpo"), SMALL.arm("mpo")
    policy_a, start_a = starting_models(SMALL, arm_a, 0, tmp_path)
    assert base.base_path(tmp_path, "guess_number", 0).is_file()
    fresh = base.new_policy(SMALL, "guess_number", 0)
    assert not _same(_state(policy_a), _state(fresh))  # cloned: it moved from the initialisation
    assert start_a["base"]["eps"] == 1.0 and start_a["base"]["task"] == "guess_number"

    # Every later arm of the seed loads it: making it again would fail here.
    def refuse(*_args, **_kwargs):
        raise AssertionError("the base policy was made again")

    monkeypatch.setattr(base, "_make_base", refuse)
    policy_b, start_b = starting_models(SMALL, arm_b, 0, tmp_path)
    assert _same(_state(policy_a), _state(policy_b)) and start_a["base"] == start_b["base"]
    monkeypatch.undo()

    # Another seed or task is another base policy; other settings are made again, in place.
    assert not _same(_state(policy_a), _state(starting_models(SMALL, arm_a, 1, tmp_path)[0]))
    assert starting_models(SMALL, other_task, 0, tmp_path)[1]["base"]["task"] == "search"
    changed = dataclasses.replace(SMALL, base=dataclasses.replace(SMALL.base, steps=5))  # type: ignore[arg-type]
    assert base.base_key(changed, "guess_number", 0) != base.base_key(SMALL, "guess_number", 0)
    assert not base.is_cached(changed, "guess_number", 0, tmp_path, critic=False)
    policy_c = starting_models(changed, arm_a, 0, tmp_path)[0]
    assert base.is_cached(changed, "guess_number", 0, tmp_path, critic=False)
    assert not _same(_state(policy_a), _state(policy_c))
    # A torn file is not used: made again.
    path = base.base_path(tmp_path, "guess_number", 0)
    path.write_bytes(path.read_bytes()[:100])
    assert _same(_state(policy_c), _state(starting_models(changed, arm_a, 0, tmp_path)[0]))


def test_warmup_is_for_critic_arms_only_and_the_same_for_each(tmp_path):
    from mpo_lab.reproduce.run import starting_models

    critic_arms = [a for a in SMALL.arms if a.task == "guess_number" and a.trains_critic]
    assert {a.key for a in critic_arms} == {"guess_ppo", "guess_mpo", "guess_mpo_token_is"}
    critics = []
    for arm in critic_arms:
        _, start = starting_models(SMALL, arm, 0, tmp_path)
        critics.append(_state(start["critic"]))
        assert start["warmup"]["steps"] == 6 and start["warmup"]["critic_lr"] == SMALL.budget.critic_learning_rate
        assert math.isfinite(start["warmup"]["explained_variance"])
    assert all(_same(critics[0], c) for c in critics[1:])
    head = {k: v for k, v in critics[0].items() if k.startswith("lm_head")}
    assert any(v.abs().sum() > 0 for v in head.values())  # fitted: no longer the zero head
    for key in ("guess_grpo", "guess_gspo"):  # critic-free arms: no warm-up, the zero value head
        _, start = starting_models(SMALL, SMALL.arm(key), 0, tmp_path)
        assert start["warmup"] is None
        assert all(v.abs().sum() == 0 for k, v in start["critic"].state_dict().items() if k.startswith("lm_head"))
    # Without a warm-up every arm gets the zero head.
    _, start = starting_models(dataclasses.replace(SMALL, warmup=None), SMALL.arm("guess_ppo"), 0, tmp_path)
    assert start["warmup"] is None


def test_run_all_prepares_each_task_and_seed_once(tmp_path):
    from mpo_lab.reproduce import base
    from mpo_lab.reproduce.run import run_all

    config = dataclasses.replace(
        SMALL,
        arms=tuple(SMALL.arm(k) for k in ("guess_grpo", "guess_mpo", "grpo", "gspo")),
        budget=dataclasses.replace(SMALL.budget, updates=1, eval_every=1),
    )
    notes: list[str] = []
    runs = run_all(config, tmp_path, workers=1, note=notes.append)
    made = [n for n in notes if "base policy held-out success" in n]
    assert len(made) == 2  # guess_number and search, seed 0
    assert base.critic_path(tmp_path, "guess_number", 0).is_file()
    assert not base.critic_path(tmp_path, "search", 0).exists()  # only critic-free arms there
    by_arm = {r["arm"]: r for r in runs}
    assert by_arm["guess_grpo"]["base"] == by_arm["guess_mpo"]["base"]
    assert by_arm["guess_mpo"]["warmup"] is not None and by_arm["guess_grpo"]["warmup"] is None


def test_no_base_is_the_random_initialisation():
    from mpo_lab.reproduce.base import new_policy
    from mpo_lab.reproduce.run import starting_models

    bare = dataclasses.replace(QUICK, base=None, warmup=None)
    policy, start = starting_models(bare, bare.arm("mpo"), 3)
    assert start["base"] is None and start["warmup"] is None
    assert _same(_state(policy), _state(new_policy(bare, "search", 3)))


def test_every_configuration_has_a_noise_level_per_task():
    for config in CONFIGS.values():
        assert config.base is not None and config.warmup is not None
        for spec in config.tasks:
            assert 0.0 <= config.base.eps(spec.name) <= 1.0
    with pytest.raises(InvalidConfigError, match="no noise level"):
        FULL.base.eps("no_such_task")  # type: ignore[union-attr]


@pytest.mark.slow  # one FULL behaviour cloning: ~14 CPU seconds
@pytest.mark.parametrize("task", ["search"])
def test_full_base_policy_is_in_the_band(task):
    """FULL's base policy of the main task, made as the runs make it, succeeds within the
    paper's base band on 256 held-out tasks (the measurement behind its noise level)."""
    from mpo_lab.reproduce.base import base_policy, held_out_success

    torch.set_num_threads(1)
    policy, info = base_policy(FULL, task, FULL.first_seed)
    success = held_out_success(policy, FULL, task, FULL.first_seed, 256)
    assert BASE_BAND[0] <= success <= BASE_BAND[1], success
    assert info["held_out_success"] == success  # FULL's own measurement is this one (256 episodes)


def test_the_committed_plan_record_is_the_plan():
    # The plan is fixed before the final runs: docs/analysis-plan.md, in the history, records
    # it; changing the plan without regenerating the record fails here.
    from pathlib import Path

    from mpo_lab.reproduce.plan import render_markdown

    record = Path(__file__).resolve().parents[1] / "docs" / "analysis-plan.md"
    assert record.read_text() == render_markdown(), "run: mpo-lab plan > docs/analysis-plan.md"
    assert f"`{PLAN.plan_hash()}`" in record.read_text()


def test_the_instruments_plan_is_its_configurations_and_is_committed():
    """The instrument's configuration carries out its own plan (every comparison's arms, 256
    distinct held-out tasks at the end, seeds apart from its pilots'), the two plans share what
    the analysis reads from the paper's (metrics, alpha, margins), and docs/instrument-plan.md
    records it."""
    from pathlib import Path

    from mpo_lab.reproduce.plan import INSTRUMENT_PLAN, PLANS, plan_for, render_markdown
    from mpo_lab.reproduce.presets import INSTRUMENT, INSTRUMENT_QUICK

    assert plan_for(INSTRUMENT) is plan_for(INSTRUMENT_QUICK) is INSTRUMENT_PLAN and plan_for(FULL) is PLAN
    INSTRUMENT_PLAN.check(INSTRUMENT)
    assert INSTRUMENT.budget.final_eval_tasks == 256 and INSTRUMENT.plan == "instrument"
    assert not set(INSTRUMENT.seed_list) & set(INSTRUMENT_PLAN.pilot_seeds)
    assert INSTRUMENT_PLAN.min_seeds <= INSTRUMENT.seeds <= INSTRUMENT_PLAN.max_seeds
    for plan in PLANS.values():
        assert (plan.metrics, plan.alpha, plan.equivalence_margins) == (
            PLAN.metrics,
            PLAN.alpha,
            PLAN.equivalence_margins,
        )
    tasks = {spec.name for spec in INSTRUMENT.tasks}
    assert {c.task for c in INSTRUMENT_PLAN.comparisons} == tasks
    assert {c.claim for c in INSTRUMENT_PLAN.comparisons} == {"table1", "gigpo"}
    with pytest.raises(InvalidConfigError, match="unknown plan 'nope'"):
        plan_for(dataclasses.replace(INSTRUMENT, plan="nope"))
    record = Path(__file__).resolve().parents[1] / "docs" / "instrument-plan.md"
    assert record.read_text() == render_markdown(INSTRUMENT_PLAN), (
        "run: mpo-lab plan instrument > docs/instrument-plan.md"
    )


def test_coin_collectors_plan_is_its_configurations_and_is_committed():
    """The third premise task's configuration carries out its own plan (the instrument's
    comparisons on Coin Collector, seeds apart from its pilot's), and docs/instrument-coin-plan.md
    records it; the instrument's plan and configuration are unchanged by it."""
    from pathlib import Path

    from mpo_lab.reproduce.plan import COIN_PLAN, INSTRUMENT_PLAN, plan_for, render_markdown
    from mpo_lab.reproduce.presets import INSTRUMENT, INSTRUMENT_COIN

    assert plan_for(INSTRUMENT_COIN) is COIN_PLAN
    COIN_PLAN.check(INSTRUMENT_COIN)
    assert [c.what for c in COIN_PLAN.comparisons] == [
        "coin_collector: MPO - GRPO",
        "coin_collector: MPO - PPO",
        "coin_collector: MPO - MPO w/ token IS",
        "coin_collector: MPO - GiGPO",
        "coin_collector: GiGPO - GRPO",
    ]
    assert dict(COIN_PLAN.task_roles) == {"coin_collector": "premise"}
    assert not set(INSTRUMENT_COIN.seed_list) & set(COIN_PLAN.pilot_seeds)
    assert COIN_PLAN.min_seeds <= INSTRUMENT_COIN.seeds <= COIN_PLAN.max_seeds
    assert INSTRUMENT_COIN.budget == INSTRUMENT.budget and INSTRUMENT_COIN.model == INSTRUMENT.model
    assert (INSTRUMENT.config_hash(), INSTRUMENT_PLAN.plan_hash()) == ("6ea60269eb82", "c2e3d233630c")
    record = Path(__file__).resolve().parents[1] / "docs" / "instrument-coin-plan.md"
    assert record.read_text() == render_markdown(COIN_PLAN), (
        "run: mpo-lab plan instrument-coin > docs/instrument-coin-plan.md"
    )


def test_a_task_can_clone_from_more_demonstrations_than_the_others():
    """``BasePolicy.cloning``: per task (a variant takes its environment's) its own demonstrations
    and steps; unset, the configuration's hash is the one it always had."""
    from mpo_lab.reproduce.presets import INSTRUMENT

    base = INSTRUMENT.base
    assert base is not None
    assert base.sizes("search") == base.sizes("search@think0") == (8192, 4000)
    assert base.sizes("multi_hop") == (base.episodes, base.steps) == (4096, 1500)
    assert "cloning" not in FULL.to_dict()["base"] and "plan" not in FULL.to_dict()
    assert INSTRUMENT.to_dict()["base"]["cloning"] == (("search", 8192, 4000),)
    changed = dataclasses.replace(FULL, base=dataclasses.replace(FULL.base, cloning=(("search", 1024, 10),)))
    assert changed.config_hash() != FULL.config_hash()


def test_the_instrument_runs_by_name_and_its_page_names_the_command():
    """``mpo-rs reproduce --config instrument``: the committed configuration by name, with
    seeds and arms as flags; it takes no budget or env, and the page's command line says it."""
    import argparse

    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.budgets import command_line, is_committed
    from mpo_lab.reproduce.command import add_parser, run
    from mpo_lab.reproduce.presets import INSTRUMENT
    from mpo_rs.exceptions import InvalidOptionError

    assert build_config(config_name="instrument") == INSTRUMENT and is_committed(INSTRUMENT)
    fewer = build_config(config_name="instrument", seeds=2, arms="grpo,mpo")
    assert command_line(fewer) == "mpo-rs reproduce --config instrument --arms grpo,mpo --seeds 2"
    with pytest.raises(InvalidOptionError, match="config: one of instrument, instrument-quick"):
        build_config(config_name="full")
    with pytest.raises(InvalidOptionError, match="runs on cpu, not cuda"):
        build_config(config_name="instrument", device="cuda")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    for flags in (["--quick"], ["--budget", "small"], ["--env", "x:y"]):
        args = parser.parse_args(["reproduce", "--config", "instrument", *flags])
        with pytest.raises(InvalidOptionError, match="--config names a whole configuration"):
            run(args)
    with pytest.raises(InvalidOptionError, match="--docs writes the committed page"):
        run(parser.parse_args(["reproduce", "--config", "instrument-quick", "--docs", "d"]))
