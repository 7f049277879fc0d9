"""The importance ratio of a loss call (private to :mod:`mpo_rs.torch.losses`): the
per-token ratio of each ratio mode, the clip range it is clipped to, and the statistics of
the turns' ratios. See :mod:`mpo_rs.torch.losses` for the construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Reached only through mpo_rs.torch, whose import names the extra when torch is missing.
import torch
from torch import Tensor

from ..exceptions import InvalidOptionError, InvalidRolloutError
from ._layout import (
    Layout,
    as_float,
    bool_mask,
    check_choice,
    check_graded,
    compute_dtype,
    flat_turn_index,
    make_layout,
    turn_index_from_mask,
)

__all__ = [
    "RATIO_MODES",
    "TURN_RATIOS",
    "TURN_RATIO_STATISTICS",
    "Ratio",
    "check_clip_range",
    "compute_ratio",
    "flat_turn_ratio_statistics",
    "importance_ratio",
    "turn_ratio_statistics",
]

RATIO_MODES = ("turn", "token", "sequence")
TURN_RATIOS = ("product", "geo_mean")


def _grouped_log_ratio(
    log_ratio: Tensor, mask_f: Tensor, index: Tensor, n_buckets: int, mean: bool, bound: float
) -> Tensor:
    """Per token, the (detached) sum or mean of ``log_ratio`` over its bucket, clamped to
    ``[-bound, bound]``."""
    with torch.no_grad():
        sums = log_ratio.new_zeros(n_buckets).index_add_(0, index, log_ratio.detach())
        if mean:
            counts = mask_f.new_zeros(n_buckets).index_add_(0, index, mask_f)
            sums = sums / counts.clamp_min(1.0)
        return sums.clamp_(-bound, bound).index_select(0, index)


class _SharedRatio(torch.autograd.Function):
    """rho~ = exp(sg[g] + l - sg[l]) for a per-token log-ratio ``l`` and a detached group
    log-ratio ``g``: the value is exp(g), the gradient w.r.t. ``l`` is exp(g) per token.

    Same numbers as writing the stop-gradient expression out, but without the add, the
    subtract and their backward passes over every token.
    """

    @staticmethod
    def forward(ctx: Any, log_ratio: Tensor, group_log_ratio: Tensor) -> Tensor:
        rho = torch.exp(group_log_ratio)
        ctx.save_for_backward(rho)
        return rho

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_rho: Tensor) -> tuple[Tensor, None]:
        (rho,) = ctx.saved_tensors
        return grad_rho * rho, None


@dataclass(frozen=True)
class Ratio:
    """Per-token importance ratios of one call, flat, with what the loss needs next."""

    rho: Tensor  # ratio used by the surrogate (grad flows to log_prob)
    log_ratio: Tensor  # l = log pi_theta - log pi_old, 0 off-policy
    layout: Layout
    mask_f: Tensor
    num_turns: Tensor | None
    turn_index: Tensor | None  # bucket 1 + turn id per token (see turn_index_from_mask)


def compute_ratio(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    ratio: str,
    turn_ratio: str,
    token_turn: Any,
    offsets: Any,
    log_ratio_clamp: float,
) -> Ratio:
    """The checked ratio of one call with what the loss needs next; the arguments are
    :func:`~mpo_rs.torch.losses.policy_loss`'s."""
    check_graded(log_prob, "log_prob")
    check_choice(ratio, RATIO_MODES, "ratio")
    check_choice(turn_ratio, TURN_RATIOS, "turn_ratio")
    if not log_ratio_clamp > 0.0:
        raise InvalidOptionError(f"`log_ratio_clamp` must be positive, got {log_ratio_clamp}")
    padded = log_prob.dim() == 2
    if padded and token_turn is not None:
        raise InvalidRolloutError(
            "`token_turn` is for flat 1-D inputs; with padded (B, L) inputs the turns are derived from the mask rows"
        )
    if not padded and ratio == "turn" and token_turn is None:
        raise InvalidRolloutError(
            "flat 1-D inputs with ratio='turn' need `token_turn` "
            "(mpo_rs.segment_turns(mask, offsets).token_turn), or pass padded (B, L) tensors"
        )
    dtype = compute_dtype(log_prob)
    mask_b = bool_mask(mask, log_prob)
    layout = make_layout(mask_b, offsets, padded)
    m = layout.mask
    mask_f = m.to(dtype)
    # Zero every off-policy entry first, so padding garbage (even inf/NaN) never reaches
    # a sum, an exp or a gradient.
    new = log_prob.reshape(-1).to(dtype)
    old = as_float(old_log_prob, log_prob, dtype, "old_log_prob").reshape(-1)
    log_ratio = torch.where(m, new - old, 0.0)

    turn_index: Tensor | None = None
    num_turns: Tensor | None = None
    if padded:
        turn_index, num_turns = turn_index_from_mask(mask_b)
    elif token_turn is not None:
        turn_index, num_turns = flat_turn_index(token_turn, m)

    c = float(log_ratio_clamp)
    if ratio == "token":
        rho = torch.exp(log_ratio.clamp(-c, c))
    else:
        if ratio == "turn":
            assert turn_index is not None  # checked above
            group = _grouped_log_ratio(log_ratio, mask_f, turn_index, m.shape[0] + 1, turn_ratio == "geo_mean", c)
        else:  # GSPO-token: geometric mean over the whole sequence
            with torch.no_grad():
                n_tokens = layout.seq_sum(mask_f).clamp_min(1.0)
                seq_log_ratio = (layout.seq_sum(log_ratio.detach()) / n_tokens).clamp_(-c, c)
                group = layout.seq_broadcast(seq_log_ratio)
        # log rho~ = sg[clamp(log rho_t)] + l - sg[l]: forward the group's ratio, backward
        # this token's own grad log pi (scaled by rho_t). The clamp bounds the forward value
        # only; a one-token group gives exactly the token ratio.
        rho = _SharedRatio.apply(log_ratio, group)
    return Ratio(rho, log_ratio, layout, mask_f, num_turns, turn_index)


