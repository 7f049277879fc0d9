"""Critic metrics on host arrays: :func:`explained_variance`, the one definition used by the
learner's ``critic/explained_variance`` and by ``mpo-rs reproduce``.

The NaN rule (the same as :func:`mpo_rs.torch.losses.value_loss`'s metric): the explained
variance is NaN when there are no tokens or when the returns have (near) zero variance,
Var(G) <= :data:`EV_MIN_RETURN_VAR` -- e.g. every trajectory of a batch got the same
score --, where the ratio says nothing about the critic (dividing by a clamped Var(G)
would read about -1e7).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EV_MIN_RETURN_VAR", "explained_variance"]

EV_MIN_RETURN_VAR = 1e-8
"""At or below this variance of the returns the explained variance is NaN."""


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(G - V) / Var(G) over the given tokens, in float64 (population variances);
    NaN when there are no tokens or Var(G) <= :data:`EV_MIN_RETURN_VAR`."""
    g = np.asarray(returns, dtype=np.float64)
    if g.size == 0:
        return math.nan
    return_var = float(g.var())
    if not return_var > EV_MIN_RETURN_VAR:
        return math.nan
    return 1.0 - float((g - np.asarray(values, dtype=np.float64)).var()) / return_var
