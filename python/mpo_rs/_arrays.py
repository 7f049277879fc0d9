"""Coercion of user arrays to what the Rust core reads.

Contiguous arrays of the right dtype pass through untouched (no copy); anything numpy can
view -- float64, strided slices, torch CPU tensors, Arrow arrays -- is converted. The
wrong kind, dtype or shape of input raises ``InvalidBatchError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from .exceptions import InvalidBatchError


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A numpy view of ``x`` (a copy only where numpy must make one)."""
    if isinstance(x, np.ndarray):
        return x
    device = getattr(x, "device", None)
    if device is not None and hasattr(x, "detach"):  # a torch tensor
        if getattr(device, "type", "cpu") != "cpu":
            raise InvalidBatchError(
                f"`{name}` is a tensor on {device}; the estimators read host memory, pass `{{name}}.cpu()`".replace(
                    "{name}", name
                )
            )
        x = x.detach()
        if x.dtype.is_floating_point and x.dtype.itemsize < 4:
            x = x.float()  # float16 / bfloat16 have no numpy view
        view: np.ndarray = x.numpy()
        return view
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidBatchError(f"`{name}` cannot be read as an array: {e}") from None


_F32, _I64, _U8, _BOOL = (np.dtype(t) for t in (np.float32, np.int64, np.uint8, np.bool_))


def _ready(x: Any, dtype: np.dtype[Any]) -> bool:
    """Whether ``x`` is already what the core reads: a C-contiguous 1-D ndarray of ``dtype``.
    Such an input passes as is, before any other check: most calls give one, and on a small
    batch the checks are a measurable part of a call's cost."""
    return type(x) is np.ndarray and x.dtype is dtype and x.ndim == 1 and x.flags.c_contiguous


def _one_dim(arr: np.ndarray, name: str) -> None:
    if arr.ndim != 1:
        raise InvalidBatchError(f"`{name}` must be 1-D (flat tokens or trajectories), got shape {arr.shape}")


def _flat_of_kind(x: Any, name: str, kinds: str, what: str) -> np.ndarray:
    """``x`` as a 1-D numpy array whose dtype kind is one of ``kinds``, else
    ``InvalidBatchError``: `name` must be ``what``."""
    arr = as_numpy(x, name)
    if arr.dtype.kind not in kinds:
        raise InvalidBatchError(f"`{name}` must be {what}, got dtype {arr.dtype}")
    _one_dim(arr, name)
    return arr


# What one element of an argument is, when it is not a token (for error messages).
_UNITS = {"scores": "trajectory", "per_trajectory": "trajectory", "check_scores": "trajectory", "turn_rewards": "turn"}


def _place(name: str) -> Callable[[int], str]:
    unit = _UNITS.get(name, "token")
    return lambda i: f"{unit} {i}"


def float32(x: Any, name: str, where: Callable[[int], str] | None = None) -> npt.NDArray[np.float32]:
    """``x`` as a contiguous 1-D float32 array. ``where(i)`` names element ``i`` in an error
    (default: the token, trajectory or turn, as ``name`` holds one per each)."""
    if _ready(x, _F32):
        return x  # type: ignore[no-any-return]
    arr = _flat_of_kind(x, name, "fiub", "a real numeric array")
    if arr.dtype.kind != "f" or arr.dtype.itemsize <= 4:
        return np.ascontiguousarray(arr, dtype=np.float32)  # integers and halves always fit
    # A wider float beyond float32's range would become ±inf (with a RuntimeWarning) and
    # then be blamed as "inf is not finite"; name the value instead.
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        beyond = np.flatnonzero(np.isinf(out) & np.isfinite(arr))
        if beyond.size:
            i = int(beyond[0])
            place = (where or _place(name))(i)
            raise InvalidBatchError(f"`{name}`: {_number(arr[i])} at {place} is outside float32's range")
    return out


def _number(x: Any) -> str:
    """A float as the Parquet tool prints it: 1e300, -3.5e38."""
    return repr(float(x)).replace("e+", "e")


