//! `advantages_parquet`: the streaming Parquet → Parquet run behind the `mpo-rs` command,
//! with the GIL released while it streams.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mpo_logs::{run, Job, LogError, Phase, Progress, Tuning};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{column_spec, estimator_from, to_py};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(advantages_parquet, m)?)
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
/// Ctrl-C) stops the run, leaving OUTPUT as it was. Returns the run's summary.
#[pyfunction]
#[pyo3(signature = (
    input, output, estimator, lam, lam_intra, beta, gamma, lam_critic, eps,
    mask_col, values_col, rewards_col, score_col, group_col,
    progress=None, batch_bytes=None, max_row_group_bytes=None
))]
#[allow(clippy::too_many_arguments)]
fn advantages_parquet<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
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
    progress: Option<Py<PyAny>>,
    batch_bytes: Option<usize>,
    max_row_group_bytes: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let defaults = Tuning::default();
    let job = Job {
        input,
        output,
        estimator: estimator_from(estimator, [lam, lam_intra, beta, gamma, lam_critic, eps])?,
        columns: column_spec(mask_col, values_col, rewards_col, score_col, group_col),
        tuning: Tuning {
            batch_bytes: batch_bytes.unwrap_or(defaults.batch_bytes).max(1),
            max_row_group_bytes: max_row_group_bytes.unwrap_or(defaults.max_row_group_bytes).max(1),
        },
    };
    let pool = crate::pool::for_stages().map_err(PyRuntimeError::new_err)?;
    // An exception raised in Python during the run (Ctrl-C, the callback) stops it and is
    // re-raised as is.
    let mut raised: Option<PyErr> = None;
    let result = py.detach(|| {
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
                outcome.map_err(|e| raised = Some(e)).is_ok()
            })
        };
        // A panic is a bug, but it should reach Python as an ordinary exception.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&job, Some(pool), &mut report)))
    });
    let summary = match (result, raised) {
        (Ok(Ok(summary)), _) => summary,
        (Ok(Err(LogError::Interrupted)), Some(e)) => return Err(e),
        (Ok(Err(e)), _) => return Err(to_py(e)),
        (Err(_), _) => return Err(super::internal_error()),
    };
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
