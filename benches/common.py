"""Shared pieces of the benchmarks: the realistic batch, a timer, the machine line."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class RolloutBatch:
    """N multi-turn trajectories, flat + offsets, and the same batch padded (B, L)."""

    values: np.ndarray  # float32[T]
    mask: np.ndarray  # bool[T]
    offsets: np.ndarray  # int64[N+1]
    rewards: np.ndarray  # float32[T]: the outcome on each trajectory's last policy token
    scores: np.ndarray  # float32[N]

    @property
    def n_tokens(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_trajectories(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, rewards, mask) as (B, L) float32 arrays, right-padded with zeros."""
        lengths = np.diff(self.offsets)
        B, L = self.n_trajectories, int(lengths.max(initial=0))
        rows = np.repeat(np.arange(B), lengths)
        cols = np.arange(self.n_tokens) - np.repeat(self.offsets[:-1], lengths)
        out = []
        for flat in (np.nan_to_num(self.values), self.rewards, self.mask.astype(np.float32)):
            pad = np.zeros((B, L), np.float32)
            pad[rows, cols] = flat
            out.append(pad)
        return out[0], out[1], out[2]

    def policy_only(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-trajectory (rewards, values) of policy tokens only, float64 (pre-compressed
        input for per-trajectory tools)."""
        rs, vs = [], []
        for j in range(self.n_trajectories):
            sl = slice(self.offsets[j], self.offsets[j + 1])
            m = self.mask[sl]
            rs.append(self.rewards[sl][m].astype(np.float64))
            vs.append(self.values[sl][m].astype(np.float64))
        return rs, vs


def make_batch(
    n_traj: int = 1000,
    turns: int = 8,
    turn_len: int = 120,
    obs_len: int = 300,
    seed: int = 0,
) -> RolloutBatch:
    """Agentic rollouts: a prompt, then `turns` policy turns of ~turn_len tokens, each
    followed by a ~obs_len-token tool observation (lengths jittered ±50%)."""
    rng = np.random.default_rng(seed)
    jitter = lambda mean, size: np.maximum(1, rng.integers(mean // 2, mean * 3 // 2 + 1, size))  # noqa: E731
    pieces, lengths = [], []
    for _ in range(n_traj):
        k = int(rng.integers(max(1, turns // 2), turns * 3 // 2 + 1))
        runs = np.empty(2 * k, np.int64)
        runs[0::2] = jitter(obs_len, k)  # the prompt / previous observation
        runs[1::2] = jitter(turn_len, k)
        flags = np.tile([False, True], k)
        pieces.append(np.repeat(flags, runs))
        lengths.append(int(runs.sum()))
    mask = np.concatenate(pieces)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.uniform(-1, 1, mask.shape[0]).astype(np.float32)
    values[~mask] = np.nan  # never read
    scores = rng.integers(0, 2, n_traj).astype(np.float32)
    rewards = np.zeros(mask.shape[0], np.float32)
    for j in range(n_traj):
        last = offsets[j] + np.flatnonzero(mask[offsets[j] : offsets[j + 1]])[-1]
        rewards[last] = scores[j]
    return RolloutBatch(values, mask, offsets, rewards, scores)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import mpo_rs

    return (
        f"{cpu}, {os.cpu_count()} logical cores, mpo_rs pool {mpo_rs.get_num_threads()} threads, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )
