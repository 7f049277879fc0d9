"""The design screens of docs/instrument.md, on the noisy oracle's exact values (no training).

``python docs/instrument/screens/screens.py frozen_lake`` prints, per FrozenLake setting and
demonstration noise eps, the oracle's success, the noisy oracle's success, the explained
variance of its exact values (the best any critic of the policy could do), the median
between-turn share, the share of GRPO groups of 4 whose outcomes differ, and the turns.
``... sokoban`` prints the same per Sokoban setting (sokoban_screen.log is its output), ``...
sokoban_shallow`` for shallow rooms (sokoban_shallow_screen.log), ``... coin_collector`` per Coin
Collector setting (coin_collector_screen.log), ``... coin_collector_spreads`` per spread of chain
length (coin_collector_spreads_screen.log).
``... key_door`` prints, per KeyDoor design and eps, the median between-turn share of the exact
values and of the reference critic's cross-fitted table (64 tasks x 16 rollouts).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from mpo_lab.envs import make
from mpo_lab.envs.premise import NoisyOracle, belief_model, exact_success, rollout, share_statistics
from mpo_lab.reproduce.reference import belief_keys, cross_fitted_values
from mpo_rs.diagnose import summarize_value_structure, value_structure

SOKOBAN_SETTINGS: list[dict[str, Any]] = [
    {},
    {"num_boxes": 2},
    {"size": 5},
    {"size": 5, "num_boxes": 2},
    {"max_turns": 6},
    {"max_turns": 15},
    {"max_turns": 15, "search_depth": 10},
    {"num_boxes": 2, "max_turns": 15},
]
"""Room 6x6 or 5x5, one box or two, budget 6/10/15 (the reverse play as deep as the budget,
or 10 with a budget of 15: the same rooms as the default with five turns to spare)."""

SOKOBAN_SHALLOW: list[dict[str, Any]] = [
    {"search_depth": 3, "max_turns": 6},
    {"search_depth": 4, "max_turns": 6},
    {"search_depth": 4, "max_turns": 8},
    {"search_depth": 5, "max_turns": 8},
    {"search_depth": 4, "max_turns": 10},
]
"""Rooms a clone might learn more easily: the reverse play 3-5 moves deep (boxes near their targets)."""

COIN_COLLECTOR_SETTINGS: list[dict[str, Any]] = [
    {},
    {"max_turns": 11},
    {"distractors": 2, "quest_length": 4, "max_turns": 10},
    {"length_choices": [2, 6], "max_turns": 10},
    {"length_choices": [2, 6], "max_turns": 12},
    {"length_choices": [3, 7], "max_turns": 12, "num_names": 14},
    {"length_choices": [2, 5, 8], "max_turns": 13, "num_names": 16},
    {"length_choices": [2, 4], "distractors": 2, "max_turns": 10},
]
"""TextWorld's chain of 5 rooms with one dead end each (levels 101-200), budgets 9 and 11; two dead
ends per room; and a spread of chain lengths shown in the prompt, as TextWorld's levels are."""

COIN_COLLECTOR_SPREADS: list[dict[str, Any]] = [
    {"length_choices": [2, 5], "max_turns": 9},
    {"length_choices": [3, 5], "max_turns": 9},
    {"length_choices": [3, 6], "max_turns": 10},
    {"length_choices": [2, 5], "distractors": 2, "max_turns": 11, "num_names": 15},
    {"length_choices": [3, 5], "distractors": 2, "max_turns": 11, "num_names": 15},
    {"length_choices": [2, 4], "distractors": 2, "max_turns": 9},
    {"length_choices": [2, 4], "distractors": 2, "max_turns": 10},
]
"""Spreads of chain length between the default's one difficulty (its clone's ceiling 0.24 in
iteration 24) and the wide spreads above (few GRPO groups whose outcomes differ)."""


