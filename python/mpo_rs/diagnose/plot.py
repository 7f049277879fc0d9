"""The figures of ``mpo-rs diagnose -o``: the between-turn share over trajectories, the
boundary jumps, and the paper's Figure 2 (token values, turn means and jumps) for chosen
trajectories. matplotlib is imported only when a figure is drawn; without it,
:func:`write_report` raises :class:`mpo_rs.MissingDependencyError` naming the ``plot``
extra (after writing summary.json)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _native
from .._deps import require
from ..outputs import figure_bytes, write_file
from .read import Diagnosis, TrajectoryTrace
from .summary import PAPER_MEDIAN_BETWEEN_SHARE, value_structure, write_summary_json

__all__ = ["jump_figure", "require_matplotlib", "share_figure", "trace_figure", "write_report"]

TOOL = "diagnose"
"""The tool named in a report directory's marker."""
REPORT_DIR = "REPORT_DIR"
"""How messages name the report directory."""


def require_matplotlib() -> None:
    require("matplotlib", "mpo-rs diagnose", "plot")


def write_report(
    diag: Diagnosis,
    out_dir: str | os.PathLike[str],
    *,
    figures: bool = True,
    overwrite: bool = False,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> list[Path]:
    """Writes summary.json and, with ``figures``, the PNG figures; returns the paths
    written. summary.json is written first (atomically), so it is there even when the
    figures fail; figures without matplotlib raise MissingDependencyError naming the
    ``plot`` extra.

    ``out_dir`` must be new, empty, or an earlier report (it holds the ``.mpo-rs-output``
    marker naming diagnose), else :class:`mpo_rs.InvalidOptionError` is raised before
    anything is written; ``overwrite`` writes into any directory. The directory is created
    and marked as a report of diagnose (docs/reliability.md, "Output safety"); it must not
    be, contain or lie inside one of ``inputs`` (the logs read). Every file is written
    whole and never through a link (a symlink in the report is replaced, not followed)."""
    _native.claim_output_dir(out_dir, TOOL, overwrite=overwrite, label=REPORT_DIR, inputs=list(inputs))
    out = Path(out_dir)
    written = [write_summary_json(diag.summary(), out)]
    if not figures:
        return written
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, draw in (("share_histogram.png", share_figure), ("jump_distribution.png", jump_figure)):
        fig = draw(plt, diag)
        written.append(write_file(out / name, figure_bytes(fig, dpi=120)))
        plt.close(fig)

    for tr in diag.traces:
        written.append(_trace_figure(plt, tr, out / f"trajectory_{tr.row}.png"))
    return written


SUCCESS_COLOR, FAILURE_COLOR = "#4c9a2a", "#c0392b"


def _legend_outside(ax: Any) -> None:
    """The legend above the plot area, never over the bars or lines."""
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02, 1.0, 0.2), mode="expand", ncols=2, fontsize=8, frameon=False)


def share_figure(plt: Any, diag: Diagnosis) -> Any:
    """The between-turn share over trajectories: successes and failures side by side, the
    median and the paper's median as reference lines."""
    usable = (diag.n_turns >= 2) & (diag.total > 0)
    share = diag.between_share[usable]
    success = diag.outcome[usable] > 0
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    ax.hist(
        [share[success], share[~success]],
        bins=np.linspace(0, 1, 21).tolist(),
        color=[SUCCESS_COLOR, FAILURE_COLOR],
        label=[f"success ({int(success.sum()):,})", f"failure ({int((~success).sum()):,})"],
    )
    if share.size:
        median = float(np.median(share))
        ax.axvline(median, color="k", ls="--", lw=1.2, label=f"median here {median:.1%}")
    ax.axvline(
        PAPER_MEDIAN_BETWEEN_SHARE,
        color="#7f7f7f",
        ls=":",
        lw=1.6,
        label=f"paper median {PAPER_MEDIAN_BETWEEN_SHARE:.1%}",
    )
    ax.set_xlim(0, 1)
    ax.set(xlabel="between-turn share of value variance (per trajectory)", ylabel="trajectories")
    ax.set_title("Where does the critic's value variance live?", pad=34)
    _legend_outside(ax)
    return fig


def jump_figure(plt: Any, diag: Diagnosis) -> Any:
    """Boundary jumps of successes and failures side by side (not stacked)."""
    succ = diag.outcome[diag.jump_row] > 0 if diag.jumps.size else np.zeros(0, bool)
    lim = float(np.quantile(np.abs(diag.jumps), 0.995)) if diag.jumps.size else 1.0
    bins = np.linspace(-lim, lim, 31).tolist() if lim > 0 else 10
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    ax.hist(
        [diag.jumps[succ], diag.jumps[~succ]],
        bins=bins,
        label=[f"success ({int(succ.sum()):,} boundaries)", f"failure ({int((~succ).sum()):,})"],
        color=[SUCCESS_COLOR, FAILURE_COLOR],
    )
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel=r"boundary jump $\Delta V = V_{t+1,1} - V_{t,L_t}$", ylabel="turn boundaries")
    ax.set_title("Value jumps at turn boundaries", pad=34)
    _legend_outside(ax)
    return fig


def _trace_figure(plt: Any, tr: TrajectoryTrace, path: Path) -> Path:
    fig = trace_figure(plt, tr)
    written = write_file(path, figure_bytes(fig, dpi=120))
    plt.close(fig)
    return written


def trace_figure(plt: Any, tr: TrajectoryTrace) -> Any:
    """Figure 2 of the paper for one trajectory: token values, turn means, jumps. The jump
    labels sit in a band above the highest value and the legend right of the plot, so that
    neither covers the data."""
    vs = value_structure(tr.values, tr.mask, [0, len(tr.mask)])
    fig, ax = plt.subplots(figsize=(10, 3.8), layout="constrained")
    pos = np.arange(len(tr.mask))
    policy = tr.values[tr.mask.astype(bool)]
    low, high = (float(policy.min()), float(policy.max())) if policy.size else (0.0, 1.0)
    span = high - low or 1.0
    label_y = high + 0.08 * span
    for k, (s, e) in enumerate(zip(vs.turns.starts, vs.turns.ends, strict=True)):
        ax.plot(pos[s:e], tr.values[s:e], lw=0.8, color="#3b75af", label="token values" if k == 0 else None)
        ax.hlines(
            tr.values[s:e].astype(np.float64).mean(),
            s,
            e - 1,
            color="#e67e22",
            lw=2.2,
            label="turn mean" if k == 0 else None,
        )
        if k + 1 < vs.turns.n_turns:
            nxt = vs.turns.starts[k + 1]
            ax.annotate(
                "",
                xy=(nxt, tr.values[nxt]),
                xytext=(e - 1, tr.values[e - 1]),
                arrowprops=dict(arrowstyle="->", color=FAILURE_COLOR, lw=1.2),
            )
            ax.text(
                (e - 1 + nxt) / 2,
                label_y + (k % 2) * 0.08 * span,  # two staggered rows: close boundaries do not collide
                f"{vs.jumps[k]:+.2f}",
                color=FAILURE_COLOR,
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.plot([], [], color=FAILURE_COLOR, lw=1.2, label="jump $\\Delta V$ (value above)")
    ax.set_ylim(low - 0.05 * span, high + 0.3 * span)
    share = vs.between_share[0]
    kind = "success" if tr.outcome > 0 else "failure"
    ax.set(
        xlabel="token position (gaps: observations)",
        ylabel="V",
        title=f"trajectory {tr.row} ({kind}, outcome {tr.outcome:g}): between-turn share {share:.1%}",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig
