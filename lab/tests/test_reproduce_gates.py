"""The instrument's yardsticks: the on-policy reference critic (against the exact values of
the noisy oracle, which acts on the belief state) and the gates' verdicts."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from mpo_lab.envs import make
from mpo_lab.envs.premise import NoisyOracle, belief_model, rollout
from mpo_lab.reproduce.gate_rules import GATES, call_tokens, judge, learning_measurement
from mpo_lab.reproduce.reference import TabularCritic, belief_keys, cross_fitted_values, prefix_summary
from mpo_rs.torch.metrics import explained_variance


def _oracle_rollouts(task: str, eps: float, tasks: int, group: int, seed: int = 0):
    env = make(task)
    oracle = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(seed)
    rs = [rollout(env, oracle, 50_000 + i // group, rng) for i in range(tasks * group)]
    tokens = np.concatenate([r.tokens for r in rs]).astype(np.int64)
    mask = np.concatenate([r.mask for r in rs]).astype(bool)
    offsets = np.cumsum([0] + [len(r.tokens) for r in rs])
    exact = np.concatenate([np.asarray(r.values)[np.asarray(r.mask, bool)] for r in rs])
    returns = np.concatenate([[r.score] * int(np.sum(r.mask)) for r in rs])
    fold = np.concatenate([[(i % group) % 2] * int(np.sum(r.mask)) for i, r in enumerate(rs)])
    return env, tokens, mask, offsets, exact, returns, fold


@pytest.mark.parametrize("task", ["search", "multi_hop", "frozen_lake"])
def test_the_reference_critic_recovers_the_exact_values_of_a_belief_state_policy(task):
    """FrozenLake's belief holds the map, which 16 rollouts reach: its table keys a summary
    (the turn and the optimal success from the cell, then of the move), pooled over maps."""
    env, tokens, mask, offsets, exact, returns, fold = _oracle_rollouts(task, 0.2, tasks=128, group=16)
    keys = belief_keys(env, tokens, mask, offsets)
    assert len(keys) == int(mask.sum())  # one key per policy token
    values = cross_fitted_values(keys, returns, fold)
    ev_exact, ev_table = explained_variance(exact, returns), explained_variance(values, returns)
    # Cross-fitted on 2,048 rollouts: a little below the exact values' explained variance, not above.
    assert ev_exact - 0.06 < ev_table < ev_exact + 0.02, (ev_exact, ev_table)
    # A summary key averages states of one key's different exact values: a little further off.
    assert float(np.mean(np.abs(values - exact))) < (0.07 if task == "frozen_lake" else 0.05)


def test_the_reference_critic_keeps_a_decisive_tokens_value_inside_its_turn():
    """KeyDoor: the key token decides inside turn 0 whether the door can open. The table must
    key what the token decides (right or wrong key), not the token itself -- a token that is one
    task's key and another's wrong one would average the two, and the value would move only
    at the next turn's belief, between turns. Its between-turn share is then the exact values'."""
    from mpo_rs.diagnose import summarize_value_structure, value_structure

    env, tokens, mask, offsets, exact, returns, fold = _oracle_rollouts("key_door", 0.55, tasks=64, group=16)
    values = cross_fitted_values(belief_keys(env, tokens, mask, offsets), returns, fold)
    scores = np.array([returns[i] for i in np.searchsorted(np.flatnonzero(mask), offsets[:-1])])
    shares = []
    for v in (exact, values):
        full = np.zeros(mask.size, dtype=np.float32)
        full[mask] = v
        shares.append(
            summarize_value_structure(value_structure(full, mask, offsets), outcome=scores)["all"][
                "median_between_share"
            ]
        )
    assert shares[0] < 0.1 and shares[1] < 0.25, shares
    assert explained_variance(values, returns) > explained_variance(exact, returns) - 0.06


def test_the_cross_fitted_table_cannot_memorise_noise():
    env, tokens, mask, offsets, _, returns, fold = _oracle_rollouts("search", 0.2, tasks=32, group=16)
    keys = belief_keys(env, tokens, mask, offsets)
    noise = np.random.default_rng(1).permutation(returns)  # returns that no key predicts
    own = TabularCritic(keys, noise)(keys)  # fitted on the same tokens: memorises some of it
    assert explained_variance(own, noise) > 0.0
    assert explained_variance(cross_fitted_values(keys, noise, fold), noise) < 0.02


def _rows(final: dict[str, float], base: float = 0.2, spread: float = 0.02) -> list[dict]:
    rows = []
    for arm, value in final.items():
        for seed in range(4):
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "final_success": value + spread * (seed - 1.5),
                    "base_success": base,
                    "warmup_explained_variance": 0.3,
                    "final_explained_variance": 0.35,
                }
            )
    return rows


def _base(entropy=0.5, distinct=0.6, ceiling=0.5, share=0.9):
    return [{"entropy": entropy, "distinct_groups": distinct, "critic_ceiling": ceiling, "between_share": share}]


def test_a_task_that_trains_and_is_predictable_passes_every_gate():
    learned = learning_measurement(_rows({"grpo": 0.5, "ppo": 0.45, "mpo": 0.5}), "")
    results = {r.gate: r for r in judge("premise", _base(), learned)}
    assert set(results) == {"learning", "exploration", "predictability", "premise"}
    assert all(r.passed for r in results.values()), results


@pytest.mark.parametrize(
    ("change", "gate"),
    [
        ({"final": {"grpo": 0.25, "ppo": 0.5, "mpo": 0.5}}, "learning"),  # GRPO gains 0.05 only
        ({"base": {"entropy": 0.05}}, "exploration"),
        ({"base": {"distinct": 0.2}}, "exploration"),
        ({"base": {"ceiling": 0.2}}, "predictability"),
        ({"base": {"ceiling": 0.8}}, "predictability"),  # learned critics at 0.3 < half of 0.8
        ({"base": {"share": 0.7}}, "premise"),
    ],
)
def test_each_gate_fails_on_its_own(change, gate):
    final = change.get("final", {"grpo": 0.5, "ppo": 0.45, "mpo": 0.5})
    learned = learning_measurement(_rows(final), "")
    results = {r.gate: r for r in judge("premise", _base(**change.get("base", {})), learned)}
    assert [g for g, r in results.items() if not r.passed] == [gate]


def test_the_negative_control_must_fail_the_premise_and_a_gate_not_measured_is_not_passed():
    results = {r.gate: r for r in judge("control", _base(share=0.3), None)}
    assert results["premise"].passed and results["learning"].passed is None
    assert "predictability" not in results
    assert not {r.gate: r for r in judge("control", _base(share=0.6), None)}["premise"].passed
    nan = {r.gate: r for r in judge("premise", _base(ceiling=math.nan), None)}
    assert nan["predictability"].passed is None
    assert GATES.learning_lower_bound == 0.10 and GATES.premise_share == 0.8


def test_a_trajectory_that_opens_with_a_policy_token_is_refused_naming_it():
    from mpo_rs import InvalidBatchError

    env, tokens, mask, offsets, *_ = _oracle_rollouts("search", 0.2, tasks=1, group=2)
    bad = mask.copy()
    bad[offsets[1]] = True  # the second trajectory's first token
    with pytest.raises(InvalidBatchError, match="trajectory 1: it must open with its first observation"):
        belief_keys(env, tokens, bad, offsets)


def test_thinking_tokens_key_as_the_turns_start_and_the_entropy_reads_the_call():
    env = make("search", think_tokens=3)
    model = belief_model(env)
    b = model.initial(env.reset(0))
    think = env.first_think
    assert prefix_summary(model, b, ()) == prefix_summary(model, b, (think, think)) == ()
    assert prefix_summary(model, b, (think,) * 3 + (4,)) == (4,)
    assert prefix_summary(model, b, (think, 4)) == (2, "malformed")
    # Two trajectories: an observation, then turns of 3 thoughts + a 3-token call.
    mask = np.array([0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1], dtype=bool)
    offsets = np.array([0, 14, 22])
    calls = call_tokens(mask, offsets, 3)
    assert calls.tolist() == [False] * 4 + [True] * 3 + [False] * 4 + [True] * 3 + [False] * 5 + [True] * 3
    assert call_tokens(mask, offsets, 0).tolist() == mask.tolist()


# ---------------------------------------------------------------- the reference critic as a value source


class _Batch:
    """The members of a RolloutBatch that the reference critic reads."""

    def __init__(self, tokens, mask, offsets, scores):
        self.token_ids, self.mask, self.offsets, self._scores = tokens, mask, offsets, np.asarray(scores)

    def trajectory_scores(self):
        return self._scores


@functools.cache
def _oracle_batch(eps: float, tasks: int, group: int, seed: int):
    env = make("search", hit_probs=[0.05, 0.9])
    oracle = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(seed)
    rs = [rollout(env, oracle, 10 * seed + 70_000 + i // group, rng) for i in range(tasks * group)]
    tokens = np.concatenate([r.tokens for r in rs]).astype(np.int64)
    mask = np.concatenate([r.mask for r in rs]).astype(bool)
    offsets = np.cumsum([0] + [len(r.tokens) for r in rs])
    exact = np.concatenate([np.asarray(r.values)[np.asarray(r.mask, bool)] for r in rs])
    return env, _Batch(tokens, mask, offsets, [r.score for r in rs]), exact


def test_the_reference_value_source_reads_no_batch_its_own_returns_and_tracks_the_exact_values():
    from mpo_lab.reproduce.reference import OnPolicyReference

    env, base, _ = _oracle_batch(0.2, tasks=128, group=8, seed=1)
    _, batch, exact = _oracle_batch(0.2, tasks=64, group=8, seed=2)
    reference = OnPolicyReference(env)
    reference.add_base(base)
    values = reference.values(batch)
    assert values.dtype == np.float32 and values.shape == batch.mask.shape and not values[~batch.mask].any()
    flipped = _Batch(batch.token_ids, batch.mask, batch.offsets, 1.0 - batch.trajectory_scores())
    assert np.array_equal(reference.values(flipped), values)  # its own returns are never read
    error = float(np.mean(np.abs(values[batch.mask] - exact)))
    assert error < 0.08 and error < 0.3 * float(np.mean(np.abs(exact - exact.mean()))), error  # 1,024 rollouts fitted
    # Updates replace the base's rollouts once `window` batches are in.
    small = OnPolicyReference(env, window=1)
    small.add_base(base)
    small.add(flipped)
    assert not np.array_equal(small.values(batch), values)


@pytest.mark.parametrize("k", [0.0, 0.25, 0.5, 0.75])
def test_the_critic_quality_ladder_explains_k_of_the_references_variance(k):
    from mpo_lab.reproduce.reference import OnPolicyReference

    env, base, _ = _oracle_batch(0.2, tasks=256, group=8, seed=3)
    _, batch, _ = _oracle_batch(0.2, tasks=256, group=8, seed=4)
    returns = np.repeat(batch.trajectory_scores(), np.diff(batch.offsets))[batch.mask]
    exact = OnPolicyReference(env)
    exact.add_base(base)
    ceiling = explained_variance(exact.values(batch)[batch.mask], returns)
    evs = []
    for seed in range(4):
        degraded = OnPolicyReference(env, ev_fraction=k, seed=seed)
        degraded.add_base(base)
        evs.append(explained_variance(degraded.values(batch)[batch.mask], returns))
    assert ceiling > 0.3
    assert abs(float(np.mean(evs)) - k * ceiling) < 0.06, (k, ceiling, evs)


def test_a_reference_arm_is_a_critic_arm_with_a_documented_source():
    from mpo_lab.reproduce.config import ARMS, Arm
    from mpo_rs.options import Estimator

    arm = Arm(
        "r", "MPO, reference critic", "ladder", "search", Estimator("mae"), "turn", critic="reference", critic_ev=0.5
    )
    assert arm.critic_kind == "reference+noise" and not arm.learns_critic and arm.trains_critic
    assert arm.identity()["critic_ev"] == 0.5
    assert all("critic" not in a.identity() for a in ARMS)  # the committed arms' hashes stay
    from mpo_rs import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="a group estimator reads no values"):
        Arm("g", "GRPO", "ladder", "search", Estimator("grpo"), "token", critic="reference")
    with pytest.raises(InvalidConfigError, match=r"critic must be one of learned, reference"):
        Arm("p", "PPO", "ladder", "search", Estimator("gae"), "token", critic="oracle")
    with pytest.raises(InvalidConfigError, match=r"critic_ev is a fraction in \[0, 1\]"):
        Arm("p", "PPO", "ladder", "search", Estimator("gae"), "token", critic_ev=0.5)


def test_a_candidate_with_the_ladder_trains_reference_arms_end_to_end(tmp_path):
    """The gates' candidate with the ladder: the reference arms run (no warm-up, no value head
    trained), their rows say which critic they read, and the report is written."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    import dataclasses

    from mpo_lab.reproduce.api import run_config
    from mpo_lab.reproduce.gates import candidate
    from mpo_lab.reproduce.presets import QUICK

    config = candidate(QUICK, ["search"], {"think_tokens": 2}, ladder=True, gigpo=True)
    keep = {"grpo", "ppo", "mpo", "mpo_ref1", "ppo_ref0.5", "ragen_bilevel_ref0", "gigpo"}
    config = dataclasses.replace(config, arms=tuple(a for a in config.arms if a.key in keep), workers=1)
    assert {a.key for a in config.arms} == keep
    run_config(config, tmp_path / "out")
    rows = {r["arm"]: r for r in pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()}
    assert set(rows) == keep
    assert {k: rows[k]["critic"] for k in keep} == {
        "grpo": "none",
        "ppo": "learned",
        "mpo": "learned",
        "mpo_ref1": "reference",
        "ppo_ref0.5": "reference+noise",
        "ragen_bilevel_ref0": "reference+noise",
        "gigpo": "none",
    }
    assert rows["ppo_ref0.5"]["critic_ev_target"] == 0.5 and math.isnan(rows["mpo_ref1"]["critic_ev_target"])
    assert all(r["think_tokens"] == 2 and r["task"] == "search" for r in rows.values())
    assert not rows["mpo_ref1"]["critic_trained"] and rows["ppo"]["critic_trained"]
    assert not rows["gigpo"]["critic_trained"] and config.arm("gigpo").method == "gigpo"


