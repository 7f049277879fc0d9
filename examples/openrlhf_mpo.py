"""MPO in OpenRLHF (openrlhf 0.11.2): the experience maker and the policy loss.

In an OpenRLHF run, two lines change (docs/integrations.md, "OpenRLHF"):

* the trainer's experience maker: ``self.experience_maker = mpo_experience_maker()(...,
  mpo_estimator=Estimator("mae", ...), mpo_baseline=None)`` with the arguments OpenRLHF's
  ``PPOTrainer`` passes to ``RemoteExperienceMaker`` (``openrlhf/trainer/ppo_trainer.py``);
  ``mpo_baseline="grpo"`` when the run has no critic;
* the actor's loss: ``self.policy_loss_fn = MPOPolicyLoss(clip_eps_low, clip_eps_high,
  dual_clip, token_level_loss, turn_ratio="product")`` in place of ``PolicyLoss(...)``.

:func:`experience_maker` below builds the maker on a host that carries what the mixin reads
from OpenRLHF's ``RemoteExperienceMaker`` (``strategy.args``, ``kl_ctl``), so the recipe runs
on a CPU without Ray, vLLM or DeepSpeed; ``tests/test_integration_openrlhf.py`` runs it on
OpenRLHF's ``Experience`` batches.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from mpo_rs import Estimator
from mpo_rs.integrations.openrlhf import MPOExperienceMixin, MPOPolicyLoss, mpo_experience_maker

__all__ = ["MPOPolicyLoss", "experience_maker", "mpo_experience_maker"]


class _Host:
    """What ``RemoteExperienceMaker.__init__`` sets and the mixin reads."""

    def __init__(self, strategy: Any, kl_controller: Any, **kwargs: Any) -> None:
        self.strategy = strategy
        self.kl_ctl = kl_controller


def experience_maker(
    mpo_estimator: str | Estimator = "mae",
    mpo_baseline: str | Estimator | None = None,
    kl_coef: float = 0.05,
    n_samples_per_prompt: int = 2,
) -> Any:
    """An MPO experience maker with OpenRLHF's settings as its ``strategy.args`` holds them."""
    args = SimpleNamespace(
        rollout=SimpleNamespace(n_samples_per_prompt=n_samples_per_prompt),
        reward=SimpleNamespace(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator="mpo", gamma=1.0, lambd=1.0)),
    )
    maker_class = mpo_experience_maker(_Host)  # in OpenRLHF: mpo_experience_maker() (RemoteExperienceMaker)
    maker: MPOExperienceMixin = maker_class(
        strategy=SimpleNamespace(args=args),
        kl_controller=SimpleNamespace(value=kl_coef),
        mpo_estimator=mpo_estimator,
        mpo_baseline=mpo_baseline,
    )
    return maker
