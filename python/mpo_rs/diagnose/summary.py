"""The variance decomposition of a critic's values and the one aggregate over it.

MPO rests on a measured fact: a critic's values move mostly at turn boundaries. Per
trajectory, :func:`value_structure` splits the token-weighted variance of the values over
its policy tokens exactly into a between-turn part (turn means around the trajectory mean)
and a within-turn part (tokens around their turn mean), and gives the boundary jumps
ΔV = V_{t+1,1} - V_{t,L_t}. :func:`summarize` turns per-trajectory results into the
paper's aggregates; it is what ``summary.json``, :meth:`Diagnosis.summary
<mpo_rs.diagnose.Diagnosis.summary>` and :func:`summarize_value_structure` return.
Every key is described in docs/diagnostics.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _native
from .._arrays import float32, int64, mask_u8
from ..estimators import Turns
from ..outputs import write_file

__all__ = [
    "JUMP_QUANTILES",
    "MIN_READING_TRAJECTORIES",
    "ON_TURNS_SHARE",
    "PAPER_MEDIAN_BETWEEN_SHARE",
    "WITHIN_TURNS_SHARE",
    "ValueStructure",
    "between_share",
    "format_table",
    "share_reading",
    "summarize",
    "summarize_value_structure",
    "value_structure",
    "write_summary_json",
]

JUMP_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
PAPER_MEDIAN_BETWEEN_SHARE = 0.895
"""The paper's median between-turn share of within-trajectory value variance."""
PAPER_FRACTION_BETWEEN_GT_WITHIN = 0.938
"""The paper's fraction of trajectories with between-turn > within-turn variance."""
ON_TURNS_SHARE = 0.75
"""A median between-turn share at or above this reads "the value lives on turns": three
quarters of the variance or more is between turn means, which MAE's turn-level credit keeps."""
WITHIN_TURNS_SHARE = 0.5
"""A median share below this reads "the value moves within turns": in the median trajectory
the within-turn part, which turn means average away, is the larger one."""
MIN_READING_TRAJECTORIES = 30
"""No reading below this many kept trajectories: the median share's standard error, about
1.25 sd / sqrt(n), is then 0.07 or more for the spread of shares seen in practice (sd ~0.3),
over a quarter of the 0.25 between the two thresholds."""
SUCCESS = "success (outcome > 0)"
FAILURE = "failure (outcome <= 0)"


