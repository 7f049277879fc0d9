"""The learner's settings, :class:`LearnerConfig` (needs torch).

The estimator is one field, ``estimator``: a name of the options table (``"mae"``,
``"gae"``, ``"grpo"``, ``"drgrpo"``, ``"rloo"``, ``"bilevel"``) or an :class:`mpo_rs.Estimator` carrying
its options, e.g. ``LearnerConfig(estimator=Estimator("mae", lam=0.9))``. The config
declares no estimator option, default or range of its own: the Rust table judges them when
the ``Estimator`` is built. Every other field is checked when the config is built, with
:class:`mpo_rs.InvalidOptionError` naming it: ints are ints (``bool`` is not one), floats
are real numbers (not ``bool``), finite and in range, names come from their tuples.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from .._native import closest_name
from ..exceptions import InvalidOptionError
from ..options import ESTIMATORS, Estimator
from .estimation import as_estimator, natural_ratio
from .losses import AGGREGATIONS, RATIO_MODES, TURN_RATIOS, check_clip_range

__all__ = ["ADVANTAGE_SCALES", "ESTIMATORS", "MAX_EPOCHS", "LearnerConfig"]

ADVANTAGE_SCALES = ("none", "whiten")

MAX_EPOCHS = 10_000
"""The most passes over a batch per step (``ppo_epochs``, ``critic_epochs``): PPO makes a
few; a count beyond this is a slip that would hold one step for hours, or for ever."""

# The estimator options LearnerConfig took as fields of its own before it took an Estimator:
# old field -> the option's name in the table.
_MOVED_OPTIONS = {
    "lam": "lam",
    "lam_intra": "lam_intra",
    "beta": "beta",
    "gamma": "gamma",
    "lam_critic": "lam_critic",
    "gae_length_adaptive_alpha": "length_adaptive_alpha",
    "grpo_norm_std": "norm_std",
    "grpo_leave_one_out": "leave_one_out",
    "grpo_eps": "eps",
}
# Settings renamed before a release: old name -> what to write instead.
_REPLACED = {"normalize_advantages": 'advantage_scale="whiten"'}


@dataclass
class LearnerConfig:
    """The settings of :class:`~mpo_rs.torch.learner.Learner`; see docs/torch.md."""

    # Advantage estimation (Rust core).
    estimator: str | Estimator = "mae"
    """An estimator name or an ``mpo_rs.Estimator`` with its options; stored as the
    ``Estimator`` it resolves to (``LearnerConfig(estimator="rloo").estimator`` is
    ``Estimator("rloo")``)."""
    advantage_scale: str = "none"
    """``"none"`` or ``"whiten"``: whiten the advantages over the batch's policy tokens
    after estimation, as verl does for GAE (:func:`mpo_rs.torch.whiten`: masked mean,
    unbiased variance, ``rsqrt(var + 1e-8)``; needs 2 policy tokens or more). Applies to
    every estimator; GRPO's per-group std is the estimator's ``norm_std``."""

    # Policy loss (see mpo_rs.torch.losses.policy_loss).
    ratio: str | None = None
    """``"turn"`` | ``"token"`` | ``"sequence"`` (GSPO); None = the estimator's natural
    ratio (:attr:`policy_ratio`): turn for mae, token for gae, bilevel and the group family."""
    turn_ratio: str = "product"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    log_ratio_clamp: float = 20.0
    agg: str = "token-mean"
    value_clip: float | None = 0.5
    entropy_coef: float = 0.0
    """Entropy bonus: the loss is ``policy_loss - entropy_coef * entropy``, the entropy of
    the policy (at ``temperature``) per policy token, aggregated with ``agg``."""

    # Optimisation.
    ppo_epochs: int = 1
    minibatch_size: int = 16
    """Trajectories per optimizer step."""
    micro_batch_size: int | None = None
    """Trajectories per forward/backward (gradient accumulation); None = whole minibatch."""
    max_grad_norm: float | None = 1.0
    """Clip each model's gradient to this norm (positive); None = no clipping."""
    bf16: bool = False
    """Run the models under bf16 autocast; losses are computed in fp32."""
    temperature: float = 1.0
    """Divides the logits, as the sampler did."""
    shuffle: bool = True
    seed: int = 0
    """Seeds the minibatch shuffle (a non-negative int)."""
    device: str | torch.device | None = None
    """Where to train; None = where the policy's parameters are (modules are moved only
    when this is set)."""
    critic_epochs: int | None = None
    """Passes of the critic over the batch's minibatches per step, independent of the
    actor's ``ppo_epochs`` (K critic updates per actor update); None = ``ppo_epochs``.
    verl's ``critic.ppo_epochs``, which also defaults to the actor's ``ppo_epochs``: the
    same name beside ``ppo_epochs`` here, and the same default, so a config that does not
    set it trains as before. The first ``min(ppo_epochs, critic_epochs)`` passes update
    both models on the same minibatches; the critic's extra passes draw their shuffles
    from a generator of their own (seeded from ``seed``), so the actor's updates do not
    depend on this setting. (Last among the fields, to keep the positional order.)"""

    def __new__(cls, *args: Any, **kwargs: Any) -> LearnerConfig:  # the arguments go on to __init__
        # Before the dataclass's __init__, so that a removed or misspelt field is an
        # InvalidOptionError that says where to go, not a TypeError.
        _check_arguments(args, kwargs)
        return super().__new__(cls)

    def __setattr__(self, name: str, value: Any) -> None:
        # A removed or misspelt setting assigned after construction is refused as at
        # construction, not kept as an attribute nothing reads.
        _check_arguments((), {name: value})
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, _CHECKS[f.name](f.name, getattr(self, f.name)))
        check_clip_range(self.clip_low, self.clip_high, self.dual_clip)

    @property
    def policy_ratio(self) -> str:
        """The ratio the policy loss uses: ``ratio``, or the estimator's natural one."""
        if self.ratio is not None:
            return self.ratio
        return natural_ratio(as_estimator(self.estimator))

    def check_critic(self, has_critic: bool) -> None:
        """Refuses ``critic_epochs`` for a learner without a critic, where it would do
        nothing (a group estimator then trains the policy alone; a critic estimator reads
        the batch's values). Called by the learner, which knows whether it has one."""
        if self.critic_epochs is not None and not has_critic:
            raise InvalidOptionError(
                f"LearnerConfig.critic_epochs={self.critic_epochs} sets the critic's passes, but the Learner has "
                f"no critic (estimator {as_estimator(self.estimator).name!r}); leave it None, or pass "
                "critic= and critic_optimizer="
            )

    @property
    def critic_passes(self) -> int:
        """The critic's passes per step: ``critic_epochs``, or ``ppo_epochs`` when None."""
        return self.ppo_epochs if self.critic_epochs is None else self.critic_epochs

    @property
    def whitens(self) -> bool:
        return self.advantage_scale == "whiten"


