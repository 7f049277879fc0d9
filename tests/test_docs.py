"""The documentation runs as written: every fenced ``python``, ``bash`` and ``console`` block
of README.md and docs/*.md is executed here, or is marked not runnable with the reason on
the line before its fence, as ``<!-- not run: needs a GPU -->`` (the skip shows the reason).

The blocks of a page run in order, in one fresh directory per page holding a small rollout
log (``rollouts.parquet``, and the same file as ``rollouts/part-0.parquet``), as a reader
following the page would; the venv's ``bin`` is first on PATH and the checkout on PYTHONPATH (so ``examples.*`` imports, as from
the checkout's root). Python blocks run in a new interpreter; bash blocks with ``bash -e``;
in a ``console`` block the lines after ``$ `` are the commands (the rest is their output).
Every fence names its language, so nothing runnable hides as an unmarked block. Every
script under examples/ runs too (``python examples/x.py``: it prints what it did).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "bash", "console"}
# Languages that are shown, never run: data, output, diagrams, trees.
SHOWN = {"text", "json", "yaml", "toml"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
TIMEOUT = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, end = len(m["indent"]), i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        previous = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        marked = NOT_RUN.match(previous)
        code = "\n".join(ln[indent:] for ln in lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, m["lang"], code, marked["reason"] if marked else None))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
TO_RUN = [b for b in ALL if b.lang in RUNNABLE]


def test_every_fence_names_a_known_language():
    unknown = [f"{b.id} ({b.lang or 'no language'})" for b in ALL if b.lang not in RUNNABLE | SHOWN]
    assert not unknown, f"name the language of each fence (python, bash, console, or text to show): {unknown}"


def test_a_not_run_marker_stands_before_a_runnable_block():
    stray = [b.id for b in ALL if b.not_run is not None and b.lang not in RUNNABLE]
    assert not stray, stray


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """The files a block finds in its directory: a small rollout log, as a file and a folder."""
    pytest.importorskip("pyarrow")
    from mpo_rs.demo import write_rollout_log

    root = tmp_path_factory.mktemp("docs-template")
    write_rollout_log(root / "rollouts.parquet", 64, row_group_rows=16, seed=3)
    (root / "rollouts").mkdir()
    shutil.copy(root / "rollouts.parquet", root / "rollouts" / "part-0.parquet")
    return root


def _env(root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "Agg"
    return env


def _command(block: Block) -> list[str]:
    if block.lang == "python":
        return [sys.executable, "-c", block.code]
    if block.lang == "bash":
        return ["bash", "-e", "-o", "pipefail", "-c", block.code]
    # console: the commands follow "$ "; a trailing "\" continues one onto the next line.
    commands, pending = [], ""
    for line in block.code.splitlines():
        if pending or line.startswith("$ "):
            part = line if pending else line[2:]
            pending += part[:-1] + " " if part.endswith("\\") else part
            if not part.endswith("\\"):
                commands.append(pending)
                pending = ""
    return ["bash", "-e", "-o", "pipefail", "-c", "\n".join(commands)]


@pytest.fixture(scope="module")
def page_dirs(template, tmp_path_factory):
    """One working directory per page, made from the template on first use."""
    made: dict[Path, Path] = {}

    def work(page: Path) -> Path:
        if page not in made:
            made[page] = tmp_path_factory.mktemp(page.stem) / "work"
            shutil.copytree(template, made[page])
        return made[page]

    return work


def run_block(block: Block, work: Path, root: Path = ROOT) -> None:
    """Runs ``block`` in ``work`` with ``root`` on PYTHONPATH (skips one marked not runnable)."""
    if block.not_run is not None:
        pytest.skip(f"not run: {block.not_run}")
    r = subprocess.run(_command(block), cwd=work, env=_env(root), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, (
        f"{block.id} failed ({r.returncode}):\n{block.code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )


def run_example(script: Path, args: list[str], work: Path, root: Path = ROOT) -> None:
    """Runs the example ``script`` with ``args`` in ``work``; it must say what it did."""
    cmd = [sys.executable, str(script), *args]
    r = subprocess.run(cmd, cwd=work, env=_env(root), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{script.name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), f"{script.name} printed nothing"


@pytest.mark.parametrize("block", TO_RUN, ids=[b.id for b in TO_RUN])
def test_block_runs(block, page_dirs):
    run_block(block, page_dirs(block.page))


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# Arguments that keep an example short; each prints what it did.
EXAMPLE_ARGS: dict[str, list[str]] = {
    "ray_advantages.py": ["rollouts", "annotated", "--num-cpus", "1"],
}


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_as_a_script_and_says_what_it_did(script, template, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(template, work)
    run_example(script, EXAMPLE_ARGS.get(script.name, []), work)
