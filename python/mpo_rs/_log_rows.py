"""The rows of a rollout-log batch: what :class:`mpo_rs.rollout_log.RolloutLogWriter`
accepts (padded or flat tokens, scores, group ids, a step), checked with messages that name
the argument, and built as the Arrow record batch the log's files hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .exceptions import InvalidBatchError

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def record_batch(
    ids: np.ndarray,
    mask: np.ndarray,
    offsets: np.ndarray,
    values: np.ndarray | None,
    rewards: np.ndarray | None,
    scores: Any,
    group_ids: Any,
    step: Any,
    names: Mapping[str, str],
    method: str,
    arg_names: tuple[str, str],
) -> Any:
    """The rows of one batch (flat tokens, trajectory j being ``offsets[j]:offsets[j+1]``)
    checked and built as an Arrow record batch with the columns ``names`` gives the roles;
    None for a batch of no rows (checked all the same). ``arg_names`` are the caller's names
    of the token ids and rewards, for messages."""
    import pyarrow as pa

    ids_name, rewards_name = arg_names
    n_rows = offsets.shape[0] - 1
    _check_token_ids(ids, offsets, method, ids_name)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise InvalidBatchError(f"{method}: `step` must be an integer (the training step), got {step!r}")
    if not _INT64_MIN <= int(step) <= _INT64_MAX:
        raise InvalidBatchError(f"{method}: `step` is {int(step)}, outside the step column's int64 range")
    row_of = np.repeat(np.arange(n_rows), np.diff(offsets))
    if values is not None:
        _check_finite(values, mask, row_of, offsets, method, "values", policy_only=True)
    if rewards is not None:
        _check_finite(rewards, np.ones_like(mask), row_of, offsets, method, rewards_name, policy_only=False)
    score = None if scores is None else _scores(scores, n_rows, method)
    groups = None if group_ids is None else _groups(group_ids, n_rows, method)
    if n_rows == 0:
        return None  # an empty batch (checked like any other) adds nothing: no rows, no schema

    if offsets[-1] >= 2**31:
        raise InvalidBatchError(
            f"{method}: one batch of {offsets[-1]} tokens is more than a Parquet list column holds (2^31); "
            "append it in parts"
        )
    list_offsets = pa.array(offsets.astype(np.int32))

    def lists(x: np.ndarray) -> Any:
        return pa.ListArray.from_arrays(list_offsets, pa.array(x))

    n = names
    arrays: dict[str, Any] = {n["token_ids"]: lists(ids.astype(np.int32, copy=False))}
    arrays[n["loss_mask"]] = lists(mask.astype(bool, copy=False))
    if values is not None:
        arrays[n["values"]] = lists(values.astype(np.float32, copy=False))
    if rewards is not None:
        arrays[n["rewards"]] = lists(rewards.astype(np.float32, copy=False))
    if score is not None:
        arrays[n["score"]] = pa.array(score.astype(np.float32, copy=False))
    if groups is not None:
        arrays[n["group_id"]] = groups
    arrays[n["step"]] = pa.array(np.full(n_rows, int(step), np.int64))
    return pa.RecordBatch.from_pydict(arrays)


def array(x: Any, name: str) -> np.ndarray:
    """numpy view of a tensor (any device, bf16 upcast) or array-like."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        t = x.detach()
        if str(t.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
            t = t.float()
        return np.asarray(t.cpu().numpy())
    try:
        out = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise InvalidBatchError(f"`{name}` cannot be read as an array: {e}") from None
    if out.dtype == object and name != "group_ids":
        raise InvalidBatchError(f"`{name}` must be a numeric array, got objects ({type(x).__name__})")
    return out


def padded(x: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = array(x, name)
    if a.shape != shape:
        raise InvalidBatchError(f"append_padded: `{name}` has shape {a.shape}, expected {shape} like `input_ids`")
    return a


def flat(x: Any, name: str, n: int) -> np.ndarray:
    a = array(x, name)
    if a.shape != (n,):
        raise InvalidBatchError(f"append_flat: `{name}` has shape {a.shape}, expected ({n},) like `token_ids`")
    return a


def mask01(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype == bool:
        return a
    if a.dtype.kind not in "iuf":
        raise InvalidBatchError(f"`{name}` must be bool or 0/1 numbers, got dtype {a.dtype}")
    bad = (a != 0) & (a != 1)
    if bad.any():
        where = np.argwhere(bad)[0]
        raise InvalidBatchError(
            f"`{name}` must hold only 0 and 1; found {a[tuple(where)].item()!r} at {_position(where)}"
        )
    return np.asarray(a != 0)


def zero_on_padding(a: np.ndarray, keep: np.ndarray, name: str) -> None:
    bad = (a != 0) & ~keep
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise InvalidBatchError(
            f"append_padded: `{name}` is nonzero ({a[row, col].item()!r}) at row {row}, column {col}, where "
            "`attention_mask` is 0 (padding): it would be lost. Put a trajectory's reward on one of its "
            "tokens (its last policy token), and mark policy tokens only inside attention_mask"
        )


def _real(a: np.ndarray, name: str, method: str) -> np.ndarray:
    if a.dtype.kind not in "iuf" or a.dtype == bool:
        raise InvalidBatchError(f"{method}: `{name}` must be real numbers, got dtype {a.dtype}")
    return a


def _check_finite(
    a: np.ndarray,
    where: np.ndarray,
    row_of: np.ndarray,
    offsets: np.ndarray | None,
    method: str,
    name: str,
    *,
    policy_only: bool,
) -> None:
    """NaN/inf (or beyond float32) where the tools read ``a`` is refused now, not when
    the log is read."""
    _real(a, name, method)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    bad = where & ~(np.abs(a) <= _FLOAT32_MAX)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = int(row_of[i])
        place = f"row {row}" if offsets is None else f"row {row}, token {i - int(offsets[row])}"
        what = "on a policy token " if policy_only else ""
        raise InvalidBatchError(f"{method}: `{name}` holds {a[i].item()!r} {what}at {place}: not a finite float32")


def _check_token_ids(ids: np.ndarray, offsets: np.ndarray, method: str, name: str) -> None:
    if ids.dtype.kind not in "iu":
        raise InvalidBatchError(f"{method}: `{name}` must hold integer token ids, got dtype {ids.dtype}")
    top = np.iinfo(np.int32).max
    if ids.size and (ids.min() < 0 or ids.max() > top):
        i = int(np.flatnonzero((ids < 0) | (ids > top))[0])
        row = int(np.searchsorted(offsets, i, side="right") - 1)
        raise InvalidBatchError(
            f"{method}: `{name}` holds {int(ids[i])} at row {row}, token {i - int(offsets[row])}, outside "
            "the token-id range 0..2^31-1"
        )


def _scores(scores: Any, n_rows: int, method: str) -> np.ndarray:
    score = array(scores, "scores")
    if score.shape != (n_rows,):
        raise InvalidBatchError(f"{method}: `scores` has shape {score.shape}, expected ({n_rows},)")
    score = _real(score, "scores", method)
    _check_finite(score, np.ones(n_rows, bool), np.arange(n_rows), None, method, "scores", policy_only=False)
    return score


def _group_array(group_ids: Any, method: str) -> np.ndarray:
    if not isinstance(group_ids, (list, tuple)):
        return array(group_ids, "group_ids")
    # Element by element: numpy would read [1, "1"] as the strings "1", "1".
    try:
        return np.asarray(group_ids, dtype=object)
    except (TypeError, ValueError) as e:
        raise InvalidBatchError(f"{method}: `group_ids` cannot be read as an array: {e}") from None


def _groups(group_ids: Any, n_rows: int, method: str) -> Any:
    """The group ids as an Arrow int64 or string array. A log holds one kind (as
    docs/rollout-logs.md says): integers beside strings are refused, never merged."""
    import pyarrow as pa

    g = _group_array(group_ids, method)
    if g.shape != (n_rows,):
        raise InvalidBatchError(f"{method}: `group_ids` has shape {g.shape}, expected ({n_rows},)")
    if g.size == 0:
        return pa.array([], pa.int64())  # no ids to judge: numpy reads an empty list as float64
    if g.dtype.kind in "iu":
        if g.dtype.kind == "u" and g.max() > _INT64_MAX:
            i = int(np.argmax(g))
            raise InvalidBatchError(f"{method}: `group_ids` holds {g[i]} at row {i}, beyond int64")
        return pa.array(g.astype(np.int64))
    if g.dtype.kind not in "UO":
        raise InvalidBatchError(f"{method}: `group_ids` must be integers or strings (verl's uid), got dtype {g.dtype}")
    values = g.tolist()
    is_int = [isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values]
    is_str = [isinstance(v, str) for v in values]
    for i, v in enumerate(values):
        if not (is_int[i] or is_str[i]):
            raise InvalidBatchError(
                f"{method}: `group_ids` must be all integers or all strings; row {i} holds {type(v).__name__} {v!r}"
            )
    if any(is_int) and any(is_str):
        i, j = is_int.index(True), is_str.index(True)
        raise InvalidBatchError(
            f"{method}: `group_ids` mixes integers and strings (row {i} holds {values[i]!r}, row {j} holds "
            f"{values[j]!r}); a log's group ids are of one kind: give all as integers or all as strings"
        )
    if all(is_str) and values:
        return pa.array(values, pa.string())
    for i, v in enumerate(values):
        if not _INT64_MIN <= int(v) <= _INT64_MAX:
            raise InvalidBatchError(f"{method}: `group_ids` holds {int(v)} at row {i}, outside int64")
    return pa.array([int(v) for v in values], pa.int64())


def _position(index: Sequence[int] | np.ndarray) -> str:
    idx = [int(i) for i in index]
    return f"row {idx[0]}, column {idx[1]}" if len(idx) == 2 else f"token {idx[0]}"
