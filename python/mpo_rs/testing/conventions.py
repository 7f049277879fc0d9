"""Convention adapters: how the kit calls an advantage function written for one trainer.

A convention turns the kit's flat :class:`~mpo_rs.testing.strategies.Batch` into the
arguments a function expects, calls it, and reads its result back as one float64 per flat
token (:class:`Outcome`). It is any callable ``(fn, batch, options, layout) -> Outcome``;
:data:`CONVENTIONS` names the built-in ones:

``flat``
    ``fn(values, mask, offsets, *, rewards, **options)`` on flat numpy arrays, returning an
    object with ``.advantages`` (and maybe ``.returns``, ``.turn_advantages``) or a tuple
    ``(advantages, returns)`` or the advantages alone. ``mpo_rs.gae_advantages`` and
    ``mpo_rs.mae_advantages`` are of this convention. A NaN value (a non-policy token's) is
    replaced by the layout's ``fill``, a finite number.
``flat-group``
    ``fn(scores, group_ids, **options)`` returning one advantage per trajectory, which
    the adapter puts on the trajectory's policy tokens (``mpo_rs.group_advantages``).
``verl-gae``
    verl's ``compute_gae_advantage_return(token_level_rewards, values, response_mask,
    gamma, lam) -> (advantages, returns)``: right-padded ``(B, L)`` float32 torch tensors,
    an int64 mask (verl's dtype); ``options`` passed as keywords.
``verl-group``
    verl's group estimators ``fn(token_level_rewards, response_mask, index) -> (advantages,
    returns)`` (GRPO, RLOO, ...): ``index`` a numpy array of string ids, one per row.
``verl-reinforce``
    verl's ``compute_reinforce_plus_plus_outcome_advantage(token_level_rewards,
    response_mask, config) -> (advantages, returns)``: γ goes in as ``config=AlgoConfig(gamma=...)``
    (needs verl).
``padded``
    ``fn(rewards, values, mask, **options)`` on ``(B, L)`` numpy arrays (float32, bool
    mask), returning the advantages or ``(advantages, returns)``.

Writing one's own: a function of the same shape, e.g. for a trainer that takes
``(B, L)`` tensors named differently::

    def my_convention(fn, batch, options, layout):
        p = to_padded(batch, padding_side=layout.side, extra=layout.extra, fill=layout.fill)
        adv = fn(rewards=torch.from_numpy(p.token_level_rewards), mask=torch.from_numpy(p.mask), **options)
        return Outcome(from_padded(adv, p))

    check_advantages(my_fn, convention=my_convention, estimator="gae")

The torch conventions need torch (the ``torch`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._deps import needs
from ..exceptions import InvalidBatchError, InvalidOptionError
from .strategies import Batch, PaddedBatch, from_padded, to_padded

__all__ = ["CONVENTIONS", "Convention", "Layout", "Outcome", "resolve_convention"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Layout:
    """How a padded convention lays the batch out: the padding side, extra columns of
    padding and the value on non-policy tokens and padding. Flat conventions ignore it."""

    side: Literal["left", "right"] = "right"
    extra: int = 0
    fill: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """A function's result read back per flat token (float64); what it does not return is None."""

    advantages: F64
    returns: F64 | None = None
    turn_advantages: F64 | None = None
    """Per turn, when the function returns them (``.turn_advantages``)."""


Convention = Callable[[Callable[..., Any], Batch, Mapping[str, Any], Layout], Outcome]
"""``(fn, batch, options, layout) -> Outcome``."""


def _f64(x: Any) -> F64:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _split(result: Any) -> tuple[Any, Any, Any]:
    """(advantages, returns, turn_advantages) of a result object, a tuple or an array."""
    if hasattr(result, "advantages"):
        return result.advantages, getattr(result, "returns", None), getattr(result, "turn_advantages", None)
    if isinstance(result, tuple):
        if len(result) not in (1, 2):
            raise InvalidBatchError(
                f"the function returned a tuple of {len(result)} items, expected (advantages, returns)"
            )
        return result[0], (result[1] if len(result) == 2 else None), None
    return result, None, None


def _flat_shape(name: str, a: F64, n: int) -> F64:
    if a.shape != (n,):
        raise InvalidBatchError(f"the function's {name} have shape {a.shape}, expected ({n},) (one per flat token)")
    return a