def test_a_candidate_adds_a_premise_task_and_trains_it_end_to_end(tmp_path):
    """``add``: Sokoban, in no committed configuration, joins a candidate with Table 1's arms
    (``sok_`` keys, GiGPO anchored on its observation) and its demonstrations' noise; without
    that noise it is refused. Its base policy, arms and gates' measurement then run."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    import dataclasses

    from mpo_lab.reproduce.api import run_config
    from mpo_lab.reproduce.gate_rules import base_measurement
    from mpo_lab.reproduce.gates import candidate
    from mpo_lab.reproduce.presets import QUICK
    from mpo_lab.reproduce.tasks import task_role
    from mpo_rs.exceptions import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="--base-eps"):
        candidate(QUICK, ["sokoban"], {}, add=["sokoban"])
    config = candidate(QUICK, ["sokoban"], {"max_turns": 4}, base_eps=0.3, add=["sokoban"], gigpo=True)
    assert [t.name for t in config.tasks] == ["sokoban"] and task_role("sokoban") == "premise"
    assert [a.key for a in config.arms] == ["sok_grpo", "sok_ppo", "sok_mpo", "sok_gigpo"]
    assert config.base.eps("sokoban") == 0.3 and config.arm("sok_gigpo").estimator.options["anchor"] == "observation"
    config = dataclasses.replace(config, workers=1)
    run_config(config, tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert sorted(r["arm"] for r in rows) == ["sok_gigpo", "sok_grpo", "sok_mpo", "sok_ppo"]
    assert all(r["task"] == "sokoban" and 0 <= r["final_success"] <= 1 for r in rows)
    measured = base_measurement(config, "sokoban", config.seed_list[0], tasks=4, group=4, cache=tmp_path / "out")
    assert 0 <= measured["critic_ceiling"] <= 1 or math.isnan(measured["critic_ceiling"])


def test_two_variants_of_one_environment_run_side_by_side(tmp_path):
    """``search`` and ``search@think2`` in one configuration: their own arm keys, base
    policies, run rows and titles; the variant's environment has its parameters."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    import dataclasses

    from mpo_lab.reproduce.api import run_config
    from mpo_lab.reproduce.config import TaskSpec, table1_arms
    from mpo_lab.reproduce.env import make_env
    from mpo_lab.reproduce.presets import QUICK
    from mpo_lab.reproduce.rows import task_title
    from mpo_lab.reproduce.tasks import registry_name, task_prefix

    variant = TaskSpec("search@think2", (("think_tokens", 2),))
    assert registry_name(variant.name) == "search" and task_prefix(variant.name) == "think2_"
    assert task_prefix("multi_hop@spread") == "hop_spread_" and task_title(variant.name) == "Search (think2)"
    assert make_env(variant).action_tokens == 5
    arms = tuple(a for a in (*table1_arms("search"), *table1_arms(variant.name)) if a.key.endswith(("grpo", "mpo")))
    assert [a.key for a in arms] == ["grpo", "mpo", "think2_grpo", "think2_mpo"]
    config = dataclasses.replace(QUICK, tasks=(QUICK.task("search"), variant), arms=arms, workers=1)
    run_config(config, tmp_path / "out")
    rows = {r["arm"]: r for r in pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()}
    assert {k: (r["task"], r["think_tokens"]) for k, r in rows.items()} == {
        "grpo": ("search", 0),
        "mpo": ("search", 0),
        "think2_grpo": ("search@think2", 2),
        "think2_mpo": ("search@think2", 2),
    }
    assert (tmp_path / "out" / "base" / "search@think2-seed0.pt").is_file()


