"""The Rust group statistics behind the Ray adapter (mpo_rs._native.GroupStatistics,
annotate_batch, resolve_log_columns) and verl's critic-free MAE (group_baselines)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mpo_rs import Columns, InvalidBatchError, InvalidOptionError, _native, synthetic
from mpo_rs.options import Estimator

pa = pytest.importorskip("pyarrow")


def numpy_baselines(
    scores: np.ndarray, ids: np.ndarray, leave_one_out: bool, norm_std: bool, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy code verl's mpo_mae_grpo / mpo_mae_rloo used before the Rust core."""
    _, inverse = np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    s = scores.astype(np.float64)
    count = np.bincount(inverse)
    total = np.bincount(inverse, weights=s)
    n = count[inverse].astype(np.float64)
    others = np.maximum(n - 1, 1)
    scale = np.ones_like(s)
    if leave_one_out:
        baseline = (total[inverse] - s) / others
    else:
        baseline = (total / count)[inverse]
        if norm_std:
            sq_dev = np.bincount(inverse, weights=(s - baseline) ** 2)
            scale = 1.0 / (np.sqrt(sq_dev[inverse] / others) + eps)
    return baseline, scale, n < 2


@pytest.mark.parametrize(
    ("leave_one_out", "norm_std", "eps"),
    [(False, True, 1e-6), (False, False, 1e-6), (True, False, 1e-6), (False, True, 0.3)],
)
def test_group_baselines_are_the_numpy_statistics_bitwise(leave_one_out, norm_std, eps):
    rng = np.random.default_rng(5)
    ids = np.concatenate([rng.integers(0, 9, 200), np.arange(9, 14)])  # five groups of one
    scores = (rng.normal(size=ids.size) * 10 + 1e3).astype(np.float32)
    uses_eps = norm_std and not leave_one_out  # an eps the formula ignores is refused
    est = Estimator("grpo", norm_std=norm_std, leave_one_out=leave_one_out, **({"eps": eps} if uses_eps else {}))
    got = _native.group_baselines(scores, ids.astype(np.int64), 14, est)
    want = numpy_baselines(scores, ids, leave_one_out, norm_std, eps)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert got[2].sum() == 5
    with pytest.raises(InvalidBatchError, match="trajectory 3"):
        _native.group_baselines(np.array([0, 1, 2, np.nan], np.float32), np.zeros(4, np.int64), 1, est)


def log_table(rows: int = 60) -> pa.Table:
    batch = synthetic.flat_batch(rows, seed=3, groups="interleaved", n_groups=5, score_levels=3, tokens=True)
    return synthetic.to_arrow(batch)


def test_partials_merge_to_the_statistics_of_the_whole():
    table = log_table()
    columns = Columns(mask="loss_mask", values="values", rewards="rewards", group="group_id")
    parts = [table.slice(0, 7), table.slice(7, 30), table.slice(37)]
    partials = [pa.table(_native.GroupStatistics.scan(p, columns=columns).to_arrow()) for p in parts]
    merged = _native.GroupStatistics.merge(partials)
    whole = pa.table(_native.GroupStatistics.scan(table, columns=columns).to_arrow())
    got = pa.table(merged.to_arrow())
    assert len(merged) == 5 and got.column_names == list(_native.GroupStatistics.columns)
    assert got["group"].equals(whole["group"]) and got["count"].equals(whole["count"])
    for name in ("sum", "mean", "m2"):
        np.testing.assert_allclose(got[name].to_numpy(), whole[name].to_numpy(), rtol=1e-12, atol=1e-12)

    # Annotating each part with the merged statistics is annotating the whole table.
    from mpo_rs.arrow import with_advantages

    est = Estimator("rloo")
    annotated = pa.concat_tables([pa.table(_native.annotate_batch(p, est, merged, columns=columns)) for p in parts])
    want = with_advantages(table, estimator=est, rewards_col="rewards")
    assert annotated.column_names == want.column_names
    np.testing.assert_allclose(
        annotated["advantages"].combine_chunks().flatten().to_numpy(),
        want["advantages"].combine_chunks().flatten().to_numpy(),
        rtol=1e-6,
        atol=1e-7,
    )

    with pytest.raises(InvalidOptionError, match="need the merged GroupStatistics"):
        _native.annotate_batch(table, est, None, columns=columns)
    stranger = table.slice(0, 2).set_column(table.column_names.index("group_id"), "group_id", pa.array([0, 99]))
    with pytest.raises(InvalidBatchError, match=r"row 1, column `group_id`: group id not seen"):
        _native.annotate_batch(stranger, est, merged, columns=columns)


def test_resolve_log_columns_picks_the_reward_column_and_checks_types():
    table = log_table(4)
    names = Columns(mask="loss_mask", values="values", group="group_id")
    got = _native.resolve_log_columns(table.schema, Estimator("grpo"), columns=names)
    assert got == ("rewards", None, None, ["rewards", "group_id", "loss_mask"])
    got = _native.resolve_log_columns(table.schema, Estimator("mae"), columns=replace(names, score="score"))
    assert got == (None, "score", None, [])
    with pytest.raises(InvalidBatchError, match="missing column `critic`"):
        _native.resolve_log_columns(table.schema, Estimator("gae"), columns=replace(names, values="critic"))
    both = replace(names, rewards="rewards", score="score")
    with pytest.raises(InvalidOptionError, match="not both"):
        _native.resolve_log_columns(table.schema, Estimator("mae"), columns=both)


