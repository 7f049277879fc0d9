"""mpo_rs.torch: advantages from padded (B, L) tensors, whitening, the compatibility modules."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mpo_rs  # noqa: E402
import mpo_rs.torch as mt  # noqa: E402
from mpo_rs import estimators  # noqa: E402

CUDA = torch.cuda.is_available()


def padded_batch(seed: int, rows: int = 6, cols: int = 20):
    """(values, mask, token rewards, scores, group ids): agentic rows, turns of policy
    tokens (1) between observations (0), right padding; rewards only on policy tokens."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, cols), dtype=bool)
    for b in range(rows):
        pos, end = 1, int(rng.integers(cols // 2, cols + 1))
        while pos < end:
            turn = int(rng.integers(1, 5))
            mask[b, pos : min(pos + turn, end)] = True
            pos += turn + int(rng.integers(1, 4))
    rewards = (rng.standard_normal((rows, cols)) * mask).astype(np.float32)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    scores = rng.integers(0, 2, rows).astype(np.float32)
    groups = np.arange(rows) // 3
    return torch.from_numpy(values), torch.from_numpy(mask), torch.from_numpy(rewards), scores, groups


def flat(mask: torch.Tensor):
    rows, cols = mask.shape
    return mask.reshape(-1).numpy().astype(np.uint8), np.arange(rows + 1, dtype=np.int64) * cols


@pytest.mark.parametrize("seed", [0, 1])
def test_mae_and_gae_equal_the_numpy_estimators_on_the_flat_layout(seed):
    values, mask, rewards, scores, _ = padded_batch(seed)
    m, offsets = flat(mask)
    options = {"lam": 0.7, "lam_intra": 0.9, "beta": 0.5, "gamma": 0.99, "lam_critic": 0.95}
    adv, ret = mt.mae_advantages(values, mask, rewards, **options)
    want = estimators.mae_advantages(values.reshape(-1).numpy(), m, offsets, rewards=rewards.reshape(-1), **options)
    assert adv.shape == mask.shape and adv.dtype == torch.float32
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want.advantages)
    np.testing.assert_array_equal(ret.reshape(-1).numpy(), want.returns)
    adv, ret = mt.mae_advantages(values, mask, scores=torch.from_numpy(scores))
    want = estimators.mae_advantages(values.reshape(-1).numpy(), m, offsets, scores=scores)
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want.advantages)
    adv, ret = mt.gae_advantages(values, mask, rewards, gamma=0.99, lam=0.9)
    want = estimators.gae_advantages(
        values.reshape(-1).numpy(), m, offsets, rewards=rewards.reshape(-1), gamma=0.99, lam=0.9
    )
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want.advantages)
    np.testing.assert_array_equal(ret.reshape(-1).numpy(), want.returns)


def test_options_are_judged_by_the_options_table():
    values, mask, rewards, _, _ = padded_batch(2)
    adv, _ = mt.mae_advantages(values, mask, rewards, lam=0.5)
    flat = estimators.mae_advantages(
        values.reshape(-1).numpy(),
        mask.reshape(-1).numpy(),
        np.arange(mask.shape[0] + 1) * mask.shape[1],
        rewards=rewards.reshape(-1).numpy(),
        lam=0.5,
    )
    assert adv.reshape(-1).numpy().tobytes() == flat.advantages.tobytes()
    # A keyword nobody knows reaches the options table, which refuses it.
    with pytest.raises(mpo_rs.InvalidOptionError, match="`lam_intr` is not an option of the mae estimator"):
        mt.mae_advantages(values, mask, rewards, lam_intr=0.9)
    with pytest.raises(mpo_rs.InvalidOptionError, match="`lam_intr` is not an option of the mae estimator"):
        mt.padded.advantages(mask, rewards, values=values, lam_intr=0.9)
    # Ranges are the estimator's.
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`lam` = 1\.5 is out of range"):
        mt.mae_advantages(values, mask, rewards, lam=1.5)


