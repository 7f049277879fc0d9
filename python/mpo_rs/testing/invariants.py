"""The invariants of docs/spec.md as named checks any advantage function can be put to.

Each :class:`Invariant` checks one property on one batch: it calls the function under test
(a :data:`Subject`: the function bound to its convention, see
:mod:`mpo_rs.testing.conventions`) once or a few times and raises
:class:`InvariantViolation` -- the invariant, its spec section, the batch drawn as turns and
the expected against the actual values -- when the property does not hold. Hypothesis
(:func:`mpo_rs.testing.check_advantages`, or a test's ``@given``) draws the batches and
shrinks a failure to a small one. :data:`INVARIANTS` lists them by name; which apply to an
estimator is its :class:`~mpo_rs.testing.estimators.EstimatorSpec`'s ``invariants``
(:data:`~mpo_rs.testing.estimators.ESTIMATORS`, re-exported here).

Expected values come from :mod:`mpo_rs.testing.reference` (float64, from the formulas).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _native
from .._deps import needs
from . import _render, reference
from .conventions import Layout, Outcome
from .estimators import ESTIMATORS, EstimatorSpec
from .strategies import Batch, Draw, grid

with needs("mpo_rs.testing.invariants", "testing"):
    from hypothesis import assume
    from hypothesis import strategies as st

__all__ = [
    "ESTIMATORS",
    "INVARIANTS",
    "EstimatorSpec",
    "Invariant",
    "InvariantViolation",
    "Subject",
    "Tolerance",
    "insert_observations",
    "take",
]

F64 = npt.NDArray[np.float64]
Subject = Callable[[Batch, Mapping[str, Any], Layout], Outcome]
"""The function under test bound to its convention: ``(batch, options, layout) -> Outcome``."""

SPEC = "docs/spec.md"


@dataclass(frozen=True)
class Tolerance:
    """Two numbers agree when ``|a − b| <= atol + rtol · |b|`` (float32 functions against
    float64 references)."""

    rtol: float = 1e-4
    atol: float = 1e-3


class InvariantViolation(AssertionError):
    """An invariant failed on a batch; the message draws the batch and the values."""

    def __init__(self, invariant: str, section: str, message: str) -> None:
        super().__init__(message)
        self.invariant = invariant
        self.section = section


@dataclass(frozen=True)
class Context:
    """What a check gets besides the batch and the options."""

    subject: Subject
    estimator: EstimatorSpec
    draw: Draw
    tolerance: Tolerance
    invariant: Invariant


@dataclass(frozen=True)
class Invariant:
    """A named property with its spec section and its check."""

    name: str
    section: str
    doc: str
    check: Callable[[Context, Batch, dict[str, Any]], None]


# --- the reference's values ---------------------------------------------------------------


def _ref(b: Batch, est: EstimatorSpec, opts: Mapping[str, Any]) -> tuple[F64, F64 | None]:
    """The reference's (advantages per token, turn advantages or None) for ``est``."""
    mask, offsets = b.mask.tolist(), b.offsets.tolist()
    values = np.nan_to_num(b.values)
    if est.kind == "group":
        assert b.group_ids is not None
        leave_one_out, norm_std = est.name == "rloo", est.name == "grpo"
        per = reference.group(b.scores.tolist(), b.group_ids.tolist(), norm_std=norm_std, leave_one_out=leave_one_out)
        return np.where(b.mask, np.repeat(np.array(per, dtype=np.float64), np.diff(b.offsets)), 0.0), None
    if est.name == "reinforce":  # the discounted return: token GAE without values, λ = 1
        adv, _ = reference.gae(np.zeros_like(values), mask, offsets, rewards=b.rewards, gamma=opts["gamma"], lam=1.0)
        return np.array(adv), None
    if est.kind == "token":
        adv, _ = reference.gae(values, mask, offsets, rewards=b.rewards, **opts)
        return np.array(adv), None
    adv, _, turn = reference.mae(values, mask, offsets, rewards=b.rewards, **opts)
    return np.array(adv), np.array(turn)


def _turns(b: Batch) -> reference.RefTurns:
    return reference.segment(b.mask.tolist(), b.offsets.tolist())


