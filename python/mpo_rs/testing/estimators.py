"""The estimators the kit checks a function as: what each computes, the options it is
called with, the batches it is checked on and the invariants it implies
(:mod:`mpo_rs.testing.invariants`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._deps import needs
from .strategies import Batch, batches, group_batches

with needs("mpo_rs.testing.estimators", "testing"):
    from hypothesis import strategies as st

__all__ = ["ESTIMATORS", "EstimatorSpec"]


@dataclass(frozen=True)
class EstimatorSpec:
    """What the kit knows of an estimator: its kind (``token``: per-token GAE-like,
    ``turn``: MAE-like, ``group``: a group baseline), the options it is called with, the
    batches it is checked on, its reference and the invariants it implies."""

    name: str
    kind: Literal["token", "turn", "group"]
    option_names: tuple[str, ...]
    batches: st.SearchStrategy[Batch]
    invariants: tuple[str, ...]
    section: str

    @property
    def options(self) -> st.SearchStrategy[dict[str, Any]]:
        """The options' strategy: γ and λ (λ = 1 and 0.95 often, else anywhere in [0, 1]),
        and MAE's λ_intra and β."""
        return st.fixed_dictionaries({name: _OPTION_RANGES[name] for name in self.option_names})

    def set(self, opts: Mapping[str, Any], **fixed: float) -> dict[str, Any]:
        """``opts`` with those of ``fixed`` the estimator takes."""
        return {**opts, **{k: v for k, v in fixed.items() if k in self.option_names}}


_OPTION_RANGES: dict[str, st.SearchStrategy[float]] = {
    "gamma": st.one_of(st.just(1.0), st.floats(0.5, 1.0)),
    "lam": st.one_of(st.just(1.0), st.just(0.95), st.floats(0.0, 1.0)),
    "lam_intra": st.floats(0.0, 1.0),
    "beta": st.floats(0.0, 2.0),
}
_critic = batches(4, edges=True, max_runs=5, max_run=4, turn_rewards=True)
_CRITIC = ("observation-transparency", "masked-value-independence", "padding-invariance", "permutation-equivariance")
_ENDS = ("terminal-reward", "turn-reward-placement", "thread-determinism")
_GROUP = (
    "reference",
    "group-translation",
    "observation-transparency",
    "padding-invariance",
    "permutation-equivariance",
    "thread-determinism",
)

ESTIMATORS: dict[str, EstimatorSpec] = {
    "gae": EstimatorSpec(
        "gae",
        "token",
        ("gamma", "lam"),
        _critic,
        ("reference", *_CRITIC, "telescoping", *_ENDS),
        "Token GAE (the PPO baseline, verl's multi-turn convention)",
    ),
    "mae": EstimatorSpec(
        "mae",
        "turn",
        ("gamma", "lam", "lam_intra", "beta"),
        _critic,
        ("reference", "turn-mean", "beta-zero-broadcast", *_CRITIC, "telescoping", *_ENDS),
        "MAE: multiscale advantage estimation (MPO)",
    ),
    # REINFORCE++'s return-to-go: token GAE with no values and λ = 1 (γ per policy token).
    "reinforce": EstimatorSpec(
        "reinforce",
        "token",
        ("gamma",),
        _critic,
        ("reference", "observation-transparency", "padding-invariance", "permutation-equivariance", *_ENDS),
        "Token GAE (the PPO baseline, verl's multi-turn convention)",
    ),
    "grpo": EstimatorSpec("grpo", "group", (), group_batches(), _GROUP, "Group baselines (no critic)"),
    "drgrpo": EstimatorSpec("drgrpo", "group", (), group_batches(), _GROUP, "Group baselines (no critic)"),
    "rloo": EstimatorSpec("rloo", "group", (), group_batches(), _GROUP, "Group baselines (no critic)"),
}
"""The estimators the kit checks against, by name."""
