"""The plug-in's names, its errors and the options it reads from verl's config."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ...exceptions import InvalidConfigError, MissingCriticValuesError
from ...options import default

__all__ = [
    "CRITIC_ESTIMATORS",
    "CRITIC_FREE_ESTIMATORS",
    "ESTIMATORS",
    "LOSS_MODES",
    "SESSION_GROUPED_ESTIMATORS",
    "InvalidConfigError",
    "MPOOptions",
    "MissingCriticValuesError",
    "config_get",
    "discount",
]

CRITIC_ESTIMATORS = ("mpo_gae", "mpo_mae")
CRITIC_FREE_ESTIMATORS = ("mpo_grpo", "mpo_rloo", "mpo_mae_grpo", "mpo_mae_rloo")
ESTIMATORS = CRITIC_ESTIMATORS + CRITIC_FREE_ESTIMATORS
LOSS_MODES = ("mpo", "mpo_geo_mean")

# Plug-in estimator -> the verl estimator whose multi-output session grouping it gets in the
# v1 trainer. verl 0.9.1's compute_advantage_for_multi_trajectories groups `{uid}_{session}`
# outputs only for "grpo": it scores each session by its final output and gives that row's
# advantage to every output of the session, which is right only for one advantage per row.
SESSION_GROUPED_ESTIMATORS = {"mpo_grpo": "grpo"}


@dataclass(frozen=True)
class MPOOptions:
    """Options read from ``algorithm.mpo`` (all optional). ``algorithm.gamma`` is the
    discount of every estimator; ``algorithm.lam`` is ``mpo_gae``'s token lambda, as for
    verl's ``gae``. Defaults are those of the Rust options table (``mpo_rs.Estimator``);
    ranges are checked by the estimator that uses an option (an out-of-range value raises
    ``mpo_rs.InvalidOptionError`` naming it)."""

    lam: float = default("mae", "lam")
    """MAE: turn-scale lambda (credit decays once per interaction)."""
    lam_intra: float = default("mae", "lam_intra")
    """MAE: token lambda inside a turn."""
    beta: float = default("mae", "beta")
    """MAE: weight of the centred intra-turn refinement (0 = one advantage per turn)."""
    lam_critic: float = default("mae", "lam_critic")
    """MAE: lambda of the critic's value targets (1 = discounted Monte-Carlo return)."""
    eps: float = default("grpo", "eps")
    """Group estimators: added to the group std before dividing."""
    whiten: bool | None = None
    """Whiten advantages over the batch's LLM tokens (verl's ``masked_whiten`` formula).
    None = the estimator's default: on for ``mpo_gae`` (as verl's ``gae``), off otherwise."""

    @classmethod
    def from_config(cls, config: Any) -> MPOOptions:
        section = config_get(config, "mpo", None)
        if section is None:
            return cls()
        try:
            given = dict(section.items())
        except AttributeError:
            raise InvalidConfigError(
                f"`algorithm.mpo` must be a mapping of options, got {type(section).__name__}"
            ) from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise InvalidConfigError(
                f"unknown `algorithm.mpo` option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
            )
        options = cls(**given)
        for name in (f.name for f in fields(cls) if f.type == "float"):
            value = getattr(options, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidConfigError(f"`algorithm.mpo.{name}` must be a number, got {value!r}")
        if options.whiten is not None and not isinstance(options.whiten, bool):
            raise InvalidConfigError(f"`algorithm.mpo.whiten` must be true, false or null, got {options.whiten!r}")
        return options


def config_get(config: Any, key: str, default: Any) -> Any:
    """``config[key]`` for an OmegaConf DictConfig, a verl dataclass config or a dict."""
    if config is None:
        return default
    get = getattr(config, "get", None)
    if callable(get):
        return get(key, default)
    return getattr(config, key, default)


def discount(config: Any) -> float:
    """``algorithm.gamma`` (1.0 when absent)."""
    return float(config_get(config, "gamma", 1.0))