def flat(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``flat`` convention (see the module's docstring)."""
    values = np.where(np.isnan(b.values), np.float32(layout.fill), b.values).astype(np.float32)
    adv, ret, turn = _split(fn(values, b.mask, b.offsets, rewards=b.rewards, **options))
    n = len(b.mask)
    return Outcome(
        _flat_shape("advantages", _f64(adv), n),
        None if ret is None else _flat_shape("returns", _f64(ret), n),
        None if turn is None else _f64(turn),
    )


def flat_group(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``flat-group`` convention: per-trajectory advantages on the policy tokens."""
    if b.group_ids is None:
        raise InvalidBatchError("the flat-group convention needs a batch with group ids")
    per = _f64(_split(fn(b.scores, b.group_ids, **options))[0])
    if per.shape != (b.n,):
        raise InvalidBatchError(f"the function returned shape {per.shape}, expected ({b.n},) (one per trajectory)")
    lengths = np.diff(b.offsets)
    return Outcome(np.where(b.mask, np.repeat(per, lengths), 0.0))


def _padded(b: Batch, layout: Layout) -> PaddedBatch:
    return to_padded(b, padding_side=layout.side, extra=layout.extra, fill=layout.fill)


def _padded_outcome(result: Any, p: PaddedBatch) -> Outcome:
    adv, ret, _ = _split(result)
    return Outcome(from_padded(_f64(adv), p), None if ret is None else from_padded(_f64(ret), p))


def padded(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``padded`` convention: numpy ``(B, L)`` arrays in and out."""
    p = _padded(b, layout)
    return _padded_outcome(fn(p.token_level_rewards, p.values, p.mask, **options), p)


def _torch() -> Any:
    with needs("mpo_rs.testing's torch conventions", "torch"):
        import torch
    return torch


def verl_gae(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``verl-gae`` convention: verl's ``compute_gae_advantage_return``."""
    torch = _torch()
    p = _padded(b, layout)
    t = torch.from_numpy
    result = fn(t(p.token_level_rewards), t(p.values), t(p.mask.astype(np.int64)), **options)
    return _padded_outcome(result, p)


def verl_group(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``verl-group`` convention: verl's group estimators, with ``index``."""
    torch = _torch()
    if b.group_ids is None:
        raise InvalidBatchError("the verl-group convention needs a batch with group ids")
    p = _padded(b, layout)
    index = np.array([f"uid-{g}" for g in b.group_ids.tolist()], dtype=object)
    result = fn(torch.from_numpy(p.token_level_rewards), torch.from_numpy(p.mask.astype(np.int64)), index, **options)
    return _padded_outcome(result, p)


def verl_reinforce(fn: Callable[..., Any], b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
    """The ``verl-reinforce`` convention: verl's REINFORCE++, γ in an ``AlgoConfig``."""
    torch = _torch()
    with needs("mpo_rs.testing's verl-reinforce convention", "verl"):
        from verl.trainer.config import AlgoConfig
    p = _padded(b, layout)
    config = AlgoConfig(gamma=float(options.get("gamma", 1.0)))
    rest = {k: v for k, v in options.items() if k not in ("gamma", "lam")}
    result = fn(
        torch.from_numpy(p.token_level_rewards), torch.from_numpy(p.mask.astype(np.int64)), config=config, **rest
    )
    return _padded_outcome(result, p)


CONVENTIONS: dict[str, Convention] = {
    "flat": flat,
    "flat-group": flat_group,
    "padded": padded,
    "verl-gae": verl_gae,
    "verl-group": verl_group,
    "verl-reinforce": verl_reinforce,
}
"""The built-in conventions by name (see the module's docstring)."""

PADDED = frozenset({"padded", "verl-gae", "verl-group", "verl-reinforce"})
"""The built-in conventions that lay the batch out as padded rows."""


def resolve_convention(convention: str | Convention) -> Convention:
    """A convention by name (a key of :data:`CONVENTIONS`) or the callable itself."""
    if callable(convention):
        return convention
    try:
        return CONVENTIONS[convention]
    except KeyError:
        known = ", ".join(sorted(CONVENTIONS))
        raise InvalidOptionError(f"unknown convention {convention!r}; the built-in ones are: {known}") from None
