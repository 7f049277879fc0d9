//! Arrow tables in and out of the extension through the Arrow PyCapsule interface
//! (pyo3-arrow): anything exporting `__arrow_c_array__` or `__arrow_c_stream__` — pyarrow
//! Table / RecordBatch / ChunkedArray of structs, polars DataFrame / Series of structs —
//! is imported without copying its buffers. The result holds only the four new columns,
//! one batch per input batch; `mpo_rs.arrow` appends them to the caller's own object.

// The Parquet tool's binding lives beside this file; declaring it here keeps the crate
// root's share of this feature to one module and one register call.
#[path = "logs.rs"]
mod logs;

use std::sync::Arc;

use ::arrow::array::RecordBatch;
use ::arrow::datatypes::{Schema, SchemaRef};
use mpo_logs::{
    annotate, output_fields, read_row_scores, ColumnSpec, Columns, DataError, Estimator, EstimatorOptions, GroupStats,
    LogError,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::PyTable;

use crate::InvalidBatchError;

create_exception!(
    _native,
    InvalidOptionError,
    PyValueError,
    "An option, estimator parameter or path the rollout-log tools will not use (a usage error)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("InvalidOptionError", m.py().get_type::<InvalidOptionError>())?;
    m.add_function(wrap_pyfunction!(arrow_advantages, m)?)?;
    logs::register(m)
}

/// Maps a rollout-log error to the Python exception a caller would catch: bad data
/// (including corrupt files) → `InvalidBatchError`, a usage problem →
/// `InvalidOptionError`, the operating system → `OSError` with its errno.
pub(crate) fn to_py(e: LogError) -> PyErr {
    let message = e.to_string();
    match e {
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

/// Builds the estimator from Python keyword options (None = the estimator's default).
pub(crate) fn estimator_from(name: &str, options: [Option<f64>; 6]) -> PyResult<Estimator> {
    let [lam, lam_intra, beta, gamma, lam_critic, eps] = options;
    let o = EstimatorOptions { lam, lam_intra, beta, gamma, lam_critic, eps };
    Estimator::from_options(name, &o).map_err(to_py)
}

pub(crate) fn column_spec(
    mask_col: String,
    values_col: String,
    rewards_col: Option<String>,
    score_col: Option<String>,
    group_col: String,
) -> ColumnSpec {
    ColumnSpec { mask: mask_col, values: values_col, rewards: rewards_col, score: score_col, group: group_col }
}

/// The output columns (advantages, returns, turn_index, turn_advantages) of every batch
/// of `data`, as a table with one batch per input batch.
#[pyfunction]
#[pyo3(signature = (
    data, estimator, lam, lam_intra, beta, gamma, lam_critic, eps,
    mask_col, values_col, rewards_col, score_col, group_col
))]
#[allow(clippy::too_many_arguments)]
fn arrow_advantages(
    py: Python<'_>,
    data: AnyRecordBatch,
    estimator: &str,
    lam: Option<f64>,
    lam_intra: Option<f64>,
    beta: Option<f64>,
    gamma: Option<f64>,
    lam_critic: Option<f64>,
    eps: Option<f64>,
    mask_col: String,
    values_col: String,
    rewards_col: Option<String>,
    score_col: Option<String>,
    group_col: String,
) -> PyResult<PyTable> {
    let estimator = estimator_from(estimator, [lam, lam_intra, beta, gamma, lam_critic, eps])?;
    let reader = data.into_reader()?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<RecordBatch>, _>>()
        .map_err(|e| InvalidBatchError::new_err(format!("cannot read the Arrow input: {e}")))?;
    let spec = column_spec(mask_col, values_col, rewards_col, score_col, group_col);
    let columns = spec.resolve(&schema, estimator.needs()).map_err(to_py)?;
    let out_schema = Arc::new(Schema::new(output_fields(columns.list_kind(&schema)).to_vec()));
    let pool = crate::pool::for_calls().map_err(PyRuntimeError::new_err)?;
    let out = py
        .detach(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install(|| annotate_all(&batches, &columns, &estimator, &out_schema))
            }))
        })
        .map_err(|_| internal_error())?
        .map_err(to_py)?;
    PyTable::try_new(out, out_schema)
}

/// What a panic in the Rust code becomes (a bug, never expected from bad input).
pub(crate) fn internal_error() -> PyErr {
    PyRuntimeError::new_err("mpo_rs failed unexpectedly (an internal error); please report it with the input's schema")
}

/// Annotates every batch; errors name the row in the whole table.
fn annotate_all(
    batches: &[RecordBatch],
    columns: &Columns,
    estimator: &Estimator,
    out_schema: &SchemaRef,
) -> Result<Vec<RecordBatch>, LogError> {
    let groups = match estimator {
        Estimator::Group(params) => Some(group_statistics(batches, columns, GroupStats::new(*params))?),
        _ => None,
    };
    let mut out = Vec::with_capacity(batches.len());
    let mut base = 0u64;
    for batch in batches {
        let a =
            annotate(batch, columns, estimator, groups.as_ref()).map_err(|e| LogError::Batch(e.shift_rows(base)))?;
        let columns = a.columns.to_vec();
        out.push(
            RecordBatch::try_new(out_schema.clone(), columns)
                .map_err(|e| LogError::Batch(DataError::Capacity(format!("cannot assemble the output: {e}"))))?,
        );
        base += batch.num_rows() as u64;
    }
    Ok(out)
}

/// Group statistics over all batches of the table (the same scans as the Parquet tool).
fn group_statistics(batches: &[RecordBatch], columns: &Columns, mut stats: GroupStats) -> Result<GroupStats, LogError> {
    let group_col = columns.group.as_deref().unwrap_or_default();
    while stats.wants_scan() {
        let mut base = 0u64;
        for batch in batches {
            let shifted = |e: DataError| LogError::Batch(e.shift_rows(base));
            let scores = read_row_scores(batch, &columns.reward).map_err(shifted)?;
            stats.scan(group_col, batch, &scores).map_err(shifted)?;
            base += batch.num_rows() as u64;
        }
        stats.finish_scan();
    }
    Ok(stats)
}
