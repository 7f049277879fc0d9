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

    written = json.loads((DOCS / "full" / "results.json").read_text())
    assert "family" in written and "confirmatory" not in written  # the committed file, as written
    read = read_results(written)
    assert (
        read["confirmatory"] == written["family"] and read["confirmatory_comparisons"] == written["family_comparisons"]
    )
    assert "family" not in read and "family_comparisons" not in read and read["runs"] == written["runs"]
    assert read_results(read) == read  # today's names read as they are
