"""``mpo-rs diagnose``: does the critic's value structure live on the turn scale?

Streams a Parquet rollout log (a file or a directory of files) record batch by record
batch -- memory is bounded by one batch plus a few numbers per trajectory -- and computes
in Rust, per trajectory, the between/within-turn split of the token-weighted value
variance and the boundary jumps (:func:`mpo_rs.diagnostics.value_structure`). Aggregates:
median between-turn share, fraction of trajectories with between > within, the jump
distribution, split by outcome and by training step when a step column exists. Writes a
JSON summary and PNG figures (share histogram, jump distribution, and the paper's
Figure 2 -- token values with turn means and boundary jumps -- for chosen trajectories).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _native
from ._deps import MissingDependencyError, require
from ._native import InvalidBatchError, InvalidOptionError
from .diagnostics import value_structure

__all__ = ["Diagnosis", "diagnose_logs", "write_report", "add_parser", "run"]


@dataclass
class TrajectoryTrace:
    """The token-level values of one trajectory kept for plotting."""

    row: int
    outcome: float
    values: npt.NDArray[np.float32]
    mask: npt.NDArray[np.bool_]


@dataclass
class Diagnosis:
    """Per-trajectory results of a whole log (rows in file order) and the kept traces."""

    total: npt.NDArray[np.float64]
    between: npt.NDArray[np.float64]
    within: npt.NDArray[np.float64]
    n_turns: npt.NDArray[np.int64]
    outcome: npt.NDArray[np.float64]
    step: npt.NDArray[np.int64] | None
    jumps: npt.NDArray[np.float32]
    """All boundary jumps (NaN-free), with `jump_row` the trajectory of each."""
    jump_row: npt.NDArray[np.int64]
    traces: list[TrajectoryTrace] = field(default_factory=list)
    batches: int = 0

    @property
    def rows(self) -> int:
        return int(self.total.shape[0])

    @property
    def between_share(self) -> npt.NDArray[np.float64]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.total > 0, self.between / self.total, np.nan)

    def to_arrow(self) -> Any:
        """Per-trajectory results as a pyarrow Table."""
        import pyarrow as pa

        cols: dict[str, Any] = {
            "total_variance": self.total,
            "between_turn_variance": self.between,
            "within_turn_variance": self.within,
            "between_share": self.between_share,
            "n_turns": self.n_turns,
            "outcome": self.outcome,
        }
        if self.step is not None:
            cols["step"] = self.step
        return pa.table(cols)

    def summary(self) -> dict[str, Any]:
        """Aggregates over trajectories with >= 2 turns and varying values (the others have
        no between/within split to speak of)."""
        usable = (self.n_turns >= 2) & (self.total > 0)

        def block(sel: npt.NDArray[np.bool_]) -> dict[str, Any]:
            share = self.between_share[sel]
            jumps = self.jumps[sel[self.jump_row]] if self.jumps.size else self.jumps
            q = (0.05, 0.25, 0.5, 0.75, 0.95)
            return {
                "trajectories": int(sel.sum()),
                "median_between_share": _f(np.median(share)) if share.size else None,
                "fraction_between_gt_within": _f(np.mean(self.between[sel] > self.within[sel])) if share.size else None,
                "jumps": int(jumps.size),
                "median_abs_jump": _f(np.median(np.abs(jumps))) if jumps.size else None,
                "jump_quantiles": {str(p): _f(x) for p, x in zip(q, np.quantile(jumps, q))} if jumps.size else None,
            }

        out: dict[str, Any] = {
            "rows": self.rows,
            "excluded_fewer_than_two_turns_or_constant": int((~usable).sum()),
            "all": block(usable),
            "by_outcome": {
                "success (outcome > 0)": block(usable & (self.outcome > 0)),
                "failure (outcome <= 0)": block(usable & (self.outcome <= 0)),
            },
        }
        if self.step is not None:
            out["by_step"] = {str(s): block(usable & (self.step == s)) for s in np.unique(self.step)}
        return out


def _f(x: Any) -> float:
    return float(x)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _corrupt(file: Path, row_group: int | None, e: BaseException) -> InvalidBatchError:
    """A file pyarrow cannot decode: bad data (exit 1), named as `advantages` names it."""
    where = f"{file}: row group {row_group}" if row_group is not None else str(file)
    return InvalidBatchError(f"{where}: cannot read Parquet: {_one_line(e)}")


@dataclass
class _Columns:
    """The columns read, chosen on the first file's schema and used for every file."""

    values: str
    mask: str
    reward: tuple[str, str]
    """("score", name) or ("rewards", name)."""
    step: str | None

    @property
    def names(self) -> list[str]:
        return [c for c in (self.values, self.mask, self.reward[1], self.step) if c]

    @classmethod
    def choose(
        cls, names: set[str], values: str, mask: str, score: str | None, rewards: str | None, step: str | None
    ) -> _Columns:
        if score and rewards:
            raise InvalidOptionError("give --score-col or --rewards-col, not both")
        if score:
            reward = ("score", score)
        elif rewards:
            reward = ("rewards", rewards)
        elif "score" in names:
            reward = ("score", "score")
        elif "rewards" in names:
            reward = ("rewards", "rewards")
        else:
            reward = ("score", "score")  # reported as missing by the caller
        return cls(values, mask, reward, step or ("step" if "step" in names else None))


