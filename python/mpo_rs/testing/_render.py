"""A counterexample in words: the batch drawn as turns, and expected against actual values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .strategies import Batch

MAX_ROWS = 16
"""Rows of the expected/actual table shown (the failing ones first)."""


def _num(x: float) -> str:
    return "nan" if x != x else f"{x:.6g}"


def _nums(xs: Any) -> str:
    return ", ".join(_num(float(x)) for x in xs)


def _runs(mask: npt.NDArray[np.bool_], lo: int, hi: int) -> list[tuple[bool, int, int]]:
    """The maximal runs of tokens lo:hi as (policy, start, end)."""
    out: list[tuple[bool, int, int]] = []
    q = lo
    while q < hi:
        start = q
        while q < hi and mask[q] == mask[start]:
            q += 1
        out.append((bool(mask[start]), start, q))
    return out


def draw_batch(b: Batch) -> list[str]:
    """The batch as lines: per trajectory, its observation spans and its turns with their
    values and rewards (flat token indices in brackets)."""
    n_tok = len(b.mask)
    lines = [f"batch: {b.n} trajector{'y' if b.n == 1 else 'ies'}, {n_tok} tokens ({int(b.mask.sum())} policy)"]
    for j in range(b.n):
        lo, hi = int(b.offsets[j]), int(b.offsets[j + 1])
        extras = []
        if b.group_ids is not None:
            extras += [f"score {_num(float(b.scores[j]))}", f"group {int(b.group_ids[j])}"]
        if b.truncated is not None and b.truncated[j]:
            extras.append("truncated")
        about = f" ({', '.join(extras)})" if extras else ""
        lines.append(f"  trajectory {j} [{lo}:{hi}]{about}" + ("" if hi > lo else ": empty"))
        turn = 0
        for policy, s, e in _runs(b.mask, lo, hi):
            if not policy:
                lines.append(f"    observation [{s}:{e}]")
                continue
            turn_reward = ""
            if b.turn_rewards is not None:
                turn_reward = f"  turn reward {_num(b.turn_rewards[j][turn])}"
            v = "" if b.group_ids is not None else f"  V = {_nums(b.values[s:e])}"
            lines.append(f"    turn {turn} [{s}:{e}]{v}  r = {_nums(b.rewards[s:e])}{turn_reward}")
            turn += 1
    return lines


def token_labels(b: Batch) -> list[str]:
    """A label per flat token: ``token q (trajectory j, turn t)``, or ``observation``."""
    labels = [""] * len(b.mask)
    for j in range(b.n):
        turn = -1
        lo, hi = int(b.offsets[j]), int(b.offsets[j + 1])
        for q in range(lo, hi):
            if b.mask[q] and (q == lo or not b.mask[q - 1]):
                turn += 1
            where = f"turn {turn}" if b.mask[q] else "observation"
            labels[q] = f"token {q} (trajectory {j}, {where})"
    return labels


def table(labels: Sequence[str], expected: Any, actual: Any, bad: Any) -> list[str]:
    """Expected against actual, one row per label, the failing rows first and marked."""
    order = [i for i in range(len(labels)) if bad[i]] + [i for i in range(len(labels)) if not bad[i]]
    width = max((len(labels[i]) for i in order), default=0)
    lines = [f"  {'':{width}}  {'expected':>12}  {'actual':>12}"]
    for i in order[:MAX_ROWS]:
        mark = "  <-- differs" if bad[i] else ""
        lines.append(f"  {labels[i]:{width}}  {_num(float(expected[i])):>12}  {_num(float(actual[i])):>12}{mark}")
    if len(order) > MAX_ROWS:
        lines.append(f"  ... and {len(order) - MAX_ROWS} more rows")
    return lines


def options_line(options: Mapping[str, Any]) -> str:
    """The options of the call, as ``name=value`` pairs."""
    return ", ".join(f"{k}={_num(v) if isinstance(v, float) else v}" for k, v in options.items()) or "(none)"
