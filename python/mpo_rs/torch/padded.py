"""Advantages from padded ``(B, L)`` tensors, the layout trainers keep (needs torch).

verl, OpenRLHF, TRL, slime and NeMo-RL hold a batch as ``(B, L)`` tensors, one trajectory
per row: ``values``, ``token_level_rewards`` and a ``response_mask`` (action mask) that is
1 on the tokens the policy generated and 0 on observation / tool tokens and padding. This
module views such a batch as the flat ragged batch of :mod:`mpo_rs.estimators` (row j is
tokens ``j*L:(j+1)*L``), runs the Rust estimator and returns ``(B, L)`` tensors.

Inputs may live on any device; the estimators run on the host. CPU float32 contiguous
inputs are read without a copy, and CPU float32 results are returned without one.
:func:`advantages` computes any estimator of the options table in one call into the Rust
core (through :func:`mpo_rs.advantages`, which owns the options' names, defaults and
checks); ``mae_advantages``, ``gae_advantages``, ``bilevel_advantages``,
``group_advantages`` and ``gigpo_advantages`` are its typed aliases, one per family.

Errors are typed and name the argument: ``mpo_rs.InvalidBatchError`` for data (a tensor of
the wrong shape, not a tensor, a mask that is not 0/1, a float64 value beyond float32's
range), ``mpo_rs.InvalidOptionError`` for a setting (``observation_rewards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .. import _arrays, _native, estimators
from .. import observation_rewards as _observation
from ..exceptions import InvalidBatchError, MissingCriticValuesError
from ..options import Estimator, resolve

__all__ = [
    "OBSERVATION_REWARDS",
    "PaddedBatch",
    "advantages",
    "bilevel_advantages",
    "gae_advantages",
    "gigpo_advantages",
    "group_advantages",
    "mae_advantages",
    "whiten",
]

OBSERVATION_REWARDS = _observation.OBSERVATION_REWARDS
"""What to do with a nonzero reward on a token where the mask is 0: refuse it (the
estimators' rule), drop it (verl's GAE never reads it), or credit it to the last policy
token before it in its row (the action the observation answered). The one table of the
log tools too (:mod:`mpo_rs.observation_rewards`)."""

WHITEN_EPS = 1e-8
"""Added to the variance before the square root, as verl's ``masked_whiten``."""


