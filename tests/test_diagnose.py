"""`mpo-rs diagnose` and `mpo_rs.diagnose`: streamed value-structure diagnostics (issue 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("matplotlib")

from mpo_rs._deps import install_hint  # noqa: E402
from mpo_rs.cli import main  # noqa: E402
from mpo_rs.demo import write_rollout_log  # noqa: E402
from mpo_rs.diagnose import diagnose_logs  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _log(path, rows, score, step=None):
    """rows: list of (values, mask) per trajectory."""
    cols = {
        "values": pa.array([v for v, _ in rows], pa.list_(pa.float32())),
        "loss_mask": pa.array([[bool(x) for x in m] for _, m in rows], pa.list_(pa.bool_())),
        "score": pa.array(score, pa.float32()),
    }
    if step is not None:
        cols["step"] = pa.array(step, pa.int64())
    pq.write_table(pa.table(cols), path, row_group_size=2)
    return path


def test_hand_made_trajectories_have_their_known_shares(tmp_path):
    rows = [
        ([0, 0, 9, 1, 1], [1, 1, 0, 1, 1]),  # all variance between turns
        ([0, 2, 9, 0, 2], [1, 1, 0, 1, 1]),  # all within
        ([0, 1], [1, 1]),  # one turn: left out of the aggregates
        ([0, 0, 9, 1, 3], [1, 1, 0, 1, 1]),  # both parts
    ]
    path = _log(tmp_path / "log.parquet", rows, score=[1, 0, 1, 0], step=[1, 1, 2, 2])
    d = diagnose_logs(path, batch_rows=3)
    assert d.batches == 2 and d.rows == 4
    np.testing.assert_allclose(d.between_share[:2], [1.0, 0.0])
    v = np.array([0, 0, 1, 3.0])  # turn means 0 and 2 around the mean 1
    assert np.isclose(d.total[3], v.var())
    assert np.isclose(d.between[3], (2 * (0 - 1) ** 2 + 2 * (2 - 1) ** 2) / 4)
    s = d.summary()
    assert s["all"]["trajectories"] == 3 and s["excluded_fewer_than_two_turns_or_constant"] == 1
    assert s["by_outcome"]["success (outcome > 0)"]["median_between_share"] == 1.0
    assert set(s["by_step"]) == {"1", "2"}
    # jumps: +1 (traj 0), -2 (traj 1), +1 (traj 3)
    assert sorted(d.jumps.tolist()) == [-2.0, 1.0, 1.0]
    assert d.to_arrow().num_rows == 4


def test_the_streamed_and_the_in_memory_summaries_are_one_aggregate(tmp_path):
    """summary.json, Diagnosis.summary() and summarize_value_structure: same keys, same numbers."""
    from mpo_rs.diagnose import summarize_value_structure as summarize
    from mpo_rs.diagnose import value_structure

    rows = [
        ([0, 0, 9, 1, 1], [1, 1, 0, 1, 1]),
        ([0, 2, 9, 0, 2], [1, 1, 0, 1, 1]),
        ([0, 1], [1, 1]),
        ([0, 0, 9, 1, 3, 9, 9, -2], [1, 1, 0, 1, 1, 0, 0, 1]),
        ([5, 5, 0, 5], [1, 1, 0, 1]),
    ]
    score = [1, 0, 1, 0, 1]
    streamed = diagnose_logs(_log(tmp_path / "log.parquet", rows, score=score), batch_rows=2).summary()
    offsets = np.cumsum([0] + [len(v) for v, _ in rows])
    values = np.concatenate([np.asarray(v, np.float32) for v, _ in rows])
    mask = np.concatenate([np.asarray(m, bool) for _, m in rows])
    in_memory = summarize(value_structure(values, mask, offsets), outcome=score)
    assert in_memory == streamed
    assert streamed["all"]["jumps"] == 4 and streamed["excluded_fewer_than_two_turns_or_constant"] == 2


def test_the_command_prints_a_table_and_writes_json_and_figures(tmp_path, capsys):
    log = tmp_path / "rollouts.parquet"
    write_rollout_log(log, 48, row_group_rows=16, seed=3)
    out = tmp_path / "report"
    assert main(["diagnose", str(log), "-o", str(out), "--batch-rows", "10"]) == 0
    printed = capsys.readouterr().out
    assert "median share" in printed and "success (outcome > 0)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == 48 and 0.0 <= summary["all"]["median_between_share"] <= 1.0
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"share_histogram.png", "jump_distribution.png"} <= names
    assert len([n for n in names if n.startswith("trajectory_")]) == 2  # a success and a failure
    for p in pngs:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 5_000, p


def test_chosen_trajectories_and_a_directory_of_files(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    write_rollout_log(d / "a.parquet", 12, row_group_rows=5, seed=1)
    write_rollout_log(d / "b.parquet", 12, row_group_rows=5, seed=2)
    out = tmp_path / "r"
    assert main(["diagnose", str(d), "-o", str(out), "--trajectories", "2,20"]) == 0
    assert {p.name for p in out.glob("trajectory_*.png")} == {"trajectory_2.png", "trajectory_20.png"}


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--values-col", "nope"], 1, "missing column `nope`"),
        (["--trajectories", "x"], 2, "--trajectories must be"),
        (["--batch-rows", "0"], 2, "--batch-rows must be at least 1"),
    ],
)
def test_errors_are_one_line_with_exit_codes(tmp_path, capsys, args, code, message):
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 4, row_group_rows=4)
    assert main(["diagnose", str(log), *args]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_data_names_file_row_group_row_and_column(tmp_path, capsys):
    path = _log(
        tmp_path / "bad.parquet", [([0, 1], [1, 1]), ([0, 1], [1, 1]), ([0, float("nan")], [1, 1])], score=[1, 0, 1]
    )
    assert main(["diagnose", str(path)]) == 1
    err = capsys.readouterr().err
    # The third row is row 2 of the file, in its second row group (two rows per group).
    assert "bad.parquet: row group 1: row 2, column `values`: NaN is not finite at token 1" in err, err
    assert main(["diagnose", str(tmp_path / "missing.parquet")]) == 1


# Issue 11, item 3: diagnose reads, checks and exits as `advantages` does.


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=5).astype(np.float32).tolist(), [1, 1, 0, 1, 1]) for _ in range(n)]


def _run(capsys, *args):
    code = main(["diagnose", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(err):
    assert err.count("\n") == 1 and err.startswith("mpo-rs: error: ") and "Traceback" not in err, err
    return err


def test_a_log_split_into_subdirectories_is_read_like_advantages_reads_it(tmp_path, capsys):
    """One listing, in Rust: recursive, name order, hidden and `_` names skipped."""
    from mpo_rs import _native

    log = tmp_path / "log"
    (log / "step=1").mkdir(parents=True)
    _log(log / "a.parquet", _rows(20, 1), score=[1.0, 0.0] * 10)
    _log(log / "step=1" / "b.parquet", _rows(20, 2), score=[1.0, 0.0] * 10)
    _log(log / "_tmp.parquet", _rows(3), score=[1.0] * 3)
    _log(log / ".hidden.parquet", _rows(3), score=[1.0] * 3)
    (log / "_SUCCESS").write_text("")
    listed = [p.relative_to(log).as_posix() for p in map(Path, _native.list_parquet_inputs(log))]
    assert listed == ["a.parquet", "step=1/b.parquet"]
    assert diagnose_logs(log).rows == 40
    assert main(["advantages", str(log), "-o", str(tmp_path / "out"), "-q"]) == 0
    written = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.parquet"))
    assert written == listed


def test_an_empty_directory_is_a_usage_error_in_both_commands(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _run(capsys, empty)
    assert code == 2 and "holds no .parquet files" in _one_line_error(err)
    assert main(["advantages", str(empty), "-o", str(tmp_path / "out")]) == 2


def test_list_of_strings_is_bad_data_naming_the_column(tmp_path, capsys):
    t = pa.table(
        {
            "values": pa.array([["a", "b"]], pa.list_(pa.string())),
            "loss_mask": pa.array([[True, True]], pa.list_(pa.bool_())),
            "score": pa.array([1.0], pa.float32()),
        }
    )
    pq.write_table(t, tmp_path / "s.parquet")
    code, _, err = _run(capsys, tmp_path / "s.parquet")
    assert code == 1 and "s.parquet: column `values` has type list<Utf8>" in _one_line_error(err), err


@pytest.mark.parametrize("damage", ["garbage", "truncated", "footer"])
def test_corrupt_and_truncated_files_are_bad_data_naming_the_file(tmp_path, capsys, damage):
    good = tmp_path / "good.parquet"
    write_rollout_log(good, 64, row_group_rows=16, seed=4, compression="none")
    data = bytearray(good.read_bytes())
    bad = tmp_path / "bad.parquet"
    if damage == "garbage":
        bad.write_bytes(b"not a parquet file at all\n" * 100)
    elif damage == "truncated":
        bad.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a valid footer over pages overwritten with noise
        rng = np.random.default_rng(0)
        data[4 : len(data) // 2] = rng.integers(0, 256, len(data) // 2 - 4, dtype=np.uint8).tobytes()
        bad.write_bytes(bytes(data))
    code, _, err = _run(capsys, bad)
    assert code == 1 and str(bad) in _one_line_error(err) and "cannot read Parquet" in err, err


def test_a_null_step_is_refused_not_labelled_int64_min(tmp_path, capsys):
    t = pa.table(
        {
            "values": pa.array([[0.0, 1.0]] * 3, pa.list_(pa.float32())),
            "loss_mask": pa.array([[True, True]] * 3, pa.list_(pa.bool_())),
            "score": pa.array([1.0, 0.0, 1.0], pa.float32()),
            "step": pa.array([1, None, 2], pa.int64()),
        }
    )
    pq.write_table(t, tmp_path / "s.parquet")
    code, out, err = _run(capsys, tmp_path / "s.parquet")
    assert code == 1 and "s.parquet: row group 0: row 1, column `step`: null value" in _one_line_error(err), err
    assert "-9223372036854775808" not in out


@pytest.mark.parametrize("bad, message", [(float("nan"), "NaN is not finite"), (None, "null value")])
def test_a_nan_or_null_outcome_is_refused(tmp_path, capsys, bad, message):
    """Before: dropped from both the success and the failure rows (NaN) or passed (null)."""
    t = pa.table(
        {
            "values": pa.array([[0.0, 1.0]] * 3, pa.list_(pa.float32())),
            "loss_mask": pa.array([[True, True]] * 3, pa.list_(pa.bool_())),
            "score": pa.array([1.0, bad, 0.0], pa.float64()),
        }
    )
    pq.write_table(t, tmp_path / "s.parquet")
    code, _, err = _run(capsys, tmp_path / "s.parquet")
    assert code == 1 and f"s.parquet: row group 0: row 1, column `score`: {message}" in _one_line_error(err), err


def test_rewards_are_checked_like_the_mask(tmp_path, capsys):
    def write(rewards):
        t = pa.table(
            {
                "values": pa.array([[0.0, 1.0, 2.0]] * 2, pa.list_(pa.float32())),
                "loss_mask": pa.array([[1, 0, 1]] * 2, pa.list_(pa.uint8())),
                "rewards": pa.array(rewards, pa.list_(pa.float32())),
            }
        )
        pq.write_table(t, tmp_path / "r.parquet")
        return _run(capsys, tmp_path / "r.parquet")

    code, _, err = write([[0, 0, 1], [0, 1]])
    assert code == 1 and "row 1: column `rewards` has 2 tokens but `loss_mask` has 3" in _one_line_error(err), err
    code, _, err = write([[0, 0, 1], [0, 0, float("inf")]])
    assert code == 1 and "row 1, column `rewards`: inf is not finite at token 2" in _one_line_error(err), err
    code, out, _ = write([[0, 0, 1], [0, 0, -1]])
    assert code == 0 and "trajectories read" in out


def test_without_matplotlib_summary_json_is_written_and_one_line_says_why_no_figures(tmp_path):
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 16, row_group_rows=8, seed=5)
    out = tmp_path / "report"
    script = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from mpo_rs.cli import main\n"
        f"sys.exit(main(['diagnose', {str(log)!r}, '-o', {str(out)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and install_hint("plot") in r.stderr and "Traceback" not in r.stderr
    assert json.loads((out / "summary.json").read_text())["rows"] == 16
    assert not list(out.glob("*.png"))


def test_report_dir_that_is_a_file_is_refused_before_reading(tmp_path, capsys):
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 4, row_group_rows=4)
    target = tmp_path / "report"
    target.write_text("keep me")
    code, _, err = _run(capsys, log, "-o", target)
    assert code == 2 and "is a file" in _one_line_error(err)
    assert target.read_text() == "keep me"


def test_non_empty_report_dir_not_written_by_diagnose_is_refused_and_kept(tmp_path, capsys):
    # Issue 18 (output safety): `-o` wrote summary.json and figures into any directory.
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 8, row_group_rows=4)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "summary.json").write_text("the user's own")
    code, _, err = _run(capsys, log, "-o", docs)
    assert code == 2 and "not written by mpo-rs diagnose" in _one_line_error(err), err
    assert "summary.json" in err and "choose a new directory" in err, err
    assert [p.name for p in docs.iterdir()] == ["summary.json"]
    assert (docs / "summary.json").read_text() == "the user's own"
    # A directory that is another tool's output is refused the same way.
    from mpo_rs import _native

    other = tmp_path / "repro"
    _native.claim_output_dir(other, "reproduce", "abc123")
    code, _, err = _run(capsys, log, "-o", other)
    assert code == 2 and "is the output of mpo-rs reproduce, not of mpo-rs diagnose" in _one_line_error(err)


def test_report_dir_of_an_earlier_diagnose_is_marked_and_reused(tmp_path, capsys):
    from mpo_rs import _native
    from mpo_rs.diagnose import write_report

    log = tmp_path / "l.parquet"
    write_rollout_log(log, 8, row_group_rows=4)
    out = tmp_path / "new" / "report"  # parents are created
    assert _run(capsys, log, "-o", out)[0] == 0
    assert _native.output_dir_marker(out) == ("diagnose", None)
    assert _run(capsys, log, "-o", out)[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(capsys, log, "-o", empty)[0] == 0
    # The library function follows the same rule; `overwrite` is the explicit way past it.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    diag = diagnose_logs(log)
    with pytest.raises(_native.InvalidOptionError, match="not written by mpo-rs diagnose"):
        write_report(diag, foreign, figures=False)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    write_report(diag, foreign, figures=False, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine" and (foreign / "summary.json").exists()


@pytest.mark.parametrize("rows", ["99999999999999999999", str(2**63)])
def test_huge_batch_rows_is_a_usage_error_not_a_traceback(tmp_path, capsys, rows):
    # Defect 12 (issue 18): pyarrow's OverflowError escaped as a traceback.
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 4, row_group_rows=4)
    code, _, err = _run(capsys, log, "--batch-rows", rows)
    assert code == 2 and "--batch-rows must be at most 2**63 - 1" in _one_line_error(err), err
    assert _run(capsys, log, "--batch-rows", str(2**63 - 1))[0] == 0
    from mpo_rs import InvalidOptionError

    for bad in (2**63, 0, 2.5, True):
        with pytest.raises(InvalidOptionError, match="batch_rows"):
            diagnose_logs(log, batch_rows=bad)


def test_reward_on_an_observation_token_is_refused_as_advantages_refuses_it(tmp_path, capsys):
    # Defect 12 (issue 18): diagnose summed the rewards and accepted what advantages refuses.
    t = pa.table(
        {
            "values": pa.array([[0.0, 1.0, 2.0, 3.0]] * 2, pa.list_(pa.float32())),
            "loss_mask": pa.array([[1, 1, 0, 1]] * 2, pa.list_(pa.uint8())),
            "rewards": pa.array([[0, 0, 0, 1], [0, 0, 0.5, 1]], pa.list_(pa.float32())),
        }
    )
    path = tmp_path / "obs.parquet"
    pq.write_table(t, path)
    code, _, err = _run(capsys, path)
    message = "obs.parquet: row group 0: row 1, column `rewards`: reward 0.5 at observation token 2"
    assert code == 1 and message in _one_line_error(err), err
    assert main(["advantages", str(path), "-o", str(tmp_path / "o.parquet")]) == 1
    assert message in _one_line_error(capsys.readouterr().err)
    from mpo_rs import InvalidBatchError

    with pytest.raises(InvalidBatchError, match=r"reward 0\.5 at observation token 2"):
        diagnose_logs(path)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_input_listed_twice_through_a_link_is_refused(tmp_path, capsys, link):
    # Defect 6 (issue 18): the one listing refuses two names of one file in both commands.
    log = tmp_path / "log"
    log.mkdir()
    write_rollout_log(log / "a.parquet", 8, row_group_rows=4)
    (os.symlink if link == "symlink" else os.link)(log / "a.parquet", log / "b.parquet")
    code, _, err = _run(capsys, log)
    assert code == 2 and "are the same file" in _one_line_error(err), err
    assert str(log / "a.parquet") in err and str(log / "b.parquet") in err


_RSS_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import pyarrow.parquet as pq
    from mpo_rs.diagnose import diagnose_logs
    if sys.argv[2] == "stream":
        rows = diagnose_logs(sys.argv[1], batch_rows=64).rows
    else:  # what a non-streaming reader holds: the two columns, decoded
        t = pq.read_table(sys.argv[1], columns=["values", "loss_mask"])
        flat = [np.asarray(t.column(c).combine_chunks().flatten()) for c in ("values", "loss_mask")]
        rows = t.num_rows
    # VmHWM is this process image's own peak; ru_maxrss would inherit the forking
    # parent's (pytest's) high-water mark across exec.
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    print(rows, int(hwm.split()[1]))
    """
)