def between_share(total: npt.NDArray[np.float64], between: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """between / total per trajectory; NaN where the values do not vary at all."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, between / total, np.nan)


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
        return between_share(self.total, self.between)

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


def summarize(
    total: npt.NDArray[np.float64],
    between: npt.NDArray[np.float64],
    within: npt.NDArray[np.float64],
    n_turns: npt.NDArray[np.int64],
    jumps: npt.NDArray[np.float32],
    jump_trajectory: npt.NDArray[np.int64],
    *,
    outcome: Any = None,
    step: npt.NDArray[np.int64] | None = None,
) -> dict[str, Any]:
    """The aggregates over trajectories with at least two turns and varying values (the
    others have no between/within split to speak of): for all of them, split by outcome
    (success = outcome > 0) when ``outcome`` is given and by training step when ``step`` is.

    ``total``, ``between``, ``within``, ``n_turns`` (and ``outcome``, ``step``) hold one
    value per trajectory; ``jumps`` the finite boundary jumps and ``jump_trajectory`` the
    trajectory of each."""
    usable = (n_turns >= 2) & (total > 0)
    share = between_share(total, between)

    def block(sel: npt.NDArray[np.bool_]) -> dict[str, Any]:
        shares = share[sel]
        chosen = jumps[sel[jump_trajectory]] if jumps.size else jumps
        return {
            "trajectories": int(sel.sum()),
            "median_between_share": float(np.median(shares)) if shares.size else None,
            "fraction_between_gt_within": float(np.mean(between[sel] > within[sel])) if shares.size else None,
            "jumps": int(chosen.size),
            "median_abs_jump": float(np.median(np.abs(chosen))) if chosen.size else None,
            "jump_quantiles": (
                {str(q): float(x) for q, x in zip(JUMP_QUANTILES, np.quantile(chosen, JUMP_QUANTILES), strict=True)}
                if chosen.size
                else None
            ),
        }

    everything = block(usable)
    out: dict[str, Any] = {
        "rows": int(total.shape[0]),
        "excluded_fewer_than_two_turns_or_constant": int((~usable).sum()),
        "all": everything,
        "reading": share_reading(everything["median_between_share"], everything["trajectories"]),
    }
    if outcome is not None:
        o = np.asarray(outcome)
        out["by_outcome"] = {SUCCESS: block(usable & (o > 0)), FAILURE: block(usable & (o <= 0))}
    if step is not None:
        out["by_step"] = {str(s): block(usable & (step == s)) for s in np.unique(step)}
    return out


def share_reading(median_share: float | None, trajectories: int | None = None) -> str | None:
    """One line reading a median between-turn share against the paper's and the thresholds
    :data:`ON_TURNS_SHARE` and :data:`WITHIN_TURNS_SHARE`, saying how many trajectories it
    rests on when ``trajectories`` is given, and declining below
    :data:`MIN_READING_TRAJECTORIES` of them; None without a share (no trajectory to measure)."""
    if median_share is None:
        return None
    over = "" if trajectories is None else f" over {trajectories:,} trajector{'y' if trajectories == 1 else 'ies'}"
    head = f"median between-turn share {median_share:.2f}{over}"
    if trajectories is not None and trajectories < MIN_READING_TRAJECTORIES:
        return (
            f"{head}: too few for a reading (at least {MIN_READING_TRAJECTORIES} with two or more turns and "
            "varying values are needed); diagnose a larger log"
        )
    paper = f"(paper: {PAPER_MEDIAN_BETWEEN_SHARE:.3f})"
    if median_share >= ON_TURNS_SHARE:
        return f"{head}: the critic's value lives on turns {paper}; MAE's turn-level credit applies"
    if median_share >= WITHIN_TURNS_SHARE:
        return (
            f"{head}: the critic's value leans to turns but not as strongly as in the paper {paper}; "
            f"MAE's turn-level credit keeps the between-turn part and averages the within-turn part away "
            f"(share < {ON_TURNS_SHARE:g}): compare it with token-level GAE"
        )
    return (
        f"{head}: the critic's value moves within turns, not on them {paper}; MAE's turn-level credit "
        f"would average most of it away (share < {WITHIN_TURNS_SHARE:g}): prefer token-level GAE, "
        "or train the critic longer and diagnose again"
    )


def summarize_value_structure(vs: ValueStructure, outcome: Any = None) -> dict[str, Any]:
    """:func:`summarize` of in-memory results (``mpo_rs.diagnose.summarize_value_structure``); split by
    outcome (success = outcome > 0) when ``outcome`` (one value per trajectory) is given."""
    finite = np.isfinite(vs.jumps)
    jump_trajectory = np.repeat(np.arange(len(vs.total)), vs.n_turns)[finite]
    return summarize(vs.total, vs.between, vs.within, vs.n_turns, vs.jumps[finite], jump_trajectory, outcome=outcome)


def format_table(summary: dict[str, Any]) -> str:
    """The aggregates as a plain-text table."""
    rows = [("all", summary["all"]), *summary.get("by_outcome", {}).items()]
    rows += [(f"step {k}", v) for k, v in summary.get("by_step", {}).items()]

    def fmt(x: float | None, pct: bool = True) -> str:
        return "-" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.3f}")

    lines = [
        f"{'subset':<24} {'trajectories':>12} {'median share':>13} {'between>within':>15} {'median |jump|':>14}",
    ]
    for name, b in rows:
        lines.append(
            f"{name:<24} {b['trajectories']:>12,} {fmt(b['median_between_share']):>13} "
            f"{fmt(b['fraction_between_gt_within']):>15} {fmt(b['median_abs_jump'], False):>14}"
        )
    lines.append(
        f"({summary['rows']:,} trajectories read; {summary['excluded_fewer_than_two_turns_or_constant']:,} "
        f"with fewer than two turns or constant values left out. Paper: median share "
        f"{PAPER_MEDIAN_BETWEEN_SHARE:.1%}, between > within in {PAPER_FRACTION_BETWEEN_GT_WITHIN:.1%}.)"
    )
    reading = share_reading(summary["all"]["median_between_share"], summary["all"]["trajectories"])
    if reading is not None:
        lines.append(f"Reading: {reading}.")
    return "\n".join(lines)


def write_summary_json(summary: dict[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Writes ``summary.json`` into ``out_dir`` whole or not at all, never through a link
    (``mpo_rs.outputs.write_file``)."""
    return write_file(Path(out_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")