@dataclass(frozen=True)
class PaddedBatch:
    """A padded ``(B, L)`` batch seen as the flat ragged batch the Rust core reads."""

    shape: tuple[int, int]
    device: torch.device
    """Where results go."""
    dtype: torch.dtype
    """The dtype of results."""
    policy: np.ndarray
    """bool (B*L,): the policy tokens."""
    offsets: np.ndarray
    """int64 (B+1,): row j is tokens ``j*L:(j+1)*L``."""

    @classmethod
    def of(cls, response_mask: Tensor, like: Tensor | None = None, like_name: str = "like") -> PaddedBatch:
        """The batch of ``response_mask`` (``(B, L)``, bool or 0/1 numbers, 1 = policy
        token); results take the device and floating dtype of ``like`` (float32 if it is
        not floating), or the mask's device and float32 without it. ``like_name`` names
        ``like`` in an error."""
        _check_tensor(response_mask, "response_mask")
        if like is not None:
            _check_tensor(like, like_name)
        if response_mask.dim() != 2:
            raise InvalidBatchError(
                f"`response_mask` must be padded (batch, response_length), got shape {tuple(response_mask.shape)}"
            )
        reference = response_mask if like is None else like
        dtype = reference.dtype if like is not None and like.dtype.is_floating_point else torch.float32
        rows, cols = response_mask.shape
        mask = response_mask.detach().cpu().reshape(-1)
        if mask.dtype == torch.bool:
            policy = mask.numpy()  # a view, read only
        else:
            policy = _policy_of(mask, "response_mask", cols)
        return cls((rows, cols), reference.device, dtype, policy, np.arange(rows + 1, dtype=np.int64) * cols)

    @property
    def mask_u8(self) -> np.ndarray:
        return self.policy.view(np.uint8)

    def flat(self, x: Tensor, name: str) -> np.ndarray:
        """A float32 host view (a copy only if it must be) of a ``(B, L)`` tensor, flat."""
        self._check_shape(x, name)
        out: np.ndarray = _host_float32(x, name).contiguous().reshape(-1).numpy()
        return out

    def _check_shape(self, x: Any, name: str) -> None:
        _check_tensor(x, name)
        if tuple(x.shape) != self.shape:
            raise InvalidBatchError(f"`{name}` has shape {tuple(x.shape)}, expected {self.shape} like `response_mask`")

    def padded(self, flat: np.ndarray) -> Tensor:
        """A flat per-token result as a ``(B, L)`` tensor on the batch's device and dtype."""
        return torch.from_numpy(flat).reshape(self.shape).to(device=self.device, dtype=self.dtype)

    def policy_rewards(self, token_level_rewards: Tensor, observation_rewards: str) -> np.ndarray:
        """Flat rewards, with rewards on observation tokens handled as ``observation_rewards``
        says (:data:`OBSERVATION_REWARDS`); ``"credit"`` drops a reward with no policy token
        before it in its row. The log tools' rule, run by Rust: a non-finite reward is never
        moved or dropped, so the estimator refuses it where it sits, in every mode."""
        mode = _observation.check(observation_rewards)
        rewards = self.flat(token_level_rewards, "token_level_rewards")
        if mode == "error":
            return rewards  # the estimator names the first such token
        moved = _native.relocate_observation_rewards(rewards, self.mask_u8, self.offsets, mode, "token_level_rewards")
        return rewards if moved is None else moved

    def whitened(self, flat: np.ndarray) -> np.ndarray:
        """:func:`whiten` of a flat per-token result over the policy tokens, on the host
        (before the result goes to the device, so the numbers do not depend on it)."""
        out: np.ndarray = whiten(torch.from_numpy(flat), torch.from_numpy(self.policy)).numpy()
        return out

    def row_scores(self, token_level_rewards: Tensor) -> np.ndarray:
        """One score per row: the sum of all its token rewards (verl's GRPO / RLOO)."""
        self._check_shape(token_level_rewards, "token_level_rewards")
        out: np.ndarray = _host_float32(token_level_rewards, "token_level_rewards").sum(dim=-1).numpy()
        return out


def _check_tensor(x: Any, name: str) -> None:
    if not isinstance(x, Tensor):
        hint = f" (torch.from_numpy({name}) wraps an array without a copy)" if isinstance(x, np.ndarray) else ""
        kind = "numpy.ndarray" if isinstance(x, np.ndarray) else type(x).__name__
        raise InvalidBatchError(f"`{name}` must be a torch.Tensor, got {kind}{hint}")


def _host_float32(x: Tensor, name: str) -> Tensor:
    """``x`` on the host in float32. A float64 value beyond float32's range is refused,
    naming it: it would become inf and be blamed as "not finite"."""
    out = x.detach().to(device="cpu", dtype=torch.float32)
    if x.dtype == torch.float64 and out.numel() and not bool(torch.isfinite(out).all()):
        beyond = torch.isinf(out) & torch.isfinite(x.detach().cpu())
        if bool(beyond.any()):
            where = tuple(int(i) for i in beyond.nonzero()[0])
            position = f"row {where[0]}, column {where[1]}" if len(where) == 2 else f"index {where}"
            value = _arrays._number(x.detach().cpu()[where].item())
            raise InvalidBatchError(f"`{name}`: {value} at {position} is outside float32's range")
    return out


def _policy_of(mask: Tensor, name: str, cols: int) -> np.ndarray:
    """bool: where a flat, host, non-bool mask is 1. Any value but 0 and 1 (NaN, 2, -1,
    0.5) is refused, naming its row and column: a NaN would otherwise count as a policy
    token."""
    if mask.dtype.is_complex:
        raise InvalidBatchError(f"`{name}` must be bool or 0/1 numbers, got dtype {mask.dtype}")
    values = mask.float().numpy() if mask.dtype in (torch.bfloat16, torch.float16) else mask.numpy()
    policy: np.ndarray = values == 1  # numpy: no torch dispatch
    bad = ~policy
    bad &= values != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidBatchError(
            f"`{name}` must hold 0 or 1 (1 = policy token), found {values[i].item()!r} at row {i // max(cols, 1)}, "
            f"column {i % max(cols, 1)}"
        )
    return policy