def test_the_ladders_gains_are_paired_by_seed_per_rung():
    from mpo_lab.reproduce.when import ladder_gains, ladder_table, turn_length_gains

    rows = []
    for seed in range(4):
        rows.append(
            {"arm": "hop_grpo", "seed": seed, "final_success": 0.5 + 0.01 * seed, "final_explained_variance": math.nan}
        )
        for k in (1.0, 0.5, 0.0):
            for method, gain in (("mpo", 0.1 * k), ("ppo", 0.05)):
                rows.append(
                    {
                        "arm": f"hop_{method}_ref{k:g}",
                        "seed": seed,
                        "final_success": 0.5 + 0.01 * seed + gain + 0.001 * (seed % 2),
                        "final_explained_variance": 0.5 * k,
                    }
                )
    entries = ladder_gains(rows, "multi_hop")
    assert [e["k"] for e in entries] == [1.0, 0.5, 0.0]  # rungs and learned critics that did not run are left out
    top, bottom = entries[0], entries[-1]
    assert top["ev"]["mpo"] == 0.5 and bottom["ev"]["ppo"] == 0.0
    assert top["gain_over_grpo"]["mpo"]["diff"] == pytest.approx(0.1005) and top["gain_over_grpo"]["mpo"]["n"] == 4
    assert top["mpo_minus_ppo"]["diff"] == pytest.approx(0.05) and bottom["mpo_minus_ppo"]["diff"] == pytest.approx(
        -0.05
    )
    table = ladder_table(entries)
    assert "| reference x0.5 | 0.25 / 0.25 |" in table and "MPO − PPO" in table
    lengths = turn_length_gains(rows, ["multi_hop"])
    assert math.isnan(lengths[0]["mpo_minus_ppo"]["diff"])  # no learned-critic MPO arm in these rows


