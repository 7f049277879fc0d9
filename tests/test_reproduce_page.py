"""The committed page is a function of the committed results: ``docs/reproduction.md``
re-renders byte for byte from ``docs/full/results.json`` (the guard of every change to the
report's code; a change of wording is made by ``python -m mpo_rs.reproduce.report docs``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_committed_page_re_renders_from_its_results():
    from mpo_rs.reproduce.report import page_figures, rerender

    page = (DOCS / "reproduction.md").read_text()
    assert len(page_figures(page)) >= 10
    rendered = rerender(DOCS)
    if rendered != page:
        for i, (a, b) in enumerate(zip(rendered.splitlines(), page.splitlines(), strict=False)):
            if a != b:
                pytest.fail(
                    f"line {i + 1} differs (run: python -m mpo_rs.reproduce.report docs):\n"
                    f"  rendered:  {a[:300]}\n  committed: {b[:300]}"
                )
        pytest.fail(f"lengths differ: {len(rendered)} rendered, {len(page)} committed")


def test_figure_names_on_the_docs_page():
    from mpo_rs.reproduce.report import docs_figure

    assert docs_figure("img/confirmatory.png") == "img/reproduction/confirmatory.png"
    assert docs_figure("diagnosis/mpo/share_histogram.png") == "img/reproduction/mpo_share_histogram.png"


def test_the_committed_results_read_under_todays_names():
    # The committed runs' results.json keep the key names they were written with ("family",
    # "family_comparisons"); read_results is the one place that reads both spellings.
    from mpo_rs.reproduce.report import read_results

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
    from mpo_rs.reproduce.page import README_MARKERS
    from mpo_rs.reproduce.report import rerender_readme_summary

    readme = (DOCS.parent / "README.md").read_text()
    start, end = readme.find(README_MARKERS[0]), readme.find(README_MARKERS[1])
    assert 0 <= start < end, "the README has lost its summary markers"
    summary = rerender_readme_summary(DOCS)
    assert readme[start : end + len(README_MARKERS[1])] == summary, "run: python -m mpo_rs.reproduce.report docs"
    assert "**Bottom line.**" in summary and "| MPO − PPO | MPO − GRPO |" in summary


def test_a_readme_is_written_only_between_its_markers(tmp_path):
    from mpo_rs.reproduce.page import README_MARKERS
    from mpo_rs.reproduce.report import write_readme_summary

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
    from mpo_rs.reproduce.presets import FULL, INSTRUMENT
    from mpo_rs.reproduce.when import when_inputs

    rows = [{"arm": a.key, "seed": 1} for a in INSTRUMENT.arms]
    tasks, ladder_task, _ = when_inputs(INSTRUMENT, rows, {})
    assert ladder_task == "multi_hop" and tasks == [spec.name for spec in INSTRUMENT.tasks]
    without = [r for r in rows if "_ref" not in r["arm"]]
    assert when_inputs(INSTRUMENT, without, {})[1] == "search"
    assert when_inputs(FULL, [{"arm": a.key, "seed": 1} for a in FULL.arms], {})[1] == "search"
