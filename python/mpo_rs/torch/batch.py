"""The learner's rollout batch: N trajectories flat token by token, as host arrays (needs
torch only to accept tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from ..estimators import as_group_ids
from ..exceptions import InvalidBatchError, InvalidRolloutError

__all__ = ["RolloutBatch"]


def _host(x: Any, name: str) -> np.ndarray:
    """A host numpy view of an array-like (torch tensors are moved and detached)."""
    if isinstance(x, Tensor):
        x = x.detach().cpu()
        x = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        out: np.ndarray = x.numpy()
        return out
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise InvalidRolloutError(f"`{name}` cannot be read as an array: {e}") from None


@dataclass
class RolloutBatch:
    """N trajectories, flat token by token, as host arrays: trajectory j is tokens
    ``offsets[j]:offsets[j+1]`` of every per-token array."""

    token_ids: npt.NDArray[np.int64]
    """int64[T]: every token of every trajectory (prompt, actions, observations)."""
    mask: npt.NDArray[np.bool_]
    """bool[T]: True on tokens the policy generated."""
    offsets: npt.NDArray[np.int64]
    """int64[N+1]: trajectory j is tokens ``offsets[j]:offsets[j+1]``."""
    old_log_probs: npt.NDArray[np.float32] | None = None
    """float32[T]: behaviour-policy log-probs; None = recompute with the current policy."""
    rewards: npt.NDArray[np.float32] | None = None
    """float32[T]: token rewards (zero off-policy); or give ``scores``."""
    scores: npt.NDArray[np.float32] | None = None
    """float32[N]: one outcome reward per trajectory."""
    group_ids: Any = None
    """[N]: rollouts of one prompt share an id (needed by the group estimators). Ids
    follow the group-id rule of :func:`mpo_rs.estimators.group_codes`: numbers compare by
    value, strings are a kind of their own (``1`` and ``"1"`` are two groups), so a list
    is kept as an object array rather than stringified by numpy."""
    values: npt.NDArray[np.float32] | None = None
    """float32[T]: critic values at rollout time; None = computed by the learner's critic."""

    def __post_init__(self) -> None:
        self.token_ids = np.ascontiguousarray(_host(self.token_ids, "token_ids"), dtype=np.int64)
        self.mask = np.ascontiguousarray(_host(self.mask, "mask")).astype(bool, copy=False)
        self.offsets = np.ascontiguousarray(_host(self.offsets, "offsets"), dtype=np.int64)
        n_tokens = self.token_ids.shape[0]
        if self.token_ids.ndim != 1 or self.mask.shape != (n_tokens,):
            raise InvalidRolloutError(
                f"`token_ids` and `mask` must be flat and of one length, got shapes "
                f"{self.token_ids.shape} and {self.mask.shape}"
            )
        o = self.offsets
        if o.ndim != 1 or o.shape[0] < 1 or o[0] != 0 or o[-1] != n_tokens or np.any(np.diff(o) < 0):
            raise InvalidRolloutError(
                f"`offsets` must be int64[N+1], start at 0, never decrease and end at the "
                f"token count {n_tokens}; got {o[:8]}{'...' if o.shape[0] > 8 else ''}"
            )
        for name in ("old_log_probs", "rewards", "values"):
            arr = getattr(self, name)
            if arr is not None:
                arr = np.ascontiguousarray(_host(arr, name), dtype=np.float32)
                if arr.shape != (n_tokens,):
                    raise InvalidRolloutError(f"`{name}` has shape {arr.shape}, expected ({n_tokens},)")
                setattr(self, name, arr)
        if self.scores is not None:
            self.scores = np.ascontiguousarray(_host(self.scores, "scores"), dtype=np.float32)
            if self.scores.shape != (self.n_trajectories,):
                raise InvalidRolloutError(f"`scores` has shape {self.scores.shape}, expected ({self.n_trajectories},)")
        if (self.rewards is None) == (self.scores is None):
            raise InvalidRolloutError("give exactly one of `rewards` (token-level) and `scores` (one per trajectory)")
        if self.group_ids is not None:
            ids = _host(self.group_ids, "group_ids") if isinstance(self.group_ids, Tensor) else self.group_ids
            try:
                self.group_ids = as_group_ids(ids)
            except InvalidBatchError as e:
                raise InvalidRolloutError(str(e)) from None
            if self.group_ids.shape != (self.n_trajectories,):
                raise InvalidRolloutError(
                    f"`group_ids` has shape {self.group_ids.shape}, expected ({self.n_trajectories},)"
                )
        lengths = np.diff(o)
        first_is_policy = self.mask[o[:-1][lengths > 0]]
        if first_is_policy.any():
            j = int(np.flatnonzero(lengths > 0)[np.argmax(first_is_policy)])
            raise InvalidRolloutError(
                f"trajectory {j} starts with a policy token; the first token has no context "
                "to be scored from (prepend the prompt)"
            )

    @property
    def n_trajectories(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        return np.diff(self.offsets)

    def trajectory_scores(self) -> npt.NDArray[np.float32]:
        """One outcome per trajectory: ``scores``, or the sum of its token rewards."""
        if self.scores is not None:
            return self.scores
        assert self.rewards is not None
        traj_of_token = np.repeat(np.arange(self.n_trajectories), self.lengths)
        return np.bincount(traj_of_token, weights=self.rewards, minlength=self.n_trajectories).astype(np.float32)

    @classmethod
    def from_padded(
        cls,
        input_ids: Any,
        attention_mask: Any,
        response_mask: Any,
        *,
        old_log_probs: Any = None,
        rewards: Any = None,
        scores: Any = None,
        group_ids: Any = None,
        values: Any = None,
    ) -> RolloutBatch:
        """Builds a batch from ``(B, L)`` rows, one trajectory per row; the tokens kept are
        those with ``attention_mask`` set (left or right padding), in row order."""
        ids = _host(input_ids, "input_ids")
        if ids.ndim != 2:
            raise InvalidRolloutError(f"`input_ids` must be (B, L), got shape {ids.shape}")
        keep = _host(attention_mask, "attention_mask").astype(bool)
        if keep.shape != ids.shape:
            raise InvalidRolloutError(f"`attention_mask` has shape {keep.shape}, expected {ids.shape}")

        def flat(x: Any, name: str) -> np.ndarray | None:
            if x is None:
                return None
            arr = _host(x, name)
            if arr.shape != ids.shape:
                raise InvalidRolloutError(f"`{name}` has shape {arr.shape}, expected {ids.shape}")
            kept: np.ndarray = arr[keep]
            return kept

        offsets = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int64)
        return cls(
            token_ids=ids[keep],
            mask=flat(response_mask, "response_mask").astype(bool),  # type: ignore[union-attr]
            offsets=offsets,
            old_log_probs=flat(old_log_probs, "old_log_probs"),
            rewards=flat(rewards, "rewards"),
            scores=scores,
            group_ids=group_ids,
            values=flat(values, "values"),
        )
