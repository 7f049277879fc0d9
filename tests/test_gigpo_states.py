"""GiGPO's anchor states and step groups by one rule on every path (issue 42; docs/reliability.md,
"One input rule"): distinct observations are distinct states even when their hashes
collide; step groups are numbered by first appearance whatever holds the group ids; anchor
ids are int64 values on every path; an option or input GiGPO would not read is refused; the
files of one log read the same anchor column whatever their order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpo_rs
import mpo_rs.arrow
from mpo_rs import InvalidBatchError, InvalidOptionError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# Two distinct token ids whose anchor hashes collide: 64-bit FNV-1a over each id's eight
# little-endian bytes is 0xa19f9eb1e634edc2 for both (so is it for any common suffix).
# Found by a parallel collision search (Pollard's rho with distinguished points) over the
# hash of one token, about 3.3e9 evaluations; `fnv1a64` below checks the pair.
A, B = 4017207813578192166, -348170734932881874
FRESH = 12345  # a token that collides with neither


def fnv1a64(tokens: list[int]) -> int:
    """The anchor hash as the core computes it (mpo_core::anchor_hash)."""
    h = 0xCBF29CE484222325
    for t in tokens:
        for byte in (t % 2**64).to_bytes(8, "little"):
            h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h


def test_the_pair_collides_with_any_common_suffix():
    assert A != B and fnv1a64([A]) == fnv1a64([B]) == 0xA19F9EB1E634EDC2
    assert fnv1a64([A, 7, 8]) == fnv1a64([B, 7, 8]) and fnv1a64([A]) != fnv1a64([FRESH])


def batch(first: int, second: int) -> dict[str, np.ndarray]:
    """Four trajectories of one group, two turns each: observations [x, 5] then [9]; the
    first two open with `first`, the other two with `second`."""
    rows = [[first, 5, 1, 9, 2], [first, 5, 3, 9, 4], [second, 5, 1, 9, 2], [second, 5, 6, 9, 4]]
    mask = np.tile(np.array([0, 0, 1, 0, 1], np.uint8), 4)
    return {
        "mask": mask,
        "offsets": np.arange(0, 21, 5, dtype=np.int64),
        "token_ids": np.array(rows, np.int64).reshape(-1),
        "group_ids": np.zeros(4, np.int64),
        "scores": np.array([1.0, 0.0, 3.0, -2.0], np.float32),
    }


def gigpo(b: dict[str, np.ndarray], **options) -> mpo_rs.GiGPOResult:
    return mpo_rs.gigpo_advantages(
        b["mask"], b["offsets"], group_ids=b["group_ids"], scores=b["scores"], token_ids=b["token_ids"], **options
    )


@pytest.mark.parametrize("anchor", ["observation", "prefix"])
@pytest.mark.parametrize("norm_std", [False, True])
def test_colliding_observations_are_distinct_states(anchor, norm_std):
    colliding = gigpo(batch(A, B), anchor=anchor, norm_std=norm_std)
    # The same batch with the second observation renamed to a token that collides with
    # nothing: the same states, so the same bits.
    renamed = gigpo(batch(A, FRESH), anchor=anchor, norm_std=norm_std)
    np.testing.assert_array_equal(colliding.step_groups, renamed.step_groups)
    assert colliding.advantages.tobytes() == renamed.advantages.tobytes()
    # The first turns: two states, not one (hashes alone merged them).
    first = colliding.step_groups[[0, 2, 4, 6]].tolist()
    assert first[0] == first[1] != first[2] == first[3]
    # The one entry and the Arrow path read the same states.
    est = mpo_rs.advantages(**_kw(batch(A, B)), estimator="gigpo", anchor=anchor, norm_std=norm_std)
    assert est.advantages.tobytes() == colliding.advantages.tobytes()
    got = _arrow(batch(A, B), anchor=anchor, norm_std=norm_std)
    np.testing.assert_array_equal(got, colliding.advantages)


def _kw(b):
    return {k: b[k] for k in ("mask", "offsets", "group_ids", "scores", "token_ids")}


def _table(b: dict[str, np.ndarray], **extra) -> pa.Table:
    pairs = list(itertools.pairwise(b["offsets"]))
    return pa.table(
        {
            "loss_mask": pa.array([b["mask"][s:e].tolist() for s, e in pairs], pa.list_(pa.uint8())),
            "token_ids": pa.array([b["token_ids"][s:e].tolist() for s, e in pairs], pa.list_(pa.int64())),
            "score": b["scores"],
            "group_id": b["group_ids"],
            **extra,
        }
    )


def _arrow(b, **options) -> np.ndarray:
    out = mpo_rs.arrow.with_advantages(_table(b), estimator="gigpo", score_col="score", **options)
    return out.column("advantages").combine_chunks().flatten().to_numpy()


def test_a_log_split_between_colliding_states_keeps_them_apart(tmp_path):
    # The colliding states sit in different files and row groups: the log's statistics key
    # them by their tokens too, so the log equals the batch.
    b = batch(A, B)
    table = _table(b)
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(table.slice(0, 3), src / "part-0.parquet", row_group_size=1)
    pq.write_table(table.slice(3), src / "part-1.parquet")
    for anchor in ("observation", "prefix"):
        out = tmp_path / f"out-{anchor}"
        mpo_rs.arrow.advantages_parquet(src, out, estimator="gigpo", score_col="score", anchor=anchor)
        got = pq.read_table(out).column("advantages").combine_chunks().flatten().to_numpy()
        np.testing.assert_array_equal(got, gigpo(batch(A, FRESH), anchor=anchor).advantages)


def test_step_groups_are_numbered_by_first_appearance_for_every_container():
    # Group 5 appears first: its turns' step groups come first, whatever holds the ids.
    mask = np.array([0, 1, 0, 1, 0, 1], np.uint8)
    kw = {"scores": [1.0, 0.0, 2.0], "turn_state_ids": [7, 7, 7]}
    want = [0, 1, 0]
    for ids in ([5, 3, 5], (5, 3, 5), np.array([5, 3, 5]), np.array([5.0, 3.0, 5.0]), np.array(["b", "a", "b"])):
        got = mpo_rs.gigpo_advantages(mask, [0, 2, 4, 6], group_ids=ids, **kw)
        assert got.step_groups.tolist() == want, ids
    codes, n = mpo_rs.estimators.group_codes(np.array([9, 2, 9, 4, 2], np.uint64))
    assert codes.tolist() == [0, 1, 0, 2, 1] and n == 3 and codes.dtype == np.int64


def test_anchor_ids_beyond_int64_are_refused_on_every_path():
    mask = np.array([0, 1, 0, 1], np.uint8)
    big = np.array([2**64 - 1, 3], np.uint64)
    kw = {"group_ids": [0, 0], "scores": [1.0, 0.0]}
    with pytest.raises(InvalidBatchError, match=r"18446744073709551615 at index 0, beyond int64's range"):
        mpo_rs.gigpo_advantages(mask, [0, 2, 4], turn_state_ids=big, **kw)
    table = pa.table(
        {
            "loss_mask": pa.array([[0, 1], [0, 1]], pa.list_(pa.uint8())),
            "state": pa.array([[3], [2**64 - 1]], pa.list_(pa.uint64())),
            "score": pa.array([1.0, 0.0], pa.float32()),
            "group_id": [0, 0],
        }
    )
    cols = {"score_col": "score", "turn_state_ids_col": "state"}
    with pytest.raises(InvalidBatchError, match=r"row 1, column `state`: 18446744073709551615 .* beyond int64's range"):
        mpo_rs.arrow.with_advantages(table, estimator="gigpo", **cols)
    # Within int64's range a uint64 id is its value: the same bits as int64 ids.
    small = table.set_column(1, "state", pa.array([[3], [2**63 - 1]], pa.list_(pa.uint64())))
    signed = table.set_column(1, "state", pa.array([[3], [2**63 - 1]], pa.list_(pa.int64())))
    a = mpo_rs.arrow.with_advantages(small, estimator="gigpo", **cols).column("advantages")
    assert a.equals(mpo_rs.arrow.with_advantages(signed, estimator="gigpo", **cols).column("advantages"))


def test_options_and_inputs_gigpo_would_not_read_are_refused():
    mask = np.array([0, 1, 0, 1], np.uint8)
    kw = {"group_ids": [0, 0], "scores": [1.0, 0.0]}
    # eps without the std division, as grpo refuses it.
    for options in ({"eps": 1e-3}, {"eps": 1e-3, "norm_std": False}):
        with pytest.raises(
            InvalidOptionError, match=r"`eps` does not apply to the gigpo estimator with norm_std=false"
        ):
            mpo_rs.gigpo_advantages(mask, [0, 2, 4], turn_state_ids=[1, 1], **kw, **options)
    assert mpo_rs.Estimator("gigpo", norm_std=True, eps=1e-3).options["eps"] == 1e-3
    # The anchor option says how token ids are read: beside ids given per turn it does nothing.
    with pytest.raises(InvalidOptionError, match=r"`anchor` = \"prefix\" does not apply with `turn_state_ids`"):
        mpo_rs.gigpo_advantages(mask, [0, 2, 4], turn_state_ids=[1, 1], anchor="prefix", **kw)
    # Both anchor sources: one would be left unread.
    with pytest.raises(InvalidOptionError, match=r"give `turn_state_ids` or `token_ids` .* not both"):
        mpo_rs.gigpo_advantages(mask, [0, 2, 4], turn_state_ids=[1, 1], token_ids=[0, 1, 2, 3], **kw)
    # The log path: a turn_state_ids column with anchor="prefix".
    table = pa.table(
        {
            "loss_mask": pa.array([[0, 1], [0, 1]], pa.list_(pa.uint8())),
            "turn_state_ids": pa.array([[3], [3]], pa.list_(pa.int64())),
            "score": pa.array([1.0, 0.0], pa.float32()),
            "group_id": [0, 0],
        }
    )
    with pytest.raises(InvalidOptionError, match=r"`anchor` = \"prefix\" does not apply with `turn_state_ids`"):
        mpo_rs.arrow.with_advantages(table, estimator="gigpo", score_col="score", anchor="prefix")


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_files_that_differ_in_anchor_source_are_refused_in_any_order(tmp_path, order):
    b = batch(1, 2)
    tokens_only = _table(b)
    with_ids = _table(b, turn_state_ids=pa.array([[1, 2]] * 4, pa.list_(pa.int64())))
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(tokens_only, src / f"{order[0]}.parquet")
    pq.write_table(with_ids, src / f"{order[1]}.parquet")
    with pytest.raises(
        InvalidBatchError, match=r"anchor states come from `.*`.*the files of one log must read the same"
    ):
        mpo_rs.arrow.advantages_parquet(src, tmp_path / "out", estimator="gigpo", score_col="score")
    # Naming the column reads it from every file.
    out = tmp_path / "named"
    summary = mpo_rs.arrow.advantages_parquet(src, out, estimator="gigpo", score_col="score", token_ids_col="token_ids")
    assert summary["files"] == 2
