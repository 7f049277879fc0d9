"""The `mpo-rs advantages` command: Parquet in, Parquet out, equal to the numpy
estimators; groups scattered over row groups and files; what it refuses to replace; its
progress lines and flags. How it stops is tests/test_cli_stops.py; bad input and usage,
tests/test_cli_errors.py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from test_arrow import make_log as arrow_log  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs import synthetic  # noqa: E402
from mpo_rs.arrow import OUTPUT_COLUMNS  # noqa: E402


def make_log(rows: int, seed: int = 0, groups: int = 6) -> dict[str, np.ndarray]:
    """mpo_rs.synthetic's TINY shape with normal values, three score levels, scattered
    group ids and token ids."""
    return arrow_log(rows, seed, groups, values="normal", tokens=True, score_levels=3)


def table_of(log: dict[str, np.ndarray], rows: slice = slice(None)) -> pa.Table:
    batch = synthetic.FlatBatch(
        log["values"],
        log["mask"],
        log["offsets"],
        log["rewards"],
        log["scores"],
        log["groups"],
        token_ids=log["token_ids"],
    )
    t = synthetic.to_arrow(batch)
    t = t.add_column(1, "prompt", pa.array([f"prompt {g}" for g in log["groups"]]))  # a string column carried through
    start, stop, _ = rows.indices(t.num_rows)
    return t.slice(start, stop - start)


def run_cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpo_rs.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(*args: object) -> subprocess.CompletedProcess[str]:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return r


def flat(path: Path, column: str) -> np.ndarray:
    t = pq.read_table(path, columns=[column])
    return np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in t[column].chunks])


@pytest.fixture(scope="module")
def log() -> dict[str, np.ndarray]:
    return make_log(400, seed=11)


@pytest.fixture(scope="module")
def log_file(log, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("logs") / "rollouts.parquet"
    pq.write_table(table_of(log), path, row_group_size=37)  # groups span many row groups
    return path


def test_mae_output_equals_the_numpy_estimator_and_keeps_every_input(log, log_file, tmp_path):
    out = tmp_path / "out.parquet"
    r = ok("advantages", log_file, "-o", out)
    assert r.stdout.startswith(f"mpo-rs: wrote {out}: 400 rows, {log['mask'].size:,} tokens")
    assert r.stderr == ""  # no progress when stderr is not a terminal
    want = mpo_rs.mae_advantages(log["values"], log["mask"], log["offsets"], rewards=log["rewards"])
    np.testing.assert_array_equal(flat(out, "advantages"), want.advantages)
    np.testing.assert_array_equal(flat(out, "returns"), want.returns)
    np.testing.assert_array_equal(flat(out, "turn_advantages"), want.turn_advantages)
    got = pq.read_table(out)
    original = pq.read_table(log_file)
    assert got.column_names == original.column_names + list(OUTPUT_COLUMNS)
    assert got.select(original.column_names).equals(original)


def test_option_flags_for_some_of_the_options():
    """A tool taking some of the options (examples/ray_advantages.py) gets their flags from
    the table, and only theirs."""
    import argparse

    from mpo_rs.cli import add_option_flags, option_args

    names = ["lam", "norm_std"]
    parser = argparse.ArgumentParser()
    add_option_flags(parser, names)
    assert option_args(parser.parse_args(["--lam", "0.9", "--no-norm-std"]), names) == {"lam": 0.9, "norm_std": False}
    assert option_args(parser.parse_args([]), names) == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["--beta", "0.5"])


def test_gae_with_parameters(log, log_file, tmp_path):
    out = tmp_path / "gae.parquet"
    ok("advantages", log_file, "-o", out, "--estimator", "gae", "--lam", 0.9, "--gamma", 0.99, "-q")
    want = mpo_rs.gae_advantages(
        log["values"], log["mask"], log["offsets"], rewards=log["rewards"], lam=0.9, gamma=0.99
    )
    np.testing.assert_array_equal(flat(out, "advantages"), want.advantages)
    np.testing.assert_array_equal(flat(out, "returns"), want.returns)


@pytest.mark.parametrize(
    "estimator, kw",
    [("grpo", {}), ("drgrpo", {"norm_std": False}), ("rloo", {"leave_one_out": True})],
)
def test_group_baselines_over_row_groups_and_files(log, tmp_path, estimator, kw):
    # Three files of uneven size with small row groups; every group spans several of both.
    src = tmp_path / "in"
    src.mkdir()
    table = table_of(log)
    for name, rows in [
        ("part-0.parquet", slice(0, 90)),
        ("part-1.parquet", slice(90, 250)),
        ("part-2.parquet", slice(250, 400)),
    ]:
        pq.write_table(table.slice(rows.start, rows.stop - rows.start), src / name, row_group_size=23)
    out = tmp_path / "out"
    r = ok("advantages", src, "-o", out, "--estimator", estimator, "--score-col", "score")
    assert "3 files" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    per_row = mpo_rs.group_advantages(log["scores"], log["groups"], **kw)
    want = mpo_rs.broadcast_to_tokens(per_row, log["mask"], log["offsets"])
    got = np.concatenate([flat(out / f"part-{i}.parquet", "advantages") for i in range(3)])
    np.testing.assert_array_equal(got, want)


def test_polars_written_large_list_file(log, tmp_path):
    pl = pytest.importorskip("polars")
    path = tmp_path / "polars.parquet"
    pl.from_arrow(table_of(log)).write_parquet(path, row_group_size=50)  # zstd, large_list
    assert pq.read_schema(path).field("values").type == pa.large_list(pa.float32())
    out = tmp_path / "out.parquet"
    ok("advantages", path, "-o", out, "-q")
    want = mpo_rs.mae_advantages(log["values"], log["mask"], log["offsets"], rewards=log["rewards"])
    np.testing.assert_array_equal(flat(out, "advantages"), want.advantages)
    back = pl.read_parquet(out)
    assert back.schema["advantages"] == pl.List(pl.Float32)
    assert back.schema["turn_index"] == pl.List(pl.Int32)
    assert back.select(pl.from_arrow(table_of(log)).columns).equals(pl.read_parquet(path))


def earlier_output(path: Path) -> bytes:
    """Writes an earlier output of the tool at `path` (a small log with the advantage
    columns appended: only such a file may be replaced) and returns its bytes."""
    pq.write_table(mpo_rs.arrow.with_advantages(table_of(make_log(8, seed=9))), path)
    return path.read_bytes()


def test_quiet_prints_nothing_and_output_is_replaced(log_file, tmp_path):
    out = tmp_path / "out.parquet"
    earlier_output(out)
    r = ok("advantages", log_file, "-o", out, "--quiet")
    assert r.stdout == "" and r.stderr == ""
    assert pq.read_metadata(out).num_rows == 400
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]


def test_directory_output_replaces_an_earlier_one_whole(log, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(table_of(log, slice(0, 100)), src / "a.parquet")
    out = tmp_path / "out"
    out.mkdir()
    earlier_output(out / "stale.parquet")
    ok("advantages", src, "-o", out, "-q")
    assert sorted(p.name for p in out.iterdir()) == ["a.parquet"]
    # A directory holding anything but earlier outputs is not replaced.
    (out / "notes.txt").write_text("mine")
    r = run_cli("advantages", src, "-o", out)
    assert r.returncode == 2 and "refusing to replace it" in r.stderr
    assert (out / "notes.txt").exists()


def test_output_equal_to_input_is_refused(log_file, tmp_path):
    before = log_file.read_bytes()
    for out in (log_file, log_file.parent / "." / log_file.name):
        r = run_cli("advantages", log_file, "-o", out)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and "is INPUT" in r.stderr
    assert log_file.read_bytes() == before


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_input_linked_to_a_file_inside_output_is_refused_and_kept(log_file, tmp_path, link):
    # `in/` holds a link to `out/real.parquet`: replacing `out/` would delete the input.
    out = tmp_path / "out"
    ok("advantages", log_file, "-o", tmp_path / "first.parquet")
    out.mkdir()
    real = out / "real.parquet"
    shutil.copy(log_file, real)
    before = real.read_bytes()
    src = tmp_path / "in"
    src.mkdir()
    (os.symlink if link == "symlink" else os.link)(real, src / "a.parquet")
    r = run_cli("advantages", src, "-o", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "replacing OUTPUT would delete it" in r.stderr, r.stderr
    assert real.read_bytes() == before


def test_dev_null_output_is_refused(log_file):
    # Defect 1 (issue 18): as root, the atomic rename turned /dev/null into a Parquet file.
    r = run_cli("advantages", log_file, "-o", "/dev/null")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "/dev/null is a character device" in r.stderr and "never replaced" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("through_symlink", [False, True])
def test_fifo_output_is_refused_and_not_opened(log_file, tmp_path, through_symlink):
    # Defect 1: a FIFO (or a symlink to one; symlinks are resolved) is never replaced, and
    # never opened (opening a FIFO with no writer would block: the timeout would show it).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = fifo
    if through_symlink:
        out = tmp_path / "out.parquet"
        out.symlink_to(fifo)
    r = run_cli("advantages", log_file, "-o", out, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is a FIFO" in r.stderr, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"fifo", out.name})


def test_output_directory_holding_a_raw_log_is_refused_and_kept(log, tmp_path):
    # Defect 3: "holds nothing but Parquet files" is true of every log directory.
    src, dst = tmp_path / "dsA", tmp_path / "dsB"
    src.mkdir()
    dst.mkdir()
    pq.write_table(table_of(log, slice(0, 50)), src / "a.parquet")
    pq.write_table(table_of(log, slice(50, 100)), dst / "precious_raw.parquet")
    before = (dst / "precious_raw.parquet").read_bytes()
    r = run_cli("advantages", src, "-o", dst)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "precious_raw.parquet, which is not an output of mpo-rs advantages" in r.stderr, r.stderr
    assert "remove it or choose a new directory" in r.stderr, r.stderr
    assert [p.name for p in dst.iterdir()] == ["precious_raw.parquet"]
    assert (dst / "precious_raw.parquet").read_bytes() == before
    # A directory of earlier outputs (and hidden names) is replaced.
    (dst / "precious_raw.parquet").unlink()
    earlier_output(dst / "a.parquet")
    (dst / "_SUCCESS").write_text("")
    ok("advantages", src, "-o", dst, "-q")
    assert sorted(p.name for p in dst.iterdir()) == ["a.parquet"]


def test_output_file_that_is_not_an_earlier_output_is_refused_and_kept(log_file, tmp_path):
    # Defect 3, a file OUTPUT: a raw log, or anything else, is not replaced.
    out = tmp_path / "precious.parquet"
    shutil.copy(log_file, out)
    before = out.read_bytes()
    r = run_cli("advantages", log_file, "-o", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "precious.parquet is not an output of mpo-rs advantages" in r.stderr, r.stderr
    assert "remove it or choose a new path" in r.stderr, r.stderr
    assert out.read_bytes() == before
    # An earlier output is replaced.
    ok("advantages", log_file, "-o", tmp_path / "first.parquet", "-q")
    ok("advantages", log_file, "-o", tmp_path / "first.parquet", "-q", "--estimator", "gae")
    assert pq.read_metadata(tmp_path / "first.parquet").num_rows == 400


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_input_listed_twice_through_a_link_is_refused(log_file, tmp_path, link):
    # Defect 6: `b.parquet -> a.parquet` was read twice, and GRPO counted it twice.
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(log_file, src / "a.parquet")
    (os.symlink if link == "symlink" else os.link)(src / "a.parquet", src / "b.parquet")
    for estimator in ("mae", "grpo"):
        r = run_cli("advantages", src, "-o", tmp_path / "out", "--estimator", estimator)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"{src / 'a.parquet'} and {src / 'b.parquet'} are the same file" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_progress_line_on_a_terminal(log_file, tmp_path):
    from mpo_rs import cli

    class Tty:
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

    tty = Tty()
    p = cli._Progress(tty, enabled=True)  # type: ignore[arg-type]
    p.update("write", 10, 2_500_000, 40, 0.5)
    p.clear()
    assert "writing 10/40 rows, 2.5M tokens, 5.0M tokens/s" in tty.text
    assert tty.text.endswith("\r")


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    if "mpo-rs" not in scripts:
        pytest.skip("package metadata not installed (source tree)")
    assert scripts["mpo-rs"] == "mpo_rs_cli:main"


def test_progress_lines_in_a_log_file_when_stderr_is_not_a_terminal(log_file, tmp_path, monkeypatch, capsys):
    """Defect (issue 20, item 8): progress showed only on a terminal; a batch job's log
    stayed empty until the run ended. Now a line is printed every LOG_PERIOD_S seconds."""
    from mpo_rs import cli

    monkeypatch.setattr(cli, "LOG_PERIOD_S", 0.0)
    assert cli.main(["advantages", str(log_file), "-o", str(tmp_path / "a.parquet")]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and "\r" not in err, err
    assert all(line.startswith("mpo-rs: ") for line in lines), err
    assert any("writing" in line and "rows" in line and "tokens/s" in line for line in lines), err
    # -q still silences it.
    assert cli.main(["advantages", str(log_file), "-o", str(tmp_path / "b.parquet"), "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_progress_log_lines_are_spaced_by_the_period():
    from mpo_rs import cli

    class Log:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

    log = Log()
    p = cli._Progress(log, enabled=True, terminal=False, period=3600.0)  # type: ignore[arg-type]
    for i in range(100):
        p.update("write", i, 1000 * i, 100, 0.5)
    p.clear()
    assert log.text == ""  # a run shorter than the period prints nothing
    p = cli._Progress(log, enabled=True, terminal=False, period=0.0)  # type: ignore[arg-type]
    p.update("write", 10, 2_500_000, 40, 0.5)
    p.clear()
    assert log.text == "mpo-rs: writing 10/40 rows, 2.5M tokens, 5.0M tokens/s (0 s)\n"


def test_every_column_flag_of_every_command_has_help_text():
    """Issue 20, item 8: ``diagnose --help`` must document --values-col/--mask-col/--rewards-col
    (the column flags come from the column spec, mpo_rs.columns.add_flags)."""
    import argparse

    from mpo_rs import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    seen = set()
    for command, p in sub.choices.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.endswith("-col"):
                    seen.add((command, opt))
                    assert action.help and action.help != argparse.SUPPRESS, (command, opt)
                    assert "default" in action.help, (command, opt, action.help)
    for opt in ("--values-col", "--mask-col", "--rewards-col"):
        assert ("diagnose", opt) in seen and ("advantages", opt) in seen
    text = sub.choices["diagnose"].format_help()
    for opt in ("--values-col", "--mask-col", "--rewards-col"):
        line = next(line for line in text.splitlines() if line.strip().startswith(opt))
        assert line.strip() != f"{opt} NAME", line  # the help follows on the flag's line


def test_missing_column_error_names_the_flag_that_maps_it(tmp_path):
    """Issue 20, item 8: a missing column was reported with no hint of the flag to map it."""
    path = tmp_path / "log.parquet"
    pq.write_table(
        pa.table(
            {
                "values": pa.array([[0.0, 1.0]], pa.list_(pa.float32())),
                "response_mask": pa.array([[1, 1]], pa.list_(pa.int8())),
                "score": [1.0],
            }
        ),
        path,
    )
    for command in (("advantages", path, "-o", tmp_path / "out.parquet"), ("diagnose", path)):
        r = run_cli(*command)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "missing column `loss_mask` (columns are: values, response_mask, score)" in r.stderr, r.stderr
        assert r.stderr.rstrip().endswith("; name the column to use with --mask-col NAME"), r.stderr
