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


def main() -> int:
    """Advantages and the policy loss on one small OpenRLHF ``Experience`` batch: two prompts,
    two samples each, rows of two turns (action_mask runs) with tool tokens between them."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    mask = torch.tensor(
        [[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 1, 1]], dtype=torch.bool
    )
    torch.manual_seed(0)
    experience = Experience(
        action_mask=mask,
        values=torch.randn(mask.shape),
        kl=torch.zeros(mask.shape),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        index=[0, 1, 2, 3],
        info={},
    )
    maker = experience_maker(mpo_estimator=Estimator("mae", lam=0.8, lam_intra=0.95))
    (experience,) = maker.compute_advantages_and_returns([experience])
    print("advantages (OpenRLHF's compute_advantages_and_returns through the MPO mixin):")
    print(experience.advantages)
    old = -torch.rand(mask.shape)
    log_probs = (old + 0.1 * torch.randn(mask.shape)).requires_grad_()
    loss_fn = MPOPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, turn_ratio="product")
    loss = loss_fn(log_probs, old, experience.advantages, action_mask=mask)[0]
    loss.backward()
    print(
        f"MPOPolicyLoss: {loss.item():.4f}; gradient on {int((log_probs.grad != 0).sum())} of {int(mask.sum())} action tokens"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
