//! Report directories under the output-safety rule of `mpo_logs::safety`: the one check of
//! what `mpo-rs diagnose -o` and `mpo-rs reproduce --out` may write into, and the marker
//! that makes a directory theirs. Errors go through the one mapper (a refusal is
//! `InvalidOptionError`, the operating system `OSError`).

use std::path::{Path, PathBuf};

use mpo_logs::atomic;
use mpo_logs::safety::{self, ReportTool};
use pyo3::prelude::*;

use crate::errors::log_error;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_output_dir, m)?)?;
    m.add_function(wrap_pyfunction!(claim_output_dir, m)?)?;
    m.add_function(wrap_pyfunction!(output_dir_marker, m)?)?;
    m.add_function(wrap_pyfunction!(check_dataset_output, m)?)?;
    m.add_function(wrap_pyfunction!(write_output_file, m)?)?;
    m.add_function(wrap_pyfunction!(output_subdir, m)?)
}

fn label_or_default(label: Option<String>) -> String {
    label.unwrap_or_else(|| "output directory".into())
}

/// Checks that `path` may receive the output of `tool` ("diagnose" or "reproduce"): it
/// does not exist, is an empty directory, or holds `tool`'s marker; with `overwrite`, any
/// directory; and it is not, does not contain and does not lie inside any of `inputs` (the
/// files or directories the tool reads), even before it exists. Returns the configuration
/// id the marker records when it is `tool`'s, else None. Writes nothing. `label` names the
/// path in messages (default "output directory"). Refusals raise `InvalidOptionError`.
#[pyfunction]
#[pyo3(signature = (path, tool, *, overwrite=false, label=None, inputs=Vec::new()))]
fn check_output_dir(
    path: PathBuf,
    tool: &str,
    overwrite: bool,
    label: Option<String>,
    inputs: Vec<PathBuf>,
) -> PyResult<Option<String>> {
    let tool = ReportTool::from_name(tool).map_err(log_error)?;
    safety::check_report_dir(&path, tool, overwrite, &label_or_default(label), &inputs).map_err(log_error)
}

/// `check_output_dir`, then creates `path` (and its parents) if needed and writes `tool`'s
/// marker (`.mpo-rs-output`) into it, recording `config` (a configuration id: 1 to 128
/// printable ASCII characters, no spaces) when given. Returns the configuration id the
/// previous marker recorded when it was `tool`'s, else None. Deletes nothing.
#[pyfunction]
#[pyo3(signature = (path, tool, config=None, *, overwrite=false, label=None, inputs=Vec::new()))]
fn claim_output_dir(
    path: PathBuf,
    tool: &str,
    config: Option<String>,
    overwrite: bool,
    label: Option<String>,
    inputs: Vec<PathBuf>,
) -> PyResult<Option<String>> {
    let tool = ReportTool::from_name(tool).map_err(log_error)?;
    safety::claim_report_dir(&path, tool, config.as_deref(), overwrite, &label_or_default(label), &inputs)
        .map_err(log_error)
}

/// `(tool, config)` of the marker in the directory `path`, or None where there is none
/// (no directory, no marker, or a file that is not a marker).
#[pyfunction]
fn output_dir_marker(path: PathBuf) -> PyResult<Option<(String, Option<String>)>> {
    Ok(safety::read_marker(&path).map_err(log_error)?.map(|m| (m.tool, m.config)))
}

/// Checks the local `inputs` and the output directory of a writer that adds files to a
/// directory and never replaces it (Ray Data's `write_parquet`): `output` must be new or
/// empty, and must not alias an input; no two inputs may be one file. Writes nothing.
/// Refusals raise `InvalidOptionError`.
/// With `output=None` (an output the caller cannot check, such as a URI), only the last.
#[pyfunction]
#[pyo3(signature = (inputs, output=None))]
fn check_dataset_output(inputs: Vec<PathBuf>, output: Option<PathBuf>) -> PyResult<()> {
    safety::check_dataset_output(&inputs, output.as_deref()).map_err(log_error)
}

/// Writes `data` to `directory/relative` whole or not at all, never through a link: the
/// directories below `directory` are created, a symlink among them replaced by a
/// directory; the bytes go to an exclusively created temporary beside the target, renamed
/// over it (a symlink at the target is replaced, its target left alone). Returns the
/// path written. `relative` holds plain names only (no `..`), else `InvalidOptionError`.
#[pyfunction]
fn write_output_file(py: Python<'_>, directory: PathBuf, relative: PathBuf, data: &[u8]) -> PyResult<PathBuf> {
    py.detach(|| atomic::write_output_file(&directory, &relative, data)).map_err(log_error)
}

/// The directory `directory/relative`, created as needed, with no link below `directory`
/// (a symlink there is replaced by a new directory). Returns its path.
#[pyfunction]
fn output_subdir(directory: PathBuf, relative: PathBuf) -> PyResult<PathBuf> {
    atomic::output_subdir(&directory, Path::new(&relative)).map_err(log_error)
}
