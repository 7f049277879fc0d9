"""Advantage estimators over ragged batches.

A batch is N trajectories flattened token by token: ``offsets`` (int64, N+1) cuts the
flat arrays, ``mask`` marks the tokens the policy generated. Every function here coerces
its inputs (see ``_arrays``), releases the GIL and runs the Rust core in parallel over
trajectories; results are float32 numpy arrays owned by the caller.

:func:`advantages` computes any estimator of the options table: it takes ``estimator=`` (a
name or an :class:`mpo_rs.Estimator`), the estimator's options as keywords (``lam=0.9``;
names, defaults and domains come from ``mpo_rs.Estimator.option_table()``,
docs/estimators.md) and the inputs the estimator reads, and makes one call into the Rust
core, which dispatches on the estimator. The functions of one family (``mae_advantages``,
``gae_advantages``, ``bilevel_advantages``, ``group_advantages``) are typed aliases of it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, SupportsAbs, cast

import numpy as np
import numpy.typing as npt

from . import _native
from ._arrays import as_numpy, flags, float32, int64, mask_u8, ragged_float32, ragged_int64
from .exceptions import InvalidBatchError, InvalidOptionError
from .options import Estimator, family_estimators, resolve

__all__ = [
    "CHECK_TOLERANCE",
    "BiLevelResult",
    "Estimate",
    "GAEResult",
    "MAEResult",
    "Turns",
    "advantages",
    "bilevel_advantages",
    "broadcast_to_tokens",
    "gae_advantages",
    "group_advantages",
    "mae_advantages",
    "segment_turns",
]


@dataclass(frozen=True, eq=False)
class Turns:
    """Turn segmentation of a batch; a turn is a maximal run of policy tokens."""

    starts: npt.NDArray[np.int64]
    """Flat index of each turn's first token."""
    ends: npt.NDArray[np.int64]
    """Flat index one past each turn's last token."""
    traj_offsets: npt.NDArray[np.int64]
    """Turns of trajectory j are ``traj_offsets[j]:traj_offsets[j+1]``."""
    token_turn: npt.NDArray[np.int32]
    """Global turn index of each token, -1 off-policy."""

    @property
    def n_turns(self) -> int:
        return int(self.starts.shape[0])

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Number of tokens of each turn."""
        return self.ends - self.starts


@dataclass(frozen=True, eq=False)
class MAEResult:
    advantages: npt.NDArray[np.float32]
    """Per token: A_turn + beta * (centred intra-turn GAE); 0 off-policy."""
    returns: npt.NDArray[np.float32]
    """Per token: critic value targets with lam_critic; 0 off-policy."""
    turn_advantages: npt.NDArray[np.float32]
    """Per turn: the turn-level GAE A_t^turn."""
    turns: Turns


@dataclass(frozen=True, eq=False)
class GAEResult:
    advantages: npt.NDArray[np.float32]
    """Per token GAE over policy tokens; 0 off-policy."""
    returns: npt.NDArray[np.float32]
    """Per token value targets with lam_critic; 0 off-policy."""


@dataclass(frozen=True, eq=False)
class BiLevelResult:
    advantages: npt.NDArray[np.float32]
    """Per token: the token-level GAE inside each turn started from the turn's return G_t;
    0 off-policy. Not mean-preserving: a turn's mean is not A_t^hi."""
    returns: npt.NDArray[np.float32]
    """Per token: advantages + values; 0 off-policy."""
    turn_advantages: npt.NDArray[np.float32]
    """Per turn: the turn-level GAE A_t^hi (also the advantage of the turn's last token)."""
    turns: Turns


