//! `mpo_rs._native`: the thin PyO3 layer over `mpo-core`.
//!
//! Each function takes contiguous numpy arrays (the Python wrappers in `mpo_rs` coerce
//! anything else), borrows them as slices without copying, releases the GIL while the
//! core runs on the extension's fork-safe pool, and hands the output `Vec`s to numpy
//! without copying.

mod arrow;
mod diagnose;
mod pool;

/// Output buffers are tens of MB and written once; with the system allocator each call
/// maps fresh pages and pays a page fault per 4 KiB (microseconds each on a VM), which
/// costs more than the estimators' arithmetic. mimalloc keeps freed pages for reuse.
/// numpy frees our arrays through this same allocator (the Vec is dropped in Rust).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v3; the crate does not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed pages for 10 s (jemalloc's default decay) instead of mimalloc's 1 s before
/// returning them to the OS. Outputs are tens of MB: a call whose predecessor's outputs
/// were freed more than a second ago took fresh pages and paid their faults and zeroing
/// (after 1.5 s idle, 3.36M tokens: GAE median 8.9 -> 5.3 ms, MAE 11.6 -> 10.5 ms, faults
/// per call 220 -> 28 and 508 -> 69). The price: up to 10 s of freed memory stays resident.
fn keep_freed_pages() {
    // SAFETY: sets a documented option; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}

use mpo_core::{GaeParams, GroupParams, MaeParams, MpoError, Rewards, Turns};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _native,
    InvalidBatchError,
    PyValueError,
    "A batch or parameter the estimators cannot use; the message names the argument and where."
);

fn to_py(e: MpoError) -> PyErr {
    InvalidBatchError::new_err(e.to_string())
}

fn slice<'a, T: numpy::Element>(arr: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    arr.as_slice().map_err(|_| PyTypeError::new_err(format!("`{name}` must be a C-contiguous 1-D array")))
}

/// Runs `f` on the extension's pool with the GIL released.
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, MpoError> + Send) -> PyResult<T> {
    let pool = pool::for_calls().map_err(PyRuntimeError::new_err)?;
    py.detach(|| pool.install(f)).map_err(to_py)
}

fn rewards_of<'a>(rewards: Option<&'a [f32]>, scores: Option<&'a [f32]>) -> PyResult<Rewards<'a>> {
    match (rewards, scores) {
        (Some(r), None) => Ok(Rewards::Token(r)),
        (None, Some(s)) => Ok(Rewards::Score(s)),
        _ => Err(InvalidBatchError::new_err(
            "give exactly one of `rewards` (token-level) and `scores` (one per trajectory)",
        )),
    }
}

type TurnArrays<'py> =
    (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i32>>);

