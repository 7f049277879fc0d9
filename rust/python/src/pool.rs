//! The extension's own rayon pools, safe across `fork()`.
//!
//! A forked child (a DataLoader worker, a multiprocessing "fork" worker) inherits the
//! parent's pool *objects* but none of their threads, so using them would hang. Each pool
//! is tagged with the pid that built it; a process that finds a foreign pool builds a
//! fresh one (single-threaded by default in a forked child, as torch does in workers,
//! unless the user asked for a size) and never touches — or frees — the inherited one.
//! Pools are leaked on purpose: they live for the process, and a replaced pool may still
//! be borrowed by another thread.
//!
//! Two pools, built on first use, of the same size:
//! - [`for_calls`] runs a call made by the caller and waited for (the estimators, Arrow
//!   tables). Built on the Python main thread, it adopts that thread as its worker 0
//!   (`use_current_thread`): a call from the main thread runs inline and works alongside
//!   the other workers instead of blocking while they wake up. On a 2-core VM, blocking
//!   the caller made the kernel start both workers on one core in about half the calls,
//!   which doubled the wall time of a 5 ms call (measured: GAE median 6.0 -> 4.2 ms, MAE
//!   9.2 -> 5.8 ms, 3.36M tokens, cold caches). Calls from other threads are queued as
//!   before and run on the spawned workers — so a pool of one thread (RAYON_NUM_THREADS=1,
//!   `set_num_threads(1)`, a 1-CPU container) has no adopted thread: its one worker is
//!   spawned, or calls from other threads would wait for a worker that never comes.
//! - [`for_stages`] has only spawned workers: the Parquet pipeline submits work from its
//!   decode and encode threads, and an adopted main thread, blocked between batches, would
//!   leave those stages one worker short.
//!
//! A forked child's main thread still carries the parent's worker state, so the child's
//! pools cannot adopt it and are built without (rayon then runs its calls as calls from a
//! thread of another pool).

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::errors::internal_error;

struct Pool {
    pid: u32,
    threads: usize,
    pool: ThreadPool,
}

/// One lazily built, pid-tagged pool.
struct Slot {
    pool: AtomicPtr<Pool>,
    adopt_main_thread: bool,
}

static CALLS: Slot = Slot { pool: AtomicPtr::new(std::ptr::null_mut()), adopt_main_thread: true };
static STAGES: Slot = Slot { pool: AtomicPtr::new(std::ptr::null_mut()), adopt_main_thread: false };

/// Threads asked for by `set_num_threads`; 0 = rayon's default (RAYON_NUM_THREADS, else
/// one per core).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);
/// The process that imported the module; any other pid is a forked child.
static IMPORTED_BY: AtomicU32 = AtomicU32::new(0);
/// The Python main thread, recorded when the module is imported there.
static MAIN_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Records the importing process, and the calling thread as the Python main thread if
/// `is_main` (module initialisation).
pub fn on_import(is_main: bool) {
    IMPORTED_BY.store(std::process::id(), Ordering::Relaxed);
    if is_main {
        let _ = MAIN_THREAD.set(std::thread::current().id());
    }
}

/// The number of threads rayon gives a pool asked for `requested` (0 = its default:
/// RAYON_NUM_THREADS if a positive number, else the CPUs this process may run on).
fn effective_threads(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    match std::env::var("RAYON_NUM_THREADS").ok().and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

fn build(threads: usize, adopt_main_thread: bool) -> Result<&'static Pool, String> {
    let builder = || ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("mpo-rs-{i}"));
    let on_main = MAIN_THREAD.get() == Some(&std::thread::current().id());
    // An adopted main thread works for the pool only while it is inside a call of its
    // own; a pool whose one worker is that thread would never run another thread's call
    // (it would wait forever). Adopt only when at least one spawned worker remains.
    // Adoption also fails if this thread already belongs to a pool (an earlier pool of
    // ours, or the parent's, inherited through fork): build without it then.
    let adopt = adopt_main_thread && on_main && effective_threads(threads) >= 2;
    let adopted = if adopt { builder().use_current_thread().build().ok() } else { None };
    let pool = match adopted {
        Some(pool) => pool,
        None => builder().build().map_err(|e| format!("cannot start the mpo_rs thread pool: {e}"))?,
    };
    let threads = pool.current_num_threads();
    Ok(Box::leak(Box::new(Pool { pid: std::process::id(), threads, pool })))
}