def _fail(ctx: Context, b: Batch, opts: Mapping[str, Any], what: str, body: list[str]) -> InvariantViolation:
    inv = ctx.invariant
    lines = [f"{inv.name} ({SPEC}, {inv.section}) failed: {what}", f"options: {_render.options_line(opts)}"]
    return InvariantViolation(inv.name, inv.section, "\n".join([*lines, *_render.draw_batch(b), *body]))


def _compare(
    ctx: Context,
    b: Batch,
    opts: Mapping[str, Any],
    what: str,
    labels: Sequence[str],
    expected: Any,
    actual: Any,
    exact: bool = False,
) -> None:
    exp, act = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if exact:
        bad = ~((exp == act) | (np.isnan(exp) & np.isnan(act)))
    else:
        tol = ctx.tolerance
        bad = ~(np.abs(exp - act) <= tol.atol + tol.rtol * np.abs(exp))
    if bad.any():
        raise _fail(ctx, b, opts, what, _render.table(labels, exp, act, bad))


def _on_policy(ctx: Context, b: Batch, opts: Mapping[str, Any], what: str, expected: Any, actual: Any) -> None:
    """Compares per-token arrays on the policy tokens (a trainer's values off-policy are its own)."""
    pol = np.flatnonzero(b.mask)
    labels = _render.token_labels(b)
    _compare(ctx, b, opts, what, [labels[q] for q in pol], np.asarray(expected)[pol], np.asarray(actual)[pol])


def _turn_means(adv: F64, turns: reference.RefTurns) -> F64:
    return np.array([adv[s:e].mean() for s, e in zip(turns.starts, turns.ends, strict=True)], dtype=np.float64)


def _turn_labels(b: Batch, turns: reference.RefTurns) -> list[str]:
    labels = []
    for j in range(b.n):
        for t, k in enumerate(range(turns.traj_offsets[j], turns.traj_offsets[j + 1])):
            labels.append(f"trajectory {j}, turn {t} [{turns.starts[k]}:{turns.ends[k]}]")
    return labels


def _call(ctx: Context, b: Batch, opts: Mapping[str, Any], layout: Layout | None = None) -> Outcome:
    return ctx.subject(b, opts, layout or Layout())


# --- batch transformations ----------------------------------------------------------------


def take(b: Batch, order: Sequence[int]) -> tuple[Batch, npt.NDArray[np.int64]]:
    """The trajectories of ``b`` in ``order``, and each new token's old flat index."""
    idx = [np.arange(b.offsets[j], b.offsets[j + 1]) for j in order]
    flat = np.concatenate([*idx, np.array([], np.int64)]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in idx])]).astype(np.int64)
    pick = list(order)
    out = Batch(
        b.values[flat],
        b.mask[flat],
        offsets,
        b.rewards[flat],
        b.scores[pick],
        None if b.turn_rewards is None else [b.turn_rewards[j] for j in pick],
        None if b.truncated is None else b.truncated[pick],
        None if b.group_ids is None else b.group_ids[pick],
        None if b.turn_state_ids is None else [b.turn_state_ids[j] for j in pick],
    )
    return out, flat


def insert_observations(b: Batch, where: Sequence[int], lengths: Sequence[int]) -> tuple[Batch, npt.NDArray[np.int64]]:
    """Observation runs inserted before flat tokens ``where`` (each inside the trajectory
    the token starts or belongs to); returns the batch and each old token's new index."""
    new_pos = np.arange(len(b.mask), dtype=np.int64)
    for w, n in zip(where, lengths, strict=True):
        new_pos[w:] += n
    total = len(b.mask) + sum(lengths)
    mask = np.zeros(total, bool)
    values = np.full(total, np.nan, np.float32)
    rewards = np.zeros(total, np.float32)
    mask[new_pos], values[new_pos], rewards[new_pos] = b.mask, b.values, b.rewards
    offsets = b.offsets.copy()
    for w, n in zip(where, lengths, strict=True):
        offsets[np.searchsorted(b.offsets, w, side="right") :] += n
    return replace(b, values=values, mask=mask, offsets=offsets, rewards=rewards), new_pos


def _zero_values(b: Batch) -> Batch:
    return replace(b, values=np.where(b.mask, np.float32(0), np.float32(np.nan)).astype(np.float32))


# --- the checks ---------------------------------------------------------------------------


