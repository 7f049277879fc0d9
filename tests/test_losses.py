"""mpo_rs.torch.losses: turn-IS policy loss, its ablations, the critic loss."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs import InvalidOptionError, InvalidRolloutError  # noqa: E402
from mpo_rs.torch import losses  # noqa: E402

F64 = torch.float64


# --------------------------------------------------------------------------- helpers


def reference_turns(mask: np.ndarray) -> list[list[int]]:
    """Flat token positions of each turn of a padded (B, L) mask, by plain loops."""
    turns: list[list[int]] = []
    rows, cols = mask.shape
    for b in range(rows):
        for i in range(cols):
            if mask[b, i] and (i == 0 or not mask[b, i - 1]):
                turns.append([])
            if mask[b, i]:
                turns[-1].append(b * cols + i)
    return turns


@st.composite
def padded_batches(draw, max_rows: int = 4, max_len: int = 12):
    rows = draw(st.integers(1, max_rows))
    length = draw(st.integers(1, max_len))
    mask = np.array(draw(st.lists(st.booleans(), min_size=rows * length, max_size=rows * length)), dtype=bool).reshape(
        rows, length
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    old = -rng.random((rows, length)) * 3
    new = old + 0.03 * rng.standard_normal((rows, length))  # ratios stay inside the clip
    adv = rng.standard_normal((rows, length))
    return (
        torch.tensor(new, dtype=F64),
        torch.tensor(old, dtype=F64),
        torch.tensor(adv, dtype=F64),
        torch.from_numpy(mask),
    )


def grad_of(loss_fn, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_prob = new.clone().requires_grad_()
    loss = loss_fn(log_prob)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad


def seeded_batch(rows: int, cols: int, *, observation_share: float, noise: float) -> tuple[torch.Tensor, ...]:
    """A random (rows, cols) batch from seed 0: the policy mask (about ``observation_share``
    of the tokens off it), old log-probs, new ones ``noise`` from them, advantages."""
    torch.manual_seed(0)
    mask = torch.rand(rows, cols) > observation_share
    old = -torch.rand(rows, cols) * 3
    new = old + noise * torch.randn(rows, cols)
    return mask, old, new, torch.randn(rows, cols)


def padded_to_flat(mask: torch.Tensor, *tensors: torch.Tensor, lengths=None):
    """Flat tokens of padded rows (row b keeps its first lengths[b] columns)."""
    rows, cols = mask.shape
    if lengths is None:
        lengths = [cols] * rows
    keep = torch.arange(cols)[None, :] < torch.tensor(lengths)[:, None]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return offsets, keep, [t[keep] for t in (mask, *tensors)]


# --------------------------------------------------------------------------- turn IS


@given(padded_batches())
def test_forward_ratio_is_the_turn_ratio_on_every_token(batch):
    new, old, _, mask = batch
    for turn_ratio in ("product", "geo_mean"):
        rho = losses.importance_ratio(new, old, mask, ratio="turn", turn_ratio=turn_ratio).reshape(-1)
        log_ratio = (new - old).reshape(-1)
        for turn in reference_turns(mask.numpy()):
            expected = log_ratio[turn].sum()
            if turn_ratio == "geo_mean":
                expected = expected / len(turn)
            torch.testing.assert_close(rho[turn], torch.exp(expected).expand(len(turn)), rtol=1e-12, atol=0)
        assert torch.all(rho[~mask.reshape(-1)] == 1.0)


@given(padded_batches())
def test_gradient_is_turn_ratio_times_token_advantage(batch):
    """dL/dlog pi_{t,i} = -rho_t * A_{t,i} / n inside the clip range (token-mean)."""
    new, old, adv, mask = batch
    n = max(int(mask.sum()), 1)
    _, grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask, clip_low=0.9, clip_high=10.0)[0], new)
    flat_grad, flat_adv = grad.reshape(-1), adv.reshape(-1)
    log_ratio = (new - old).reshape(-1)
    for turn in reference_turns(mask.numpy()):
        rho_t = torch.exp(log_ratio[turn].sum())
        torch.testing.assert_close(flat_grad[turn], -rho_t * flat_adv[turn] / n, rtol=1e-10, atol=1e-14)
    assert torch.all(grad[~mask] == 0)


def test_gradient_vanishes_only_where_the_clip_is_active():
    # One 3-token turn with log rho_t = 0.3 > log 1.2: tokens with A > 0 are clipped
    # (no gradient), tokens with A < 0 are not (min picks the unclipped branch).
    mask = torch.tensor([[False, True, True, True]])
    old = torch.zeros(1, 4, dtype=F64)
    new = torch.tensor([[0.0, 0.1, 0.1, 0.1]], dtype=F64)
    adv = torch.tensor([[0.0, 1.0, -1.0, 2.0]], dtype=F64)
    _, grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask)[0], new)
    rho = np.exp(0.3)
    assert grad[0, 1] == 0 and grad[0, 3] == 0
    torch.testing.assert_close(grad[0, 2], torch.tensor(rho / 3, dtype=F64))
    _, metrics = losses.policy_loss(new, old, adv, mask)
    torch.testing.assert_close(metrics["clip_frac_high"], torch.tensor(2 / 3, dtype=F64))
    assert metrics["clip_frac_low"] == 0


@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_one_token_per_turn_is_exactly_token_is(rows, turns_per_row, seed):
    rng = np.random.default_rng(seed)
    length = 2 * turns_per_row
    mask = torch.zeros(rows, length, dtype=torch.bool)
    mask[:, 1::2] = True  # observation, action, observation, action, ...
    old = torch.tensor(-rng.random((rows, length)) * 2, dtype=torch.float32)
    new = old + torch.tensor(0.4 * rng.standard_normal((rows, length)), dtype=torch.float32)
    adv = torch.tensor(rng.standard_normal((rows, length)), dtype=torch.float32)
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    token_loss, token_grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask, ratio="token", **kw)[0], new)
    for turn_ratio in ("product", "geo_mean"):
        turn_loss, turn_grad = grad_of(
            lambda lp, turn_ratio=turn_ratio: losses.policy_loss(
                lp, old, adv, mask, ratio="turn", turn_ratio=turn_ratio, **kw
            )[0],
            new,
        )
        assert torch.equal(turn_loss, token_loss)  # bitwise, clipped tokens included
        assert torch.equal(turn_grad, token_grad)


def test_without_stop_gradient_the_centred_credit_cancels_within_a_turn():
    """MAE gives A_{t,i} = A_t^turn + centred token credit. With the naive per-token ratio
    exp(sum_i l_{t,i}) every token of a turn gets the same gradient -rho_t * sum_j A_{t,j} / n
    and the centred credit is lost; the stop-gradient ratio keeps it."""
    mask = torch.tensor([[False, True, True, True, True, False, True, True]])
    old = torch.full((1, 8), -1.0, dtype=F64)
    new = old + torch.tensor([[0, 0.02, -0.01, 0.03, 0.0, 0, 0.01, -0.02]], dtype=F64)
    turn_adv = torch.tensor([[0, 0.5, 0.5, 0.5, 0.5, 0, -0.3, -0.3]], dtype=F64)
    credit = torch.tensor([[0, 0.9, -0.6, 0.3, -0.6, 0, 0.4, -0.4]], dtype=F64)  # sums to 0 per turn
    n = int(mask.sum())
    turns = [[1, 2, 3, 4], [6, 7]]

    def naive_loss(lp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        log_ratio = torch.where(mask, lp - old, 0.0)
        rho = torch.zeros_like(lp)
        for turn in turns:  # the ratio without stop-gradient: exp of the turn's sum
            rho[0, turn] = torch.exp(log_ratio[0, turn].sum())
        return (-(rho * adv)[mask]).sum() / n

    grads = {}
    for name, adv in (("turn only", turn_adv), ("with credit", turn_adv + credit)):
        grads["naive", name] = grad_of(lambda lp, adv=adv: naive_loss(lp, adv), new)[1]
        grads["sg", name] = grad_of(
            lambda lp, adv=adv: losses.policy_loss(lp, old, adv, mask, clip_low=0.9, clip_high=10.0)[0], new
        )[1]
    # Naive: the credit changes nothing, and tokens of a turn share one gradient.
    torch.testing.assert_close(grads["naive", "with credit"], grads["naive", "turn only"], rtol=1e-12, atol=1e-15)
    for turn in turns:
        g = grads["naive", "with credit"][0, turn]
        torch.testing.assert_close(g, g[:1].expand(len(turn)), rtol=1e-12, atol=0)
    # Stop-gradient: the credit moves each token's gradient by exactly -rho_t * credit / n.
    difference = grads["sg", "with credit"] - grads["sg", "turn only"]
    log_ratio = torch.where(mask, new - old, 0.0)
    for turn in turns:
        rho_t = torch.exp(log_ratio[0, turn].sum())
        torch.testing.assert_close(difference[0, turn], -rho_t * credit[0, turn] / n, rtol=1e-10, atol=1e-15)
    assert difference.abs().max() > 0.05  # visibly different, not a rounding effect


@given(padded_batches())
def test_sequence_ratio_is_gspo_token(batch):
    new, old, adv, mask = batch
    rho = losses.importance_ratio(new, old, mask, ratio="sequence")
    n = max(int(mask.sum()), 1)
    _, grad = grad_of(
        lambda lp: losses.policy_loss(lp, old, adv, mask, ratio="sequence", clip_low=0.9, clip_high=10.0)[0], new
    )
    for b in range(mask.shape[0]):
        row = mask[b]
        if not row.any():
            continue
        s = torch.exp((new - old)[b][row].mean())
        torch.testing.assert_close(rho[b][row], s.expand(int(row.sum())), rtol=1e-12, atol=0)
        torch.testing.assert_close(grad[b][row], -s * adv[b][row] / n, rtol=1e-10, atol=1e-14)


# --------------------------------------------------------------------------- layouts


@given(padded_batches(), st.data())
def test_padded_equals_flat(batch, data):
    new, old, adv, mask = batch
    rows, cols = mask.shape
    lengths = [data.draw(st.integers(0, cols)) for _ in range(rows)]
    padded_mask = mask & (torch.arange(cols)[None, :] < torch.tensor(lengths)[:, None])
    offsets, _, (flat_mask, flat_new, flat_old, flat_adv) = padded_to_flat(padded_mask, new, old, adv, lengths=lengths)
    turns = mpo_rs.segment_turns(flat_mask.numpy(), offsets)
    for ratio in ("turn", "token", "sequence"):
        for agg in losses.AGGREGATIONS:
            kw = dict(ratio=ratio, agg=agg, clip_low=0.02, clip_high=0.03, dual_clip=1.5)
            loss_p, grad_p = grad_of(lambda lp, kw=kw: losses.policy_loss(lp, old, adv, padded_mask, **kw)[0], new)
            loss_f, grad_f = grad_of(
                lambda lp, kw=kw: losses.policy_loss(
                    lp, flat_old, flat_adv, flat_mask, token_turn=turns.token_turn, offsets=offsets, **kw
                )[0],
                flat_new,
            )
            torch.testing.assert_close(loss_f, loss_p, rtol=1e-12, atol=1e-15)
            # Gradients of tokens kept in flat form agree; padding gets none.
            keep = torch.arange(cols)[None, :] < torch.tensor(lengths)[:, None]
            torch.testing.assert_close(grad_f, grad_p[keep], rtol=1e-12, atol=1e-15)
            assert torch.all(grad_p[~keep] == 0)
    _, m_p = losses.policy_loss(new, old, adv, padded_mask)
    _, m_f = losses.policy_loss(flat_new, flat_old, flat_adv, flat_mask, token_turn=turns.token_turn)
    assert int(m_p["num_turns"]) == int(m_f["num_turns"]) == turns.n_turns
    for key in ("clip_frac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "num_tokens"):
        torch.testing.assert_close(m_f[key], m_p[key], rtol=1e-12, atol=1e-15, equal_nan=True)


@given(padded_batches())
def test_turns_from_mask_match_the_rust_segmentation(batch):
    *_, mask = batch
    index, num_turns = losses.turn_index_from_mask(mask)
    rows, cols = mask.shape
    offsets = np.arange(rows + 1, dtype=np.int64) * cols
    turns = mpo_rs.segment_turns(mask.reshape(-1).numpy(), offsets)
    expected = turns.token_turn.astype(np.int64) + 1
    on = mask.reshape(-1).numpy()
    np.testing.assert_array_equal(index.numpy()[on], expected[on])
    assert int(num_turns) == turns.n_turns


def test_token_turn_accepts_numpy_and_tensors():
    mask = np.array([0, 1, 1, 0, 1, 1, 1, 0], dtype=bool)
    offsets = np.array([0, 4, 8])
    token_turn = mpo_rs.segment_turns(mask, offsets).token_turn
    new = torch.linspace(-1, -0.5, 8, dtype=F64)
    old = new - 0.05
    adv = torch.ones(8, dtype=F64)
    results = [
        losses.policy_loss(new, old, adv, torch.from_numpy(mask), token_turn=tt)[0]
        for tt in (token_turn, torch.from_numpy(token_turn), torch.from_numpy(token_turn).long())
    ]
    assert results[0] == results[1] == results[2]
    rho = losses.importance_ratio(new, old, mask, token_turn=token_turn)
    torch.testing.assert_close(rho[[1, 2]], torch.full((2,), np.exp(0.1), dtype=F64))
    torch.testing.assert_close(rho[[4, 5, 6]], torch.full((3,), np.exp(0.15), dtype=F64))


# --------------------------------------------------------------------------- clipping, aggregation


def test_dual_clip_caps_the_loss_of_negative_advantages():
    mask = torch.tensor([[False, True, True]])
    old = torch.zeros(1, 3, dtype=F64)
    new = torch.tensor([[0.0, 1.0, 1.0]], dtype=F64)  # turn ratio e^2 ~ 7.39
    adv = torch.tensor([[0.0, -1.0, -2.0]], dtype=F64)
    rho = np.exp(2.0)
    plain, plain_grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask)[0], new)
    torch.testing.assert_close(plain, torch.tensor(rho * 3 / 2, dtype=F64))  # unbounded: rho * |A|
    assert torch.all(plain_grad[0, 1:] != 0)
    capped, capped_grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask, dual_clip=3.0)[0], new)
    torch.testing.assert_close(capped, torch.tensor(3.0 * 3 / 2, dtype=F64))  # -c * A, token-mean
    assert torch.all(capped_grad == 0)
    _, metrics = losses.policy_loss(new, old, adv, mask, dual_clip=3.0)
    assert metrics["dual_clip_frac"] == 1.0
    # Positive advantages are untouched by the dual clip; a cap above the ratio is inactive.
    for a, c in ((1.0, 3.0), (-1.0, 10.0)):
        adv2 = torch.tensor([[0.0, a, a]], dtype=F64)
        torch.testing.assert_close(
            losses.policy_loss(new, old, adv2, mask, dual_clip=c)[0], losses.policy_loss(new, old, adv2, mask)[0]
        )


def test_clip_higher_is_asymmetric():
    mask = torch.tensor([True])
    old = torch.zeros(1, dtype=F64)
    adv = torch.ones(1, dtype=F64)
    new = torch.tensor([np.log(1.25)], dtype=F64)
    tt = np.array([0])
    loss_020, g_020 = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask, token_turn=tt)[0], new)
    loss_028, g_028 = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask, token_turn=tt, clip_high=0.28)[0], new)
    torch.testing.assert_close(loss_020, torch.tensor(-1.2, dtype=F64))
    assert g_020 == 0
    torch.testing.assert_close(loss_028, torch.tensor(-1.25, dtype=F64))
    torch.testing.assert_close(g_028, torch.tensor([-1.25], dtype=F64))
    # The lower bound: A < 0 and ratio 0.75 is clipped at 0.8 with clip_low=0.2, not at 0.7.
    new_low = torch.tensor([np.log(0.75)], dtype=F64)
    torch.testing.assert_close(
        losses.policy_loss(new_low, old, -adv, mask, token_turn=tt)[0], torch.tensor(0.8, dtype=F64)
    )
    torch.testing.assert_close(
        losses.policy_loss(new_low, old, -adv, mask, token_turn=tt, clip_low=0.3)[0], torch.tensor(0.75, dtype=F64)
    )


def test_aggregations_by_hand():
    # Row 0: 3 policy tokens with losses 1, 2, 3; row 1: 1 token with loss 10; row 2: none.
    mask = torch.tensor([[True, True, True, False], [False, True, False, False], [False] * 4])
    per_token = torch.tensor([[1.0, 2.0, 3.0, 99.0], [99.0, 10.0, 99.0, 99.0], [99.0] * 4], dtype=F64)
    expected = {"token-mean": 16 / 4, "seq-mean-token-mean": (2 + 10) / 2, "seq-mean-token-sum": (6 + 10) / 2}
    offsets, _, (flat_mask, flat_x) = padded_to_flat(mask, per_token)
    for agg, value in expected.items():
        torch.testing.assert_close(losses.aggregate(per_token, mask, agg), torch.tensor(value, dtype=F64))
        torch.testing.assert_close(
            losses.aggregate(flat_x, flat_mask, agg, offsets=offsets), torch.tensor(value, dtype=F64)
        )
    # policy_loss with ratio 1 and A = -loss reproduces them.
    zeros = torch.zeros_like(per_token)
    for agg, value in expected.items():
        loss, _ = losses.policy_loss(zeros, zeros, -per_token, mask, agg=agg)
        torch.testing.assert_close(loss, torch.tensor(value, dtype=F64))


def test_log_ratio_clamp_bounds_the_forward_value_but_keeps_the_gradient():
    mask = torch.tensor([[False, True, True]])
    old = torch.tensor([[0.0, -40.0, -1.0]], dtype=F64)
    new = torch.tensor([[0.0, -1.0, -1.0]], dtype=F64)  # turn log-ratio 39
    adv = torch.tensor([[0.0, -1.0, -1.0]], dtype=F64)
    rho = losses.importance_ratio(new, old, mask)
    torch.testing.assert_close(rho[0, 1:], torch.full((2,), np.exp(20.0), dtype=F64))
    loss, grad = grad_of(lambda lp: losses.policy_loss(lp, old, adv, mask)[0], new)
    assert torch.isfinite(loss) and torch.all(torch.isfinite(grad))
    torch.testing.assert_close(grad[0, 1:], torch.full((2,), np.exp(20.0) / 2, dtype=F64))
    rho5 = losses.importance_ratio(new, old, mask, log_ratio_clamp=5.0)
    torch.testing.assert_close(rho5[0, 1:], torch.full((2,), np.exp(5.0), dtype=F64))


def test_padding_garbage_never_leaks():
    mask = torch.tensor([[False, True, True, False, False]])
    new = torch.tensor([[float("nan"), -1.0, -2.0, float("-inf"), float("inf")]])
    old = torch.tensor([[float("-inf"), -1.1, -2.0, float("nan"), 0.0]])
    adv = torch.tensor([[float("nan"), 1.0, -1.0, float("inf"), float("nan")]])
    for ratio in losses.RATIO_MODES:
        for agg in losses.AGGREGATIONS:
            loss, grad = grad_of(
                lambda lp, ratio=ratio, agg=agg: losses.policy_loss(lp, old, adv, mask, ratio=ratio, agg=agg)[0], new
            )
            assert torch.isfinite(loss) and torch.all(torch.isfinite(grad)), (ratio, agg)
            assert torch.all(grad[~mask] == 0)


def test_no_policy_tokens_gives_zero_loss_and_nan_ratio_stats():
    x = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = losses.policy_loss(x, x.detach(), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert loss == 0 and metrics["num_tokens"] == 0 and metrics["num_turns"] == 0
    assert torch.isnan(metrics["ratio_min"]) and torch.isnan(metrics["ratio_mean"])
    loss.backward()
    assert torch.all(x.grad == 0)


# --------------------------------------------------------------------------- critic loss


def test_value_loss_formula():
    mask = torch.tensor([[False, True, True, True, True]])
    values = torch.tensor([[9.0, 1.0, 2.0, 0.0, 0.5]], dtype=F64, requires_grad=True)
    old = torch.tensor([[9.0, 0.0, 2.2, 0.1, 0.0]], dtype=F64)
    returns = torch.tensor([[9.0, 2.0, 2.0, 1.0, -1.0]], dtype=F64)
    loss, metrics = losses.value_loss(values, old, returns, mask, clip=0.5)
    v, vo, g = values.detach()[mask], old[mask], returns[mask]
    clipped = vo + (v - vo).clamp(-0.5, 0.5)  # [0.5, 2.0, 0.1, 0.5]
    per_token = 0.5 * torch.maximum((v - g) ** 2, (clipped - g) ** 2)
    torch.testing.assert_close(loss, per_token.mean())
    # By hand: token 1: max(1, 2.25); token 2: 0; token 3: max(1, 0.81); token 4: max(2.25, 2.25).
    torch.testing.assert_close(loss, torch.tensor(0.5 * (2.25 + 0 + 1 + 2.25) / 4, dtype=F64))
    torch.testing.assert_close(metrics["clip_frac"], torch.tensor(0.25, dtype=F64))
    loss.backward()
    # Clipped branch chosen at token 1 (V outside V_old +- 0.5): no gradient there.
    assert values.grad[0, 1] == 0 and values.grad[0, 0] == 0
    torch.testing.assert_close(values.grad[0, 3], torch.tensor(0.5 * 2 * (0.0 - 1.0) / 4, dtype=F64))
    unclipped, _ = losses.value_loss(values, old, returns, mask, clip=None)
    torch.testing.assert_close(unclipped, (0.5 * (v - g) ** 2).mean())
    # The clipped branch counts even when V is exact: V_old far away keeps the loss up.
    exact = returns.clone().requires_grad_()
    assert losses.value_loss(exact, old, returns, mask)[0] > 0
    perfect, m = losses.value_loss(exact, returns, returns, mask)
    assert perfect == 0 and m["explained_variance"] == 1.0 and m["clip_frac"] == 0
    # Returns that do not vary leave the explained variance undefined: NaN, not -1e7.
    flat = torch.ones_like(returns)
    _, m = losses.value_loss(values.detach(), old, flat, mask)
    assert torch.isnan(m["explained_variance"])


def test_value_loss_flat_and_seq_aggregation():
    mask = torch.tensor([[False, True, True], [False, False, True]])
    values = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    returns = torch.zeros(2, 3)
    loss, _ = losses.value_loss(values, values, returns, mask, agg="seq-mean-token-mean")
    torch.testing.assert_close(loss, torch.tensor(((0.5 + 2.0) / 2 + 4.5) / 2))
    offsets, _, (fm, fv, fr) = padded_to_flat(mask, values, returns)
    flat, _ = losses.value_loss(fv, fv, fr, fm, agg="seq-mean-token-mean", offsets=offsets)
    torch.testing.assert_close(flat, loss)


# --------------------------------------------------------------------------- errors


def test_errors_name_the_problem():
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(InvalidOptionError, match="ratio='bogus'"):
        losses.policy_loss(x, x, x, mask, ratio="bogus")
    with pytest.raises(InvalidOptionError, match="turn_ratio"):
        losses.policy_loss(x, x, x, mask, turn_ratio="mean")
    with pytest.raises(InvalidOptionError, match="agg"):
        losses.policy_loss(x, x, x, mask, agg="sum")
    with pytest.raises(InvalidRolloutError, match="`advantages` has shape"):
        losses.policy_loss(x, x, torch.zeros(2, 4), mask)
    with pytest.raises(InvalidRolloutError, match="`mask` has shape"):
        losses.policy_loss(x, x, x, mask[:, :2])
    with pytest.raises(InvalidRolloutError, match="padded"):
        losses.policy_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 2, 3))
    with pytest.raises(InvalidRolloutError, match="log_prob"):
        losses.policy_loss(np.zeros((2, 3)), x, x, mask)
    with pytest.raises(InvalidRolloutError, match="floating"):
        losses.policy_loss(torch.zeros(2, 3, dtype=torch.long), x, x, mask)
    with pytest.raises(InvalidOptionError, match="dual_clip"):
        losses.policy_loss(x, x, x, mask, dual_clip=1.0)
    with pytest.raises(InvalidOptionError, match="clip_low"):
        losses.policy_loss(x, x, x, mask, clip_low=1.0)
    with pytest.raises(InvalidRolloutError, match="token_turn` is for flat"):
        losses.policy_loss(x, x, x, mask, token_turn=np.zeros(6, np.int32))
    flat = torch.zeros(6)
    fmask = torch.tensor([0, 1, 1, 0, 1, 1], dtype=torch.bool)
    with pytest.raises(InvalidRolloutError, match="need `token_turn`"):
        losses.policy_loss(flat, flat, flat, fmask)
    with pytest.raises(InvalidRolloutError, match="shape"):
        losses.policy_loss(flat, flat, flat, fmask, token_turn=np.array([-1, 0, 0, -1, 1], np.int32))
    with pytest.raises(InvalidRolloutError, match="below the token count"):
        losses.policy_loss(flat, flat, flat, fmask, token_turn=np.array([-1, 0, 0, -1, 7, 7], np.int32))
    with pytest.raises(InvalidRolloutError, match="disagree at token 3"):
        losses.policy_loss(flat, flat, flat, fmask, token_turn=np.array([-1, 0, 0, 0, 1, 1], np.int32))
    with pytest.raises(InvalidRolloutError, match="integer"):
        losses.policy_loss(flat, flat, flat, fmask, token_turn=np.zeros(6))
    with pytest.raises(InvalidRolloutError, match="offsets="):
        losses.policy_loss(flat, flat, flat, fmask, ratio="sequence")
    with pytest.raises(InvalidRolloutError, match="offsets="):
        losses.policy_loss(flat, flat, flat, fmask, ratio="token", agg="seq-mean-token-sum")
    with pytest.raises(InvalidRolloutError, match="offsets"):
        losses.policy_loss(flat, flat, flat, fmask, ratio="sequence", offsets=np.array([0, 3, 5]))
    with pytest.raises(InvalidRolloutError, match="offsets` is for flat"):
        losses.policy_loss(x, x, x, mask, offsets=np.array([0, 3, 6]))
    with pytest.raises(InvalidRolloutError, match="values"):
        losses.value_loss(np.zeros(3), x, x, mask)
    with pytest.raises(InvalidOptionError, match="clip"):
        losses.value_loss(x, x, x, mask, clip=0.0)


def test_import_mpo_rs_does_not_import_torch():
    code = "import sys, mpo_rs; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
