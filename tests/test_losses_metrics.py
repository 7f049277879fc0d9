"""mpo_rs.torch.losses: the metrics policy_loss returns (turn-ratio statistics before clipping), the dtypes it computes in, and the same on a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")


from test_losses import grad_of, reference_turns, seeded_batch  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs import InvalidRolloutError  # noqa: E402
from mpo_rs.torch import losses  # noqa: E402

F64 = torch.float64


# --------------------------------------------------------------------------- metrics, dtypes


def test_metrics_are_detached_zero_dim_tensors():
    torch.manual_seed(0)
    new = torch.randn(4, 16, requires_grad=True)
    old = new.detach() + 0.3 * torch.randn(4, 16)
    mask = torch.rand(4, 16) > 0.3
    _, metrics = losses.policy_loss(new, old, torch.randn(4, 16), mask, dual_clip=3.0)
    expected = {"clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl",
                "ratio_mean", "ratio_min", "ratio_max", "num_tokens", "num_turns",
                *losses.TURN_RATIO_STATISTICS}  # fmt: skip
    assert set(metrics) == expected
    for value in metrics.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
    assert metrics["approx_kl"] >= 0
    assert metrics["ratio_min"] <= metrics["ratio_mean"] <= metrics["ratio_max"]
    torch.testing.assert_close(metrics["clip_frac"], metrics["clip_frac_low"] + metrics["clip_frac_high"])
    lr = (new.detach() - old)[mask]
    torch.testing.assert_close(metrics["approx_kl"], (torch.exp(lr) - 1 - lr).mean())
    assert int(metrics["num_turns"]) == len(reference_turns(mask.numpy()))
    # Flat inputs without token_turn do not know the turns.
    _, flat_metrics = losses.policy_loss(
        new.detach().reshape(-1), old.reshape(-1), torch.ones(64), mask.reshape(-1), ratio="token"
    )
    assert "num_turns" not in flat_metrics
    assert not set(losses.TURN_RATIO_STATISTICS) & set(flat_metrics)


def test_turn_ratio_statistics_before_clipping_match_a_hand_computation():
    # Row 0: turns {1,2} and {4}; row 1: turns {0,1} and {5}. Log-ratios chosen by hand.
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 1]], dtype=torch.bool)
    log_ratio = torch.tensor([[9.0, 0.5, 0.3, 9.0, -0.1, 9.0], [0.05, -0.02, 9.0, 9.0, 9.0, -25.0]], dtype=F64)
    old = -torch.rand(2, 6, dtype=F64)
    new = old + log_ratio  # off-policy entries (9.0) must not count
    turn_sums = [0.8, -0.1, 0.03, -25.0]
    turn_lengths = [2, 1, 2, 1]
    hand = {
        "product": [math.exp(s) for s in turn_sums],  # before the clamp at 20: exp(-25) stays
        "geo": [math.exp(s / n) for s, n in zip(turn_sums, turn_lengths, strict=True)],
    }
    for ratio in ("turn", "token", "sequence"):
        for turn_ratio in losses.TURN_RATIOS:
            kwargs = dict(ratio=ratio, turn_ratio=turn_ratio, clip_low=0.2, clip_high=0.28)
            _, metrics = losses.policy_loss(new, old, torch.ones(2, 6, dtype=F64), mask, **kwargs)
            # Flat inputs with token_turn give the same statistics.
            offsets = np.array([0, 6, 12])
            turns = mpo_rs.segment_turns(mask.reshape(-1).numpy().astype(np.uint8), offsets)
            _, flat = losses.policy_loss(
                new.reshape(-1), old.reshape(-1), torch.ones(12, dtype=F64), mask.reshape(-1),
                token_turn=turns.token_turn, offsets=offsets, **kwargs,
            )  # fmt: skip
            for form, rhos in hand.items():
                outside = sum(not 0.8 <= r <= 1.28 for r in rhos) / len(rhos)
                for m in (metrics, flat):
                    torch.testing.assert_close(m[f"turn_ratio_{form}_mean"], torch.tensor(sum(rhos) / 4, dtype=F64))
                    torch.testing.assert_close(m[f"turn_ratio_{form}_min"], torch.tensor(min(rhos), dtype=F64))
                    torch.testing.assert_close(m[f"turn_ratio_{form}_max"], torch.tensor(max(rhos), dtype=F64))
                    torch.testing.assert_close(m[f"turn_ratio_{form}_outside_clip"], torch.tensor(outside, dtype=F64))
    # product: exp(0.8) > 1.28 and exp(-25) < 0.8 are outside; geo: exp(0.4) and exp(-25).
    assert metrics["turn_ratio_product_outside_clip"] == 0.5 and metrics["turn_ratio_geo_outside_clip"] == 0.5


def test_turn_ratio_statistics_leave_the_loss_bitwise_unchanged():
    # The loss and its gradient are the surrogate of importance_ratio, aggregated, bit for bit.
    torch.manual_seed(3)
    new = torch.randn(4, 32, requires_grad=True)
    old = new.detach() + 0.2 * torch.randn(4, 32)
    adv = torch.randn(4, 32)
    mask = torch.rand(4, 32) > 0.4
    for ratio in losses.RATIO_MODES:
        for turn_ratio in losses.TURN_RATIOS:
            loss, metrics = losses.policy_loss(new, old, adv, mask, ratio=ratio, turn_ratio=turn_ratio)
            assert "turn_ratio_product_mean" in metrics
            (grad,) = torch.autograd.grad(loss, new)
            rho = losses.importance_ratio(new, old, mask, ratio=ratio, turn_ratio=turn_ratio)
            per_token = losses.clipped_surrogate(rho, torch.where(mask, adv, 0.0), 0.2, 0.2).per_token
            expected = losses.aggregate(per_token, mask)
            (expected_grad,) = torch.autograd.grad(expected, new)
            assert torch.equal(loss, expected) and torch.equal(grad, expected_grad)


def test_turn_ratio_statistics_alone_equal_those_of_policy_loss():
    torch.manual_seed(4)
    new = torch.randn(3, 20, requires_grad=True)
    old = new.detach() + 0.3 * torch.randn(3, 20)
    mask = torch.rand(3, 20) > 0.4
    _, metrics = losses.policy_loss(new, old, torch.randn(3, 20), mask, clip_low=0.1, clip_high=0.3)
    alone = losses.turn_ratio_statistics(new, old, mask, clip_low=0.1, clip_high=0.3)
    assert set(alone) == set(losses.TURN_RATIO_STATISTICS)
    for name, value in alone.items():
        assert torch.equal(value, metrics[name]) and not value.requires_grad, name
    with pytest.raises(InvalidRolloutError, match="token_turn"):
        losses.turn_ratio_statistics(new.reshape(-1), old.reshape(-1), mask.reshape(-1))


def test_turn_ratio_statistics_masked_path_equals_the_compact_one():
    # The masked reduction (CUDA's, without a host sync) and the compact one (CPU's) agree.
    from mpo_rs.torch._ratio import flat_turn_ratio_statistics

    torch.manual_seed(5)
    for rows, cols, keep in ((3, 40, 0.6), (2, 5, 0.0), (1, 1, 1.0)):
        mask = torch.rand(rows, cols) < keep
        log_ratio = torch.where(mask, 0.4 * torch.randn(rows, cols, dtype=F64), 0.0).reshape(-1)
        index, _ = losses.turn_index_from_mask(mask)
        mask_f = mask.reshape(-1).to(F64)
        compact = flat_turn_ratio_statistics(log_ratio, mask_f, index, 0.2, 0.28, compact=True)
        masked = flat_turn_ratio_statistics(log_ratio, mask_f, index, 0.2, 0.28, compact=False)
        for name in losses.TURN_RATIO_STATISTICS:
            torch.testing.assert_close(masked[name], compact[name], equal_nan=True, rtol=1e-12, atol=0.0)


def test_turn_ratio_statistics_are_nan_without_turns():
    x = torch.zeros(2, 3, requires_grad=True)
    _, metrics = losses.policy_loss(x, x.detach(), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    for name in losses.TURN_RATIO_STATISTICS:
        assert torch.isnan(metrics[name]), name


def test_bf16_log_probs_are_computed_in_fp32():
    mask, old, new32, adv = seeded_batch(3, 40, observation_share=0.3, noise=0.01)
    new16 = new32.to(torch.bfloat16).requires_grad_()
    loss16, metrics = losses.policy_loss(new16, old, adv, mask)
    assert loss16.dtype == torch.float32 and metrics["ratio_mean"].dtype == torch.float32
    loss16.backward()
    assert new16.grad is not None and new16.grad.dtype == torch.bfloat16
    reference = losses.policy_loss(new16.detach().float(), old, adv, mask)[0]
    torch.testing.assert_close(loss16.detach(), reference)


# --------------------------------------------------------------------------- GPU


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_gpu_matches_cpu_without_host_sync():
    mask, old, new, adv = seeded_batch(8, 512, observation_share=0.4, noise=0.05)
    for ratio in losses.RATIO_MODES:
        cpu_loss, cpu_grad = grad_of(
            lambda lp, ratio=ratio: losses.policy_loss(lp, old, adv, mask, ratio=ratio, dual_clip=3.0)[0], new
        )
        dev = [t.cuda() for t in (new, old, adv, mask)]
        log_prob = dev[0].clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside the loss raises
        try:
            _, metrics = losses.policy_loss(log_prob, dev[1], dev[2], dev[3], ratio=ratio, dual_clip=3.0,
                                            agg="seq-mean-token-mean")  # fmt: skip
            loss_tm, _ = losses.policy_loss(log_prob, dev[1], dev[2], dev[3], ratio=ratio, dual_clip=3.0)
            loss_tm.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.testing.assert_close(loss_tm.cpu(), cpu_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(log_prob.grad.cpu(), cpu_grad, rtol=1e-5, atol=1e-8)
        assert all(v.device.type == "cuda" for v in metrics.values())
        # The turn-ratio statistics (masked on CUDA, compact on CPU) agree.
        _, cpu_metrics = losses.policy_loss(new, old, adv, mask, ratio=ratio, dual_clip=3.0, agg="seq-mean-token-mean")
        for name in losses.TURN_RATIO_STATISTICS:
            torch.testing.assert_close(metrics[name].cpu(), cpu_metrics[name], rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@cuda
def test_gpu_bf16_turn_loss():
    torch.manual_seed(0)
    mask = (torch.rand(4, 256) > 0.4).cuda()
    old = (-torch.rand(4, 256) * 3).cuda()
    new = (old + 0.01 * torch.randn_like(old)).bfloat16().requires_grad_()
    loss, _ = losses.policy_loss(new, old, torch.randn_like(old), mask)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and new.grad.dtype == torch.bfloat16