def _check_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    names = [f.name for f in fields(LearnerConfig)]
    moved = [k for k in kwargs if k in _MOVED_OPTIONS]
    if moved:
        given = kwargs.get("estimator", args[0] if args else None)
        name = repr(given) if isinstance(given, str) else "name"
        options = ", ".join(f"{_MOVED_OPTIONS[k]}=..." for k in moved)
        raise InvalidOptionError(
            f"LearnerConfig takes no `{moved[0]}`: estimator options travel with the estimator, "
            f"e.g. LearnerConfig(estimator=mpo_rs.Estimator({name}, {options}))"
        )
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        word = unknown[0]
        if word in _REPLACED:
            hint = f" (write {_REPLACED[word]})"
        else:
            guess = closest_name(word, names)
            hint = "" if guess is None else f" (did you mean `{guess}`?)"
        raise InvalidOptionError(
            f"LearnerConfig has no setting `{word}`{hint}; its settings are {', '.join(sorted(names))}"
        )
    if len(args) > len(names):
        raise InvalidOptionError(f"LearnerConfig takes at most {len(names)} settings, got {len(args)} positional ones")
    twice = [k for k in names[: len(args)] if k in kwargs]
    if twice:
        raise InvalidOptionError(f"LearnerConfig got `{twice[0]}` twice, by position and by name")


