"""GiGPO over rollout logs (docs/parquet.md, "GiGPO"): ``mpo_rs.arrow`` and ``mpo-rs
advantages --estimator gigpo`` equal :func:`mpo_rs.gigpo_advantages` on the same batch,
with groups split across files and row groups, anchors from a ``turn_state_ids`` column or
hashed from ``token_ids``; a log without either is refused naming both columns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpo_rs
from mpo_rs import Columns, InvalidBatchError, InvalidOptionError, cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def make_log(n: int, seed: int = 0, groups: int = 7) -> dict[str, object]:
    """Trajectories of alternating observation and policy runs over a vocabulary of three
    token ids (observations repeat, so step groups have several members), scattered group
    ids, token rewards, one score and one anchor id per turn per row."""
    rng = np.random.default_rng(seed)
    masks, tokens, rewards, turn_ids = [], [], [], []
    for _ in range(n):
        mask: list[int] = []
        policy = bool(rng.integers(2))
        for _ in range(rng.integers(0, 7)):
            mask += [int(policy)] * int(rng.integers(1, 4))
            policy = not policy
        m = np.array(mask, np.uint8)
        masks.append(m)
        tokens.append(rng.integers(0, 3, m.size))
        rewards.append(np.where(m == 1, rng.integers(-3, 4, m.size) / 2, 0).astype(np.float32))
        starts = np.flatnonzero(np.diff(np.r_[0, m]) == 1)
        turn_ids.append(rng.integers(0, 3, starts.size))
    offsets = np.r_[0, np.cumsum([m.size for m in masks])].astype(np.int64)
    return {
        "mask": np.concatenate(masks) if n else np.zeros(0, np.uint8),
        "offsets": offsets,
        "token_ids": np.concatenate(tokens).astype(np.int64),
        "rewards": np.concatenate(rewards),
        "scores": rng.integers(0, 3, n).astype(np.float32),
        "group_ids": rng.integers(0, groups, n),
        "turn_state_ids": turn_ids,
    }


def table_of(log: dict[str, object]) -> pa.Table:
    offsets = log["offsets"]
    lists = lambda x: pa.array([x[a:b].tolist() for a, b in itertools.pairwise(offsets)])  # noqa: E731
    return pa.table(
        {
            "prompt": pa.array([f"p{g}" for g in log["group_ids"]]),
            "loss_mask": lists(log["mask"]),
            "token_ids": lists(log["token_ids"]),
            "rewards": lists(log["rewards"]),
            "score": log["scores"],
            "group_id": log["group_ids"],
            "state": pa.array([t.tolist() for t in log["turn_state_ids"]], pa.list_(pa.int64())),
        }
    )


def numpy_gigpo(log, **kw) -> mpo_rs.GiGPOResult:
    return mpo_rs.gigpo_advantages(log["mask"], log["offsets"], group_ids=log["group_ids"], **kw)


def flat(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).combine_chunks().flatten().to_numpy(zero_copy_only=False)


@pytest.fixture(scope="module")
def log():
    return make_log(300, seed=5)


@pytest.mark.parametrize("norm_std", [False, True])
@pytest.mark.parametrize("anchor", ["observation", "prefix"])
def test_arrow_equals_numpy_with_hashed_token_ids(log, norm_std, anchor):
    table = table_of(log)
    # Many small batches: every group spans several.
    batches = pa.Table.from_batches(table.to_batches(max_chunksize=19))
    got = mpo_rs.arrow.with_advantages(
        batches, estimator="gigpo", rewards_col="rewards", norm_std=norm_std, anchor=anchor
    )
    want = numpy_gigpo(log, rewards=log["rewards"], token_ids=log["token_ids"], norm_std=norm_std, anchor=anchor)
    assert np.any(want.step_advantages != 0)
    np.testing.assert_array_equal(flat(got, "advantages"), want.advantages)
    np.testing.assert_array_equal(flat(got, "returns"), want.advantages)
    np.testing.assert_array_equal(flat(got, "turn_advantages"), want.advantages[want.turns.starts])
    assert got.select(table.column_names).equals(batches)


def test_turn_state_ids_win_and_scores_are_read(log):
    table = table_of(log)
    cols = Columns(score="score", turn_state_ids="state")
    got = mpo_rs.arrow.with_advantages(table, estimator=mpo_rs.Estimator("gigpo", gamma=0.9), columns=cols)
    want = numpy_gigpo(log, scores=log["scores"], turn_state_ids=log["turn_state_ids"], gamma=0.9)
    np.testing.assert_array_equal(flat(got, "advantages"), want.advantages)
    # Any integer type: narrower ids are widened.
    narrow = table.set_column(
        table.column_names.index("state"), "state", table.column("state").cast(pa.list_(pa.int16()))
    )
    got16 = mpo_rs.arrow.with_advantages(narrow, estimator=mpo_rs.Estimator("gigpo", gamma=0.9), columns=cols)
    np.testing.assert_array_equal(flat(got16, "advantages"), want.advantages)
    # The default column name is read when present, before token_ids.
    renamed = table.rename_columns([c if c != "state" else "turn_state_ids" for c in table.column_names])
    again = mpo_rs.arrow.with_advantages(renamed, estimator="gigpo", score_col="score", gamma=0.9)
    np.testing.assert_array_equal(flat(again, "advantages"), want.advantages)


def test_parquet_groups_split_across_files_and_row_groups(log, tmp_path):
    table = table_of(log)
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(table.slice(0, 130), src / "part-0.parquet", row_group_size=17)
    pq.write_table(table.slice(130), src / "part-1.parquet", row_group_size=23)
    want = numpy_gigpo(log, rewards=log["rewards"], token_ids=log["token_ids"], norm_std=True)
    out = tmp_path / "out"
    summary = mpo_rs.arrow.advantages_parquet(src, out, estimator="gigpo", rewards_col="rewards", norm_std=True)
    assert summary["files"] == 2 and summary["rows"] == 300
    got = pq.read_table(out)  # the directory, files in order
    np.testing.assert_array_equal(flat(got, "advantages"), want.advantages)
    # The command line: the same bits.
    out2 = tmp_path / "out2"
    flags = ["--estimator", "gigpo", "--rewards-col", "rewards", "--norm-std", "--token-ids-col", "token_ids"]
    code = cli.main(["advantages", str(src), "-o", str(out2), "-q", *flags])
    assert code == cli.EXIT_OK
    np.testing.assert_array_equal(flat(pq.read_table(out2), "advantages"), want.advantages)


def test_missing_anchor_columns_are_named(log, tmp_path, capsys):
    table = table_of(log).drop_columns(["token_ids", "state"])
    with pytest.raises(InvalidBatchError, match=r"missing column `turn_state_ids` or `token_ids`") as e:
        mpo_rs.arrow.with_advantages(table, estimator="gigpo")
    assert "turn_state_ids_col=NAME or token_ids_col=NAME" in str(e.value)
    pq.write_table(table, tmp_path / "in.parquet")
    code = cli.main(
        ["advantages", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "o.parquet"), "--estimator", "gigpo"]
    )
    assert code == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "missing column `turn_state_ids` or `token_ids`" in err and "--turn-state-ids-col NAME" in err
    # A named anchor column for another estimator, or both named, is a usage error.
    with pytest.raises(InvalidOptionError, match="applies to the gigpo estimator only"):
        mpo_rs.arrow.with_advantages(table_of(log), estimator="grpo", score_col="score", token_ids_col="token_ids")
    with pytest.raises(InvalidOptionError, match="not both"):
        mpo_rs.arrow.with_advantages(
            table_of(log), estimator="gigpo", token_ids_col="token_ids", turn_state_ids_col="state"
        )


def test_bad_anchor_data_names_row_and_column(log):
    table = table_of(log)
    state = table.column("state").to_pylist()
    row = next(j for j, s in enumerate(state) if s)
    state[row] = state[row][:-1]
    bad = table.set_column(table.column_names.index("state"), "state", pa.array(state, pa.list_(pa.int64())))
    with pytest.raises(InvalidBatchError, match=rf"row {row}, column `state`: \d+ anchor-state ids, but the row has"):
        mpo_rs.arrow.with_advantages(bad, estimator="gigpo", turn_state_ids_col="state", score_col="score")
    floats = table.set_column(table.column_names.index("state"), "state", pa.array([[0.5]] * table.num_rows))
    with pytest.raises(InvalidBatchError, match=r"column `state` has type List\(Float64\), expected list<integer>"):
        mpo_rs.arrow.with_advantages(floats, estimator="gigpo", turn_state_ids_col="state", score_col="score")
