"""Where the tokens of a loss call sit (private to :mod:`mpo_rs.torch.losses`): the
inputs read as tensors on the log-probs' device, the flat view of padded ``(B, L)`` or flat
``(T,)`` inputs with their grouping by sequence, and the turn buckets of either layout.
Nothing in here reads a device value back to the host."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

# Reached only through mpo_rs.torch, whose import names the extra when torch is missing.
import torch
from torch import Tensor

from ..exceptions import InvalidOptionError, InvalidRolloutError

__all__ = [
    "Layout",
    "as_float",
    "bool_mask",
    "check_choice",
    "check_graded",
    "compute_dtype",
    "flat_turn_index",
    "make_layout",
    "turn_index_from_mask",
]


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where the tokens of a loss call sit: every per-token tensor is viewed flat, and the
    layout knows how to group flat tokens by sequence."""

    mask: Tensor  # bool[n], True on policy tokens
    padded_shape: tuple[int, int] | None  # (B, L) for padded inputs, None for flat
    offsets: Tensor | None  # int64[N+1] on the device, flat inputs only

    @property
    def n_seqs(self) -> int | None:
        if self.padded_shape is not None:
            return self.padded_shape[0]
        return None if self.offsets is None else int(self.offsets.shape[0]) - 1

    @cached_property
    def seq_index(self) -> Tensor:
        """Sequence id of every flat token (int64[n]); computed once per call."""
        if self.padded_shape is not None:
            cols = self.padded_shape[1]
            return torch.arange(self.mask.shape[0], device=self.mask.device) // cols
        if self.offsets is None:
            raise InvalidRolloutError(
                "flat inputs need `offsets=` (int64[N+1], trajectory j is tokens "
                "offsets[j]:offsets[j+1]) for ratio='sequence' and the seq-mean aggregations"
            )
        positions = torch.arange(self.mask.shape[0], device=self.mask.device)
        return torch.searchsorted(self.offsets[1:], positions, right=True)

    def seq_sum(self, x: Tensor) -> Tensor:
        """Per-sequence sums of a flat tensor that is already zero off-policy."""
        if self.padded_shape is not None:
            return x.reshape(self.padded_shape).sum(dim=1)
        index = self.seq_index  # raises if flat inputs lack `offsets`
        return x.new_zeros(self.n_seqs).index_add_(0, index, x)  # type: ignore[arg-type]

    def seq_broadcast(self, per_seq: Tensor) -> Tensor:
        """A per-sequence value on every flat token of its sequence."""
        if self.padded_shape is not None:
            return per_seq[:, None].expand(self.padded_shape).reshape(-1)
        return per_seq.index_select(0, self.seq_index)