fn turn_arrays(py: Python<'_>, t: Turns) -> TurnArrays<'_> {
    (
        PyArray1::from_vec(py, t.starts),
        PyArray1::from_vec(py, t.ends),
        PyArray1::from_vec(py, t.traj_offsets),
        PyArray1::from_vec(py, t.token_turn),
    )
}

/// (starts, ends, traj_offsets, token_turn)
#[pyfunction]
fn segment_turns<'py>(
    py: Python<'py>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<TurnArrays<'py>> {
    let (m, o) = (slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let turns = run(py, || mpo_core::segment_turns(m, o))?;
    Ok(turn_arrays(py, turns))
}

/// (advantages, returns, turn_advantages, (starts, ends, traj_offsets, token_turn))
#[pyfunction]
#[pyo3(signature = (values, mask, offsets, rewards, scores, lam, lam_intra, beta, gamma, lam_critic))]
#[allow(clippy::too_many_arguments)]
fn mae_advantages<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
    rewards: Option<PyReadonlyArray1<'py, f32>>,
    scores: Option<PyReadonlyArray1<'py, f32>>,
    lam: f64,
    lam_intra: f64,
    beta: f64,
    gamma: f64,
    lam_critic: f64,
) -> PyResult<(Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>, TurnArrays<'py>)> {
    let (v, m, o) = (slice(&values, "values")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let r = rewards.as_ref().map(|a| slice(a, "rewards")).transpose()?;
    let s = scores.as_ref().map(|a| slice(a, "scores")).transpose()?;
    let source = rewards_of(r, s)?;
    let params = MaeParams { lam, lam_intra, beta, gamma, lam_critic };
    let out = run(py, || mpo_core::mae_advantages(v, m, o, source, &params))?;
    Ok((
        PyArray1::from_vec(py, out.advantages),
        PyArray1::from_vec(py, out.returns),
        PyArray1::from_vec(py, out.turn_advantages),
        turn_arrays(py, out.turns),
    ))
}

/// (advantages, returns)
#[pyfunction]
#[pyo3(signature = (values, mask, offsets, rewards, scores, gamma, lam, lam_critic, length_adaptive_alpha))]
#[allow(clippy::too_many_arguments)]
fn gae_advantages<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
    rewards: Option<PyReadonlyArray1<'py, f32>>,
    scores: Option<PyReadonlyArray1<'py, f32>>,
    gamma: f64,
    lam: f64,
    lam_critic: f64,
    length_adaptive_alpha: Option<f64>,
) -> PyResult<(Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>)> {
    let (v, m, o) = (slice(&values, "values")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let r = rewards.as_ref().map(|a| slice(a, "rewards")).transpose()?;
    let s = scores.as_ref().map(|a| slice(a, "scores")).transpose()?;
    let source = rewards_of(r, s)?;
    let params = GaeParams { gamma, lam, lam_critic, length_adaptive_alpha };
    let out = run(py, || mpo_core::gae_advantages(v, m, o, source, &params))?;
    Ok((PyArray1::from_vec(py, out.advantages), PyArray1::from_vec(py, out.returns)))
}

/// Group-baseline advantages from dense group codes in `0..n_groups`.
#[pyfunction]
#[pyo3(signature = (scores, group_index, n_groups, norm_std, eps, leave_one_out))]
fn group_advantages<'py>(
    py: Python<'py>,
    scores: PyReadonlyArray1<'py, f32>,
    group_index: PyReadonlyArray1<'py, i64>,
    n_groups: usize,
    norm_std: bool,
    eps: f64,
    leave_one_out: bool,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (s, g) = (slice(&scores, "scores")?, slice(&group_index, "group_ids")?);
    let params = GroupParams { norm_std, eps, leave_one_out };
    let out = run(py, || mpo_core::group_advantages(s, g, n_groups, &params))?;
    Ok(PyArray1::from_vec(py, out))
}

/// Per-trajectory values written on each trajectory's policy tokens.
#[pyfunction]
fn broadcast_to_tokens<'py>(
    py: Python<'py>,
    per_trajectory: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (p, m, o) = (slice(&per_trajectory, "per_trajectory")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let out = run(py, || mpo_core::broadcast_to_tokens(p, m, o))?;
    Ok(PyArray1::from_vec(py, out))
}

/// (total, between, within, jumps, (starts, ends, traj_offsets, token_turn))
#[pyfunction]
#[allow(clippy::type_complexity)]
fn value_structure<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<(
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f32>>,
    TurnArrays<'py>,
)> {
    let (v, m, o) = (slice(&values, "values")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let out = run(py, || mpo_core::value_structure(v, m, o))?;
    Ok((
        PyArray1::from_vec(py, out.total),
        PyArray1::from_vec(py, out.between),
        PyArray1::from_vec(py, out.within),
        PyArray1::from_vec(py, out.jumps),
        turn_arrays(py, out.turns),
    ))
}

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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    keep_freed_pages();
    let threading = m.py().import("threading")?;
    pool::on_import(threading.call_method0("main_thread")?.is(&threading.call_method0("current_thread")?));
    m.add("InvalidBatchError", m.py().get_type::<InvalidBatchError>())?;
    m.add_function(wrap_pyfunction!(segment_turns, m)?)?;
    m.add_function(wrap_pyfunction!(mae_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(gae_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(group_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast_to_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(value_structure, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    arrow::register(m)?;
    diagnose::register(m)?;
    Ok(())
}
