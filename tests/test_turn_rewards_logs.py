"""Per-turn rewards and truncation in rollout logs (issue 20 items 4, 5): the
``turn_rewards`` list column and the ``truncated`` bool column through ``mpo_rs.arrow``,
``mpo-rs advantages`` and its generated flags, equal bitwise to the numpy estimators, and
the errors named by file, row and column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import mpo_rs  # noqa: E402
from mpo_rs import InvalidBatchError, InvalidOptionError, columns  # noqa: E402
from mpo_rs.arrow import advantages_parquet, with_advantages  # noqa: E402

# Three rows: 2 turns, 1 turn (a trailing observation), 0 turns.
MASKS = [[0, 1, 1, 0, 1], [1, 1, 0], [0, 0]]
VALUES = [[0.0, 0.5, 0.25, 0.0, 1.0], [0.75, -0.5, 0.0], [0.0, 0.0]]
TURN_REWARDS = [[0.5, 1.0], [-1.0], []]
TRUNCATED = [True, False, True]


def table(**extra: object) -> pa.Table:
    cols = {
        "loss_mask": pa.array([[bool(m) for m in row] for row in MASKS]),
        "values": pa.array(VALUES, type=pa.list_(pa.float32())),
        "turn_rewards": pa.array(TURN_REWARDS, type=pa.list_(pa.float32())),
        "truncated": pa.array(TRUNCATED),
    }
    cols.update(extra)
    return pa.table(cols)


def flat_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mask = np.array([m for row in MASKS for m in row], dtype=bool)
    values = np.array([v for row in VALUES for v in row], dtype=np.float32)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in MASKS])])
    return values, mask, offsets


def bits(column: pa.ChunkedArray) -> list[int]:
    return column.combine_chunks().flatten().to_numpy().view(np.uint32).tolist()


def np_bits(x: np.ndarray) -> list[int]:
    return x.view(np.uint32).tolist()


@pytest.mark.parametrize("estimator", ["mae", "gae"])
def test_turn_rewards_and_truncated_columns_equal_the_numpy_estimators(estimator):
    fn = {"mae": mpo_rs.mae_advantages, "gae": mpo_rs.gae_advantages}[estimator]
    values, mask, offsets = flat_inputs()
    want = fn(values, mask, offsets, turn_rewards=TURN_REWARDS, truncated=TRUNCATED)
    out = with_advantages(table(), estimator=estimator)  # both columns found by their default names
    assert bits(out["advantages"]) == np_bits(want.advantages)
    assert bits(out["returns"]) == np_bits(want.returns)
    # Named explicitly, and under other names.
    renamed = table().rename_columns(["loss_mask", "values", "per_turn", "cut"])
    out = with_advantages(renamed, estimator=estimator, turn_rewards_col="per_turn", truncated_col="cut")
    assert bits(out["advantages"]) == np_bits(want.advantages)
    # Without the truncated column: not truncated.
    plain = fn(values, mask, offsets, turn_rewards=TURN_REWARDS)
    out = with_advantages(table().drop_columns(["truncated"]), estimator=estimator)
    assert bits(out["advantages"]) == np_bits(plain.advantages)


def test_a_row_with_the_wrong_number_of_turn_rewards_is_named():
    bad = pa.array([[0.5], [-1.0], []], type=pa.list_(pa.float32()))
    with pytest.raises(
        InvalidBatchError, match=r"row 0, column `turn_rewards`: 1 turn rewards, but the row has 2 turns"
    ):
        with_advantages(table(turn_rewards=bad))
    nan = pa.array([[0.5, float("nan")], [-1.0], []], type=pa.list_(pa.float32()))
    with pytest.raises(InvalidBatchError, match=r"row 0, column `turn_rewards`: NaN is not finite at turn 1"):
        with_advantages(table(turn_rewards=nan))


def test_the_sum_check_names_the_row_and_both_columns():
    good = pa.array([1.5, -1.0, 0.0], type=pa.float32())
    with_advantages(table(score=good), turn_rewards_col="turn_rewards", check_score_col="score")
    bad = pa.array([1.5, -1.0, 0.5], type=pa.float32())
    with pytest.raises(
        InvalidBatchError, match=r"row 2, column `turn_rewards`: the turn rewards sum to 0, but `score`"
    ):
        with_advantages(table(score=bad), turn_rewards_col="turn_rewards", check_score_col="score")
    with pytest.raises(InvalidOptionError, match="checks that per-turn rewards sum to it"):
        with_advantages(table(score=good), score_col="score", check_score_col="score")
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        with_advantages(
            table(score=good), turn_rewards_col="turn_rewards", check_score_col="score", check_tolerance=-1.0
        )


def test_truncated_column_errors():
    with pytest.raises(InvalidBatchError, match=r"column `truncated` has type Int64, expected bool"):
        with_advantages(table(truncated=pa.array([1, 0, 1])))
    with pytest.raises(InvalidBatchError, match=r"row 1, column `truncated`: null value"):
        with_advantages(table(truncated=pa.array([True, None, False])))
    # The group baselines do not bootstrap: a named column is refused, a present one ignored.
    groups = table(group_id=pa.array([0, 0, 1]))
    with pytest.raises(InvalidOptionError, match="applies to the critic estimators"):
        with_advantages(groups, estimator="grpo", truncated_col="truncated")
    with_advantages(groups, estimator="grpo")


def test_score_and_rewards_still_come_first_by_default():
    # A log with a score column beside turn rewards keeps using the score (as before).
    values, mask, offsets = flat_inputs()
    t = table(score=pa.array([1.0, 2.0, 3.0], type=pa.float32())).drop_columns(["truncated"])
    want = mpo_rs.mae_advantages(values, mask, offsets, scores=[1.0, 2.0, 3.0])
    assert bits(with_advantages(t)["advantages"]) == np_bits(want.advantages)
    with pytest.raises(InvalidOptionError, match="not two"):
        with_advantages(t, score_col="score", turn_rewards_col="turn_rewards")


def test_the_column_spec_names_the_new_columns():
    assert columns.default("turn_rewards") == "turn_rewards"
    assert columns.default("truncated") == "truncated"
    assert columns.row("check_score")["role"] == "named"
    assert columns.OUTPUT_COLUMNS == ("advantages", "returns", "turn_index", "turn_advantages")


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpo_rs.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_the_command_line_reads_them_through_the_generated_flags(tmp_path: Path):
    src = tmp_path / "log.parquet"
    pq.write_table(table(score=pa.array([1.5, -1.0, 0.0], type=pa.float32())), src)
    out = tmp_path / "out.parquet"
    r = run_cli("advantages", src, "-o", out, "-q", "--turn-rewards-col", "turn_rewards", "--check-score-col", "score")
    assert r.returncode == 0, r.stderr
    values, mask, offsets = flat_inputs()
    want = mpo_rs.mae_advantages(values, mask, offsets, turn_rewards=TURN_REWARDS, truncated=TRUNCATED)
    assert bits(pq.read_table(out)["advantages"]) == np_bits(want.advantages)
    # A failed check: exit 1, one line naming the file, row and both columns.
    r = run_cli(
        "advantages",
        src,
        "-o",
        tmp_path / "bad.parquet",
        "--turn-rewards-col",
        "turn_rewards",
        "--check-score-col",
        "score",
        "--check-tolerance",
        "0",
        "--truncated-col",
        "nope",
    )
    assert r.returncode == 1
    assert "missing column `nope`" in r.stderr and "--truncated-col" in r.stderr, r.stderr
    advantages_help = run_cli("advantages", "--help").stdout
    for flag in ("--turn-rewards-col", "--truncated-col", "--check-score-col", "--check-tolerance"):
        assert flag in advantages_help


def test_advantages_parquet_names_the_file_and_row(tmp_path: Path):
    bad = pa.array([[0.5, 1.0], [-1.0, 2.0], []], type=pa.list_(pa.float32()))
    src = tmp_path / "log.parquet"
    pq.write_table(table(turn_rewards=bad), src)
    with pytest.raises(InvalidBatchError, match=r"log\.parquet: row group 0: row 1, column `turn_rewards`: 2 turn"):
        advantages_parquet(src, tmp_path / "out.parquet")


def test_diagnose_reads_a_log_with_per_turn_rewards_only(tmp_path: Path):
    src = tmp_path / "log.parquet"
    pq.write_table(table(), src)
    r = run_cli("diagnose", src, "-o", tmp_path / "report")
    assert r.returncode == 0, r.stderr
    bad = pa.array([[0.5], [-1.0], []], type=pa.list_(pa.float32()))
    pq.write_table(table(turn_rewards=bad), src)
    r = run_cli("diagnose", src, "-o", tmp_path / "report2")
    assert r.returncode == 1
    assert "row 0, column `turn_rewards`: 1 turn rewards, but the row has 2 turns" in r.stderr, r.stderr
