"""Runtime behaviour of the binding: input kinds and copies, thread-count determinism,
fork safety, the GIL, empty batches."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mpo_rs
from mpo_rs import _arrays


def synthetic(n_traj=300, turns=5, seed=0):
    """A multi-turn batch: per trajectory, turns of 5-40 policy tokens between observations."""
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(n_traj):
        parts = [np.zeros(rng.integers(1, 30), bool)]
        for _ in range(rng.integers(1, turns + 1)):
            parts += [np.ones(rng.integers(1, 40), bool), np.zeros(rng.integers(0, 50), bool)]
        masks.append(np.concatenate(parts))
    mask = np.concatenate(masks)
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in masks])]).astype(np.int64)
    values = rng.normal(size=len(mask)).astype(np.float32)
    scores = rng.integers(0, 2, size=n_traj).astype(np.float32)
    return values, mask, offsets, scores


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def all_outputs(values, mask, offsets, scores):
    m = mpo_rs.mae_advantages(values, mask, offsets, scores=scores)
    g = mpo_rs.gae_advantages(values, mask, offsets, scores=scores)
    grp = mpo_rs.group_advantages(scores, np.arange(len(scores)) // 4)
    return m.advantages, m.returns, m.turn_advantages, m.turns.token_turn, g.advantages, g.returns, grp


_DIGEST_SCRIPT = """
import sys, mpo_rs
sys.path.insert(0, {tests!r})
from test_runtime import synthetic, all_outputs, digest
print(mpo_rs.get_num_threads(), digest(*all_outputs(*synthetic(2000))))
"""


def test_results_are_bitwise_identical_for_any_thread_count():
    script = _DIGEST_SCRIPT.format(tests=os.path.dirname(__file__))
    seen = {}
    for threads in ("1", "2", "7"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        n, h = out.stdout.split()
        assert n == threads
        seen[threads] = h
    assert len(set(seen.values())) == 1, seen
    assert digest(*all_outputs(*synthetic(2000))) == seen["1"]


def test_set_num_threads_resizes_the_pool():
    try:
        mpo_rs.set_num_threads(3)
        assert mpo_rs.get_num_threads() == 3
        a = digest(*all_outputs(*synthetic(500)))
        mpo_rs.set_num_threads(1)
        assert a == digest(*all_outputs(*synthetic(500)))
    finally:
        mpo_rs.set_num_threads(0)  # back to the default size


def _child(queue, threads):
    if threads:
        mpo_rs.set_num_threads(threads)
    queue.put((mpo_rs.get_num_threads(), digest(*all_outputs(*synthetic(400)))))


def _in_forked_children(n: int, threads: int = 0) -> list[tuple[int, str]]:
    """(pool size, output digest) from each of `n` forked children; `threads` > 0 resizes
    the child's pool first."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(queue, threads)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_the_pool_works_in_forked_children():
    parent = digest(*all_outputs(*synthetic(400)))  # the parent's pool is now running
    for threads, h in _in_forked_children(2):
        assert threads == 1, "a forked child defaults to one thread, like torch's workers"
        assert h == parent


def test_a_forked_child_can_grow_its_pool():
    """The child's main thread carries the parent's worker state (the parent's main thread
    is the parent pool's worker 0); its own pool must still run calls, at any size."""
    parent = digest(*all_outputs(*synthetic(400)))
    assert _in_forked_children(1, threads=2) == [(2, parent)]


_POOL_THREADS_SCRIPT = """
import os, mpo_rs, numpy as np
mpo_rs.gae_advantages(np.zeros(8, np.float32), np.ones(8, bool), [0, 4, 8], scores=[1.0, 0.0])
import time
for _ in range(200):  # spawned threads name themselves once they have started
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    if sum(n.startswith("mpo-rs-") for n in names) >= 2:
        break
    time.sleep(0.01)
time.sleep(0.1)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(mpo_rs.get_num_threads(), sum(n.startswith("mpo-rs-") for n in names))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_main_thread_is_one_of_the_pools_workers():
    env = {**os.environ, "RAYON_NUM_THREADS": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _POOL_THREADS_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["3", "2"], "3 workers: the main thread and 2 spawned threads"


def test_calls_from_several_threads_at_once_agree_with_the_main_thread():
    batch = synthetic(1500)
    expect = digest(*all_outputs(*batch))
    got: list[str] = []
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(3):
                got.append(digest(*all_outputs(*batch)))
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(3):  # the main thread (the pool's worker 0) works meanwhile
        got.append(digest(*all_outputs(*batch)))
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a call from another thread never finished"
    assert not errors, errors
    assert got == [expect] * 12


_OTHER_THREAD_SCRIPT = """
import os, sys, threading, numpy as np, mpo_rs
if sys.argv[1] == "set":
    mpo_rs.set_num_threads(1)
m = np.array([1, 1, 0, 1], np.uint8)
o = np.array([0, 4])
s = np.array([1.0, 0.0], np.float32)
mpo_rs.segment_turns(m, o)  # the main thread's first call builds the pool
calls = [
    lambda: mpo_rs.segment_turns(m, o),
    lambda: mpo_rs.mae_advantages(np.zeros(4, np.float32), m, o, scores=s[:1]),
    lambda: mpo_rs.group_advantages(s, np.array([0, 0])),
]
for call in calls:
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        print("hung", flush=True)
        os._exit(3)  # a thread stuck in the pool would also block a normal exit