def test_the_final_evaluation_reads_its_own_number_of_distinct_tasks():
    """Budget.final_eval_tasks: the evaluation after the last update plays that many distinct
    held-out tasks; the others keep eval_tasks; unset, a configuration's hash is what it was."""
    import dataclasses

    from mpo_lab.reproduce.presets import QUICK
    from mpo_lab.reproduce.run import run_one

    assert QUICK.config_hash() == "de862aa5fd65"
    config = dataclasses.replace(QUICK, budget=dataclasses.replace(QUICK.budget, final_eval_tasks=8))
    assert config.config_hash() != QUICK.config_hash()
    evals = run_one(config, "grpo", 0)["evals"]
    assert [e["tasks"] for e in evals] == [4.0, 4.0, 8.0]


def test_the_first_screen_reads_each_gain_off_its_interval(tmp_path):
    """when_section: per task (turn length, share, critic) and along the ladder, MPO's paired
    gains in words -- ahead or behind only where the 95% interval excludes 0; plot_when draws
    a figure of them."""
    from mpo_lab.reproduce.figures import plot_when
    from mpo_lab.reproduce.when import ladder_gains, task_gains, when_section

    rows = []
    for seed in range(6):
        jitter = 0.002 * (seed % 3)
        for task, p, think, gain in (("search", "", 0, 0.0), ("search@think16", "think16_", 16, 0.08)):
            for method, extra in (("grpo", 0.0), ("ppo", 0.02), ("mpo", 0.02 + gain)):
                noise = 0.03 * (-1) ** seed if (task, method) == ("search", "mpo") else jitter
                rows.append(
                    {
                        "arm": f"{p}{method}",
                        "task": task,
                        "seed": seed,
                        "think_tokens": think,
                        "final_success": 0.4 + extra + noise,
                        "final_explained_variance": math.nan if method == "grpo" else 0.3,
                    }
                )
    shares = {"search": 0.7, "search@think16": 0.9}
    text = "\n".join(when_section(rows, ["search", "search@think16"], "search", shares=shares, figure="img/when.png"))
    assert text.startswith("## When does MPO help?")
    assert "| Search (think16) | 16 | 0.90 | 0.30 / 0.30 | MPO ahead of PPO by 0.080" in text
    assert "| Search | 0 | 0.70 | 0.30 / 0.30 | no difference shown between MPO and PPO" in text
    assert "![When does MPO help?](img/when.png)" in text and "critic-quality ladder" not in text  # no ladder ran
    withheld = "\n".join(
        when_section(
            rows, ["search", "search@think16"], "search", withheld={"search": "the task fails the premise gate"}
        )
    )
    assert (
        "| Search (no reading: the task fails the premise gate) | 0 | — | 0.30 / 0.30 | -0.002 [-0.037, +0.033] |"
        in withheld
    )
    assert "exploratory (none of the plan's confirmatory comparisons)" in text and "Holm" not in text
    # A gain that is also a confirmatory comparison carries its Holm verdict beside the uncorrected words.
    holm = "\n".join(
        when_section(
            rows, ["search", "search@think16"], "search", holm={("think16_mpo", "think16_ppo"): "inconclusive"}
        )
    )
    assert "MPO ahead of PPO by 0.080" in holm and "(uncorrected; Holm: inconclusive) |" in holm
    assert holm.count("Holm: ") == 1 and "its Holm-corrected verdict follows it" in holm
    path = plot_when(
        task_gains(rows, ["search", "search@think16"], shares), ladder_gains(rows, "search"), tmp_path / "w.png"
    )
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_gigpo_anchors_on_the_environments_state_and_the_hash_records_it():
    """FrozenLake's observation is its state; Search's and MultiHop's state is the history, which
    the prefix anchor hashes. An arm's identity records GiGPO's options, so two anchors are two
    configurations (no committed configuration has a GiGPO arm: their hashes stay)."""
    from mpo_lab.reproduce.config import gigpo_arm

    assert gigpo_arm("frozen_lake").estimator.options["anchor"] == "observation"
    assert gigpo_arm("search@think16").estimator.options["anchor"] == "prefix"
    assert gigpo_arm("multi_hop").identity()["options"]["anchor"] == "prefix"