# --- The group-id rule across blocks and files (issue 18 defect 8) ---------------------


def _partial(ids: pa.Array) -> pa.Table:
    table = pa.table({"g": ids, "score": pa.array(np.arange(len(ids)), pa.float32())})
    return pa.table(_native.GroupStatistics.scan(table, columns=Columns(group="g", mask="m", score="score")).to_arrow())


def test_int_ids_beyond_2_53_beside_float_ids_are_refused_naming_the_blocks():
    # int64 2**53 and 2**53+1 in one block, float ids in another: the merged table had two
    # rows keyed by the same float 2**53, and the annotation then failed with "did the input
    # change during the run?". The ids have no one exact type: refused, naming both blocks.
    blocks = [_partial(pa.array([2**53, 2**53 + 1], pa.int64())), _partial(pa.array([0.5, 2.0**53]))]
    with pytest.raises(InvalidBatchError, match=r"9007199254740993 in block 0 .* block 1 holds float ids"):
        _native.GroupStatistics.merge(blocks, labels=["block 0", "block 1"])
    with pytest.raises(InvalidBatchError, match="statistics table 0"):
        _native.GroupStatistics.merge(blocks)


def test_int_and_float_ids_merge_by_value_with_exact_keys():
    blocks = [_partial(pa.array([1, 2**53, -3], pa.int64())), _partial(pa.array([1.0, 0.5, -0.0]))]
    merged = pa.table(_native.GroupStatistics.merge(blocks).to_arrow())
    assert merged["group"].type == pa.float64()
    assert merged["group"].to_pylist() == [-3.0, 0.0, 0.5, 1.0, 2.0**53]
    assert merged["count"].to_pylist() == [1, 1, 1, 2, 1]
    # Every key is distinct, so the table merges back into itself.
    again = pa.table(_native.GroupStatistics.merge([merged]).to_arrow())
    assert again.equals(merged)


def test_string_ids_beside_number_ids_are_refused_naming_the_blocks():
    blocks = [_partial(pa.array([1, 2], pa.int64())), _partial(pa.array([], pa.int64())), _partial(pa.array(["1"]))]
    with pytest.raises(InvalidBatchError, match=r"string group ids in b2 but number ids in b0"):
        _native.GroupStatistics.merge(blocks, labels=["b0", "b1", "b2"])
    # An empty block holds no ids, whatever its type.
    merged = pa.table(_native.GroupStatistics.merge(blocks[1:]).to_arrow())
    assert merged["group"].to_pylist() == ["1"]


def test_uint64_ids_keep_their_exact_value():
    big = 2**64 - 1
    merged = pa.table(
        _native.GroupStatistics.merge(
            [_partial(pa.array([big, 3], pa.uint64())), _partial(pa.array([3], pa.uint8()))]
        ).to_arrow()
    )
    assert merged["group"].type == pa.uint64() and merged["group"].to_pylist() == [3, big]
    with pytest.raises(InvalidBatchError, match="beyond int64"):
        _native.GroupStatistics.merge([_partial(pa.array([big], pa.uint64())), _partial(pa.array([-1], pa.int64()))])


def _log_file(path, ids: pa.Array) -> None:
    import pyarrow.parquet as pq

    n = len(ids)
    table = pa.table(
        {
            "group_id": ids,
            "score": pa.array(np.arange(n), pa.float32()),
            "loss_mask": pa.array([[1, 1]] * n, pa.list_(pa.int8())),
            "values": pa.array([[0.0, 0.0]] * n, pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path)


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (pa.array([2**53, 2**53 + 1], pa.int64()), pa.array([0.5, 2.0]), r"9007199254740993 in \S*a.parquet"),
        (pa.array([1, 2], pa.int64()), pa.array(["1", "2"]), r"string group ids in \S*b.parquet but number ids in"),
    ],
)
def test_the_cli_refuses_the_same_mixed_group_ids(tmp_path, a, b, message):
    from mpo_rs.arrow import advantages_parquet

    root = tmp_path / "in"
    root.mkdir()
    _log_file(root / "a.parquet", a)
    _log_file(root / "b.parquet", b)
    for estimator in ("grpo", "rloo"):
        with pytest.raises(InvalidBatchError, match=message):
            advantages_parquet(root, tmp_path / "out", estimator=estimator)
    assert not (tmp_path / "out").exists()
    if b.type == pa.string():
        with pytest.raises(InvalidBatchError, match=message):
            _native.check_group_column([root], "group_id")
    # mae reads no group ids: the same log is fine.
    advantages_parquet(root, tmp_path / "out", estimator="mae")


def test_int_and_float_files_group_by_value_in_the_cli(tmp_path):
    import pyarrow.parquet as pq

    from mpo_rs.arrow import advantages_parquet

    root = tmp_path / "in"
    root.mkdir()
    _log_file(root / "a.parquet", pa.array([1, 2], pa.int64()))
    _log_file(root / "b.parquet", pa.array([2.0, 1.0]))
    advantages_parquet(root, tmp_path / "out", estimator="drgrpo")
    adv = [pq.read_table(tmp_path / "out" / f)["advantages"].to_pylist() for f in ("a.parquet", "b.parquet")]
    # group 1 = scores {0 (a), 1 (b)}, group 2 = {1 (a), 0 (b)}: means 0.5.
    assert adv == [[[-0.5, -0.5], [0.5, 0.5]], [[-0.5, -0.5], [0.5, 0.5]]]
