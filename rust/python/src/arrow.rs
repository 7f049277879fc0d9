//! Arrow tables in and out of the extension through the Arrow PyCapsule interface
//! (pyo3-arrow): anything exporting `__arrow_c_array__` or `__arrow_c_stream__` — pyarrow
//! Table / RecordBatch / ChunkedArray of structs, polars DataFrame / Series of structs —
//! is imported without copying its buffers. The result holds only the four new columns,
//! one batch per input batch; `mpo_rs.arrow` appends them to the caller's own object.

use ::arrow::array::RecordBatch;
use ::arrow::datatypes::SchemaRef;
use std::borrow::Cow;

use mpo_logs::relocate::relocate;
use mpo_logs::{annotate_table, EstimatorColumns, LogError, ObservationRewards, COLUMNS, OBSERVATION_REWARDS};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::PyTable;

use crate::columns::LogColumns;
use crate::errors::{log_error, InvalidBatchError};
use crate::numpy::slice;
use crate::options::Estimator;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(arrow_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(column_spec, m)?)?;
    m.add_function(wrap_pyfunction!(observation_rewards_spec, m)?)?;
    m.add_function(wrap_pyfunction!(relocate_observation_rewards, m)?)
}

/// What the log tools may do with a reward on an observation token (mask 0), one dict per
/// choice of ``observation_rewards=`` / ``--observation-rewards``: ``name`` and ``doc``;
/// the first is the default.
#[pyfunction]
fn observation_rewards_spec(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows = OBSERVATION_REWARDS
        .iter()
        .map(|(name, _, doc)| {
            let row = PyDict::new(py);
            row.set_item("name", name)?;
            row.set_item("doc", doc)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}

/// The `observation_rewards` choice called `name` (`InvalidOptionError` listing the names).
pub(crate) fn observation_rewards(name: &str) -> PyResult<ObservationRewards> {
    ObservationRewards::from_name(name).map_err(log_error)
}

/// The flat token rewards the estimators see under ``observation_rewards=mode`` (the log
/// tools' one rule, rust/logs/src/relocate.rs), for ``mpo_rs.torch``'s padded rows: None
/// when nothing moves (use ``rewards`` as given), else a copy with each finite nonzero
/// reward on a mask-0 token dropped or credited. A non-finite reward is never moved, so
/// the estimator refuses it where it sits; a credited sum beyond float32 is refused naming
/// ``column`` and the row.
#[pyfunction]
fn relocate_observation_rewards<'py>(
    py: Python<'py>,
    rewards: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
    mode: &str,
    column: &str,
) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
    let mode = observation_rewards(mode)?;
    let (r, m, o) = (slice(&rewards, "rewards")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    if r.len() != m.len() {
        return Err(InvalidBatchError::new_err(format!("`{column}` has {} tokens, the mask {}", r.len(), m.len())));
    }
    mpo_core::Layout::new(o, m.len()).map_err(crate::errors::core_error)?;
    match relocate(Cow::Borrowed(r), m, o, mode, column).map_err(|e| log_error(LogError::Batch(e)))? {
        Cow::Borrowed(_) => Ok(None),
        Cow::Owned(moved) => Ok(Some(PyArray1::from_vec(py, moved))),
    }
}

/// The columns of a rollout log, one dict per column: ``name`` (the key of its option:
/// ``mask`` is ``mask_col`` / ``--mask-col``), ``default`` (its default column name),
/// ``type`` (the Arrow types accepted or written), ``role`` (``"input"``, ``"optional"``:
/// read when present or named, ``"output"``: appended) and ``doc``. The one list the
/// Arrow, command-line, Ray and diagnose entry points take their column names from.
#[pyfunction]
fn column_spec(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows = COLUMNS
        .iter()
        .map(|c| {
            let row = PyDict::new(py);
            row.set_item("name", c.key)?;
            row.set_item("default", c.default)?;
            row.set_item("type", c.data_type)?;
            row.set_item("role", c.role)?;
            row.set_item("doc", c.doc)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}

/// Every batch of an Arrow input (a table, a batch or a stream) with its schema.
pub(crate) fn read_all(data: AnyRecordBatch) -> PyResult<(Vec<RecordBatch>, SchemaRef)> {
    let reader = data.into_reader()?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<RecordBatch>, _>>()
        .map_err(|e| InvalidBatchError::new_err(format!("cannot read the Arrow input: {e}")))?;
    Ok((batches, schema))
}

/// The output columns (advantages, returns, turn_index, turn_advantages) of every batch
/// of `data`, as a table with one batch per input batch.
#[pyfunction]
#[pyo3(signature = (data, estimator, columns, check_tolerance=None, observation_rewards="error"))]
fn arrow_advantages(
    py: Python<'_>,
    data: AnyRecordBatch,
    estimator: &Bound<'_, Estimator>,
    columns: LogColumns,
    check_tolerance: Option<Bound<'_, PyAny>>,
    observation_rewards: &str,
) -> PyResult<PyTable> {
    let estimator = estimator.get().core;
    let (batches, schema) = read_all(data)?;
    let spec = columns.spec(check_tolerance.as_ref(), Some(observation_rewards))?;
    let columns = spec.resolve(&schema, estimator.needs()).map_err(log_error)?;
    let (out, out_schema) =
        crate::pool::run(py, log_error, || annotate_table(&batches, &schema, &columns, &estimator))?;
    PyTable::try_new(out, out_schema)
}
