"""A hypothesis fuzzer of the lab's stateful env object: a VectorEnv call is all or nothing
(under the library's fuzz settings, tests/test_fuzz_api.py)."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_api import fuzz_settings

import mpo_rs

# --------------------------------------------------------------------------- VectorEnv atomicity


def vector_env_state(vec) -> tuple:
    """Everything a VectorEnv call may change: its done/turn arrays and each env's fields."""
    return vec.done.tolist(), vec.turns.tolist(), [copy.deepcopy(vars(env)) for env in vec.envs]


@st.composite
def vector_env_op(draw, vec):
    """A reset or a step of ``vec``, valid or with one twist that must be refused."""
    n, k, vocab = len(vec), vec.action_tokens, vec.vocab_size
    if draw(st.booleans()) and draw(st.booleans()):  # a quarter: reset
        seeds: list = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
        twist = draw(st.sampled_from(["none", "none", "negative", "float", "str", "none_seed", "length", "scalar"]))
        if twist in ("negative", "float", "str", "none_seed"):
            bad = {"negative": -draw(st.integers(1, 9)), "float": 1.5, "str": "3", "none_seed": None}[twist]
            seeds[draw(st.integers(0, n - 1))] = bad
        elif twist == "length":
            seeds = seeds[:-1] if draw(st.booleans()) else [*seeds, 0]
        elif twist == "scalar":
            seeds = 7
        return "reset", seeds, twist == "none"
    done = vec.done
    token = st.integers(0, vocab - 1)
    actions: list = [None if done[i] else draw(st.lists(token, min_size=k, max_size=k)) for i in range(n)]
    twist = draw(
        st.sampled_from(["none", "none", "none", "range", "length", "none_running", "action_done", "float", "array"])
    )
    i = draw(st.integers(0, n - 1))
    running = [j for j in range(n) if not done[j]]
    if twist == "range" and running:
        actions[running[0]][draw(st.integers(0, k - 1))] = draw(st.sampled_from([-1, vocab, vocab + 7]))
    elif twist == "length" and running:
        actions[running[-1]] = actions[running[-1]][:-1] if draw(st.booleans()) else [*actions[running[-1]], 0]
    elif twist == "none_running" and running:
        actions[running[0]] = None
    elif twist == "action_done" and done[i]:
        actions[i] = [0] * k
    elif twist == "float" and running:
        actions[running[0]] = [0.5] * k
    elif twist == "array":
        rows = np.asarray([a if a is not None else [0] * k for a in actions], dtype=np.int64)
        kind = draw(st.sampled_from(["ok", "dtype", "shape"]))
        if kind == "dtype":
            return "step", rows.astype(np.float64), False
        if kind == "shape":
            return "step", rows[:-1], False  # one row short (a finished env's row may have any length)
        return "step", rows, True
    else:
        twist = "none"
    return "step", actions, twist == "none"


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(["guess_number", "key_door"]), n=st.integers(1, 4))
def test_vector_env_calls_are_all_or_nothing(data, kind, n):
    """Random reset/step sequences, some calls with a bad seed or action: a refused call
    raises mpo_rs's typed error and leaves every env's state exactly as before (defect 9 of
    issue 18); an accepted one moves every running env by one turn."""
    from mpo_lab.envs import GuessNumber, KeyDoor, VectorEnv

    if kind == "guess_number":
        vec = VectorEnv(lambda: GuessNumber(num_values=8, max_turns=4, action_tokens=2), n)
    else:
        vec = VectorEnv(lambda: KeyDoor(max_turns=3, action_tokens=3), n)
    for _ in range(data.draw(st.integers(1, 12))):
        op, argument, valid = data.draw(vector_env_op(vec))
        before = vector_env_state(vec)
        was_done = vec.done
        try:
            if op == "reset":
                observations = vec.reset(argument)
            else:
                observations, rewards, dones = vec.step(argument)
        except mpo_rs.MpoError as e:
            assert not valid, f"valid {op}({argument!r}) refused: {e}"
            assert str(e) and "\n" not in str(e)
            assert vector_env_state(vec) == before, f"refused {op}({argument!r}) changed the state"
            continue
        assert valid, f"{op}({argument!r}) was accepted"
        if op == "reset":
            assert len(observations) == n and not vec.done.any() and not vec.turns.any()
        else:
            assert len(observations) == n and rewards.shape == dones.shape == (n,)
            assert (vec.turns - np.asarray(before[1]) == ~was_done).all()
            assert all(observations[j] == [] for j in range(n) if was_done[j])
