"""Shared pieces of the benchmarks: the realistic batch, the interleaved timer, equality
checks, the peak-memory probe, the machine description and the suites' command line.

Every suite builds its batches with `make_batch` / `batch_for_tokens`, times with
`time_cases` (or `interleaved_times`) and checks peers with `assert_close`, so that all
figures in the report are produced the same way.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable

import numpy as np

# ---------------------------------------------------------------------------------------
# Batches


@dataclass
class RolloutBatch:
    """N multi-turn trajectories, flat + offsets (mpo_rs's layout), with converters to the
    layouts the peers take: padded (B, L) rows (verl), per-trajectory policy-token arrays
    (stateset-rl-core, scipy) and one policy-token sequence with end flags (torchrl)."""

    values: np.ndarray  # float32[T]
    mask: np.ndarray  # bool[T]
    offsets: np.ndarray  # int64[N+1]
    rewards: np.ndarray  # float32[T]: the outcome on each trajectory's last policy token
    scores: np.ndarray  # float32[N]
    group_ids: np.ndarray  # int64[N]: rollouts of one prompt share an id

    @property
    def n_tokens(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_trajectories(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_policy_tokens(self) -> int:
        return int(np.count_nonzero(self.mask))

    @property
    def input_bytes(self) -> int:
        """Bytes mpo_rs reads for a token estimator: values, mask, rewards, offsets."""
        return sum(a.nbytes for a in (self.values, self.mask, self.rewards, self.offsets))

    def describe(self) -> dict[str, Any]:
        lengths = np.diff(self.offsets)
        return {
            "trajectories": self.n_trajectories,
            "tokens": self.n_tokens,
            "policy_tokens": self.n_policy_tokens,
            "turns": int(np.count_nonzero(self.mask[1:] & ~self.mask[:-1]) + self.mask[:1].sum()),
            "max_trajectory_tokens": int(lengths.max(initial=0)),
            "group_size": int(np.bincount(self.group_ids).max(initial=0)),
        }

    def padded_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) in the padded layout of every flat token."""
        lengths = np.diff(self.offsets)
        rows = np.repeat(np.arange(self.n_trajectories), lengths)
        cols = np.arange(self.n_tokens) - np.repeat(self.offsets[:-1], lengths)
        return rows, cols

    def padded_shape(self) -> tuple[int, int]:
        return self.n_trajectories, int(np.diff(self.offsets).max(initial=0))

    def padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, rewards, mask) as (B, L) float32 arrays, right-padded with zeros."""
        rows, cols = self.padded_index()
        out = []
        for flat in (np.nan_to_num(self.values), self.rewards, self.mask.astype(np.float32)):
            pad = np.zeros(self.padded_shape(), np.float32)
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

    def policy_flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All policy tokens in one sequence: (values, rewards, last) where `last` marks
        each trajectory's last policy token (the `done` flag of RL libraries)."""
        traj_of_token = np.repeat(np.arange(self.n_trajectories), np.diff(self.offsets))[self.mask]
        last = np.ones(traj_of_token.shape[0], bool)
        last[:-1] = traj_of_token[1:] != traj_of_token[:-1]
        return self.values[self.mask], self.rewards[self.mask], last


def make_batch(
    n_traj: int = 1000,
    turns: int = 8,
    turn_len: int = 120,
    obs_len: int = 300,
    group_size: int = 8,
    seed: int = 0,
) -> RolloutBatch:
    """Agentic rollouts: a prompt, then `turns` policy turns of ~turn_len tokens, each
    followed by a ~obs_len-token tool observation (lengths and turn counts jittered ±50%).
    Consecutive trajectories form groups of `group_size` (one prompt, several rollouts);
    scores take five partial-credit levels so that groups are rarely all equal."""
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
    values: np.ndarray = rng.random(mask.shape[0], dtype=np.float32)  # type: ignore[assignment]
    values *= 2
    values -= 1  # uniform in [-1, 1), built in place: batches reach 10^8 tokens
    values[~mask] = np.nan  # never read
    scores = (rng.integers(0, 5, n_traj) / 4).astype(np.float32)
    rewards = np.zeros(mask.shape[0], np.float32)
    policy_tokens = np.flatnonzero(mask)  # every trajectory has one: turns >= 1, lengths >= 1
    last_policy = policy_tokens[np.searchsorted(policy_tokens, offsets[1:]) - 1]
    rewards[last_policy] = scores
    group_ids = np.arange(n_traj, dtype=np.int64) // group_size
    return RolloutBatch(values, mask, offsets, rewards, scores, group_ids)


def batch_for_tokens(
    tokens: float, *, turns: int = 8, turn_len: int = 120, obs_len: int = 300, group_size: int = 8, seed: int = 0
) -> RolloutBatch:
    """A `make_batch` batch of about `tokens` tokens (whole groups of trajectories)."""
    mean_traj_tokens = max(1, turns) * (turn_len + obs_len)
    groups = max(1, round(tokens / mean_traj_tokens / group_size))
    return make_batch(groups * group_size, turns, turn_len, obs_len, group_size, seed)


# ---------------------------------------------------------------------------------------
# Timing


