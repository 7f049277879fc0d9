"""The reproduction's report: results tables, figures, claims with verdicts, and the
generated ``docs/reproduction.md``, written from the runs (:func:`mpo_lab.reproduce.run.run_one`
results); no number or figure is typed by hand. The layers below, each computed from the one
before: :mod:`.rows` (a row per run), :mod:`.analysis` (claims and the confirmatory comparisons), :mod:`.figures`,
:mod:`.summary` and :mod:`.page`. Needs pyarrow for the tables and matplotlib for the figures.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.exceptions import InvalidOptionError
from mpo_rs.outputs import output_subdir, table_bytes, write_file

from .analysis import ALPHA, claims, confirmatory, confirmatory_comparisons
from .budgets import is_committed
from .config import ReproduceConfig
from .env import task_chance
from .figures import SWEEPS, diagnose_runs, figure_groups, plot_bars, plot_confirmatory, plot_curves, plot_when
from .gating import gates_section, withheld
from .page import README_MARKERS, Page
from .page_text import fmt
from .plan import plan_for, sizing
from .presets import CONFIGS
from .rows import arm_columns, arm_labels, summarize_run
from .stats import (
    direction_words,
)
from .userbase import base_description
from .when import WHEN_TITLE, ladder_gains, task_gains, when_inputs

__all__ = [
    "docs_figure",
    "page_figures",
    "page_from_results",
    "read_results",
    "rerender",
    "rerender_readme_summary",
    "write_readme_summary",
    "write_report",
]

CONFIRMATORY_FIGURE = "The confirmatory comparisons' paired differences"
"""The title of the figure of the analysis plan's confirmatory comparisons (``confirmatory.png``)."""

CONFIRMATORY_CAPTION = (
    "Each row is one confirmatory comparison A - B of the analysis plan on one task: the mean per-seed "
    "difference and its uncorrected paired 95% interval; the colour is the Holm-corrected verdict "
    "(so an interval may exclude 0 in grey)."
)
"""Its caption."""

# A results.json written before the confirmatory comparisons had that name keeps them under
# the old keys; read_results reads them under today's (the committed runs' files stay as written).
_RENAMED_KEYS = {"family": "confirmatory", "family_comparisons": "confirmatory_comparisons"}


def _write_tables(
    runs: list[dict[str, Any]], rows: list[dict[str, Any]], config: ReproduceConfig, out: Path
) -> list[Path]:
    import pyarrow as pa

    chash = config.config_hash()
    paths = []
    table = pa.Table.from_pylist([{**r, "config": config.name, "config_hash": chash} for r in rows])
    write_file(out / "runs.parquet", table_bytes(table))
    paths.append(out / "runs.parquet")
    for source in ("curve", "evals"):
        records = [{"arm": r["arm"], "seed": r["seed"], **row} for r in runs for row in r[source]]
        if records:
            keys = sorted({k for rec in records for k in rec})
            cols = {k: [rec.get(k, math.nan) for rec in records] for k in keys}
            write_file(out / ("curves.parquet" if source == "curve" else "evals.parquet"), table_bytes(pa.table(cols)))
            paths.append(out / ("curves.parquet" if source == "curve" else "evals.parquet"))
    return paths


