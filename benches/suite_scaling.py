"""Scaling suite: how mpo_rs and the GAE peers behave as the batch changes shape.

* peak memory of one call, each implementation in a fresh process (and what building
  the peer's input layout adds);
* thread count: mpo_rs with a pool of 1 and of 2 threads;
* tokens per batch from 10^5 up to 10^8: a size is run only if the implementation's
  measured bytes per token fit in half the memory available at that moment, and a peer
  stops once its time, extrapolated from the previous size, passes a per-call limit;
* turns per trajectory (1 to 64) and turn length (8 to 2048 tokens) at a fixed token count.

Batches come from `common.batch_for_tokens` (turns of ~120 tokens, observations of ~300,
lengths jittered ±50%); peers get their native layouts built before timing, as in the GAE
suite, whose equality checks are repeated here on the smallest batch of the token sweep.

    python benches/suite_scaling.py [--quick] [--json PATH]
    python benches/suite_scaling.py --probe NAME --tokens N   # one peak-memory probe
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    Case,
    available_memory_bytes,
    batch_for_tokens,
    log,
    peak_extra_bytes,
    suite_main,
    time_cases,
    versions,
)
from suite_gae import (
    BANDWIDTH_FLOOR,
    FLOOR,
    MPO_GAE,
    MPO_GAE_WHITENED,
    MPO_MAE,
    PEER_VERSIONS,
    PEERS,
    mpo_cases,
    prepare_peers,
)

import mpo_rs

# The peers of the GAE suite that take part here; the padded numpy loop and per-trajectory
# lfilter are left to the GAE suite (they only show Python-loop overhead growing).
SCALING_PEERS = [p for p in PEERS if not p.name.startswith(("numpy", "scipy"))]
MEMORY_SHARE = 0.5  # of MemAvailable, measured just before each size
BATCH_BYTES_PER_TOKEN = 24  # the flat batch and the transients of building it


def configuration(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "sizes": [1e5, 3e5, 1e6],
            "shape_tokens": 3e5,
            "probe_tokens": 1e6,
            "thread_tokens": 1e6,
            "max_call_s": 2.0,
            "repeats": 3,
            "seconds_per_case": 2.0,
        }
    return {
        "sizes": [1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8],
        "shape_tokens": 1e6,
        "probe_tokens": 1e7,
        "thread_tokens": 1e7,
        "max_call_s": 5.0,
        "repeats": 7,
        "seconds_per_case": 5.0,
    }


def cases_for(
    b: Any, names: set[str] | None = None, *, check: bool = False
) -> tuple[list[Case], list[dict[str, Any]], list[dict[str, Any]]]:
    """mpo_rs, floors and scaling peers on batch `b` (all of them, or those in `names`)."""
    ours = [c for c in mpo_cases(b) if names is None or c.name in names]
    peers = [p for p in SCALING_PEERS if names is None or p.name in names]
    peer_cases, checks, skipped = prepare_peers(b, peers, check=check)
    return ours + peer_cases, checks, skipped


# ---------------------------------------------------------------------------------------
# Peak memory: one fresh process per implementation, so that nothing another case
# allocated (or an allocator cached) blurs the figure.


def probe(name: str, tokens: float) -> dict[str, Any]:
    """Run in a child process: the memory that building `name`'s input layout and one call
    of `name` add on top of the flat batch."""
    warm_cases, _, skipped = cases_for(batch_for_tokens(2e4), {name})
    if skipped:
        return {"name": name, "skipped": skipped[0]["reason"]}
    warm_cases[0].fn()  # libraries, kernels and thread pools are loaded before measuring
    b = batch_for_tokens(tokens)
    built: list[Case] = []
    layout_bytes = peak_extra_bytes(lambda: built.extend(cases_for(b, {name})[0]))
    call_bytes = peak_extra_bytes(built[0].fn)
    return {
        "name": name,
        "tokens": b.n_tokens,
        "batch_bytes": b.input_bytes,
        "layout_bytes": max(0, layout_bytes),
        "call_bytes": max(0, call_bytes),
    }


def peak_memory(tokens: float) -> list[dict[str, Any]]:
    names = [c.name for c in mpo_cases(batch_for_tokens(2e4))] + [p.name for p in SCALING_PEERS]
    out = []
    for name in names:
        log(f"scaling: peak memory of {name} at {tokens:.0e} tokens")
        child = subprocess.run(
            [sys.executable, __file__, "--probe", name, "--tokens", str(tokens)], capture_output=True, text=True
        )
        if child.returncode != 0:
            out.append({"name": name, "skipped": f"probe failed: {child.stderr.strip().splitlines()[-1:]}"})
            continue
        out.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return out


def bytes_per_token(memory: list[dict[str, Any]]) -> dict[str, float]:
    return {m["name"]: (m["layout_bytes"] + m["call_bytes"]) / m["tokens"] for m in memory if "tokens" in m}


# ---------------------------------------------------------------------------------------
# Sweeps


def token_sweep(
    cfg: dict[str, Any], per_token_bytes: dict[str, float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    points, skipped, checks = [], [], []
    last_time: dict[str, tuple[float, int]] = {}  # name -> (seconds, tokens) at the last size
    stopped: set[str] = set()
    for i, size in enumerate(cfg["sizes"]):
        budget = MEMORY_SHARE * available_memory_bytes()
        if BATCH_BYTES_PER_TOKEN * size > budget:
            skipped.append(
                {
                    "tokens": int(size),
                    "name": "all",
                    "reason": f"the batch alone would take more than {MEMORY_SHARE:.0%} of available memory",
                }
            )
            break
        b = batch_for_tokens(size)
        names = {c.name for c in mpo_cases(b)} | {p.name for p in SCALING_PEERS}
        for name in sorted(names):
            reason = None
            if name in stopped:
                reason = "stopped at a smaller size"
            elif name in last_time:
                t, n = last_time[name]
                if t * b.n_tokens / n > cfg["max_call_s"]:
                    reason = f"one call would take about {t * b.n_tokens / n:.0f} s (limit {cfg['max_call_s']:.0f} s)"
            if (
                reason is None
                and per_token_bytes.get(name, 0) * b.n_tokens + BATCH_BYTES_PER_TOKEN * b.n_tokens > budget
            ):
                reason = f"needs about {per_token_bytes[name] * b.n_tokens / 2**30:.1f} GiB (measured bytes per token), over {MEMORY_SHARE:.0%} of available memory"
            if reason is not None:
                names.discard(name)
                stopped.add(name)
                skipped.append({"tokens": b.n_tokens, "name": name, "reason": reason})
        log(f"scaling: {b.n_tokens:,} tokens: {len(names)} implementations")
        cases, size_checks, peer_skips = cases_for(b, names, check=i == 0)
        checks += size_checks
        skipped += [{"tokens": b.n_tokens, "name": s["peer"], "reason": s["reason"]} for s in peer_skips]
        rows = time_cases(cases, cfg["repeats"], seconds_per_case=cfg["seconds_per_case"])
        for r in rows:
            last_time[r["name"]] = (r["median_s"], b.n_tokens)
            points.append({"tokens": b.n_tokens, "policy_tokens": b.n_policy_tokens, **r})
        del cases, b
    return points, skipped, checks


def shape_sweep(cfg: dict[str, Any], parameter: str, values: list[int]) -> list[dict[str, Any]]:
    """Time per token as one batch-shape parameter varies at a fixed token count."""
    names = {FLOOR, MPO_GAE, MPO_MAE} | {p.name for p in SCALING_PEERS if not p.padded}
    points = []
    for value in values:
        b = batch_for_tokens(cfg["shape_tokens"], **{parameter: value})
        log(f"scaling: {parameter}={value}: {b.n_tokens:,} tokens")
        cases, _, _ = cases_for(b, names)
        for r in time_cases(cases, cfg["repeats"], seconds_per_case=cfg["seconds_per_case"]):
            points.append({parameter: value, "tokens": b.n_tokens, "turns_total": b.describe()["turns"], **r})
    return points


def thread_scaling(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    b = batch_for_tokens(cfg["thread_tokens"])
    log(f"scaling: threads at {b.n_tokens:,} tokens")
    estimators = {
        MPO_GAE: next(c.fn for c in mpo_cases(b) if c.name == MPO_GAE),
        MPO_MAE: next(c.fn for c in mpo_cases(b) if c.name == MPO_MAE),
    }
    cases = [
        Case(
            f"{name}, {threads} thread{'s' if threads > 1 else ''}",
            fn,
            before=functools.partial(mpo_rs.set_num_threads, threads),
        )
        for name, fn in estimators.items()
        for threads in (1, 2)
    ]
    try:
        rows = time_cases(cases, cfg["repeats"] + 2)
    finally:
        mpo_rs.set_num_threads(0)
    return [{"tokens": b.n_tokens, **r} for r in rows]


def run(quick: bool) -> dict[str, Any]:
    cfg = configuration(quick)
    memory = peak_memory(cfg["probe_tokens"])
    threads = thread_scaling(cfg)
    tokens, skipped, checks = token_sweep(cfg, bytes_per_token(memory))
    turns = shape_sweep(cfg, "turns", [1, 2, 4, 8, 16, 32, 64])
    turn_len = shape_sweep(cfg, "turn_len", [8, 32, 128, 512, 2048])
    return {
        "suite": "scaling",
        "title": "Scaling: tokens, turns, turn length, threads, peak memory",
        "config": cfg,
        "floors": [FLOOR, BANDWIDTH_FLOOR],
        "mpo": [MPO_GAE, MPO_GAE_WHITENED, MPO_MAE],
        "memory": memory,
        "threads": threads,
        "tokens": tokens,
        "tokens_skipped": skipped,
        "turns": turns,
        "turn_len": turn_len,
        "checks": checks,
        "versions": versions(*PEER_VERSIONS),
    }


if __name__ == "__main__":
    if "--probe" in sys.argv:
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--probe", required=True)
        ap.add_argument("--tokens", type=float, required=True)
        args = ap.parse_args()
        print(json.dumps(probe(args.probe, args.tokens)))
    else:
        suite_main(run, __doc__)
