"""Does the critic's value structure live on the turn scale? (spec section 6)

MPO rests on a measured fact: a critic's values move mostly at turn boundaries. Per
trajectory, :func:`value_structure` splits the token-weighted variance of the values over
its policy tokens exactly into a between-turn part (turn means around the trajectory mean)
and a within-turn part (tokens around their turn mean), and gives the boundary jumps
ΔV = V_{t+1,1} - V_{t,L_t}. :func:`summarize` turns that into the paper's aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _native
from ._arrays import float32, int64, mask_u8
from .estimators import Turns

__all__ = ["ValueStructure", "value_structure", "summarize"]


@dataclass(frozen=True, eq=False)
class ValueStructure:
    total: npt.NDArray[np.float64]
    """Per trajectory: token-weighted (population) variance of V over its policy tokens."""
    between: npt.NDArray[np.float64]
    """Per trajectory: sum_t L_t (mean_t - mean)^2 / n."""
    within: npt.NDArray[np.float64]
    """Per trajectory: sum_t sum_i (V_ti - mean_t)^2 / n; between + within = total."""
    jumps: npt.NDArray[np.float32]
    """Per turn: V of the next turn's first token minus V of this turn's last token; NaN for
    the last turn of each trajectory."""
    turns: Turns

    @property
    def between_share(self) -> npt.NDArray[np.float64]:
        """between / total per trajectory; NaN where the values do not vary at all."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.total > 0, self.between / self.total, np.nan)

    @property
    def n_turns(self) -> npt.NDArray[np.int64]:
        return np.diff(self.turns.traj_offsets)


def value_structure(values: Any, mask: Any, offsets: Any) -> ValueStructure:
    """The variance decomposition and boundary jumps of every trajectory (Rust, parallel).
    Values are read on policy tokens only and must be finite there."""
    total, between, within, jumps, turns = _native.value_structure(
        float32(values, "values"), mask_u8(mask), int64(offsets, "offsets")
    )
    return ValueStructure(total, between, within, jumps, Turns(*turns))


def summarize(vs: ValueStructure, outcome: Any = None) -> dict[str, Any]:
    """The paper's aggregates over trajectories with at least two turns and varying values:
    median between-turn share, fraction with between > within, jump quantiles; split by
    outcome (e.g. success = score > 0) when ``outcome`` (one value per trajectory) is given.
    """
    multi = (vs.n_turns >= 2) & (vs.total > 0)

    def block(sel: npt.NDArray[np.bool_]) -> dict[str, Any]:
        share = vs.between_share[sel]
        traj_of_turn = np.repeat(np.arange(len(vs.total)), vs.n_turns)
        jumps = vs.jumps[np.isin(traj_of_turn, np.flatnonzero(sel))]
        jumps = jumps[np.isfinite(jumps)]
        q = [0.05, 0.25, 0.5, 0.75, 0.95]
        return {
            "trajectories": int(sel.sum()),
            "median_between_share": float(np.median(share)) if share.size else None,
            "fraction_between_gt_within": float(np.mean(vs.between[sel] > vs.within[sel])) if share.size else None,
            "jump_abs_median": float(np.median(np.abs(jumps))) if jumps.size else None,
            "jump_quantiles": dict(zip(map(str, q), np.quantile(jumps, q).tolist())) if jumps.size else None,
        }

    out: dict[str, Any] = {"all": block(multi)}
    if outcome is not None:
        o = np.asarray(outcome)
        for label, sel in (("success", o > 0), ("failure", o <= 0)):
            out[label] = block(multi & sel)
    return out