def _host_scores(scores: Any, rows: int) -> np.ndarray:
    """``scores`` (a tensor on any device, an array or a list; one per row) as float32."""
    if isinstance(scores, Tensor):
        scores = scores.detach().cpu()
    s = _arrays.float32(scores, "scores")  # refuses 2-D scores and float64 beyond float32
    if s.shape != (rows,):
        raise InvalidBatchError(f"`scores` has shape {s.shape}, expected ({rows},): one per row")
    return s


def _host(x: Any) -> Any:
    """A tensor on the host (any device in), anything else as it is."""
    return x.detach().cpu() if isinstance(x, Tensor) else x


def _reward_source(
    batch: PaddedBatch,
    token_level_rewards: Tensor | None,
    scores: Any,
    observation_rewards: str,
    turn_rewards: Any = None,
) -> dict[str, Any]:
    _observation.check(observation_rewards)  # a bad setting is refused whichever reward source is given
    estimators.one_reward_source(token_level_rewards=token_level_rewards, scores=scores, turn_rewards=turn_rewards)
    if token_level_rewards is not None:
        return {"rewards": batch.policy_rewards(token_level_rewards, observation_rewards)}
    if turn_rewards is not None:
        if isinstance(turn_rewards, (list, tuple)):
            return {"turn_rewards": [_host(r) for r in turn_rewards]}
        return {"turn_rewards": _host(turn_rewards)}
    return {"scores": _host_scores(scores, batch.shape[0])}


def advantages(
    response_mask: Tensor,
    token_level_rewards: Tensor | None = None,
    *,
    values: Tensor | None = None,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    group_ids: Any = None,
    check_scores: Any = None,
    check_tolerance: float = estimators.CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
    turn_state_ids: Any = None,
    token_ids: Tensor | None = None,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor | None]:
    """Any estimator of the options table over ``(B, L)`` rows, in one call into the Rust
    core (:func:`mpo_rs.advantages`); ``estimator`` (default ``"mae"``) and ``options`` as
    there. Returns ``(advantages, returns)``, ``(B, L)`` tensors, 0 off the policy tokens;
    ``returns`` is None for the group estimators (no critic).

    The critic estimators (mae, gae, bilevel) read ``values`` and exactly one reward source,
    as :func:`mae_advantages` describes them. The group estimators read ``group_ids`` (one
    per row) and one score per row: ``scores``, or the sum of the row's
    ``token_level_rewards`` (as verl's ``grpo`` / ``rloo``). gigpo reads ``group_ids``, one
    reward source and its anchor states, as :func:`gigpo_advantages` describes them. Results
    take the device and floating dtype of ``token_level_rewards`` (of ``values`` with
    ``scores``, the mask's and float32 for a critic-free estimator with ``scores``).
    """
    est = resolve(estimator, options, "mae")
    # Every input given goes to the core, which refuses one the estimator does not read
    # (the input rule of mpo_rs.advantages; docs/reliability.md).
    anchors = {"turn_state_ids": turn_state_ids, "token_ids": token_ids}
    given = _Given(scores, turn_rewards, truncated, check_scores, check_tolerance, group_ids)
    if est.family == "gigpo":
        out = _gigpo(est, response_mask, token_level_rewards, given, anchors, observation_rewards, whiten, values)
        return out, None
    if est.family == "group":
        return _group(est, response_mask, token_level_rewards, given, anchors, whiten, values), None
    return _critic(est, values, response_mask, token_level_rewards, given, anchors, observation_rewards, whiten)


class _Given(NamedTuple):
    """The optional inputs of a critic estimator beside the token rewards."""

    scores: Any
    turn_rewards: Any
    truncated: Any
    check_scores: Any
    check_tolerance: float
    group_ids: Any = None


