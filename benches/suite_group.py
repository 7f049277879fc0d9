"""Group suite: critic-free outcome advantages (GRPO, RLOO) on the GAE suite's batch.

Token level — what a trainer consumes: mpo_rs `group_advantages` + `broadcast_to_tokens`
(flat tokens) against verl 0.9.1's GRPO and RLOO estimators, the loop versions and the
vectorized ones (padded (B, L) token rewards and response mask, a per-trajectory group id
array). Per trajectory: mpo_rs `group_advantages` against stateset-rl-core
`compute_group_advantages` ((groups, group size) float64 scores). verl's vectorized RLOO is
the code of verl PR #3555 (130 ms -> 6 ms); beside it, a plain torch RLOO written here from
that PR's idea (group sizes and sums by scatter-add, (G·r − S)/(G − 1)), given the scores
and integer group ids directly, per trajectory and broadcast over the padded response mask.

Shared semantics checked before timing: GRPO = (score − group mean) / (unbiased std + ε),
ε = 1e-6 on both sides; RLOO = score − mean of the other members. The batch has groups of
8 and no group of one (verl gives a singleton score/(1+ε) for GRPO and its score for RLOO,
mpo_rs gives 0). stateset-rl-core divides by the population std (plus its own tiny ε), so
its output is compared with mpo_rs's scaled by sqrt(n/(n−1)); without std division
(Dr. GRPO) the two are compared as they are.

    python benches/suite_group.py [--quick] [--json PATH]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import mpo_rs

EPS = 1e-6
MPO_GRPO = "mpo_rs GRPO: group_advantages + broadcast_to_tokens"
MPO_RLOO = "mpo_rs RLOO: group_advantages(leave_one_out) + broadcast_to_tokens"
MPO_GRPO_TRAJ = "mpo_rs GRPO per trajectory: group_advantages"
MPO_RLOO_TRAJ = "mpo_rs RLOO per trajectory: group_advantages(leave_one_out)"
TORCH_RLOO = "torch RLOO from verl #3555's idea (group sums by scatter-add) × response mask"
TORCH_RLOO_TRAJ = "torch RLOO per trajectory from verl #3555's idea (group sums by scatter-add)"
FLAT = "per-trajectory scores + group ids; flat mask + offsets"


def mpo_tokens(b: common.FlatBatch, leave_one_out: bool) -> np.ndarray:
    # RLOO divides by no std, so mpo_rs refuses an eps for it.
    adv = (
        mpo_rs.group_advantages(b.scores, b.group_ids, leave_one_out=True)
        if leave_one_out
        else mpo_rs.group_advantages(b.scores, b.group_ids, eps=EPS)
    )
    return mpo_rs.broadcast_to_tokens(adv, b.mask, b.offsets)


def verl_cases(b: common.FlatBatch) -> tuple[list[common.Case], list[dict[str, Any]]]:
    core_algos = common.import_peer("verl.trainer.ppo.core_algos")
    torch = common.import_peer("torch")
    _, rewards_np, mask_np = b.padded()
    rewards, mask = torch.from_numpy(rewards_np), torch.from_numpy(mask_np)
    rows, cols = b.padded_index()
    layout = "padded (B, L) token rewards + response mask, torch float32; group id per row"
    estimators: list[tuple[str, Callable[..., Any], str]] = [
        ("verl 0.9.1 compute_grpo_outcome_advantage", core_algos.compute_grpo_outcome_advantage, MPO_GRPO),
        (
            "verl 0.9.1 compute_grpo_vectorized_outcome_advantage",
            core_algos.compute_grpo_vectorized_outcome_advantage,
            MPO_GRPO,
        ),
        ("verl 0.9.1 compute_rloo_outcome_advantage", core_algos.compute_rloo_outcome_advantage, MPO_RLOO),
        (
            "verl 0.9.1 compute_rloo_vectorized_outcome_advantage",
            core_algos.compute_rloo_vectorized_outcome_advantage,
            MPO_RLOO,
        ),
    ]
    cases, checks = [], []
    for name, estimator, baseline in estimators:
        call = lambda estimator=estimator: estimator(rewards, mask, b.group_ids, epsilon=EPS)  # noqa: E731
        adv, _ = call()
        ours = mpo_tokens(b, leave_one_out=baseline == MPO_RLOO)
        checks.append(
            common.assert_close(
                name, "advantages on every token (0 on observations and padding)", adv.numpy()[rows, cols], ours
            )
        )
        cases.append(common.Case(name, call, layout, baseline))
    return cases, checks


def torch_rloo(torch: Any, scores: Any, group_ids: Any, n_groups: int) -> Any:
    """Idea of verl-project/verl PR #3555 (verl/trainer/ppo/core_algos.py,
    `compute_rloo_vectorized_outcome_advantage`, "130 ms -> 6 ms"): no loop over groups;
    with each group's size G and sum S from one scatter-add each, RLOO is
    r_i − (S − r_i)/(G − 1) = (G·r_i − S)/(G − 1), and 0 in a group of one."""
    ones = torch.ones_like(scores)
    size = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, group_ids, ones)[group_ids]
    total = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, group_ids, scores)[group_ids]
    return torch.where(size > 1, (size * scores - total) / (size - 1).clamp_min(1), 0)


def torch_rloo_cases(b: common.FlatBatch) -> tuple[list[common.Case], list[dict[str, Any]]]:
    """The #3555 idea in plain torch, given per-trajectory scores (not token rewards to sum)
    and integer group ids (no np.unique): per trajectory, and broadcast over the padded
    response mask as a trainer consumes it."""
    torch = common.import_peer("torch")
    scores, group_ids = torch.from_numpy(b.scores), torch.from_numpy(b.group_ids)
    n_groups = int(b.group_ids.max()) + 1
    mask = torch.from_numpy(b.padded()[2])
    rows, cols = b.padded_index()
    per_traj = lambda: torch_rloo(torch, scores, group_ids, n_groups)  # noqa: E731
    tokens = lambda: torch_rloo(torch, scores, group_ids, n_groups).unsqueeze(-1) * mask  # noqa: E731
    checks = [
        common.assert_close(
            TORCH_RLOO_TRAJ,
            "RLOO per trajectory",
            per_traj().numpy(),
            mpo_rs.group_advantages(b.scores, b.group_ids, leave_one_out=True),
        ),
        common.assert_close(
            TORCH_RLOO,
            "RLOO on every token (0 on observations and padding)",
            tokens().numpy()[rows, cols],
            mpo_tokens(b, leave_one_out=True),
        ),
    ]
    return [
        common.Case(
            TORCH_RLOO, tokens, "per-trajectory scores + group ids, torch; padded (B, L) response mask", MPO_RLOO
        ),
        common.Case(TORCH_RLOO_TRAJ, per_traj, "per-trajectory scores + group ids, torch", MPO_RLOO_TRAJ),
    ], checks


def stateset_cases(b: common.FlatBatch) -> tuple[list[common.Case], list[dict[str, Any]]]:
    stateset = common.import_peer("stateset_rl_core")
    group_size = b.describe()["group_size"]
    grid = b.scores.astype(np.float64).reshape(-1, group_size)  # groups are consecutive rows
    n = group_size
    checks = [
        common.assert_close(
            "stateset-rl-core compute_group_advantages",
            "GRPO per trajectory; stateset divides by the population std, so mpo_rs's is scaled by sqrt(n/(n−1))",
            stateset.compute_group_advantages(grid, "mean", True),
            mpo_rs.group_advantages(b.scores, b.group_ids, eps=EPS) * np.sqrt(n / (n - 1)),
        ),
        common.assert_close(
            "stateset-rl-core compute_group_advantages",
            "Dr. GRPO per trajectory (mean baseline, no std division), as is",
            stateset.compute_group_advantages(grid, "mean", False),
            mpo_rs.group_advantages(b.scores, b.group_ids, norm_std=False),
        ),
    ]
    call = lambda: stateset.compute_group_advantages(grid, "mean", True)  # noqa: E731
    return [
        common.Case(
            "stateset-rl-core compute_group_advantages", call, "(groups, group size) float64 scores", MPO_GRPO_TRAJ
        )
    ], checks


def run(quick: bool) -> dict[str, Any]:
    n_traj, repeats = (200, 5) if quick else (1000, 15)
    b = common.make_batch(n_traj)
    assert np.bincount(b.group_ids).min() > 1, "singleton groups are defined differently by verl"
    cases = [
        common.Case(MPO_GRPO, lambda: mpo_tokens(b, False), FLAT),
        common.Case(MPO_RLOO, lambda: mpo_tokens(b, True), FLAT),
        common.Case(
            MPO_GRPO_TRAJ,
            lambda: mpo_rs.group_advantages(b.scores, b.group_ids, eps=EPS),
            "per-trajectory scores + group ids",
        ),
        common.Case(
            MPO_RLOO_TRAJ,
            lambda: mpo_rs.group_advantages(b.scores, b.group_ids, leave_one_out=True),
            "per-trajectory scores + group ids",
        ),
    ]
    checks, skipped = [], []
    common.log(f"group: {b.n_trajectories} trajectories in groups of {b.describe()['group_size']}; checking peers")
    for name, build in (
        ("verl 0.9.1 GRPO / RLOO", verl_cases),
        ("stateset-rl-core compute_group_advantages", stateset_cases),
        (TORCH_RLOO, torch_rloo_cases),
    ):
        prepared = common.try_peer(name, lambda build=build: build(b), skipped)
        if prepared is not None:
            cases += prepared[0]
            checks += prepared[1]
    common.log("group: timing")
    rows = common.time_cases(cases, repeats, seconds_per_case=3 if quick else 10)
    return {
        "suite": "group",
        "title": "Group baselines (GRPO, RLOO) against the peers",
        "batch": b.describe(),
        "params": {"eps": EPS},
        "repeats": repeats,
        "rows": rows,
        "checks": checks,
        "skipped": skipped,
        "versions": common.versions("verl", "torch", "stateset-rl-core", "numpy"),
    }


if __name__ == "__main__":
    common.suite_main(run, __doc__)
