//! The exception hierarchy of `mpo_rs.exceptions` — every class of it is created here
//! (`mpo_rs.exceptions` re-exports them) — and the one place a Rust error becomes a
//! Python exception.
//!
//! ```text
//! ValueError
//! └── MpoError                     any input mpo_rs will not use
//!     ├── InvalidBatchError        arrays, rows or log data the estimators cannot use
//!     ├── InvalidOptionError       an estimator or option name, or an option's value
//!     ├── InvalidRolloutError      rollouts the torch learner and losses cannot use
//!     ├── InvalidConfigError       an integration's or an environment's configuration
//!     └── MissingCriticValuesError a critic estimator called without critic values
//! ModuleNotFoundError
//! └── MissingDependencyError       an optional dependency is not installed
//! ```
//! Bad or corrupt Parquet / Arrow data is an `InvalidBatchError` (it names file, row group,
//! row and column); the operating system's failures are `OSError` with their errno.

use mpo_core::MpoError as CoreError;
use mpo_logs::LogError;
use pyo3::create_exception;
use pyo3::exceptions::{PyKeyboardInterrupt, PyModuleNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    mpo_rs.exceptions,
    MpoError,
    PyValueError,
    "Input mpo_rs will not use; the message (one line) names what and where."
);
create_exception!(
    mpo_rs.exceptions,
    InvalidBatchError,
    MpoError,
    "A batch the estimators cannot use (arrays, rows, log data); the message names the argument or column and where."
);
create_exception!(
    mpo_rs.exceptions,
    InvalidOptionError,
    MpoError,
    "An estimator or option the tools will not use: an unknown name, an option the estimator does not take, \
     a value outside its domain, or an unusable path or flag."
);
create_exception!(
    mpo_rs.exceptions,
    InvalidRolloutError,
    MpoError,
    "Rollouts (tensors, lengths, masks) the torch learner or losses cannot use, or an action an environment \
     refuses; the message names the argument and where."
);
create_exception!(
    mpo_rs.exceptions,
    InvalidConfigError,
    MpoError,
    "An integration option or an environment parameter is unknown or out of range, or a configuration is missing."
);
create_exception!(
    mpo_rs.exceptions,
    MissingCriticValuesError,
    MpoError,
    "A critic estimator (mae, gae) was called without critic values."
);
create_exception!(
    mpo_rs.exceptions,
    MissingDependencyError,
    PyModuleNotFoundError,
    "An optional dependency is not installed; the message (one line) names the extra that installs it. \
     A ModuleNotFoundError, so ``except ImportError`` still catches it."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MpoError", py.get_type::<MpoError>())?;
    m.add("InvalidBatchError", py.get_type::<InvalidBatchError>())?;
    m.add("InvalidOptionError", py.get_type::<InvalidOptionError>())?;
    m.add("InvalidRolloutError", py.get_type::<InvalidRolloutError>())?;
    m.add("InvalidConfigError", py.get_type::<InvalidConfigError>())?;
    m.add("MissingCriticValuesError", py.get_type::<MissingCriticValuesError>())?;
    m.add("MissingDependencyError", py.get_type::<MissingDependencyError>())
}

/// An error of the core: a parameter or option → `InvalidOptionError`, anything about the
/// data → `InvalidBatchError`.
pub fn core_error(e: CoreError) -> PyErr {
    match e {
        CoreError::Parameter { .. } | CoreError::Option(_) | CoreError::Inapplicable(_) => {
            InvalidOptionError::new_err(e.to_string())
        }
        CoreError::MissingValues { .. } => MissingCriticValuesError::new_err(e.to_string()),
        _ => InvalidBatchError::new_err(e.to_string()),
    }
}

/// An error of the rollout-log tools: bad data (including corrupt files) →
/// `InvalidBatchError`, a usage problem → `InvalidOptionError`, the operating system →
/// `OSError` with its errno.
pub fn log_error(e: LogError) -> PyErr {
    let message = e.to_string();
    match e {
        _ if e.is_usage() => InvalidOptionError::new_err(message),
        LogError::Usage(_) => InvalidOptionError::new_err(message),
        LogError::Data { .. } | LogError::Batch(_) | LogError::Corrupt { .. } => InvalidBatchError::new_err(message),
        LogError::Io { source, .. } => match source.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, message)),
            None => PyOSError::new_err(message),
        },
        LogError::Write { .. } => PyOSError::new_err(message),
        LogError::Interrupted => PyKeyboardInterrupt::new_err(message),
    }
}

/// What a panic in the Rust code becomes (a bug, never expected from bad input).
pub fn internal_error() -> PyErr {
    PyRuntimeError::new_err("mpo_rs failed unexpectedly (an internal error); please report it with the input's schema")
}
