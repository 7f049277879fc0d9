"""The executable spec: slow float64 estimators written from the formulas of docs/spec.md.

Each function here computes one estimator of docs/spec.md ("Estimators") the way the
page writes it: plain Python floats (float64), explicit sums instead of recurrences, one
trajectory at a time. It shares nothing with the Rust core but the formulas, so agreement
between the two is evidence that both follow the page. :mod:`mpo_rs.testing.invariants`
takes its expected values from here, and so can a user's own tests::

    from mpo_rs.testing import reference
    adv, ret = reference.gae(values, mask, offsets, rewards=rewards, gamma=0.99, lam=0.95)

The inputs are the flat batch of docs/spec.md ("Batch layout"): ``values`` and ``mask``
one per token, ``offsets`` N + 1 cuts, one reward source (``rewards`` per token,
``scores`` per trajectory or ``turn_rewards`` per turn). Outputs are lists of floats, one
per token (0 off-policy) or per turn. Slow by design (quadratic sums): meant for batches
of tens of tokens.

* :func:`segment` -- turns (maximal runs of policy tokens);
* :func:`mae` -- MAE, MPO's multiscale advantage ("MAE");
* :func:`gae` -- token GAE over policy tokens ("Token GAE");
* :func:`bilevel` -- RAGEN's bi-level GAE ("Turn-level estimators of other projects");
* :func:`group` -- GRPO, Dr. GRPO and RLOO ("Group baselines");
* :func:`gigpo` and :func:`verl_agent` -- GiGPO, and verl-agent's reading of it ("GiGPO").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ._reference_gigpo import GiGPOReference, gigpo, turns_of, verl_agent

__all__ = [
    "GiGPOReference",
    "RefTurns",
    "bilevel",
    "gae",
    "gigpo",
    "group",
    "is_close_list",
    "mae",
    "segment",
    "token_rewards",
    "turns_of",
    "verl_agent",
]


@dataclass
class RefTurns:
    """The segmentation of :func:`segment`, as lists (the fields of :class:`mpo_rs.Turns`)."""

    starts: list[int]
    ends: list[int]
    traj_offsets: list[int]
    token_turn: list[int]


def segment(mask: Sequence[Any], offsets: Sequence[Any]) -> RefTurns:
    """Turns: each maximal run of policy tokens inside a trajectory (docs/spec.md, "Batch layout")."""
    starts: list[int] = []
    ends: list[int] = []
    traj_offsets = [0]
    token_turn = [-1] * len(mask)
    for j in range(len(offsets) - 1):
        lo, hi = offsets[j], offsets[j + 1]
        q = lo
        while q < hi:
            if mask[q]:
                s = q
                while q < hi and mask[q]:
                    token_turn[q] = len(starts)
                    q += 1
                starts.append(s)
                ends.append(q)
            else:
                q += 1
        traj_offsets.append(len(starts))
    return RefTurns(starts, ends, traj_offsets, token_turn)


def token_rewards(
    mask: Sequence[Any], offsets: Sequence[Any], rewards: Any, scores: Any, turn_rewards: Any = None
) -> list[float]:
    """Token-level rewards; a score goes on its trajectory's last policy token, a turn
    reward (``turn_rewards[j][t]``) on the last token of turn t of trajectory j."""
    if rewards is not None:
        return [float(r) for r in rewards]
    out = [0.0] * len(mask)
    if turn_rewards is not None:
        turns = segment(mask, offsets)
        for j in range(len(offsets) - 1):
            ends = turns.ends[turns.traj_offsets[j] : turns.traj_offsets[j + 1]]
            assert len(ends) == len(turn_rewards[j])
            for end, r in zip(ends, turn_rewards[j], strict=True):
                out[end - 1] = float(r)
        return out
    for j in range(len(offsets) - 1):
        policy = [q for q in range(offsets[j], offsets[j + 1]) if mask[q]]
        if policy:
            out[policy[-1]] = float(scores[j])
    return out


def mae(
    values: Any,
    mask: Sequence[Any],
    offsets: Sequence[Any],
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    lam: float = 0.8,
    lam_intra: float = 0.95,
    beta: float = 1.0,
    gamma: float = 1.0,
    lam_critic: float = 1.0,
) -> tuple[list[float], list[float], list[float]]:
    """Returns (advantages, returns, turn_advantages) as lists of floats. A truncated
    trajectory's V_{T+1,1} is the value at its last policy token instead of 0."""
    r = token_rewards(mask, offsets, rewards, scores, turn_rewards)
    v = [float(x) for x in values]
    turns = segment(mask, offsets)
    n_tok = len(mask)
    adv = [0.0] * n_tok
    ret = [0.0] * n_tok
    turn_adv = [0.0] * len(turns.starts)
    for j in range(len(offsets) - 1):
        tids = list(range(turns.traj_offsets[j], turns.traj_offsets[j + 1]))
        toks = [list(range(turns.starts[t], turns.ends[t])) for t in tids]
        n = len(tids)

        end_v = v[toks[-1][-1]] if n and truncated is not None and truncated[j] else 0.0

        def first_v(k: int, toks: list[list[int]] = toks, n: int = n, end_v: float = end_v) -> float:
            return v[toks[k][0]] if k < n else end_v  # V_{k,1}; V_{T+1,1} = 0 or V_{T,L_T}

        # token residuals δ_{t,i}
        deltas = []
        for k in range(n):
            d: list[float] = []
            for i, q in enumerate(toks[k]):
                if i + 1 < len(toks[k]):
                    d.append(r[q] + v[toks[k][i + 1]] - v[q])
                else:
                    d.append(r[q] + gamma * first_v(k + 1) - v[q])
            deltas.append(d)
        # stage 1: δ^turn = R_t + γ V_{t+1,1} − V_{t,1};  A^turn_t = Σ_l (γλ)^l δ^turn_{t+l}
        d_turn = [sum(r[q] for q in toks[k]) + gamma * first_v(k + 1) - first_v(k) for k in range(n)]
        a_turn = [sum((gamma * lam) ** ell * d_turn[k + ell] for ell in range(n - k)) for k in range(n)]
        for k in range(n):
            turn_adv[tids[k]] = a_turn[k]
            L = len(toks[k])
            intra = [sum(lam_intra**m * deltas[k][i + m] for m in range(L - i)) for i in range(L)]
            mean = sum(intra) / L
            for i, q in enumerate(toks[k]):
                adv[q] = a_turn[k] + beta * (intra[i] - mean)
        # critic targets: C_q = δ_q + g_q λc C_{q+1} over the trajectory's policy tokens
        flat = [(q, deltas[k][i], i + 1 == len(toks[k])) for k in range(n) for i, q in enumerate(toks[k])]
        c = 0.0
        for q, dq, last in reversed(flat):
            c = dq + (gamma if last else 1.0) * lam_critic * c
            ret[q] = v[q] + c
    return adv, ret, turn_adv