@dataclass(frozen=True, eq=False)
class Estimate:
    """What :func:`advantages` computes; what the estimator does not define is None."""

    estimator: Estimator
    advantages: npt.NDArray[np.float32]
    """Per token, 0 off-policy (a group estimator's per-trajectory advantage on its policy
    tokens)."""
    returns: npt.NDArray[np.float32] | None
    """Per token, the critic's targets (mae, gae, bilevel)."""
    turn_advantages: npt.NDArray[np.float32] | None
    """Per turn (mae, bilevel; gigpo: the value on the turn's tokens)."""
    turns: Turns | None
    """The segmentation ``turn_advantages`` index (mae, bilevel, gigpo)."""
    per_trajectory: npt.NDArray[np.float32] | None
    """One advantage per trajectory (the group estimators; gigpo: the episode advantages)."""
    step_advantages: npt.NDArray[np.float32] | None = None
    """Per turn, gigpo's step advantages (``turns`` indexes them)."""
    step_groups: npt.NDArray[np.int64] | None = None
    """Per turn, gigpo's step-group ids (dense int64)."""


CHECK_TOLERANCE = 1e-4
"""Tolerance of the check that per-turn rewards sum to the trajectory's score
(``check_scores``): ``|sum_t r_t - score| <= tol * max(1, |score|)``."""


# How the reward-source message describes each source, whatever the layer calls it.
_SOURCE_WORDS = {
    "rewards": "token-level",
    "token_level_rewards": "(B, L)",
    "scores": "one per trajectory",
    "turn_rewards": "one per turn",
}


def one_reward_source(**given: Any) -> str:
    """The name of the one reward source given (keywords: the layer's names of its sources,
    in the order the message lists them; None: not given). The rule of every estimator and
    layer (numpy, torch, the critic-free MAE): exactly one, else ``InvalidBatchError``
    listing the sources and naming what was given."""
    names = [name for name, x in given.items() if x is not None]
    if len(names) != 1:
        listed = [f"`{name}` ({_SOURCE_WORDS[name]})" for name in given]
        choices = f"{', '.join(listed[:-1])} and {listed[-1]}"
        got = " and ".join(f"`{name}`" for name in names) if names else "none"
        raise InvalidBatchError(f"give exactly one of {choices}; got {got}")
    return names[0]


def _critic_inputs(
    offsets: npt.NDArray[np.int64],
    rewards: Any,
    scores: Any,
    turn_rewards: Any,
    truncated: Any,
    check_scores: Any,
    check_tolerance: float,
) -> dict[str, Any]:
    """The reward source (exactly one of token rewards, scores, per-turn rewards) and the
    optional inputs of the critic estimators, as the native functions take them."""
    one_reward_source(rewards=rewards, scores=scores, turn_rewards=turn_rewards)
    if check_scores is not None and turn_rewards is None:
        raise InvalidBatchError("`check_scores` checks that `turn_rewards` sum to each score; give `turn_rewards` too")
    # Only what is given: fewer keywords for the native call to parse (its per-call cost).
    out: dict[str, Any] = {}
    if rewards is not None:
        out["rewards"] = float32(rewards, "rewards")
    elif scores is not None:
        out["scores"] = float32(scores, "scores")
    else:
        n_rows = max(int(offsets.shape[0]) - 1, 0)
        out["turn_rewards"], out["turn_offsets"] = ragged_float32(turn_rewards, "turn_rewards", n_rows)
    if truncated is not None:
        out["truncated"] = flags(truncated, "truncated")
    if check_scores is not None:
        out["check_scores"] = float32(check_scores, "check_scores")
    # Judged by Rust (type and domain) whether or not a check is asked for.
    out["check_tolerance"] = check_tolerance
    return out


def segment_turns(mask: Any, offsets: Any) -> Turns:
    """Splits every trajectory into turns (maximal runs of ``mask == 1``)."""
    return Turns(*_native.segment_turns(mask_u8(mask), int64(offsets, "offsets")))


class _Native(NamedTuple):
    """The native call's outputs (None: not defined by the estimator)."""

    advantages: Any
    returns: Any
    turn_advantages: Any
    turns: Any
    per_trajectory: Any
    step_advantages: Any
    step_groups: Any