def _critic(
    est: Estimator,
    values: Tensor | None,
    response_mask: Tensor,
    token_level_rewards: Tensor | None,
    given: _Given,
    anchors: dict[str, Any],
    observation_rewards: str,
    whiten: bool,
) -> tuple[Tensor, Tensor]:
    """The critic estimators' part of :func:`advantages`: flatten, estimate, optionally
    whiten, pad back."""
    if values is None:
        raise MissingCriticValuesError(f"the {est.name} estimator needs the critic's `values` ((B, L))")
    if token_level_rewards is None:
        batch = PaddedBatch.of(response_mask, like=values, like_name="values")
    else:
        _check_tensor(values, "values")
        batch = PaddedBatch.of(response_mask, like=token_level_rewards, like_name="token_level_rewards")
    source = _reward_source(batch, token_level_rewards, given.scores, observation_rewards, given.turn_rewards)
    if given.truncated is not None:
        source["truncated"] = _host(given.truncated)
    if given.check_scores is not None:
        source["check_scores"] = _host(given.check_scores)
    try:
        raw = estimators._estimate(
            est,
            batch.mask_u8,
            batch.offsets,
            batch.flat(values, "values"),
            group_ids=given.group_ids,
            check_tolerance=given.check_tolerance,
            **_anchor_inputs(batch, anchors),
            **source,
        )
    except InvalidBatchError as e:
        if token_level_rewards is None or observation_rewards != "error" or "at observation token" not in str(e):
            raise
        raise InvalidBatchError(
            f"{e} (in `token_level_rewards`, where `response_mask` is 0: an observation or padding "
            'token); pass observation_rewards="credit" to move such a reward to the last policy '
            "token before it in its row (a score written into a padded row's last column), or "
            '"drop" to ignore it'
        ) from None
    adv = raw.advantages
    return batch.padded(batch.whitened(adv) if whiten else adv), batch.padded(raw.returns)


def _group(
    est: Estimator,
    response_mask: Tensor,
    token_level_rewards: Tensor | None,
    given: _Given,
    anchors: dict[str, Any],
    whiten: bool,
    values: Any,
) -> Tensor:
    """The group estimators' part of :func:`advantages`: one score per row, then the core."""
    batch = PaddedBatch.of(response_mask, like=token_level_rewards, like_name="token_level_rewards")
    scores = given.scores
    estimators.one_reward_source(token_level_rewards=token_level_rewards, scores=scores)
    if token_level_rewards is not None:
        row_scores = batch.row_scores(token_level_rewards)
    else:
        row_scores = _host_scores(scores, batch.shape[0])
    if given.group_ids is None:
        raise InvalidBatchError("`group_ids` is missing: give one group id per row")
    adv = estimators._estimate(
        est,
        batch.mask_u8,
        batch.offsets,
        None if values is None else batch.flat(values, "values"),
        scores=row_scores,
        group_ids=given.group_ids,
        truncated=given.truncated,
        **_anchor_inputs(batch, anchors),
    ).advantages
    return batch.padded(batch.whitened(adv) if whiten else adv)


def _gigpo(
    est: Estimator,
    response_mask: Tensor,
    token_level_rewards: Tensor | None,
    given: _Given,
    anchors: dict[str, Any],
    observation_rewards: str,
    whiten: bool,
    values: Tensor | None = None,
) -> Tensor:
    """GiGPO's part of :func:`advantages`: the rows flattened, token ids flat int64."""
    batch = PaddedBatch.of(response_mask, like=token_level_rewards, like_name="token_level_rewards")
    source = _reward_source(batch, token_level_rewards, given.scores, observation_rewards, given.turn_rewards)
    if given.group_ids is None:
        raise InvalidBatchError("`group_ids` is missing: give one group id per row")
    adv = estimators._estimate(
        est,
        batch.mask_u8,
        batch.offsets,
        None if values is None else batch.flat(values, "values"),
        group_ids=given.group_ids,
        truncated=given.truncated,
        check_scores=given.check_scores,
        check_tolerance=given.check_tolerance,
        **_anchor_inputs(batch, anchors),
        **source,
    ).advantages
    return batch.padded(batch.whitened(adv) if whiten else adv)


_NO_ANCHORS: dict[str, Any] = {"turn_state_ids": None, "token_ids": None}


def _anchor_inputs(batch: PaddedBatch, anchors: dict[str, Any]) -> dict[str, Any]:
    """The anchor inputs given, as the core reads them (token ids ``(B, L)`` flattened to
    int64 beside the mask); passed for every estimator, so that one that reads no anchor
    states refuses them."""
    out: dict[str, Any] = {}
    token_ids = anchors["token_ids"]
    if token_ids is not None:
        batch._check_shape(token_ids, "token_ids")
        out["token_ids"] = _arrays.int64(token_ids.detach().cpu().reshape(-1), "token_ids")
    if anchors["turn_state_ids"] is not None:
        out["turn_state_ids"] = _host(anchors["turn_state_ids"])
    return out


