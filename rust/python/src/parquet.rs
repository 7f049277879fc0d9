//! Parquet rollout logs: `advantages_parquet`, the streaming Parquet → Parquet run behind
//! `mpo-rs advantages` (the GIL released while it streams), and what `mpo-rs diagnose`
//! shares with it: the listing of INPUT's Parquet files, and the reading and validation of
//! a batch's columns (mpo-logs), with errors that name file, row group, row and column the
//! same way.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arrow::array::{downcast_integer_array, Array, RecordBatch};
use mpo_core::MpoError;
use mpo_logs::{read_row_scores, relocate, RewardData, Rollouts};
use mpo_logs::{run, Columns, DataError, FileAt, Job, LogError, Phase, Progress, RewardColumn, Tuning};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_arrow::PyRecordBatch;

use crate::columns::LogColumns;
use crate::errors::{log_error as to_py, InvalidOptionError};
use crate::options::Estimator;
use crate::pool::{self, On};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(advantages_parquet, m)?)?;
    m.add_function(wrap_pyfunction!(list_parquet_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(check_group_column, m)?)?;
    m.add_function(wrap_pyfunction!(diagnose_batch, m)?)
}

/// How often a run re-enters Python (progress callback, Ctrl-C check).
const REPORT_EVERY: Duration = Duration::from_millis(100);

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::GroupStatistics => "group-statistics",
        Phase::Write => "write",
    }
}

/// Computes the advantage columns of a Parquet file or directory of files and writes
/// INPUT with them appended to OUTPUT, atomically. `progress(phase, rows, tokens,
/// total_rows, seconds)` is called about ten times a second; an exception from it (or
/// Ctrl-C) stops the run, leaving OUTPUT as it was. `observation_rewards` (a name of
/// `observation_rewards_spec()`) says what the estimators make of a token reward where
/// the mask is 0; the rewards column is written out as given. Returns the run's summary.
#[pyfunction]
#[pyo3(signature = (
    input, output, estimator, columns,
    progress=None, batch_bytes=None, max_row_group_bytes=None, check_tolerance=None, observation_rewards="error"
))]
#[allow(clippy::too_many_arguments)]
fn advantages_parquet<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
    estimator: &Bound<'py, Estimator>,
    columns: LogColumns,
    progress: Option<Py<PyAny>>,
    batch_bytes: Option<usize>,
    max_row_group_bytes: Option<usize>,
    check_tolerance: Option<Bound<'py, PyAny>>,
    observation_rewards: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let defaults = Tuning::default();
    let columns = columns.spec(check_tolerance.as_ref(), Some(observation_rewards))?;
    let job = Job {
        input,
        output,
        estimator: estimator.get().core,
        columns,
        tuning: Tuning {
            batch_bytes: batch_bytes.unwrap_or(defaults.batch_bytes).max(1),
            max_row_group_bytes: max_row_group_bytes.unwrap_or(defaults.max_row_group_bytes).max(1),
        },
    };
    // An exception raised in Python during the run (Ctrl-C, the callback) stops it and is
    // re-raised as is.
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let to_py = |e: LogError| match (e, raised.lock().ok().and_then(|mut r| r.take())) {
        (LogError::Interrupted, Some(e)) => e,
        (e, _) => to_py(e),
    };
    let summary = pool::call(py, On::Stages, to_py, |pool| {
        let mut last: Option<Instant> = None;
        let mut report = |p: &Progress| -> bool {
            if last.is_some_and(|t| t.elapsed() < REPORT_EVERY) {
                return true;
            }
            last = Some(Instant::now());
            Python::attach(|py| {
                let outcome = py.check_signals().and_then(|()| match &progress {
                    Some(callback) => callback
                        .call1(py, (phase_name(p.phase), p.rows, p.tokens, p.total_rows, p.elapsed.as_secs_f64()))
                        .map(drop),
                    None => Ok(()),
                });
                outcome.map_err(|e| raised.lock().map(|mut r| *r = Some(e))).is_ok()
            })
        };
        run(&job, Some(pool), &mut report)
    })?;
    let d = PyDict::new(py);
    d.set_item("files", summary.files)?;
    d.set_item("row_groups", summary.row_groups)?;
    d.set_item("rows", summary.counts.rows)?;
    d.set_item("tokens", summary.counts.tokens)?;
    d.set_item("policy_tokens", summary.counts.policy_tokens)?;
    d.set_item("turns", summary.counts.turns)?;
    d.set_item("input_bytes", summary.input_bytes)?;
    d.set_item("output_bytes", summary.output_bytes)?;
    d.set_item("seconds", summary.seconds)?;
    Ok(d)
}