# The native tuple named without a Python-level constructor call (what ``_Native._make``
# does inside): part of every call's fixed cost.
_as_native = cast("Callable[[type[_Native], Any], _Native]", tuple.__new__)


def _estimate(
    est: Estimator,
    mask: Any,
    offsets: Any,
    values: Any = None,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    group_ids: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = CHECK_TOLERANCE,
    turn_state_ids: Any = None,
    token_ids: Any = None,
) -> _Native:
    """The one call into the Rust core (``_native.advantages``) of every layer, after the
    inputs are coerced; the core dispatches on ``est`` and refuses what it lacks or would
    not read."""
    o = int64(offsets, "offsets")
    inputs = _critic_inputs(o, rewards, scores, turn_rewards, truncated, check_scores, check_tolerance)
    if group_ids is not None:
        codes, inputs["n_groups"] = group_codes(group_ids)
        n_rows = max(int(o.shape[0]) - 1, 0)
        if codes.shape[0] != n_rows:
            raise InvalidBatchError(f"`group_ids` has length {codes.shape[0]}, expected {n_rows} (one per trajectory)")
        inputs["group_index"] = codes
    if turn_state_ids is not None:
        n_rows = max(int(o.shape[0]) - 1, 0)
        inputs["turn_state_ids"], inputs["turn_state_offsets"] = ragged_int64(turn_state_ids, "turn_state_ids", n_rows)
    if token_ids is not None:
        inputs["token_ids"] = int64(token_ids, "token_ids")
    v = None if values is None else float32(values, "values")
    return _as_native(_Native, _native.advantages(est, mask_u8(mask), o, v, **inputs))


