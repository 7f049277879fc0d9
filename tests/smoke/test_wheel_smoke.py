"""Smoke tests of the built wheel, installed into a bare virtual environment (numpy and
pyarrow only, no Rust on PATH): the numpy estimators, the Arrow path, the command line
and the missing-extra hint. Run by tests/smoke/run.sh (`make test-wheel`) from a temporary
directory, so that the package imported is the installed one; they are skipped elsewhere."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

WHEEL = os.environ.get("MPO_RS_WHEEL")
pytestmark = pytest.mark.skipif(WHEEL is None, reason="run by tests/smoke/run.sh on an installed wheel")


def _batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two trajectories: [2 policy, 1 observation, 3 policy] and [4 policy]."""
    mask = np.array([1, 1, 0, 1, 1, 1, 1, 1, 1, 1], np.uint8)
    values = np.linspace(0.1, 1.0, mask.size, dtype=np.float32)
    offsets = np.array([0, 6, 10], np.int64)
    return values, mask, offsets


def test_the_package_is_the_installed_wheel_and_no_rust_is_on_path():
    import mpo_rs

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(mpo_rs.__file__).resolve().is_relative_to(site), mpo_rs.__file__
    assert shutil.which("cargo") is None and shutil.which("rustc") is None
    from importlib import metadata

    record = json.loads(metadata.distribution("mpo-rs").read_text("direct_url.json") or "{}")
    assert record.get("archive_info") is not None and record["url"].endswith(Path(WHEEL or "").name), record


def test_numpy_estimators():
    import mpo_rs

    values, mask, offsets = _batch()
    res = mpo_rs.mae_advantages(values, mask, offsets, scores=np.array([1.0, 0.0], np.float32))
    assert res.advantages.dtype == np.float32 and res.advantages.shape == mask.shape
    assert res.advantages[2] == 0 and res.turns.token_turn.tolist() == [0, 0, -1, 1, 1, 1, 2, 2, 2, 2]
    # The turn mean of the token advantages is the turn advantage.
    for t in range(3):
        np.testing.assert_allclose(res.advantages[res.turns.token_turn == t].mean(), res.turn_advantages[t], atol=1e-6)
    grpo = mpo_rs.group_advantages(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(grpo, [0.7071, -0.7071, 0, 0], atol=1e-3)


def test_arrow_table():
    import pyarrow as pa

    import mpo_rs.arrow

    values, mask, offsets = _batch()
    table = pa.table(
        {
            "loss_mask": [mask[a:b].astype(bool).tolist() for a, b in itertools.pairwise(offsets)],
            "values": [values[a:b].tolist() for a, b in itertools.pairwise(offsets)],
            "score": [1.0, 0.0],
        }
    )
    out = mpo_rs.arrow.with_advantages(table, estimator="mae")
    assert out.num_rows == 2 and {"advantages", "returns", "turn_index", "turn_advantages"} <= set(out.column_names)
    assert out.column("turn_index").to_pylist()[0] == [0, 0, -1, 1, 1, 1]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mpo-rs", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_command_line(tmp_path):
    from mpo_rs.demo import write_rollout_log

    write_rollout_log(tmp_path / "log.parquet", 16, row_group_rows=8, seed=1)
    r = _cli("advantages", "log.parquet", "-o", "adv.parquet", "--estimator", "mae", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "adv.parquet").metadata.num_rows == 16
    # diagnose without matplotlib: the summary, and one line saying what installs the figures.
    r = _cli("diagnose", "log.parquet", "-o", "report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["rows"] == 16
    assert f"pip install '{WHEEL}[plot]'" in r.stderr, r.stderr


def test_a_missing_extra_names_a_command_that_works():
    code = "import mpo_rs.torch"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "MissingDependencyError" in r.stderr, r.stderr
    message = r.stderr.strip().splitlines()[-1]
    assert message.endswith(f"`mpo_rs.torch` needs torch: pip install '{WHEEL}[torch]'"), message
    # The named requirement resolves (offline; the extra's own packages are not fetched).
    target = f"{WHEEL}[torch]"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", target],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "mpo-rs" in r.stdout.lower().replace("_", "-"), r.stdout + r.stderr
