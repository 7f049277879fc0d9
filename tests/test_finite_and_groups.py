"""Issue 11 items 6 and 7: one group-id rule for every path (numpy, Parquet tool, verl, Ray),
and estimators that return finite numbers or raise naming the trajectory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpo_rs
from mpo_rs import InvalidBatchError, _native

SCORES = np.array([0.0, 5.0, 1.0, 9.0], np.float32)


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpo_rs.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


# --------------------------------------------------------------------------- 6. group ids


@pytest.mark.parametrize("missing", [np.nan, float("nan"), np.float32("nan"), np.inf, -np.inf, None])
def test_a_missing_group_id_is_refused_naming_the_trajectory(missing):
    # Was [0, 0, 0, 0]: NaN != NaN broke numpy's factorization of the whole object array.
    ids = np.array([1.0, missing, 1.0, 2.0], dtype=object)
    with pytest.raises(InvalidBatchError, match=r"`group_ids` is .* at trajectory 1; a group id must not be missing"):
        mpo_rs.group_advantages(SCORES, ids)


def test_missing_ids_in_typed_arrays_and_lists_are_refused_too():
    with pytest.raises(InvalidBatchError, match="at trajectory 2"):
        mpo_rs.group_advantages(SCORES, np.array([1.0, 1.0, np.nan, 2.0]))
    with pytest.raises(InvalidBatchError, match="at trajectory 3"):
        mpo_rs.group_advantages(SCORES, ["a", "b", "a", None])
    with pytest.raises(InvalidBatchError, match="at trajectory 0"):
        mpo_rs.group_advantages(SCORES, np.array(["NaT", "2024-01-01", "2024-01-01", "NaT"], "datetime64[D]"))


@pytest.mark.parametrize(
    "ids",
    [
        np.array([1, "1", 1, "1"], dtype=object),
        [1, "1", 1, "1"],  # numpy alone would make this ["1", "1", "1", "1"]
        [1.0, "1", np.int64(1), np.str_("1")],
        [1, b"1", 1, b"1"],
    ],
)
def test_a_number_and_a_string_are_two_groups(ids):
    got = mpo_rs.group_advantages(SCORES, ids, norm_std=False)
    np.testing.assert_array_equal(got, [-0.5, -2.0, 0.5, 2.0])  # {0, 1} and {5, 9}


def test_numbers_compare_by_value():
    ints = mpo_rs.group_advantages(SCORES, np.array([1, 2, 1, 2]))
    for ids in (
        np.array([1.0, 2.0, 1.0, 2.0]),
        np.array([1, 2.0, np.int64(1), np.float32(2)], dtype=object),
        [True, 2, 1.0, 2],
        np.array([1, 2, 1, 2], np.uint8),
    ):
        np.testing.assert_array_equal(mpo_rs.group_advantages(SCORES, ids), ints)
    # -0.0 is 0; 2.5 is its own group.
    got = mpo_rs.group_advantages(SCORES, [0, -0.0, 2.5, 2.5], norm_std=False)
    np.testing.assert_array_equal(got, [-2.5, 2.5, -4.0, 4.0])


def test_other_hashable_ids_by_type_and_value_and_unhashable_refused():
    ids = np.empty(4, dtype=object)
    ids[:] = [("p", 1), ("p", 2), ("p", 1), ("p", 2)]
    got = mpo_rs.group_advantages(SCORES, ids, norm_std=False)
    np.testing.assert_array_equal(got, [-0.5, -2.0, 0.5, 2.0])
    ids[:] = [[1], [1], [2], [2]]
    with pytest.raises(InvalidBatchError, match="unhashable list at trajectory 0"):
        mpo_rs.group_advantages(SCORES, ids)


def test_group_codes_are_dense_in_order_of_first_appearance():
    codes, n = mpo_rs.estimators.group_codes(np.array(["b", 7, "b", 7.0, "c"], dtype=object))
    assert n == 3 and codes.dtype == np.int64
    np.testing.assert_array_equal(codes, [0, 1, 0, 1, 2])


pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def group_log(path: Path, group_ids: pa.Array, scores: list[float]) -> Path:
    n = len(scores)
    pq.write_table(
        pa.table(
            {
                "loss_mask": pa.array([[True, True]] * n, pa.list_(pa.bool_())),
                "values": pa.array([[0.0, 0.0]] * n, pa.list_(pa.float32())),
                "score": pa.array(scores, pa.float32()),
                "group_id": group_ids,
            }
        ),
        path,
    )
    return path


def cli_row_advantages(path: Path) -> np.ndarray:
    t = pq.read_table(path, columns=["advantages"])
    return np.array([row[0] for row in t["advantages"].to_pylist()], np.float32)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1.0, 2.5, 1.0, 2.5, 3.0], pa.float64()),
        pa.array([1.0, 2.5, 1.0, 2.5, 3.0], pa.float32()),
        pa.array([1, 2, 1, 2, 3], pa.int16()),
        pa.array(["1", "2.5", "1", "2.5", "x"]),
    ],
)
def test_the_parquet_tool_groups_as_the_numpy_function(tmp_path, column):
    scores = [1.0, 4.0, 2.0, 8.0, 5.0]
    src = group_log(tmp_path / "in.parquet", column, scores)
    for estimator, kw in [("grpo", {}), ("drgrpo", {"norm_std": False}), ("rloo", {"leave_one_out": True})]:
        out = tmp_path / f"{estimator}.parquet"
        r = run_cli("advantages", src, "-o", out, "--estimator", estimator, "-q")
        assert r.returncode == 0, r.stderr
        want = mpo_rs.group_advantages(np.array(scores, np.float32), column.to_numpy(zero_copy_only=False), **kw)
        np.testing.assert_array_equal(cli_row_advantages(out), want)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None])
def test_the_parquet_tool_refuses_a_missing_group_id_naming_the_row(tmp_path, bad):
    src = group_log(tmp_path / "in.parquet", pa.array([1.0, 1.0, 2.0, bad, 2.0], pa.float64()), [0.0] * 5)
    out = tmp_path / "out.parquet"
    r = run_cli("advantages", src, "-o", out, "--estimator", "grpo", "-q")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "row 3, column `group_id`" in r.stderr, r.stderr
    assert not out.exists()


def test_verl_plugin_follows_the_rule():
    torch = pytest.importorskip("torch")
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from mpo_rs.integrations import verl as plugin

    rewards = torch.zeros(4, 2)
    rewards[:, 1] = torch.tensor([0.0, 5.0, 1.0, 9.0])
    mask = torch.ones(4, 2)
    with pytest.raises(InvalidBatchError, match="at trajectory 1"):
        plugin.compute_mpo_grpo_advantage(rewards, mask, None, np.array(["a", np.nan, "a", "b"], dtype=object))
    for fn in (plugin.compute_mpo_grpo_advantage, plugin.compute_mpo_mae_grpo_advantage):
        with pytest.raises(InvalidBatchError, match="at trajectory 3"):
            fn(rewards, mask, None, np.array([1, 2, 1, None], dtype=object))
    # 1 and "1" are two groups: {0, 1} and {5, 9}, as group_advantages.
    adv, _ = plugin.compute_mpo_grpo_advantage(rewards, mask, None, np.array([1, "1", 1, "1"], dtype=object))
    want = mpo_rs.group_advantages(SCORES, np.array([1, "1", 1, "1"], dtype=object))
    np.testing.assert_allclose(adv[:, 0].numpy(), want, rtol=1e-6)


def test_ray_group_keys_follow_the_rule():
    # The statistics the Ray adapter ships (mpo_rs._native.GroupStatistics): float ids by
    # value (-0.0 and 0.0 one group), NaN and inf missing ids refused naming row and column.
    stats = _native.GroupStatistics.scan(
        pa.table(
            {"g": pa.array([1.0, -0.0, 2.5, 0.0, 1.0]), "score": pa.array([1.0, 2.0, 3.0, 4.0, 5.0], pa.float32())}
        ),
        columns=mpo_rs.Columns(group="g", score="score"),
    )
    table = pa.table(_native.GroupStatistics.merge([pa.table(stats.to_arrow())]).to_arrow())
    assert table["group"].type == pa.float64()
    assert table["group"].to_pylist() == [0.0, 1.0, 2.5] and table["count"].to_pylist() == [2, 2, 1]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InvalidBatchError, match=r"row 1, column `g`: .* is not finite"):
            _native.GroupStatistics.scan(
                pa.table({"g": pa.array([1.0, bad]), "score": pa.array([1.0, 2.0])}),
                columns=mpo_rs.Columns(group="g", score="score"),
            )


# --------------------------------------------------------------------------- 7. finite output


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan")])
def test_eps_must_be_positive(eps):
    # eps=0 with equal scores gave 0/0 = NaN.
    # An option out of its domain is an InvalidOptionError from every entry point.
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`eps` = .* is out of range: it must be in \(0, inf\)"):
        mpo_rs.group_advantages(np.ones(4, np.float32), np.zeros(4, np.int64), eps=eps)


def test_finite_scores_that_overflow_a_group_baseline_raise():
    with pytest.raises(InvalidBatchError, match=r"`advantages` would be inf at trajectory 1: the estimate overflows"):
        mpo_rs.group_advantages(np.array([0, 3e38, -3e38], np.float32), [0, 1, 1], leave_one_out=True)


def test_a_huge_beta_raises_naming_the_trajectory():
    mask = np.array([1, 1, 1, 0, 1, 1, 1], bool)
    values = np.array([0, 0, 0, 0, 0, 1, 0], np.float32)
    scores = np.array([0.0, 1.0], np.float32)
    offsets = np.array([0, 3, 7])
    with pytest.raises(
        InvalidBatchError, match=r"`advantages` would be -?inf at token \d \(trajectory 1, position \d\)"
    ):
        mpo_rs.mae_advantages(values, mask, offsets, scores=scores, beta=1e308)
    # Trajectory 0 has no spread inside its turn: 0 × beta, finite.
    res = mpo_rs.mae_advantages(values[:3], mask[:3], offsets[:2], scores=scores[:1], beta=1e308)
    assert np.isfinite(res.advantages).all()


def test_gae_with_finite_values_of_3e38_raises():
    values = np.array([-3e38, 3e38, -3e38], np.float32)
    with pytest.raises(InvalidBatchError, match=r"`advantages` would be inf at token 0 \(trajectory 0, position 0\)"):
        mpo_rs.gae_advantages(values[:1], [1], [0, 1], scores=np.array([3e38], np.float32))
    with pytest.raises(InvalidBatchError, match=r"`returns` would be inf at token 1 \(trajectory 1, position 0\)"):
        mpo_rs.gae_advantages(np.zeros(3), [1, 1, 1], [0, 1, 3], rewards=[0, 3e38, 3e38], lam=0.0)
    with pytest.raises(InvalidBatchError, match=r"would be -?inf .* \(trajectory 0"):
        mpo_rs.mae_advantages(values[:1], [1], [0, 1], scores=np.array([3e38], np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_broadcast_to_tokens_refuses_non_finite_values(bad):
    with pytest.raises(InvalidBatchError, match=r"`per_trajectory` is not finite \(.*\) at trajectory 1"):
        mpo_rs.broadcast_to_tokens(np.array([1.0, bad], np.float32), [1, 0, 1, 1], [0, 2, 4])


def test_the_parquet_tool_refuses_a_huge_beta_with_one_line(tmp_path):
    n = 3
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "loss_mask": pa.array([[True, True, True]] * n, pa.list_(pa.bool_())),
                "values": pa.array([[0.0, 1.0, 0.0]] * n, pa.list_(pa.float32())),
                "score": pa.array([1.0] * n, pa.float32()),
            }
        ),
        src,
    )
    out = tmp_path / "out.parquet"
    r = run_cli("advantages", src, "-o", out, "--beta", "1e308", "-q")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "`advantages` would be" in r.stderr and "row 0" in r.stderr and "overflows float32" in r.stderr
    assert not out.exists()
    # An ordinary beta on the same file is fine.
    assert run_cli("advantages", src, "-o", out, "--beta", "1", "-q").returncode == 0


def test_an_overflowing_estimate_names_its_row_in_the_file_not_in_the_batch(tmp_path):
    # Row 4 sits in the third row group of two rows: the message must say row 4.
    values = [[0.0, 1.0, 0.0]] * 6
    values[4] = [-3e38, -3e38, -3e38]
    scores = [1.0] * 6
    scores[4] = 3e38  # A_turn = 3e38 - (-3e38) overflows float32
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "loss_mask": pa.array([[True, True, True]] * 6, pa.list_(pa.bool_())),
                "values": pa.array(values, pa.list_(pa.float32())),
                "score": pa.array(scores, pa.float32()),
            }
        ),
        src,
        row_group_size=2,
    )
    r = run_cli("advantages", src, "-o", tmp_path / "out.parquet", "-q")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "row 4:" in r.stderr and "overflows float32" in r.stderr, r.stderr
