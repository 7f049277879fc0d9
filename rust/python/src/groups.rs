//! Group statistics and annotation for logs split over many workers (the Ray adapter,
//! `mpo_rs.integrations.ray`): each worker reduces its batches to partial per-group
//! statistics, shipped as Arrow tables; the driver merges them; each worker then annotates
//! its batches with the merged statistics. The work is mpo-logs' (`GroupStats`,
//! `partial_group_statistics`, `annotate_batches`); this module converts and releases the
//! GIL.

use mpo_core::GroupParams;
use mpo_logs::{
    annotate_batches, partial_group_statistics, Columns, DataError, EstimatorColumns, GroupStats, LogError,
};
use mpo_logs::{RewardColumn, STATISTICS_COLUMNS};
use pyo3::prelude::*;
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::{PySchema, PyTable};

use crate::arrow::read_all;
use crate::columns::LogColumns;
use crate::errors::{log_error, InvalidOptionError};
use crate::options::Estimator;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GroupStatistics>()?;
    m.add_function(wrap_pyfunction!(resolve_log_columns, m)?)?;
    m.add_function(wrap_pyfunction!(annotate_batch, m)?)
}

/// Runs `f` through the binding's one call helper ([`crate::pool::run`]).
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, DataError> + Send) -> PyResult<T> {
    crate::pool::run(py, |e| log_error(LogError::Batch(e)), f)
}

fn reward_column(
    rewards_col: Option<String>,
    score_col: Option<String>,
    turn_rewards_col: Option<String>,
) -> PyResult<RewardColumn> {
    match (rewards_col, score_col, turn_rewards_col) {
        (Some(r), None, None) => Ok(RewardColumn::Token(r)),
        (None, Some(s), None) => Ok(RewardColumn::Score(s)),
        (None, None, Some(t)) => Ok(RewardColumn::Turn(t)),
        _ => Err(InvalidOptionError::new_err("give exactly one of `rewards_col`, `score_col` and `turn_rewards_col`")),
    }
}

/// Per-group ``count``, ``sum``, ``mean`` and ``m2`` (squared deviations from the mean)
/// of the row scores: a row's score is its score column, or the sum of its token rewards.
#[pyclass(frozen, module = "mpo_rs._native", name = "GroupStatistics")]
#[derive(Debug)]
pub struct GroupStatistics {
    stats: GroupStats,
}

#[pymethods]
impl GroupStatistics {
    /// The statistics of the rows of ``data`` alone (one partial of a distributed pass),
    /// the rows read and checked as the annotation reads them (with token rewards, the mask
    /// too; a token reward where the mask is 0 refused or moved as ``observation_rewards``
    /// says). Errors name the row within ``data``.
    #[staticmethod]
    #[pyo3(signature = (data, *, columns, observation_rewards="error"))]
    fn scan(py: Python<'_>, data: AnyRecordBatch, columns: LogColumns, observation_rewards: &str) -> PyResult<Self> {
        let reward = reward_column(columns.rewards, columns.score, columns.turn_rewards)?;
        let columns = Columns {
            mask: columns.mask,
            values: None,
            reward,
            group: Some(columns.group),
            observation_rewards: crate::arrow::observation_rewards(observation_rewards)?,
            truncated: None,
            check: None,
            anchors: None,
        };
        let (batches, _) = read_all(data)?;
        let stats = run(py, || partial_group_statistics(&batches, &columns))?;
        Ok(Self { stats })
    }

    /// Merges statistics tables (``to_arrow()`` of partials), in the order given: counts
    /// and sums add up, and m2 by the parallel-variance formula
    /// ``m2 = Σ (m2_i + n_i (sum_i / n_i − mean)²)``. Tables whose ids one log cannot
    /// hold together (strings beside numbers, an int beyond ±2^53 beside floats: the
    /// group-id rule of docs/estimators.md) raise ``InvalidBatchError`` naming them by
    /// ``labels`` (default ``"statistics table i"``).
    #[staticmethod]
    #[pyo3(signature = (tables, labels=None))]
    fn merge(py: Python<'_>, tables: Vec<AnyRecordBatch>, labels: Option<Vec<String>>) -> PyResult<Self> {
        if labels.as_ref().is_some_and(|l| l.len() != tables.len()) {
            return Err(InvalidOptionError::new_err("give one label per statistics table"));
        }
        let mut batches = Vec::new();
        let mut batch_labels = Vec::new();
        for (i, table) in tables.into_iter().enumerate() {
            let read = read_all(table)?.0;
            let label = labels.as_ref().map_or_else(|| format!("statistics table {i}"), |l| l[i].clone());
            batch_labels.extend(std::iter::repeat_n(label, read.len()));
            batches.extend(read);
        }
        let stats = run(py, || GroupStats::merge(GroupParams::default(), &batches, Some(&batch_labels)))?;
        Ok(Self { stats })
    }

