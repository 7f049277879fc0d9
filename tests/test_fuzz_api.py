"""A hypothesis fuzzer of the Python API (issue 11): random and adversarial calls of every
estimator, checked against the independent reference (tests/reference.py).

Each call gets a batch from tests/strategies.py and then, maybe, one adversarial twist:
NaN/inf or huge numbers where they are read or where they are not, float64 values beyond
float32, other dtypes (float64, float16, int, bool, object, str, complex), strided views,
broken offsets, empty batches, 2-D arrays, out-of-domain parameters, group ids of every
kind (ints, strings, objects, NaN, mixed). The torch learner's ``LearnerConfig`` gets random
values per field (an accepted config has its fields' kinds and trains a step; anything
else is ``InvalidOptionError``). Whatever the input:

- the call returns, or raises one of ``mpo_rs.exceptions`` (``InvalidBatchError``, ...) with a
  one-line message -- never another exception, never a panic;
- no input array is modified;
- a result has float32 outputs of the right length, equal to the reference when the input
  is valid and moderate, and finite (see ``ALLOW_NONFINITE_OUTPUT``);
- a valid input in another dtype or layout gives the same bits as its canonical form.

``make test`` runs the profile's examples (60, CI 150); ``make fuzz`` sets
``MPO_FUZZ_EXAMPLES`` for a longer run.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import os
import warnings

import numpy as np
import pytest
import reference as ref
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from strategies import Batch, batches, gae_params, mae_params

import mpo_rs

# Issue 11 item 7 made the estimators refuse to produce non-finite numbers, so a non-finite
# result, even from extreme (but valid) input, fails the fuzzer.
ALLOW_NONFINITE_OUTPUT = False

EXAMPLES = int(os.environ.get("MPO_FUZZ_EXAMPLES", "0"))
fuzz_settings = settings(
    **({"max_examples": EXAMPLES} if EXAMPLES else {}),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TOL = dict(rtol=1e-5, atol=1e-4)
TYPED = (mpo_rs.MpoError,)  # issue 18: no plain ValueError / TypeError is left

SPECIALS = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e30, 1e-45, -0.0]


def snapshot(args: dict) -> dict:
    return {k: copy.deepcopy(v) for k, v in args.items()}


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind == "O":
            return all(x is y or x == y or (x != x and y != y) for x, y in zip(a.tolist(), b.tolist(), strict=True))
        return a.tobytes() == b.tobytes()
    return a is b or a == b


def call(fn, args: dict):
    """Calls ``fn(**args)``; returns (result, exception), failing on anything untyped and on
    any change to the inputs."""
    before = snapshot(args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. numpy's cast overflow (issue 11 item 8)
            out, err = fn(**args), None
    except TYPED as e:
        out, err = None, e
        msg = str(e)
        assert msg and "\n" not in msg, f"error message is not one line: {msg!r}"
    except BaseException as e:  # a panic (pyo3 PanicException), SystemError, ...
        pytest.fail(f"{fn.__name__} raised {type(e).__name__}: {e}")
    for k, v in args.items():
        assert same(v, before[k]), f"{fn.__name__} modified its `{k}` argument"
    return out, err


def check_array(a, n: int, name: str, extreme: bool):
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (n,), (
        name,
        type(a),
        getattr(a, "dtype", None),
    )
    if not np.isfinite(a).all():
        assert extreme and ALLOW_NONFINITE_OUTPUT, f"`{name}` is not finite for valid, moderate input"


# ----------------------------------------------------------------- adversarial twists


@st.composite
def estimator_call(draw, kind: str):
    """(args, valid, extreme, canonical): the keyword arguments of a call, whether the
    spec accepts them, whether they hold extreme numbers, and for a valid call in another
    dtype or layout the canonical (float32 / bool / int64) args."""
    b: Batch = draw(batches(max_traj=5))
    params = draw(mae_params if kind == "mae" else gae_params)
    use_scores = draw(st.booleans())
    args = dict(values=b.values, mask=b.mask, offsets=b.offsets, **params)
    if use_scores:
        args["scores"] = b.scores
    else:
        args["rewards"] = b.rewards
    valid, extreme, canonical = True, False, None
    policy = np.flatnonzero(b.mask)
    obs = np.flatnonzero(~b.mask)
    twist = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "special-value",
                "special-obs-value",
                "special-reward",
                "special-score",
                "reward-on-obs",
                "f64-overflow",
                "dtype",
                "strided",
                "offsets",
                "empty",
                "2d",
                "param",
                "both-rewards",
                "neither-reward",
                "mask-value",
            ]
        )
    )
    reward_key = "scores" if use_scores else "rewards"
    if twist == "special-value" and policy.size:
        x = draw(st.sampled_from(SPECIALS))
        args["values"] = v = b.values.copy()
        v[draw(st.sampled_from(policy.tolist()))] = x
        valid, extreme = bool(np.isfinite(x)), True
    elif twist == "special-obs-value" and obs.size:
        args["values"] = v = b.values.copy()
        v[draw(st.sampled_from(obs.tolist()))] = draw(st.sampled_from(SPECIALS))  # never read
    elif twist == "special-reward" and not use_scores and policy.size:
        x = draw(st.sampled_from(SPECIALS))
        args["rewards"] = r = b.rewards.copy()
        r[draw(st.sampled_from(policy.tolist()))] = x
        valid, extreme = bool(np.isfinite(x)), True
    elif twist == "special-score" and use_scores and b.n:
        x = draw(st.sampled_from(SPECIALS))
        args["scores"] = s = b.scores.copy()
        s[draw(st.integers(0, b.n - 1))] = x
        valid, extreme = bool(np.isfinite(x)), True
    elif twist == "reward-on-obs" and not use_scores and obs.size:
        args["rewards"] = r = b.rewards.copy()
        r[draw(st.sampled_from(obs.tolist()))] = draw(st.sampled_from([0.5, -1.0, np.nan, np.inf, 1e-45]))
        valid = False
    elif twist == "f64-overflow" and policy.size:
        args["values"] = v = b.values.astype(np.float64)
        v[draw(st.sampled_from(policy.tolist()))] = draw(st.sampled_from([1e300, -1e300, 1e39]))
        valid = False  # beyond float32: refused, never silently inf
    elif twist == "dtype":
        key = draw(st.sampled_from(["values", reward_key, "mask", "offsets"]))
        kinds = {
            "mask": [np.int64, np.uint8, np.float32, np.int8, "object", "str"],
            "offsets": [np.int32, np.uint64, np.float64, "object"],  # float: a TypeError
        }.get(key, [np.float64, np.float16, np.int32, np.bool_, "object", "str", np.complex64])
        dt = draw(st.sampled_from(kinds))
        orig = args[key]
        if dt == "str":
            args[key] = orig.astype(str)
            valid = False
        elif dt == "object":
            args[key] = orig.astype(object)
            valid = None  # numpy may or may not read it: either outcome, but typed
        elif dt == np.complex64 or (key == "offsets" and dt == np.float64):
            args[key] = orig.astype(dt)
            valid = False
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args[key] = orig.astype(dt)
            if key in ("values", "rewards", "scores"):
                # A lossy cast changes the numbers: only an exact one keeps the reference.
                back = np.asarray(args[key]).astype(np.float32)
                exact = np.array_equal(
                    np.nan_to_num(back[b.mask] if key == "values" else back),
                    np.nan_to_num(orig[b.mask] if key == "values" else orig),
                )
                canonical = dict(args, **{key: back}) if exact else None
                valid = None if not exact else True
            else:
                canonical = dict(args, **{key: orig})
    elif twist == "strided":
        for key in ("values", "mask", reward_key):
            a = args[key]
            wide = np.repeat(a, 2)
            args[key] = wide[::2]  # a non-contiguous view of the same numbers
        canonical = dict(args, values=b.values, mask=b.mask, **{reward_key: b.scores if use_scores else b.rewards})
    elif twist == "offsets":
        o = b.offsets.copy()
        choice = draw(st.sampled_from(["start", "overrun", "short", "decrease", "empty", "negative"]))
        if choice == "start":
            o[0] = 1
        elif choice == "overrun":
            o[-1] += 1
        elif choice == "short" and o[-1] > 0:
            o[-1] -= 1
        elif choice == "decrease" and len(o) >= 3:
            o[1] = o[2] + 1
        elif choice == "empty":
            o = o[:0]
        elif choice == "negative":
            o[-1] = -1
        else:
            o[-1] += 2
        args["offsets"] = o
        valid = False
    elif twist == "empty":
        args.update(values=b.values[:0], mask=b.mask[:0], offsets=np.zeros(1, np.int64))
        args[reward_key] = np.zeros(0, np.float32)
    elif twist == "2d":
        key = draw(st.sampled_from(["values", "mask", "offsets"]))
        args[key] = np.stack([args[key], args[key]])
        valid = False
    elif twist == "param":
        name = draw(st.sampled_from(sorted(params)))
        args[name] = draw(st.sampled_from([-0.5, 1.5, np.nan, np.inf, -np.inf, 1e308]))
        ok = {"beta": lambda x: 0 <= x < math.inf, "gamma": lambda x: 0 < x <= 1}.get(name, lambda x: 0 <= x <= 1)
        valid = bool(ok(args[name]))
        extreme = valid
    elif twist == "both-rewards":
        args.update(rewards=b.rewards, scores=b.scores)
        valid = False
    elif twist == "neither-reward":
        args.pop("rewards", None)
        args.pop("scores", None)
        valid = False
    elif twist == "mask-value" and len(b.mask):
        m = b.mask.astype(np.uint8)
        m[draw(st.integers(0, len(m) - 1))] = draw(st.sampled_from([2, 255]))
        args["mask"] = m
        valid = False
    return args, valid, extreme, canonical


def reference_of(kind: str, args: dict):
    kw = {k: v for k, v in args.items() if k not in ("values", "mask", "offsets", "rewards", "scores")}
    mask = np.asarray(args["mask"]).astype(bool).tolist()
    offsets = np.asarray(args["offsets"]).tolist()
    rw = dict(rewards=args.get("rewards"), scores=args.get("scores"))
    fn = ref.mae if kind == "mae" else ref.gae
    return fn(np.asarray(args["values"], np.float32), mask, offsets, **rw, **kw)


@pytest.mark.parametrize("kind", ["mae", "gae"])
@fuzz_settings
@given(data=st.data())
def test_estimators_survive_anything_and_match_the_reference(kind, data):
    args, valid, extreme, canonical = data.draw(estimator_call(kind))
    fn = mpo_rs.mae_advantages if kind == "mae" else mpo_rs.gae_advantages
    out, err = call(lambda **kw: fn(kw.pop("values"), kw.pop("mask"), kw.pop("offsets"), **kw), args)
    if valid is False:
        assert err is not None, f"invalid input accepted: {sorted(args)}"
        return
    if err is not None:
        assert valid is None or extreme, f"valid input refused: {err}"
        return
    n = len(np.asarray(args["mask"]))
    check_array(out.advantages, n, "advantages", extreme)
    check_array(out.returns, n, "returns", extreme)
    if canonical is not None:
        again = fn(canonical.pop("values"), canonical.pop("mask"), canonical.pop("offsets"), **canonical)
        assert out.advantages.tobytes() == again.advantages.tobytes(), "another dtype/layout changed the result"
        assert out.returns.tobytes() == again.returns.tobytes()
    if valid and not extreme:
        want = reference_of(kind, args)
        np.testing.assert_allclose(out.advantages, want[0], **TOL)
        np.testing.assert_allclose(out.returns, want[1], **TOL)
        if kind == "mae":
            np.testing.assert_allclose(out.turn_advantages, want[2], **TOL)


# ----------------------------------------------------------------- group baselines

group_id_kinds = st.sampled_from(
    ["int", "uint", "str", "float", "object-int", "object-str", "bytes", "mixed", "nan", "none", "bool", "2d", "short"]
)


@fuzz_settings
@given(
    scores=st.lists(st.one_of(st.floats(-4, 4, width=32), st.sampled_from(SPECIALS)), max_size=12),
    raw_ids=st.lists(st.integers(0, 3), max_size=12),
    kind=group_id_kinds,
    norm_std=st.booleans(),
    leave_one_out=st.booleans(),
    eps=st.sampled_from([None, 1e-6, 1e-8, 0.5, 0.0, -1.0, np.nan, np.inf]),
)
def test_group_advantages_survive_anything_and_match_the_reference(scores, raw_ids, kind, norm_std, leave_one_out, eps):
    n = min(len(scores), len(raw_ids)) if kind != "short" else len(scores)
    s = np.array(scores[:n], np.float32)
    base = raw_ids[:n] if kind != "short" else raw_ids[: max(n - 1, 0)]
    ids: object
    homogeneous = True
    if kind in ("int", "short"):
        ids = np.array(base, np.int64)
    elif kind == "uint":
        ids = np.array(base, np.uint64) + np.uint64(2**63)
    elif kind == "str":
        ids = np.array([f"p{g}" for g in base])
    elif kind == "bytes":
        ids = np.array([b"p%d" % g for g in base])
    elif kind == "float":
        ids = np.array(base, np.float64) / 2
    elif kind == "object-int":
        ids = np.array([10**30 + g for g in base], dtype=object)
    elif kind == "object-str":
        ids = np.array([f"p{g}" for g in base], dtype=object)
    elif kind == "bool":
        ids = np.array([g % 2 == 0 for g in base])
    elif kind == "2d":
        ids = np.array(base, np.int64).reshape(1, -1)
    else:  # mixed types, NaN, None: the rule is issue 11 item 6's; any typed outcome
        homogeneous = False
        pick = {
            "mixed": lambda g: g if g % 2 else str(g),
            "nan": lambda g: math.nan if g == 0 else g,
            "none": lambda g: None if g == 0 else g,
        }[kind]
        ids = np.array([pick(g) for g in base] + [], dtype=object)
    args = dict(scores=s, group_ids=ids, norm_std=norm_std, eps=eps, leave_one_out=leave_one_out)
    out, err = call(mpo_rs.group_advantages, args)
    # An eps the formula ignores (no std division) is refused, as drgrpo/rloo refuse it.
    ignored_eps = eps is not None and (leave_one_out or not norm_std)
    if eps is None:
        eps = 1e-6
    # A 2-D id array is refused even when empty; one id too few only when there are scores.
    bad = kind == "2d" or (kind == "short" and n > 0) or not np.isfinite(s).all() or not (eps >= 0) or math.isinf(eps)
    bad = bad or ignored_eps
    if bad:
        assert err is not None, "invalid input accepted"
        return
    extreme = bool((np.abs(s) > 1e4).any()) or eps == 0
    if err is not None:
        assert not homogeneous or extreme, f"valid input refused: {err}"
        return
    check_array(out, n, "group advantages", extreme)
    if homogeneous and not extreme:
        key = ids.tolist()
        want = ref.group(s.tolist(), key, norm_std=norm_std, eps=eps, leave_one_out=leave_one_out)
        np.testing.assert_allclose(out, want, **TOL)


# ----------------------------------------------------------------- segmentation, broadcast


@fuzz_settings
@given(
    b=batches(max_traj=6),
    twist=st.sampled_from(["none", "offsets", "mask", "dtype", "strided"]),
    per=st.lists(st.one_of(st.floats(-4, 4, width=32), st.sampled_from(SPECIALS)), max_size=8),
)
def test_segment_and_broadcast_survive_anything(b, twist, per):
    mask, offsets, valid = b.mask, b.offsets, True
    if twist == "offsets":
        offsets = b.offsets.copy()
        offsets[-1] += 1
        valid = False
    elif twist == "mask" and len(mask):
        mask = b.mask.astype(np.int64)
        mask[0] = 3
        valid = False
    elif twist == "dtype":
        mask = b.mask.astype(np.float64)
    elif twist == "strided":
        mask = np.repeat(b.mask, 2)[::2]
    t, err = call(mpo_rs.segment_turns, dict(mask=mask, offsets=offsets))
    if not valid:
        assert err is not None
    else:
        assert err is None, err
        r = ref.segment(b.mask.astype(int).tolist(), b.offsets.tolist())
        assert t.starts.tolist() == r.starts and t.ends.tolist() == r.ends
        assert t.traj_offsets.tolist() == r.traj_offsets and t.token_turn.tolist() == r.token_turn

    p = np.array((per + [0.0] * b.n)[: b.n], np.float32)
    out, err = call(mpo_rs.broadcast_to_tokens, dict(per_trajectory=p, mask=mask, offsets=offsets))
    if not valid:
        assert err is not None
        return
    if err is not None:
        assert not np.isfinite(p).all(), f"valid input refused: {err}"
        return
    assert out.dtype == np.float32 and out.shape == b.mask.shape
    want = np.zeros(len(b.mask), np.float32)
    for j in range(b.n):
        lo, hi = b.offsets[j], b.offsets[j + 1]
        want[lo:hi] = np.where(b.mask[lo:hi], p[j], 0.0)
    assert out.tobytes() == want.tobytes() or (ALLOW_NONFINITE_OUTPUT and np.array_equal(out, want, equal_nan=True))


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
    from mpo_rs.envs import GuessNumber, KeyDoor, VectorEnv

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


# ----------------------------------------------------------------- the learner's config

_HAS_TORCH = importlib.util.find_spec("torch") is not None

# Values of every kind a config file or a command line might hand over: numbers of both
# signs and none, non-finite, huge, bools, numpy scalars, strings, containers, objects.
_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([0, 1, 2, -1, 10**400, np.int64(4), np.True_, np.float32(0.5)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, -0.5, 2.5, math.nan, math.inf, -math.inf, 1e-300, 1e300]),
    st.sampled_from(["", "mae", "gae", "rloo", "vapo", "turn", "token", "whiten", "none", "product", "cpu", "1"]),
    st.sampled_from(["token-mean", "seq-mean-token-sum", "sequence", "geo_mean", "gpu0", "cpu:0"]),
    st.sampled_from([[], [1], {"lam": 0.9}, object(), b"mae", (0.2,)]),
)


def _learner_field_values():
    """Up to 4 fields, each set to a value it accepts or to anything (``_ANY_VALUE``)."""
    from mpo_rs.torch import learner_config as lc
    from mpo_rs.torch.losses import AGGREGATIONS, RATIO_MODES, TURN_RATIOS

    def unit(lo, hi):
        return st.floats(lo, hi, allow_nan=False)

    valid = {
        "estimator": st.one_of(
            st.sampled_from(mpo_rs.Estimator.names()),
            st.sampled_from([mpo_rs.Estimator(n) for n in mpo_rs.Estimator.names()]),
            st.builds(lambda lam, beta: mpo_rs.Estimator("mae", lam=lam, beta=beta), unit(0, 1), unit(0, 3)),
        ),
        "advantage_scale": st.sampled_from(lc.ADVANTAGE_SCALES),
        "ratio": st.sampled_from((None, *RATIO_MODES)),
        "turn_ratio": st.sampled_from(TURN_RATIOS),
        "clip_low": unit(0, 0.99),
        "clip_high": unit(0, 10),
        "dual_clip": st.one_of(st.none(), unit(1.01, 10)),
        "log_ratio_clamp": unit(0.01, 50),
        "agg": st.sampled_from(AGGREGATIONS),
        "value_clip": st.one_of(st.none(), unit(0.01, 10)),
        "entropy_coef": unit(-1, 1),
        "ppo_epochs": st.integers(1, 3),
        "minibatch_size": st.integers(1, 8),
        "micro_batch_size": st.one_of(st.none(), st.integers(1, 8)),
        "max_grad_norm": st.one_of(st.none(), unit(1e-3, 10)),
        "bf16": st.booleans(),
        "temperature": unit(0.1, 5),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**64),
        "device": st.sampled_from([None, "cpu"]),
        "critic_epochs": st.one_of(st.none(), st.integers(1, 3)),
    }
    assert valid.keys() == {f.name for f in dataclasses.fields(lc.LearnerConfig)}
    return st.lists(st.sampled_from(sorted(valid)), max_size=4, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: st.one_of(valid[n], _ANY_VALUE) for n in names})
    )


@pytest.mark.skipif(not _HAS_TORCH, reason="needs torch")
@fuzz_settings
@given(data=st.data())
def test_learner_config_fields_give_a_config_or_an_invalid_option_error(data):
    """Random values per LearnerConfig field (wrong types, NaN, inf, negatives, bools): a
    valid config whose fields have their kinds, or InvalidOptionError, never another
    exception; an accepted config on the CPU also trains one step."""
    import torch

    from mpo_rs.torch.learner import Learner, LearnerConfig, RolloutBatch

    kwargs = data.draw(_learner_field_values(), label="fields")
    try:
        config = LearnerConfig(**kwargs)
    except mpo_rs.InvalidOptionError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        event("refused")
        return
    event("accepted")
    assert isinstance(config.estimator, mpo_rs.Estimator)
    for name in ("ppo_epochs", "minibatch_size", "seed"):
        value = getattr(config, name)
        assert type(value) is int and value >= 0, (name, value)
    for name in ("micro_batch_size", "critic_epochs"):
        value = getattr(config, name)
        assert value is None or (type(value) is int and value >= 1), (name, value)
    for name in ("clip_low", "clip_high", "log_ratio_clamp", "entropy_coef", "temperature"):
        value = getattr(config, name)
        assert type(value) is float and math.isfinite(value), (name, value)
    for name in ("max_grad_norm", "value_clip", "dual_clip"):
        value = getattr(config, name)
        assert value is None or (type(value) is float and math.isfinite(value) and value > 0), (name, value)
    for name in ("bf16", "shuffle"):
        assert type(getattr(config, name)) is bool, name
    if config.device not in (None, "cpu") or max(config.ppo_epochs, config.critic_passes) > 3:
        return  # a device this machine may not have; 10**20 epochs are valid but endless
    torch.manual_seed(0)
    offsets = np.array([0, 3, 6, 9, 12])
    batch = RolloutBatch(
        token_ids=np.tile([0, 1, 2], 4),
        mask=np.tile([False, True, True], 4),
        offsets=offsets,
        scores=np.array([1.0, 0.0, 1.0, 0.5], np.float32),
        group_ids=[0, 0, 1, 1],
        values=np.zeros(12, np.float32),
    )

    class Policy(torch.nn.Module):  # logits (B, L, 4) from the token alone
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(4, 4)

        def forward(self, input_ids, attention_mask):
            return self.embed(input_ids)

    model = Policy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if config.critic_epochs is not None:  # the critic's passes, for a learner with no critic
        with pytest.raises(mpo_rs.InvalidOptionError, match="critic_epochs"):
            Learner(model, optimizer, config)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. bf16 autocast on a CPU without it
        metrics = Learner(model, optimizer, config).step(batch)
    assert all(isinstance(v, float) for v in metrics.values())


# --- GroupStatistics: scan and merge under random block splits and id types (issue 18) ---

_POOLS = {
    "int64": [0, 1, 2, -1, -7, 2**53, 2**53 + 1, 2**62],
    "uint64": [0, 1, 2, 7, 2**63, 2**64 - 1],
    "float64": [0.0, -0.0, 1.0, 2.0, 0.5, -7.0, 2.0**53, 1e20],
    "string": ["0", "1", "a", ""],
}


@st.composite
def _blocks(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(_POOLS)), min_size=1, max_size=5))
    blocks = []
    for kind in kinds:
        ids = draw(st.lists(st.sampled_from(_POOLS[kind]), max_size=6))
        scores = draw(st.lists(st.integers(-50, 50), min_size=len(ids), max_size=len(ids)))
        blocks.append((kind, ids, [s / 4 for s in scores]))
    return blocks


def _expected_refusal(blocks) -> str | None:
    """The group-id rule of docs/estimators.md, over the non-empty blocks: a pattern of the
    messages of the rules broken (any of them may be reported first), or None."""
    kinds = {kind for kind, ids, _ in blocks if ids}
    ints = [i for kind, ids, _ in blocks if kind in ("int64", "uint64") for i in ids]
    broken = []
    if "string" in kinds and kinds - {"string"}:
        broken.append("all numbers or all strings")
    if "float64" in kinds and any(float(i) != i for i in ints):
        broken.append("has no exact float64")
    if "float64" not in kinds and "int64" in kinds and any(i > 2**63 - 1 for i in ints):
        broken.append("beyond int64")
    return "|".join(broken) or None


@fuzz_settings
@given(_blocks())
def test_group_statistics_merge_equals_a_one_pass_reference(blocks):
    pa = pytest.importorskip("pyarrow")
    partials = []
    for kind, ids, scores in blocks:
        table = pa.table(
            {
                "g": pa.array(ids, {"string": pa.string()}.get(kind, getattr(pa, kind)())),
                "score": pa.array(scores, pa.float32()),
            }
        )
        stats = mpo_rs._native.GroupStatistics.scan(table, columns=mpo_rs.Columns(group="g", mask="m", score="score"))
        partials.append(pa.table(stats.to_arrow()))
    labels = [f"block {i}" for i in range(len(blocks))]
    refusal = _expected_refusal(blocks)
    if refusal is not None:
        with pytest.raises(mpo_rs.InvalidBatchError, match=refusal):
            mpo_rs._native.GroupStatistics.merge(partials, labels=labels)
        return
    merged = pa.table(mpo_rs._native.GroupStatistics.merge(partials, labels=labels).to_arrow())
    # The reference: one pass over every row, keys by exact value (Python's own rule: 1 ==
    # 1.0, 2**53 + 1 != 2.0**53), strings a kind of their own.
    ref_rows: dict[object, list[float]] = {}
    for kind, ids, scores in blocks:
        for i, s in zip(ids, scores, strict=True):
            key = ("s", i) if kind == "string" else ("n", i)
            ref_rows.setdefault(key, []).append(float(np.float32(s)))
    got = merged.to_pydict()
    assert len(got["group"]) == len(ref_rows), "one row per group, exact keys"
    assert got["group"] == sorted(got["group"])
    for g, n, total, m2 in zip(got["group"], got["count"], got["sum"], got["m2"], strict=True):
        member = ref_rows[("s", g) if isinstance(g, str) else ("n", g)]
        assert n == len(member)
        mean = math.fsum(member) / n
        assert total == pytest.approx(math.fsum(member), rel=1e-12, abs=1e-12)
        assert m2 == pytest.approx(math.fsum((x - mean) ** 2 for x in member), rel=1e-9, abs=1e-9)
    # A merged table merged alone is itself.
    again = pa.table(mpo_rs._native.GroupStatistics.merge([merged]).to_arrow())
    assert again.equals(merged)
