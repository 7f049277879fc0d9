"""``reproduce --out`` writes by the library's output rule (mpo_rs.outputs): never through a
link, never over what it did not write, and it says what would help instead of --overwrite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_optional_deps import _cli  # the library's tests/ (conftest.py)
from test_output_rules import assert_no_direct_writes

from mpo_lab._deps import INSTALL
from mpo_rs.cli import main
from mpo_rs.outputs import claim_output_dir


def test_reproduce_files_replace_a_symlink_and_never_write_through_it(tmp_path):
    # reproduce --out wrote through a symlinked reproduction.md; each file reproduce
    # writes goes through the one writer, whose directories are never links either.
    from mpo_lab.reproduce import run as reproduce_run
    from mpo_rs.outputs import write_file

    out = tmp_path / "out"
    claim_output_dir(out, "reproduce", "abc123", label="--out")
    precious = tmp_path / "precious.md"
    precious.write_text("mine")
    (out / "reproduction.md").symlink_to(precious)
    write_file(out / "reproduction.md", "# page\n")
    assert precious.read_text() == "mine" and (out / "reproduction.md").read_text() == "# page\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / reproduce_run.RUNS_DIR).symlink_to(elsewhere, target_is_directory=True)
    from mpo_lab.reproduce.presets import QUICK

    reproduce_run._save_run(out, QUICK, {"arm": "mpo", "seed": 0, "final": 1.0})
    assert list(elsewhere.iterdir()) == []
    saved = json.loads(reproduce_run.run_file(out, "mpo", 0).read_text())
    task = json.loads(json.dumps(QUICK.task(QUICK.arm("mpo").task).identity()))  # as saved: tuples become lists
    assert saved == {"config_hash": QUICK.config_hash(), "task": task, "arm": "mpo", "seed": 0, "final": 1.0}


@pytest.mark.parametrize("kind", ["file", "fifo", "dev-null", "dangling-link"])
def test_overwrite_refusals_say_what_would_help_instead_of_overwrite(tmp_path, capsys, kind):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("keep")
        helps = "give the path of a new or empty directory"
    elif kind == "fifo":
        os.mkfifo(out)
        helps = "choose a new path"
    elif kind == "dev-null":
        out = Path(os.devnull)
        helps = "choose a new path"
    else:
        out.symlink_to(tmp_path / "nowhere")
        helps = "remove it or choose a new path"
    for extra in (["--overwrite"], []):
        assert main(["reproduce", "--quick", "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert helps in err and "--overwrite" not in err, err
    if kind == "file":
        assert out.read_text() == "keep"


def test_overwrite_is_still_advised_where_it_helps(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    assert main(["reproduce", "--quick", "--out", str(out)]) == 2
    assert "or pass --overwrite to write into it anyway" in capsys.readouterr().err


def test_no_reproduce_module_writes_a_path_itself():
    # Every file of reproduce goes through mpo_rs.outputs.write_file.
    assert_no_direct_writes(sorted((Path(__file__).resolve().parents[1] / "mpo_lab" / "reproduce").glob("*.py")))


def test_reproduce_names_every_missing_dependency_in_one_line(tmp_path):
    """All of a command's missing dependencies at once, one command installing them all
    (not torch, then pyarrow, then matplotlib on three tries)."""
    out = tmp_path / "out"
    r = _cli(("torch", "pyarrow", "matplotlib"), "reproduce", "--quick", "--out", str(out))
    assert r.returncode == 1, r
    assert r.stderr == f"mpo-rs: error: `reproduce` needs torch, pyarrow, matplotlib: {INSTALL}\n", r.stderr
    r = _cli(("matplotlib",), "reproduce", "--quick", "--out", str(out))
    assert r.stderr == f"mpo-rs: error: `reproduce` needs matplotlib: {INSTALL}\n", r.stderr
    assert not out.exists()
