"""The committed page is a function of the committed results: ``docs/reproduction.md``
re-renders byte for byte from ``docs/full/results.json`` (the guard of every change to the
report's code that must not change what it says)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _figures(page: str) -> list[tuple[str, str, str]]:
    """The page's figures as (title, path, caption): the one part of the page that is not in
    results.json for a run that predates ``results["figures"]``."""
    section = page.split("\n## Figures\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.split(r"\n### ", "\n" + section.strip("\n"))[1:]:
        title, rest = block.split("\n", 1)
        image = re.match(r"\n!\[(.*)\]\((.*)\)\n", rest + "\n")
        assert image and image.group(1) == title, block
        caption = rest[image.end() :].strip("\n")
        out.append((title, image.group(2), caption))
    return out


def test_the_committed_page_re_renders_from_its_results():
    from mpo_rs.reproduce.config import CONFIGS
    from mpo_rs.reproduce.report import page_from_results

    results = json.loads((DOCS / "full" / "results.json").read_text())
    committed = {c.config_hash(): c for c in CONFIGS.values()}
    assert results["config_hash"] in committed, "the committed results are not of a committed configuration"
    config = committed[results["config_hash"]]
    page = (DOCS / "reproduction.md").read_text()
    figures = results.get("figures") or _figures(page)
    assert len(figures) >= 10
    rendered = page_from_results(results, config, figures, docs_dir=DOCS)
    if rendered != page:
        for i, (a, b) in enumerate(zip(rendered.splitlines(), page.splitlines(), strict=False)):
            if a != b:
                pytest.fail(f"line {i + 1} differs:\n  rendered:  {a[:300]}\n  committed: {b[:300]}")
        pytest.fail(f"lengths differ: {len(rendered)} rendered, {len(page)} committed")