def to_device(x: Any, device: torch.device, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.to(device, non_blocking=True)
    try:
        return torch.as_tensor(np.asarray(x), device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidRolloutError(f"`{name}` cannot be read as a tensor: {e}") from None


def as_float(x: Any, like: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    t = to_device(x, like.device, name)
    if not (t.dtype.is_floating_point or t.dtype in (torch.int32, torch.int64)):
        raise InvalidRolloutError(f"`{name}` must be a real-valued tensor, got dtype {t.dtype}")
    if t.shape != like.shape:
        raise InvalidRolloutError(f"`{name}` has shape {tuple(t.shape)}, expected {tuple(like.shape)}")
    return t.to(dtype)


def bool_mask(mask: Any, like: Tensor) -> Tensor:
    m = to_device(mask, like.device, "mask")
    if m.shape != like.shape:
        raise InvalidRolloutError(f"`mask` has shape {tuple(m.shape)}, expected {tuple(like.shape)}")
    if m.dtype == torch.bool:
        return m
    if m.dtype.is_complex:
        raise InvalidRolloutError(f"`mask` must be bool or 0/1 numbers, got dtype {m.dtype}")
    return m != 0  # any nonzero entry marks a policy token (no value check: it would sync)


def compute_dtype(x: Tensor) -> torch.dtype:
    # bf16/fp16 log-probs are upcast: exp() of a sum of many of them must not round.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_graded(x: Any, name: str) -> None:
    """``x`` is what a loss differentiates (``log_prob``, the critic's ``values``): a floating
    tensor, padded ``(B, L)`` or flat ``(T,)``; else ``InvalidRolloutError`` naming it."""
    if not isinstance(x, Tensor):
        raise InvalidRolloutError(f"`{name}` must be a torch.Tensor (it carries the gradient), got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise InvalidRolloutError(f"`{name}` must be floating point, got {x.dtype}")
    if x.dim() not in (1, 2):
        raise InvalidRolloutError(f"`{name}` must be padded (B, L) or flat (T,), got shape {tuple(x.shape)}")


def check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise InvalidOptionError(f"unknown {name}={value!r}; expected one of {', '.join(map(repr, allowed))}")


def is_host(x: Any) -> bool:
    return not isinstance(x, Tensor) or x.device.type == "cpu"


def host_numpy(x: Any) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, Tensor) else np.asarray(x)


def make_layout(mask: Tensor, offsets: Any, padded: bool) -> Layout:
    if padded:
        if offsets is not None:
            raise InvalidRolloutError("`offsets` is for flat 1-D inputs; padded rows are the sequences")
        rows, cols = mask.shape
        return Layout(mask.reshape(-1), (rows, cols), None)
    offs = None
    if offsets is not None:
        if is_host(offsets):  # validate what is free to validate
            o = host_numpy(offsets)
            if o.ndim != 1 or o.shape[0] < 1 or o.dtype.kind not in "iu":
                raise InvalidRolloutError(
                    f"`offsets` must be a 1-D integer array of N+1 entries, got {o.dtype} {o.shape}"
                )
            if o[0] != 0 or o[-1] != mask.shape[0] or np.any(np.diff(o) < 0):
                raise InvalidRolloutError(
                    f"`offsets` must start at 0, be non-decreasing and end at the token count "
                    f"{mask.shape[0]}; got offsets[0]={o[0]}, offsets[-1]={o[-1]}"
                )
        offs = to_device(offsets, mask.device, "offsets").to(torch.int64)
    return Layout(mask, None, offs)


# --------------------------------------------------------------------------- turns


def turn_index_from_mask(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Turn buckets of a padded ``(B, L)`` mask, computed on its device without a loop.

    A turn starts where a row's mask goes 0 -> 1 (column 0 counts as preceded by 0), so a
    turn never spans rows. Returns ``(index, num_turns)``: ``index`` (int64[B*L]) is the
    running count of turn starts in row-major order, i.e. 1 + the global turn id on policy
    tokens (0 for off-policy tokens before the first turn; other off-policy tokens carry
    the previous turn's bucket and must be zeroed by the caller); ``num_turns`` is a 0-dim
    tensor. Buckets fit in ``B*L + 1`` slots.
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    previous = torch.zeros_like(m)
    previous[:, 1:] = m[:, :-1]
    starts = (m & ~previous).reshape(-1)
    index = torch.cumsum(starts, dim=0)  # int64
    return index, starts.sum()


def flat_turn_index(token_turn: Any, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Turn buckets (1 + turn id, 0 off-policy) of flat inputs from ``token_turn``."""
    n = mask.shape[0]
    if is_host(token_turn):
        tt = host_numpy(token_turn)
        if tt.dtype.kind not in "iu":
            raise InvalidRolloutError(f"`token_turn` must hold integer turn ids, got dtype {tt.dtype}")
        if tt.shape != (n,):
            raise InvalidRolloutError(f"`token_turn` has shape {tt.shape}, expected ({n},) like the log-probs")
        if n and (tt.min() < -1 or tt.max() >= n):
            bad = int(np.flatnonzero((tt < -1) | (tt >= n))[0])
            raise InvalidRolloutError(
                f"`token_turn` must hold -1 (off-policy) or a turn id below the token count {n}; "
                f"found {tt[bad]} at token {bad}. Use mpo_rs.segment_turns(mask, offsets).token_turn "
                "of exactly these tokens"
            )
        if mask.device.type == "cpu":
            disagree = np.flatnonzero((tt >= 0) != mask.numpy())
            if disagree.size:
                i = int(disagree[0])
                raise InvalidRolloutError(
                    f"`token_turn` and `mask` disagree at token {i}: token_turn={tt[i]}, "
                    f"mask={bool(mask[i])} (turn ids are -1 exactly off-policy)"
                )
    turn = to_device(token_turn, mask.device, "token_turn")
    if turn.dtype.is_floating_point or turn.dtype == torch.bool or turn.shape != (n,):
        raise InvalidRolloutError(f"`token_turn` must be an integer tensor of shape ({n},)")
    turn = turn.to(torch.int64)
    # A turn starts where the id changes to a non-negative one.
    previous = torch.cat([turn.new_full((1,), -1), turn[:-1]])
    num_turns = ((turn >= 0) & (turn != previous)).sum()
    index = torch.where(mask, turn + 1, 0)
    return index, num_turns