print("ok", mpo_rs.get_num_threads())
"""


@pytest.mark.parametrize(
    "how, env",
    [("env", {"RAYON_NUM_THREADS": "1"}), ("set", {}), ("env", {"RAYON_NUM_THREADS": "2"})],
)
def test_a_pool_of_one_thread_serves_calls_from_other_threads(how, env):
    # A one-thread pool whose worker was the adopted main thread never ran another
    # thread's call: the call waited forever and the process could not exit.
    out = subprocess.run(
        [sys.executable, "-c", _OTHER_THREAD_SCRIPT, how],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stdout.split()[0] == "ok"


def test_contiguous_inputs_of_the_right_dtype_are_not_copied():
    values, mask, offsets, _ = synthetic(10)
    assert _arrays.float32(values, "values") is values
    assert _arrays.int64(offsets, "offsets") is offsets
    assert np.shares_memory(_arrays.mask_u8(mask), mask)
    as_u8 = mask.view(np.uint8)
    assert _arrays.mask_u8(as_u8) is as_u8


def test_outputs_are_fresh_writable_arrays():
    values, mask, offsets, scores = synthetic(10)
    m = mpo_rs.mae_advantages(values, mask, offsets, scores=scores)
    for arr in (m.advantages, m.returns, m.turn_advantages, m.turns.token_turn):
        assert arr.flags.writeable and arr.flags.c_contiguous
        assert not np.shares_memory(arr, values)


def test_float64_strided_and_integer_inputs_give_the_same_results():
    values, mask, offsets, scores = synthetic(50)
    ref = mpo_rs.mae_advantages(values, mask, offsets, scores=scores)
    wide = np.empty(2 * len(values), np.float64)
    wide[::2] = values
    got = mpo_rs.mae_advantages(
        wide[::2], mask.astype(np.int32), offsets.astype(np.int32), scores=scores.astype(np.float64)
    )
    assert np.array_equal(ref.advantages, got.advantages)
    assert np.array_equal(ref.returns, got.returns)
    lists = mpo_rs.mae_advantages(values.tolist(), mask.tolist(), offsets.tolist(), scores=scores.tolist())
    assert np.array_equal(ref.advantages, lists.advantages)


def test_torch_cpu_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    values, mask, offsets, scores = synthetic(50)
    ref = mpo_rs.mae_advantages(values, mask, offsets, scores=scores)
    v = torch.from_numpy(values).requires_grad_(True)
    got = mpo_rs.mae_advantages(v, torch.from_numpy(mask), torch.from_numpy(offsets), scores=torch.from_numpy(scores))
    assert np.array_equal(ref.advantages, got.advantages)
    half = mpo_rs.gae_advantages(torch.from_numpy(values).bfloat16(), torch.from_numpy(mask), offsets, scores=scores)
    assert half.advantages.dtype == np.float32


def test_empty_batch_returns_empty_arrays():
    empty_f, empty_m = np.zeros(0, np.float32), np.zeros(0, bool)
    m = mpo_rs.mae_advantages(empty_f, empty_m, [0], scores=empty_f)
    g = mpo_rs.gae_advantages(empty_f, empty_m, [0], rewards=empty_f)
    t = mpo_rs.segment_turns(empty_m, [0])
    assert m.advantages.shape == m.returns.shape == m.turn_advantages.shape == (0,)
    assert g.advantages.shape == (0,) and t.traj_offsets.tolist() == [0]
    assert mpo_rs.group_advantages(empty_f, np.zeros(0, np.int64)).shape == (0,)


def test_trajectories_without_policy_tokens_get_zeros():
    mask = np.array([0, 0, 1, 0], bool)
    m = mpo_rs.mae_advantages(np.ones(4, np.float32), mask, [0, 2, 4], scores=[5.0, 1.0])
    assert m.advantages[:2].tolist() == [0, 0] and m.turns.traj_offsets.tolist() == [0, 0, 1]


def test_the_gil_is_released_while_the_core_runs():
    values, mask, offsets, scores = synthetic(4000, turns=8)
    done = threading.Event()
    elapsed = []

    def work():
        t0 = time.perf_counter()
        for _ in range(5):
            mpo_rs.mae_advantages(values, mask, offsets, scores=scores)
        elapsed.append(time.perf_counter() - t0)
        done.set()

    thread = threading.Thread(target=work)
    spins = 0
    thread.start()
    while not done.is_set():
        spins += 1
    thread.join()
    # With the GIL held for the whole call this loop could barely run; released, it spins
    # millions of times per second.
    assert spins > 10_000 * max(elapsed[0], 0.01), (spins, elapsed)


def test_group_ids_of_any_kind():
    scores = np.array([1.0, 0.0, 1.0, 0.5], np.float32)
    by_int = mpo_rs.group_advantages(scores, [7, 7, 3, 3])
    by_str = mpo_rs.group_advantages(scores, np.array(["b", "b", "a", "a"]))
    by_obj = mpo_rs.group_advantages(scores, ["uid-b", "uid-b", "uid-a", "uid-a"])
    assert np.array_equal(by_int, by_str) and np.array_equal(by_int, by_obj)
    assert mpo_rs.group_advantages([3.0], ["solo"]).tolist() == [0.0]
    tok = mpo_rs.broadcast_to_tokens(by_int, np.array([1, 0, 1, 1, 1]), [0, 2, 3, 4, 5])
    assert tok.tolist() == [by_int[0], 0.0, by_int[1], by_int[2], by_int[3]]