def _open(file: Path, cols: _Columns | None, options: dict[str, Any]) -> tuple[Any, _Columns]:
    """Opens one input (footer and schema) and checks its columns' names and types, the
    same checks as a batch's, before anything is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(file, "rb"):  # the OS's own errors (permissions, a vanished file) stay OSError
        pass
    try:
        # pre_buffer would read the selected columns of every row group ahead: unbounded.
        # Page checksums, where the writer stored them, are verified.
        pf = pq.ParquetFile(file, pre_buffer=False, page_checksum_verification=True)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _corrupt(file, None, e) from None
    names = set(schema.names)
    have = ", ".join(schema.names) or "none"
    if cols is None:
        if not (options["score"] or options["rewards"] or names & {"score", "rewards"}):
            raise InvalidBatchError(
                f"{file}: missing column `score` or `rewards` (columns are: {have}); "
                "name the outcome with --score-col or --rewards-col"
            )
        cols = _Columns.choose(names, **options)
    absent = [c for c in cols.names if c not in names]
    if absent:
        raise InvalidBatchError(f"{file}: missing column `{absent[0]}` (columns are: {have})")
    empty = pa.RecordBatch.from_pylist([], schema=pa.schema([schema.field(c) for c in cols.names]))
    _native.diagnose_batch(empty, file, None, 0, cols.mask, cols.values, cols.reward, cols.step)
    return pf, cols


def diagnose_logs(
    path: str | os.PathLike[str],
    *,
    values_col: str = "values",
    mask_col: str = "loss_mask",
    score_col: str | None = None,
    rewards_col: str | None = None,
    step_col: str | None = None,
    keep_rows: list[int] | None = None,
    batch_rows: int = 1024,
) -> Diagnosis:
    """Streams the log and returns the per-trajectory results.

    ``path`` is a Parquet file or a directory, whose files are found as ``mpo-rs
    advantages`` finds them (one implementation, in Rust: recursively, in name order,
    hidden and ``_`` names skipped). Every file is opened and its columns checked before
    any row is read; every batch is checked as ``advantages`` checks it (types, nulls,
    list lengths, mask values, finite values and outcomes), and bad data raises
    :class:`mpo_rs.InvalidBatchError` naming file, row group, row (in the file) and column.

    The outcome of a trajectory is ``score_col`` if given (default: ``score`` when present),
    else the sum of ``rewards_col`` (default: ``rewards``); the column is chosen on the
    first file. ``step_col`` (default: ``step`` when present) splits the aggregates by
    training step. Traces for figures are kept for the rows in ``keep_rows`` (row numbers
    over the whole log), else for the first success and the first failure with at least
    two turns.
    """
    _require_pyarrow()
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("total", "between", "within", "n_turns", "outcome", "step", "jumps", "jump_row")
    }
    traces: list[TrajectoryTrace] = []
    wanted = set(keep_rows or [])
    seen_kinds: set[bool] = set()
    options = dict(values=values_col, mask=mask_col, score=score_col, rewards=rewards_col, step=step_col)
    cols: _Columns | None = None
    sources = []
    for file in _native.list_parquet_inputs(path):
        pf, cols = _open(Path(file), cols, options)
        sources.append((Path(file), pf))
    assert cols is not None  # the listing is never empty
    import pyarrow as pa

    row0 = 0
    batches = 0
    for file, pf in sources:
        file_row = 0
        for g in range(pf.metadata.num_row_groups):
            group_start = file_row
            stream = pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=cols.names)
            while True:
                try:
                    batch = next(stream, None)
                except (pa.ArrowException, OSError, ValueError) as e:
                    raise _corrupt(file, g, e) from None
                if batch is None:
                    break
                (values, mask, offsets, outcome, step, total, between, within, jumps, n_turns) = _native.diagnose_batch(
                    batch, file, g, file_row, cols.mask, cols.values, cols.reward, cols.step
                )
                rows = np.arange(row0, row0 + batch.num_rows)
                finite = np.isfinite(jumps)
                parts["total"].append(total)
                parts["between"].append(between)
                parts["within"].append(within)
                parts["n_turns"].append(n_turns)
                parts["outcome"].append(outcome)
                if step is not None:
                    parts["step"].append(step)
                parts["jumps"].append(jumps[finite])
                parts["jump_row"].append(np.repeat(rows, n_turns)[finite])
                for k, row in enumerate(rows):
                    success = bool(outcome[k] > 0)
                    keep = row in wanted if wanted else (n_turns[k] >= 2 and success not in seen_kinds)
                    if keep:
                        seen_kinds.add(success)
                        sl = slice(offsets[k], offsets[k + 1])
                        traces.append(
                            TrajectoryTrace(int(row), float(outcome[k]), values[sl].copy(), mask[sl].astype(bool))
                        )
                row0 += batch.num_rows
                file_row += batch.num_rows
                batches += 1
            expected = pf.metadata.row_group(g).num_rows
            if file_row - group_start != expected:
                raise _corrupt(
                    file, g, ValueError(f"decoded {file_row - group_start} rows, the footer says {expected}")
                )
    cat = lambda k, dt: np.concatenate(parts[k]).astype(dt) if parts[k] else np.zeros(0, dt)  # noqa: E731
    return Diagnosis(
        total=cat("total", np.float64),
        between=cat("between", np.float64),
        within=cat("within", np.float64),
        n_turns=cat("n_turns", np.int64),
        outcome=cat("outcome", np.float64),
        step=cat("step", np.int64) if cols.step else None,
        jumps=cat("jumps", np.float32),
        jump_row=cat("jump_row", np.int64),
        traces=traces,
        batches=batches,
    )


def _require_pyarrow() -> None:
    require("pyarrow", "mpo-rs diagnose", "arrow")


def format_table(summary: dict[str, Any]) -> str:
    """The aggregates as a plain-text table."""
    rows = [("all", summary["all"])] + list(summary["by_outcome"].items())
    rows += [(f"step {k}", v) for k, v in summary.get("by_step", {}).items()]
    fmt = lambda x, pct=True: "-" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.3f}")  # noqa: E731
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
        "with fewer than two turns or constant values left out. Paper: median share 89.5%, "
        "between > within in 93.8%.)"
    )
    return "\n".join(lines)


def write_report(diag: Diagnosis, out_dir: str | os.PathLike[str], *, figures: bool = True) -> list[Path]:
    """Writes summary.json and, with ``figures``, the PNG figures; returns the paths
    written. summary.json is written first (atomically), so it is there even when the
    figures fail; figures without matplotlib raise MissingDependencyError naming the
    ``plot`` extra."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(diag.summary(), indent=2) + "\n")
    os.replace(tmp, summary_path)
    written = [summary_path]
    if not figures:
        return written
    _require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = (diag.n_turns >= 2) & (diag.total > 0)
    fig, ax = plt.subplots(figsize=(6, 4))
    share = diag.between_share[usable]
    ax.hist(share, bins=np.linspace(0, 1, 41), color="#3b75af")
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
    bins = np.linspace(-lim, lim, 61) if lim > 0 else 10
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
    for k, (s, e) in enumerate(zip(vs.turns.starts, vs.turns.ends)):
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


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "diagnose",
        help="does the critic's value structure live on the turn scale?",
        description=(
            "Streams a Parquet rollout log and reports, per trajectory, how much of the "
            "token-weighted value variance lies between turns rather than within them, and "
            "the value jumps at turn boundaries (MPO's evidence, on your own critic)."
        ),
    )
    p.add_argument("input", metavar="INPUT", help="a Parquet file or a directory of Parquet files")
    p.add_argument("-o", "--output", metavar="REPORT_DIR", help="write summary.json and PNG figures here")
    p.add_argument(
        "--trajectories", metavar="K", help="comma-separated row numbers to draw (default: a success and a failure)"
    )
    p.add_argument("--values-col", default="values", metavar="NAME")
    p.add_argument("--mask-col", default="loss_mask", metavar="NAME")
    p.add_argument(
        "--score-col", metavar="NAME", help="outcome per trajectory (default: score, else the sum of rewards)"
    )
    p.add_argument("--rewards-col", metavar="NAME")
    p.add_argument("--step-col", metavar="NAME", help="training-step column (default: step, if present)")
    p.add_argument("--batch-rows", type=int, default=1024, metavar="N", help="rows per streamed batch (1024)")


