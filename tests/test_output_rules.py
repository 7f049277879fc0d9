"""The rules every writer follows (docs/reliability.md, "Writers: outputs never alias
inputs or follow links"): an output that is, contains or lies inside an input is refused,
whether or not it exists yet (rust/logs/src/aliasing.rs); a report's files are written
whole and never through a link, a symlink where one goes being replaced
(rust/logs/src/atomic.rs); and a refusal that ``--overwrite`` cannot lift does not advise it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mpo_rs import InvalidOptionError, _native  # noqa: E402
from mpo_rs.cli import main  # noqa: E402
from mpo_rs.rollout_log import RolloutLogWriter  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def write_log(directory: Path, rows: int = 8, seed: int = 0) -> Path:
    """A small rollout log of three-turn trajectories (values vary: diagnose can read it)."""
    rng = np.random.default_rng(seed)
    turns = np.array([1, 1, 1, 0, 0, 1, 1, 1, 0, 1], bool)
    with RolloutLogWriter(directory) as w:
        w.append_padded(
            input_ids=rng.integers(0, 100, (rows, turns.size)),
            loss_mask=np.tile(turns, (rows, 1)),
            values=rng.normal(size=(rows, turns.size)).astype(np.float32),
            scores=(np.arange(rows) % 2).astype(np.float32),
            group_ids=np.arange(rows) // 2,
            step=0,
        )
    return directory


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ outputs and inputs


def test_ray_refuses_an_output_inside_its_input_that_does_not_exist_yet(tmp_path):
    # The check returned early when the output's parent did not exist: a Parquet part
    # landed inside IN and the next read of IN failed.
    pytest.importorskip("ray")
    from mpo_rs.integrations import ray as mpo_ray

    source = write_log(tmp_path / "in")
    before = tree(source)
    link = tmp_path / "link"
    link.symlink_to(source)
    for output in (source / "missing" / "new", link / "missing" / "new", tmp_path / "x" / ".." / "in" / "a" / "b"):
        with pytest.raises(InvalidOptionError, match="is inside the INPUT directory"):
            mpo_ray.advantages_parquet(source, output)
    assert tree(source) == before and not (source / "missing").exists()


def test_the_cli_refuses_an_output_inside_its_input_that_does_not_exist_yet(tmp_path, capsys):
    source = write_log(tmp_path / "in")
    assert main(["advantages", str(source), "-o", str(source / "missing" / "new")]) == 2
    assert "is inside the INPUT directory" in capsys.readouterr().err
    assert not (source / "missing").exists()


def test_diagnose_refuses_a_report_dir_inside_its_input_that_does_not_exist_yet(tmp_path, capsys):
    source = write_log(tmp_path / "in")
    before = tree(source)
    for report in (source / "report", source / "missing" / "report"):
        assert main(["diagnose", str(source), "-o", str(report)]) == 2
        err = capsys.readouterr().err
        assert "REPORT_DIR" in err and "is inside the INPUT directory" in err, err
    assert tree(source) == before


def test_diagnose_refuses_a_report_dir_that_contains_its_input(tmp_path, capsys):
    # An earlier report (its marker present) with the log moved inside it was written into.
    report = tmp_path / "report"
    assert main(["diagnose", str(write_log(tmp_path / "first")), "-o", str(report)]) == 0
    source = write_log(report / "rollouts", seed=1)
    before = tree(report)
    assert main(["diagnose", str(source), "-o", str(report)]) == 2
    err = capsys.readouterr().err
    assert "is inside REPORT_DIR" in err and "choose a path that does not contain INPUT" in err, err
    assert tree(report) == before
    # The same rule from the library: write_report and the binding.
    with pytest.raises(InvalidOptionError, match="is inside REPORT_DIR"):
        _native.claim_output_dir(report, "diagnose", label="REPORT_DIR", inputs=[source])
    with pytest.raises(InvalidOptionError, match="is INPUT"):
        _native.check_output_dir(source, "diagnose", overwrite=True, inputs=[source])


# ------------------------------------------------------------------ links


def test_diagnose_replaces_a_symlinked_figure_or_temporary_and_never_writes_through_it(tmp_path):
    pytest.importorskip("matplotlib")
    source = write_log(tmp_path / "in")
    report = tmp_path / "report"
    assert main(["diagnose", str(source), "-o", str(report)]) == 0
    outside = {name: tmp_path / f"precious-{name}" for name in ("share_histogram.png", ".summary.json.tmp")}
    for name, target in outside.items():
        target.write_bytes(b"someone's file")
        (report / name).unlink(missing_ok=True)
        (report / name).symlink_to(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (report / "summary.json").unlink()
    (report / "summary.json").symlink_to(elsewhere / "summary.json")  # dangling
    assert main(["diagnose", str(source), "-o", str(report)]) == 0
    for target in outside.values():
        assert target.read_bytes() == b"someone's file"
    assert not (elsewhere / "summary.json").exists()
    png = report / "share_histogram.png"
    assert not png.is_symlink() and png.read_bytes().startswith(PNG)
    summary = report / "summary.json"
    assert not summary.is_symlink() and json.loads(summary.read_text())["all"]["trajectories"] == 8
    assert [p.name for p in report.iterdir() if ".mpo-rs-" in p.name] == [".mpo-rs-output"], "no temporary left"


# What a module would write a report file with, directly (following a planted link).
DIRECT_WRITES = (
    ".write_text(",
    ".write_bytes(",
    ".savefig(out",
    ".savefig(path",
    "pq.write_table(",
    "torch.save(saved, temp",
)


def assert_no_direct_writes(modules: list[Path]) -> None:
    """None of ``modules`` writes a path itself: every file goes through mpo_rs.outputs."""
    for module in modules:
        found = [d for d in DIRECT_WRITES if d in module.read_text()]
        assert not found, f"{module.name} writes directly: {found}"


def test_no_report_writer_writes_a_path_itself():
    # Every file of diagnose goes through mpo_rs.outputs.write_file (the lab's tests hold
    # reproduce to the same rule).
    assert_no_direct_writes(
        sorted((Path(__file__).resolve().parents[1] / "python" / "mpo_rs" / "diagnose").glob("*.py"))
    )


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_a_relative_path_that_leaves_the_report_is_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match=r"without `\.\.`"):
        _native.write_output_file(tmp_path, "../escape", b"x")
    assert not (tmp_path.parent / "escape").exists()
