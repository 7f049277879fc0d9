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
//!
//! Where an error points is also on the exception, as attributes set here from the Rust
//! error's fields (None where not applicable, and on an error raised in Python):
//! `InvalidBatchError.column` (the argument or column), `.missing` (for a missing column, the
//! names none of which the input has: one, or a role's alternatives), `.trajectory` (the
//! trajectory or row), `.token` (the token's position in it); `InvalidOptionError.option`. Python reads them instead of
//! parsing the message.

use mpo_core::MpoError as CoreError;
use mpo_logs::LogError;
use pyo3::create_exception;
use pyo3::exceptions::{PyKeyboardInterrupt, PyModuleNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

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

/// The attributes of each class, None on the class (an error raised in Python has them too).
const BATCH_ATTRIBUTES: [&str; 4] = ["column", "missing", "trajectory", "token"];

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for name in BATCH_ATTRIBUTES {
        py.get_type::<InvalidBatchError>().setattr(name, py.None())?;
    }
    py.get_type::<InvalidOptionError>().setattr("option", py.None())?;
    m.add("MpoError", py.get_type::<MpoError>())?;
    m.add("InvalidBatchError", py.get_type::<InvalidBatchError>())?;
    m.add("InvalidOptionError", py.get_type::<InvalidOptionError>())?;
    m.add("InvalidRolloutError", py.get_type::<InvalidRolloutError>())?;
    m.add("InvalidConfigError", py.get_type::<InvalidConfigError>())?;
    m.add("MissingCriticValuesError", py.get_type::<MissingCriticValuesError>())?;
    m.add("MissingDependencyError", py.get_type::<MissingDependencyError>())
}

/// Where a batch error points, for its exception's attributes.
#[derive(Default)]
struct At<'a> {
    column: Option<&'a str>,
    missing: &'a [String],
    trajectory: Option<u64>,
    token: Option<u64>,
}

/// An `InvalidBatchError` carrying `at` as attributes.
fn batch_error(message: String, at: At<'_>) -> PyErr {
    let err = InvalidBatchError::new_err(message);
    Python::attach(|py| {
        let missing = (!at.missing.is_empty()).then(|| PyTuple::new(py, at.missing).ok()).flatten();
        let value = err.value(py);
        // A fresh exception instance takes any attribute; a failure would only lose the hint.
        let _ = value.setattr("column", at.column);
        let _ = value.setattr("missing", missing);
        let _ = value.setattr("trajectory", at.trajectory);
        let _ = value.setattr("token", at.token);
    });
    err
}

/// An `InvalidOptionError` naming `option` as its attribute.
fn option_error(message: String, option: Option<&str>) -> PyErr {
    let err = InvalidOptionError::new_err(message);
    Python::attach(|py| {
        let _ = err.value(py).setattr("option", option);
    });
    err
}

/// An error of the core: a parameter or option → `InvalidOptionError`, anything about the
/// data → `InvalidBatchError`.
pub fn core_error(e: CoreError) -> PyErr {
    match e {
        CoreError::Parameter { .. } | CoreError::Option { .. } | CoreError::Inapplicable(_) => {
            option_error(e.to_string(), e.option())
        }
        CoreError::MissingValues { .. } => MissingCriticValuesError::new_err(e.to_string()),
        _ => batch_error(
            e.to_string(),
            At {
                column: e.column(),
                trajectory: e.trajectory().map(|t| t as u64),
                token: e.token().map(|t| t as u64),
                ..At::default()
            },
        ),
    }
}

/// An error of the rollout-log tools: bad data (including corrupt files) →
/// `InvalidBatchError`, a usage problem → `InvalidOptionError`, the operating system →
/// `OSError` with its errno.
pub fn log_error(e: LogError) -> PyErr {
    let message = e.to_string();
    match e {
        LogError::Usage(_) => option_error(message, None),
        LogError::Option(e) => option_error(message, e.option()),
        // An option, or an input the estimator does not read, refused while reading a batch.
        LogError::Data { ref error, .. } | LogError::Batch(ref error) if error.is_usage() => {
            option_error(message, error.option())
        }
        LogError::Data { ref error, .. } | LogError::Batch(ref error) => batch_error(
            message,
            At {
                column: error.column(),
                missing: error.missing_columns(),
                trajectory: error.row(),
                token: error.token(),
            },
        ),
        LogError::Corrupt { ref column, .. } => batch_error(message, At { column: column.as_deref(), ..At::default() }),
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
