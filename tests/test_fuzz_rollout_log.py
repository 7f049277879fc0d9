"""A hypothesis fuzzer of RolloutLogWriter: random plans of batches (padded or flat, empty
ones, optional columns, integer or string group ids), adversarial twists (group ids of two
kinds, integers beyond int64, NaN on a policy token, a batch of the other id kind, a bad
shape) and kills (SIGKILL of the writing process between two calls, or at the commit
that names a finished part), then the log read back by ``mpo-rs advantages`` and ``mpo-rs
diagnose``. Whatever the plan:

- a valid batch is accepted and a twisted one raises a typed error (``mpo_rs.MpoError``)
  and adds nothing, the writer staying open;
- the log's visible files are complete parts whose rows are, in order, a prefix of the
  accepted rows: all of them after ``close``, at least those flushed before a kill;
- a new writer continues the log after a kill (its leftover temporary is skipped);
- ``mpo-rs advantages`` exits 0 with one output row per log row, and ``mpo-rs diagnose``
  exits 0, or 1 with one line when no trajectory is usable; never a traceback.

``make test`` runs a few examples (8); ``make fuzz`` sets ``MPO_FUZZ_EXAMPLES``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import mpo_rs  # noqa: E402
from mpo_rs.cli import main  # noqa: E402
from mpo_rs.rollout_log import RolloutLogWriter  # noqa: E402

EXAMPLES = int(os.environ.get("MPO_FUZZ_EXAMPLES", "0")) or 8
TWISTS = ("mixed-ids", "huge-step", "huge-id", "nan-value", "other-id-kind", "bad-shape")

# One plan: the id kind of the log, then operations. An append is (rows, length, seed,
# layout, twist or None); a flush is None. `kill` is None, ("between", k) (SIGKILL before
# operation k) or ("commit", n) (SIGKILL at the n-th commit that names a finished part).
appends = st.tuples(
    st.integers(0, 6),
    st.integers(1, 12),
    st.integers(0, 2**31),
    st.sampled_from(["padded", "flat"]),
    st.one_of(st.none(), st.none(), st.sampled_from(TWISTS)),
)
plans = st.fixed_dictionaries(
    {
        "ids": st.sampled_from(["int", "str"]),
        "ops": st.lists(st.one_of(appends, st.none()), min_size=1, max_size=8),
        "max_file_bytes": st.sampled_from([1, 2000, 1 << 20]),
        "kill": st.one_of(
            st.none(),
            st.none(),
            st.tuples(st.just("between"), st.integers(0, 8)),
            st.tuples(st.just("commit"), st.integers(1, 3)),
        ),
    }
)


def batch(rows: int, length: int, seed: int, ids: str, step: int) -> dict[str, Any]:
    """A valid padded batch: attention from a random start, three kinds of tokens."""
    rng = np.random.default_rng(seed)
    keep = np.zeros((rows, length), bool)
    for r in range(rows):
        keep[r, rng.integers(0, length) :] = True
    mask = keep & (rng.random((rows, length)) < 0.7)
    groups = rng.integers(0, 3, rows)
    return {
        "input_ids": np.where(keep, rng.integers(0, 1000, (rows, length)), 0),
        "attention_mask": keep,
        "loss_mask": mask,
        "values": rng.normal(size=(rows, length)).astype(np.float32),
        "scores": rng.integers(0, 2, rows).astype(np.float32),
        "group_ids": groups if ids == "int" else np.array([f"g{g}" for g in groups]),
        "step": step,
    }


def twisted(b: dict[str, Any], twist: str, ids: str) -> dict[str, Any]:
    b = dict(b)
    rows = b["input_ids"].shape[0]
    if twist == "mixed-ids":
        b["group_ids"] = [1, "1"] + [1] * max(0, rows - 2)
    elif twist == "huge-step":
        b["step"] = 2**70
    elif twist == "huge-id":
        b["group_ids"] = [2**64] + [1] * max(0, rows - 1)
    elif twist == "nan-value":
        b["values"] = b["values"].copy()
        b["loss_mask"] = b["loss_mask"].copy()
        b["loss_mask"][0, -1] = b["attention_mask"][0, -1] = True
        b["values"][0, -1] = np.nan
    elif twist == "other-id-kind":
        b["group_ids"] = [f"x{i}" for i in range(rows)] if ids == "int" else list(range(rows))
    else:
        b["scores"] = np.zeros(rows + 1, np.float32)
    return b


def flat(b: dict[str, Any]) -> dict[str, Any]:
    keep = b["attention_mask"]
    offsets = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
    out = {"token_ids": b["input_ids"][keep], "loss_mask": b["loss_mask"][keep], "offsets": offsets}
    return {**out, "values": b["values"][keep], "scores": b["scores"], "group_ids": b["group_ids"], "step": b["step"]}


def always_refused(twist: str | None, rows: int, accepted_before: int) -> bool:
    """Whether the twist makes the batch invalid (a mixed or huge id needs a row to hold it;
    the other id kind only differs from an earlier batch)."""
    if twist is None:
        return False
    if twist == "other-id-kind":
        return accepted_before > 0 and rows >= 1
    return True  # the others are refused even without a row (their lengths do not match)


def run_plan(plan: dict[str, Any], directory: str, kill: Any = None) -> list[list[int]]:
    """Runs the plan's operations (SIGKILL where ``kill`` says); returns the token ids of the
    accepted rows, in order. Raises AssertionError where a call behaves unlike the plan."""
    if kill is not None and kill[0] == "commit":
        from mpo_rs import rollout_log

        real, calls = rollout_log.StagedFile, [0]

        class Killed:
            """The writer's StagedFile, killing the process at the n-th commit."""

            def __init__(self, target: Any) -> None:
                self.staged = real(target)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.staged, name)

            def commit_new(self, target: Any) -> bool:
                calls[0] += 1
                if calls[0] == kill[1]:
                    os.kill(os.getpid(), signal.SIGKILL)
                return bool(self.staged.commit_new(target))

        rollout_log.StagedFile = Killed  # type: ignore[misc,assignment]
    accepted: list[list[int]] = []
    w = RolloutLogWriter(directory, max_file_bytes=plan["max_file_bytes"])
    for k, op in enumerate(plan["ops"]):
        if kill == ("between", k):
            os.kill(os.getpid(), signal.SIGKILL)
        if op is None:
            w.flush()
            continue
        rows, length, seed, layout, twist = op
        step = len(accepted) + k  # distinct per batch: rows are found again by it
        b = batch(rows, length, seed, plan["ids"], step)
        if (twist == "other-id-kind" and not accepted) or (twist == "nan-value" and rows == 0):
            twist = None  # no earlier kind to differ from; no row to hold the NaN
        if twist is not None:
            b = twisted(b, twist, plan["ids"])
        args = b if layout == "padded" else flat(b)
        before = w.rows_appended
        try:
            (w.append_padded if layout == "padded" else w.append_flat)(**args)
        except mpo_rs.MpoError as e:
            assert twist is not None, f"a valid batch was refused: {e}"
            assert "\n" not in str(e) and w.rows_appended == before and not w.closed
            continue
        assert not always_refused(twist, rows, len(accepted)), f"twist {twist} accepted"
        keep = b["attention_mask"]
        accepted.extend(b["input_ids"][r][keep[r]].tolist() for r in range(rows))
    w.close()
    return accepted


