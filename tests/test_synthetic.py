"""mpo_rs.synthetic: the one rollout-log factory of the tests, the benchmarks and the demo."""

from __future__ import annotations

import numpy as np
import pytest

from mpo_rs import InvalidOptionError, synthetic
from mpo_rs.synthetic import FlatBatch, flat_batch

FIELDS = ("values", "mask", "offsets", "rewards", "scores", "group_ids", "trajectory_ids", "token_ids", "old_logprobs")


def runs_of(batch: FlatBatch, row: int) -> list[tuple[bool, int]]:
    """(is_policy, length) of each run of equal mask values in one row."""
    m = batch.mask[batch.offsets[row] : batch.offsets[row + 1]]
    if m.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(m.astype(np.int8))) + 1
    return [(bool(part[0]), part.size) for part in np.split(m, cuts)]


@pytest.mark.parametrize("shape", [{}, synthetic.TINY, synthetic.DEMO])
def test_the_same_seed_gives_the_same_batch_and_another_seed_another(shape):
    a, b = flat_batch(40, seed=7, **shape), flat_batch(40, seed=7, **shape)
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or np.array_equal(x, y, equal_nan=True), name
    c = flat_batch(40, seed=8, **shape)
    assert not np.array_equal(a.offsets, c.offsets)


def test_the_benchmarks_stream_is_pinned():
    """The defaults are the benchmarks' batches; their numbers must not drift silently."""
    b = flat_batch(4, seed=0)
    assert b.offsets.tolist() == [0, 4501, 6196, 7680, 9007]
    assert b.scores.tolist() == [0.0, 0.25, 0.0, 0.5]
    assert b.values[b.mask][0] == np.float32(0.14279115200042725)


