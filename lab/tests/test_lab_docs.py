"""The lab's documentation runs as written, by the library's rules (tests/test_docs.py): every
fenced ``python``, ``bash`` and ``console`` block of lab/README.md and lab/docs/*.md runs, or is
marked not runnable with its reason; every script under lab/examples runs. Blocks run from a
fresh directory per page, with the lab's folder on PYTHONPATH (so ``examples.my_env`` imports,
as from lab/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_docs import RUNNABLE, SHOWN, blocks, run_block, run_example

LAB = Path(__file__).resolve().parents[1]
PAGES = [LAB / "README.md", *sorted((LAB / "docs").glob("*.md"))]
ALL = [b for page in PAGES for b in blocks(page)]
TO_RUN = [b for b in ALL if b.lang in RUNNABLE]
EXAMPLES = sorted((LAB / "examples").glob("*.py"))
# Arguments that keep an example short; each prints what it did.
EXAMPLE_ARGS: dict[str, list[str]] = {
    "rollout_log_diagnose.py": ["--updates", "2", "--tasks", "2", "--group-size", "2"],
}


def test_every_fence_names_a_known_language():
    unknown = [f"{b.id} ({b.lang or 'no language'})" for b in ALL if b.lang not in RUNNABLE | SHOWN]
    assert not unknown, f"name the language of each fence (python, bash, console, or text to show): {unknown}"


@pytest.mark.parametrize("block", TO_RUN, ids=[b.id for b in TO_RUN])
def test_block_runs(block, page_dirs):
    run_block(block, page_dirs(block.page), LAB)


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_as_a_script_and_says_what_it_did(script, template, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(template, work)
    run_example(script, EXAMPLE_ARGS.get(script.name, []), work, LAB)
