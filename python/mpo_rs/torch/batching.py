"""Batching of the learner: the one flat -> right-padded gather of trajectories, and
fixed-size chunks of rows (numpy arrays; the module itself does not use torch).

A flat batch holds N trajectories token by token, cut by ``offsets`` (int64, N+1);
:func:`pad_rows` gathers some of them into ``(B, L)`` host arrays, right-padded with 0, and
keeps the map back to the flat layout (:attr:`PaddedRows.positions`), so a per-position
model output can be scattered back as ``flat[padded.positions] = out[padded.valid]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["PaddedRows", "chunks", "pad_rows"]


@dataclass
class PaddedRows:
    """Right-padded ``(B, L)`` host arrays of some trajectories, ready for the device."""

    arrays: dict[str, np.ndarray]
    """The gathered arrays by name, padding 0, plus ``attention_mask`` (int64, 1 = token)."""
    valid: np.ndarray
    """bool ``(B, L)``: True on the trajectories' tokens, False on the padding."""
    index: np.ndarray
    """int64 ``(B, L)``: the flat index of every position (0 on the padding)."""
    n_policy_tokens: int = 0
    """Policy tokens (``mask``) in these rows; 0 when no ``mask`` was gathered."""
    n_policy_seqs: int = 0
    """Rows with at least one policy token."""

    @property
    def positions(self) -> np.ndarray:
        """The flat index of every valid position, row by row (``index[valid]``)."""
        out: np.ndarray = self.index[self.valid]
        return out


def pad_rows(flat: dict[str, np.ndarray], offsets: np.ndarray, rows: np.ndarray) -> PaddedRows:
    """Trajectories ``rows`` of the flat arrays ``flat`` (cut by ``offsets``) as ``(B, L)``
    arrays of their own dtypes, L the longest row (at least 1); ``flat["mask"]``, when
    given, counts the policy tokens."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    width = max(int(lengths.max(initial=0)), 1)
    columns = np.arange(width)
    valid = columns[None, :] < lengths[:, None]
    index = np.where(valid, starts[:, None] + columns[None, :], 0)
    arrays = {name: np.where(valid, arr[index], 0).astype(arr.dtype, copy=False) for name, arr in flat.items()}
    arrays["attention_mask"] = valid.astype(np.int64)
    out = PaddedRows(arrays, valid, index)
    mask = arrays.get("mask")
    if mask is not None:
        out.n_policy_tokens = int(mask.sum())
        out.n_policy_seqs = int(mask.any(axis=1).sum())
    return out


def chunks(items: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """Consecutive slices of ``items`` of ``size`` (the last one shorter)."""
    for start in range(0, items.shape[0], size):
        yield items[start : start + size]