def int64(x: Any, name: str) -> npt.NDArray[np.int64]:
    if _ready(x, _I64):
        return x  # type: ignore[no-any-return]
    arr = _flat_of_kind(x, name, "iu", "an integer array")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        i = int(np.argmax(arr > np.iinfo(np.int64).max))
        # Ids are int64 values on every path (the Parquet/Arrow reader refuses the same).
        raise InvalidBatchError(
            f"`{name}` holds {int(arr[i])} at index {i}, beyond int64's range (ids are int64 values, compared by value)"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def mask_u8(x: Any, name: str = "mask") -> npt.NDArray[np.uint8]:
    """bool and uint8 masks are viewed as bytes without a copy; integer or float masks must
    hold only 0 and 1 and are converted."""
    if _ready(x, _BOOL):
        return x.view(np.uint8)  # type: ignore[no-any-return]
    if _ready(x, _U8):
        return x  # type: ignore[no-any-return]
    arr = as_numpy(x, name)
    _one_dim(arr, name)
    if arr.dtype == np.bool_:
        return np.ascontiguousarray(arr).view(np.uint8)
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)  # the core checks for values other than 0/1
    if arr.dtype.kind not in "iuf":
        raise InvalidBatchError(f"`{name}` must be a bool or 0/1 integer array, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr != 0) & (arr != 1))
    if bad.size:
        raise InvalidBatchError(f"`{name}` must hold 0 or 1, found {arr[bad[0]].item()!r} at token {bad[0]}")
    return arr.astype(np.uint8)


def _is_row(x: Any) -> bool:
    """Whether an element of a list is itself a sequence (a row of a ragged input)."""
    return isinstance(x, (list, tuple)) or getattr(x, "ndim", 0) >= 1


def ragged_float32(x: Any, name: str, n_rows: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64] | None]:
    """A per-turn input: a flat array (the batch's turns in order; offsets None), or a list
    of ``n_rows`` sequences, one per trajectory (flattened, with their offsets, so that a
    count that disagrees can be named by trajectory)."""
    rows = _rows(x, name, n_rows)
    if rows is None:
        return float32(_unboxed(x), name), None
    flat = [float32(e, f"{name}[{j}]", _turn_of(j)) for j, e in enumerate(rows)]
    return np.ascontiguousarray(np.concatenate(flat), dtype=np.float32), _row_offsets(flat)


def ragged_int64(x: Any, name: str, n_rows: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """A per-turn integer input (ids), flat or one sequence per trajectory, as
    :func:`ragged_float32` reads it."""
    rows = _rows(x, name, n_rows)
    if rows is None:
        return int64(_empty_ints(_unboxed(x)), name), None
    flat = [int64(_empty_ints(e), f"{name}[{j}]") for j, e in enumerate(rows)]
    return np.ascontiguousarray(np.concatenate(flat), dtype=np.int64), _row_offsets(flat)


def _empty_ints(x: Any) -> Any:
    """An empty list or tuple as an empty int64 array (numpy reads it as float64)."""
    return np.zeros(0, np.int64) if isinstance(x, (list, tuple)) and not x else x


def _unboxed(x: Any) -> Any:
    """A 1-D numpy object array (a ragged array of rows, or an empty one) as a list."""
    return list(x) if isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 1 else x


def _rows(x: Any, name: str, n_rows: int) -> list[Any] | None:
    """``x`` as one sequence per trajectory when it is given so, else None (flat)."""
    x = _unboxed(x)
    if not (isinstance(x, (list, tuple)) and len(x) and all(_is_row(e) for e in x)):
        return None
    if len(x) != n_rows:
        raise InvalidBatchError(f"`{name}` has {len(x)} lists, expected {n_rows} (one per trajectory)")
    return list(x)


def _row_offsets(rows: list[np.ndarray]) -> npt.NDArray[np.int64]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.shape[0] for r in rows], out=offsets[1:])
    return offsets


def _turn_of(j: int) -> Callable[[int], str]:
    return lambda i: f"turn {i} of trajectory {j}"


def flags(x: Any, name: str) -> npt.NDArray[np.bool_]:
    """One flag per trajectory: bool, or numbers that are 0 or 1."""
    arr = as_numpy(x, name)
    if arr.dtype != np.bool_ and arr.dtype.kind not in "iuf":
        raise InvalidBatchError(f"`{name}` must be a bool array (one flag per trajectory), got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidBatchError(f"`{name}` must be 1-D (one flag per trajectory), got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return np.ascontiguousarray(arr)
    bad = np.flatnonzero((arr != 0) & (arr != 1))
    if bad.size:
        raise InvalidBatchError(f"`{name}` must hold 0 or 1, found {arr[bad[0]].item()!r} at trajectory {bad[0]}")
    return arr.astype(np.bool_)