/// The Parquet files of INPUT in the order `advantages_parquet` reads them: INPUT itself
/// if it is a file, else the `.parquet` files under it (recursively, in name order; hidden
/// and `_` names skipped; directory symlinks not followed). A directory without Parquet
/// files raises `InvalidOptionError`; a path that cannot be read, `OSError`.
#[pyfunction]
fn list_parquet_inputs(input: PathBuf) -> PyResult<Vec<PathBuf>> {
    mpo_logs::paths::list_inputs(&input).map_err(to_py)
}

/// Checks the group column of the Parquet files of ``inputs`` (files or directories;
/// their footers only) by the group-id rule across files, as `advantages_parquet` does
/// before reading a row: string ids beside number ids raise `InvalidBatchError` naming
/// both files.
#[pyfunction]
fn check_group_column(inputs: Vec<PathBuf>, group_col: &str) -> PyResult<()> {
    mpo_logs::check_group_column(&inputs, group_col).map_err(to_py)
}

type Diagnosed<'py> = (
    Bound<'py, PyArray1<f32>>,         // values
    Bound<'py, PyArray1<u8>>,          // mask
    Bound<'py, PyArray1<i64>>,         // offsets
    Bound<'py, PyArray1<f64>>,         // outcome
    Option<Bound<'py, PyArray1<i64>>>, // step
    Bound<'py, PyArray1<f64>>,         // total
    Bound<'py, PyArray1<f64>>,         // between
    Bound<'py, PyArray1<f64>>,         // within
    Bound<'py, PyArray1<f32>>,         // jumps
    Bound<'py, PyArray1<i64>>,         // n_turns
);

/// Reads one batch of a rollout log as `advantages_parquet` reads it (types, nulls, list
/// lengths, mask values, finite numbers) and computes its value structure. `reward` is
/// `("score", column)`, `("rewards", column)` or `("turn_rewards", column)`: the outcome is
/// the score, or the sum of the token (turn) rewards. Errors name `path`, `row_group`
/// (None: a check of the schema on an empty batch) and the row in the file (`row_base` +
/// the row in the batch), and raise `InvalidBatchError`. A token reward on an observation
/// token is refused or moved as `observation_rewards` says (as in `advantages_parquet`);
/// per-turn rewards sit on policy tokens, so they pass as given.
///
/// Returns (values, mask, offsets, outcome, step, total, between, within, jumps, n_turns).
#[pyfunction]
#[pyo3(signature = (
    batch, path, row_group, row_base, mask_col, values_col, reward, step_col=None, observation_rewards="error"
))]
#[allow(clippy::too_many_arguments)]
fn diagnose_batch<'py>(
    py: Python<'py>,
    batch: PyRecordBatch,
    path: PathBuf,
    row_group: Option<usize>,
    row_base: u64,
    mask_col: String,
    values_col: String,
    reward: (String, String),
    step_col: Option<String>,
    observation_rewards: &str,
) -> PyResult<Diagnosed<'py>> {
    let observation_rewards = crate::arrow::observation_rewards(observation_rewards)?;
    let batch = batch.into_inner();
    let reward = match reward.0.as_str() {
        "score" => RewardColumn::Score(reward.1),
        "rewards" => RewardColumn::Token(reward.1),
        "turn_rewards" => RewardColumn::Turn(reward.1),
        other => return Err(InvalidOptionError::new_err(format!("unknown reward kind {other:?}"))),
    };
    let columns = Columns {
        mask: mask_col,
        values: Some(values_col),
        reward,
        group: None,
        observation_rewards,
        truncated: None,
        check: None,
        anchors: None,
    };
    let to_py =
        |error: DataError| to_py(LogError::Data { at: FileAt { path, row_group }, error: error.shift_rows(row_base) });
    let d = pool::run(py, to_py, || diagnose(&batch, &columns, step_col.as_deref()))?;
    Ok((
        PyArray1::from_vec(py, d.values),
        PyArray1::from_vec(py, d.mask),
        PyArray1::from_vec(py, d.offsets),
        PyArray1::from_vec(py, d.outcome),
        d.step.map(|s| PyArray1::from_vec(py, s)),
        PyArray1::from_vec(py, d.vs.total),
        PyArray1::from_vec(py, d.vs.between),
        PyArray1::from_vec(py, d.vs.within),
        PyArray1::from_vec(py, d.vs.jumps),
        PyArray1::from_vec(py, d.n_turns),
    ))
}