def _require_matplotlib() -> None:
    require("matplotlib", "mpo-rs diagnose", "plot")


def run(args: argparse.Namespace, note: Callable[[str], None] = lambda _: None) -> tuple[str, list[Path]]:
    """Runs the command; returns the table and the files written. Raises InvalidBatchError
    (bad data), InvalidOptionError (usage), MissingDependencyError (pyarrow) or OSError.

    Everything that can fail without reading the log is checked first: options, REPORT_DIR,
    pyarrow, matplotlib. Without matplotlib the figures are skipped -- ``note`` gets one
    line saying so and naming the ``plot`` extra -- and summary.json is still written."""
    keep = None
    if args.trajectories:
        try:
            keep = [int(x) for x in args.trajectories.split(",") if x.strip()]
        except ValueError:
            raise InvalidOptionError(
                f"--trajectories must be comma-separated row numbers, got {args.trajectories!r}"
            ) from None
    if args.batch_rows < 1:
        raise InvalidOptionError("--batch-rows must be at least 1")
    if args.score_col and args.rewards_col:
        raise InvalidOptionError("give --score-col or --rewards-col, not both")
    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        raise InvalidOptionError(f"REPORT_DIR {args.output} is a file; give a directory")
    _require_pyarrow()
    figures = bool(args.output)
    if figures:
        try:
            _require_matplotlib()
        except MissingDependencyError:
            figures = False
            note("figures skipped: they need matplotlib: pip install 'mpo-rs[plot]' (summary.json is written)")
    diag = diagnose_logs(
        args.input,
        values_col=args.values_col,
        mask_col=args.mask_col,
        score_col=args.score_col,
        rewards_col=args.rewards_col,
        step_col=args.step_col,
        keep_rows=keep,
        batch_rows=args.batch_rows,
    )
    written = write_report(diag, args.output, figures=figures) if args.output else []
    return format_table(diag.summary()), written
