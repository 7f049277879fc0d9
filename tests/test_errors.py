"""Every bad input of the estimators (docs/estimators.md) raises a typed exception naming what and where."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import mpo_rs

MASK = np.array([1, 1, 0, 1, 1, 1], bool)
VALUES = np.array([1, 2, np.nan, 3, 4, 5], np.float32)
REWARDS = np.array([0, 0, 0, 0, 0, 1], np.float32)
OFFSETS = np.array([0, 3, 6], np.int64)
ESTIMATORS = [mpo_rs.mae_advantages, mpo_rs.gae_advantages]


def call(fn, values=VALUES, mask=MASK, offsets=OFFSETS, **kw):
    if "scores" not in kw and "rewards" not in kw:
        kw["rewards"] = REWARDS
    return fn(values, mask, offsets, **kw)


def test_invalid_batch_error_is_a_value_error():
    assert issubclass(mpo_rs.InvalidBatchError, ValueError)
    assert issubclass(mpo_rs.InvalidBatchError, mpo_rs.MpoError)
    assert str(mpo_rs.InvalidBatchError) == "<class 'mpo_rs.exceptions.InvalidBatchError'>"


@pytest.mark.parametrize("fn", ESTIMATORS)
@pytest.mark.parametrize("kw", [dict(lam=1.5), dict(gamma=0.0), dict(lam_critic=2.0), dict(lam=float("nan"))])
def test_options_out_of_range_are_invalid_option_errors(fn, kw):
    with pytest.raises(mpo_rs.InvalidOptionError, match="is out of range"):
        call(fn, **kw)


@pytest.mark.parametrize("fn", ESTIMATORS)
@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(values=VALUES[:5]), r"`values` has length 5, expected 6"),
        (dict(rewards=REWARDS[:4]), r"`rewards` has length 4, expected 6"),
        (dict(offsets=np.array([0, 4, 3, 6])), r"`offsets` decreases at trajectory 1"),
        (dict(offsets=np.array([0, 3, 7])), r"`offsets` overruns the tokens: offsets\[2\] = 7"),
        (dict(offsets=np.array([0, 3, 5])), r"`offsets` stops short"),
        (dict(offsets=np.array([1, 3, 6])), r"`offsets` must start at 0"),
        (dict(offsets=np.array([], np.int64)), r"`offsets` is empty"),
        (
            dict(values=np.where(np.arange(6) == 4, np.inf, VALUES)),
            r"`values` is not finite \(inf\) at token 4 \(trajectory 1, position 1\)",
        ),
        (
            dict(rewards=np.where(np.arange(6) == 1, np.nan, REWARDS)),
            r"`rewards` is not finite \(NaN\) at token 1 \(trajectory 0, position 1\)",
        ),
        (
            dict(rewards=np.where(np.arange(6) == 2, 0.5, REWARDS)),
            r"`rewards` is 0.5 at observation token 2 \(trajectory 0, position 2\)",
        ),
        (dict(rewards=REWARDS, scores=np.ones(2, np.float32)), r"exactly one of `rewards`"),
        (dict(scores=np.array([1.0, np.nan], np.float32)), r"`scores` is not finite \(NaN\) at trajectory 1"),
        (dict(scores=np.ones(3, np.float32)), r"`scores` has length 3, expected 2"),
        (dict(mask=np.array([1, 1, 0, 2, 1, 1], np.uint8)), r"`mask` must hold 0 or 1, found 2 at token 3"),
        (dict(mask=np.array([1, 1, 0, 5, 1, 1], np.int64)), r"`mask` must hold 0 or 1, found 5 at token 3"),
        (dict(lam=1.5), r"`lam` = 1.5 is out of range: it must be in \[0, 1\]"),
        (dict(lam=-0.1), r"`lam` = -0.1 is out of range"),
        (dict(gamma=0.0), r"`gamma` = 0 is out of range: it must be in \(0, 1\]"),
        (dict(gamma=1.01), r"`gamma` = 1.01 is out of range"),
        (dict(lam_critic=2.0), r"`lam_critic` = 2 is out of range"),
        (dict(lam=float("nan")), r"`lam` = NaN is out of range"),
    ],
)
def test_bad_batches_raise_typed_errors_naming_the_place(fn, kw, pattern):
    expected = mpo_rs.InvalidOptionError if "out of range" in pattern else mpo_rs.InvalidBatchError
    with pytest.raises(expected, match=pattern):
        call(fn, **kw)


def test_neither_rewards_nor_scores():
    with pytest.raises(mpo_rs.InvalidBatchError, match="exactly one of `rewards`"):
        mpo_rs.mae_advantages(VALUES, MASK, OFFSETS)


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(lam_intra=1.2), r"`lam_intra` = 1.2"),
        (dict(beta=-0.5), r"`beta` = -0.5 is out of range: it must be in \[0, inf\)"),
        (dict(beta=float("inf")), r"`beta` = inf"),
    ],
)
def test_mae_only_parameters(kw, pattern):
    with pytest.raises(mpo_rs.InvalidOptionError, match=pattern):
        call(mpo_rs.mae_advantages, **kw)


def test_length_adaptive_alpha_must_be_positive():
    with pytest.raises(mpo_rs.InvalidOptionError, match="length_adaptive_alpha"):
        call(mpo_rs.gae_advantages, length_adaptive_alpha=0.0)


@pytest.mark.parametrize("fn", ESTIMATORS)
@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(values=np.array(["a"] * 6)), r"`values` must be a real numeric array"),
        (dict(values=VALUES.astype(np.complex64)), r"`values` must be a real numeric array"),
        (dict(offsets=OFFSETS.astype(np.float64)), r"`offsets` must be an integer array"),
        (dict(mask=np.array(["x"] * 6)), r"`mask` must be a bool or 0/1 integer array"),
        (dict(values=object()), r"`values`"),
    ],
)
def test_wrong_kind_of_array_is_an_invalid_batch_error(fn, kw, pattern):
    with pytest.raises(mpo_rs.InvalidBatchError, match=pattern):
        call(fn, **kw)


@pytest.mark.parametrize("fn", ESTIMATORS)
def test_two_dimensional_input_is_rejected(fn):
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`values` must be 1-D"):
        call(fn, values=np.zeros((2, 3), np.float32))


def test_nan_values_on_observation_tokens_are_never_read():
    values = VALUES.copy()
    values[2] = np.nan
    a = call(mpo_rs.mae_advantages, values=values)
    values[2] = 123.0
    b = call(mpo_rs.mae_advantages, values=values)
    assert np.array_equal(a.advantages, b.advantages) and np.array_equal(a.returns, b.returns)


def test_the_first_bad_trajectory_is_reported_whatever_the_threads():
    n = 2000
    offsets = np.arange(n + 1, dtype=np.int64) * 4
    mask = np.ones(4 * n, bool)
    values = np.zeros(4 * n, np.float32)
    values[[4 * 1500 + 1, 4 * 700 + 2, 4 * 1999]] = np.nan
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"token 2802 \(trajectory 700, position 2\)"):
        mpo_rs.mae_advantages(values, mask, offsets, scores=np.zeros(n, np.float32))


def test_group_errors():
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`group_ids` has length 2, expected 3"):
        mpo_rs.group_advantages(np.zeros(3), [1, 2])
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`scores` is not finite \(NaN\) at trajectory 1"):
        mpo_rs.group_advantages([1.0, np.nan], [0, 0])
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`eps` = -1"):
        mpo_rs.group_advantages([1.0, 2.0], [0, 0], eps=-1.0)
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`group_ids` must be 1-D"):
        mpo_rs.group_advantages([1.0, 2.0], [[0, 0]])
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`group_ids` is nan at trajectory 0"):
        mpo_rs.group_advantages([1.0, 2.0], [np.nan, 0.0])


def test_segment_turns_errors():
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`offsets` overruns"):
        mpo_rs.segment_turns(MASK, [0, 7])
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"`offsets` must be an integer array"):
        mpo_rs.segment_turns(MASK, [0.0, 6.0])


def test_inputs_are_never_modified():
    arrays = dict(values=VALUES.copy(), mask=MASK.copy(), offsets=OFFSETS.copy(), rewards=REWARDS.copy())
    before = {k: v.copy() for k, v in arrays.items()}
    mpo_rs.mae_advantages(**arrays)
    mpo_rs.gae_advantages(**arrays)
    for k in arrays:
        np.testing.assert_array_equal(arrays[k], before[k])


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_any_f32 = hnp.arrays(np.float32, st.integers(0, 12), elements=st.floats(width=32))
_any_u8 = hnp.arrays(np.uint8, st.integers(0, 12))
_any_i64 = hnp.arrays(np.int64, st.integers(0, 6), elements=st.integers(-3, 15))


@given(_any_f32, _any_u8, _any_i64, _any_f32, st.booleans(), st.floats(-1, 2), st.floats(-1, 2))
def test_no_input_crashes_the_process(values, mask, offsets, rewards, as_scores, lam, gamma):
    """Garbage in gives a result or a ValueError -- never a panic (pyo3's PanicException
    is a BaseException, so it would escape the `except`)."""
    kw = {"scores" if as_scores else "rewards": rewards}
    for fn in (mpo_rs.mae_advantages, mpo_rs.gae_advantages):
        try:
            fn(values, mask, offsets, lam=lam, gamma=gamma, **kw)
        except ValueError:
            pass
    for fn in (mpo_rs.segment_turns, lambda m, o: mpo_rs.broadcast_to_tokens(values, m, o)):
        try:
            fn(mask, offsets)
        except ValueError:
            pass
    try:
        mpo_rs.group_advantages(values, mask)
    except ValueError:
        pass


@pytest.mark.parametrize("fn", ESTIMATORS)
def test_float64_beyond_float32_is_named_with_its_value_and_no_warning(fn):
    import warnings

    values = np.array([1, 2, 0, 3, 1e300, 5], np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow RuntimeWarning would fail here
        with pytest.raises(mpo_rs.InvalidBatchError, match=r"^`values`: 1e300 at token 4 is outside float32's range$"):
            call(fn, values=values)
        with pytest.raises(
            mpo_rs.InvalidBatchError, match=r"^`scores`: -3.5e38 at trajectory 1 is outside float32's range$"
        ):
            call(fn, scores=np.array([1.0, -3.5e38]))
        # Up to float32's largest value is in range; an infinite float64 is still "not finite".
        from mpo_rs._arrays import float32

        assert float32(np.array([3.4028235e38, -1e-300]), "values").tolist() == [np.finfo(np.float32).max, -0.0]
        with pytest.raises(mpo_rs.InvalidBatchError, match=r"`values` is not finite \(inf\) at token 4"):
            call(fn, values=np.where(np.arange(6) == 4, np.inf, VALUES.astype(np.float64)))


# --------------------------------------------------------------------------- typed errors only

PACKAGE = Path(mpo_rs.__file__).resolve().parent


def plain_raises(path: Path) -> list[str]:
    """``raise ValueError(...)`` / ``raise TypeError`` statements of a module, as file:line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}")
    return found