def advantages(
    mask: Any,
    offsets: Any,
    *,
    values: Any = None,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    group_ids: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = CHECK_TOLERANCE,
    turn_state_ids: Any = None,
    token_ids: Any = None,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> Estimate:
    """Any estimator of the options table on a ragged batch, in one call into the Rust core.

    ``estimator`` is a name (default ``"mae"``) or an :class:`mpo_rs.Estimator`; ``options``
    override its options. Exactly one reward source is given: ``rewards`` (per token),
    ``scores`` (per trajectory) or ``turn_rewards`` (per turn), as in
    :func:`mae_advantages`. The critic estimators (mae, gae, bilevel) read ``values`` (one
    per token; missing: :class:`mpo_rs.MissingCriticValuesError`), mae and gae also
    ``truncated``; the group estimators (grpo, drgrpo, rloo) read ``scores`` and
    ``group_ids`` (one per trajectory, the rule of :func:`group_codes`); gigpo reads
    ``group_ids``, any reward source and its anchor states, ``turn_state_ids`` or
    ``token_ids`` (:func:`mpo_rs.gigpo_advantages`). An input the estimator does not read
    is refused (:class:`mpo_rs.InvalidOptionError`), never ignored. Returns an
    :class:`Estimate`; the results are bitwise those of the family's function.
    """
    est = resolve(estimator, options, "mae")
    raw = _estimate(
        est,
        mask,
        offsets,
        values,
        rewards,
        scores,
        turn_rewards,
        group_ids,
        truncated,
        check_scores,
        check_tolerance,
        turn_state_ids,
        token_ids,
    )
    turns = None if raw.turns is None else Turns(*raw.turns)
    return Estimate(
        est,
        raw.advantages,
        raw.returns,
        raw.turn_advantages,
        turns,
        raw.per_trajectory,
        raw.step_advantages,
        raw.step_groups,
    )


# How a family's function names its family when handed another one.
_FAMILY_WORDS = {
    "mae": "mae",
    "gae": "gae",
    "bilevel": "bilevel",
    "group": "group (grpo, drgrpo, rloo)",
    "gigpo": "gigpo",
}


# Each family's default estimator, built once: a family's function called without
# `estimator` and options (the usual call) takes it as is, with nothing to resolve or check.
_FAMILY_DEFAULT = {e.family: e for e in map(Estimator, family_estimators())}


def of_family(estimator: str | Estimator | None, options: dict[str, Any], family: str, function: str) -> Estimator:
    """``estimator`` resolved (default: ``family``'s first name) for the function of one
    family; another family raises :class:`mpo_rs.InvalidOptionError` naming both."""
    if estimator is None and not options:
        return _FAMILY_DEFAULT[family]
    est = resolve(estimator, options, _FAMILY_DEFAULT[family].name)
    if est.family != family:
        raise InvalidOptionError(
            f"{function} computes the {_FAMILY_WORDS[family]} estimator; got the {est.name} estimator "
            "(use the function of its family, or mpo_rs.advantages)"
        )
    return est


def mae_advantages(
    values: Any,
    mask: Any,
    offsets: Any,
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = CHECK_TOLERANCE,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> MAEResult:
    """Multiscale advantage estimation (MPO).

    A GAE over turns (``lam``, discount ``gamma`` once per interaction) gives each turn
    A_t^turn; a token GAE inside the turn (``lam_intra``), centred on its turn mean and
    scaled by ``beta``, refines it per token, so the turn mean of the advantages is
    exactly A_t^turn. ``returns`` are the critic's targets with ``lam_critic``
    (1 = discounted Monte-Carlo return). Exactly one of ``rewards`` (per token, zero off
    policy), ``scores`` (per trajectory, placed on its last policy token) and
    ``turn_rewards`` (per turn, placed on each turn's last policy token) is given.

    ``turn_rewards`` is a list of N sequences, one per trajectory with one reward per turn
    (a count that is not the trajectory's number of turns raises ``InvalidBatchError``
    naming the trajectory and both counts), or a flat array of all the batch's turns in
    order (only its total length can then be checked). ``check_scores`` (one per
    trajectory, optional) checks that each trajectory's turn rewards sum to it, within
    ``check_tolerance * max(1, |score|)``. ``truncated`` (N bools, optional) marks
    trajectories cut off before their episode ended: the last policy token bootstraps from
    its own value, ``V_{T+1,1} := V_{T,L_T}``, instead of 0 (docs/estimators.md,
    "Truncation"); a trajectory not truncated is computed bitwise as without the flag.

    ``estimator`` is ``"mae"`` (default) or an ``Estimator("mae", ...)``; ``options``
    override its options (defaults: lam=0.8, lam_intra=0.95, beta=1, gamma=1,
    lam_critic=1). An unknown option raises :class:`mpo_rs.InvalidOptionError`.
    :func:`advantages` with ``estimator="mae"``, typed.
    """
    est = of_family(estimator, options, "mae", "mae_advantages")
    raw = _estimate(
        est, mask, offsets, values, rewards, scores, turn_rewards, None, truncated, check_scores, check_tolerance
    )
    return MAEResult(raw.advantages, raw.returns, raw.turn_advantages, Turns(*raw.turns))


def gae_advantages(
    values: Any,
    mask: Any,
    offsets: Any,
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = CHECK_TOLERANCE,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> GAEResult:
    """Token-level GAE over policy tokens, observation tokens skipped (verl's multi-turn
    convention). No whitening. ``returns`` use their own ``lam_critic``; verl's
    ``returns = advantages + values`` is ``lam_critic=lam``. ``length_adaptive_alpha``
    enables VAPO's per-trajectory lambda = 1 - 1/(alpha * l), l = policy tokens.
    ``rewards`` / ``scores`` / ``turn_rewards``, ``check_scores`` and ``truncated`` as in
    :func:`mae_advantages` (truncated: ``delta_last = r_last + gamma * V_last - V_last``).

    ``estimator`` is ``"gae"`` (default) or an ``Estimator("gae", ...)``; ``options``
    override its options (defaults: lam=0.95, gamma=1, lam_critic=1).
    :func:`advantages` with ``estimator="gae"``, typed.
    """
    est = of_family(estimator, options, "gae", "gae_advantages")
    raw = _estimate(
        est, mask, offsets, values, rewards, scores, turn_rewards, None, truncated, check_scores, check_tolerance
    )
    return GAEResult(raw.advantages, raw.returns)


def bilevel_advantages(
    values: Any,
    mask: Any,
    offsets: Any,
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    check_scores: Any = None,
    check_tolerance: float = CHECK_TOLERANCE,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> BiLevelResult:
    """RAGEN's bi-level GAE (``compute_bi_level_gae_advantage_return``), turns from the mask.

    High level: a GAE over turns on the value at each turn's last token (discount
    ``high_level_gamma`` once per turn, ``lam``) gives A_t^hi and the turn return
    G_t = A_t^hi + V. Low level: a token GAE inside each turn (discount ``gamma``, ``lam``)
    whose last token is rewarded with G_t and bootstraps from nothing. ``returns`` are
    advantages + values. Token rewards are summed per turn; a score sits on the last policy
    token. No whitening (RAGEN whitens afterwards: an advantage-scale choice).
    ``rewards`` / ``scores`` / ``turn_rewards`` and ``check_scores`` as in
    :func:`mae_advantages`; there is no ``truncated`` (RAGEN's estimator defines none).

    ``estimator`` is ``"bilevel"`` (default) or an ``Estimator("bilevel", ...)``; ``options``
    override its options (defaults, RAGEN's: lam=1, gamma=1, high_level_gamma=0.95).
    :func:`advantages` with ``estimator="bilevel"``, typed.
    """
    est = of_family(estimator, options, "bilevel", "bilevel_advantages")
    raw = _estimate(
        est, mask, offsets, values, rewards, scores, turn_rewards, None, None, check_scores, check_tolerance
    )
    return BiLevelResult(raw.advantages, raw.returns, raw.turn_advantages, Turns(*raw.turns))


def group_advantages(
    scores: Any,
    group_ids: Any,
    *,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> npt.NDArray[np.float32]:
    """Critic-free group baselines, one advantage per trajectory.

    GRPO: (s - mean_g) / (std_g + eps), unbiased std. ``norm_std=False``: Dr. GRPO
    (s - mean_g). ``leave_one_out=True``: RLOO, s - mean of the other members of the group
    (as verl and TRL define it; ``norm_std`` does not apply). A group of one gets 0.
    ``group_ids`` may be of any kind numpy can factorize: ints, strings, objects.

    ``estimator`` is ``"grpo"`` (default; takes ``eps``, ``norm_std``, ``leave_one_out``),
    ``"drgrpo"``, ``"rloo"`` or an ``Estimator`` of the group family. :func:`advantages`
    with a group estimator, one token per trajectory.
    """
    est = of_family(estimator, options, "group", "group_advantages")
    s = float32(scores, "scores")
    codes, n_groups = group_codes(group_ids)
    n = s.shape[0]
    if codes.shape[0] != n:
        raise InvalidBatchError(f"`group_ids` has length {codes.shape[0]}, expected {n} (one per score)")
    # No mask and offsets: one policy token per trajectory, whose advantages are the
    # per-trajectory ones (returned once, as the advantages).
    return _native.advantages(est, None, None, None, None, s, codes, n_groups)[0]


def as_group_ids(group_ids: Any) -> np.ndarray:
    """A 1-D numpy array of group ids, checked by the group-id rule (see ``group_codes``).

    Python lists and tuples become object arrays, so that ``[1, "1"]`` keeps two kinds
    (numpy would turn both into the string ``"1"``).
    """
    if isinstance(group_ids, (list, tuple)):
        nested = next((i for i, x in enumerate(group_ids) if isinstance(x, (list, np.ndarray))), None)
        if nested is not None:
            raise InvalidBatchError(f"`group_ids` must be 1-D (one per trajectory), got a list at trajectory {nested}")
        ids = np.empty(len(group_ids), dtype=object)
        ids[:] = group_ids
    else:
        ids = as_numpy(group_ids, "group_ids")
    if ids.ndim != 1:
        raise InvalidBatchError(f"`group_ids` must be 1-D (one per trajectory), got shape {ids.shape}")
    return ids


def group_codes(group_ids: Any) -> tuple[npt.NDArray[np.int64], int]:
    """Dense group codes (int64, in order of first appearance) and the number of groups.

    The group-id rule, shared with ``mpo-rs advantages`` and the Ray and verl
    integrations: numbers are one kind and compare by value (``1``, ``1.0``,
    ``np.int64(1)`` and ``True`` are one group); strings and bytes are kinds of their own
    (``1`` and ``"1"`` are two groups); any other hashable object is keyed by its type and
    value. A missing id -- ``None``, NaN, ±inf, NaT -- raises ``InvalidBatchError`` naming
    the trajectory: it is almost always a lost uid, and treating it as a group of its own
    would silently give that rollout advantage 0.
    """
    ids = as_group_ids(group_ids)
    kind = ids.dtype.kind
    if kind == "O":
        return _object_codes(ids)
    if kind in "fc":
        _reject_missing(np.flatnonzero(~np.isfinite(ids)), ids)
    elif kind in "mM":
        _reject_missing(np.flatnonzero(np.isnat(ids)), ids)
    # np.unique numbers the ids in sorted order; renumber them by first appearance, the
    # order of a list's codes (_object_codes), so no output depends on the container.
    uniques, first, codes = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0], dtype=np.int64)
    return np.ascontiguousarray(rank[codes.reshape(-1)]), int(uniques.shape[0])


def _reject_missing(bad: np.ndarray, ids: np.ndarray) -> None:
    if bad.size:
        j = int(bad[0])
        value = ids[j].item() if isinstance(ids[j], np.generic) else ids[j]
        raise InvalidBatchError(
            f"`group_ids` is {value!r} at trajectory {j}; a group id must not be missing (None, NaN, inf)"
        )


def _group_key(x: Any) -> Any:
    """The (kind, value) key of one id of an object array, or None for a missing id."""
    if isinstance(x, str):
        return ("str", x)
    if isinstance(x, bytes):
        return ("bytes", x)
    if isinstance(x, (numbers.Number, np.bool_)):
        try:
            # numbers.Number declares no __abs__, though every registered number type has one.
            missing = bool(x != x) or abs(cast(SupportsAbs[object], x)) == math.inf  # NaN, then ±inf
        except (TypeError, ValueError, ArithmeticError):
            missing = False
        return None if missing else ("number", x)
    if x is None or (isinstance(x, (np.datetime64, np.timedelta64)) and np.isnat(x)):
        return None
    return (type(x), x)


def _object_codes(ids: np.ndarray) -> tuple[npt.NDArray[np.int64], int]:
    # Python's equality and hashing already make 1 == 1.0 == np.int64(1) == True, so a dict
    # of (kind, value) keys is the rule; it is also faster than sorting Python objects.
    table: dict[Any, int] = {}
    codes = np.empty(ids.shape[0], dtype=np.int64)
    for j, x in enumerate(ids.tolist()):
        key = _group_key(x)
        if key is None:
            _reject_missing(np.array([j]), ids)
        try:
            codes[j] = table.setdefault(key, len(table))
        except TypeError:
            raise InvalidBatchError(f"`group_ids` holds an unhashable {type(x).__name__} at trajectory {j}") from None
    return codes, len(table)


def broadcast_to_tokens(per_trajectory: Any, mask: Any, offsets: Any) -> npt.NDArray[np.float32]:
    """Writes each trajectory's value on its policy tokens (0 elsewhere), e.g. to turn
    ``group_advantages`` into per-token advantages."""
    return _native.broadcast_to_tokens(
        float32(per_trajectory, "per_trajectory"), mask_u8(mask), int64(offsets, "offsets")
    )