def test_cpu_float32_inputs_and_results_are_not_copied(monkeypatch):
    values, mask, rewards, _, _ = padded_batch(3)
    seen = {}
    real = estimators._estimate

    def spy(est, mask_flat, offsets, values_flat, **kwargs):
        seen["values"], seen["rewards"], seen["mask"] = values_flat, kwargs["rewards"], mask_flat
        result = real(est, mask_flat, offsets, values_flat, **kwargs)
        seen["advantages"] = result[0]
        return result

    monkeypatch.setattr(estimators, "_estimate", spy)
    adv, _ = mt.mae_advantages(values, mask, rewards)
    assert np.shares_memory(seen["values"], values.numpy())
    assert np.shares_memory(seen["rewards"], rewards.numpy())
    assert np.shares_memory(seen["mask"], mask.numpy())
    assert adv.data_ptr() == seen["advantages"].ctypes.data  # the Rust result, as a tensor


def test_results_take_the_rewards_dtype_and_other_inputs_are_converted():
    values, mask, rewards, _, _ = padded_batch(4)
    adv64, _ = mt.gae_advantages(values.double(), mask.long(), rewards.double())
    adv32, _ = mt.gae_advantages(values, mask, rewards)
    assert adv64.dtype == torch.float64
    np.testing.assert_array_equal(adv64.float().numpy(), adv32.numpy())
    adv_bf16_mask, _ = mt.gae_advantages(values, mask.to(torch.bfloat16), rewards)
    torch.testing.assert_close(adv_bf16_mask, adv32, rtol=0, atol=0)


def test_group_advantages_equal_the_numpy_estimator_per_row():
    _, mask, rewards, scores, groups = padded_batch(5)
    m, offsets = flat(mask)
    out = mt.group_advantages(None, mask, groups, scores=scores, leave_one_out=True)
    per_row = estimators.group_advantages(scores, groups, leave_one_out=True)
    np.testing.assert_array_equal(out.reshape(-1).numpy(), estimators.broadcast_to_tokens(per_row, m, offsets))
    # With token rewards a row's score is the sum of its rewards (verl's convention).
    out = mt.group_advantages(rewards, mask, groups)
    per_row = estimators.group_advantages(rewards.sum(dim=-1).numpy(), groups)
    np.testing.assert_array_equal(out.reshape(-1).numpy(), estimators.broadcast_to_tokens(per_row, m, offsets))
    with pytest.raises(mpo_rs.InvalidBatchError, match="exactly one"):
        mt.group_advantages(rewards, mask, groups, scores=scores)


def test_observation_rewards_are_refused_dropped_or_credited():
    values, mask, rewards, _, _ = padded_batch(6)
    row, col = (~mask).nonzero()[3].tolist()
    assert mask[row, :col].any()
    moved = rewards.clone()
    moved[row, col] = 2.0
    with pytest.raises(mpo_rs.InvalidBatchError, match="rewards must be 0 where mask is 0"):
        mt.mae_advantages(values, mask, moved)
    dropped, _ = mt.mae_advantages(values, mask, moved, observation_rewards="drop")
    torch.testing.assert_close(dropped, mt.mae_advantages(values, mask, rewards)[0], rtol=0, atol=0)
    credited_rewards = rewards.clone()
    last = int(mask[row, :col].nonzero()[-1])
    credited_rewards[row, last] += 2.0
    credited, _ = mt.mae_advantages(values, mask, moved, observation_rewards="credit")
    torch.testing.assert_close(credited, mt.mae_advantages(values, mask, credited_rewards)[0], rtol=0, atol=0)
    with pytest.raises(mpo_rs.InvalidOptionError, match="observation_rewards"):
        mt.mae_advantages(values, mask, moved, observation_rewards="keep")


def test_bad_inputs_name_the_argument():
    values, mask, rewards, scores, _ = padded_batch(7)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`values` has shape \(6, 19\), expected \(6, 20\)"):
        mt.mae_advantages(values[:, :-1], mask, rewards)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`response_mask` must be a torch\.Tensor, got numpy\.ndarray"):
        mt.gae_advantages(values, mask.numpy(), rewards)
    with pytest.raises(mpo_rs.InvalidBatchError, match="`response_mask` must be padded"):
        mt.gae_advantages(values, mask.reshape(-1), rewards)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`scores` has shape \(5,\)"):
        mt.mae_advantages(values, mask, scores=scores[:-1])
    with pytest.raises(mpo_rs.InvalidBatchError, match="exactly one"):
        mt.mae_advantages(values, mask)