def test_no_plain_value_or_type_error_on_a_public_path():
    """Deliverable 3 of issue 18: every error mpo_rs raises is one of mpo_rs.exceptions
    (all ValueError subclasses, so `except ValueError` keeps working), which says whether
    the data, an option or a configuration is at fault."""
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20
    assert [hit for path in modules for hit in plain_raises(path)] == []


# ------------------------------------------------------------------ where an error points


def test_a_batch_error_carries_its_column_trajectory_and_token():
    values = np.zeros(7, np.float32)
    values[5] = np.nan  # trajectory 1 (tokens 3-6), position 2
    mask = np.ones(7, np.uint8)
    with pytest.raises(mpo_rs.InvalidBatchError) as info:
        mpo_rs.mae_advantages(values, mask, np.array([0, 3, 7]), scores=np.zeros(2, np.float32))
    e = info.value
    assert (e.column, e.trajectory, e.token, e.missing) == ("values", 1, 2, None), str(e)


def test_an_option_error_names_its_option():
    with pytest.raises(mpo_rs.InvalidOptionError) as info:
        mpo_rs.Estimator("mae", lam=2.0)
    assert info.value.option == "lam"
    with pytest.raises(mpo_rs.InvalidOptionError) as info:
        mpo_rs.Estimator("mea")
    assert info.value.option == "estimator"
    with pytest.raises(mpo_rs.InvalidOptionError) as info:
        mpo_rs.Estimator("grpo", lam=0.5)
    assert info.value.option == "lam"


def test_a_missing_column_names_every_alternative():
    pa = pytest.importorskip("pyarrow")
    from mpo_rs.arrow import with_advantages

    table = pa.table({"loss_mask": [[1, 1]], "values": [[0.0, 0.0]]})
    with pytest.raises(mpo_rs.InvalidBatchError) as info:
        with_advantages(table)
    assert info.value.missing == ("rewards", "score", "turn_rewards"), str(info.value)
    assert info.value.trajectory is None and info.value.token is None


def test_an_error_raised_in_python_has_the_attributes_as_none():
    e = mpo_rs.InvalidBatchError("made here")
    assert (e.column, e.missing, e.trajectory, e.token) == (None, None, None, None)
    assert mpo_rs.InvalidOptionError("made here").option is None


def test_no_module_parses_an_error_message_back():
    # The hints are built from the attributes: no regular expression reads an error's text.
    root = Path(__file__).resolve().parents[1] / "python" / "mpo_rs"
    for name in ("columns.py", "arrow.py"):
        assert "re.compile" not in (root / name).read_text(), name
