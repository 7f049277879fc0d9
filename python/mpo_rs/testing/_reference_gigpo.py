"""GiGPO's part of the executable spec (:mod:`mpo_rs.testing.reference` re-exports it):
written from the formulas of docs/spec.md ("GiGPO"), not from the kernel: dictionaries of
groups, float64, one trajectory at a time. Anchor states read from token ids are keyed by
the token tuples themselves (no hash), so a comparison also checks that the kernel's hash
merges exactly the equal histories."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GiGPOReference", "gigpo", "turns_of", "verl_agent"]


@dataclass
class GiGPOReference:
    """What :func:`gigpo` computes."""

    advantages: np.ndarray  # float64 per token
    episode: np.ndarray  # float64 per trajectory
    step: np.ndarray  # float64 per turn
    step_groups: np.ndarray  # int64 per turn
    turn_values: np.ndarray  # float64 per turn: A_E + w * A_S


def turns_of(mask: Any, lo: int, hi: int) -> list[tuple[int, int]]:
    """The turns (maximal runs of mask == 1) of tokens lo:hi, as flat (start, end)."""
    out: list[tuple[int, int]] = []
    q = lo
    while q < hi:
        if mask[q]:
            start = q
            while q < hi and mask[q]:
                q += 1
            out.append((start, q))
        else:
            q += 1
    return out


def _centred(x: float, members: list[float], norm_std: bool, eps: float) -> float:
    n = len(members)
    if n < 2:
        return 0.0
    mean = sum(members) / n
    if not norm_std:
        return x - mean
    std = math.sqrt(sum((m - mean) ** 2 for m in members) / (n - 1))
    return (x - mean) / (std + eps)


def _turn_rewards(
    turns: list[list[tuple[int, int]]], rewards: Any, scores: Any, turn_rewards: Any
) -> tuple[list[list[float]], list[float]]:
    """Per-turn rewards r_{j,t} (token rewards summed per turn, a score on the last turn, or
    given) and each trajectory's return R_j."""
    r: list[list[float]] = []
    ret: list[float] = []
    for j, own in enumerate(turns):
        if rewards is not None:
            r.append([sum(float(rewards[q]) for q in range(a, b)) for a, b in own])
            ret.append(sum(r[j]))
        elif scores is not None:
            r.append([0.0] * len(own))
            if own:
                r[j][-1] = float(scores[j])
            ret.append(float(scores[j]))
        else:
            r.append([float(x) for x in turn_rewards[j]])
            ret.append(sum(r[j]))
    return r, ret


def _states(
    turns: list[list[tuple[int, int]]], offsets: list[int], turn_state_ids: Any, token_ids: Any, anchor: str
) -> list[list[Any]]:
    """Anchor states s_{j,t}: the ids given, else the token tuples themselves (no hash)."""
    if turn_state_ids is not None:
        return [[int(s) for s in row] for row in turn_state_ids]
    states: list[list[Any]] = []
    for j, own in enumerate(turns):
        row: list[Any] = []
        for t, (a, _) in enumerate(own):
            since = offsets[j] if (anchor == "prefix" or t == 0) else own[t - 1][1]
            row.append(tuple(int(x) for x in token_ids[since:a]))
        states.append(row)
    return states


