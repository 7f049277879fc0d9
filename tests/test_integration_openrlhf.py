"""MPO in OpenRLHF, against the installed package's classes (openrlhf 0.11.2, installed
without its GPU runtime, as verl is).

What is real here: OpenRLHF's ``Experience`` batches, its ``apply_length_penalties`` (called
by the mixin) and the signatures of ``RemoteExperienceMaker.compute_advantages_and_returns``
and ``PolicyLoss`` (read from the installed source). ``RemoteExperienceMaker`` and
``PolicyLoss`` themselves cannot be imported on a CPU machine: ``openrlhf.models`` imports
flash-attn (CUDA only) and DeepSpeed, ``openrlhf.trainer.ray`` imports vLLM. The mixin is
therefore run on a host object with the two attributes ``RemoteExperienceMaker.__init__``
sets and the mixin reads (``strategy`` with its ``args``, ``kl_ctl``).

The recipe of docs/integrations.md ("OpenRLHF") is ``examples/openrlhf_mpo.py``; this test
imports it. Skipped when openrlhf is not installed (``make test`` installs it).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
openrlhf = pytest.importorskip(
    "openrlhf", reason="openrlhf is not installed (the `openrlhf` extra; make test installs it)"
)
experience_module = pytest.importorskip(
    "openrlhf.trainer.ppo_utils.experience", reason="openrlhf's ppo_utils need pylatexenc and sympy"
)

import mpo_rs  # noqa: E402
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError  # noqa: E402
from mpo_rs.integrations import openrlhf as mpo_openrlhf  # noqa: E402
from mpo_rs.torch import losses  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import openrlhf_mpo  # noqa: E402

Experience = experience_module.Experience
PACKAGE = Path(openrlhf.__file__).parent


def _signature(path: Path, cls: str, method: str) -> list[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return [a.arg for a in item.args.args]
    raise AssertionError(f"{cls}.{method} not found in {path}")


def test_signatures_are_openrlhfs() -> None:
    import inspect

    maker = PACKAGE / "trainer/ppo_utils/experience_maker.py"
    assert _signature(maker, "RemoteExperienceMaker", "compute_advantages_and_returns") == ["self", "experiences"]
    loss = PACKAGE / "models/loss.py"
    forward = [p for p in inspect.signature(mpo_openrlhf.MPOPolicyLoss.forward).parameters]
    assert _signature(loss, "PolicyLoss", "forward") == forward
    init = [p for p in inspect.signature(mpo_openrlhf.MPOPolicyLoss.__init__).parameters]
    assert _signature(loss, "PolicyLoss", "__init__") == init[:-1]  # plus turn_ratio
    assert init[-1] == "turn_ratio"


def _experiences(seed: int = 0, n_prompts: int = 3, n_samples: int = 2, length: int = 12) -> list:
    """Two Experience batches of multi-turn rows: action_mask has 2-3 runs of ones per row
    (environment tokens between them are 0), right padding, rewards one per sample, in
    shuffled prompt order (OpenRLHF's `index`)."""
    g = torch.Generator().manual_seed(seed)
    rows = n_prompts * n_samples
    order = torch.randperm(rows, generator=g).tolist()
    mask = torch.zeros(rows, length, dtype=torch.bool)
    for r in range(rows):
        turns = 2 + r % 2
        pos = 0
        for _ in range(turns):
            pos += int(torch.randint(0, 2, (1,), generator=g))  # observation tokens
            n = 1 + int(torch.randint(0, 3, (1,), generator=g))
            mask[r, pos : pos + n] = True
            pos += n + 1
    values = torch.randn(rows, length, generator=g)
    kl = torch.rand(rows, length, generator=g) * 0.1 * mask
    rewards = torch.randint(0, 2, (rows,), generator=g).float()
    half = rows // 2
    out = []
    for part in (slice(0, half), slice(half, rows)):
        idx = order[part]
        out.append(
            Experience(
                action_mask=mask[idx],
                values=values[idx],
                kl=kl[idx],
                rewards=rewards[idx],
                index=idx,
                info={},
            )
        )
    return out


def _direct_rewards(experience, kl_coef: float) -> torch.Tensor:
    """The reward on the row's last action token, minus kl_coef * kl (OpenRLHF's compute_reward)."""
    mask = experience.action_mask
    out = torch.zeros(mask.shape)
    for r in range(mask.shape[0]):
        last = int(mask[r].nonzero().max())
        out[r, last] = experience.rewards[r]
    return out - kl_coef * experience.kl


def test_openrlhf_critic_advantages_equal_mpo_rs() -> None:
    maker = openrlhf_mpo.experience_maker(mpo_estimator=Estimator("mae", lam=0.9, beta=0.5))
    experiences = _experiences()
    originals = [(e.values.clone(), e.action_mask.clone(), e.kl.clone()) for e in experiences]
    out = maker.compute_advantages_and_returns(experiences)
    assert out is experiences
    for experience, (values, mask, kl) in zip(experiences, originals, strict=True):
        rows, cols = mask.shape
        rewards = _direct_rewards(SimpleNamespace(action_mask=mask, rewards=experience.rewards, kl=kl), 0.05)
        direct = mpo_rs.mae_advantages(
            values.numpy().reshape(-1),
            mask.numpy().reshape(-1).astype(np.uint8),
            np.arange(rows + 1, dtype=np.int64) * cols,
            rewards=np.where(mask.numpy(), rewards.numpy(), 0.0).astype(np.float32).reshape(-1),
            estimator=maker.mpo_estimator,
        )
        np.testing.assert_allclose(experience.advantages.numpy().reshape(-1), direct.advantages, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(experience.returns.numpy().reshape(-1), direct.returns, rtol=1e-6, atol=1e-7)
        assert experience.kl is None
        assert experience.info["return"].shape == (rows,)


def test_openrlhf_critic_free_advantages_equal_mpo_rs_and_grpo() -> None:
    """Critic-free: the group (a prompt's samples, found from `index` across experiences)
    baseline as the value. At lam=1, beta=0 and no KL it is OpenRLHF's group_norm up to eps."""
    maker = openrlhf_mpo.experience_maker(
        mpo_estimator=Estimator("mae", lam=1.0, beta=0.0), mpo_baseline="grpo", kl_coef=0.0
    )
    experiences = _experiences(seed=3, n_prompts=4, n_samples=3)
    index = np.concatenate([e.index for e in experiences])
    scores = torch.cat([e.rewards for e in experiences]).numpy()
    maker.strategy.args.rollout.n_samples_per_prompt = 3
    maker.compute_advantages_and_returns(experiences)
    per_row = mpo_rs.group_advantages(scores, index // 3, estimator="grpo")
    start = 0
    for experience in experiences:
        rows = experience.action_mask.shape[0]
        mask = experience.action_mask.numpy()
        expected = np.where(mask, per_row[start : start + rows, None], 0.0)
        np.testing.assert_allclose(experience.advantages.numpy(), expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(experience.returns, experience.advantages)
        start += rows


def test_openrlhf_missing_values_and_bad_estimators_are_refused() -> None:
    maker = openrlhf_mpo.experience_maker()
    experiences = _experiences()
    experiences[0].values = None
    with pytest.raises(InvalidBatchError, match="mpo_baseline"):
        maker.compute_advantages_and_returns(experiences)
    with pytest.raises(InvalidOptionError, match="MAE estimator"):
        openrlhf_mpo.experience_maker(mpo_estimator="grpo")
    with pytest.raises(InvalidOptionError, match="group estimator"):
        openrlhf_mpo.experience_maker(mpo_baseline="gae")
    with pytest.raises(InvalidOptionError, match="policy_loss_type"):
        mpo_openrlhf.MPOPolicyLoss(policy_loss_type="gspo")


@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("turn_ratio", ["product", "geo_mean"])
def test_openrlhf_policy_loss_is_mpo_rs_turn_ratio_loss(token_level_loss: bool, turn_ratio: str) -> None:
    experiences = _experiences(seed=5)
    mask = experiences[0].action_mask
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(mask.shape, generator=g)
    log_probs = (old + 0.3 * torch.randn(mask.shape, generator=g)).requires_grad_()
    advantages = torch.randn(mask.shape, generator=g)
    loss_fn = mpo_openrlhf.MPOPolicyLoss(
        0.2, 0.28, dual_clip=3.0, token_level_loss=token_level_loss, turn_ratio=turn_ratio
    )
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter = loss_fn(log_probs, old, advantages, action_mask=mask)
    assert vllm_kl is None and is_filter is None
    lp = log_probs.detach().clone().requires_grad_()
    agg = "token-mean" if token_level_loss else "seq-mean-token-mean"
    direct, metrics = losses.policy_loss(
        lp,
        old,
        advantages,
        mask,
        ratio="turn",
        turn_ratio=turn_ratio,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        agg=agg,
    )
    assert torch.equal(loss, direct)
    assert torch.equal(clip_ratio, metrics["clip_frac"])
    loss.backward()
    direct.backward()
    assert torch.equal(log_probs.grad, lp.grad)
    m = mask.float()
    assert torch.allclose(ppo_kl, -((log_probs.detach() - old) * m).sum() / m.sum())
    # The global reductions: totals times dp_size.
    n_tokens, n_seqs = float(m.sum()), float((m.sum(-1) > 0).sum())
    scaled = loss_fn(log_probs, old, advantages, mask, None, 2, 100.0, 10.0)[0]
    factor = (n_tokens / 100.0 if token_level_loss else n_seqs / 10.0) * 2
    assert torch.allclose(scaled, direct.detach() * factor)


def _openrlhf_models_modules():
    """OpenRLHF's real ``models/utils.py`` and ``models/loss.py``, loaded without the
    ``openrlhf.models`` package's ``__init__`` (which imports the Actor and so flash-attn,
    CUDA only). ``models/utils.py`` imports DeepSpeed: skipped where it is absent (as in
    ``make test``; it ran with DeepSpeed 0.19.8 installed by hand)."""
    import importlib.util
    import types

    pytest.importorskip("deepspeed", reason="openrlhf.models.utils imports DeepSpeed (not installed by make test)")
    name = "openrlhf.models"
    if name not in sys.modules or not hasattr(sys.modules[name], "_mpo_rs_bare"):
        package = types.ModuleType(name)
        package.__path__ = [str(PACKAGE / "models")]
        package._mpo_rs_bare = True
        sys.modules[name] = package
    modules = []
    for sub in ("utils", "loss"):
        full = f"{name}.{sub}"
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, PACKAGE / "models" / f"{sub}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
        modules.append(sys.modules[full])
    return modules


def _one_token_turns(rows: int = 6, cols: int = 10, seed: int = 0) -> torch.Tensor:
    """Masks whose every turn is one token (policy tokens never adjacent): the turn ratio is
    then the token ratio, and MPOPolicyLoss must be OpenRLHF's PPO loss."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[:, ::2] = torch.rand(rows, (cols + 1) // 2, generator=g) < 0.8
    return mask


@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_openrlhf_policy_loss_with_one_token_turns_is_openrlhfs(token_level_loss: bool, dual_clip) -> None:
    _, loss_module = _openrlhf_models_modules()
    mask = _one_token_turns()
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(mask.shape, generator=g)
    log_probs = (old + 0.4 * torch.randn(mask.shape, generator=g)).requires_grad_()
    advantages = torch.randn(mask.shape, generator=g)
    theirs_fn = loss_module.PolicyLoss(0.2, 0.28, dual_clip=dual_clip, token_level_loss=token_level_loss)
    ours_fn = mpo_openrlhf.MPOPolicyLoss(0.2, 0.28, dual_clip=dual_clip, token_level_loss=token_level_loss)
    for extra in ((), (None, 2, 40.0, 5.0)):
        lp_theirs = log_probs.detach().clone().requires_grad_()
        theirs = theirs_fn(lp_theirs, old, advantages, mask.float(), *extra)
        ours = ours_fn(log_probs, old, advantages, mask, *extra)
        torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(ours[1], theirs[1])  # clip_ratio
        torch.testing.assert_close(ours[2], theirs[2])  # ppo_kl
        assert ours[3] is None and theirs[3] is None and ours[4] is None and theirs[4] is None
        ours[0].backward()
        theirs[0].backward()
        torch.testing.assert_close(log_probs.grad, lp_theirs.grad, rtol=1e-6, atol=1e-7)
        log_probs.grad = None


def test_openrlhf_token_rewards_are_compute_reward() -> None:
    utils, _ = _openrlhf_models_modules()
    experiences = _experiences(seed=7)
    for experience in experiences:
        for clip in (None, (-0.5, 0.5)):
            theirs = utils.compute_reward(
                experience.rewards, 0.05, experience.kl, action_mask=experience.action_mask, reward_clip_range=clip
            )
            ours = mpo_openrlhf.token_rewards(experience.rewards, experience.action_mask, experience.kl, 0.05, clip)
            assert torch.equal(ours, theirs)
