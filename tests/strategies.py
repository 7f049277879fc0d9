"""Hypothesis strategies for ragged multi-turn batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st


@dataclass
class Batch:
    values: np.ndarray  # float32[T]; NaN on observation tokens (never read)
    mask: np.ndarray  # bool[T]
    offsets: np.ndarray  # int64[N+1]
    rewards: np.ndarray  # float32[T], zero off-policy
    scores: np.ndarray  # float32[N]

    @property
    def n(self) -> int:
        return len(self.offsets) - 1


finite = st.floats(-4, 4, allow_nan=False, width=32)


@st.composite
def trajectory(draw, max_runs: int = 6, max_run: int = 6) -> list[int]:
    """A mask: alternating observation and policy runs, possibly empty."""
    mask: list[int] = []
    policy = draw(st.booleans())
    for _ in range(draw(st.integers(0, max_runs))):
        mask += [int(policy)] * draw(st.integers(1, max_run))
        policy = not policy
    return mask


@st.composite
def batches(draw, max_traj: int = 6, dense_rewards: bool | None = None) -> Batch:
    masks = draw(st.lists(trajectory(), min_size=0, max_size=max_traj))
    mask = np.array([m for traj in masks for m in traj], dtype=bool)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in masks])]).astype(np.int64)
    n_tok = len(mask)
    values = np.array(draw(st.lists(finite, min_size=n_tok, max_size=n_tok)), dtype=np.float32)
    values[~mask] = np.nan
    dense = draw(st.booleans()) if dense_rewards is None else dense_rewards
    if dense:
        rewards = np.array(draw(st.lists(finite, min_size=n_tok, max_size=n_tok)), dtype=np.float32)
        rewards[~mask] = 0.0
    else:  # one terminal reward on each trajectory's last policy token
        rewards = np.zeros(n_tok, dtype=np.float32)
        for j in range(len(masks)):
            pol = np.flatnonzero(mask[offsets[j] : offsets[j + 1]])
            if pol.size:
                rewards[offsets[j] + pol[-1]] = draw(finite)
    scores = np.array(draw(st.lists(finite, min_size=len(masks), max_size=len(masks))), dtype=np.float32)
    return Batch(values, mask, offsets, rewards, scores)


unit = st.floats(0.0, 1.0)
mae_params = st.fixed_dictionaries(
    {
        "lam": unit,
        "lam_intra": unit,
        "beta": st.floats(0.0, 2.0),
        "gamma": st.floats(0.05, 1.0),
        "lam_critic": unit,
    }
)
gae_params = st.fixed_dictionaries({"gamma": st.floats(0.05, 1.0), "lam": unit, "lam_critic": unit})
