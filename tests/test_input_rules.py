"""The input rules of the edges: one reward per sample (the baseline reads the reward MAE
reads), one rule per input (a truncation column, a reward source, a non-finite reward, a
setting's value) whatever the estimator or layer, and errors that name where the bad
value sits (docs/reliability.md, "Input rules")."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mpo_rs
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError, _native, cli
from mpo_rs.arrow import with_advantages

torch = pytest.importorskip("torch")

from mpo_rs.torch import padded  # noqa: E402

# Two rows: [policy, policy, obs, policy] and [policy, obs, policy, policy].
MASK = [[1, 1, 0, 1], [1, 0, 1, 1]]
VALUES = [[0.5, 0.1, 0.0, -0.2], [0.3, 0.0, 0.2, 0.4]]
REWARDS = [[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.5, 1.0]]


def _log(**extra: pa.Array) -> pa.Table:
    columns = {
        "loss_mask": pa.array([[bool(m) for m in row] for row in MASK]),
        "values": pa.array(VALUES, type=pa.list_(pa.float32())),
        "rewards": pa.array(REWARDS, type=pa.list_(pa.float32())),
        "group_id": pa.array([0, 0]),
    }
    return pa.table({**columns, **extra})


# --------------------------------------------------------------- OpenRLHF: one clipped reward


def _openrlhf_maker(baseline: str, clip_range: tuple[float, float] | None):
    pytest.importorskip("openrlhf.trainer.ppo_utils.experience", reason="openrlhf is not installed")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import openrlhf_mpo

    maker = openrlhf_mpo.experience_maker(
        mpo_estimator=Estimator("mae", lam=1.0, beta=0.0), mpo_baseline=baseline, kl_coef=0.0
    )
    maker.strategy.args.reward.clip_range = clip_range
    return maker


def _one_prompt(rewards: list[float]):
    from openrlhf.trainer.ppo_utils.experience import Experience

    n = len(rewards)
    mask = torch.zeros(n, 6, dtype=torch.bool)
    mask[:, 0:2] = True  # two turns per row, an observation token between them
    mask[:, 3:5] = True
    return Experience(
        action_mask=mask,
        values=torch.zeros(n, 6),
        kl=torch.zeros(n, 6),
        rewards=torch.tensor(rewards),
        index=list(range(n)),
        info={},
    )


def test_openrlhf_drgrpo_baseline_reads_the_clipped_reward() -> None:
    """Rewards [10, 0] clipped to (-1, 1) are [1, 0]: the group baseline is their mean 0.5,
    so the better sample gets +0.5 and the other -0.5 (OpenRLHF's own dr_grpo, which clips
    the difference, gives [1, -1]: the same order). The baseline of the unclipped rewards
    (5) against the clipped reward gave [-4, -5], the better sample pushed down."""
    maker = _openrlhf_maker("drgrpo", (-1.0, 1.0))
    experience = _one_prompt([10.0, 0.0])
    maker.compute_advantages_and_returns([experience])
    mask = experience.action_mask
    per_row = [experience.advantages[r][mask[r]].unique().tolist() for r in range(2)]
    assert per_row == [[0.5], [-0.5]]
    assert (experience.advantages[~mask] == 0).all()
    # The same as the group estimator on the clipped scores, for every baseline.
    for baseline in ("grpo", "drgrpo", "rloo"):
        maker = _openrlhf_maker(baseline, (-1.0, 1.0))
        experience = _one_prompt([10.0, 0.0, -3.0, 0.5])
        maker.strategy.args.rollout.n_samples_per_prompt = 4
        maker.compute_advantages_and_returns([experience])
        want = mpo_rs.group_advantages(np.array([1.0, 0.0, -1.0, 0.5]), [0, 0, 0, 0], estimator=baseline)
        got = experience.advantages[:, 0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --------------------------------------------- bi-level: a truncation column is not its input


def test_bilevel_refuses_a_named_truncation_column_and_never_reads_a_present_one(tmp_path: Path, capsys) -> None:
    """bi-level GAE (RAGEN's) defines no truncation: a named column is refused by every
    entry point, as the group estimators refuse one; a merely present `truncated` column is
    not read (its nulls are not refused), as for the group estimators. It was accepted and
    ignored (exit 0, the same advantages), and a present column's nulls were refused."""
    flags = pa.array([True, None], type=pa.bool_())
    table = _log(truncated=flags)
    for estimator in ("bilevel", "grpo"):
        with pytest.raises(InvalidOptionError, match=r"the bi-level GAE .* defines no truncation"):
            with_advantages(table, estimator=estimator, truncated_col="truncated")
        with_flags = with_advantages(table, estimator=estimator)  # the null is never read
        without = with_advantages(_log(), estimator=estimator)
        assert with_flags.column("advantages").equals(without.column("advantages"))
    # Ray's driver resolves its columns with the same rule.
    with pytest.raises(InvalidOptionError, match="defines no truncation"):
        _native.resolve_log_columns(table.schema, Estimator("bilevel"), columns=mpo_rs.Columns(truncated="truncated"))
    # The command: a usage error (exit 2), and no output.
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    code = cli.main(["advantages", str(src), "-o", str(out), "--estimator", "bilevel", "--truncated-col", "truncated"])
    assert code == 2 and not out.exists()
    assert "defines no truncation" in capsys.readouterr().err
    assert cli.main(["advantages", str(src), "-o", str(out), "--estimator", "bilevel", "-q"]) == 0
    # mae still reads both.
    with pytest.raises(InvalidBatchError, match="truncated"):
        with_advantages(table, estimator="mae")
    # numpy and torch bi-level take no `truncated` at all.
    with pytest.raises(InvalidOptionError, match="truncated"):
        mpo_rs.bilevel_advantages(
            np.zeros(2, np.float32), np.ones(2, np.uint8), np.array([0, 2]), scores=[1.0], truncated=[True]
        )
    with pytest.raises(InvalidOptionError, match="truncated"):
        padded.bilevel_advantages(torch.zeros(1, 2), torch.ones(1, 2), scores=[1.0], truncated=[True])


# ------------------------------------ torch observation rewards: a non-finite reward stays put


@pytest.mark.parametrize("mode", ["error", "drop", "credit"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_torch_observation_rewards_refuse_a_non_finite_reward_where_it_sits(mode: str, bad: float) -> None:
    """A NaN or ±inf on an observation token (row 1, column 1, mask 0) is refused naming
    that token in every mode, as the Arrow path refuses it: "drop" swallowed it and
    "credit" moved it onto the policy token before it (column 0), naming the wrong place."""
    mask = torch.tensor(MASK)
    rewards = torch.tensor(REWARDS)
    rewards[1, 1] = bad
    where = r"trajectory 1, position 1\)"
    with pytest.raises(InvalidBatchError, match=r"not finite .*" + where):
        padded.mae_advantages(torch.tensor(VALUES), mask, rewards, observation_rewards=mode)
    with pytest.raises(InvalidBatchError, match=r"not finite .*" + where):
        padded.gae_advantages(torch.tensor(VALUES), mask, rewards, observation_rewards=mode)
    from mpo_rs.torch import critic_free

    with pytest.raises(InvalidBatchError, match="not finite"):
        critic_free.mae_group_advantages(mask, [0, 0], rewards, observation_rewards=mode)
    # The Arrow path says the same of the same rewards.
    table = _log().set_column(2, "rewards", pa.array(rewards.tolist(), type=pa.list_(pa.float32())))
    with pytest.raises(InvalidBatchError, match="row 1, column `rewards`"):
        with_advantages(table, observation_rewards=mode)


def test_torch_observation_rewards_move_finite_rewards_as_the_arrow_path_does() -> None:
    """The finite rewards are still dropped or credited, as the log tools do (one rule, run
    by Rust); a credited sum beyond float32 is refused naming the row."""
    mask = torch.tensor(MASK)
    rewards = torch.tensor(REWARDS)
    rewards[0, 2] = 3.0  # after the policy token at column 1
    rewards[1, 1] = -1.0  # after the policy token at column 0
    for mode in ("drop", "credit"):
        ours, _ = padded.mae_advantages(torch.tensor(VALUES), mask, rewards, observation_rewards=mode)
        table = _log().set_column(2, "rewards", pa.array(rewards.tolist(), type=pa.list_(pa.float32())))
        theirs = with_advantages(table, observation_rewards=mode).column("advantages").to_pylist()
        np.testing.assert_array_equal(ours.numpy(), np.array(theirs, dtype=np.float32))
    big = torch.zeros(1, 3)
    big[0, 0], big[0, 1] = 3e38, 3e38
    with pytest.raises(InvalidBatchError, match=r"row 0, column `token_level_rewards`.*outside float32's range"):
        padded.mae_advantages(torch.zeros(1, 3), torch.tensor([[1, 0, 1]]), big, observation_rewards="credit")


# ------------------------------------------------- settings are judged even where unused


@pytest.mark.parametrize("tolerance", [math.nan, -1.0, -5, math.inf, "x", True, None])
def test_check_tolerance_is_judged_without_a_check_column(tolerance, tmp_path: Path, capsys) -> None:
    """A check tolerance that is not a number in [0, inf) is refused whether or not a check
    is asked for (numpy, Arrow, Parquet, the command); it was accepted, doing nothing."""
    b = dict(values=np.zeros(2, np.float32), mask=np.ones(2, np.uint8), offsets=np.array([0, 2]))
    if tolerance is None:  # None is the default, not a value
        tolerance = object()
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        mpo_rs.mae_advantages(**b, scores=[1.0], check_tolerance=tolerance)
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        mpo_rs.bilevel_advantages(**b, turn_rewards=[[1.0]], check_tolerance=tolerance)
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        with_advantages(_log(), check_tolerance=tolerance)
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(_log(), src)
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        mpo_rs.arrow.advantages_parquet(src, out, check_tolerance=tolerance)
    if isinstance(tolerance, float):
        assert cli.main(["advantages", str(src), "-o", str(out), "--check-tolerance", str(tolerance)]) == 2
        assert "check_tolerance" in capsys.readouterr().err
    assert not out.exists()


def test_verl_rollout_log_dir_must_be_a_path() -> None:
    """`algorithm.mpo.rollout_log_dir` set to true, 5 or ["a"] made directories "True", "5"
    and "['a']"; it is refused, naming the key, by every reader of the section."""
    from mpo_rs.integrations.verl.config import MPOOptions
    from mpo_rs.integrations.verl.rollout_log import rollout_log_dir

    for bad in (True, 5, ["a"], b"dir", 1.5):
        config = {"mpo": {"rollout_log_dir": bad}}
        with pytest.raises(InvalidOptionError, match=r"algorithm.mpo.rollout_log_dir"):
            rollout_log_dir(config)
        with pytest.raises(InvalidOptionError, match=r"algorithm.mpo.rollout_log_dir"):
            MPOOptions.from_config(config)
    assert rollout_log_dir({"mpo": {"rollout_log_dir": "logs"}}) == "logs"
    assert rollout_log_dir({"mpo": {"rollout_log_dir": Path("logs")}}) == "logs"


def test_learner_epochs_are_bounded_and_critic_epochs_need_a_critic() -> None:
    """critic_epochs=10**20 (a step that never ends) is refused like any value out of range;
    critic_epochs on a learner without a critic (GRPO training the policy alone) does
    nothing, and is refused when the learner is built."""
    from mpo_rs.torch.learner import Learner
    from mpo_rs.torch.learner_config import MAX_EPOCHS, LearnerConfig

    for name in ("critic_epochs", "ppo_epochs"):
        with pytest.raises(InvalidOptionError, match=f"LearnerConfig.{name} must be in \\[1, {MAX_EPOCHS}\\]"):
            LearnerConfig(**{name: 10**20})
        LearnerConfig(**{name: MAX_EPOCHS})
    policy = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    config = LearnerConfig(estimator="grpo", critic_epochs=2)
    with pytest.raises(InvalidOptionError, match=r"critic_epochs=2 .* no critic"):
        Learner(policy, optimizer, config)
    critic = torch.nn.Linear(2, 1)
    Learner(policy, optimizer, config, critic=critic, critic_optimizer=torch.optim.SGD(critic.parameters(), lr=0.1))
    Learner(policy, optimizer, LearnerConfig(estimator="grpo"))


# ---------------------------------------------------------------- one reward-source rule


def test_torch_bilevel_takes_turn_rewards_as_numpy_does() -> None:
    """`turn_rewards` is a reward source of every critic estimator in every layer: torch's
    bi-level GAE refused it ("give exactly one of ...") though it was given."""
    mask = torch.tensor(MASK)
    turn_rewards = [[1.0, 2.0], [0.5, 1.0]]
    ours, returns = padded.bilevel_advantages(torch.tensor(VALUES), mask, turn_rewards=turn_rewards)
    flat_mask = np.array(MASK, dtype=np.uint8).reshape(-1)
    theirs = mpo_rs.bilevel_advantages(
        np.array(VALUES, np.float32).reshape(-1), flat_mask, np.array([0, 4, 8]), turn_rewards=turn_rewards
    )
    np.testing.assert_array_equal(ours.numpy().reshape(-1), theirs.advantages)
    np.testing.assert_array_equal(returns.numpy().reshape(-1), theirs.returns)
    # The same rule, and message, for every estimator and layer.
    for call in (
        lambda: padded.bilevel_advantages(torch.tensor(VALUES), mask),
        lambda: padded.mae_advantages(torch.tensor(VALUES), mask, scores=[1, 2], turn_rewards=turn_rewards),
        lambda: padded.group_advantages(None, mask, [0, 0]),
        lambda: mpo_rs.bilevel_advantages(np.zeros(8, np.float32), flat_mask, np.array([0, 4, 8])),
    ):
        with pytest.raises(InvalidBatchError, match=r"give exactly one of `.*; got "):
            call()


# ---------------------------------------------------- a per-turn value is named by its turn


def test_a_per_turn_reward_beyond_float32_is_named_by_its_turn() -> None:
    """turn_rewards=[[0.0, 1e300]] reported "at token 1"; it is turn 1 of trajectory 0, as
    a NaN there is named (numpy, torch, and the Arrow path's per-turn list column)."""
    b = dict(values=np.zeros(4, np.float32), mask=np.array([1, 0, 1, 1], np.uint8), offsets=np.array([0, 4]))
    with pytest.raises(InvalidBatchError, match="1e300 at turn 1 of trajectory 0 is outside float32's range"):
        mpo_rs.mae_advantages(**b, turn_rewards=[[0.0, 1e300]])
    with pytest.raises(InvalidBatchError, match=r"(?i)not finite \(nan\) at turn 1 of trajectory 0"):
        mpo_rs.mae_advantages(**b, turn_rewards=[[0.0, math.nan]])
    with pytest.raises(InvalidBatchError, match="`turn_rewards`: 1e300 at turn 1 is outside"):
        mpo_rs.mae_advantages(**b, turn_rewards=np.array([0.0, 1e300]))
    with pytest.raises(InvalidBatchError, match="at turn 1 of trajectory 0 is outside"):
        padded.mae_advantages(
            torch.zeros(1, 4),
            torch.tensor([[1, 0, 1, 1]]),
            turn_rewards=[torch.tensor([0.0, 1e300], dtype=torch.float64)],
        )
    table = pa.table(
        {
            "loss_mask": pa.array([[True, False, True, True]]),
            "values": pa.array([[0.0] * 4], type=pa.list_(pa.float32())),
            "turn_rewards": pa.array([[0.0, 1e300]], type=pa.list_(pa.float64())),
            "group_id": pa.array([0]),
        }
    )
    for estimator in ("mae", "grpo"):
        with pytest.raises(InvalidBatchError, match="row 0, column `turn_rewards`: 1e300 at turn 1 is outside"):
            with_advantages(table, estimator=estimator)