def _check_reference(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    expected, _ = _ref(b, ctx.estimator, opts)
    _on_policy(
        ctx,
        b,
        opts,
        f"the advantages differ from the reference's {ctx.estimator.name}",
        expected,
        _call(ctx, b, opts).advantages,
    )


def _check_turn_mean(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    out = _call(ctx, b, opts)
    turns = _turns(b)
    expected = out.turn_advantages if out.turn_advantages is not None else _ref(b, ctx.estimator, opts)[1]
    what = "a turn's token advantages do not average to its turn advantage A_t^turn"
    _compare(ctx, b, opts, what, _turn_labels(b, turns), expected, _turn_means(out.advantages, turns))


def _check_beta_zero(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    opts = ctx.estimator.set(opts, beta=0.0)
    turns = _turns(b)
    out = _call(ctx, b, opts)
    # The function's own turn advantages when it returns them (then bitwise), else the reference's.
    turn_adv = out.turn_advantages if out.turn_advantages is not None else _ref(b, ctx.estimator, opts)[1]
    assert turn_adv is not None
    expected = np.zeros(len(b.mask))
    for k, (s, e) in enumerate(zip(turns.starts, turns.ends, strict=True)):
        expected[s:e] = turn_adv[k]
    what = "with β = 0 every token of a turn should carry the turn advantage A_t^turn"
    _on_policy(ctx, b, opts, what, expected, out.advantages)


def _check_observations(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    m, starts = b.mask, set(b.offsets[:-1].tolist())
    # Token GAE skips observations anywhere; a turn-level estimator would see two turns
    # where an observation cuts one, so they go only where none is cut.
    anywhere = ctx.estimator.kind == "token"
    allowed = [q for q in range(len(m)) if anywhere or q in starts or not m[q] or not m[q - 1]]
    assume(allowed)
    where = ctx.draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=3, unique=True))
    lengths = ctx.draw(st.lists(st.integers(1, 4), min_size=len(where), max_size=len(where)))
    b2, pos = insert_observations(b, sorted(where), [n for _, n in sorted(zip(where, lengths, strict=True))])
    before, after = _call(ctx, b, opts).advantages, _call(ctx, b2, opts).advantages
    spans = ", ".join(f"{n} before token {w}" for w, n in sorted(zip(where, lengths, strict=True)))
    what = f"inserting observation tokens ({spans}) changed the policy tokens' advantages (expected: before, actual: after)"
    _on_policy(ctx, b, opts, what, before, after[pos])


def _check_masked_values(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    off = int((~b.mask).sum())
    fills = [np.array(ctx.draw(st.lists(grid, min_size=off, max_size=off)), np.float32) for _ in range(2)]
    outs = []
    for k, fill in enumerate(fills):
        values = b.values.copy()
        values[~b.mask] = fill
        outs.append(_call(ctx, replace(b, values=values), opts, Layout(fill=float(k * 3 - 1))).advantages)
    what = "changing the values on non-policy tokens and padding changed the advantages"
    _on_policy(ctx, b, opts, what, outs[0], outs[1])


def _check_padding(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    side = ctx.draw(st.sampled_from(["right", "left"]))
    extra = ctx.draw(st.integers(0, 3))
    empty = ctx.draw(st.lists(st.integers(0, b.n), max_size=2))
    # Empty trajectories (rows of padding only), each with a group of its own.
    offsets, ids, scores = list(b.offsets), None if b.group_ids is None else list(b.group_ids), list(b.scores)
    fresh = 1 + (max(ids) if ids else 0)
    for k, j in enumerate(sorted(empty, reverse=True)):
        offsets.insert(j, offsets[j])
        scores.insert(j, 0.0)
        if ids is not None:
            ids.insert(j, fresh + k)
    b2 = replace(
        b,
        offsets=np.array(offsets, np.int64),
        scores=np.array(scores, np.float32),
        group_ids=None if ids is None else np.array(ids, np.int64),
        turn_rewards=None,
        truncated=None,
        turn_state_ids=None,
    )
    before = _call(ctx, b, opts).advantages
    after = _call(ctx, b2, opts, Layout(side=side, extra=extra)).advantages
    what = f"{side} padding with {extra} extra columns and {len(empty)} empty rows changed the advantages"
    _on_policy(ctx, b, opts, what, before, after)


def _check_permutation(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    order = ctx.draw(st.permutations(list(range(b.n))))
    b2, old = take(b, order)
    out = _call(ctx, b2, opts).advantages
    back = np.zeros(len(b.mask))
    back[old] = out
    what = f"reordering the trajectories as {list(order)} did not reorder the advantages"
    _on_policy(ctx, b, opts, what, _call(ctx, b, opts).advantages, back)


def _check_translation(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    assert b.group_ids is not None
    # A group can be shifted when each member has a policy token to carry its score (a
    # padded trainer's score is its row's reward sum).
    has_policy = np.array([b.mask[b.offsets[j] : b.offsets[j + 1]].any() for j in range(b.n)], dtype=bool)
    shiftable = sorted(int(g) for g in np.unique(b.group_ids) if has_policy[b.group_ids == g].all())
    assume(shiftable)
    g = ctx.draw(st.sampled_from(shiftable))
    c = ctx.draw(grid.filter(lambda x: x != 0))
    members = np.flatnonzero(b.group_ids == g)
    scores, rewards = b.scores.copy(), b.rewards.copy()
    for j in members:
        scores[j] += c
        last = b.offsets[j] + np.flatnonzero(b.mask[b.offsets[j] : b.offsets[j + 1]])[-1]
        rewards[last] += c
    b2 = replace(b, scores=scores, rewards=rewards)
    what = f"adding {c:g} to every score of group {g} changed the advantages"
    _on_policy(ctx, b, opts, what, _call(ctx, b, opts).advantages, _call(ctx, b2, opts).advantages)


def _returns_to_go(b: Batch, gamma: float, per_turn: bool) -> F64:
    """Σ_k γ^k r over the policy tokens from each token on (``per_turn``: γ once per turn,
    each turn's rewards summed), per policy token; 0 elsewhere."""
    out = np.zeros(len(b.mask))
    turns = _turns(b)
    for j in range(b.n):
        ks = range(turns.traj_offsets[j], turns.traj_offsets[j + 1])
        if per_turn:
            g = 0.0
            for k in reversed(ks):
                g = float(np.sum(b.rewards[turns.starts[k] : turns.ends[k]], dtype=np.float64)) + gamma * g
                out[turns.starts[k] : turns.ends[k]] = g
        else:
            g = 0.0
            for q in reversed([q for k in ks for q in range(turns.starts[k], turns.ends[k])]):
                g = float(b.rewards[q]) + gamma * g
                out[q] = g
    return out


def _expect_returns(ctx: Context, b: Batch, opts: dict[str, Any], what: str, subtract_values: bool) -> None:
    """λ = 1 (β = 0 for a turn-level estimator): A = G − V (token GAE per token, MAE per turn)."""
    gamma = float(opts.get("gamma", 1.0))
    per_turn = ctx.estimator.kind == "turn"
    g = _returns_to_go(b, gamma, per_turn)
    out = _call(ctx, b, opts).advantages
    turns = _turns(b)
    if per_turn:
        v_first = np.nan_to_num(b.values[turns.starts]).astype(np.float64) if subtract_values else 0.0
        expected = g[turns.starts] - v_first
        _compare(ctx, b, opts, what, _turn_labels(b, turns), expected, _turn_means(out, turns))
    else:
        expected = g - (np.nan_to_num(b.values).astype(np.float64) if subtract_values else 0.0)
        _on_policy(ctx, b, opts, what, expected, out)


def _check_telescoping(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    opts = ctx.estimator.set(opts, lam=1.0)
    what = "with λ = 1 the advantage should be the discounted return minus the value (A = G − V)"
    _expect_returns(ctx, b, opts, what, subtract_values=True)


def _check_terminal(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    rewards = np.zeros_like(b.rewards)
    for j in range(b.n):
        pol = np.flatnonzero(b.mask[b.offsets[j] : b.offsets[j + 1]])
        if pol.size:
            rewards[b.offsets[j] + pol[-1]] = b.scores[j]
    b2 = replace(_zero_values(b), rewards=rewards)
    opts = ctx.estimator.set(opts, lam=1.0, beta=0.0)
    what = "with zero values and λ = 1 the terminal reward should reach every earlier token, discounted by γ per step"
    _expect_returns(ctx, b2, opts, what, subtract_values=False)


def _check_turn_rewards(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    turn_rewards = b.turn_rewards or [[1.0] * k for k in b.turn_counts()]
    b2 = _zero_values(replace(b, turn_rewards=turn_rewards).with_turn_rewards_as_tokens())
    opts = ctx.estimator.set(opts, lam=1.0, beta=0.0)
    what = "a turn's reward, on its last token, should count for that turn and the ones before it, not later ones"
    _expect_returns(ctx, b2, opts, what, subtract_values=False)


def _check_threads(ctx: Context, b: Batch, opts: dict[str, Any]) -> None:
    runs = []
    previous = _native.get_num_threads()
    torch = sys.modules.get("torch")
    torch_previous = torch.get_num_threads() if torch is not None else None
    try:
        for threads in (1, max(2, os.cpu_count() or 2)):
            _native.set_num_threads(threads)
            if torch is not None:
                torch.set_num_threads(threads)
            runs.append(_call(ctx, b, opts).advantages)
    finally:
        _native.set_num_threads(previous)
        if torch is not None:
            torch.set_num_threads(torch_previous)
    labels = _render.token_labels(b)
    _compare(
        ctx,
        b,
        opts,
        "the advantages differ between 1 thread and several (expected: 1 thread)",
        labels,
        runs[0],
        runs[1],
        exact=True,
    )


INVARIANTS: dict[str, Invariant] = {
    inv.name: inv
    for inv in [
        Invariant(
            "reference",
            "Estimators",
            "The advantages agree with the float64 reference written from the formulas (mpo_rs.testing.reference), to the tolerance.",
            _check_reference,
        ),
        Invariant(
            "turn-mean",
            "MAE: multiscale advantage estimation (MPO)",
            "MAE preserves the turn mean: a turn's token advantages average to A_t^turn, whatever β.",
            _check_turn_mean,
        ),
        Invariant(
            "beta-zero-broadcast",
            "MAE: multiscale advantage estimation (MPO)",
            "With β = 0 every token of a turn carries A_t^turn: no turn is skipped, none gets another's value.",
            _check_beta_zero,
        ),
        Invariant(
            "observation-transparency",
            "Invariants (held by property tests)",
            "Observation tokens carry credit through and never reset it: inserting or lengthening observation spans (where no turn is cut in two) changes no policy token's advantage.",
            _check_observations,
        ),
        Invariant(
            "masked-value-independence",
            "Batch layout",
            "Values on non-policy tokens and padding are never read: changing them changes nothing.",
            _check_masked_values,
        ),
        Invariant(
            "padding-invariance",
            "Batch layout",
            "Left or right padding, extra padding columns and empty rows change no advantage.",
            _check_padding,
        ),
        Invariant(
            "permutation-equivariance",
            "Invariants (held by property tests)",
            "Trajectories do not interact: reordering the batch reorders the advantages.",
            _check_permutation,
        ),
        Invariant(
            "group-translation",
            "Group baselines (no critic)",
            "Adding a constant to every score of a group leaves the group's advantages unchanged.",
            _check_translation,
        ),
        Invariant(
            "telescoping",
            "Invariants (held by property tests)",
            "With λ = 1 the residuals telescope: A = G − V (token GAE per token, γ per token; MAE per turn, γ per turn, against the turn's first value).",
            _check_telescoping,
        ),
        Invariant(
            "terminal-reward",
            "Token GAE (the PPO baseline, verl's multi-turn convention)",
            "With zero values and λ = 1 a terminal reward reaches every earlier policy token, discounted by γ per policy token (per turn for MAE) and never across observation spans.",
            _check_terminal,
        ),
        Invariant(
            "turn-reward-placement",
            "MAE: multiscale advantage estimation (MPO)",
            "A per-turn reward placed on its turn's last token counts for that turn and earlier ones: the advantage is the discounted sum of the rewards from the turn on.",
            _check_turn_rewards,
        ),
        Invariant(
            "thread-determinism",
            "Invariants (held by property tests)",
            "The advantages are bitwise the same on one thread and on several.",
            _check_threads,
        ),
    ]
}
"""Every invariant by name."""
