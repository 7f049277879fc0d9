"""The exceptions of mpo_rs, one hierarchy (all exported at top level as ``mpo_rs.X``)::

    ValueError
    └── MpoError                     any input mpo_rs will not use
        ├── InvalidBatchError        arrays, rows or rollout-log data the estimators cannot use
        │                            (including bad or corrupt Parquet / Arrow data)
        ├── InvalidOptionError       an estimator or option name, an option that does not
        │                            apply, a value outside its domain, an unusable path or flag
        ├── InvalidRolloutError      rollouts the torch learner and losses cannot use, an
        │                            action or call an environment (mpo_rs.envs) refuses
        ├── InvalidConfigError       an integration's configuration (verl's ``algorithm.mpo``),
        │                            an environment's parameter or seed
        └── MissingCriticValuesError a critic estimator called without critic values
    ImportError
    └── MissingDependencyError       an optional dependency is not installed

Every class is created by the Rust extension (``rust/python/src/errors.rs``, the one place
they are defined), which also maps every Rust error to one of them (operating-system
failures become ``OSError`` with their errno); this module re-exports them, so tracebacks
read ``mpo_rs.exceptions.InvalidBatchError``.
"""

from __future__ import annotations

from ._native import (
    InvalidBatchError,
    InvalidConfigError,
    InvalidOptionError,
    InvalidRolloutError,
    MissingCriticValuesError,
    MissingDependencyError,
    MpoError,
)

__all__ = [
    "InvalidBatchError",
    "InvalidConfigError",
    "InvalidOptionError",
    "InvalidRolloutError",
    "MissingCriticValuesError",
    "MissingDependencyError",
    "MpoError",
]
