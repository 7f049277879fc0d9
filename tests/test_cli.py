"""The `mpo-rs advantages` command: Parquet in, Parquet out, equal to the numpy
estimators; groups scattered over row groups and files; atomic output under SIGKILL; and
every bad input or usage as a one-line error with the right exit code."""

from __future__ import annotations

import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from itertools import pairwise
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


def _slow_run_script(src: Path, dst: Path) -> str:
    """A child that runs the pipeline with a progress callback that sleeps, so there is
    time to kill it midway, deterministically."""
    return (
        "import time\n"
        "import mpo_rs\n"
        "from mpo_rs import _native\n"
        f"_native.advantages_parquet({str(src)!r}, {str(dst)!r}, _native.Estimator('mae'), mpo_rs.Columns(),\n"
        "    progress=lambda *a: time.sleep(0.05), batch_bytes=256 << 10)\n"
    )


def _signal_when_staged(proc: subprocess.Popen, directory: Path, min_bytes: int, sig: int) -> None:
    """Sends `sig` to `proc` once a staged temporary in `directory` has `min_bytes`.

    The run is paused (SIGSTOP) while the staged file is looked for, so on a loaded
    machine it cannot commit between the look and the signal; `sig` is delivered when it
    resumes."""

    def staged() -> bool:
        for p in directory.rglob("*"):
            in_temp = ".mpo-rs-" in str(p.relative_to(directory))  # a temp file or inside a temp dir
            try:
                if in_temp and p.is_file() and p.stat().st_size >= min_bytes:
                    return True
            except FileNotFoundError:  # renamed or removed while we looked
                pass
        return False

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run finished before it could be signalled"
        proc.send_signal(signal.SIGSTOP)
        try:
            if staged():
                proc.send_signal(sig)
                return
        finally:
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.002)
    proc.kill()
    raise AssertionError("no staged output appeared")


def _kill_when_staged(proc: subprocess.Popen, directory: Path, min_bytes: int) -> None:
    """SIGKILLs `proc` once a staged temporary in `directory` has `min_bytes`."""
    _signal_when_staged(proc, directory, min_bytes, signal.SIGKILL)
    proc.wait(timeout=60)  # every signal test has a deadline: a hang fails it


@pytest.fixture(scope="module")
def big_log_file(tmp_path_factory) -> Path:
    """~40 MB, so the staged output gets data on disk well before the run ends."""
    from mpo_rs.demo import write_rollout_log

    path = tmp_path_factory.mktemp("big") / "big.parquet"
    write_rollout_log(path, 1500, row_group_rows=100)
    return path


