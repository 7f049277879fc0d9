"""Arrow tables in and out (docs/parquet.md): pyarrow and polars objects, list and
large_list, no copies of the inputs, equality with the numpy estimators, and bad data
named by row and column."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

import mpo_rs  # noqa: E402
from mpo_rs import _native, synthetic  # noqa: E402
from mpo_rs.arrow import OUTPUT_COLUMNS, with_advantages  # noqa: E402


def make_log(rows: int, seed: int = 0, groups: int = 5, **shape: Any) -> dict[str, np.ndarray]:
    """Flat columns of a small random multi-turn log (mpo_rs.synthetic's TINY shape, which
    ``shape`` overrides; ids of `groups` scattered groups, not sorted; ``token_ids`` with
    ``tokens=True``); every row ends on a policy token."""
    b = synthetic.flat_batch(rows, seed=seed, n_groups=groups, **{**synthetic.TINY, **shape})
    log = {
        "offsets": b.offsets,
        "mask": b.mask.astype(np.uint8),
        "values": b.values,
        "rewards": b.rewards,
        "scores": b.scores,
        "groups": b.group_ids,
        "token_ids": b.token_ids,
    }
    return {name: column for name, column in log.items() if column is not None}


def to_table(log: dict[str, np.ndarray], large: bool = False, chunks: int = 1) -> pa.Table:
    batch = synthetic.FlatBatch(
        log["values"], log["mask"], log["offsets"], log["rewards"], log["scores"], log["groups"]
    )
    return synthetic.to_arrow(batch, large=large, chunks=chunks)


def flat(column: pa.ChunkedArray) -> np.ndarray:
    return np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in column.chunks] or [[]])


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("chunks", [1, 3])
def test_mae_columns_equal_the_numpy_estimator(large, chunks):
    log = make_log(60, seed=1)
    table = to_table(log, large=large, chunks=chunks)
    out = with_advantages(table)
    want = mpo_rs.mae_advantages(log["values"], log["mask"], log["offsets"], rewards=log["rewards"])
    np.testing.assert_array_equal(flat(out["advantages"]), want.advantages)
    np.testing.assert_array_equal(flat(out["returns"]), want.returns)
    np.testing.assert_array_equal(flat(out["turn_advantages"]), want.turn_advantages)
    # turn_index counts turns within each row: global index minus the row's first turn.
    row_of_token = np.repeat(np.arange(60), np.diff(log["offsets"]))
    tt = want.turns.token_turn
    local = np.where(tt >= 0, tt - want.turns.traj_offsets[row_of_token], -1)
    np.testing.assert_array_equal(flat(out["turn_index"]), local)
    assert out.schema.field("advantages").type == (pa.large_list if large else pa.list_)(
        pa.field("item", pa.float32(), nullable=False)
    )
    assert out.column_names == table.column_names + list(OUTPUT_COLUMNS)


def test_inputs_are_shared_not_copied():
    table = to_table(make_log(20))
    out = with_advantages(table)
    for name in table.column_names:
        for a, b in zip(table[name].chunks, out[name].chunks, strict=True):
            assert [x.address for x in a.buffers() if x] == [x.address for x in b.buffers() if x]


def test_sliced_tables_rebase_their_offsets():
    log = make_log(30, seed=2)
    table = to_table(log).slice(7, 15)
    out = with_advantages(table)
    lo, hi = log["offsets"][7], log["offsets"][22]
    sub_offsets = log["offsets"][7:23] - lo
    want = mpo_rs.mae_advantages(log["values"][lo:hi], log["mask"][lo:hi], sub_offsets, rewards=log["rewards"][lo:hi])
    np.testing.assert_array_equal(flat(out["advantages"]), want.advantages)


def test_gae_and_score_column():
    log = make_log(40, seed=3)
    table = to_table(log).drop_columns(["rewards"])
    out = with_advantages(table, estimator="gae", lam=0.9, gamma=0.99)
    want = mpo_rs.gae_advantages(log["values"], log["mask"], log["offsets"], scores=log["scores"], lam=0.9, gamma=0.99)
    np.testing.assert_array_equal(flat(out["advantages"]), want.advantages)
    np.testing.assert_array_equal(flat(out["returns"]), want.returns)


@pytest.mark.parametrize(
    "estimator, kw",
    [
        ("grpo", {}),
        ("drgrpo", {"norm_std": False}),
        ("rloo", {"leave_one_out": True}),
    ],
)
def test_group_baselines_across_chunks_equal_the_numpy_estimator(estimator, kw):
    log = make_log(80, seed=4)
    out = with_advantages(to_table(log, chunks=4), estimator=estimator, score_col="score")
    per_row = mpo_rs.group_advantages(log["scores"], log["groups"], **kw)
    want = mpo_rs.broadcast_to_tokens(per_row, log["mask"], log["offsets"])
    np.testing.assert_array_equal(flat(out["advantages"]), want)
    np.testing.assert_array_equal(flat(out["returns"]), want)


def test_record_batch_and_struct_chunked_array_keep_their_kind():
    log = make_log(10, seed=5)
    table = to_table(log)
    batch = table.to_batches()[0]
    out = with_advantages(batch)
    assert isinstance(out, pa.RecordBatch)
    assert out.schema.names == batch.schema.names + list(OUTPUT_COLUMNS)
    structs = pa.chunked_array([pa.StructArray.from_arrays(batch.columns, names=batch.schema.names)])
    out_structs = with_advantages(structs)
    assert isinstance(out_structs, pa.ChunkedArray)
    assert [f.name for f in out_structs.type] == batch.schema.names + list(OUTPUT_COLUMNS)
    np.testing.assert_array_equal(
        flat(pa.chunked_array([c.field("advantages") for c in out_structs.chunks])),
        flat(with_advantages(table)["advantages"]),
    )


def test_polars_in_polars_out():
    pl = pytest.importorskip("polars")
    log = make_log(25, seed=6)
    table = to_table(log)
    df = pl.from_arrow(table)
    assert df.schema["values"] == pl.List(pl.Float32)
    out = with_advantages(df, estimator="mae")
    assert isinstance(out, pl.DataFrame)
    assert out.columns == df.columns + list(OUTPUT_COLUMNS)
    assert out.select(df.columns).equals(df)
    np.testing.assert_array_equal(out["advantages"].explode().to_numpy(), flat(with_advantages(table)["advantages"]))
    series = with_advantages(df.to_struct("log"))
    assert isinstance(series, pl.Series) and series.name == "log"
    assert series.struct.unnest().equals(out)


def test_float64_values_and_integer_masks_are_accepted():
    log = make_log(12, seed=7)
    off = pa.array(log["offsets"], pa.int32())
    table = pa.table(
        {
            "loss_mask": pa.ListArray.from_arrays(off, pa.array(log["mask"].astype(np.int64))),
            "values": pa.ListArray.from_arrays(off, pa.array(log["values"].astype(np.float64))),
            "rewards": pa.ListArray.from_arrays(off, pa.array(log["rewards"].astype(np.float64))),
        }
    )
    out = with_advantages(table)
    want = mpo_rs.mae_advantages(log["values"], log["mask"], log["offsets"], rewards=log["rewards"])
    np.testing.assert_array_equal(flat(out["advantages"]), want.advantages)


def _replace(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, column)


def _bad_tables():
    log = make_log(6, seed=8)
    t = to_table(log)
    lens = np.diff(log["offsets"])
    values = [list(map(float, log["values"][a:b])) for a, b in pairwise(log["offsets"])]
    null_list = values.copy()
    null_list[4] = None
    null_elem = [v.copy() for v in values]
    null_elem[3][0] = None
    short = [v.copy() for v in values]
    short[2] = short[2][:-1] if lens[2] > 1 else short[2] + [0.0, 0.0]
    nan = [v.copy() for v in values]
    first_policy = int(np.flatnonzero(log["mask"][log["offsets"][5] : log["offsets"][6]])[0])
    nan[5][first_policy] = float("nan")
    masks = [list(map(int, log["mask"][a:b])) for a, b in pairwise(log["offsets"])]
    masks[1][0] = 2
    huge = [v.copy() for v in values]
    huge[2][-1] = 1e300  # float64 only: it would become inf in float32
    huge_scores = log["scores"].astype(np.float64)
    huge_scores[4] = -3.5e38
    f32 = pa.list_(pa.float32())
    return [
        (_replace(t, "values", pa.array(null_list, f32)), r"row 4, column `values`: null list"),
        (_replace(t, "values", pa.array(null_elem, f32)), r"row 3, column `values`: null element at token 0"),
        (_replace(t, "values", pa.array(short, f32)), r"row 2: column `values` has \d+ tokens but `loss_mask` has"),
        (
            _replace(t, "values", pa.array(nan, f32)),
            rf"row 5, column `values`: NaN is not finite at token {first_policy}",
        ),
        (
            _replace(t, "loss_mask", pa.array(masks, pa.list_(pa.int8()))),
            r"row 1, column `loss_mask`: the mask must hold 0 or 1, found 2 at token 0",
        ),
        (
            _replace(t, "values", pa.array(huge, pa.list_(pa.float64()))),
            rf"row 2, column `values`: 1e300 at token {lens[2] - 1} is outside float32's range",
        ),
        (
            _replace(t, "score", pa.array(huge_scores)).drop_columns(["rewards"]),
            r"row 4, column `score`: -3.5e38 is outside float32's range",
        ),
        (t.drop_columns(["values"]), r"missing column `values`"),
        (
            _replace(t, "values", pa.array([["x"]] * 6)),
            r"column `values` has type List\(.*Utf8.*\), expected list<float or integer>",
        ),
        (t.append_column("advantages", t["score"]), r"column `advantages` is already in the input"),
    ]


@pytest.mark.parametrize("table, pattern", _bad_tables())
def test_bad_tables_name_row_and_column(table, pattern):
    with pytest.raises(mpo_rs.InvalidBatchError, match=pattern):
        with_advantages(table)


def test_errors_name_the_row_in_the_whole_table():
    log = make_log(30, seed=9)
    scores = log["scores"].copy()
    scores[23] = np.nan
    table = _replace(to_table(log, chunks=3), "score", pa.array(scores)).drop_columns(["rewards"])
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"row 23, column `score`: NaN is not finite"):
        with_advantages(table, estimator="grpo")


@pytest.mark.parametrize(
    "kw, pattern",
    [
        ({"estimator": "ppo"}, "unknown estimator `ppo`"),
        ({"estimator": "gae", "beta": 0.5}, "`beta` does not apply to the gae estimator"),
        ({"lam": 1.5}, r"`lam` = 1.5 is out of range"),
        ({"rewards_col": "rewards", "score_col": "score"}, "not both"),
    ],
)
def test_unusable_options_raise_invalid_option_error(kw, pattern):
    assert issubclass(_native.InvalidOptionError, ValueError)
    with pytest.raises(_native.InvalidOptionError, match=pattern):
        with_advantages(to_table(make_log(3)), **kw)


def test_non_tables_are_invalid_batch_errors():
    with pytest.raises(_native.InvalidBatchError, match="PyCapsule"):
        with_advantages([1, 2, 3])
    with pytest.raises(_native.InvalidBatchError, match="struct"):
        with_advantages(pa.chunked_array([[1, 2]]))


def test_empty_tables():
    table = to_table(make_log(5)).slice(0, 0)
    out = with_advantages(table)
    assert out.num_rows == 0 and out.column_names[-4:] == list(OUTPUT_COLUMNS)


def test_missing_loss_mask_names_the_users_columns_and_the_mask_col_keyword():
    """Issue 20, item 8: a missing ``loss_mask`` listed only the columns passed on to Rust
    (``values, score``), not the user's (``response_mask`` was there), and no keyword."""
    table = pa.table(
        {
            "values": pa.array([[0.0, 1.0]], pa.list_(pa.float32())),
            "response_mask": pa.array([[1, 1]], pa.list_(pa.int8())),
            "score": [1.0],
            "prompt": ["x"],
        }
    )
    want = (
        "missing column `loss_mask` (the input's columns are: values, response_mask, score, prompt); "
        "name the column to use with mask_col=NAME"
    )
    inputs = [table, table.to_batches()[0], pa.chunked_array([table.to_batches()[0].to_struct_array()])]
    try:
        import polars as pl

        inputs += [pl.from_arrow(table), pl.from_arrow(table).to_struct("s")]
    except ImportError:
        pass
    for x in inputs:
        with pytest.raises(mpo_rs.InvalidBatchError) as e:
            with_advantages(x)
        assert str(e.value) == want, (type(x), str(e.value))
    out = with_advantages(table, mask_col="response_mask")
    assert out.column_names[-4:] == list(OUTPUT_COLUMNS)
    no_reward = table.drop_columns(["score"])
    with pytest.raises(mpo_rs.InvalidBatchError, match="rewards_col=NAME or score_col=NAME"):
        with_advantages(no_reward, mask_col="response_mask")
