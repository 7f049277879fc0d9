"""The verl plug-in's policy loss (`mpo`) on verl's padded tensors: equal to mpo_rs.torch.losses,
verl's vanilla PPO with one-token turns, its clip settings, data-parallel normalisation from
the global batch info, its refusals and bf16 log-probs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from omegaconf import OmegaConf  # noqa: E402
from test_integration_verl import agent_rows  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs.integrations import verl as plugin  # noqa: E402
from mpo_rs.torch import losses  # noqa: E402

F64 = torch.float64


# --------------------------------------------------------------------------- the mpo loss


def actor_config(low=0.2, high=0.28, dual=3.0) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=dual,
    )


def loss_inputs(seed: int, rows: int = 6, cols: int = 32, noise: float = 0.2):
    rng = np.random.default_rng(seed)
    mask = torch.from_numpy(agent_rows(rng, rows, cols)).bool()
    old = torch.tensor(-rng.random((rows, cols)) * 3, dtype=F64)
    new = old + noise * torch.tensor(rng.standard_normal((rows, cols)), dtype=F64)
    adv = torch.tensor(rng.standard_normal((rows, cols)), dtype=F64)
    # verl hands the loss padded tensors whose off-mask entries are arbitrary.
    adv[~mask] = 7.0
    return new, old, adv, mask


def loss_and_grad(fn, new, *args, **kwargs):
    log_prob = new.clone().requires_grad_()
    loss, metrics = fn(args[0], log_prob, *args[1:], **kwargs)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize(("mode", "turn_ratio"), [("mpo", "product"), ("mpo_geo_mean", "geo_mean")])
def test_mpo_loss_equals_mpo_rs_losses_on_verls_padded_tensors(agg, mode, turn_ratio):
    new, old, adv, mask = loss_inputs(20)
    config = actor_config(low=0.15, high=0.3, dual=2.5)
    fn = core_algos.get_policy_loss_fn(mode)
    loss, grad, metrics = loss_and_grad(
        fn, new, old, adv, mask, loss_agg_mode=agg, config=config, rollout_is_weights=None
    )

    def reference(log_prob):
        return losses.policy_loss(
            log_prob,
            old,
            adv,
            mask,
            ratio="turn",
            turn_ratio=turn_ratio,
            clip_low=0.15,
            clip_high=0.3,
            dual_clip=2.5,
            agg=agg,
        )

    log_prob = new.clone().requires_grad_()
    want, want_metrics = reference(log_prob)
    (want_grad,) = torch.autograd.grad(want, log_prob)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-7, atol=1e-10)
    # The inputs reach the clip range, so the clip settings matter.
    assert metrics["actor/pg_clipfrac"] > 0
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(want_metrics["clip_frac"]))
    assert metrics["actor/mpo_turn_ratio_max"] == pytest.approx(float(want_metrics["ratio_max"]))


def test_mpo_loss_follows_the_clip_settings():
    new, old, adv, mask = loss_inputs(21)
    losses_by_clip = {}
    for low, high in [(0.2, 0.2), (0.1, 0.4)]:
        loss, _, _ = loss_and_grad(
            plugin.compute_policy_loss_mpo, new, old, adv, mask, "token-mean", actor_config(low, high)
        )
        want, _ = losses.policy_loss(new, old, adv, mask, clip_low=low, clip_high=high, dual_clip=3.0)
        torch.testing.assert_close(loss, want, rtol=1e-7, atol=1e-10)
        losses_by_clip[(low, high)] = float(loss)
    assert losses_by_clip[(0.2, 0.2)] != losses_by_clip[(0.1, 0.4)]


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_with_one_token_turns_mpo_is_verls_vanilla_ppo(agg):
    new, old, adv, _ = loss_inputs(22, noise=1.0)  # ratios beyond the dual clip
    mask = torch.zeros_like(new, dtype=torch.bool)
    mask[:, ::2] = True  # every LLM turn is a single token
    mask[2, 10:] = False
    config = actor_config(low=0.1, high=0.3, dual=2.0)
    weights = torch.rand(new.shape, dtype=F64, generator=torch.Generator().manual_seed(0)) + 0.5
    got = loss_and_grad(plugin.compute_policy_loss_mpo, new, old, adv, mask, agg, config, weights)
    want = loss_and_grad(core_algos.compute_policy_loss_vanilla, new, old, adv, mask, agg, config, weights)
    torch.testing.assert_close(got[0], want[0], rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(got[1], want[1], rtol=1e-7, atol=1e-10)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert got[2][key] == pytest.approx(want[2][key], rel=1e-6, abs=1e-9), key
    assert want[2]["actor/pg_clipfrac_lower"] > 0  # the dual clip is exercised


def test_mpo_loss_uses_the_global_batch_info_for_data_parallel_normalisation():
    new, old, adv, mask = loss_inputs(23)
    config = actor_config()
    local, _, _ = loss_and_grad(plugin.compute_policy_loss_mpo, new, old, adv, mask, "token-sum", config)
    config.global_batch_info.update(dp_size=4, batch_num_tokens=1000, global_batch_size=None)
    scaled, _, _ = loss_and_grad(plugin.compute_policy_loss_mpo, new, old, adv, mask, "token-mean", config)
    # verl's agg_loss: token-mean over the global batch's tokens, times dp_size.
    torch.testing.assert_close(scaled, local / 1000 * 4)


def test_mpo_loss_needs_the_actor_config():
    new, old, adv, mask = loss_inputs(24)
    with pytest.raises(plugin.InvalidConfigError, match="needs the actor config"):
        plugin.compute_policy_loss_mpo(old, new, adv, mask, "token-mean", None)
    with pytest.raises(plugin.InvalidConfigError, match="clip_ratio_c"):
        plugin.compute_policy_loss_mpo(old, new, adv, mask, "token-mean", actor_config(dual=1.0))


def test_mpo_loss_refuses_a_string_clip_ratio():
    """Strings are refused for every key of the plug-in's config (a YAML override's
    "0.3"), not converted with float()."""
    new, old, adv, mask = loss_inputs(25)
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"):
        config = OmegaConf.create({"clip_ratio": 0.2, key: "0.3"})
        with pytest.raises(plugin.InvalidConfigError, match=rf"`actor_rollout_ref\.actor\.{key}` must be a number"):
            plugin.compute_policy_loss_mpo(old, new, adv, mask, "token-mean", config)
    with pytest.raises(mpo_rs.InvalidRolloutError, match="`log_prob` must be padded"):
        plugin.compute_policy_loss_mpo(old[0], new[0], adv[0], mask[0], "token-mean", actor_config())


def test_mpo_loss_takes_bf16_log_probs():
    new, old, adv, mask = loss_inputs(25)
    loss, grad, _ = loss_and_grad(
        plugin.compute_policy_loss_mpo, new.bfloat16(), old.bfloat16(), adv.float(), mask, "token-mean", actor_config()
    )
    want, _ = losses.policy_loss(new.bfloat16(), old.bfloat16(), adv.float(), mask, dual_clip=3.0, clip_high=0.28)
    torch.testing.assert_close(loss.float(), want.float())
    assert grad.dtype == torch.bfloat16 and torch.isfinite(grad.float()).all()