    /// The statistics as an Arrow table, one row per group sorted by id: ``group`` (int64,
    /// uint64, float64 or large_string: the one type of the ids, each exact in it), ``count`` int64, ``sum``, ``mean``,
    /// ``m2`` float64.
    fn to_arrow(&self, py: Python<'_>) -> PyResult<PyTable> {
        let table = run(py, || self.stats.to_table())?;
        let schema = table.schema();
        PyTable::try_new(vec![table], schema)
    }

    /// The number of groups.
    fn __len__(&self) -> usize {
        self.stats.n_groups()
    }

    /// The names of the columns of a statistics table.
    #[classattr]
    fn columns() -> [&'static str; 5] {
        STATISTICS_COLUMNS
    }
}

/// Checks an estimator's columns against ``schema`` (names, types, no output column yet)
/// and picks the reward column by the default rule (a ``rewards`` column if present, else
/// ``score``, else ``turn_rewards``). Returns ``(rewards_col, score_col, turn_rewards_col,
/// statistics_columns)``: exactly one of the first three set, and the columns
/// ``GroupStatistics.scan`` reads (empty for estimators without groups). The truncation
/// flags of ``columns`` (None: ``truncated`` if present) are checked here too.
#[pyfunction]
#[pyo3(signature = (schema, estimator, *, columns))]
fn resolve_log_columns(
    schema: PySchema,
    estimator: &Bound<'_, Estimator>,
    columns: LogColumns,
) -> PyResult<ResolvedColumns> {
    let estimator = estimator.get().core;
    let spec = columns.spec(None, None)?;
    let columns = spec.resolve(&schema.into_inner(), estimator.needs()).map_err(log_error)?;
    let statistics = match columns.group {
        Some(_) => columns.partial_statistics_columns().into_iter().map(String::from).collect(),
        None => Vec::new(),
    };
    Ok(match columns.reward {
        RewardColumn::Token(r) => (Some(r), None, None, statistics),
        RewardColumn::Score(s) => (None, Some(s), None, statistics),
        RewardColumn::Turn(t) => (None, None, Some(t), statistics),
    })
}

type ResolvedColumns = (Option<String>, Option<String>, Option<String>, Vec<String>);

/// ``data`` with the advantage columns appended, one batch per input batch. The group
/// estimators take their baselines from ``statistics`` (merged over the whole log); the
/// others need none. ``observation_rewards`` as in ``arrow_advantages``. Errors name the
/// row within ``data``.
#[pyfunction]
#[pyo3(signature = (data, estimator, statistics, *, columns, observation_rewards="error"))]
fn annotate_batch(
    py: Python<'_>,
    data: AnyRecordBatch,
    estimator: &Bound<'_, Estimator>,
    statistics: Option<&Bound<'_, GroupStatistics>>,
    columns: LogColumns,
    observation_rewards: &str,
) -> PyResult<PyTable> {
    let estimator = estimator.get().core;
    let (batches, schema) = read_all(data)?;
    let spec = columns.spec(None, Some(observation_rewards))?;
    let columns = spec.resolve(&schema, estimator.needs()).map_err(log_error)?;
    let groups = statistics.map(|s| &s.get().stats);
    if columns.group.is_some() && groups.is_none() {
        return Err(InvalidOptionError::new_err(
            "the group estimators need the merged GroupStatistics of the whole log",
        ));
    }
    let (out, out_schema) = run(py, || annotate_batches(&batches, &schema, &columns, &estimator, groups, true))?;
    PyTable::try_new(out, out_schema)
}
