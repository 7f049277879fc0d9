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

The first three are created by the Rust extension, which maps every Rust error to one of
them (operating-system failures become ``OSError`` with their errno), so tracebacks read
``mpo_rs.exceptions.InvalidBatchError``.
"""

from __future__ import annotations

from ._deps import MissingDependencyError
from ._native import InvalidBatchError, InvalidOptionError, MpoError

__all__ = [
    "InvalidBatchError",
    "InvalidConfigError",
    "InvalidOptionError",
    "InvalidRolloutError",
    "MissingCriticValuesError",
    "MissingDependencyError",
    "MpoError",
]


class InvalidRolloutError(MpoError):
    """Rollouts (tensors, lengths, masks) the torch learner or losses cannot use, or an
    action an environment refuses; the message names the argument and where."""


class InvalidConfigError(MpoError):
    """An integration option or an environment parameter is unknown or out of range, or a
    configuration is missing."""


class MissingCriticValuesError(MpoError):
    """A critic estimator (mae, gae) was called without critic values."""


for _cls in (InvalidRolloutError, InvalidConfigError, MissingCriticValuesError):
    _cls.__module__ = __name__
del _cls