def gae(
    values: Any,
    mask: Sequence[Any],
    offsets: Sequence[Any],
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    truncated: Any = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    lam_critic: float = 1.0,
    length_adaptive_alpha: float | None = None,
) -> tuple[list[float], list[float]]:
    """Token GAE over policy tokens as explicit sums: A_q = Σ_k (γλ)^k δ_{q+k}; a
    truncated trajectory's last token bootstraps from its own value instead of 0."""
    r = token_rewards(mask, offsets, rewards, scores, turn_rewards)
    v = [float(x) for x in values]
    adv = [0.0] * len(mask)
    ret = [0.0] * len(mask)
    for j in range(len(offsets) - 1):
        pol = [q for q in range(offsets[j], offsets[j + 1]) if mask[q]]
        n = len(pol)
        lam_j = lam
        if length_adaptive_alpha is not None:
            lam_j = min(1.0, max(0.0, 1.0 - 1.0 / (length_adaptive_alpha * max(n, 1))))
        end_v = v[pol[-1]] if n and truncated is not None and truncated[j] else 0.0
        deltas = [r[pol[i]] + gamma * (v[pol[i + 1]] if i + 1 < n else end_v) - v[pol[i]] for i in range(n)]
        for i in range(n):
            adv[pol[i]] = sum((gamma * lam_j) ** k * deltas[i + k] for k in range(n - i))
            ret[pol[i]] = v[pol[i]] + sum((gamma * lam_critic) ** k * deltas[i + k] for k in range(n - i))
    return adv, ret


