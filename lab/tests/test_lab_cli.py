"""The lab's command line: ``mpo-lab``'s subcommands, and ``mpo-rs reproduce`` through the
library's entry point group (listed by ``mpo-rs --help``, imported only when run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpo_lab import cli
from mpo_lab.reproduce.plan import PLANS, render_markdown

LAB = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)


def test_mpo_lab_plan_prints_the_committed_plan(capsys):
    assert cli.main(["plan", "instrument"]) == 0
    assert capsys.readouterr().out == render_markdown(PLANS["instrument"])
    assert (LAB / "docs" / "instrument-plan.md").read_text() == render_markdown(PLANS["instrument"])


def test_mpo_lab_lists_its_subcommands_and_refuses_an_unknown_one():
    r = _run("mpo_lab", "--help")
    assert r.returncode == 0 and all(name in r.stdout for name in cli.COMMANDS), r.stdout
    r = _run("mpo_lab", "reproduc")
    assert r.returncode == 2 and "did you mean reproduce?" in r.stderr, r.stderr


def test_mpo_rs_lists_reproduce_and_runs_the_labs():
    r = _run("mpo_rs.cli", "--help")
    assert r.returncode == 0 and "reproduce" in r.stdout and "from mpo-lab" in r.stdout, r.stdout
    r = _run("mpo_rs.cli", "reproduce", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: mpo-rs reproduce"), r.stdout[:200]
    r = _run("mpo_rs.cli", "reproduce", "--budget", "huge")
    assert r.returncode == 2 and r.stderr.startswith("mpo-rs reproduce: error: argument --budget"), r.stderr


@pytest.mark.parametrize("name", ["gates", "premise", "page"])
def test_each_subcommand_has_its_own_help(name):
    r = _run("mpo_lab", name, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: mpo-lab {name}"), r.stdout[:200]
