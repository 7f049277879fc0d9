"""Token GAE and MAE on a realistic agentic batch, against the tools people use today.

Run: `make bench` (or `python benches/bench_estimators.py [--quick]`). Every figure is a
ratio of times measured in this one run (median of several repeats), so it transfers
across machines better than seconds do. Before timing, each peer's output is checked
against mpo_rs on the semantics they share (GAE, observation tokens skipped, no
whitening), so the comparison is of equal work.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import RolloutBatch, machine, make_batch, median_time  # noqa: E402

import mpo_rs  # noqa: E402

GAMMA, LAM = 1.0, 0.95


def numpy_padded_gae(values, rewards, mask):
    """verl's reverse loop over the padded time axis, observation tokens skipped."""
    B, L = values.shape
    nextvalues = np.zeros(B, np.float32)
    lastgaelam = np.zeros(B, np.float32)
    adv = np.empty((B, L), np.float32)
    for t in range(L - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + GAMMA * nextvalues - values[:, t]
        lastgaelam_ = delta + GAMMA * LAM * lastgaelam
        nextvalues = values[:, t] * m + (1 - m) * nextvalues
        lastgaelam = lastgaelam_ * m + (1 - m) * lastgaelam
        adv[:, t] = lastgaelam
    return adv * mask, (adv + values) * mask


def lfilter_gae(rs, vs):
    """Per trajectory: δ over policy tokens, then a first-order IIR filter backwards."""
    from scipy.signal import lfilter

    out = []
    for r, v in zip(rs, vs):
        nxt = np.append(v[1:], 0.0)
        delta = r + GAMMA * nxt - v
        out.append(lfilter([1.0], [1.0, -GAMMA * LAM], delta[::-1])[::-1])
    return out


def check_equal_work(b: RolloutBatch, padded, rs, vs, peers) -> None:
    ours = mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, gamma=GAMMA, lam=LAM, lam_critic=LAM)
    flat_ours = [ours.advantages[b.offsets[j] : b.offsets[j + 1]][b.mask[b.offsets[j] : b.offsets[j + 1]]] for j in range(b.n_trajectories)]
    lengths = np.diff(b.offsets)
    adv_pad, ret_pad = numpy_padded_gae(*padded)
    rows = np.repeat(np.arange(b.n_trajectories), lengths)
    cols = np.arange(b.n_tokens) - np.repeat(b.offsets[:-1], lengths)
    np.testing.assert_allclose(adv_pad[rows, cols], ours.advantages, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ret_pad[rows, cols], ours.returns, rtol=1e-4, atol=1e-3)
    for name, fn in peers.items():
        got = fn()
        for j in range(0, b.n_trajectories, max(1, b.n_trajectories // 50)):
            np.testing.assert_allclose(got[j], flat_ours[j], rtol=1e-4, atol=1e-3, err_msg=name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smaller batch and fewer repeats")
    args = ap.parse_args()
    n_traj, repeats = (200, 3) if args.quick else (1000, 7)
    b = make_batch(n_traj=n_traj)
    padded = b.padded()
    rs, vs = b.policy_only()

    peers: dict[str, object] = {"scipy.signal.lfilter per trajectory": lambda: lfilter_gae(rs, vs)}
    try:
        import stateset_rl_core

        peers["stateset-rl-core batch_compute_gae"] = lambda: stateset_rl_core.batch_compute_gae(rs, vs, GAMMA, LAM)
    except ImportError:
        print("stateset-rl-core is not installed: `pip install stateset-rl-core` to compare with it")
    check_equal_work(b, padded, rs, vs, peers)

    def floor():
        # What any estimator must at least do: read its inputs and write fresh outputs.
        return b.values.copy(), b.rewards.copy()

    t = {
        "memory floor (copy 2 inputs to 2 outputs)": median_time(floor, repeats),
        "mpo_rs.gae_advantages": median_time(lambda: mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, gamma=GAMMA, lam=LAM), repeats),
        "mpo_rs.mae_advantages": median_time(lambda: mpo_rs.mae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards), repeats),
        "numpy reverse loop, padded (verl-style)": median_time(lambda: numpy_padded_gae(*padded), max(1, repeats // 2)),
    }
    for name, fn in peers.items():
        t[name] = median_time(fn, repeats)

    gae, mae = t["mpo_rs.gae_advantages"], t["mpo_rs.mae_advantages"]
    print(f"\nbatch: {b.n_trajectories} trajectories, {b.n_tokens:,} tokens ({int(b.mask.sum()):,} policy), {len(mpo_rs.segment_turns(b.mask, b.offsets).starts):,} turns")
    print(f"machine: {machine()}\n")
    print("| implementation | median ms | time / mpo_rs GAE | time / mpo_rs MAE |")
    print("|---|---:|---:|---:|")
    for name, secs in t.items():
        print(f"| {name} | {secs * 1e3:.1f} | {secs / gae:.2f}× | {secs / mae:.2f}× |")
    print()
    ss = t.get("stateset-rl-core batch_compute_gae")
    floor_t = t["memory floor (copy 2 inputs to 2 outputs)"]
    if ss is not None:
        print(f"target: token GAE ≥ 2× faster than stateset-rl-core: {ss / gae:.2f}×  {'ok' if ss / gae >= 2 else 'MISSED'}")
        print(f"target: MAE no slower than stateset-rl-core:          {ss / mae:.2f}×  {'ok' if ss / mae >= 1 else 'MISSED'}")
    print(f"target: MAE within 3× the memory floor:               {mae / floor_t:.2f}×  {'ok' if mae / floor_t <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