struct Diagnosis {
    values: Vec<f32>,
    mask: Vec<u8>,
    offsets: Vec<i64>,
    outcome: Vec<f64>,
    step: Option<Vec<i64>>,
    vs: mpo_core::ValueStructure,
    n_turns: Vec<i64>,
}

fn diagnose(batch: &RecordBatch, columns: &Columns, step_col: Option<&str>) -> Result<Diagnosis, DataError> {
    let r = relocate::apply(Rollouts::read(batch, columns)?, columns)?;
    let outcome: Vec<f64> = match &r.rewards {
        RewardData::Score(s) => s.iter().map(|&x| x as f64).collect(),
        // The sum of each row's rewards; NaN/Inf refused naming the token, and a reward on
        // an observation token refused or moved as `advantages` does.
        RewardData::Token(_) => relocate::group_scores(batch, columns, &r)?.iter().map(|&x| x as f64).collect(),
        // The sum of each row's turn rewards, the counts checked as `advantages` checks them.
        RewardData::Turn { rewards, offsets } => {
            let turn = mpo_core::TurnRewards { rewards, offsets: Some(offsets) };
            mpo_core::place_turn_rewards(&r.mask, &r.offsets, turn, None).map_err(|e| match e {
                MpoError::TurnRewardCount { trajectory, got, expected } => DataError::TurnRewardCount {
                    column: columns.reward.name().into(),
                    row: trajectory as u64,
                    got: got as u64,
                    expected: expected as u64,
                },
                other => DataError::Estimator(other),
            })?;
            read_row_scores(batch, &columns.reward)?.iter().map(|&x| x as f64).collect()
        }
    };
    if let Some(row) = outcome.iter().position(|x| !x.is_finite()) {
        // A sum of finite f32 rewards can overflow f32.
        return Err(DataError::NonFiniteRow {
            column: columns.reward.name().into(),
            row: row as u64,
            value: outcome[row] as f32,
        });
    }
    let step = step_col.map(|name| read_steps(batch, name)).transpose()?;
    let values: Cow<'_, [f32]> = r.values.expect("values are read");
    let vs = mpo_core::value_structure(&values, &r.mask, &r.offsets).map_err(|e| match e {
        MpoError::NonFiniteToken { value, at, .. } => DataError::NonFiniteToken {
            column: columns.values.clone().unwrap_or_default(),
            row: at.trajectory as u64,
            token: at.position as u64,
            value,
        },
        other => DataError::Estimator(other),
    })?;
    let n_turns = vs.turns.traj_offsets.windows(2).map(|w| w[1] - w[0]).collect();
    Ok(Diagnosis {
        values: values.into_owned(),
        mask: r.mask.into_owned(),
        offsets: r.offsets.into_owned(),
        outcome,
        step,
        vs,
        n_turns,
    })
}

/// The training step of each row: an integer column without nulls.
#[allow(
    clippy::unnecessary_fallible_conversions,
    clippy::useless_conversion,
    reason = "one body serves every integer type: for the narrow ones the conversion cannot fail, for i64 it is the identity"
)]
fn read_steps(batch: &RecordBatch, name: &str) -> Result<Vec<i64>, DataError> {
    let array = batch.column_by_name(name).ok_or_else(|| DataError::MissingColumn {
        columns: vec![name.into()],
        available: format!(
            "columns are: {}",
            batch.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
        ),
    })?;
    if let Some(row) = (0..array.len()).find(|&i| array.is_null(i)) {
        return Err(DataError::NullValue { column: name.into(), row: row as u64 });
    }
    downcast_integer_array!(
        array => array
            .values()
            .iter()
            .map(|&x| {
                i64::try_from(x)
                    .map_err(|_| DataError::Capacity(format!("column `{name}`: step {x} does not fit in int64")))
            })
            .collect(),
        _ => Err(DataError::ColumnType { column: name.into(), found: array.data_type().to_string(), expected: "integer" }),
    )
}