def _peak_rss(log, mode):
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(log), mode], capture_output=True, text=True, check=True
    )
    rows, peak_kib = map(int, out.stdout.split())
    return rows, peak_kib * 1024


def test_large_logs_stream_in_bounded_memory(tmp_path):
    """Growing the log 16-fold grows the streamed run's peak RSS by far less than it grows
    a reader that holds the decoded columns (measured the same way, same run)."""
    small, large = tmp_path / "small.parquet", tmp_path / "large.parquet"
    write_rollout_log(small, 256, row_group_rows=128, seed=1)
    write_rollout_log(large, 4096, row_group_rows=128, seed=2)
    growth = {}
    for mode in ("stream", "hold"):
        (n_small, rss_small), (n_large, rss_large) = _peak_rss(small, mode), _peak_rss(large, mode)
        assert (n_small, n_large) == (256, 4096)
        growth[mode] = rss_large - rss_small
    assert growth["stream"] < 0.25 * growth["hold"], growth


def test_a_log_with_no_usable_trajectory_says_nothing_to_report(tmp_path, capsys):
    """Issue 20, item 8: every row excluded (one turn, or constant values) exited 0 with a
    table of nulls and blank figures. Now: one error line, exit 1, nothing written."""
    path = _log(tmp_path / "flat.parquet", [([0, 1], [1, 1]), ([2, 2, 0, 2], [1, 1, 0, 1])], score=[1, 0])
    out = tmp_path / "report"
    assert main(["diagnose", str(path), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert "no trajectory with >= 2 turns and varying values (2 read, all excluded); nothing to report" in captured.err
    assert not out.exists()
    empty = _log(tmp_path / "empty.parquet", [], score=[])
    assert main(["diagnose", str(empty)]) == 1
    assert "no trajectory with >= 2 turns and varying values (the log has no rows)" in capsys.readouterr().err


def test_trajectories_that_the_log_lacks_are_named_in_a_note(tmp_path, capsys):
    """Issue 20, item 8: --trajectories asking for rows that do not exist exited 0 silently
    without their figures. Now one note names them; the rest of the report is written."""
    log = tmp_path / "l.parquet"
    write_rollout_log(log, 12, row_group_rows=5, seed=1)
    out = tmp_path / "r"
    assert main(["diagnose", str(log), "-o", str(out), "--trajectories", "2,40,99,40"]) == 0
    err = capsys.readouterr().err
    assert "--trajectories: rows 40, 99 not in the log (12 rows, numbered from 0); not drawn" in err, err
    assert {p.name for p in out.glob("trajectory_*.png")} == {"trajectory_2.png"}
    assert (out / "summary.json").exists()


def test_the_summary_reads_the_share_against_the_paper_and_the_thresholds(tmp_path, capsys):
    """Issue 20, item 8: a one-line reading of the share, thresholds stated."""
    from mpo_rs.diagnose.summary import MIN_READING_TRAJECTORIES, ON_TURNS_SHARE, WITHIN_TURNS_SHARE, share_reading

    high = share_reading(0.93)
    assert high == (
        "median between-turn share 0.93: the critic's value lives on turns (paper: 0.895); "
        "MAE's turn-level credit applies"
    )
    assert "leans to turns" in share_reading(0.6) and f"share < {ON_TURNS_SHARE:g}" in share_reading(0.6)
    low = share_reading(0.2)
    assert "moves within turns" in low and "GAE" in low and f"share < {WITHIN_TURNS_SHARE:g}" in low
    # The thresholds themselves belong to the higher reading.
    assert "lives on turns" in share_reading(ON_TURNS_SHARE)
    assert "leans to turns" in share_reading(WITHIN_TURNS_SHARE)
    assert "within turns" in share_reading(np.nextafter(WITHIN_TURNS_SHARE, 0))
    assert share_reading(None) is None

    # Through a log: values that move only between turns, then only within them.
    n = MIN_READING_TRAJECTORIES
    between = [([0, 0, 9, 1, 1], [1, 1, 0, 1, 1])] * n
    within = [([0, 2, 9, 0, 2], [1, 1, 0, 1, 1])] * n
    for rows, words in ((between, "lives on turns"), (within, "moves within turns")):
        path = _log(tmp_path / f"{words[:5]}.parquet", rows, score=[1, 0] * (n // 2))
        assert words in diagnose_logs(path).summary()["reading"]
        out = tmp_path / f"report-{words[:5]}"
        assert main(["diagnose", str(path), "-o", str(out)]) == 0
        share = "1.00" if rows is between else "0.00"
        assert f"Reading: median between-turn share {share} over {n} trajectories: " in capsys.readouterr().out
        assert words in json.loads((out / "summary.json").read_text())["reading"]


def test_diagnose_gives_no_reading_from_too_few_trajectories(tmp_path, capsys):
    """A log where most trajectories are left out (one turn) reads the rest only when
    enough remain: the reading names how many it rests on, and declines below the minimum."""
    from mpo_rs.diagnose.summary import MIN_READING_TRAJECTORIES

    kept = [([0, 0, 9, 1, 1], [1, 1, 0, 1, 1])] * 4  # two turns: kept
    left_out = [([0, 1, 2], [1, 1, 1])] * 28  # one turn: no between/within split
    path = _log(tmp_path / "few.parquet", kept + left_out, score=[1, 0] * 16)
    reading = diagnose_logs(path).summary()["reading"]
    assert reading.startswith("median between-turn share 1.00 over 4 trajectories: too few for a reading"), reading
    assert f"at least {MIN_READING_TRAJECTORIES}" in reading and "lives on turns" not in reading
    assert main(["diagnose", str(path), "-o", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "Reading: median between-turn share 1.00 over 4 trajectories: too few for a reading" in out, out


def _overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_figures_read_themselves(tmp_path):
    """Issue 20, item 8: the paper's 89.5% as a reference line on the share histogram,
    successes and failures side by side (not stacked), legends and labels off the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mpo_rs.diagnose.plot import jump_figure, share_figure, trace_figure

    log = tmp_path / "rollouts.parquet"
    write_rollout_log(log, 48, row_group_rows=16, seed=3)
    diag = diagnose_logs(log, keep_rows=[0])
    assert diag.outcome.min() <= 0 < diag.outcome.max()  # both kinds present
    for draw in (share_figure, jump_figure):
        fig = draw(plt, diag)
        ax = fig.axes[0]
        success, failure = ax.containers  # two bar series
        assert len(success) == len(failure) > 1
        # Side by side: every bar stands on 0 (stacked ones stand on the other series) and
        # the two bars of a bin sit next to each other.
        assert all(bar.get_y() == 0 for bar in [*success, *failure])
        for s, f in zip(success, failure, strict=True):
            assert np.isclose(s.get_x() + s.get_width(), f.get_x())
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        assert not _overlaps(ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer))
        plt.close(fig)
    fig = share_figure(plt, diag)
    paper = [line for line in fig.axes[0].lines if line.get_label() == "paper median 89.5%"]
    assert len(paper) == 1 and list(paper[0].get_xdata()) == [0.895, 0.895]
    assert any(line.get_label().startswith("median here ") for line in fig.axes[0].lines)
    plt.close(fig)

    (trace,) = diag.traces
    fig = trace_figure(plt, trace)
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert not _overlaps(ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer))
    top = float(trace.values[trace.mask.astype(bool)].max())
    jump_labels = [t for t in ax.texts if t.get_text()[:1] in ("+", "-")]  # not the arrows (no text)
    assert jump_labels and all(t.get_position()[1] > top for t in jump_labels)
    plt.close(fig)