def test_shape_and_kind_errors_are_typed_and_name_the_argument():
    """Defect 12: a shape mismatch raised a plain ValueError, numpy arrays a raw
    AttributeError, and (4, 2) scores were flattened (and (8, 2) reported as shape (16,))."""
    values, mask, rewards, scores, groups = padded_batch(7)
    rows = mask.shape[0]
    for fn, args, name in [
        (mt.mae_advantages, (values.numpy(), mask, rewards), "values"),
        (mt.mae_advantages, (values, mask, rewards.numpy()), "token_level_rewards"),
        (mt.gae_advantages, (values, mask.numpy(), rewards), "response_mask"),
        (mt.group_advantages, (rewards.numpy(), mask, groups), "token_level_rewards"),
    ]:
        with pytest.raises(mpo_rs.InvalidBatchError, match=rf"`{name}` must be a torch\.Tensor, got numpy\.ndarray"):
            fn(*args)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`advantages` must be a torch\.Tensor"):
        mt.whiten(rewards.numpy(), mask)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`token_level_rewards` has shape"):
        mt.group_advantages(rewards[:, 1:], mask, groups)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`mask` has shape"):
        mt.whiten(rewards, mask[:, 1:])
    half = scores[: rows // 2 * 2].reshape(rows // 2, 2)
    for bad in (half, torch.ones(rows, 2), torch.ones(2 * rows, 2)):
        with pytest.raises(
            mpo_rs.InvalidBatchError, match=r"`scores` must be 1-D.*shape " + re.escape(str(tuple(bad.shape)))
        ):
            mt.group_advantages(None, mask, groups, scores=bad)
        with pytest.raises(mpo_rs.InvalidBatchError, match=r"`scores` must be 1-D"):
            mt.mae_advantages(values, mask, scores=bad)


def test_float64_beyond_float32_is_named_not_called_not_finite():
    """Defect 12: 1e300 in a float64 tensor became inf and was reported as "not finite"."""
    values, mask, rewards, scores, groups = padded_batch(8)
    huge = values.double()
    huge[2, 3] = 1e300
    with pytest.raises(
        mpo_rs.InvalidBatchError, match=r"`values`: 1e300 at row 2, column 3 is outside float32's range"
    ):
        mt.mae_advantages(huge, mask, rewards)
    big_rewards = rewards.double()
    big_rewards[1, 0] = -1e300
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`token_level_rewards`: -1e300 at row 1, column 0 is outside"):
        mt.group_advantages(big_rewards, mask, groups)
    big_scores = torch.from_numpy(scores).double()
    big_scores[4] = 1e300
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`scores`: 1e300 at trajectory 4 is outside float32's range"):
        mt.group_advantages(None, mask, groups, scores=big_scores)
    # A real inf (on a policy token) is still the estimator's "not finite".
    huge = values.double()
    row, col = mask.nonzero()[0].tolist()
    huge[row, col] = float("inf")
    with pytest.raises(mpo_rs.InvalidBatchError, match="not finite"):
        mt.mae_advantages(huge, mask, rewards)


def test_a_mask_that_is_not_0_or_1_is_refused():
    """Defect 10: a NaN in a padded mask counted as a policy token (NaN != 0)."""
    values, mask, rewards, _, groups = padded_batch(9)
    for bad_value in (float("nan"), 2.0, -1.0, 0.5):
        bad = mask.float()
        bad[1, 4] = bad_value
        with pytest.raises(mpo_rs.InvalidBatchError, match=r"`response_mask` must hold 0 or 1.* at row 1, column 4"):
            mt.mae_advantages(values, bad, rewards * mask)
        with pytest.raises(mpo_rs.InvalidBatchError, match=r"`mask` must hold 0 or 1.* at row 1, column 4"):
            mt.whiten(values, bad)
    ints = mask.to(torch.int64)
    ints[0, 0] = 3
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"found 3 at row 0, column 0"):
        mt.group_advantages(rewards, ints, groups)
    # 0/1 masks of every dtype give the bool mask's numbers.
    want = mt.mae_advantages(values, mask, rewards)
    for dtype in (torch.uint8, torch.int32, torch.float16, torch.bfloat16, torch.float64):
        got = mt.mae_advantages(values, mask.to(dtype), rewards)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), dtype


