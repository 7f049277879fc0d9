//! `mpo_rs._native`: the thin PyO3 layer over mpo-core and mpo-logs. Each module holds one
//! concept; this file only declares and registers them.

mod allocator;
mod arrow;
mod columns;
mod errors;
mod groups;
mod numpy;
mod options;
mod parquet;
mod pool;
mod safety;
mod staged;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Sets the size of the extension's thread pools (0 = default: RAYON_NUM_THREADS, else
/// one per core). Call it before the first estimator call: the Python main thread counts
/// as one of the threads of a pool built there, and a later resize cannot adopt it.
#[pyfunction]
fn set_num_threads(threads: usize) -> PyResult<()> {
    pool::set_num_threads(threads).map_err(PyRuntimeError::new_err)
}

/// The size of the extension's thread pool in this process.
#[pyfunction]
fn get_num_threads() -> PyResult<usize> {
    pool::num_threads().map_err(PyRuntimeError::new_err)
}

/// The candidate closest to `word` when it looks like its misspelling (mpo-core's rule,
/// which the Rust messages use too), else None.
#[pyfunction]
fn closest_name(word: &str, candidates: Vec<String>) -> Option<String> {
    mpo_core::closest(word, candidates.iter().map(String::as_str)).map(str::to_owned)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    allocator::keep_freed_pages();
    let threading = m.py().import("threading")?;
    pool::on_import(threading.call_method0("main_thread")?.is(&threading.call_method0("current_thread")?));
    errors::register(m)?;
    m.add_class::<options::Estimator>()?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(closest_name, m)?)?;
    numpy::register(m)?;
    arrow::register(m)?;
    groups::register(m)?;
    parquet::register(m)?;
    safety::register(m)?;
    staged::register(m)
}
