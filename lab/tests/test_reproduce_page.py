"""The page of `mpo-rs reproduce`. The committed page is a function of the committed
results: ``docs/reproduction.md`` re-renders byte for byte from ``docs/full/results.json``
(the guard of every change to the report's code; a change of wording is made by
``mpo-lab page docs``). On synthetic rows: the summary's bottom line,
estimates, verdicts, power and caveats, and the figures' panels, groups and axes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from mpo_lab.reproduce import ARMS, FULL, QUICK
from mpo_lab.reproduce.config import BETA_SWEEP
from mpo_lab.reproduce.stats import REPRODUCED, holm

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_committed_page_re_renders_from_its_results():
    from mpo_lab.reproduce.report import page_figures, rerender

    page = (DOCS / "reproduction.md").read_text()
    assert len(page_figures(page)) >= 10
    rendered = rerender(DOCS)
    if rendered != page:
        for i, (a, b) in enumerate(zip(rendered.splitlines(), page.splitlines(), strict=False)):
            if a != b:
                pytest.fail(
                    f"line {i + 1} differs (run: mpo-lab page docs):\n  rendered:  {a[:300]}\n  committed: {b[:300]}"
                )
        pytest.fail(f"lengths differ: {len(rendered)} rendered, {len(page)} committed")


def test_figure_names_on_the_docs_page():
    from mpo_lab.reproduce.report import docs_figure

    assert docs_figure("img/confirmatory.png") == "img/reproduction/confirmatory.png"
    assert docs_figure("diagnosis/mpo/share_histogram.png") == "img/reproduction/mpo_share_histogram.png"


def test_the_committed_results_read_under_todays_names():
    # The committed runs' results.json keep the key names they were written with ("family",
    # "family_comparisons"); read_results is the one place that reads both spellings.
    from mpo_lab.reproduce.report import read_results

    written = json.loads((DOCS / "paper" / "full" / "results.json").read_text())
    assert "family" in written and "confirmatory" not in written  # the paper configuration's run, as written
    read = read_results(written)
    assert (
        read["confirmatory"] == written["family"] and read["confirmatory_comparisons"] == written["family_comparisons"]
    )
    assert "family" not in read and "family_comparisons" not in read and read["runs"] == written["runs"]
    assert read_results(read) == read  # today's names read as they are


def test_the_readme_summary_is_the_committed_pages():
    """The README's summary of the committed run is generated from its results (the page's
    bottom line and first table, nothing else); a README without the markers is left alone."""
    from mpo_lab.reproduce.page import README_MARKERS
    from mpo_lab.reproduce.report import rerender_readme_summary

    readme = (DOCS.parent / "README.md").read_text()
    start, end = readme.find(README_MARKERS[0]), readme.find(README_MARKERS[1])
    assert 0 <= start < end, "the README has lost its summary markers"
    summary = rerender_readme_summary(DOCS)
    assert readme[start : end + len(README_MARKERS[1])] == summary, "run: mpo-lab page docs"
    assert "**Bottom line.**" in summary and "| MPO − PPO | MPO − GRPO |" in summary


def test_a_readme_is_written_only_between_its_markers(tmp_path):
    from mpo_lab.reproduce.page import README_MARKERS
    from mpo_lab.reproduce.report import write_readme_summary

    theirs = tmp_path / "README.md"
    theirs.write_text("# someone's project\n")
    assert not write_readme_summary(theirs, "x") and theirs.read_text() == "# someone's project\n"
    assert not write_readme_summary(tmp_path / "absent.md", "x") and not (tmp_path / "absent.md").exists()
    ours = tmp_path / "ours.md"
    ours.write_text(f"before\n{README_MARKERS[0]}\nold\n{README_MARKERS[1]}\nafter\n")
    block = f"{README_MARKERS[0]}\nnew\n{README_MARKERS[1]}"
    assert write_readme_summary(ours, block)
    assert ours.read_text() == f"before\n{block}\nafter\n"


def test_the_first_screen_reads_the_ladder_where_it_ran():
    """The instrument's ladder runs on MultiHop, not on the main task: the first screen's ladder
    is read there (the main task where no ladder ran)."""
    from mpo_lab.reproduce.presets import FULL, INSTRUMENT
    from mpo_lab.reproduce.when import when_inputs

    rows = [{"arm": a.key, "seed": 1} for a in INSTRUMENT.arms]
    tasks, ladder_task, _ = when_inputs(INSTRUMENT, rows, {})
    assert ladder_task == "multi_hop" and tasks == [spec.name for spec in INSTRUMENT.tasks]
    without = [r for r in rows if "_ref" not in r["arm"]]
    assert when_inputs(INSTRUMENT, without, {})[1] == "search"
    assert when_inputs(FULL, [{"arm": a.key, "seed": 1} for a in FULL.arms], {})[1] == "search"


# --------------------------------------------------------------------------- the page


def _synthetic_rows(level: dict[str, float], ev: float = 0.5) -> list[dict]:
    rows = []
    for seed in range(1, 6):
        for arm in ARMS:
            value = level.get(arm.key, 0.3) + 0.02 * seed * (1 if arm.key == "mpo" else 0.5)
            rows.append(
                {
                    "arm": arm.key,
                    "seed": seed,
                    "final_success": value,
                    "auc_success": value / 2,
                    "final_explained_variance": ev if arm.trains_critic else math.nan,
                    "entropy_drop": 0.1,
                    "final_turns": 3.0,
                    "between_share": 0.2,
                    "final_pass@1": value,
                    "final_entropy": 1.0,
                    "wall_s": 1.0,
                }
            )
    return rows


def _page(rows: list[dict], config=FULL):
    from mpo_lab.reproduce.analysis import claims, confirmatory_comparisons
    from mpo_lab.reproduce.page import Page

    found = claims(rows, config)
    chance = {"key_door": (0.004, "exact"), "guess_number": (0.265, "exact")}
    return Page(config, rows, found, confirmatory_comparisons(rows, found, config), chance, {}, {})


def _table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table in ``text`` whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_summary_gives_the_bottom_line_estimates_verdicts_power_and_caveats():
    from mpo_lab.reproduce.analysis import CONFIRMATORY

    page = _page(_synthetic_rows({"mpo": 0.6, "grpo": 0.3, "gspo": 0.62, "ppo": 0.1}, ev=0.05))
    summary = page.summary()
    bottom = summary.split("\n\n")[0]
    # The bottom line: the plan's confirmatory comparisons, their tally, the power, what it decided (with its task).
    assert bottom.startswith(
        f"**Bottom line.** {len(CONFIRMATORY)} comparisons were fixed in advance by the analysis plan"
    )
    assert "paired by seed over 5 seed(s) and Holm-corrected at alpha = 0.05" in bottom
    assert re.search(r"Power achieved: 95% half-widths [0-9.-]+ on 5 paired seed\(s\)", bottom)
    # Many decided: a count per task (the table has them in bold); few: each one named.
    assert "Decided (in bold in the confirmatory comparisons' table below): Search 28 reproduced." in bottom
    assert "The other comparisons of the claims (uncorrected, exploratory; see Claims):" in bottom
    # Point estimates: tasks x Table 1's arms, the plan's order (main task first, controls last).
    estimates = _table(summary, "| task | chance | seeds |")
    assert [r[0] for r in estimates] == ["Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"]
    header = summary.splitlines()[
        summary.splitlines().index(
            "| task | chance | seeds | base policy | PPO critic's between-turn share | GRPO | GSPO | PPO "
            "| MPO w/ token IS | MPO |"
        )
    ]
    assert header  # the columns are Table 1's arms, which every task runs
    search = estimates[0]
    # chance not given for search here; no base policy in these rows; the PPO critic's share
    assert search[1:5] == ["—", "5", "scratch", "0.20"]
    finals = [0.3 + 0.03, 0.62 + 0.03, 0.1 + 0.03, 0.3 + 0.03, 0.6 + 0.06]  # level + mean of the seed drift
    assert search[5:] == [f"{x / 2:.2f} / {x:.2f}" for x in finals]  # auc is half the final in these rows
    assert estimates[3][1] == "0.004" and estimates[4][1] == "0.265"
    # The confirmatory comparisons' verdicts: one row per task and pair, one column per metric; decided ones in bold.
    verdicts = _table(summary, "| task | comparison |")
    assert len(verdicts) == len({(a, b) for _, a, b in CONFIRMATORY})
    first = verdicts[0]
    assert first[:2] == ["Search", "MPO - GRPO"]
    assert re.fullmatch(r"\+0\.165 ± 0\.\d{3}, p=0\.\d{3}, \*\*reproduced\*\*", first[2])
    assert re.fullmatch(r"\+0\.330 ± 0\.\d{3}, p=0\.\d{3}, \*\*reproduced\*\*", first[3])
    gspo = next(r for r in verdicts if r[:2] == ["Search", "MPO - GSPO"])
    assert gspo[3].endswith(", inconclusive")  # [-0.01, +0.03]: no difference shown, and no equivalence reading
    assert re.search(r"The \d+ undecided show no difference; none is read as equivalence", bottom)
    assert "within ±" not in summary
    # EV 0.05 < CRITIC_EV_FLOOR on every critic arm: the caveat, per task.
    caveats = [line for line in summary.splitlines() if line.startswith("- **")]
    assert [c.split("**")[1] for c in caveats] == ["Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"]
    assert all("the critics never learned" in c for c in caveats)
    # An arm subset: only its tasks, its confirmatory comparisons.
    sub = _page(_synthetic_rows({"mpo": 0.6}), FULL.with_arms(["mpo", "ppo"]))
    summary = sub.summary()
    assert summary.startswith("**Bottom line.** 2 comparisons were fixed in advance")
    assert [r[:2] for r in _table(summary, "| task | comparison |")] == [["Search", "MPO - PPO"]]
    assert [r[0] for r in _table(summary, "| task | chance | seeds |")] == ["Search"]
    assert (
        "Decided: Search, MPO - PPO (mean held-out success over training) +0.165 ± 0.010 → **reproduced**;" in summary
    )
    assert "critics never learned" not in summary
    assert "**Not the committed configuration**: this page is `mpo-rs reproduce --arms ppo,mpo`'s" in sub.kind()[0]
    assert _page(_synthetic_rows({})).kind() == []  # the committed run says nothing about itself


def test_the_committed_page_points_to_the_runs_it_replaced():
    meta = {"workers": 2, "wall_s": 60.0, "started": "now"}
    page = _page(_synthetic_rows({}))
    page.meta = meta
    text = page.markdown({})
    assert "## Earlier runs" in text
    links = re.findall(r"\]\(((?:paper|control)/reproduction\.md)\)", text)
    assert links == ["paper/reproduction.md", "control/reproduction.md"]
    for link in links:
        assert (Path(__file__).resolve().parents[1] / "docs" / link).is_file()
    sub = _page(_synthetic_rows({}), FULL.with_arms(["mpo", "ppo"]))
    sub.meta = meta
    assert "## Earlier runs" not in sub.markdown({})  # only the committed run replaced them


def test_the_page_states_where_the_arms_started():
    rows = _synthetic_rows({})
    for r in rows:  # one base policy per (task, seed); a critic warm-up where the arm trains a critic
        r["base_success"] = 0.05 * r["seed"]
        r["warmup_explained_variance"] = 0.1 if not r["arm"].endswith(("grpo", "gspo")) else math.nan
    page = _page(rows)
    page.meta = {"workers": 2, "wall_s": 60.0, "started": "now"}
    text = page.markdown({})
    assert "## Starting point: base policies and critic warm-up" in text
    table = {r[0]: r for r in _table(text, "| task | eps | base held-out success")}
    # Seeds 1-5: base success 0.05 ... 0.25, of which 0.10, 0.15, 0.20, 0.25 lie in the band.
    assert table["Search"][1:] == ["0.00", "0.150 [0.050, 0.250]", "4 of 5", "0.10 [0.10, 0.10]"]
    assert table["GuessNumber"][1] == "1.00"
    assert "no base policy" not in text.split("## Starting point", 1)[1].split("##", 1)[0]


def test_the_committed_page_states_its_design_from_the_committed_records():
    from mpo_lab.reproduce.report import _design_inputs

    docs = Path(__file__).resolve().parents[1] / "docs"
    design = _design_inputs(FULL, docs)
    # The committed pilot record sizes the committed seeds (the plan's rule, capped).
    assert design["sizing"].seeds == FULL.seeds and design["sizing"].capped
    page = _page(_synthetic_rows({}))
    page.meta, page.design = {"workers": 2, "wall_s": 60.0, "started": "now"}, design
    text = page.markdown({})
    section = text.split("## Design: tasks, pilot and seeds", 1)[1].split("\n## ", 1)[0]
    roles = {r[0]: (r[1], r[3]) for r in _table(section, "| task | role |")}
    assert roles["Search"] == ("main", "holds") and roles["KeyDoor"] == ("control", "fails")
    assert roles["MultiHop"] == ("premise", "holds") and roles["GuessNumber"][0] == "control"
    assert f"asks for {design['sizing'].needed} seeds" in section and f"this run has {FULL.seeds}" in section
    assert re.search(r"the target 0\.05 is met on \d of 5 tasks", section)
    assert _design_inputs(QUICK, docs) == {}  # only the committed page reads the committed records


def test_a_confirmatory_comparison_no_claim_makes_is_measured_and_corrected(monkeypatch):
    from mpo_lab.reproduce import analysis as report  # where CONFIRMATORY is read

    extra = ("auc_success", "guess_mpo_token_is", "guess_ppo")
    assert extra not in report.CONFIRMATORY
    monkeypatch.setattr(report, "CONFIRMATORY", (*report.CONFIRMATORY, extra))
    monkeypatch.setitem(report.REGISTERED, "paper", report.CONFIRMATORY)
    rows = _synthetic_rows({"guess_mpo_token_is": 0.9, "guess_ppo": 0.1})
    comps = {(c.metric, c.a, c.b): c for c in _page(rows).confirmatory_comps}
    assert list(comps) == list(report.CONFIRMATORY)
    mine = comps[extra]
    assert mine.what == "MPO w/ token IS - PPO" and mine.verdict == REPRODUCED
    ps = [c.p for c in comps.values()]
    assert mine.p_holm == pytest.approx(holm(ps)[-1])
    summary = _page(rows).summary()
    assert f"**Bottom line.** {len(report.CONFIRMATORY)} comparisons" in summary
    row = next(r for r in _table(summary, "| task | comparison |") if r[:2] == ["GuessNumber", "MPO w/ token IS - PPO"])
    assert re.fullmatch(r"\+0\.400 ± 0\.000, p=0\.\d{3}, \*\*reproduced\*\*", row[2])
    assert row[3] == "—"  # the extra comparison is on one metric only


def test_at_chance_caveat():
    rows = [r | {"final_success": 0.0} for r in _synthetic_rows({})]
    caveats = [line for line in _page(rows).summary().splitlines() if line.startswith("- **KeyDoor**")]
    assert len(caveats) == 1 and "distinguishable from chance (0.004)" in caveats[0]


def test_curve_panels_leave_out_what_is_constant_by_construction():
    from mpo_lab.reproduce.figures import curve_panels

    def run(arm, seed):
        curve = [
            {"update": u, "entropy": 2.0 - 0.1 * u - 0.01 * seed, "explained_variance": math.nan, "turns": 8.0,
             "response_length": 128.0 + u}
            for u in range(4)
        ]  # fmt: skip
        return {"arm": arm, "seed": seed, "curve": curve, "evals": [{"update": 0, "success": 0.0}]}

    runs = [run(arm, seed) for arm in ("grpo", "gspo") for seed in (1, 2)]
    panels, dropped = curve_panels(runs, [("grpo", "GRPO"), ("gspo", "GSPO")])
    assert [m for m, _ in panels] == ["success", "entropy", "response_length"]
    assert dropped == [
        "critic explained variance (not defined for these arms)",
        "turns per episode (8.00 on every run)",
    ]


def test_figure_groups_follow_the_configuration():
    from mpo_lab.reproduce.figures import figure_groups

    present = {a.key for a in FULL.arms}
    groups = {(g.task, g.study): g for g in figure_groups(FULL, present)}
    assert list(groups) == [
        ("key_door", "table1"),
        ("search", "table1"),
        ("search", "relatives"),
        ("search", "beta"),
        ("search", "lambda"),
        ("search", "scale"),
        ("frozen_lake", "table1"),
        ("multi_hop", "table1"),
        ("guess_number", "table1"),
    ]
    assert [k for k, _ in groups["search", "beta"].arms] == [BETA_SWEEP[b] for b in sorted(BETA_SWEEP)]
    assert [k for k, _ in groups["search", "scale"].arms] == ["ppo", "mpo", "ppo_whiten", "mpo_whiten"]
    sub = figure_groups(FULL, {"mpo", "ppo"})
    assert [(g.task, g.study, [k for k, _ in g.arms]) for g in sub] == [("search", "table1", ["ppo", "mpo"])]


def test_curve_figure_axes_chance_and_clipping():
    pytest.importorskip("matplotlib")
    from mpo_lab.reproduce.figures import curves_figure

    def run(arm, seed):
        # Success near 1 and 0 with a spread that would take a 95% interval past [0, 1];
        # explained variance from -5 (a critic's first updates) up to 0.9.
        curve = [
            {"update": u, "entropy": 2.0 - 0.1 * u, "explained_variance": -5.0 + 1.5 * u + 0.1 * seed,
             "turns": 2.0 + seed, "response_length": 4.0 + seed}
            for u in range(5)
        ]  # fmt: skip
        evals = [{"update": u, "success": [0.0, 1.0][seed % 2] if u else 0.5} for u in (0, 4)]
        return {"arm": arm, "seed": seed, "curve": curve, "evals": evals}

    runs = [run(arm, seed) for arm in ("ppo", "mpo") for seed in range(3)]
    fig, caption = curves_figure(runs, [("ppo", "PPO"), ("mpo", "MPO")], "t", chance=0.25)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    by_title = {ax.get_title(): ax for ax in axes}
    assert len(axes) == 5 and caption == ""
    assert len(fig.axes) == 6  # a 2 x 3 grid, not one row; the sixth cell hidden
    success = by_title["validation success (held-out, T=1)"]
    assert success.get_ylim() == pytest.approx((-0.02, 1.02))
    assert any(line.get_label() == "chance" and line.get_ydata()[0] == 0.25 for line in success.get_lines())
    for band in success.collections:
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        assert ys.min() >= 0.0 and ys.max() <= 1.0  # the interval is clipped to [0, 1]
    ev = by_title["critic explained variance (axis cut at -1)"]
    assert ev.get_ylim() == pytest.approx((-1.0, 1.0))
    import matplotlib.pyplot as plt

    plt.close(fig)
