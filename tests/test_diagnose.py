"""`mpo-rs diagnose` and `mpo_rs.diagnose`: streamed value-structure diagnostics (issue 6)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("matplotlib")

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


def test_bad_data_names_file_batch_and_column(tmp_path, capsys):
    path = _log(tmp_path / "bad.parquet", [([0, 1], [1, 1]), ([0, float("nan")], [1, 1])], score=[1, 0])
    assert main(["diagnose", str(path)]) == 1
    err = capsys.readouterr().err
    assert "bad.parquet: batch 0" in err and "`values` is not finite" in err
    assert main(["diagnose", str(tmp_path / "missing.parquet")]) == 1


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
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(log), mode], capture_output=True, text=True, check=True)
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