# --------------------------------------------------------------------------- field checks


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _real(name: str, value: Any) -> float:
    """``value`` as a float: a real number, not a bool, finite and within float32's range
    (the losses compute in float32: a larger clip bound cannot be applied to a ratio)."""
    if isinstance(value, (bool, torch.Tensor)) or not isinstance(value, numbers.Real):
        raise InvalidOptionError(f"LearnerConfig.{name} must be a number, got {type(value).__name__} {_show(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if math.isnan(out):
        raise InvalidOptionError(f"LearnerConfig.{name} must be a finite number, got nan")
    if not abs(out) <= _FLOAT32_MAX:
        shown = f"{out:g}" if math.isinf(out) else _show(value)
        raise InvalidOptionError(
            f"LearnerConfig.{name} = {shown} is not finite in float32 (|x| <= {_FLOAT32_MAX:.4g}), "
            "the precision of the losses"
        )
    return out


def _number(above: float | None = None, *, optional: bool = False) -> Callable[[str, Any], Any]:
    """A finite float, greater than ``above`` when given, or None when ``optional``."""

    def check(name: str, value: Any) -> float | None:
        if value is None and optional:
            return None
        out = _real(name, value)
        if above is not None and not out > above:
            raise InvalidOptionError(
                f"LearnerConfig.{name} must be greater than {above:g}{' (or None)' if optional else ''}, got {out}"
            )
        return out

    return check


def _integer(least: int, most: int | None = None, *, optional: bool = False) -> Callable[[str, Any], Any]:
    """An int (numpy's too, not a bool) of at least ``least`` (and at most ``most``), or
    None when ``optional``."""

    def check(name: str, value: Any) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidOptionError(f"LearnerConfig.{name} must be an int, got {type(value).__name__} {_show(value)}")
        count = int(value)
        if count < least or (most is not None and count > most):
            bound = f"at least {least}" if most is None else f"in [{least}, {most}]"
            raise InvalidOptionError(
                f"LearnerConfig.{name} must be {bound}{' (or None)' if optional else ''}, got {_show(value)}"
            )
        return count

    return check


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):  # 0 and 1 are not flags
        raise InvalidOptionError(f"LearnerConfig.{name} must be True or False, got {_show(value)}")
    return bool(value)


def _choice(allowed: tuple[str, ...], *, optional: bool = False) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or value not in allowed:
            raise InvalidOptionError(
                f"unknown LearnerConfig.{name}={_show(value)}; expected one of "
                f"{', '.join(map(repr, allowed))}{' or None' if optional else ''}"
            )
        return value

    return check


def _estimator(name: str, value: Any) -> Estimator:
    return as_estimator(value, name)


def _device(name: str, value: Any) -> str | torch.device | None:
    if value is None:
        return None
    if not isinstance(value, (str, torch.device)):
        raise InvalidOptionError(f"LearnerConfig.{name} must be a device name or a torch.device, got {_show(value)}")
    try:
        torch.device(value)
    except RuntimeError as e:
        raise InvalidOptionError(f"LearnerConfig.{name}={_show(value)} is not a torch device: {e}") from None
    return value


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "estimator": _estimator,
    "advantage_scale": _choice(ADVANTAGE_SCALES),
    "ratio": _choice(RATIO_MODES, optional=True),
    "turn_ratio": _choice(TURN_RATIOS),
    # Their ranges are the losses' (check_clip_range, after the fields).
    "clip_low": _number(),
    "clip_high": _number(),
    "dual_clip": _number(optional=True),
    "log_ratio_clamp": _number(0.0),
    "agg": _choice(AGGREGATIONS),
    "value_clip": _number(0.0, optional=True),
    "entropy_coef": _number(),
    "ppo_epochs": _integer(1, MAX_EPOCHS),
    "minibatch_size": _integer(1),
    "micro_batch_size": _integer(1, optional=True),
    "max_grad_norm": _number(0.0, optional=True),
    "bf16": _flag,
    "temperature": _number(0.0),
    "shuffle": _flag,
    "seed": _integer(0),
    "device": _device,
    "critic_epochs": _integer(1, MAX_EPOCHS, optional=True),
}
assert {f.name for f in fields(LearnerConfig)} == _CHECKS.keys(), "every LearnerConfig field has its check"