def test_the_gates_command_trains_on_as_many_seeds_as_asked(tmp_path, capsys):
    """``--train-seeds N``: a pilot sized beyond its configuration's seeds trains every arm on
    the first seed and the N-1 after it, and the learning gate reads all of them."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    from mpo_lab.reproduce.gates import main

    out = tmp_path / "out"
    argv = ["--config", "quick", "--only", "search", "--arms", "grpo,ppo,mpo", "--train", str(out)]
    assert main([*argv, "--train-seeds", "2", "--seeds", "1", "--tasks", "4", "--group", "4"]) == 0
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted((r["arm"], r["seed"]) for r in rows) == [(a, s) for a in ("grpo", "mpo", "ppo") for s in (0, 1)]
    out = capsys.readouterr()
    assert "| search | learning |" in out.out
    # Its comparisons are withheld (its gates were measured after training): numbers, no reading.
    withheld = [line for line in out.err.splitlines() if "no verdict (" in line]
    assert withheld and not any("no difference shown" in line or "ahead" in line for line in withheld)
    with pytest.raises(Exception, match="seed"):
        main([*argv, "--train-seeds", "0"])


def test_a_candidate_sets_the_model_size_and_refuses_a_malformed_one():
    """``model="WIDTHxLAYERSxHEADS"`` sizes the candidate's policy and critic (and so its base
    policies' cache key); a malformed size or a width that the heads do not divide is refused."""
    from mpo_lab.reproduce.base import base_key
    from mpo_lab.reproduce.config import ModelSpec
    from mpo_lab.reproduce.gates import candidate
    from mpo_lab.reproduce.presets import PILOT
    from mpo_rs.exceptions import InvalidOptionError

    wide = candidate(PILOT, ["search"], {}, model="128x2x4")
    assert wide.model == ModelSpec(width=128, layers=2, heads=4)
    assert candidate(PILOT, ["search"], {}).model == PILOT.model
    assert base_key(wide, "search", 1001) != base_key(candidate(PILOT, ["search"], {}), "search", 1001)
    for bad in ("128x2", "128x0x4", "wide", "130x2x4"):
        with pytest.raises(InvalidOptionError, match="model"):
            candidate(PILOT, ["search"], {}, model=bad)
