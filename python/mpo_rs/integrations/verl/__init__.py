"""verl plug-in: the Rust estimators and the turn-ratio MPO loss in verl's registries.

Importing this module (verl does, in every process, through the ``verl.plugins`` entry
point that ``mpo-rs`` declares) registers

advantage estimators (``algorithm.adv_estimator=...``), all on verl's padded ``(B, L)``
tensors, one trajectory per row, ``response_mask`` 1 on LLM tokens and 0 on tool /
observation tokens and padding:

===================  =========  ==========================================================
name                 critic     what
===================  =========  ==========================================================
``mpo_gae``          yes        token GAE equal to verl's ``gae`` (whitened like it unless
                                ``algorithm.mpo.whiten=false``), computed in Rust
``mpo_mae``          yes        multiscale advantage estimation (the MPO estimator)
``mpo_grpo``         no         GRPO / Dr. GRPO (``algorithm.norm_adv_by_std_in_grpo``)
``mpo_rloo``         no         RLOO (leave-one-out mean)
``mpo_mae_grpo``     no         MAE with the group mean as a constant value baseline,
                                scaled by 1/(group std + eps) like GRPO
``mpo_mae_rloo``     no         MAE with the leave-one-out mean as the value baseline
``mpo_bilevel_gae``  yes        RAGEN's bi-level GAE (``algorithm.high_level_gamma``),
                                whitened like RAGEN unless ``algorithm.mpo.whiten=false``
``mpo_gigpo``        no         GiGPO (verl-agent's ``gigpo``): episode and anchor-state
                                step baselines; anchors from ``anchor_obs`` or the rows'
                                token ids
===================  =========  ==========================================================

and policy-loss modes (``actor_rollout_ref.actor.policy_loss.loss_mode=...``) ``mpo``
(turn ratio = product of the turn's token ratios) and ``mpo_geo_mean`` (its geometric
mean), reduced through verl's ``agg_loss`` with the actor's ``loss_agg_mode``, clip
ratios and dual-clip constant.

verl calls registered estimators without ``values``. The critic estimators get them
through a wrapper around verl's ``compute_advantage`` (:func:`install_values_hook`),
installed on import unless ``MPO_RS_VERL_VALUES_HOOK=0``; the critic itself runs only with
``critic.enable=True``. The same hook makes verl's v1 trainer group multi-output sessions
for ``mpo_grpo`` as it does for ``grpo`` (:data:`SESSION_GROUPED_ESTIMATORS`). Estimator
options beyond ``algorithm.gamma`` / ``algorithm.lam`` live under ``algorithm.mpo`` (see
:class:`MPOOptions`); :func:`estimator_options` builds each estimator's ``mpo_rs.Estimator``
from them, the Rust options table judging every value. ``algorithm.mpo.rollout_log_dir=DIR``
(or ``MPO_RS_VERL_ROLLOUT_LOG_DIR``) appends every training batch to a Parquet rollout log
through the same hook (:mod:`.rollout_log`). Details: ``docs/integrations.md``.

The package's rooms: ``config`` (names, errors, :class:`MPOOptions`, :func:`estimator_options`), ``estimators``
(through :mod:`mpo_rs.torch`'s padded-tensor API), ``loss`` (the clipped surrogate of
:mod:`mpo_rs.torch.losses` with the turn ratio), ``values_hook``, ``rollout_log``; this module registers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..._deps import needs

with needs("mpo_rs.integrations.verl", "verl"):
    import torch  # noqa: F401
    from torch import Tensor
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional  # noqa: F401  (the loss's metrics)

from . import estimators
from .config import (
    CRITIC_ESTIMATORS,
    CRITIC_FREE_ESTIMATORS,
    ESTIMATORS,
    LOSS_MODES,
    SESSION_GROUPED_ESTIMATORS,
    EstimatorOptions,
    InvalidConfigError,
    MissingCriticValuesError,
    MPOOptions,
    estimator_options,
)

# The estimator functions, re-exported (`X as X`); `__all__` takes their names from the module's.
from .estimators import compute_gae_advantage_return as compute_gae_advantage_return
from .estimators import compute_mpo_bilevel_gae_advantage as compute_mpo_bilevel_gae_advantage
from .estimators import compute_mpo_gae_advantage as compute_mpo_gae_advantage
from .estimators import compute_mpo_gigpo_advantage as compute_mpo_gigpo_advantage
from .estimators import compute_mpo_grpo_advantage as compute_mpo_grpo_advantage
from .estimators import compute_mpo_mae_advantage as compute_mpo_mae_advantage
from .estimators import compute_mpo_mae_grpo_advantage as compute_mpo_mae_grpo_advantage
from .estimators import compute_mpo_mae_rloo_advantage as compute_mpo_mae_rloo_advantage
from .estimators import compute_mpo_rloo_advantage as compute_mpo_rloo_advantage
from .loss import compute_policy_loss_mpo, compute_policy_loss_mpo_geo_mean
from .rollout_log import ROLLOUT_LOG_ENV, log_batch
from .values_hook import VALUES_HOOK_ENV, install_values_hook

__all__ = [
    "CRITIC_ESTIMATORS",
    "CRITIC_FREE_ESTIMATORS",
    "ESTIMATORS",
    "LOSS_MODES",
    "ROLLOUT_LOG_ENV",
    "SESSION_GROUPED_ESTIMATORS",
    "VALUES_HOOK_ENV",
    "EstimatorOptions",
    "InvalidConfigError",
    "MPOOptions",
    "MissingCriticValuesError",
    "compute_policy_loss_mpo",
    "compute_policy_loss_mpo_geo_mean",
    "estimator_options",
    "install_values_hook",
    "log_batch",
    "register",
]
__all__ += [name for name in estimators.__all__ if name.startswith("compute_")]


_ESTIMATOR_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "mpo_gae": compute_mpo_gae_advantage,
    "mpo_mae": compute_mpo_mae_advantage,
    "mpo_grpo": compute_mpo_grpo_advantage,
    "mpo_rloo": compute_mpo_rloo_advantage,
    "mpo_mae_grpo": compute_mpo_mae_grpo_advantage,
    "mpo_mae_rloo": compute_mpo_mae_rloo_advantage,
    "mpo_bilevel_gae": compute_mpo_bilevel_gae_advantage,
    "mpo_gigpo": compute_mpo_gigpo_advantage,
}
_LOSS_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, dict[str, Any]]]] = {
    "mpo": compute_policy_loss_mpo,
    "mpo_geo_mean": compute_policy_loss_mpo_geo_mean,
}


def _is_ours(fn: Any) -> bool:
    # By module name, so that a reload of the plug-in replaces its own earlier functions.
    module = getattr(fn, "__module__", None) or ""
    return module == __name__ or module.startswith(__name__ + ".")


def _claim(registry: dict[str, Any], name: str, kind: str) -> None:
    existing = registry.get(name)
    if existing is not None and not _is_ours(existing):
        raise RuntimeError(
            f"verl already has a {kind} named {name!r} "
            f"({getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}); "
            "mpo_rs does not replace it"
        )
    registry.pop(name, None)  # verl's register_adv_est refuses to re-register a name


def register() -> None:
    """Registers the estimators and loss modes in verl's registries (idempotent)."""
    for name, fn in _ESTIMATOR_FUNCTIONS.items():
        _claim(core_algos.ADV_ESTIMATOR_REGISTRY, name, "advantage estimator")
        core_algos.register_adv_est(name)(fn)
    for name, loss in _LOSS_FUNCTIONS.items():
        _claim(core_algos.POLICY_LOSS_REGISTRY, name, "policy loss")
        core_algos.register_policy_loss(name)(loss)


register()
if os.environ.get(VALUES_HOOK_ENV, "1").strip() != "0":
    install_values_hook()
