"""The recipe for any trainer with padded tensors (examples/any_trainer_mpo.py, the "Any
other trainer" section of docs/integrations.md): its advantages equal mpo_rs's numpy
estimators on the same batch, and its loss is the turn-ratio policy loss."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mpo_rs  # noqa: E402
import mpo_rs.torch as mt  # noqa: E402
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import any_trainer_mpo as recipe  # noqa: E402

MASK = torch.tensor(
    [[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 1, 0, 0]]
)
SCORES = torch.tensor([1.0, 0.0, 0.25, 1.0, 0.5])
GROUPS = ["a", "a", "b", "b", "b"]


def _flat(mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = mask.shape
    return mask.numpy().astype(np.uint8).reshape(-1), np.arange(rows + 1, dtype=np.int64) * cols


def test_any_trainer_critic_advantages_equal_mpo_rs() -> None:
    values = torch.randn(MASK.shape, generator=torch.Generator().manual_seed(0))
    got = recipe.mpo_advantages(MASK, SCORES, GROUPS, values=values)
    mask, offsets = _flat(MASK)
    direct = mpo_rs.mae_advantages(
        values.numpy().reshape(-1), mask, offsets, scores=SCORES.numpy(), estimator=recipe.MAE
    )
    np.testing.assert_array_equal(got.numpy().reshape(-1), direct.advantages)


def test_any_trainer_critic_free_advantages_equal_mpo_rs() -> None:
    got = recipe.mpo_advantages(MASK, SCORES, GROUPS)
    mask, offsets = _flat(MASK)
    rows, cols = MASK.shape
    codes = np.array([0, 0, 1, 1, 1])
    s = SCORES.numpy()
    expected = np.zeros(rows * cols, dtype=np.float32)
    for g in (0, 1):
        members = np.flatnonzero(codes == g)
        mean = np.float32(s[members].astype(np.float64).mean())
        scale = np.float32(1.0 / (s[members].astype(np.float64).std(ddof=1) + 1e-6))
        values = np.full(rows * cols, 0.0, dtype=np.float32).reshape(rows, cols)
        values[:] = mean
        r = mpo_rs.mae_advantages(values.reshape(-1), mask, offsets, scores=s, estimator=recipe.MAE)
        for j in members:
            expected[j * cols : (j + 1) * cols] = r.advantages[j * cols : (j + 1) * cols] * scale
    np.testing.assert_allclose(got.numpy().reshape(-1), expected, rtol=1e-6, atol=1e-7)


def test_critic_free_mae_at_lam_1_beta_0_is_group_advantages() -> None:
    for baseline in ("grpo", "drgrpo", "rloo"):
        got = mt.mae_group_advantages(
            MASK, GROUPS, scores=SCORES, baseline=baseline, estimator=Estimator("mae", lam=1.0, beta=0.0)
        )
        per_row = mt.group_advantages(None, MASK, GROUPS, scores=SCORES, estimator=baseline)
        np.testing.assert_allclose(got.numpy(), per_row.numpy(), rtol=1e-6, atol=1e-7)


def test_critic_free_mae_token_rewards_score_the_row_and_refusals_name_the_argument() -> None:
    rewards = torch.zeros(MASK.shape)
    rewards[:, 4] = SCORES  # column 4 is a policy token of every row
    by_tokens = mt.mae_group_advantages(MASK, GROUPS, rewards)
    assert by_tokens.shape == MASK.shape
    assert torch.all(by_tokens[MASK == 0] == 0)
    with pytest.raises(InvalidOptionError, match="group estimator"):
        mt.mae_group_advantages(MASK, GROUPS, scores=SCORES, baseline="mae")
    with pytest.raises(InvalidOptionError, match="MAE estimator"):
        mt.mae_group_advantages(MASK, GROUPS, scores=SCORES, estimator="gae")
    with pytest.raises(InvalidBatchError, match="exactly one"):
        mt.mae_group_advantages(MASK, GROUPS)
    with pytest.raises(InvalidBatchError, match="one per row"):
        mt.mae_group_advantages(MASK, GROUPS[:3], scores=SCORES)


def test_any_trainer_loss_is_the_turn_ratio_policy_loss() -> None:
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(MASK.shape, generator=g)
    log_prob = (old + 0.2 * torch.randn(MASK.shape, generator=g)).requires_grad_()
    advantages = recipe.mpo_advantages(MASK, SCORES, GROUPS)
    loss, metrics = recipe.mpo_loss(log_prob, old, advantages, MASK)
    direct, _ = mt.policy_loss(log_prob, old, advantages, MASK, ratio="turn", clip_low=0.2, clip_high=0.28)
    assert torch.equal(loss, direct)
    assert int(metrics["num_turns"]) == 10  # two turns per row