def _rollouts(task: str, params: dict[str, Any], eps: float, n: int, group: int) -> list[Any]:
    env = make(task, **params)
    values = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(0)
    return [rollout(env, values, 10**6 + i // group, rng) for i in range(n)]


def _ev(values: np.ndarray, returns: np.ndarray) -> float:
    return float(1 - np.var(returns - values) / np.var(returns))


def noisy_oracle(task: str, settings: list[dict[str, Any]], eps_list: list[float]) -> None:
    for params in settings:
        env = make(task, **params)
        oracle = env.oracle_success() if hasattr(env, "oracle_success") else exact_success(env, 0.0, range(512))
        print("oracle", params, round(oracle, 3), flush=True)
        for eps in eps_list:
            rs = _rollouts(task, params, eps, 1024, 4)
            scores = np.array([r.score for r in rs])
            v = np.concatenate([np.array(r.values)[np.array(r.mask, bool)] for r in rs])
            g = np.concatenate([np.full(int(np.sum(r.mask)), r.score) for r in rs])
            groups = scores.reshape(-1, 4)
            out = {
                "params": params,
                "eps": eps,
                "success": round(float(scores.mean()), 3),
                "ev": round(_ev(v, g), 3),
                "share": round(share_statistics(rs)["median_between_share"], 3),
                "distinct": round(float(np.mean(groups.max(1) != groups.min(1))), 3),
                "turns": round(float(np.mean([r.turns for r in rs])), 3),
            }
            print(json.dumps(out), flush=True)


def key_door(designs: list[tuple[dict[str, Any], list[float]]]) -> None:
    group = 16
    for params, eps_list in designs:
        for eps in eps_list:
            rs = _rollouts("key_door", params, eps, 64 * group, group)
            env = make("key_door", **params)
            tokens = np.concatenate([r.tokens for r in rs]).astype(np.int64)
            mask = np.concatenate([r.mask for r in rs]).astype(bool)
            offsets = np.cumsum([0] + [len(r.tokens) for r in rs])
            exact = np.concatenate([np.asarray(r.values)[np.asarray(r.mask, bool)] for r in rs])
            scores = np.array([r.score for r in rs])
            per = np.repeat(np.arange(len(rs)), np.diff(offsets))[mask]
            fold = (np.arange(len(rs)) % group % 2)[per]
            table = cross_fitted_values(belief_keys(env, tokens, mask, offsets), scores[per], fold)
            shares = []
            for values in (exact, table):
                full = np.zeros(mask.size, np.float32)
                full[mask] = values
                summary = summarize_value_structure(value_structure(full, mask, offsets), outcome=scores)
                shares.append(round(summary["all"]["median_between_share"], 3))
            print(json.dumps({"params": params, "eps": eps, "exact": shares[0], "table": shares[1]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["frozen_lake"]:
        noisy_oracle(
            "frozen_lake",
            [
                {},
                {"success_rate": 0.8},
                {"success_rate": 0.9},
                {"slippery": False},
                {"success_rate": 0.8, "frozen_prob": 0.7},
                {"success_rate": 0.8, "size": 5, "max_turns": 14},
                {"success_rate": 0.8, "frozen_prob": 0.7, "size": 5, "max_turns": 14},
                {"frozen_prob": 0.7},
            ],
            [0.2, 0.35, 0.5],
        )
    elif sys.argv[1:] == ["key_door"]:
        key_door(
            [
                ({"max_turns": 2, "key_position": 8, "open_position": 8}, [0.4, 0.55, 0.7]),
                ({"max_turns": 3, "key_position": 8, "open_position": 8}, [0.4, 0.55, 0.7]),
                ({"max_turns": 2, "key_position": 12, "open_position": 4}, [0.4, 0.55, 0.7]),
                ({"max_turns": 2, "key_position": 8, "open_position": 8, "num_keys": 8, "vocab_size": 24}, [0.4, 0.7]),
                ({"max_turns": 2, "action_tokens": 8, "key_position": 4, "open_position": 4}, [0.4, 0.7]),
                ({"max_turns": 2, "key_position": 8, "open_position": 8, "max_noise": 0}, [0.4, 0.7]),
                (
                    {
                        "max_turns": 2,
                        "key_position": 8,
                        "open_position": 8,
                        "num_keys": 8,
                        "vocab_size": 24,
                        "key_rule": "sum",
                    },
                    [0.4, 0.5, 0.7],
                ),
            ]
        )
    elif sys.argv[1:] == ["sokoban"]:
        noisy_oracle("sokoban", SOKOBAN_SETTINGS, [0.1, 0.2, 0.3, 0.5])
    elif sys.argv[1:] == ["sokoban_shallow"]:
        noisy_oracle("sokoban", SOKOBAN_SHALLOW, [0.2, 0.3, 0.4, 0.5])
    elif sys.argv[1:] == ["coin_collector"]:
        noisy_oracle("coin_collector", COIN_COLLECTOR_SETTINGS, [0.2, 0.3, 0.4])
    elif sys.argv[1:] == ["coin_collector_spreads"]:
        noisy_oracle("coin_collector", COIN_COLLECTOR_SPREADS, [0.3, 0.4, 0.5])
    else:
        sys.exit("usage: screens.py frozen_lake|key_door|sokoban|sokoban_shallow|coin_collector|coin_collector_spreads")