def gigpo_advantages(
    response_mask: Tensor,
    token_level_rewards: Tensor | None = None,
    *,
    group_ids: Any,
    scores: Any = None,
    turn_rewards: Any = None,
    turn_state_ids: Any = None,
    token_ids: Tensor | None = None,
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> Tensor:
    """GiGPO (:func:`mpo_rs.gigpo_advantages`) over ``(B, L)`` rows: ``group_ids`` one per
    row, one reward source (``token_level_rewards`` summed per turn, ``scores`` per row,
    ``turn_rewards`` per turn), anchor states as ``turn_state_ids`` (one per turn) or
    ``token_ids`` ``(B, L)`` beside the mask (the first turn's observation is what precedes
    it in the row: nothing, in a response that starts with the policy's tokens, which is
    the prompt the row's group shares). Returns the ``(B, L)`` advantages; GiGPO has no
    critic. :func:`advantages` with ``estimator="gigpo"``, typed."""
    est = estimators.of_family(estimator, options, "gigpo", "gigpo_advantages")
    given = _Given(scores, turn_rewards, None, None, estimators.CHECK_TOLERANCE, group_ids)
    anchors = {"turn_state_ids": turn_state_ids, "token_ids": token_ids}
    return _gigpo(est, response_mask, token_level_rewards, given, anchors, observation_rewards, whiten)


def mae_advantages(
    values: Tensor,
    response_mask: Tensor,
    token_level_rewards: Tensor | None = None,
    *,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = estimators.CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor]:
    """Multiscale advantage estimation (MPO) over ``(B, L)`` rows; a turn is a run of
    policy tokens in a row.

    Exactly one of ``token_level_rewards`` (``(B, L)``), ``scores`` (``(B,)``, placed on
    each row's last policy token) and ``turn_rewards`` (a list of B sequences, one reward
    per turn of the row, placed on each turn's last policy token; or a flat 1-D tensor of
    every turn in row order) is given; ``check_scores=`` (``(B,)``) checks that each row's
    turn rewards sum to it. ``truncated`` (``(B,)`` bools, any device) marks rows cut off
    before their episode ended: their last policy token bootstraps from its own value
    (docs/estimators.md, "Truncation"). ``options`` go to
    :func:`mpo_rs.estimators.mae_advantages` (``lam``, ``lam_intra``, ``beta``, ``gamma``,
    ``lam_critic``, ...). ``observation_rewards`` says what happens to a reward on a token
    where the mask is 0 (:data:`OBSERVATION_REWARDS`); ``whiten=True`` whitens the
    advantages over the batch's policy tokens (:func:`whiten`, on the host). Returns
    ``(advantages, returns)``, ``(B, L)`` tensors, 0 off the policy tokens, on the device and in the floating dtype of ``token_level_rewards``
    (of ``values`` when ``scores`` are given). :func:`advantages` for the mae family, typed.
    """
    est = estimators.of_family(estimator, options, "mae", "mae_advantages")
    given = _Given(scores, turn_rewards, truncated, check_scores, check_tolerance)
    return _critic(est, values, response_mask, token_level_rewards, given, _NO_ANCHORS, observation_rewards, whiten)


def gae_advantages(
    values: Tensor,
    response_mask: Tensor,
    token_level_rewards: Tensor | None = None,
    *,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    check_scores: Any = None,
    check_tolerance: float = estimators.CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor]:
    """Token GAE over the policy tokens of each row, observation tokens skipped (verl's
    multi-turn convention). Arguments and results as
    :func:`mae_advantages`; ``options`` go to :func:`mpo_rs.estimators.gae_advantages`
    (``gamma``, ``lam``, ``lam_critic``, ...; verl's ``returns = advantages + values`` is
    ``lam_critic=lam``). :func:`advantages` for the gae family, typed."""
    est = estimators.of_family(estimator, options, "gae", "gae_advantages")
    given = _Given(scores, turn_rewards, truncated, check_scores, check_tolerance)
    return _critic(est, values, response_mask, token_level_rewards, given, _NO_ANCHORS, observation_rewards, whiten)


def bilevel_advantages(
    values: Tensor,
    response_mask: Tensor,
    token_level_rewards: Tensor | None = None,
    *,
    scores: Any = None,
    turn_rewards: Any = None,
    check_scores: Any = None,
    check_tolerance: float = estimators.CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor]:
    """RAGEN's bi-level GAE over ``(B, L)`` rows; a turn is a run of policy tokens in a row.
    Arguments (the reward sources included) and results as :func:`mae_advantages`, without
    ``truncated`` (RAGEN's estimator defines none); ``options`` go to
    :func:`mpo_rs.estimators.bilevel_advantages` (``lam``, ``gamma``, ``high_level_gamma``).
    RAGEN whitens the advantages over the policy tokens: ``whiten=True``.
    :func:`advantages` for the bilevel family, typed."""
    est = estimators.of_family(estimator, options, "bilevel", "bilevel_advantages")
    given = _Given(scores, turn_rewards, None, check_scores, check_tolerance)
    return _critic(est, values, response_mask, token_level_rewards, given, _NO_ANCHORS, observation_rewards, whiten)


def group_advantages(
    token_level_rewards: Tensor | None,
    response_mask: Tensor,
    group_ids: Any,
    *,
    scores: Any = None,
    whiten: bool = False,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> Tensor:
    """Critic-free group baselines (GRPO, Dr. GRPO, RLOO): one advantage per row, written
    on its policy tokens (0 elsewhere).

    A row's score is ``scores[j]`` or, with ``token_level_rewards``, the sum of the row's
    token rewards (as verl's ``grpo`` / ``rloo``). ``group_ids`` (one per row: ints,
    strings, objects) marks rollouts of one prompt. ``options`` go to
    :func:`mpo_rs.estimators.group_advantages` (``norm_std``, ``eps``, ``leave_one_out``);
    ``whiten`` as in :func:`mae_advantages`. Returns a ``(B, L)`` tensor on the device and in the floating dtype of
    ``token_level_rewards`` (the mask's device and float32 with ``scores``).
    :func:`advantages` for the group family, typed.
    """
    est = estimators.of_family(estimator, options, "group", "group_advantages")
    given = _Given(scores, None, None, None, estimators.CHECK_TOLERANCE, group_ids)
    return _group(est, response_mask, token_level_rewards, given, _NO_ANCHORS, whiten, None)


def whiten(advantages: Tensor, mask: Tensor) -> Tensor:
    """verl's ``masked_whiten`` over the policy tokens: ``(A - mean) / sqrt(var + 1e-8)``
    with the masked mean and the unbiased masked variance; 0 off the policy tokens.

    The statistics are taken in float64 over the policy tokens only; the result has the
    shape and device of ``advantages`` and its dtype when it is floating. Integer (or bool)
    advantages are whitened as the numbers they hold and give torch's default float dtype
    (float32), as verl's ``masked_whiten`` does; they are never truncated back to integers.
    ``mask`` is bool or 0/1 numbers of the same shape (anything else, NaN included, raises
    ``InvalidBatchError``). Fewer than 2 policy tokens raise ``InvalidBatchError`` (verl's
    formula divides by n - 1).
    """
    _check_tensor(advantages, "advantages")
    _check_tensor(mask, "mask")
    if mask.shape != advantages.shape:
        raise InvalidBatchError(
            f"`mask` has shape {tuple(mask.shape)}, expected {tuple(advantages.shape)} like `advantages`"
        )
    if advantages.dtype.is_complex:
        raise InvalidBatchError(f"`advantages` must be real numbers, got dtype {advantages.dtype}")
    if mask.dtype == torch.bool:
        policy = mask.to(device=advantages.device)
    else:
        host = mask.detach().cpu().reshape(-1)
        cols = int(mask.shape[-1]) if mask.dim() else 1
        flat_policy = torch.from_numpy(_policy_of(host, "mask", cols))
        policy = flat_policy.reshape(mask.shape).to(device=advantages.device)
    out_dtype = advantages.dtype if advantages.dtype.is_floating_point else torch.get_default_dtype()
    selected = advantages[policy].double()
    n = selected.shape[0]
    if n < 2:
        raise InvalidBatchError(f"whitening needs at least 2 LLM tokens (policy tokens, mask 1) in the batch, got {n}")
    centred = selected - selected.mean()
    var = torch.dot(centred, centred) / (n - 1)
    out = torch.zeros_like(advantages, dtype=out_dtype)
    out[policy] = (centred / torch.sqrt(var + WHITEN_EPS)).to(out_dtype)
    return out