def gigpo(
    mask: Any,
    offsets: Any,
    group_ids: list[Any],
    *,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: list[list[float]] | None = None,
    turn_state_ids: list[list[int]] | None = None,
    token_ids: Any = None,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm_std: bool = False,
    eps: float = 1e-6,
    anchor: str = "observation",
) -> GiGPOReference:
    """GiGPO's advantages by its defining sums (docs/spec.md, "GiGPO")."""
    mask = np.asarray(mask, bool)
    offsets = [int(o) for o in offsets]
    n = len(offsets) - 1
    turns = [turns_of(mask, offsets[j], offsets[j + 1]) for j in range(n)]
    r, ret = _turn_rewards(turns, rewards, scores, turn_rewards)
    states = _states(turns, offsets, turn_state_ids, token_ids, anchor)
    # G_{j,t} = sum_{k >= t} gamma^(k - t) r_{j,k}
    g = [[sum(gamma ** (k - t) * r[j][k] for k in range(t, len(r[j]))) for t in range(len(r[j]))] for j in range(n)]
    # Episode groups in order of first appearance; each trajectory once.
    members: dict[Any, list[int]] = {}
    for j, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(j)
    episode = [0.0] * n
    for js in members.values():
        for j in js:
            episode[j] = _centred(ret[j], [ret[k] for k in js], norm_std, eps)
    # Step groups: (group, state); ids group by group, first appearance inside a group.
    first_turn = np.concatenate([[0], np.cumsum([len(t) for t in turns])]).astype(int)
    step = np.zeros(first_turn[-1])
    step_ids = np.zeros(first_turn[-1], np.int64)
    next_id = 0
    for js in members.values():
        sg: dict[Any, list[tuple[int, int]]] = {}
        for j in js:
            for t in range(len(turns[j])):
                sg.setdefault(states[j][t], []).append((j, t))
        for pairs in sg.values():
            values = [g[j][t] for j, t in pairs]
            for j, t in pairs:
                step[first_turn[j] + t] = _centred(g[j][t], values, norm_std, eps)
                step_ids[first_turn[j] + t] = next_id
            next_id += 1
    turn_values = np.zeros(first_turn[-1])
    adv = np.zeros(len(mask))
    for j in range(n):
        for t, (a, b) in enumerate(turns[j]):
            turn_values[first_turn[j] + t] = episode[j] + step_weight * step[first_turn[j] + t]
            adv[a:b] = turn_values[first_turn[j] + t]
    return GiGPOReference(adv, np.array(episode), step, step_ids, turn_values)


def verl_agent(
    step_rows: list[dict[str, Any]], gamma: float, mode: str, w: float = 1.0, eps: float = 1e-6, cross_all: bool = True
) -> list[float]:
    """verl-agent's GiGPO as its description reads (one row per *step*; every step row of a
    trajectory carries the episode's reward; step rewards are discounted per trajectory):
    the episode mean and std over the rows of an index (``cross_all``) or over its
    trajectories; a singleton index keeps its raw return (mean 0, std 1); step groups are
    the rows of an index with identical anchor observations (a singleton: mean itself).
    ``mode`` is ``mean_norm`` (no std) or ``mean_std_norm``. Returns one value per row."""
    divide = mode == "mean_std_norm"
    by_traj: dict[Any, list[int]] = {}
    for i, row in enumerate(step_rows):
        by_traj.setdefault(row["traj"], []).append(i)
    returns = [0.0] * len(step_rows)
    for rows in by_traj.values():
        running = 0.0
        for i in reversed(rows):
            running = step_rows[i]["reward"] + gamma * running
            returns[i] = running

    def norm(values: list[float], keys: list[Any], singleton_mean_is_self: bool) -> list[float]:
        by_key: dict[Any, list[float]] = {}
        for v, k in zip(values, keys, strict=True):
            by_key.setdefault(k, []).append(v)
        out: list[float] = []
        for v, k in zip(values, keys, strict=True):
            xs = by_key[k]
            if len(xs) == 1:
                mean, std = (xs[0] if singleton_mean_is_self else 0.0), 1.0
            else:
                mean = sum(xs) / len(xs)
                std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
            out.append((v - mean) / (std + eps) if divide else v - mean)
        return out

    index = [row["index"] for row in step_rows]
    if cross_all:
        episode = norm([row["episode_reward"] for row in step_rows], index, False)
    else:
        # One score per trajectory in the statistics, then every step row normalised.
        firsts = [rows[0] for rows in by_traj.values()]
        stats = norm([step_rows[i]["episode_reward"] for i in firsts], [index[i] for i in firsts], False)
        per_traj = {step_rows[i]["traj"]: s for i, s in zip(firsts, stats, strict=True)}
        episode = [per_traj[row["traj"]] for row in step_rows]
    step = norm(returns, [(row["index"], row["anchor_obs"]) for row in step_rows], True)
    return [e + w * s for e, s in zip(episode, step, strict=True)]
