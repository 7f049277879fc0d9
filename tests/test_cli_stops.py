"""How `mpo-rs advantages` stops: SIGKILL of the child or the command midway leaves an earlier
output as it was and no partial file; Ctrl-C, SIGTERM and SIGHUP stop it cleanly with one line
and the exit code 128 + the signal, at any moment from the start; `import mpo_rs` leaves the
signal handling alone."""

from __future__ import annotations

import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


from test_cli import earlier_output, ok  # noqa: E402


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
CONSOLE_SCRIPT = [sys.executable, "-c", "import re\nimport sys\nfrom mpo_rs_cli import main\nsys.exit(main())"]


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
        if err.endswith("KeyboardInterrupt\n") and 'mpo_rs_cli.py"' not in err and "mpo_rs/" not in err:
            # Ctrl-C while the interpreter was still loading the entry module itself
            # (finding or compiling `mpo_rs_cli`; no frame of its file or of the package
            # in the traceback): no line of mpo-rs had run yet. Seen at 30 ms on a loaded
            # machine; the held-import case below covers ours.
            continue
        if err.startswith("Exception ignored") and err.endswith("KeyboardInterrupt: \n") and "mpo_rs" not in err:
            # Python's own Ctrl-C handler, before the console script installed its own (pip's
            # `import re`, the import of `mpo_rs_cli`), raised inside a module lock's weakref
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
        "import mpo_rs_cli as cli\n"
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
