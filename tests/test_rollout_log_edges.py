"""RolloutLogWriter at the edges of its input: group ids of two kinds, empty batches and
integers beyond int64 (docs/rollout-logs.md; docs/reliability.md, "Writers: outputs never
alias inputs or follow links")."""

from __future__ import annotations

import numpy as np
import pytest

pq = pytest.importorskip("pyarrow.parquet")

import mpo_rs  # noqa: E402
from mpo_rs import InvalidBatchError  # noqa: E402
from mpo_rs.rollout_log import RolloutLogWriter  # noqa: E402


def padded(rows: int, length: int = 4) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.arange(rows * length).reshape(rows, length),
        "loss_mask": np.ones((rows, length), bool),
        "scores": np.linspace(0, 1, rows).astype(np.float32),
    }


def read_back(writer: RolloutLogWriter) -> dict[str, list[object]]:
    writer.close()
    return pq.read_table(writer.directory).to_pydict()


@pytest.mark.parametrize(
    "ids",
    [
        [1, "1", 1, "1"],
        ("a", 2, "b", 3),
        np.array([1, "1", 2, "2"], dtype=object),
        [np.int64(7), "7", np.int32(7), "7"],
    ],
    ids=["list", "tuple", "object-array", "numpy-ints"],
)
def test_writer_refuses_group_ids_that_mix_integers_and_strings(tmp_path, ids):
    # They were written as four strings "1": GRPO on the log then grouped rows that
    # group_advantages on the same ids keeps apart.
    w = RolloutLogWriter(tmp_path / "log")
    with pytest.raises(InvalidBatchError, match=r"`group_ids` mixes integers and strings \(row \d holds"):
        w.append_padded(**padded(4), group_ids=ids, step=0)
    assert w.rows_appended == 0 and not w.closed
    w.append_padded(**padded(4), group_ids=[1, 1, 2, 2], step=0)
    assert read_back(w)["group_id"] == [1, 1, 2, 2]


def test_writer_keeps_one_kind_of_group_ids_as_that_kind(tmp_path):
    w = RolloutLogWriter(tmp_path / "ints")
    w.append_padded(**padded(3), group_ids=[5, np.int64(6), 7], step=0)
    assert read_back(w)["group_id"] == [5, 6, 7]
    w = RolloutLogWriter(tmp_path / "strings")
    w.append_padded(**padded(3), group_ids=np.array(["1", "1", "x"]), step=0)
    assert read_back(w)["group_id"] == ["1", "1", "x"]
    # A later batch of the other kind is refused too (one log, one kind).
    w = RolloutLogWriter(tmp_path / "later")
    w.append_padded(**padded(2), group_ids=[1, 2], step=0)
    with pytest.raises(InvalidBatchError, match="differ from those of earlier batches"):
        w.append_padded(**padded(2), group_ids=["1", "2"], step=1)
    w.close()


def test_an_empty_padded_batch_then_flush_is_a_no_op(tmp_path):
    # It raised IndexError from flush() and closed the writer.
    w = RolloutLogWriter(tmp_path / "log")
    w.append_padded(**padded(0, 6), values=np.zeros((0, 6), np.float32), step=3)
    w.flush()
    assert not w.closed and w.files == [] and w.rows_appended == 0
    w.append_padded(**padded(0, 6), group_ids=[], step=3)  # a list of no ids is no kind yet
    w.flush()
    w.append_flat(token_ids=np.zeros(0, np.int32), loss_mask=np.zeros(0, bool), offsets=[0], step=4)
    w.flush()
    assert w.files == []
    # The empty batch fixed no schema: a batch with other optional columns is accepted.
    w.append_padded(**padded(2), group_ids=["a", "b"], step=5)
    w.flush()
    assert len(w.files) == 1
    assert read_back(w)["step"] == [5, 5]


def test_an_empty_batch_is_still_checked(tmp_path):
    w = RolloutLogWriter(tmp_path / "log")
    with pytest.raises(InvalidBatchError, match="`step` must be an integer"):
        w.append_padded(**padded(0), step="3")
    with pytest.raises(InvalidBatchError, match="`scores` has shape"):
        w.append_padded(input_ids=np.zeros((0, 2), int), loss_mask=np.zeros((0, 2)), scores=[1.0], step=0)
    w.close()


@pytest.mark.parametrize("step", [2**70, -(2**70), 2**63, np.uint64(2**63)])
def test_an_out_of_range_step_is_an_invalid_batch_error_naming_step(tmp_path, step):
    # It was a bare OverflowError.
    w = RolloutLogWriter(tmp_path / "log")
    with pytest.raises(InvalidBatchError, match=r"append_padded: `step` is -?\d+, outside the step column's int64"):
        w.append_padded(**padded(2), step=step)
    w.append_padded(**padded(2), step=2**63 - 1)
    assert read_back(w)["step"] == [2**63 - 1] * 2


@pytest.mark.parametrize(
    "ids",
    [[2**64, 1], [1, -(2**63) - 1], np.array([2**63, 1], np.uint64), (2**100, 2)],
    ids=["list-2^64", "list-below-int64", "uint64-array", "tuple-2^100"],
)
def test_out_of_range_group_ids_are_an_invalid_batch_error_naming_group_ids(tmp_path, ids):
    # [2**64, 1] was a bare OverflowError.
    w = RolloutLogWriter(tmp_path / "log")
    with pytest.raises(
        InvalidBatchError, match=r"append_flat: `group_ids` holds -?\d+ at row \d, (outside|beyond) int64"
    ):
        w.append_flat(token_ids=[1, 2], loss_mask=[1, 1], offsets=[0, 1, 2], group_ids=ids, step=0)
    assert w.rows_appended == 0
    w.append_flat(token_ids=[1, 2], loss_mask=[1, 1], offsets=[0, 1, 2], group_ids=[2**63 - 1, -(2**63)], step=0)
    assert read_back(w)["group_id"] == [2**63 - 1, -(2**63)]


def test_every_refusal_is_typed(tmp_path):
    w = RolloutLogWriter(tmp_path / "log")
    for bad in ([True, False], [1.5, 2.5], [None, 1], [b"a", b"b"]):
        with pytest.raises(mpo_rs.MpoError):
            w.append_padded(**padded(2), group_ids=bad, step=0)
    w.close()


def test_an_empty_batch_takes_empty_group_ids_of_any_dtype(tmp_path):
    """numpy reads an empty list as float64: an empty batch's empty group ids are not refused
    for their dtype (the writer fuzz target found it)."""
    import numpy as np

    from mpo_rs.rollout_log import RolloutLogWriter

    with RolloutLogWriter(tmp_path / "log") as w:
        empty = np.zeros((0, 4))
        w.append_padded(
            input_ids=empty.astype(np.int64),
            loss_mask=empty.astype(bool),
            scores=np.zeros(0),
            group_ids=np.asarray([]),
            step=0,
        )
    assert not list((tmp_path / "log").glob("*.parquet"))
