"""Does a task meet MPO's premise? Measured before any training, from exact values.

For each built-in task this computes, without training anything:

- the success of a uniformly random token policy (chance), of the oracle, and of a *noisy
  oracle* (the base-policy stand-in): each turn, with probability ``eps``, the oracle's
  action is replaced by a random one -- a uniformly drawn well-formed action or K uniformly
  drawn tokens, half and half (on KeyDoor and GuessNumber every action is well formed, so
  the replacement is K uniform tokens); ``eps`` is chosen so the noisy oracle succeeds
  ``TARGET_SUCCESS`` of the time;
- the exact value ``V(tokens < q)`` of the noisy oracle at every policy token ``q`` of its
  own rollouts (the project's convention, docs/losses.md): the expected return given
  everything before the token -- the observations so far (the critic's posterior over what
  is hidden: the answer, the chain, future hints and slips) and the policy's own tokens so
  far, including the earlier tokens of the same turn;
- on those values, the project's between-turn share (:func:`mpo_rs.diagnose.value_structure`
  and :func:`~mpo_rs.diagnose.summarize_value_structure`) and the share of the squared value increments
  between consecutive policy tokens that falls on turn boundaries (across an observation).

The values are exact, not estimated: each task has a *belief model* (:mod:`mpo_lab.envs.beliefs`: a small sufficient
state of what the history says, its transitions and its oracle) and the value is computed
by memoized recursion over it; the tests check each model against Monte-Carlo rollouts of
the real environment. Run ``mpo-lab premise`` (``--help`` for the options);
the table in docs/envs.md is its output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpo_rs.diagnose.summary import FAILURE, SUCCESS

from .beliefs import MALFORMED, Belief, BeliefModel, belief_model

__all__ = [
    "PREMISE_SHARE",
    "TARGET_SUCCESS",
    "TASKS",
    "NoisyOracle",
    "Rollout",
    "belief_model",
    "choose_eps",
    "measure",
    "measure_all",
    "play",
    "premise_verdict",
    "rollout",
    "token_arrays",
]

TARGET_SUCCESS = 0.2
"""The base policy's success the noise is set for (the paper's base models: 9-25%; FrozenLake's
random well-formed moves alone reach 0.17, which rules out a lower target)."""
TASKS = ("search", "multi_hop", "frozen_lake", "sokoban", "coin_collector", "guess_number", "key_door")
PREMISE_SHARE = 0.8
"""A task meets MPO's premise when its reference critic's median between-turn share of the
value variance is at least this."""


def premise_verdict(share: float | None) -> str:
    """``"holds"`` when ``share`` (a median between-turn share) meets :data:`PREMISE_SHARE`, else ``"fails"``."""
    return "holds" if share is not None and share >= PREMISE_SHARE else "fails"


# ---------------------------------------------------------------- exact values of the noisy oracle


class NoisyOracle:
    """The noisy oracle's exact values. Per turn: the oracle's action with probability
    ``1 - eps``; with ``eps * well_formed`` a uniformly drawn well-formed action; with
    ``eps * (1 - well_formed)`` K uniformly drawn tokens. ``NoisyOracle(model, 1.0, 0.0)`` is
    the uniformly random policy; ``eps = 0`` the oracle. Where every action is well formed
    (``model.W is None``) both replacements are K uniform tokens."""

    def __init__(self, model: BeliefModel, eps: float, well_formed: float = 0.5) -> None:
        self.model = model
        self.eps = float(eps)
        self.well_formed = 0.0 if model.W is None else float(well_formed)
        self._values: dict[Any, float] = {}
        self._q: dict[tuple[Belief, Any], float] = {}

    def value(self, b: Belief) -> float:
        """V(b): the expected return from a turn boundary."""
        key = self.model.key(b)
        cached = self._values.get(key)
        if cached is None:
            cached = self.prefix_value(b, ())
            self._values[key] = cached
        return cached

    def q(self, b: Belief, a: Any) -> float:
        """Q(b, a): the expected return of action ``a`` (see ``BeliefModel.outcomes``) from ``b``."""
        cached = self._q.get((b, a))
        if cached is None:
            cached = 0.0
            for p, r, done, nxt in self.model.outcomes(b, a):
                cached += p * (r if done or nxt is None else r + self.value(nxt))
            self._q[(b, a)] = cached
        return cached

    def prefix_value(self, b: Belief, prefix: Sequence[int]) -> float:
        """V(b, prefix): the expected return after the first ``len(prefix)`` tokens of the turn.
        The thinking tokens a turn opens with (``model.free``) leave it at the turn's value,
        unless one is not a thinking token (then the turn is malformed)."""
        m = self.model
        if m.free:
            if not m.thought_ok(prefix):
                return self.q(b, MALFORMED)
            prefix = prefix[m.free :]
        i = len(prefix)
        prefix = tuple(int(t) for t in prefix)
        star = m.oracle(b)
        w_oracle = (1.0 - self.eps) * (star[:i] == prefix)
        w_random = self.eps * (1.0 - self.well_formed) * float(m.V) ** -i
        if m.W is None:
            position = m.decisive(b)
            q_star = self.q(b, None if position is None else star[position])
            if position is None:
                c_random = q_star
            elif i > position:
                c_random = self.q(b, prefix[position])
            else:
                c_random = sum(self.q(b, g) for g in range(m.V)) / m.V
            total = w_oracle + w_random
            return (w_oracle * q_star + w_random * c_random) / total
        matching = [a for a in m.W if a[:i] == prefix]
        q_matching = [self.q(b, a) for a in matching]
        w_formed = self.eps * self.well_formed * len(matching) / len(m.W)
        rest = float(m.V) ** -(m.K - i)
        total = w_oracle + w_formed + w_random
        out = w_oracle * self.q(b, star) if w_oracle else 0.0
        if w_formed:
            out += w_formed * sum(q_matching) / len(matching)
        if w_random:
            out += w_random * (rest * sum(q_matching) + (1.0 - rest * len(matching)) * self.q(b, MALFORMED))
        return out / total

    def act(self, b: Belief, rng: np.random.Generator) -> tuple[int, ...]:
        """One turn: the thinking tokens (uniform over ``free_ids``, never noised), then the call."""
        m = self.model
        if m.free:
            thought = tuple(int(m.free_ids[j]) for j in rng.integers(len(m.free_ids), size=m.free))
            return thought + self._call(b, rng)
        return self._call(b, rng)

    def _call(self, b: Belief, rng: np.random.Generator) -> tuple[int, ...]:
        m = self.model
        if rng.random() >= self.eps:
            return m.oracle(b)
        if m.W is not None and rng.random() < self.well_formed:
            return m.W[int(rng.integers(len(m.W)))]
        return tuple(int(t) for t in rng.integers(m.V, size=m.K))


def exact_success(env: Any, eps: float, seeds: Sequence[int], well_formed: float = 0.5) -> float:
    """The noisy oracle's exact success rate averaged over ``seeds`` (eps=1, well_formed=0:
    the uniformly random policy; eps=0: the oracle)."""
    values = NoisyOracle(belief_model(env), eps, well_formed)
    return float(np.mean([values.value(values.model.initial(env.reset(s))) for s in seeds]))


def choose_eps(env: Any, seeds: Sequence[int], target: float = TARGET_SUCCESS) -> float:
    """The noise, to 0.01, whose exact success over ``seeds`` is nearest ``target`` (bisection;
    success falls as eps grows)."""
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if exact_success(env, mid, seeds) > target:
            lo = mid
        else:
            hi = mid
    grid = sorted({math.floor(lo * 100) / 100, math.ceil(hi * 100) / 100})
    return min(grid, key=lambda e: abs(exact_success(env, e, seeds) - target))


# ---------------------------------------------------------------- rollouts and the statistic


@dataclass
class Rollout:
    """One noisy-oracle episode with the exact value before each policy token."""

    tokens: list[int]
    mask: list[int]
    values: list[float]
    score: float
    turns: int


def rollout(env: Any, values: NoisyOracle, seed: int, rng: np.random.Generator) -> Rollout:
    """Play the noisy oracle on the real environment from ``seed``; the values come from the
    belief model, updated with the real observations."""
    m = values.model
    observation = env.reset(seed)
    b = m.initial(observation)
    tokens, mask, vals = list(observation), [0] * len(observation), [0.0] * len(observation)
    score, turns = 0.0, 0
    for _ in range(m.T):
        action = values.act(b, rng)
        for i, token in enumerate(action):
            tokens.append(token)
            mask.append(1)
            vals.append(values.prefix_value(b, action[:i]))
        observation, reward, done = env.step(list(action))
        score += reward
        turns += 1
        tokens.extend(observation)
        mask.extend([0] * len(observation))
        vals.extend([0.0] * len(observation))
        if done:
            break
        b = m.update(b, action, observation)
    return Rollout(tokens, mask, vals, score, turns)


def play(env: Any, values: NoisyOracle, seed: int, rng: np.random.Generator) -> float:
    """The score of one noisy-oracle episode on the real environment (no values computed)."""
    m = values.model
    b = m.initial(env.reset(seed))
    for _ in range(m.T):
        action = values.act(b, rng)
        observation, reward, done = env.step(list(action))
        if done:
            return float(reward)
        b = m.update(b, action, observation)
    return 0.0


def token_arrays(rollouts: Sequence[Rollout]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values float32, mask uint8, offsets int64) of the rollouts, concatenated."""
    offsets = np.cumsum([0] + [len(r.tokens) for r in rollouts]).astype(np.int64)
    values = np.concatenate([np.asarray(r.values, dtype=np.float32) for r in rollouts])
    mask = np.concatenate([np.asarray(r.mask, dtype=np.uint8) for r in rollouts])
    return values, mask, offsets


