"""MPO in any trainer that holds a batch as padded tensors (slime, NeMo-RL, prime-rl, your own).

What a trainer has in hand after a rollout: ``(B, L)`` response tensors, one trajectory per
row, with an action mask that is 1 on the policy's tokens and 0 on tool / observation
tokens and padding (each run of ones is one turn), and a score per trajectory (or
per-token rewards). Two calls replace the trainer's advantage estimator and policy loss;
``tests/test_integration_any_trainer.py`` runs this file.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import mpo_rs.torch as mt
from mpo_rs import Estimator
from mpo_rs.torch.losses import policy_loss

MAE = Estimator("mae", lam=0.8, lam_intra=0.95, beta=1.0)


def mpo_advantages(action_mask: Tensor, scores: Tensor, group_ids: Any, values: Tensor | None = None) -> Tensor:
    """Per-token advantages: MAE with the critic's ``values`` when there is a critic, else
    the critic-free MAE with the group baseline (GRPO-normalised)."""
    if values is not None:
        advantages, _returns = mt.mae_advantages(values, action_mask, scores=scores, estimator=MAE)
        return advantages  # _returns: the critic's targets, for mt.value_loss
    return mt.mae_group_advantages(action_mask, group_ids, scores=scores, baseline="grpo", estimator=MAE)


def mpo_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, action_mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate with MPO's turn ratio (turns from the mask rows)."""
    return policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        action_mask,
        ratio="turn",
        turn_ratio="product",
        clip_low=0.2,
        clip_high=0.28,
    )


if __name__ == "__main__":
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 1, 1]])
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages = mpo_advantages(mask, scores, group_ids=[0, 0, 1, 1])
    old = -torch.rand(mask.shape)
    log_prob = (old + 0.1 * torch.randn(mask.shape)).requires_grad_()
    loss, metrics = mpo_loss(log_prob, old, advantages, mask)
    loss.backward()
    print(advantages, loss.item(), {k: round(float(v), 4) for k, v in metrics.items()})
