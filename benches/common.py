"""Shared pieces of the benchmarks: the realistic batch (from `mpo_rs.synthetic`), the interleaved timer, equality
checks, the peak-memory probe, the machine description and the benchmarks' command lines.

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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, TypeVar

import numpy as np

from mpo_rs import synthetic
from mpo_rs.synthetic import FlatBatch

# ---------------------------------------------------------------------------------------
# Batches


def make_batch(n_traj: int = 1000, *, seed: int = 0, **shape: Any) -> FlatBatch:
    """Agentic rollouts (`mpo_rs.synthetic.flat_batch`, whose shape options ``shape`` passes):
    by default a prompt, then 8 policy turns of ~120 tokens, each followed by a ~300-token
    tool observation (lengths and turn counts jittered ±50%). Consecutive trajectories form
    groups of 8; scores take five partial-credit levels so that groups are rarely all equal;
    values on observation tokens are NaN (never read)."""
    return synthetic.flat_batch(n_traj, seed=seed, nan_observations=True, **shape)


def batch_for_tokens(tokens: float, **shape: Any) -> FlatBatch:
    """A `make_batch` batch of about `tokens` tokens (whole groups of trajectories)."""
    return synthetic.batch_for_tokens(tokens, nan_observations=True, **shape)


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


T = TypeVar("T")


class PeerMissing(Exception):
    """A peer that cannot run here (not installed, or too big for this machine)."""


def import_peer(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise PeerMissing(f"`{module}` is not importable ({err}); `make bench` installs it into .venv-bench") from err


def try_peer(name: str, build: Callable[[], T], skipped: list[dict[str, Any]]) -> T | None:
    """``build()`` for peer ``name``, or None with the reason added to ``skipped``: the peer
    cannot run here (PeerMissing), or its output differs from mpo_rs's (AssertionError from
    the equality check: not equal work, so it is not timed)."""
    try:
        return build()
    except PeerMissing as err:
        skipped.append({"peer": name, "reason": str(err)})
    except AssertionError as err:
        skipped.append({"peer": name, "reason": "output differs from mpo_rs: " + str(err).strip().splitlines()[0]})
    return None


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
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


class QuickParser(argparse.ArgumentParser):
    """Command line of the benchmarks that print one table: ``--quick``, sizes whose
    default depends on it (`size`) and, with ``torch_options``, ``--threads`` (applied to
    torch) and ``--device`` (parsed to a ``torch.device``)."""

    def __init__(self, doc: str | None, *, torch_options: bool = True) -> None:
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
        self._sizes: dict[str, tuple[int, int]] = {}
        self._torch_options = torch_options
        if torch_options:
            self.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
            self.add_argument("--device", default="cpu")

    def size(self, name: str, quick: int, full: int, help: str | None = None) -> None:
        """``--name N``; without it (or with 0) `full`, or `quick` with ``--quick``."""
        self._sizes[name] = (quick, full)
        default = f"{full}, {quick} with --quick"
        self.add_argument(f"--{name}", type=int, default=None, help=f"{help} ({default})" if help else default)

    def parse(self) -> argparse.Namespace:
        args = self.parse_args()
        for name, (quick, full) in self._sizes.items():
            setattr(args, name, getattr(args, name) or (quick if args.quick else full))
        if self._torch_options:
            import torch  # local: only the torch benchmarks need it

            if args.threads:
                torch.set_num_threads(args.threads)
            args.device = torch.device(args.device)
        return args


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


def write_section(
    page: str | os.PathLike[str], text: str, title: str, before: tuple[str, ...] = ("## Reproduce",)
) -> None:
    """Replaces the page's section ``title`` (up to the next ``## ``) by ``text``, or puts
    it before the first of the sections ``before`` the page has (at the end when it has
    none of them): how the benchmarks
    that are not suites write into docs/benchmarks.md, in the order the report keeps them
    (report.KEPT_SECTIONS)."""
    with open(page) as f:
        body = f.read()
    start = body.find(title + "\n")
    if start >= 0:
        end = body.find("\n## ", start + len(title))
        body = body[:start] + text + ("\n" + body[end + 1 :] if end >= 0 else "")
    else:
        found = [i for i in (body.find("\n" + b + "\n") for b in before) if i >= 0]
        anchor = found[0] if found else -1
        body = body + "\n" + text if anchor < 0 else body[: anchor + 1] + text + "\n" + body[anchor + 1 :]
    with open(page, "w") as f:
        f.write(body)


def section_main(
    description: str,
    run: Callable[[bool, int], Any],
    render: Callable[[Any, str, tuple[float, float], list[str]], str],
    title: str,
    before: tuple[str, ...],
) -> None:
    """Command line of a benchmark that writes one section of docs/benchmarks.md:
    ``--quick``, ``--repeats N``, ``--docs PAGE``. ``run(quick, repeats)`` measures;
    ``render(result, date, (load at start, at end), shown arguments)`` is the section."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per case (a slow case gets fewer)")
    ap.add_argument("--docs", metavar="PAGE", help="rewrite the section of this page (docs/benchmarks.md)")
    args = ap.parse_args()
    load_start, date = os.getloadavg()[0], now_utc()
    result = run(args.quick, 3 if args.quick else args.repeats)
    shown = [a for a in sys.argv[1:] if not a.startswith("--docs") and a != args.docs]
    text = render(result, date, (load_start, os.getloadavg()[0]), shown)
    print(text)
    if args.docs:
        write_section(args.docs, text, title, before)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(type(obj))


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the result)."""
    print(msg, file=sys.stderr, flush=True)