def boundary_fraction(rollout: Rollout) -> float:
    """Of the squared value changes between consecutive policy tokens, the fraction across
    turn boundaries (an observation in between); NaN if the values never change."""
    positions = [q for q, m in enumerate(rollout.mask) if m]
    at, total = 0.0, 0.0
    for a, b in itertools.pairwise(positions):
        change = (rollout.values[b] - rollout.values[a]) ** 2
        total += change
        if b != a + 1:
            at += change
    return at / total if total > 0 else math.nan


def largest_change_at_boundary(rollout: Rollout) -> bool | None:
    """Whether the largest change between consecutive policy tokens crosses a turn
    boundary; None if the values never change."""
    positions = [q for q, m in enumerate(rollout.mask) if m]
    steps = [(abs(rollout.values[b] - rollout.values[a]), b != a + 1) for a, b in itertools.pairwise(positions)]
    if not steps or max(s for s, _ in steps) == 0:
        return None
    return max(steps)[1]


def share_statistics(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The project's between-turn statistic on the rollouts' values, and where the jumps are."""
    from mpo_rs.diagnose import summarize_value_structure as summarize
    from mpo_rs.diagnose import value_structure

    values, mask, offsets = token_arrays(rollouts)
    vs = value_structure(values, mask, offsets)
    summary = summarize(vs, outcome=np.array([r.score for r in rollouts]))
    fractions = np.array([boundary_fraction(r) for r in rollouts])
    kept = fractions[np.isfinite(fractions)]
    largest = [x for x in (largest_change_at_boundary(r) for r in rollouts) if x is not None]
    return {
        "summary": summary,
        "median_between_share": summary["all"]["median_between_share"],
        "fraction_between_gt_within": summary["all"]["fraction_between_gt_within"],
        "median_abs_jump": summary["all"]["median_abs_jump"],
        "median_boundary_fraction": float(np.median(kept)) if kept.size else None,
        "largest_change_at_boundary": float(np.mean(largest)) if largest else None,
        "median_between_share_success": summary["by_outcome"][SUCCESS]["median_between_share"],
        "median_between_share_failure": summary["by_outcome"][FAILURE]["median_between_share"],
    }


# ---------------------------------------------------------------- the measurement


def measure(
    name: str,
    *,
    exact_seeds: int = 512,
    rollouts: int = 1024,
    seed: int = 0,
    eps: float | None = None,
    target: float = TARGET_SUCCESS,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Chance, oracle and noisy-oracle success and the between-turn statistics of ``name``
    (default parameters). Exact values average over seeds ``0 .. exact_seeds-1``; the
    rollouts use seeds ``10**6 + i`` and ``numpy.random.default_rng(seed)`` for the noise."""
    from . import make

    env = make(name, **(params or {}))
    seeds = range(exact_seeds)
    eps = choose_eps(env, seeds, target) if eps is None else eps
    values = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(seed)
    played = [rollout(env, values, 10**6 + i, rng) for i in range(rollouts)]
    stats = share_statistics(played)
    return {
        "task": name,
        "env": repr(env),
        "turns": env.max_turns,
        "action_tokens": env.action_tokens,
        "vocab_size": env.vocab_size,
        "chance_success": exact_success(env, 1.0, seeds, well_formed=0.0),
        "chance_success_formula": float(env.chance_success()),
        "oracle_success": exact_success(env, 0.0, seeds),
        "eps": eps,
        "base_success": exact_success(env, eps, seeds),
        "base_success_rollouts": float(np.mean([r.score for r in played])),
        "mean_turns_rollouts": float(np.mean([r.turns for r in played])),
        "exact_seeds": exact_seeds,
        "rollouts": rollouts,
        "rng_seed": seed,
        **{k: v for k, v in stats.items() if k != "summary"},
        "trajectories_kept": stats["summary"]["all"]["trajectories"],
    }


def measure_all(**kwargs: Any) -> list[dict[str, Any]]:
    return [measure(name, **kwargs) for name in TASKS]


def table(results: Sequence[dict[str, Any]]) -> str:
    """The results as the Markdown table of docs/envs.md."""

    def f(x: Any, digits: int = 3) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [
        "| task | turns × tokens | chance | oracle | eps | base (exact) | base (rollouts) "
        "| median between-turn share | (successes / failures) | between > within | boundary share of ΔV² "
        "| largest step at a boundary | premise |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        share = r["median_between_share"]
        verdict = premise_verdict(share)
        lines.append(
            f"| `{r['task']}` | {r['turns']} × {r['action_tokens']} | {r['chance_success']:.2g} | "
            f"{f(r['oracle_success'])} | {r['eps']:.2f} | {f(r['base_success'])} | "
            f"{f(r['base_success_rollouts'])} | **{f(share)}** | {f(r['median_between_share_success'], 2)} / "
            f"{f(r['median_between_share_failure'], 2)} | {f(r['fraction_between_gt_within'])} | "
            f"{f(r['median_boundary_fraction'])} | {f(r['largest_change_at_boundary'])} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "mpo-lab premise") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Measure each built-in task's premise (chance, oracle and base success; between-turn share of "
        "the exact values of a noisy oracle) before any training.",
    )
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated registry names")
    parser.add_argument("--exact-seeds", type=int, default=512, help="seeds 0..N-1 for the exact success rates")
    parser.add_argument("--rollouts", type=int, default=1024, help="noisy-oracle rollouts (seeds 10**6 + i)")
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the rollouts' noise")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    unknown = [name for name in args.tasks.split(",") if name not in TASKS]
    if unknown:
        parser.error(f"--tasks: no belief model for {', '.join(unknown)}; known: {', '.join(TASKS)}")
    results = [
        measure(name, exact_seeds=args.exact_seeds, rollouts=args.rollouts, seed=args.seed)
        for name in args.tasks.split(",")
    ]
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
            handle.write("\n")
    return 0
