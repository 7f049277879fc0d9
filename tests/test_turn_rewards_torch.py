"""Per-turn rewards, truncation and a reward on a trailing observation token through the
padded ``(B, L)`` API (``mpo_rs.torch``), against the slow reference (mpo_rs.testing.reference)."""

from __future__ import annotations

import numpy as np
import pytest

from mpo_rs.testing import reference as ref

torch = pytest.importorskip("torch")

from mpo_rs import InvalidBatchError  # noqa: E402
from mpo_rs.torch import gae_advantages, mae_advantages  # noqa: E402

# Two rows of length 6: [p p o p p pad] (2 turns) and [o p p p pad pad] (1 turn).
MASK = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
VALUES = torch.tensor([[0.1, 0.4, 9.0, -0.3, 0.8, 9.0], [9.0, 0.2, -0.6, 0.5, 9.0, 9.0]])
FLAT_MASK = MASK.reshape(-1).int().tolist()
OFFSETS = [0, 6, 12]
PARAMS = {"mae": dict(lam=0.7, lam_intra=0.9, beta=1.0, gamma=0.95), "gae": dict(lam=0.9, gamma=0.95)}
FAST = {"mae": mae_advantages, "gae": gae_advantages}
SLOW = {"mae": ref.mae, "gae": ref.gae}


def _flat_values() -> list[float]:
    return VALUES.reshape(-1).tolist()


@pytest.mark.parametrize("name", ["mae", "gae"])
def test_turn_rewards_and_truncated_rows_match_the_reference(name):
    turn_rewards = [torch.tensor([0.5, 1.0]), [-1.0]]
    truncated = torch.tensor([False, True])
    adv, ret = FAST[name](VALUES, MASK, turn_rewards=turn_rewards, truncated=truncated, **PARAMS[name])
    want = SLOW[name](
        _flat_values(),
        FLAT_MASK,
        OFFSETS,
        turn_rewards=[[0.5, 1.0], [-1.0]],
        truncated=[False, True],
        **PARAMS[name],
    )
    np.testing.assert_allclose(adv.reshape(-1).numpy(), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.reshape(-1).numpy(), want[1], rtol=1e-5, atol=1e-5)
    # The same as token rewards on each turn's last policy token, bitwise.
    tokens = torch.zeros(2, 6)
    tokens[0, 1], tokens[0, 4], tokens[1, 3] = 0.5, 1.0, -1.0
    adv2, ret2 = FAST[name](VALUES, MASK, tokens, truncated=truncated, **PARAMS[name])
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    with pytest.raises(InvalidBatchError, match="trajectory 1, which has 1 turns"):
        FAST[name](VALUES, MASK, turn_rewards=[[0.5, 1.0], [1.0, 2.0]])
    with pytest.raises(InvalidBatchError, match="give exactly one of"):
        FAST[name](VALUES, MASK, tokens, turn_rewards=turn_rewards)


@pytest.mark.parametrize("name", ["mae", "gae"])
def test_a_reward_on_a_trailing_observation_token_lands_on_the_last_policy_token_with_credit(name):
    # A score written into a padded row's last column (an observation / padding token).
    tokens = torch.zeros(2, 6)
    tokens[0, 5], tokens[1, 5] = 1.0, -0.5
    with pytest.raises(InvalidBatchError, match='observation_rewards="credit"'):
        FAST[name](VALUES, MASK, tokens, **PARAMS[name])
    for truncated in ([False, False], [True, False]):
        adv, ret = FAST[name](
            VALUES, MASK, tokens, observation_rewards="credit", truncated=torch.tensor(truncated), **PARAMS[name]
        )
        # Credited to the last policy token before it in its row: (0, 4) and (1, 3).
        landed = [0.0] * 12
        landed[4], landed[6 + 3] = 1.0, -0.5
        want = SLOW[name](_flat_values(), FLAT_MASK, OFFSETS, rewards=landed, truncated=truncated, **PARAMS[name])
        np.testing.assert_allclose(adv.reshape(-1).numpy(), want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret.reshape(-1).numpy(), want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source", ["turn_rewards", "scores"])
def test_a_bad_observation_rewards_setting_is_refused_whichever_reward_source_is_given(source):
    from mpo_rs import InvalidOptionError
    from mpo_rs.torch import mae_group_advantages

    given = {"turn_rewards": [[0.5, 1.0], [-1.0]]} if source == "turn_rewards" else {"scores": [1.0, 0.0]}
    for estimate in FAST.values():
        with pytest.raises(InvalidOptionError, match="unknown observation_rewards='credt'"):
            estimate(VALUES, MASK, observation_rewards="credt", **given)
    if source == "scores":  # the critic-free form reads no values
        with pytest.raises(InvalidOptionError, match="unknown observation_rewards='credt'"):
            mae_group_advantages(MASK, [0, 0], observation_rewards="credt", **given)
