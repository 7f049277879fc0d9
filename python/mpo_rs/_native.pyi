# Hand-written stubs of the Rust extension module (checked by mypy.stubtest).
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, final

import numpy as np
import numpy.typing as npt

from mpo_rs.columns import Columns

__all__ = [
    "Estimator",
    "InvalidBatchError",
    "InvalidConfigError",
    "InvalidOptionError",
    "InvalidRolloutError",
    "MissingCriticValuesError",
    "MissingDependencyError",
    "MpoError",
    "advantages",
    "broadcast_to_tokens",
    "closest_name",
    "get_num_threads",
    "group_baselines",
    "segment_turns",
    "set_num_threads",
    "value_structure",
]

class MpoError(ValueError): ...

class InvalidBatchError(MpoError):
    column: str | None
    missing: tuple[str, ...] | None
    trajectory: int | None
    token: int | None

class InvalidOptionError(MpoError):
    option: str | None

class InvalidRolloutError(MpoError): ...
class InvalidConfigError(MpoError): ...
class MissingCriticValuesError(MpoError): ...
class MissingDependencyError(ModuleNotFoundError): ...

@final
class Estimator:
    def __new__(cls, name: str, **overrides: Any) -> Estimator: ...
    @property
    def name(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def options(self) -> dict[str, Any]: ...
    def replace(self, **overrides: Any) -> Estimator: ...
    @staticmethod
    def names() -> tuple[str, ...]: ...
    @staticmethod
    def option_table() -> tuple[dict[str, Any], ...]: ...
    @classmethod
    def _from_options(cls, name: str, options: dict[str, Any]) -> Estimator: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_TurnArrays = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]

def segment_turns(mask: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> _TurnArrays: ...
def advantages(
    estimator: Estimator,
    mask: npt.NDArray[np.uint8] | None = None,
    offsets: npt.NDArray[np.int64] | None = None,
    values: npt.NDArray[np.float32] | None = None,
    rewards: npt.NDArray[np.float32] | None = None,
    scores: npt.NDArray[np.float32] | None = None,
    group_index: npt.NDArray[np.int64] | None = None,
    n_groups: int = 0,
    truncated: npt.NDArray[np.bool_] | None = None,
    turn_rewards: npt.NDArray[np.float32] | None = None,
    turn_offsets: npt.NDArray[np.int64] | None = None,
    check_scores: npt.NDArray[np.float32] | None = None,
    check_tolerance: object = None,
    turn_state_ids: npt.NDArray[np.int64] | None = None,
    turn_state_offsets: npt.NDArray[np.int64] | None = None,
    token_ids: npt.NDArray[np.int64] | None = None,
) -> tuple[
    npt.NDArray[np.float32],
    npt.NDArray[np.float32] | None,
    npt.NDArray[np.float32] | None,
    _TurnArrays | None,
    npt.NDArray[np.float32] | None,
    npt.NDArray[np.float32] | None,
    npt.NDArray[np.int64] | None,
]: ...
def group_baselines(
    scores: npt.NDArray[np.float32],
    group_index: npt.NDArray[np.int64],
    n_groups: int,
    estimator: Estimator,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]: ...
def broadcast_to_tokens(
    per_trajectory: npt.NDArray[np.float32],
    mask: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64],
) -> npt.NDArray[np.float32]: ...
def value_structure(
    values: npt.NDArray[np.float32],
    mask: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64],
) -> tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float32],
    _TurnArrays,
]: ...
def set_num_threads(threads: int) -> None: ...
def get_num_threads() -> int: ...
def closest_name(word: str, candidates: list[str]) -> str | None: ...

# --- Rollout logs: Arrow tables and the Parquet tool (rust/python/src/arrow.rs, parquet.rs) ---
__all__ += [
    "advantages_parquet",
    "arrow_advantages",
    "column_spec",
    "observation_rewards_spec",
    "relocate_observation_rewards",
]

class _ArrowStream(Protocol):
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...