def test_shapes_follow_the_parameters():
    b = flat_batch(300, seed=1, turns=(2, 4), turn_len=(3, 5), obs_len=(6, 6), prompt_len=(9, 9), group_size=4)
    assert b.values.dtype == np.float32 and b.mask.dtype == np.bool_ and b.offsets.dtype == np.int64
    assert b.offsets[0] == 0 and b.offsets[-1] == b.n_tokens and np.all(np.diff(b.offsets) > 0)
    assert b.scores.shape == b.group_ids.shape == (300,)
    for row in range(b.n_trajectories):
        runs = runs_of(b, row)
        assert runs[0] == (False, 9)  # the prompt
        turns = [n for policy, n in runs if policy]
        assert 2 <= len(turns) <= 4 and all(3 <= n <= 5 for n in turns)
        assert [n for policy, n in runs[1:] if not policy] == [6] * (len(turns) - 1)
        assert runs[-1][0]  # ends on a policy token, which carries the outcome
        last = b.offsets[row + 1] - 1
        assert b.rewards[last] == b.scores[row] and np.count_nonzero(b.rewards[b.offsets[row] : last]) == 0
    np.testing.assert_array_equal(b.group_ids, np.arange(300) // 4)
    assert set(np.unique(b.scores)) <= {0.0, 0.25, 0.5, 0.75, 1.0}


def test_rows_without_turns_empty_rows_tails_and_shaping():
    b = flat_batch(
        400, seed=2, turns=(0, 2), turn_len=(1, 3), obs_len=(1, 2), prompt_len=(0, 1), tail_len=(0, 2), reward_noise=0.1
    )
    lengths = np.diff(b.offsets)
    policy = np.add.reduceat(b.mask.astype(int), b.offsets[:-1]) * (lengths > 0)
    assert (lengths == 0).any() and ((lengths > 0) & (policy == 0)).any()
    assert not b.rewards[~b.mask].any()  # rewards only on policy tokens
    ends_on_tail = [r for r in range(400) if lengths[r] and not b.mask[b.offsets[r + 1] - 1]]
    assert ends_on_tail
    no_policy = policy == 0
    assert np.all(np.add.reduceat(np.abs(b.rewards), b.offsets[:-1])[no_policy & (lengths > 0)] == 0)


@pytest.mark.parametrize("groups", ["contiguous", "interleaved", "random"])
def test_group_layouts(groups):
    b = flat_batch(
        60,
        seed=3,
        groups=groups,
        group_size=5,
        n_groups=None if groups != "interleaved" else 7,
        **{k: v for k, v in synthetic.TINY.items() if k != "groups"},
    )
    if groups == "contiguous":
        np.testing.assert_array_equal(b.group_ids, np.arange(60) // 5)
    elif groups == "interleaved":
        np.testing.assert_array_equal(b.group_ids, np.arange(60) % 7)
    else:
        assert b.group_ids.min() >= 0 and b.group_ids.max() < 12 and len(set(np.bincount(b.group_ids))) > 1


def test_options_that_change_values_and_scores():
    nan = flat_batch(20, seed=4, nan_observations=True)
    assert np.isnan(nan.values[~nan.mask]).all() and np.isfinite(nan.values[nan.mask]).all()
    demo = flat_batch(64, seed=5, **synthetic.DEMO)
    assert set(np.unique(demo.scores)) <= {0.0, 1.0} and ((demo.values >= -0.2) & (demo.values <= 1.2)).all()
    assert demo.token_ids.dtype == np.int32 and (demo.old_logprobs[~demo.mask] == 0).all()
    # a prompt's rollouts share a success rate: the scores of a group depend on its id only
    assert np.array_equal(demo.group_ids, np.arange(64) // 8)


@pytest.mark.parametrize("bad", [{"turns": 0}, {"turn_len": (3, 2)}, {"obs_len": (-1, 2)}, {"score_levels": 1}])
def test_bad_parameters_are_invalid_option_errors(bad):
    with pytest.raises(InvalidOptionError, match="synthetic"):
        flat_batch(3, **bad)


@pytest.mark.parametrize("bad", [{"groups": "striped"}, {"values": "cauchy"}])
def test_unknown_kinds_are_invalid_option_errors(bad):
    with pytest.raises(InvalidOptionError, match=f"synthetic: `{next(iter(bad))}` must be"):
        flat_batch(3, **bad)


def test_chunks_continue_one_log():
    chunks = list(synthetic.flat_batches(50, 20, seed=6, group_size=8))
    assert [c.n_trajectories for c in chunks] == [20, 20, 10]
    np.testing.assert_array_equal(np.concatenate([c.trajectory_ids for c in chunks]), np.arange(50))
    np.testing.assert_array_equal(np.concatenate([c.group_ids for c in chunks]), np.arange(50) // 8)
    again = list(synthetic.flat_batches(50, 20, seed=6, group_size=8))
    assert all(np.array_equal(a.values, b.values) for a, b in zip(chunks, again, strict=True))


# Arrow and Parquet forms

try:  # the numpy tests above run without pyarrow; the ones below need it
    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.parquet as pq
except ImportError:
    pa = pq = None
needs_pyarrow = pytest.mark.skipif(pa is None, reason="needs pyarrow")


def flat(column) -> np.ndarray:
    return np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in column.chunks])


def assert_round_trip(table, b: FlatBatch, first: int = 0) -> None:
    n = table.num_rows
    off = b.offsets[first : first + n + 1]
    sl = slice(int(off[0]), int(off[-1]))
    np.testing.assert_array_equal(table["trajectory_id"].to_numpy(), b.trajectory_ids[first : first + n])
    np.testing.assert_array_equal(table["score"].to_numpy(), b.scores[first : first + n])
    np.testing.assert_array_equal(flat(table["values"]), b.values[sl])
    np.testing.assert_array_equal(flat(table["loss_mask"]), b.mask[sl])
    np.testing.assert_array_equal(flat(table["rewards"]), b.rewards[sl])
    lengths = np.asarray(pyarrow.compute.list_value_length(table["values"].combine_chunks()))
    np.testing.assert_array_equal(lengths, np.diff(off))


def test_log_columns_are_append_flats_arguments():
    import inspect

    from mpo_rs.rollout_log import RolloutLogWriter

    b = flat_batch(6, seed=3, tokens=True, **synthetic.TINY)
    columns = b.log_columns()
    assert set(columns) < set(inspect.signature(RolloutLogWriter.append_flat).parameters) - {"step"}
    assert columns["loss_mask"] is b.mask and columns["token_ids"] is b.token_ids and columns["scores"] is b.scores


@needs_pyarrow
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("chunks", [1, 4])
def test_arrow_round_trip(large, chunks):
    b = flat_batch(30, seed=7, tokens=True, **synthetic.TINY)
    t = synthetic.to_arrow(b, large=large, chunks=chunks)
    assert t.column_names == [
        "trajectory_id",
        "group_id",
        "score",
        "token_ids",
        "loss_mask",
        "values",
        "rewards",
        "old_logprobs",
    ]
    assert t.schema.field("values").type == (pa.large_list if large else pa.list_)(pa.float32())
    assert t["values"].num_chunks == chunks
    assert_round_trip(t, b)
    np.testing.assert_array_equal(flat(t["token_ids"]), b.token_ids)
    strings = synthetic.to_arrow(b, string_groups=True)["group_id"].to_pylist()
    assert strings == [f"prompt-{g}" for g in b.group_ids]
    assert synthetic.to_arrow(flat_batch(5)).column_names == [
        "trajectory_id",
        "group_id",
        "score",
        "loss_mask",
        "values",
        "rewards",
    ]


@needs_pyarrow
def test_parquet_round_trip_one_file_in_row_groups(tmp_path):
    b = flat_batch(50, seed=8, **synthetic.TINY)
    written = synthetic.write_parquet(tmp_path / "log.parquet", b, row_group_rows=12)
    assert (written.rows, written.tokens, written.paths) == (50, b.n_tokens, [tmp_path / "log.parquet"])
    f = pq.ParquetFile(tmp_path / "log.parquet")
    assert [f.metadata.row_group(g).num_rows for g in range(f.metadata.num_row_groups)] == [12, 12, 12, 12, 2]
    assert_round_trip(f.read(), b)
    assert [p.name for p in tmp_path.iterdir()] == ["log.parquet"]  # no temporary left


@needs_pyarrow
def test_parquet_split_into_files(tmp_path):
    b = flat_batch(71, seed=9, **synthetic.TINY)
    written = synthetic.write_parquet(tmp_path / "log", b, files=(23, 31, 17), row_group_rows=12, string_groups=True)
    assert [p.name for p in written.paths] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    first = 0
    for path, rows in zip(written.paths, (23, 31, 17), strict=True):
        t = pq.read_table(path)
        assert t.num_rows == rows and t.schema.field("group_id").type == pa.string()
        assert_round_trip(t, b, first)
        first += rows
    assert len(synthetic.write_parquet(tmp_path / "even", b, files=3).paths) == 3
    with pytest.raises(InvalidOptionError, match="do not add up"):
        synthetic.write_parquet(tmp_path / "bad", b, files=(10, 10))


@needs_pyarrow
def test_parquet_streamed_chunks_are_the_log(tmp_path):
    chunks = list(synthetic.flat_batches(45, 20, seed=10, **synthetic.TINY))
    written = synthetic.write_parquet(tmp_path / "log.parquet", iter(chunks), compression="none")
    assert written.rows == 45 and written.tokens == sum(c.n_tokens for c in chunks)
    f = pq.ParquetFile(tmp_path / "log.parquet")
    assert f.metadata.num_row_groups == 3
    for g, c in enumerate(chunks):
        assert_round_trip(f.read_row_group(g), c)
