"""A hypothesis fuzzer of the Python API (issue 11): random and adversarial calls of every
estimator, checked against the independent reference (mpo_rs.testing.reference).

Each call gets a batch from mpo_rs.testing.strategies and then, maybe, one adversarial twist:
NaN/inf or huge numbers where they are read or where they are not, float64 values beyond
float32, other dtypes (float64, float16, int, bool, object, str, complex), strided views,
broken offsets, empty batches, 2-D arrays, out-of-domain parameters, group ids of every
kind (ints, strings, objects, NaN, mixed). Whatever the input:

- the call returns, or raises one of ``mpo_rs.exceptions`` (``InvalidBatchError``, ...) with a
  one-line message -- never another exception, never a panic;
- no input array is modified;
- a result has float32 outputs of the right length, equal to the reference when the input
  is valid and moderate, and finite (see ``ALLOW_NONFINITE_OUTPUT``);
- a valid input in another dtype or layout gives the same bits as its canonical form.

``make test`` runs the profile's examples (60, CI 150); ``make fuzz`` sets
``MPO_FUZZ_EXAMPLES`` for a longer run. The stateful objects (VectorEnv, LearnerConfig,
GroupStatistics) are fuzzed in tests/test_fuzz_objects.py under the same settings.
"""

from __future__ import annotations

import copy
import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpo_rs
from mpo_rs.testing import reference as ref
from mpo_rs.testing.strategies import Batch, batches, gae_params, mae_params

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


# Two token ids whose anchor hashes (FNV-1a 64) collide (tests/test_gigpo_states.py says how
# they were found): a vocabulary holding both meets the case a hash-keyed reference never
# could.
COLLIDING = (4017207813578192166, -348170734932881874)


@fuzz_settings
@given(
    data=st.data(),
    n=st.integers(0, 6),
    container=st.sampled_from(["list", "tuple", "int64", "float64", "uint64", "object"]),
    anchor=st.sampled_from(["ids-rows", "ids-flat", "ids-uint64", "observation", "prefix"]),
)
def test_gigpo_states_and_groups_by_one_rule_for_every_container(data, n, container, anchor):
    """GiGPO (issue 42 items 1-3): group ids in any container number the step groups alike;
    token-id states over a vocabulary with a colliding pair equal the token-keyed reference;
    uint64 anchor ids are their values, or refused beyond int64's range."""
    from mpo_rs.testing import reference as reference_gigpo

    mask: list[int] = []
    tokens: list[int] = []
    offsets = [0]
    vocab = st.sampled_from([COLLIDING[0], COLLIDING[1], 2])
    for _ in range(n):
        policy = data.draw(st.booleans())
        for _ in range(data.draw(st.integers(0, 5))):
            length = data.draw(st.integers(1, 2))
            mask += [int(policy)] * length
            tokens += data.draw(st.lists(vocab, min_size=length, max_size=length))
            policy = not policy
        offsets.append(len(mask))
    m = np.array(mask, np.uint8)
    turns = [reference_gigpo.turns_of(m, offsets[j], offsets[j + 1]) for j in range(n)]
    raw = data.draw(st.lists(st.sampled_from([7, 3, 5]), min_size=n, max_size=n))
    ids = {
        "list": list(raw),
        "tuple": tuple(raw),
        "int64": np.array(raw, np.int64),
        "float64": np.array(raw, np.float64),
        "uint64": np.array(raw, np.uint64),
        "object": np.array(raw, dtype=object),
    }[container]
    states = [data.draw(st.lists(st.sampled_from([0, 1, 2**63 - 1]), min_size=len(t), max_size=len(t))) for t in turns]
    scores = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, -2.0]), min_size=n, max_size=n)), np.float32)
    kw: dict = {}
    if anchor == "ids-rows":
        kw["turn_state_ids"] = states
    elif anchor == "ids-flat":
        kw["turn_state_ids"] = np.array([s for row in states for s in row], np.int64)
    elif anchor == "ids-uint64":
        flat = np.array([s for row in states for s in row], np.uint64)
        beyond = flat.size > 0 and data.draw(st.booleans())
        if beyond:
            flat[-1] = 2**64 - 1  # not the id -1: refused on every path
        kw["turn_state_ids"] = flat
        if beyond:
            with pytest.raises(mpo_rs.InvalidBatchError, match="beyond int64's range"):
                mpo_rs.gigpo_advantages(m, offsets, group_ids=ids, scores=scores, **kw)
            return
    else:
        kw.update(token_ids=np.array(tokens, np.int64), anchor=anchor)
    got = mpo_rs.gigpo_advantages(m, offsets, group_ids=ids, scores=scores, **kw)
    options = {k: v for k, v in kw.items() if k == "anchor"}
    want = reference_gigpo.gigpo(
        m,
        offsets,
        list(raw),
        scores=scores,
        turn_state_ids=states if anchor.startswith("ids") else None,
        token_ids=tokens,
        **options,
    )
    np.testing.assert_allclose(got.advantages.astype(np.float64), want.advantages, **TOL)
    np.testing.assert_array_equal(got.step_groups, want.step_groups)
    # The list container computes the same bits.
    as_list = mpo_rs.gigpo_advantages(m, offsets, group_ids=list(raw), scores=scores, **kw)
    assert as_list.advantages.tobytes() == got.advantages.tobytes()
    assert as_list.step_groups.tolist() == got.step_groups.tolist()