def column_spec() -> tuple[dict[str, Any], ...]: ...
def observation_rewards_spec() -> tuple[dict[str, Any], ...]: ...
def relocate_observation_rewards(
    rewards: npt.NDArray[np.float32],
    mask: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64],
    mode: str,
    column: str,
) -> npt.NDArray[np.float32] | None: ...
def arrow_advantages(
    data: object,
    estimator: Estimator,
    columns: Columns,
    check_tolerance: object = None,
    observation_rewards: str = "error",
) -> _ArrowStream: ...
def advantages_parquet(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    estimator: Estimator,
    columns: Columns,
    progress: Callable[[str, int, int, int, float], object] | None = None,
    batch_bytes: int | None = None,
    max_row_group_bytes: int | None = None,
    check_tolerance: object = None,
    observation_rewards: str = "error",
) -> dict[str, int | float]: ...

# What `mpo-rs diagnose` shares with `advantages_parquet` (rust/python/src/parquet.rs).
__all__ += ["check_group_column", "diagnose_batch", "list_parquet_inputs"]

def list_parquet_inputs(input: str | os.PathLike[str]) -> list[Path]: ...
def check_group_column(inputs: list[str] | list[os.PathLike[str]], group_col: str) -> None: ...
def diagnose_batch(
    batch: object,
    path: str | os.PathLike[str],
    row_group: int | None,
    row_base: int,
    mask_col: str,
    values_col: str,
    reward: tuple[str, str],
    step_col: str | None = None,
    observation_rewards: str = "error",
) -> tuple[
    npt.NDArray[np.float32],
    npt.NDArray[np.uint8],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64] | None,
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float32],
    npt.NDArray[np.int64],
]: ...

# Group statistics and annotation for logs split over workers (rust/python/src/groups.rs).
__all__ += ["GroupStatistics", "annotate_batch", "resolve_log_columns"]

@final
class GroupStatistics:
    columns: ClassVar[list[str]]
    @staticmethod
    def scan(data: object, *, columns: Columns, observation_rewards: str = "error") -> GroupStatistics: ...
    @staticmethod
    def merge(tables: list[object], labels: list[str] | None = None) -> GroupStatistics: ...
    def to_arrow(self) -> _ArrowStream: ...
    def __len__(self) -> int: ...

def resolve_log_columns(
    schema: object,
    estimator: Estimator,
    *,
    columns: Columns,
) -> tuple[str | None, str | None, str | None, list[str]]: ...
def annotate_batch(
    data: object,
    estimator: Estimator,
    statistics: GroupStatistics | None,
    *,
    columns: Columns,
    observation_rewards: str = "error",
) -> _ArrowStream: ...

# Report directories under the output-safety rule (rust/python/src/safety.rs).
__all__ += [
    "check_dataset_output",
    "check_output_dir",
    "claim_output_dir",
    "output_dir_marker",
    "output_subdir",
    "write_output_file",
]

def check_output_dir(
    path: str | os.PathLike[str],
    tool: str,
    *,
    overwrite: bool = False,
    label: str | None = None,
    inputs: Sequence[str | os.PathLike[str]] = ...,
) -> str | None: ...
def claim_output_dir(
    path: str | os.PathLike[str],
    tool: str,
    config: str | None = None,
    *,
    overwrite: bool = False,
    label: str | None = None,
    inputs: Sequence[str | os.PathLike[str]] = ...,
) -> str | None: ...
def output_dir_marker(path: str | os.PathLike[str]) -> tuple[str, str | None] | None: ...
def check_dataset_output(
    inputs: list[str] | list[os.PathLike[str]], output: str | os.PathLike[str] | None = None
) -> None: ...
def write_output_file(directory: str | os.PathLike[str], relative: str | os.PathLike[str], data: bytes) -> Path: ...
def output_subdir(directory: str | os.PathLike[str], relative: str | os.PathLike[str]) -> Path: ...

# New files written whole or not at all by Python writers (rust/python/src/staged.rs).
__all__ += ["StagedFile"]

@final
class StagedFile:
    def __new__(cls, target: str | os.PathLike[str]) -> StagedFile: ...
    @property
    def temp_path(self) -> Path: ...
    def fileno(self) -> int: ...
    def commit_new(self, target: str | os.PathLike[str]) -> bool: ...
    def discard(self) -> None: ...