# Before each timed call: write a buffer larger than the last-level cache, so every case
# starts with cold caches whichever case ran before it (as in a training step, where the
# estimator runs after the model), and pause so that the previous case's worker threads
# (torch's OpenMP pool spins for a while after a parallel region) are idle.
_CACHE_FLUSH = np.zeros(64 * 2**20 // 8)
SETTLE_S = 0.005


def _cold_start() -> None:
    gc.collect()  # the previous call's garbage is not this call's cost
    np.add(_CACHE_FLUSH, 1.0, out=_CACHE_FLUSH)
    time.sleep(SETTLE_S)


def interleaved_times(
    cases: dict[str, Callable[[], object]],
    repeats: int,
    *,
    warmup: int = 1,
    min_repeats: int = 3,
    seconds_per_case: float | None = None,
    before: dict[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Wall times of every case, run in rounds whose order rotates, so that drifts in the
    machine's load (it may be shared) hit all cases alike and ratios of medians stay fair.

    A case whose warm-up call is slow gets fewer repeats (never under `min_repeats`) so that
    it spends about `seconds_per_case`; `before[name]` runs untimed before each call."""
    before = before or {}
    budget: dict[str, int] = {}
    for name, fn in cases.items():
        warm = 0.0
        for _ in range(warmup):
            before.get(name, lambda: None)()
            t0 = time.perf_counter()
            fn()
            warm = time.perf_counter() - t0
        budget[name] = repeats
        if seconds_per_case is not None and warm > 0:
            budget[name] = max(min_repeats, min(repeats, int(seconds_per_case / warm)))
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for rnd in range(repeats):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            if len(times[name]) >= budget[name]:
                continue
            before.get(name, lambda: None)()
            _cold_start()
            t0 = time.perf_counter()
            fn = cases[name]
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


@dataclass
class Case:
    """One timed implementation. `baseline` names the mpo_rs case doing the same work
    (None for mpo_rs itself and for the memory floor)."""

    name: str
    fn: Callable[[], object]
    layout: str = ""
    baseline: str | None = None
    before: Callable[[], object] | None = None


def time_cases(cases: list[Case], repeats: int, **kw: Any) -> list[dict[str, Any]]:
    """Times `cases` together (see `interleaved_times`) and returns one JSON-able row each."""
    times = interleaved_times(
        {c.name: c.fn for c in cases},
        repeats,
        before={c.name: c.before for c in cases if c.before is not None},
        **kw,
    )
    return [
        {
            "name": c.name,
            "layout": c.layout,
            "baseline": c.baseline,
            "median_s": statistics.median(times[c.name]),
            "min_s": min(times[c.name]),
            "repeats": len(times[c.name]),
        }
        for c in cases
    ]


# ---------------------------------------------------------------------------------------
# Equality checks and optional peers


class PeerMissing(Exception):
    """A peer that cannot run here (not installed, or too big for this machine)."""


def import_peer(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise PeerMissing(f"`{module}` is not importable ({err}); `make bench` installs it into .venv-bench") from err


def assert_close(
    peer: str, compared: str, got: Any, want: Any, *, rtol: float = 1e-4, atol: float = 1e-3
) -> dict[str, Any]:
    """Raises if `got` and `want` differ; returns what was compared and the largest error."""
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{peer}: {compared}")
    return {
        "peer": peer,
        "compared": compared,
        "values": int(got.size),
        "max_abs_err": float(np.max(np.abs(got - want), initial=0.0)),
    }


# ---------------------------------------------------------------------------------------
# Memory


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak resident memory that one call of `fn` adds to what the process holds now,
    outputs included (Linux: the high-water mark is reset through /proc/self/clear_refs)."""
    gc.collect()
    _release_free_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    base = _proc_status_kib("VmRSS")
    out = fn()
    peak = _proc_status_kib("VmHWM")
    del out
    return (peak - base) * 1024


def _release_free_heap() -> None:
    """Hands freed heap pages back to the OS (glibc), so that the baseline RSS is live
    memory only and a new allocation that reuses a freed block is still counted."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------
# Machine, versions, command line


def versions(*dists: str) -> dict[str, str]:
    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = "not installed"
    return out


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import mpo_rs

    info: dict[str, Any] = {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "mpo_rs_threads": mpo_rs.get_num_threads(),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def machine() -> str:
    m = machine_info()
    torch_threads = f", torch {m['torch_threads']} threads" if "torch_threads" in m else ""
    return (
        f"{m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gib']} GiB, {m['os']}; "
        f"mpo_rs pool {m['mpo_rs_threads']} threads{torch_threads}; Python {m['python']}, numpy {np.__version__}"
    )


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def suite_main(run: Callable[[bool], dict[str, Any]], doc: str | None) -> dict[str, Any]:
    """Command line shared by the suites: `--quick`, `--json PATH`; prints the section."""
    import report  # local: rendering lives with the report writer

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small batches and few repeats (a smoke run)")
    ap.add_argument("--json", metavar="PATH", help="also write the result here as JSON")
    args = ap.parse_args()
    load_average, date = os.getloadavg()[0], now_utc()
    result = run(args.quick)
    result.update(machine=machine_info(), date=date, load_average=load_average)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=_json_default)
    print(report.render_suite(result))
    print(f"\nmachine: {machine()}; load average {load_average:.1f} at the start")
    return result


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(type(obj))


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the result)."""
    print(msg, file=sys.stderr, flush=True)