def test_whiten_of_integers_is_not_truncated():
    """Defect 10: whiten on an int tensor truncated ([1, 2, 4] -> [0, 0, 1]); integers are
    whitened as numbers and give float32, as verl's masked_whiten."""
    adv = torch.tensor([[1, 2, 4, 7]])
    mask = torch.tensor([[1, 1, 1, 0]])
    got = mt.whiten(adv, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, mt.whiten(adv.float(), mask), rtol=0, atol=0)
    assert got[0, 3] == 0 and got[0, 0] < got[0, 1] < 0 < got[0, 2]


# --------------------------------------------------------------------------- whitening


def whiten_formula(adv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(A - mean) / sqrt(var + 1e-8) over the policy tokens, var unbiased; 0 elsewhere."""
    a = adv[mask].astype(np.float64)
    var = a.var(ddof=1)
    out = np.zeros_like(adv)
    out[mask] = ((a - a.mean()) / np.sqrt(var + 1e-8)).astype(adv.dtype)
    return out


def test_whiten_is_verls_masked_whiten_on_the_policy_tokens():
    values, mask, rewards, _, _ = padded_batch(8)
    adv, _ = mt.gae_advantages(values, mask, rewards)
    got = mt.whiten(adv, mask)
    np.testing.assert_allclose(got.numpy(), whiten_formula(adv.numpy(), mask.numpy()), rtol=1e-6, atol=1e-7)
    assert not got[~mask].any()
    verl_F = pytest.importorskip("verl.utils.torch_functional")
    torch.testing.assert_close(got[mask], verl_F.masked_whiten(adv, mask.float())[mask], rtol=1e-5, atol=1e-6)


def test_whiten_keyword_whitens_on_the_host_like_whiten():
    values, mask, rewards, _, _ = padded_batch(9)
    adv, ret = mt.mae_advantages(values, mask, rewards)
    white, white_ret = mt.mae_advantages(values, mask, rewards, whiten=True)
    torch.testing.assert_close(white, mt.whiten(adv, mask), rtol=0, atol=0)
    torch.testing.assert_close(white_ret, ret, rtol=0, atol=0)


def test_whiten_needs_two_policy_tokens():
    adv = torch.ones(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[1, 1] = True
    with pytest.raises(mpo_rs.InvalidBatchError, match="at least 2"):
        mt.whiten(adv, mask)


def test_the_learners_whitening_is_verls():
    from mpo_rs.torch import Learner, LearnerConfig, RolloutBatch

    rng = np.random.default_rng(10)
    n_tokens = 40
    mask = rng.random(n_tokens) < 0.6
    mask[[0, 20]] = False  # trajectories start with a prompt token
    batch = RolloutBatch(
        token_ids=np.zeros(n_tokens, np.int64),
        mask=mask,
        offsets=np.array([0, 20, 40]),
        scores=np.array([1.0, 0.0], np.float32),
        values=rng.standard_normal(n_tokens).astype(np.float32),
    )
    policy = torch.nn.Linear(1, 1)
    learner = Learner(policy, torch.optim.SGD(policy.parameters(), lr=0.1), LearnerConfig(advantage_scale="whiten"))
    raw, _ = Learner(policy, torch.optim.SGD(policy.parameters()), LearnerConfig()).compute_advantages(
        batch, batch.values
    )
    white, _ = learner.compute_advantages(batch, batch.values)
    np.testing.assert_allclose(white, whiten_formula(raw, mask), rtol=1e-6, atol=1e-7)
    try:
        from verl.utils import torch_functional as verl_F
    except ModuleNotFoundError:
        return
    want = verl_F.masked_whiten(torch.from_numpy(raw), torch.from_numpy(mask).float())
    torch.testing.assert_close(torch.from_numpy(white)[mask], want[mask], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- devices, modules


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_tensors_give_results_on_their_device_equal_to_the_cpu_ones():
    values, mask, rewards, _, groups = padded_batch(11)
    cpu = mt.mae_advantages(values, mask, rewards, whiten=True)
    gpu = mt.mae_advantages(values.cuda(), mask.cuda(), rewards.cuda(), whiten=True)
    for c, g in zip(cpu, gpu, strict=True):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), c, rtol=0, atol=0)
    out = mt.group_advantages(rewards.cuda(), mask.cuda(), groups)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), mt.group_advantages(rewards, mask, groups), rtol=0, atol=0)
    adv = cpu[0].cuda()
    torch.testing.assert_close(mt.whiten(adv, mask.cuda()).cpu(), mt.whiten(cpu[0], mask), rtol=1e-6, atol=1e-7)


def test_reward_in_a_padded_rows_last_column_hints_at_observation_rewards_credit():
    """Issue 20, item 8: a score written into a padded row's last (padding) column failed
    with "reward at observation token" and no hint of ``observation_rewards="credit"``."""
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    values = torch.zeros(2, 6)
    rewards = torch.zeros(2, 6)
    rewards[1, 5] = 1.0
    for estimate in (mt.mae_advantages, mt.gae_advantages):
        with pytest.raises(mpo_rs.InvalidBatchError) as e:
            estimate(values, mask, rewards)
        message = str(e.value)
        assert "trajectory 1, position 5" in message and "rewards must be 0 where mask is 0" in message
        assert 'observation_rewards="credit"' in message and "padding" in message, message
        credited = rewards.clone()
        credited[1, 2], credited[1, 5] = 1.0, 0.0
        got = estimate(values, mask, rewards, observation_rewards="credit")
        torch.testing.assert_close(got, estimate(values, mask, credited), rtol=0, atol=0)


def test_readme_using_it_leads_with_a_padded_recipe_that_runs():
    """Issue 20, item 8: the README's "Using it" showed only the flat API with undefined
    variables. Its first snippet is now the padded-tensor recipe; it runs as written."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    code = snippet.group(1)
    assert "from mpo_rs.torch import" in code and "mae_advantages(" in code and "policy_loss(" in code
    assert len(code.strip().splitlines()) <= 16  # a recipe, not a program
    scope: dict[str, object] = {}
    exec(compile(code, "README.md: Using it", "exec"), scope)
    advantages, mask, loss = scope["advantages"], scope["response_mask"], scope["loss"]
    assert isinstance(advantages, torch.Tensor) and advantages.shape == mask.shape  # type: ignore[union-attr]
    assert bool((advantages[~mask] == 0).all())  # type: ignore[index, operator]
    assert torch.isfinite(loss) and scope["log_prob"].grad is not None  # type: ignore[arg-type, attr-defined]


def test_readme_docs_table_lists_every_docs_page():
    """Issue 20, item 8: the README's docs table left out pages (torch, sampler, envs, ...)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    table = readme.split("\nDocumentation:\n", 1)[1].split("\n## ", 1)[0]
    missing = [p.name for p in sorted((root / "docs").glob("*.md")) if f"](docs/{p.name})" not in table]
    assert not missing, missing


@pytest.mark.parametrize(
    ("estimator", "extra", "refused"),
    [
        ("gigpo", "values", r"`values` does not apply to the gigpo estimator"),
        *[
            (name, anchor, rf"`{anchor}` do not apply to the {family} estimator")
            for name, family in [("mae", "mae"), ("gae", "gae"), ("bilevel", "bilevel"), ("grpo", "group")]
            for anchor in ("token_ids", "turn_state_ids")
        ],
    ],
)
def test_an_input_the_estimator_does_not_read_is_refused_as_numpy_refuses_it(estimator, extra, refused):
    # Issue 42 item 7: mpo_rs.torch.padded.advantages ignored these where mpo_rs.advantages
    # refuses them; every adapter goes through the core's one input rule.
    values, mask, rewards, scores, groups = padded_batch(3)
    turns = mpo_rs.segment_turns(*flat(mask)).n_turns
    given = {
        "values": values,
        "token_ids": torch.zeros(mask.shape, dtype=torch.int64),
        "turn_state_ids": np.zeros(turns, np.int64),
    }
    kw: dict = {"group_ids": groups} if estimator in ("gigpo", "grpo") else {"values": values}
    if estimator == "gigpo":
        kw["turn_state_ids" if extra != "turn_state_ids" else "token_ids"] = given["turn_state_ids"]
    kw[extra] = given[extra]
    with pytest.raises(mpo_rs.InvalidOptionError, match=refused):
        mt.padded.advantages(mask, rewards, estimator=estimator, **kw)
    # numpy's one entry refuses the same input with the same message.
    f_mask, offsets = flat(mask)
    flat_kw = {k: (v.reshape(-1).numpy() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    source = {"scores": scores} if estimator in ("gigpo", "grpo") else {"rewards": rewards.reshape(-1).numpy()}
    with pytest.raises(mpo_rs.InvalidOptionError, match=refused):
        mpo_rs.advantages(f_mask, offsets, estimator=estimator, **source, **flat_kw)
