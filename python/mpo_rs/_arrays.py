"""Coercion of user arrays to what the Rust core reads.

Contiguous arrays of the right dtype pass through untouched (no copy); anything numpy can
view -- float64, strided slices, torch CPU tensors, Arrow arrays -- is converted. The
wrong kind, dtype or shape of input raises ``InvalidBatchError`` naming the argument.
"""

from __future__ import annotations

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


def _one_dim(arr: np.ndarray, name: str) -> None:
    if arr.ndim != 1:
        raise InvalidBatchError(f"`{name}` must be 1-D (flat tokens or trajectories), got shape {arr.shape}")


# Arguments with one number per trajectory rather than per token (for error messages).
_PER_TRAJECTORY = frozenset({"scores", "per_trajectory"})


def float32(x: Any, name: str) -> npt.NDArray[np.float32]:
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "fiub":
        raise InvalidBatchError(f"`{name}` must be a real numeric array, got dtype {arr.dtype}")
    _one_dim(arr, name)
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
            where = "trajectory" if name in _PER_TRAJECTORY else "token"
            raise InvalidBatchError(f"`{name}`: {_number(arr[i])} at {where} {i} is outside float32's range")
    return out


def _number(x: Any) -> str:
    """A float as the Parquet tool prints it: 1e300, -3.5e38."""
    return repr(float(x)).replace("e+", "e")


def int64(x: Any, name: str) -> npt.NDArray[np.int64]:
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "iu":
        raise InvalidBatchError(f"`{name}` must be an integer array, got dtype {arr.dtype}")
    _one_dim(arr, name)
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise InvalidBatchError(f"`{name}` holds values beyond int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def mask_u8(x: Any, name: str = "mask") -> npt.NDArray[np.uint8]:
    """bool and uint8 masks are viewed as bytes without a copy; integer or float masks must
    hold only 0 and 1 and are converted."""
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


def optional_float32(x: Any, name: str) -> npt.NDArray[np.float32] | None:
    return None if x is None else float32(x, name)