def importance_ratio(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    *,
    ratio: str = "turn",
    turn_ratio: str = "product",
    token_turn: Any = None,
    offsets: Any = None,
    log_ratio_clamp: float = 20.0,
) -> Tensor:
    """The per-token ratio that :func:`~mpo_rs.torch.losses.policy_loss` clips, shaped like
    ``log_prob``, 1.0 on off-policy tokens. In turn mode every token of a turn holds rho_t,
    and its gradient w.r.t. its own log-prob is rho_t. Arguments as in ``policy_loss``."""
    r = compute_ratio(log_prob, old_log_prob, mask, ratio, turn_ratio, token_turn, offsets, log_ratio_clamp)
    return torch.where(r.layout.mask, r.rho, 1.0).reshape(log_prob.shape)


def check_clip_range(
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    names: tuple[str, str, str] = ("clip_low", "clip_high", "dual_clip"),
) -> None:
    """Raises InvalidOptionError unless ``0 <= clip_low < 1``, ``clip_high >= 0`` and ``dual_clip``
    is None or greater than 1; ``names`` are the caller's names of the three settings."""
    low_name, high_name, dual_name = names
    if not 0.0 <= clip_low < 1.0 or not clip_high >= 0.0:
        raise InvalidOptionError(f"need 0 <= {low_name} < 1 and {high_name} >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise InvalidOptionError(f"`{dual_name}` must be greater than 1 (or None), got {dual_clip}")


TURN_RATIO_STATISTICS = tuple(
    f"turn_ratio_{form}_{stat}" for form in ("product", "geo") for stat in ("mean", "min", "max", "outside_clip")
)
"""The metric names of :func:`~mpo_rs.torch.losses.policy_loss`'s turn-ratio statistics
(when the turns are known)."""


def turn_ratio_statistics(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    token_turn: Any = None,
) -> dict[str, Tensor]:
    """The turn-ratio statistics :func:`~mpo_rs.torch.losses.policy_loss` reports
    (:data:`TURN_RATIO_STATISTICS`), alone, for a loss of your own (verl's ``mpo`` loss mode uses it): per turn, the product
    and geometric-mean ratios before any clamp or clip; their mean, min, max over the turns
    and the share outside ``[1 - clip_low, 1 + clip_high]``. Detached 0-dim tensors, no host
    synchronisation. Padded ``(B, L)`` inputs, or flat ones with ``token_turn``, as in
    ``policy_loss``."""
    check_graded(log_prob, "log_prob")
    check_clip_range(clip_low, clip_high, None)
    padded = log_prob.dim() == 2
    if padded and token_turn is not None:
        raise InvalidRolloutError("`token_turn` is for flat 1-D inputs; padded (B, L) rows give the turns")
    if not padded and token_turn is None:
        raise InvalidRolloutError(
            "flat 1-D inputs need `token_turn` (mpo_rs.segment_turns(mask, offsets).token_turn) for the turn ratios"
        )
    dtype = compute_dtype(log_prob)
    mask_b = bool_mask(mask, log_prob)
    m = mask_b.reshape(-1)
    with torch.no_grad():
        new = log_prob.detach().reshape(-1).to(dtype)
        old = as_float(old_log_prob, log_prob, dtype, "old_log_prob").reshape(-1)
        log_ratio = torch.where(m, new - old, 0.0)
        index, _ = turn_index_from_mask(mask_b) if padded else flat_turn_index(token_turn, m)
        return flat_turn_ratio_statistics(log_ratio, m.to(dtype), index, clip_low, clip_high)


def flat_turn_ratio_statistics(
    log_ratio: Tensor,
    mask_f: Tensor,
    turn_index: Tensor,
    clip_low: float,
    clip_high: float,
    compact: bool | None = None,
) -> dict[str, Tensor]:
    """One ratio per turn, in both forms, before any clamp or clip: the product
    rho_t = exp(sum_i l_{t,i}) and the geometric mean exp(mean_i l_{t,i}). Their mean, min
    and max over the batch's turns (each turn counts once) and the share of turns outside
    ``[1 - clip_low, 1 + clip_high]``; NaN without turns. No host synchronisation: on CPU
    (``compact``, the default there) the turns' buckets are selected first, elsewhere every
    bucket is reduced with a mask."""
    n_buckets = mask_f.shape[0] + 1
    lr = log_ratio.detach()
    sums = lr.new_zeros(n_buckets).index_add_(0, turn_index, lr)
    counts = mask_f.new_zeros(n_buckets).index_add_(0, turn_index, mask_f)
    # Every turn holds a policy token; empty buckets (bucket 0, unused ids) are not turns.
    is_turn = counts > 0
    nan = torch.full((), float("nan"), dtype=lr.dtype, device=lr.device)
    if compact is None:
        compact = lr.device.type == "cpu"
    if compact:
        # No device to synchronise with: keep only the turns' buckets (far fewer than B*L+1).
        sums, counts = sums[is_turn], counts[is_turn]
        weight = None
        n_turns = torch.tensor(float(sums.shape[0]), dtype=lr.dtype)
    else:
        weight = is_turn.to(lr.dtype)
        n_turns = weight.sum()
    has_turns = n_turns > 0
    denominator = n_turns.clamp_min(1.0)
    out: dict[str, Tensor] = {}
    for form, log_rho in (("product", sums), ("geo", sums / counts.clamp_min(1.0))):
        rho = torch.exp(log_rho)
        if weight is None:
            total = rho.sum()
            low = torch.exp(log_rho.amin()) if log_rho.numel() else nan
            high = torch.exp(log_rho.amax()) if log_rho.numel() else nan
        else:
            # Non-turn buckets hold log-ratio 0: out of the sum by the weight, out of the
            # extremes by +-inf.
            total = torch.dot(rho, weight)
            low = torch.exp(torch.where(is_turn, log_rho, float("inf")).amin())
            high = torch.exp(torch.where(is_turn, log_rho, float("-inf")).amax())
        # A non-turn bucket's ratio is exactly 1, inside every clip range: no mask needed.
        outside = ((rho < 1.0 - clip_low) | (rho > 1.0 + clip_high)).sum().to(lr.dtype)
        out[f"turn_ratio_{form}_mean"] = torch.where(has_turns, total / denominator, nan)
        out[f"turn_ratio_{form}_min"] = torch.where(has_turns, low, nan)
        out[f"turn_ratio_{form}_max"] = torch.where(has_turns, high, nan)
        out[f"turn_ratio_{form}_outside_clip"] = torch.where(has_turns, outside / denominator, nan)
    return out
