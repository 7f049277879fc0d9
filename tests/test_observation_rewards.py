"""Issue 20, item 8: a reward in a padded row's last (padding) column. The log tools
(``mpo_rs.arrow``, ``advantages_parquet``, ``mpo-rs advantages``, ``diagnose``) refuse it by
default with a hint naming ``observation_rewards=`` / ``--observation-rewards``; "credit"
equals moving the reward by hand to the last policy token before it (and the torch padded
API's credit on the same rows), "drop" equals removing it. The rewards column is written
out as given."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import mpo_rs  # noqa: E402
from mpo_rs import InvalidBatchError, InvalidOptionError, _native  # noqa: E402
from mpo_rs.arrow import advantages_parquet, with_advantages  # noqa: E402
from mpo_rs.observation_rewards import DEFAULT, OBSERVATION_REWARDS  # noqa: E402

L = 4
MASK = np.array([[1, 1, 1, 0], [0, 1, 1, 0], [1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 0, 0]], np.uint8)
"""Row 0: the score in the padding column; row 1: a reward on a leading observation (no
policy token before it: credit drops it); row 2: clean; row 3: two observation rewards,
each after a policy token; row 4: a policy reward and one in the padding after it."""
REWARDS = np.array([[0, 0, 0, 1], [2, 0, 0, 0], [0, 0.5, 0, 0], [0, 0.25, 0, 0.75], [0, 0.5, 0, 0.125]], np.float32)
CREDITED = np.array([[0, 0, 1, 0], [0, 0, 0, 0], [0, 0.5, 0, 0], [0.25, 0, 0.75, 0], [0, 0.625, 0, 0]], np.float32)
DROPPED = np.where(MASK == 1, REWARDS, np.float32(0))
VALUES = np.random.default_rng(0).normal(size=MASK.shape).astype(np.float32)
GROUPS = np.array([0, 0, 1, 1, 1])
OFFSETS = np.arange(MASK.shape[0] + 1, dtype=np.int64) * L
HINT = 'observation_rewards="credit", `--observation-rewards credit`'


def table(rewards: np.ndarray) -> pa.Table:
    rows = lambda x, t: pa.array([list(r) for r in x], pa.list_(t))  # noqa: E731
    return pa.table(
        {
            "loss_mask": rows(MASK, pa.uint8()),
            "values": rows(VALUES, pa.float32()),
            "rewards": rows(rewards, pa.float32()),
            "group_id": pa.array(GROUPS),
        }
    )


def flat(column: pa.ChunkedArray) -> np.ndarray:
    return np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in column.chunks])


def numpy_advantages(estimator: str, rewards: np.ndarray) -> np.ndarray:
    """The flat API on rewards already where they belong."""
    mask, r = MASK.reshape(-1), rewards.reshape(-1)
    if estimator in ("mae", "gae"):
        estimate = mpo_rs.mae_advantages if estimator == "mae" else mpo_rs.gae_advantages
        return estimate(VALUES.reshape(-1), mask, OFFSETS, rewards=r).advantages
    per_row = mpo_rs.group_advantages(rewards.sum(axis=1), GROUPS, estimator=estimator)
    return mpo_rs.broadcast_to_tokens(per_row, mask, OFFSETS)


def test_the_choices_come_from_the_rust_table():
    assert OBSERVATION_REWARDS == tuple(r["name"] for r in _native.observation_rewards_spec())
    assert OBSERVATION_REWARDS == ("error", "drop", "credit") and DEFAULT == "error"
    torch_padded = pytest.importorskip("mpo_rs.torch.padded")
    assert torch_padded.OBSERVATION_REWARDS is OBSERVATION_REWARDS


@pytest.mark.parametrize("estimator", ["mae", "gae", "grpo", "rloo"])
def test_arrow_refuses_by_default_with_the_hint_and_moves_as_by_hand(estimator):
    given = table(REWARDS)
    with pytest.raises(InvalidBatchError) as e:
        with_advantages(given, estimator=estimator)
    assert str(e.value).startswith("row 0, column `rewards`: reward 1 at observation token 3;"), e.value
    assert HINT in str(e.value)
    for mode, by_hand in (("credit", CREDITED), ("drop", DROPPED)):
        out = with_advantages(given, estimator=estimator, observation_rewards=mode)
        want = numpy_advantages(estimator, by_hand)
        np.testing.assert_array_equal(flat(out["advantages"]), want)
        hand = with_advantages(table(by_hand), estimator=estimator)
        for name in ("returns", "turn_index", "turn_advantages"):
            np.testing.assert_array_equal(flat(out[name]), flat(hand[name]))
        # Only the estimators see the moved rewards.
        assert out["rewards"].equals(given["rewards"])


def test_an_unknown_choice_is_an_option_error():
    for bad in ("keep", None, 1):
        with pytest.raises(
            InvalidOptionError, match=r"observation_rewards=.*expected one of 'error', 'drop', 'credit'"
        ):
            with_advantages(table(REWARDS), observation_rewards=bad)
    with pytest.raises(InvalidOptionError, match="expected one of"):
        _native.arrow_advantages(
            table(REWARDS), mpo_rs.Estimator("mae"), mpo_rs.Columns(group="g"), observation_rewards="x"
        )


def test_non_finite_rewards_are_refused_where_they_are():
    r = DROPPED.copy()
    r[1, 3] = np.nan
    for mode in OBSERVATION_REWARDS:
        with pytest.raises(InvalidBatchError, match="row 1, column `rewards`: NaN is not finite at token 3"):
            with_advantages(table(r), observation_rewards=mode)


@pytest.mark.parametrize("estimator", ["mae", "drgrpo"])
def test_parquet_api_and_the_cli(tmp_path, estimator):
    path = tmp_path / "log.parquet"
    pq.write_table(table(REWARDS), path, row_group_size=2)  # the groups span row groups
    with pytest.raises(InvalidBatchError, match="row group 0: row 0, column `rewards`: reward 1 at observation"):
        advantages_parquet(path, tmp_path / "refused.parquet", estimator=estimator)
    out = tmp_path / "credit.parquet"
    advantages_parquet(path, out, estimator=estimator, observation_rewards="credit")
    got = pq.read_table(out)
    np.testing.assert_array_equal(flat(got["advantages"]), numpy_advantages(estimator, CREDITED))
    assert got["rewards"].to_pylist() == table(REWARDS)["rewards"].to_pylist()

    cli = [sys.executable, "-m", "mpo_rs.cli", "advantages", str(path), "--estimator", estimator, "-q", "-o"]
    r = subprocess.run([*cli, str(tmp_path / "cli.parquet")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and HINT in r.stderr and r.stderr.count("\n") == 1, r.stderr
    cli_out = tmp_path / "cli-drop.parquet"
    r = subprocess.run(
        [*cli, str(cli_out), "--observation-rewards", "drop"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(flat(pq.read_table(cli_out)["advantages"]), numpy_advantages(estimator, DROPPED))
    r = subprocess.run(
        [*cli, str(cli_out), "--observation-rewards", "keep"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "invalid choice: 'keep'" in r.stderr, r.stderr


def test_help_names_the_flag_and_its_choices():
    for command in ("advantages", "diagnose"):
        r = subprocess.run(
            [sys.executable, "-m", "mpo_rs.cli", command, "--help"], capture_output=True, text=True, timeout=60
        )
        text = " ".join(r.stdout.split())
        assert r.returncode == 0 and "--observation-rewards {error,drop,credit}" in text, r.stdout
        assert "credit: move it to the last policy token before it in its row" in text, r.stdout


def test_diagnose_outcomes_follow_the_choice(tmp_path):
    from mpo_rs.diagnose import diagnose_logs

    path = tmp_path / "log.parquet"
    pq.write_table(table(REWARDS), path)
    with pytest.raises(InvalidBatchError, match="row 0, column `rewards`: reward 1 at observation token 3") as e:
        diagnose_logs(path)
    assert HINT in str(e.value)
    for mode, by_hand in (("credit", CREDITED), ("drop", DROPPED)):
        d = diagnose_logs(path, observation_rewards=mode)
        np.testing.assert_array_equal(d.outcome, by_hand.sum(axis=1, dtype=np.float64))
    pytest.importorskip("matplotlib")
    from mpo_rs.cli import main

    assert main(["diagnose", str(path)]) == 1
    assert main(["diagnose", str(path), "--observation-rewards", "credit"]) == 0


def test_credit_equals_the_torch_padded_api():
    torch = pytest.importorskip("torch")
    import mpo_rs.torch as mt

    mask, values, rewards = (torch.from_numpy(x.copy()) for x in (MASK, VALUES, REWARDS))
    for name in ("mae", "gae"):
        estimate = mt.mae_advantages if name == "mae" else mt.gae_advantages
        for mode in ("credit", "drop"):
            padded, _ = estimate(values, mask, rewards, observation_rewards=mode)
            out = with_advantages(table(REWARDS), estimator=name, observation_rewards=mode)
            np.testing.assert_array_equal(flat(out["advantages"]), padded.numpy().reshape(-1))


def with_turn_columns(
    rewards: np.ndarray | None, turn_rewards: list[list[float]] | None, truncated: list[bool]
) -> pa.Table:
    t = table(REWARDS if rewards is None else rewards).append_column("truncated", pa.array(truncated))
    if turn_rewards is not None:
        t = t.drop_columns(["rewards"]).append_column("turn_rewards", pa.array(turn_rewards, pa.list_(pa.float32())))
    return t


@pytest.mark.parametrize("estimator", ["mae", "gae"])
def test_a_truncated_row_is_moved_like_any_other(estimator):
    truncated = [True, False, True, True, False]
    given = with_turn_columns(None, None, truncated)
    with pytest.raises(InvalidBatchError, match="row 0, column `rewards`: reward 1 at observation token 3"):
        with_advantages(given, estimator=estimator)
    estimate = mpo_rs.mae_advantages if estimator == "mae" else mpo_rs.gae_advantages
    for mode, by_hand in (("credit", CREDITED), ("drop", DROPPED)):
        out = with_advantages(given, estimator=estimator, observation_rewards=mode)
        want = estimate(
            VALUES.reshape(-1), MASK.reshape(-1), OFFSETS, rewards=by_hand.reshape(-1), truncated=np.array(truncated)
        )
        np.testing.assert_array_equal(flat(out["advantages"]), want.advantages)
        np.testing.assert_array_equal(flat(out["returns"]), want.returns)


@pytest.mark.parametrize("estimator", ["mae", "gae", "grpo"])
def test_per_turn_rewards_have_nothing_to_move(estimator):
    """Per-turn rewards are placed on policy tokens: every mode gives the default's output."""
    turn_rewards = [[1.0], [2.0], [0.5, -1.0], [0.25, 0.75], [0.125]]
    given = with_turn_columns(None, turn_rewards, [False, True, False, False, True])
    want = with_advantages(given, estimator=estimator)
    for mode in ("credit", "drop"):
        out = with_advantages(given, estimator=estimator, observation_rewards=mode)
        for name in ("advantages", "returns", "turn_advantages"):
            np.testing.assert_array_equal(flat(out[name]), flat(want[name]), err_msg=f"{mode} {name}")
