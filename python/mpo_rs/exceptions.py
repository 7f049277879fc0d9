"""The exceptions of mpo_rs, one hierarchy (all exported at top level as ``mpo_rs.X``)::

    ValueError
    └── MpoError                     any input mpo_rs will not use
        ├── InvalidBatchError        arrays, rows or rollout-log data the estimators cannot use
        │                            (including bad or corrupt Parquet / Arrow data)
        ├── InvalidOptionError       an estimator or option name, an option that does not
        │                            apply, a value outside its domain, an unusable path or flag
        ├── InvalidRolloutError      rollouts the torch learner and losses cannot use, an
        │                            action or call an environment (mpo_lab.envs) refuses
        ├── InvalidConfigError       an integration's configuration (verl's ``algorithm.mpo``),
        │                            an environment's parameter or seed
        └── MissingCriticValuesError a critic estimator called without critic values
    ImportError
    └── MissingDependencyError       an optional dependency is not installed

Every class is created by the Rust extension (``rust/python/src/errors.rs``, the one place
they are defined), which also maps every Rust error to one of them (operating-system
failures become ``OSError`` with their errno); this module re-exports them, so tracebacks
read ``mpo_rs.exceptions.InvalidBatchError``.

An error raised in Rust also says where it points, as attributes (None where not applicable,
and on an error raised in Python), so code reads them instead of parsing the message:

- ``InvalidBatchError.column``: the argument (``"values"``) or log column at fault;
- ``InvalidBatchError.missing``: for a missing column, the names none of which the input
  has (one, or the alternatives a role is read from, as ``("rewards", "score", "turn_rewards")``);
- ``InvalidBatchError.trajectory``: the trajectory (a log's row) it is in;
- ``InvalidBatchError.token``: the token's position in that trajectory;
- ``InvalidOptionError.option``: the option at fault (``"estimator"`` for an estimator's name).
"""

from __future__ import annotations

from . import _native

# `X as X`: each name is typed as re-exported where it is imported.
from ._native import InvalidBatchError as InvalidBatchError
from ._native import InvalidConfigError as InvalidConfigError
from ._native import InvalidOptionError as InvalidOptionError
from ._native import InvalidRolloutError as InvalidRolloutError
from ._native import MissingCriticValuesError as MissingCriticValuesError
from ._native import MissingDependencyError as MissingDependencyError
from ._native import MpoError as MpoError

# The hierarchy as the extension lists it (its classes, most general first).
__all__ = [name for name in _native.__all__ if name.endswith("Error")]