def bilevel(
    values: Any,
    mask: Sequence[Any],
    offsets: Sequence[Any],
    *,
    rewards: Any = None,
    scores: Any = None,
    lam: float = 1.0,
    gamma: float = 1.0,
    high_level_gamma: float = 0.95,
) -> tuple[list[float], list[float], list[float]]:
    """RAGEN's bi-level GAE by its defining sums; returns (advantages, returns, turn_advantages).

    e_t is turn t's last token. High level: δ^hi_t = R_t + γ_hi V_{e_{t+1}} − V_{e_t},
    A^hi_t = Σ_l (γ_hi λ)^l δ^hi_{t+l}, G_t = A^hi_t + V_{e_t}. Low level inside turn t,
    with r' = G_t on e_t and 0 before it: δ_{t,i} = r'_{t,i} + γ V_{t,i+1} − V_{t,i}
    (V after e_t is 0), A_{t,i} = Σ_k (γλ)^k δ_{t,i+k}; returns = A + V.
    """
    r = token_rewards(mask, offsets, rewards, scores)
    v = [float(x) for x in values]
    turns = segment(mask, offsets)
    adv = [0.0] * len(mask)
    ret = [0.0] * len(mask)
    turn_adv = [0.0] * len(turns.starts)
    for j in range(len(offsets) - 1):
        tids = list(range(turns.traj_offsets[j], turns.traj_offsets[j + 1]))
        toks = [list(range(turns.starts[t], turns.ends[t])) for t in tids]
        n = len(tids)

        def end_v(k: int, toks: list[list[int]] = toks, n: int = n) -> float:  # V_{e_k}; 0 past the end
            return v[toks[k][-1]] if k < n else 0.0

        d_hi = [sum(r[q] for q in toks[k]) + high_level_gamma * end_v(k + 1) - end_v(k) for k in range(n)]
        for k in range(n):
            a_hi = sum((high_level_gamma * lam) ** ell * d_hi[k + ell] for ell in range(n - k))
            turn_adv[tids[k]] = a_hi
            g = a_hi + end_v(k)
            tk = toks[k]
            L = len(tk)
            deltas = [
                (g if i + 1 == L else 0.0) + gamma * (v[tk[i + 1]] if i + 1 < L else 0.0) - v[tk[i]] for i in range(L)
            ]
            for i, q in enumerate(tk):
                adv[q] = sum((gamma * lam) ** m * deltas[i + m] for m in range(L - i))
                ret[q] = adv[q] + v[q]
    return adv, ret, turn_adv


def group(
    scores: Sequence[Any],
    group_ids: Sequence[Hashable],
    *,
    norm_std: bool = True,
    eps: float = 1e-6,
    leave_one_out: bool = False,
) -> list[float]:
    """One advantage per trajectory: GRPO ((s − mean) / (unbiased std + eps)), Dr. GRPO
    (``norm_std=False``: s − mean) or RLOO (``leave_one_out``: s − mean of the others);
    a group of one gets 0."""
    members: dict[object, list[int]] = {}
    for j, g in enumerate(group_ids):
        members.setdefault(g, []).append(j)
    out = [0.0] * len(scores)
    for idx in members.values():
        if len(idx) < 2:
            continue
        s = [float(scores[j]) for j in idx]
        mean = statistics.fmean(s)
        std = statistics.stdev(s)
        for j, x in zip(idx, s, strict=True):
            if leave_one_out:
                out[j] = x - (sum(s) - x) / (len(s) - 1)
            elif norm_std:
                out[j] = (x - mean) / (std + eps)
            else:
                out[j] = x - mean
    return out


def is_close_list(a: Sequence[float], b: Sequence[float], rtol: float = 1e-5, atol: float = 1e-4) -> bool:
    """Whether two lists of floats have the same length and agree elementwise."""
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rtol, abs_tol=atol) for x, y in zip(a, b, strict=True))
