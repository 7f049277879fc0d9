"""The torch side of mpo_rs (the ``torch`` extra).

* advantages from padded ``(B, L)`` tensors, the layout of trainers (verl, OpenRLHF, TRL,
  slime, NeMo-RL): :func:`mae_advantages`, :func:`gae_advantages`,
  :func:`bilevel_advantages`, :func:`group_advantages`, :func:`gigpo_advantages`, and :func:`whiten` (verl's ``masked_whiten``) -- from
  :mod:`mpo_rs.torch.padded`, whose ``advantages`` takes any estimator
  (:mod:`mpo_rs.torch.estimation` is the learner's estimator adapter); the critic-free MAE :func:`mae_group_advantages` (the group
  baseline as the value) -- from :mod:`mpo_rs.torch.critic_free`;
* :class:`RolloutBatch` (:mod:`mpo_rs.torch.batch`), the flat batch of the learner;
* :mod:`mpo_rs.torch.losses`: the clipped policy loss with turn / token / sequence ratios
  and the critic loss;
* :mod:`mpo_rs.torch.learner`: a PPO-style training loop, configured by
  :class:`LearnerConfig` (any estimator of the options table, a name or an
  :class:`mpo_rs.Estimator`), built from :mod:`~mpo_rs.torch.estimation` (the estimator
  adapter), :mod:`~mpo_rs.torch.model_io`, :mod:`~mpo_rs.torch.batching` and
  :mod:`~mpo_rs.torch.metrics`. ``Learner`` and ``LearnerConfig`` are imported on first use,
  so ``from mpo_rs.torch import policy_loss`` does not load the training loop.

Without torch, importing this package raises ``MissingDependencyError``. See docs/torch.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._deps import needs

# The package's one guard: importing any of its modules runs this first.
with needs("mpo_rs.torch", "torch"):
    import torch  # noqa: F401

from .batch import RolloutBatch
from .critic_free import mae_group_advantages
from .losses import policy_loss, value_loss
from .padded import (
    OBSERVATION_REWARDS,
    PaddedBatch,
    bilevel_advantages,
    gae_advantages,
    gigpo_advantages,
    group_advantages,
    mae_advantages,
    whiten,
)

__all__ = [
    "OBSERVATION_REWARDS",
    "Learner",
    "LearnerConfig",
    "PaddedBatch",
    "RolloutBatch",
    "bilevel_advantages",
    "gae_advantages",
    "gigpo_advantages",
    "group_advantages",
    "mae_advantages",
    "mae_group_advantages",
    "policy_loss",
    "value_loss",
    "whiten",
]

if TYPE_CHECKING:
    from .learner import Learner, LearnerConfig


def __getattr__(name: str) -> Any:
    # The training loop loads on first use (a trainer that only calls the losses never pays for it).
    if name in ("Learner", "LearnerConfig"):
        from . import learner

        return getattr(learner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