def _input_and_earlier_output(big_log_file: Path, tmp_path: Path, kind: str) -> tuple[Path, Path, bytes]:
    """(INPUT, OUTPUT, the earlier output's bytes) for a run to interrupt: a file, or a
    directory of one file, with an earlier OUTPUT of the same kind."""
    if kind == "file":
        out = tmp_path / "out.parquet"
        return big_log_file, out, earlier_output(out)
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    shutil.copy(big_log_file, src / "a.parquet")
    out.mkdir()
    return src, out, earlier_output(out / "a.parquet")


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_sigkill_midway_leaves_the_earlier_output_and_no_partial_file(big_log_file, tmp_path, kind):
    src, out, before = _input_and_earlier_output(big_log_file, tmp_path, kind)
    proc = subprocess.Popen([sys.executable, "-c", _slow_run_script(src, out)])
    _kill_when_staged(proc, tmp_path, min_bytes=1)
    assert proc.returncode == -signal.SIGKILL
    earlier = out if kind == "file" else out / "a.parquet"
    assert earlier.read_bytes() == before
    if kind == "directory":
        assert [p.name for p in out.iterdir()] == ["a.parquet"]
    # What a killed run leaves is hidden and recognisable; a rerun succeeds.
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible == (["out.parquet"] if kind == "file" else ["in", "out"])
    assert all(".mpo-rs-" in p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    ok("advantages", src, "-o", out, "-q")
    assert pq.read_metadata(earlier).num_rows == 1500


def test_sigkill_of_the_command_itself(big_log_file, tmp_path):
    src = tmp_path / "big.parquet"
    shutil.copy(big_log_file, src)
    out = tmp_path / "out.parquet"
    before = earlier_output(out)
    proc = subprocess.Popen([sys.executable, "-m", "mpo_rs.cli", "advantages", str(src), "-o", str(out)])
    _kill_when_staged(proc, tmp_path, min_bytes=1)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["big.parquet", "out.parquet"]


def _default_signals() -> None:
    """In the child before exec: the default action for the signals the tests send. A
    program started with a signal ignored keeps ignoring it (nohup relies on that), so a
    test run under nohup or as a background job would otherwise see no effect."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def test_ctrl_c_stops_cleanly(big_log_file, tmp_path):
    out = tmp_path / "out.parquet"
    before = earlier_output(out)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpo_rs.cli", "advantages", str(big_log_file), "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        # A parent that ignores SIGINT (a background job) or SIGHUP (nohup) passes that on; undo it.
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 60
    while not any(".mpo-rs-" in p.name for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before Ctrl-C"
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "mpo-rs: error: interrupted\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]
    assert out.read_bytes() == before


# What the installed `mpo-rs` script runs (pip writes the same three lines), so the tests
# need no script on PATH.
CONSOLE_SCRIPT = [sys.executable, "-c", "import re\nimport sys\nfrom _mpo_rs_cli import main\nsys.exit(main())"]


def _console_script(*args: object, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CONSOLE_SCRIPT, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A parent that ignores SIGINT (a background job) or SIGHUP (nohup) passes that on; undo it.
        preexec_fn=_default_signals,
        **kw,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("kind", ["file", "directory"])
def test_sigterm_midway_stops_like_ctrl_c(big_log_file, tmp_path, kind, sig):
    src, out, before = _input_and_earlier_output(big_log_file, tmp_path, kind)
    proc = _console_script("advantages", src, "-o", out)
    _signal_when_staged(proc, tmp_path, min_bytes=1, sig=sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err == f"mpo-rs: error: terminated by {signal.Signals(sig).name}\n"
    # No temporary is left behind, and the earlier output is as it was.
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out.parquet"] if kind == "file" else ["in", "out"])
    earlier = out if kind == "file" else out / "a.parquet"
    assert earlier.read_bytes() == before
    if kind == "directory":
        assert [p.name for p in out.iterdir()] == ["a.parquet"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_right_after_start_gives_no_traceback(big_log_file, tmp_path, sig):
    # In the first few tenths of a second the command is still importing numpy and the
    # extension; a signal there must be as quiet as one during the run.
    out = tmp_path / "out.parquet"
    before = earlier_output(out)
    message = "interrupted" if sig == signal.SIGINT else "terminated by SIGTERM"

    def check(proc: subprocess.Popen[str], err: str, when: object) -> None:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]
        if out.read_bytes() != before:
            # The run committed before the signal (a quiet machine finishes within the
            # longest delays): then OUTPUT is the new one, complete, whether the signal
            # came just after the commit or after the exit.
            assert proc.returncode in (0, 128 + sig, -sig), (when, proc.returncode, err)
            assert "Traceback" not in err and "Exception ignored" not in err, (when, err)  # a lost stop
            assert pq.read_metadata(out).num_rows == 1500, when
            out.write_bytes(before)
            return
        assert proc.returncode in (128 + sig, -sig), (when, proc.returncode, err)
        assert err in ("", f"mpo-rs: error: {message}\n"), (when, err)

    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5):
        proc = _console_script("advantages", big_log_file, "-o", out)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        if "Fatal Python error: init_" in err:
            # The interpreter itself was still starting (`init_import_site`,
            # `init_sys_streams`: before any line of mpo-rs ran); that is CPython's own
            # message, a few ms on an idle machine, longer on a loaded one.
            continue
        if err.endswith("KeyboardInterrupt\n") and '_mpo_rs_cli.py"' not in err and "mpo_rs/" not in err:
            # Ctrl-C while the interpreter was still loading the entry module itself
            # (finding or compiling `_mpo_rs_cli`; no frame of its file or of the package
            # in the traceback): no line of mpo-rs had run yet. Seen at 30 ms on a loaded
            # machine; the held-import case below covers ours.
            continue
        if err.startswith("Exception ignored") and err.endswith("KeyboardInterrupt: \n") and "mpo_rs" not in err:
            # Python's own Ctrl-C handler, before the console script installed its own (pip's
            # `import re`, the import of `_mpo_rs_cli`), raised inside a module lock's weakref
            # callback, and Python dropped it; the command then runs to the end. A stop that
            # reaches our handler there is sent again and prints nothing (the test above).
            out.write_bytes(before)
            continue
        # A signal before Python installed its handlers ends the process silently.
        check(proc, err, delay)
    # The same, deterministically inside the import of numpy: an audit hook says when
    # that import starts and holds it there.
    hold = (
        "import sys, time\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'numpy':\n"
        "        print('importing numpy', flush=True); time.sleep(30)\n"
        "sys.addaudithook(hook)\n"
    )
    argv = [sys.executable, "-c", hold + CONSOLE_SCRIPT[2], "advantages", str(big_log_file), "-o", str(out)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_signals,
    )
    assert proc.stdout is not None
    assert select.select([proc.stdout], [], [], 60)[0], "the child said nothing within 60 s"  # no hang
    assert proc.stdout.readline() == "importing numpy\n"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and err == f"mpo-rs: error: {message}\n", (proc.returncode, err)
    check(proc, err, "during the import of numpy")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_that_python_drops_in_a_callback_is_sent_again(sig):
    # A handler that runs inside a weakref callback (the import system's module locks have
    # them) has its exception printed as "Exception ignored" and dropped; the console script
    # must still stop, quietly.
    code = (
        "import signal, sys, weakref\n"
        "import _mpo_rs_cli as cli\n"
        "cli._install()\n"
        "class A: pass\n"
        "def cb(_):\n"
        f"    signal.raise_signal({int(sig)})\n"
        "    for _ in range(1000): pass  # the handler runs here, inside the callback\n"
        "a = A(); r = weakref.ref(a, cb)\n"
        "try:\n"
        "    del a\n"
        "    for _ in range(10**6): pass\n"
        "except KeyboardInterrupt as e:\n"
        "    print('stopped', type(e).__name__)\n"
        "else:\n"
        "    print('lost')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=_default_signals
    )
    kind = "KeyboardInterrupt" if sig == signal.SIGINT else "Terminated"
    assert (r.stdout, r.stderr) == (f"stopped {kind}\n", "")


def test_importing_mpo_rs_leaves_signal_handling_alone():
    code = (
        "import signal, mpo_rs, mpo_rs.cli, mpo_rs.arrow\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
        " signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["True", "True"], r.stderr


def test_output_equal_to_input_is_refused(log_file, tmp_path):
    before = log_file.read_bytes()
    for out in (log_file, log_file.parent / "." / log_file.name):
        r = run_cli("advantages", log_file, "-o", out)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and "is INPUT" in r.stderr
    assert log_file.read_bytes() == before


def _write_bad(tmp_path: Path, name: str, table: pa.Table, **kw) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=10, **kw)
    return path


def _with_column(table: pa.Table, name: str, column) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, column)


def _bad_inputs(tmp_path: Path):
    log = make_log(30, seed=3)
    t = table_of(log)
    off = log["offsets"]
    rows = lambda a: [list(map(float, a[x:y])) for x, y in pairwise(off)]  # noqa: E731
    values = rows(log["values"])
    f32 = pa.list_(pa.float32())

    null_list = list(values)
    null_list[14] = None
    null_elem = [list(v) for v in values]
    null_elem[23][1 if len(null_elem[23]) > 1 else 0] = None
    token = 1 if len(values[23]) > 1 else 0
    short = [list(v) for v in values]
    short[17] = short[17] + [0.0]
    masks = [list(map(int, log["mask"][x:y])) for x, y in pairwise(off)]
    masks[25][0] = 7
    nan = [list(v) for v in values]
    q = int(np.flatnonzero(log["mask"][off[12] : off[13]])[0])
    nan[12][q] = float("nan")
    obs = [list(v) for v in rows(log["rewards"])]
    zero_at = np.flatnonzero(log["mask"][off[8] : off[9]] == 0)
    scores = log["scores"].copy().astype(object)
    scores[21] = None

    cases = [
        (
            "null list",
            _with_column(t, "values", pa.array(null_list, f32)),
            [],
            r"row group 1: row 14, column `values`: null list",
        ),
        (
            "null element",
            _with_column(t, "values", pa.array(null_elem, f32)),
            [],
            rf"row group 2: row 23, column `values`: null element at token {token}",
        ),
        (
            "lengths",
            _with_column(t, "values", pa.array(short, f32)),
            [],
            r"row group 1: row 17: column `values` has \d+ tokens but `loss_mask` has \d+",
        ),
        (
            "mask value",
            _with_column(t, "loss_mask", pa.array(masks, pa.list_(pa.int32()))),
            [],
            r"row group 2: row 25, column `loss_mask`: the mask must hold 0 or 1, found 7 at token 0",
        ),
        (
            "nan",
            _with_column(t, "values", pa.array(nan, f32)),
            [],
            rf"row group 1: row 12, column `values`: NaN is not finite at token {q}",
        ),
        ("missing", t.drop_columns(["values"]), [], r"missing column `values`"),
        (
            "type",
            _with_column(t, "values", pa.array([["a"]] * 30)),
            [],
            r"column `values` has type .*, expected list<float or integer>",
        ),
        (
            "null score",
            _with_column(t.drop_columns(["rewards"]), "score", pa.array(list(scores), pa.float32())),
            ["--estimator", "grpo"],
            r"row group 2: row 21, column `score`: null value",
        ),
    ]
    if zero_at.size:
        obs[8][int(zero_at[0])] = 0.5
        cases.append(
            (
                "observation reward",
                _with_column(t, "rewards", pa.array(obs, f32)),
                [],
                rf"row group 0: row 8, column `rewards`: reward 0.5 at observation token {int(zero_at[0])}",
            )
        )
    for name, table, extra, pattern in cases:
        yield name, _write_bad(tmp_path, name.replace(" ", "-") + ".parquet", table), extra, pattern


def test_each_bad_input_is_one_line_naming_file_row_group_row_and_column(tmp_path):
    import re

    for name, path, extra, pattern in _bad_inputs(tmp_path):
        out = tmp_path / "out.parquet"
        r = run_cli("advantages", path, "-o", out, *extra)
        assert r.returncode == 1, (name, r.stderr)
        assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (name, r.stderr)
        assert r.stderr.startswith(f"mpo-rs: error: {path}"), (name, r.stderr)
        assert re.search(pattern, r.stderr), (name, r.stderr)
        assert not out.exists(), name


def test_corrupt_truncated_and_missing_files(log_file, tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet at all")
    cut = tmp_path / "cut.parquet"
    data = log_file.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    bad_page = tmp_path / "bad-page.parquet"
    mangled = bytearray(data)
    mangled[200:4000] = os.urandom(3800)  # inside the first column chunks
    bad_page.write_bytes(bytes(mangled))
    for path, pattern in [
        (garbage, "cannot read Parquet"),
        (cut, "cannot read Parquet"),
        (bad_page, r"row group 0: column `\w+`: cannot read Parquet"),
        (tmp_path / "missing.parquet", "cannot open input"),
    ]:
        r = run_cli("advantages", path, "-o", tmp_path / "out.parquet")
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and str(path) in r.stderr, r.stderr
        assert pattern in r.stderr or __import__("re").search(pattern, r.stderr), r.stderr
    assert not (tmp_path / "out.parquet").exists()


def _flip_inside_a_data_page(src: Path, dst: Path, column: str) -> None:
    """Copies `src` to `dst` with 4 bytes of `column`'s last data page in row group 0
    inverted: its payload, not a header and not the footer."""
    md = pq.ParquetFile(src).metadata.row_group(0)
    chunk = next(md.column(j) for j in range(md.num_columns) if md.column(j).path_in_schema.split(".")[0] == column)
    assert not chunk.has_dictionary_page
    end = chunk.data_page_offset + chunk.total_compressed_size
    data = bytearray(src.read_bytes())
    data[end - 8 : end - 4] = bytes(b ^ 0xFF for b in data[end - 8 : end - 4])
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("estimator", ["mae", "grpo"])
def test_page_checksums_are_verified(log, tmp_path, estimator):
    src = tmp_path / "crc.parquet"
    # Plain, uncompressed pages: a flipped byte changes a value and nothing else notices.
    pq.write_table(table_of(log, slice(0, 60)), src, write_page_checksum=True, compression="NONE", use_dictionary=False)
    out = tmp_path / "out.parquet"
    ok("advantages", src, "-o", out, "-q", "--estimator", estimator)
    before = out.read_bytes()
    column = "values" if estimator == "mae" else "score"
    bad = tmp_path / "bad.parquet"
    _flip_inside_a_data_page(src, bad, column)
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(bad, page_checksum_verification=True)
    r = run_cli("advantages", bad, "-o", out, "--estimator", estimator)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"{bad}: row group 0: column `{column}`: cannot read Parquet" in r.stderr, r.stderr
    assert "CRC checksum mismatch" in r.stderr, r.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "crc.parquet", "out.parquet"]


@pytest.mark.parametrize(
    "args, pattern",
    [
        ([], "required"),
        (["advantages", "IN"], "the following arguments are required: -o/--output"),
        (["advantages", "IN", "-o", "OUT", "--estimator", "ppo"], "invalid choice: 'ppo'"),
        (["advantages", "IN", "-o", "OUT", "--lam", "x"], "invalid float value"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, pattern):
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and pattern in r.stderr, r.stderr


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (["--estimator", "gae", "--beta", "0.5"], "`beta` does not apply to the gae estimator"),
        (["--estimator", "grpo", "--lam", "0.5"], "`lam` does not apply to the grpo estimator"),
        (["--lam", "2"], "`lam` = 2 is out of range"),
        (["--gamma", "nan"], "`gamma` = NaN is out of range"),
        (["--rewards-col", "rewards", "--score-col", "score"], "not both"),
    ],
)
def test_unusable_options_exit_2(log_file, tmp_path, extra, pattern):
    r = run_cli("advantages", log_file, "-o", tmp_path / "o.parquet", *extra)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and pattern in r.stderr, r.stderr


def test_path_combinations_exit_2(log_file, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(log_file, src / "a.parquet")
    (tmp_path / "file.parquet").write_bytes(b"x")
    for out, pattern in [
        (src / "out", "inside the INPUT directory"),
        (tmp_path, "is inside OUTPUT"),
        (tmp_path / "file.parquet", "OUTPUT must be a directory"),
    ]:
        r = run_cli("advantages", src, "-o", out)
        assert r.returncode == 2 and pattern in r.stderr, r.stderr
    r = run_cli("advantages", log_file, "-o", src)
    assert r.returncode == 2 and "OUTPUT must be a file path" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("advantages", empty, "-o", tmp_path / "o")
    assert r.returncode == 2 and "holds no .parquet files" in r.stderr


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
    assert scripts["mpo-rs"] == "_mpo_rs_cli:main"


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
