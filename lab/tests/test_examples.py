"""The lab's examples run: from a training run's log to `mpo-rs diagnose`'s answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_rollout_log import read_log  # the library's tests/ helper (on the path: conftest.py)


def test_the_example_goes_from_a_training_run_to_the_decision(tmp_path, capsys):
    pytest.importorskip("torch")
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "rollout_log_diagnose.py"
    spec = importlib.util.spec_from_file_location("rollout_log_diagnose", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--updates", "3", "--tasks", "4", "--group-size", "2", "--out", str(tmp_path)]
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert "does my critic's value live on turns? " in out
    assert read_log(tmp_path / "rollout-log").column("step").to_pylist() == [0] * 8 + [1] * 8 + [2] * 8
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["rows"] == 24 and example.decision(summary) in out