def write_report(
    runs: list[dict[str, Any]],
    config: ReproduceConfig,
    out_dir: str | os.PathLike[str],
    meta: dict[str, Any],
    *,
    docs_dir: str | os.PathLike[str] | None = None,
    note: Callable[[str], None] = lambda _: None,
    gates: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes results.json, the Parquet tables, the figures and reproduction.md under
    ``out_dir``; with ``docs_dir``, also ``docs_dir/reproduction.md`` and its figures under
    ``docs_dir/img/reproduction/``. ``gates``: the base policies' gate measurements
    (:func:`~mpo_lab.reproduce.gating.measure_own` or :func:`~mpo_lab.reproduce.gating.read_gates_file`;
    None: not measured, no verdicts). Returns the results dictionary."""
    out = Path(out_dir)
    img = output_subdir(out, "img")
    diagnose_runs(runs, out)
    rows = [summarize_run(r) | arm_columns(config, r["arm"]) for r in runs]
    section = gates_section(config, rows, gates)
    found = claims(rows, config, withheld(section, config))
    _write_tables(runs, rows, config, out)

    label = arm_labels(config)
    present = {r["arm"] for r in rows}
    ran = {a.task for a in config.arms if a.key in present}
    chance = {spec.name: task_chance(spec) for spec in config.tasks if spec.name in ran}
    groups = figure_groups(config, present)
    figures: dict[str, Path] = {}
    captions: dict[str, str] = {}
    confirmatory_comps = confirmatory_comparisons(rows, found, config, withheld(section, config))
    if confirmatory_comps:
        arm_task = {a.key: a.task for a in config.arms}
        title = CONFIRMATORY_FIGURE
        figures[title] = plot_confirmatory(
            confirmatory_comps, lambda c: arm_task.get(c.a, ""), img / "confirmatory.png"
        )
        captions[title] = CONFIRMATORY_CAPTION
    tasks, main, shares = when_inputs(config, rows, section)
    if tasks:
        metric = plan_for(config).metrics[0]
        figures[WHEN_TITLE] = plot_when(
            task_gains(rows, tasks, shares, metric), ladder_gains(rows, main, metric), img / "when.png"
        )
        captions[WHEN_TITLE] = "MPO's paired gains, as the first screen's table gives them."
    for group in groups:
        if group.study in SWEEPS:
            continue
        title = f"Learning curves, {group.title}"
        slug = "".join(ch if ch.isalnum() else "_" for ch in f"{group.task}_{group.study}")
        figures[title], captions[title] = plot_curves(
            runs, group.arms, group.title, img / f"curves_{slug}.png", chance.get(group.task, (None, ""))[0]
        )
    if groups:
        figures["Final success with 95% CIs"] = plot_bars(rows, groups, chance, img / "final_success.png")
    for arm in ("mpo", "ppo"):
        src = out / "diagnosis" / arm
        for png in sorted(src.glob("*.png")) if src.is_dir() else []:
            figures[f"Value structure of the {label.get(arm, arm)} critic ({png.stem.replace('_', ' ')})"] = png

    results = {
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "meta": meta,
        "chance": {task: {"success": value, "how": how} for task, (value, how) in chance.items()},
        # Where each task's arms start, in words (userbase.base_description): the page's base column.
        "base": {spec.name: base_description(config, spec.name) for spec in config.tasks if spec.name in ran},
        "runs": rows,
        "claims": [
            {
                "number": c.number,
                "paper": c.paper,
                "verdict": c.verdict,
                "note": c.note,
                "comparisons": [vars(x) for x in c.comparisons],
            }
            for c in found
        ],
    }
    results["confirmatory"] = {
        "plan_hash": plan_for(config).plan_hash(),
        "alpha": ALPHA,
        "correction": "holm",
        "comparisons": [{"metric": m, "a": a, "b": b} for m, a, b in confirmatory(config)],
    }
    results["confirmatory_comparisons"] = [vars(c) for c in confirmatory_comps]
    results["gates"] = section
    design = _design_inputs(config, docs_dir)
    page = Page(
        config, rows, found, confirmatory_comps, chance, meta, captions, design, section, plan_for(config).plan_hash()
    )
    results["summary"] = page.summary()
    label = arm_labels(config)
    for comp in confirmatory_comps:
        a, b = label.get(comp.a, comp.a), label.get(comp.b, comp.b)
        words = direction_words(a, b, comp.diff, comp.half_width, comp.verdict)
        if comp.withheld:  # the numbers only: "no difference shown" would be a reading
            words = f"no verdict ({comp.withheld}): {a} - {b} {comp.diff:+.3f} ± {comp.half_width:.3f}"
        elif comp.reading().startswith("equivalent"):
            words += f", {comp.reading()} (TOST p={fmt(comp.p_tost)})"
        note(
            f"{comp.what} ({comp.metric}): {words} (paired 95%, {comp.n} seeds, Holm p={fmt(comp.p_holm)}: "
            f"{comp.verdict})"
        )
    # What the page shows besides the results, so that it re-renders from results.json alone.
    results["figures"] = [
        {"title": t, "path": str(p.relative_to(out)), "caption": captions.get(t, "")} for t, p in figures.items()
    ]
    write_file(out / "results.json", json.dumps(results, indent=1, default=_json_default, allow_nan=True))
    write_file(out / "reproduction.md", page.markdown({t: str(p.relative_to(out)) for t, p in figures.items()}))
    note(f"wrote {out / 'reproduction.md'} and {out / 'results.json'}")
    if docs_dir is not None:
        _write_docs(Path(docs_dir), out, figures, page, note)
    return results


DOCS_TABLES = ("results.json", "runs.parquet", "evals.parquet")
"""The committed run's tables under ``DOCS/full/``: the page re-renders from the first."""


def _write_docs(docs: Path, out: Path, figures: Mapping[str, Path], page: Page, note: Callable[[str], None]) -> None:
    """The committed page, its figures, its tables (:data:`DOCS_TABLES`, so that the page
    re-renders from them) and the README's summary (between its markers)."""
    dest = output_subdir(docs, Path("img") / "reproduction")
    rel: dict[str, str] = {}
    for title, path in figures.items():
        rel[title] = docs_figure(str(path.relative_to(out)))
        write_file(dest / Path(rel[title]).name, path.read_bytes())
    tables = output_subdir(docs, Path("full"))
    for name in DOCS_TABLES:
        if (out / name).is_file():  # the Parquet tables need pyarrow
            write_file(tables / name, (out / name).read_bytes())
    write_file(docs / "reproduction.md", page.markdown(rel))
    note(f"wrote {docs / 'reproduction.md'}, {len(rel)} figures under {dest} and the tables under {tables}")
    if is_committed(page.config) and write_readme_summary(docs.resolve().parent / "README.md", page.readme_summary()):
        note(f"wrote the reproduction's summary into {docs.resolve().parent / 'README.md'}")


def _design_inputs(config: ReproduceConfig, docs_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The committed records the design section reads, from the docs directory the committed
    page is written to: the premise measurement and the pilot's results (then sized by the plan)."""
    if docs_dir is None or not is_committed(config) or config.plan != "paper":
        return {}  # the instrument's page reads its premise and pilot in its gates section
    docs = Path(docs_dir)
    out: dict[str, Any] = {}
    premise = docs / "premise.json"
    if premise.is_file():
        out["premise"] = json.loads(premise.read_text())
    pilot = docs / "pilot" / "results.json"
    if pilot.is_file():
        out["sizing"] = sizing(json.loads(pilot.read_text())["runs"])
    return out


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def read_results(results: Mapping[str, Any]) -> dict[str, Any]:
    """``results.json``'s content under today's names: the confirmatory comparisons of a run
    written when they were named otherwise (``family``, ``family_comparisons``) under
    ``confirmatory`` and ``confirmatory_comparisons``. The one reader of both spellings."""
    return {_RENAMED_KEYS.get(key, key): value for key, value in results.items()}


def docs_figure(path: str) -> str:
    """Where the docs page keeps the figure at ``path`` (relative to the output directory):
    under ``img/reproduction/``, a figure of a subdirectory (``diagnosis/mpo/x.png``) prefixed
    with that directory's name (``mpo_x.png``)."""
    parts = Path(path).parts
    name = parts[-1] if parts[:-1] == ("img",) else f"{parts[-2]}_{parts[-1]}"
    return f"img/reproduction/{name}"


def page_figures(page: str) -> list[tuple[str, str, str]]:
    """A page's figures as (title, path, caption), read from its "Figures" section: for a run
    whose results.json predates ``results["figures"]``."""
    section = page.split("\n## Figures\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.split(r"\n### ", "\n" + section.strip("\n"))[1:]:
        title, rest = block.split("\n", 1)
        image = re.match(r"\n!\[(.*)\]\((.*)\)\n", rest + "\n")
        if image is None or image.group(1) != title:
            raise InvalidOptionError(f"the page's Figures section has a block without its image: {title!r}")
        out.append((title, image.group(2), rest[image.end() :].strip("\n")))
    return out


def rerender(docs_dir: str | os.PathLike[str]) -> str:
    """The committed page, rendered again by today's code from ``DOCS/full/results.json``
    (its configuration must be a committed one): ``mpo-lab page DOCS``
    writes it to ``DOCS/reproduction.md``. Only the wording can change; every number is the
    committed run's."""
    return _committed_page(docs_dir)[0]


def rerender_readme_summary(docs_dir: str | os.PathLike[str]) -> str:
    """The README's summary of the committed run (:meth:`Page.readme_summary`), rendered from
    ``DOCS/full/results.json`` as :func:`rerender` renders the page."""
    return _committed_page(docs_dir)[1]


def _committed_page(docs_dir: str | os.PathLike[str]) -> tuple[str, str]:
    docs = Path(docs_dir)
    results = read_results(json.loads((docs / "full" / "results.json").read_text()))
    committed = {c.config_hash(): c for c in CONFIGS.values()}
    if results["config_hash"] not in committed:
        raise InvalidOptionError(f"{docs / 'full' / 'results.json'} is not of a committed configuration")
    if "figures" in results:
        figures = [(f["title"], docs_figure(f["path"]), f["caption"]) for f in results["figures"]]
    else:
        figures = page_figures((docs / "reproduction.md").read_text())
    page = _page(results, committed[results["config_hash"]], figures, docs_dir=docs)
    return page.markdown({title: rel for title, rel, _ in figures}), page.readme_summary()


def write_readme_summary(readme: str | os.PathLike[str], summary: str) -> bool:
    """Puts ``summary`` (:meth:`Page.readme_summary`, markers included) between the README's
    :data:`README_MARKERS`; a README without both markers is not ours to change and is left as
    it is. Whether the file was written."""
    path = Path(readme)
    if not path.is_file():
        return False
    text = path.read_text()
    start, end = text.find(README_MARKERS[0]), text.find(README_MARKERS[1])
    if start < 0 or end < start:
        return False
    new = text[:start] + summary + text[end + len(README_MARKERS[1]) :]
    if new != text:
        write_file(path, new)
    return True


def page_from_results(
    results: dict[str, Any],
    config: ReproduceConfig,
    figures: Sequence[tuple[str, str, str]],
    docs_dir: str | os.PathLike[str] | None = None,
) -> str:
    """The page of a finished run, rendered again from its ``results.json`` content alone:
    the claims and the confirmatory comparisons are recomputed from its rows and its gates; ``figures`` are the page's
    (title, relative path, caption) in order (``results["figures"]`` where a run recorded
    them). The committed page re-renders byte for byte (lab/tests/test_reproduce_page.py)."""
    return _page(results, config, figures, docs_dir).markdown({title: rel for title, rel, _ in figures})


def _page(
    results: dict[str, Any],
    config: ReproduceConfig,
    figures: Sequence[tuple[str, str, str]],
    docs_dir: str | os.PathLike[str] | None = None,
) -> Page:
    results = read_results(results)
    rows = results["runs"]
    # The gates are judged again from the measurements the run recorded (none: not measured).
    section = gates_section(config, rows, results.get("gates"))
    found = claims(rows, config, withheld(section, config))
    confirmatory_comps = confirmatory_comparisons(rows, found, config, withheld(section, config))
    chance = {task: (c["success"], c["how"]) for task, c in results["chance"].items()}
    captions = {title: caption for title, _, caption in figures if caption}
    design = _design_inputs(config, docs_dir)
    plan_hash = str(results.get("confirmatory", {}).get("plan_hash", ""))
    return Page(config, rows, found, confirmatory_comps, chance, results["meta"], captions, design, section, plan_hash)


def write_committed_page(docs_dir: str | os.PathLike[str]) -> list[str]:
    """Writes :func:`rerender`'s page to ``DOCS/reproduction.md`` and its summary into the
    README beside ``DOCS`` (where it has the markers); what was written, a line each
    (``mpo-lab page DOCS``)."""
    docs = Path(docs_dir)
    page, summary = _committed_page(docs)
    write_file(docs / "reproduction.md", page)
    done = [f"wrote {docs / 'reproduction.md'}"]
    if write_readme_summary(docs.resolve().parent / "README.md", summary):
        done.append(f"wrote the reproduction's summary into {docs.resolve().parent / 'README.md'}")
    return done
