"""The figures of ``mpo-rs diagnose -o``: the between-turn share over trajectories, the
boundary jumps, and the paper's Figure 2 (token values, turn means and jumps) for chosen
trajectories. matplotlib is imported only when a figure is drawn; without it,
:func:`write_report` raises :class:`mpo_rs.MissingDependencyError` naming the ``plot``
extra (after writing summary.json)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import _native
from .._deps import require
from .read import Diagnosis, TrajectoryTrace
from .summary import value_structure, write_summary_json

__all__ = ["require_matplotlib", "write_report"]

TOOL = "diagnose"
"""The tool named in a report directory's marker."""
REPORT_DIR = "REPORT_DIR"
"""How messages name the report directory."""


def require_matplotlib() -> None:
    require("matplotlib", "mpo-rs diagnose", "plot")


def write_report(
    diag: Diagnosis, out_dir: str | os.PathLike[str], *, figures: bool = True, overwrite: bool = False
) -> list[Path]:
    """Writes summary.json and, with ``figures``, the PNG figures; returns the paths
    written. summary.json is written first (atomically), so it is there even when the
    figures fail; figures without matplotlib raise MissingDependencyError naming the
    ``plot`` extra.

    ``out_dir`` must be new, empty, or an earlier report (it holds the ``.mpo-rs-output``
    marker naming diagnose), else :class:`mpo_rs.InvalidOptionError` is raised before
    anything is written; ``overwrite`` writes into any directory. The directory is created
    and marked as a report of diagnose (docs/reliability.md, "Output safety")."""
    _native.claim_output_dir(out_dir, TOOL, overwrite=overwrite, label=REPORT_DIR)
    out = Path(out_dir)
    written = [write_summary_json(diag.summary(), out)]
    if not figures:
        return written
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = (diag.n_turns >= 2) & (diag.total > 0)
    fig, ax = plt.subplots(figsize=(6, 4))
    share = diag.between_share[usable]
    ax.hist(share, bins=np.linspace(0, 1, 41).tolist(), color="#3b75af")
    if share.size:
        ax.axvline(np.median(share), color="k", ls="--", label=f"median {np.median(share):.1%}")
        ax.legend()
    ax.set(
        xlabel="between-turn share of value variance",
        ylabel="trajectories",
        title="Where does the critic's value variance live?",
    )
    fig.tight_layout()
    fig.savefig(out / "share_histogram.png", dpi=120)
    plt.close(fig)
    written.append(out / "share_histogram.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    succ = diag.outcome[diag.jump_row] > 0 if diag.jumps.size else np.zeros(0, bool)
    lim = float(np.quantile(np.abs(diag.jumps), 0.995)) if diag.jumps.size else 1.0
    bins = np.linspace(-lim, lim, 61).tolist() if lim > 0 else 10
    ax.hist(
        [diag.jumps[succ], diag.jumps[~succ]],
        bins=bins,
        stacked=True,
        label=["success", "failure"],
        color=["#4c9a2a", "#c0392b"],
    )
    ax.set(
        xlabel=r"boundary jump $\Delta V = V_{t+1,1} - V_{t,L_t}$",
        ylabel="turn boundaries",
        title="Value jumps at turn boundaries",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "jump_distribution.png", dpi=120)
    plt.close(fig)
    written.append(out / "jump_distribution.png")

    for tr in diag.traces:
        written.append(_trace_figure(plt, tr, out / f"trajectory_{tr.row}.png"))
    return written


def _trace_figure(plt: Any, tr: TrajectoryTrace, path: Path) -> Path:
    """Figure 2 of the paper for one trajectory: token values, turn means, jumps."""
    vs = value_structure(tr.values, tr.mask, [0, len(tr.mask)])
    fig, ax = plt.subplots(figsize=(9, 3.6))
    pos = np.arange(len(tr.mask))
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
                arrowprops=dict(arrowstyle="->", color="#c0392b", lw=1.2),
            )
            ax.text(
                (e - 1 + nxt) / 2,
                max(tr.values[e - 1], tr.values[nxt]),
                f"{vs.jumps[k]:+.2f}",
                color="#c0392b",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    share = vs.between_share[0]
    kind = "success" if tr.outcome > 0 else "failure"
    ax.set(
        xlabel="token position (gaps: observations)",
        ylabel="V",
        title=f"trajectory {tr.row} ({kind}, outcome {tr.outcome:g}): between-turn share {share:.1%}",
    )
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