/// The size for a pool built now: the requested one, else 1 in a forked child, else
/// rayon's default.
fn size_now() -> usize {
    let requested = REQUESTED.load(Ordering::Relaxed);
    let forked = IMPORTED_BY.load(Ordering::Relaxed) != std::process::id();
    if requested == 0 && forked {
        1
    } else {
        requested
    }
}

impl Slot {
    fn get(&'static self) -> Result<&'static ThreadPool, String> {
        let seen = self.pool.load(Ordering::Acquire);
        // SAFETY: a non-null pointer always points at a leaked, never-freed `Pool`.
        if let Some(p) = unsafe { seen.as_ref() } {
            if p.pid == std::process::id() {
                return Ok(&p.pool);
            }
        }
        let fresh = build(size_now(), self.adopt_main_thread)?;
        let fresh_ptr = fresh as *const Pool as *mut Pool;
        match self.pool.compare_exchange(seen, fresh_ptr, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(&fresh.pool),
            // Another thread of this process won the race; use its pool (ours stays
            // leaked, which costs idle threads once, at start-up).
            // SAFETY: as above.
            Err(winner) => Ok(unsafe { &(*winner).pool }),
        }
    }

    /// Rebuilds the pool at `threads` (0 = default) unless it already has that size;
    /// a pool not built yet is left to be built at first use.
    fn resize(&'static self, threads: usize) -> Result<(), String> {
        let seen = self.pool.load(Ordering::Acquire);
        // SAFETY: as in `get`.
        let Some(p) = (unsafe { seen.as_ref() }) else { return Ok(()) };
        if p.pid == std::process::id() && threads != 0 && p.threads == threads {
            return Ok(());
        }
        let fresh = build(size_now(), self.adopt_main_thread)?;
        self.pool.store(fresh as *const Pool as *mut Pool, Ordering::Release);
        Ok(())
    }
}

/// The pool for calls the caller waits for.
pub fn for_calls() -> Result<&'static ThreadPool, String> {
    CALLS.get()
}

/// The pool for work submitted by the Parquet pipeline's own threads.
pub fn for_stages() -> Result<&'static ThreadPool, String> {
    STAGES.get()
}

/// Resizes the pools (0 = default). Meant for start-up: each resize leaves the old pools'
/// idle threads behind, and only a pool built before the first call from the main thread
/// can adopt that thread.
pub fn set_num_threads(threads: usize) -> Result<(), String> {
    REQUESTED.store(threads, Ordering::Relaxed);
    CALLS.resize(threads)?;
    STAGES.resize(threads)
}

pub fn num_threads() -> Result<usize, String> {
    Ok(for_calls()?.current_num_threads())
}

/// Which of the extension's pools a call runs on.
#[derive(Debug, Clone, Copy)]
pub enum On {
    /// [`for_calls`]: a call the caller waits for.
    Calls,
    /// [`for_stages`]: the Parquet pipeline, whose own threads submit the work.
    Stages,
}

/// The one way the binding calls into Rust: takes the pool, releases the GIL, runs
/// `f(pool)`, contains a panic (a bug; it becomes a `RuntimeError`, never an abort) and maps
/// the error with `to_py`.
pub fn call<T: Send, E: Send>(
    py: Python<'_>,
    on: On,
    to_py: impl FnOnce(E) -> PyErr,
    f: impl FnOnce(&ThreadPool) -> Result<T, E> + Send,
) -> PyResult<T> {
    let pool = match on {
        On::Calls => for_calls(),
        On::Stages => for_stages(),
    }
    .map_err(PyRuntimeError::new_err)?;
    match py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(pool)))) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(to_py(e)),
        Err(_) => Err(internal_error()),
    }
}

/// [`call`] of `f` inside the pool for calls (the estimators, Arrow tables, statistics).
pub fn run<T: Send, E: Send>(
    py: Python<'_>,
    to_py: impl FnOnce(E) -> PyErr,
    f: impl FnOnce() -> Result<T, E> + Send,
) -> PyResult<T> {
    call(py, On::Calls, to_py, |pool| pool.install(f))
}