def log_rows(directory: Path) -> list[list[int]]:
    files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    rows: list[list[int]] = []
    for f in files:
        rows.extend(pq.read_table(f).column("token_ids").to_pylist())
    return rows


def read_back(directory: Path, tmp: Path, capsys: Any) -> None:
    n = len(log_rows(directory))
    if n == 0:
        return
    out = tmp / "advantages"
    code = main(["advantages", str(directory), "-o", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert sum(pq.read_metadata(p).num_rows for p in out.rglob("*.parquet")) == n
    code = main(["diagnose", str(directory), "-o", str(tmp / "report")])
    err = capsys.readouterr().err
    assert code == 0 or (code == 1 and err.count("\n") == 1 and "Traceback" not in err), err


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(plan=plans)
def test_random_batches_kinds_and_kills_leave_a_log_the_tools_read(plan, tmp_path_factory, capsys):
    tmp = tmp_path_factory.mktemp("writer")
    directory = tmp / "log"
    kill = plan["kill"]
    if kill is None:
        accepted = run_plan(plan, str(directory))
        assert log_rows(directory) == accepted
    else:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(plan), str(directory), json.dumps(kill)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).parent,
        )
        killed = child.returncode == -signal.SIGKILL
        assert killed or child.returncode == 0, child.stderr
        # What the plan accepts, run to the end elsewhere: the log is a prefix of it.
        accepted = run_plan(plan, str(tmp / "reference"))
        durable = log_rows(directory) if directory.exists() else []
        assert durable == accepted[: len(durable)]
        if not killed:
            assert durable == accepted
        # A new writer continues the log beside a killed run's leftover temporary.
        more = run_plan({**plan, "ops": [(2, 5, 7, "padded", None)]}, str(directory))
        assert log_rows(directory) == durable + more
    read_back(directory, tmp, capsys)


_CHILD = """
import json, sys
from test_fuzz_rollout_log import run_plan
plan, directory, kill = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
plan["ops"] = [None if op is None else tuple(op) for op in plan["ops"]]
run_plan(plan, directory, tuple(kill))
"""
