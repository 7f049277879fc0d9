//! The extension's own rayon pool, safe across `fork()`.
//!
//! A forked child (a DataLoader worker, a multiprocessing "fork" worker) inherits the
//! parent's pool *object* but none of its threads, so using it would hang. The pool is
//! tagged with the pid that built it; a process that finds a foreign pool builds a fresh
//! one (single-threaded by default, as torch does in workers, unless the user asked for a
//! size) and never touches — or frees — the inherited one. Pools are leaked on purpose:
//! they live for the process, and a replaced pool may still be borrowed by another thread.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct Pool {
    pid: u32,
    threads: usize,
    pool: ThreadPool,
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());
/// Threads asked for by `set_num_threads`; 0 = rayon's default (RAYON_NUM_THREADS, else
/// one per core).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

fn build(threads: usize) -> Result<&'static Pool, String> {
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("mpo-rs-{i}"))
        .build()
        .map_err(|e| format!("cannot start the mpo_rs thread pool: {e}"))?;
    let threads = pool.current_num_threads();
    Ok(Box::leak(Box::new(Pool { pid: std::process::id(), threads, pool })))
}

/// The pool of this process, built on first use.
pub fn current() -> Result<&'static ThreadPool, String> {
    let pid = std::process::id();
    let seen = POOL.load(Ordering::Acquire);
    // SAFETY: a non-null POOL always points at a leaked, never-freed `Pool`.
    if let Some(p) = unsafe { seen.as_ref() } {
        if p.pid == pid {
            return Ok(&p.pool);
        }
    }
    let forked = !seen.is_null();
    let requested = REQUESTED.load(Ordering::Relaxed);
    let threads = if requested == 0 && forked { 1 } else { requested };
    let fresh = build(threads)?;
    let fresh_ptr = fresh as *const Pool as *mut Pool;
    match POOL.compare_exchange(seen, fresh_ptr, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(&fresh.pool),
        // Another thread of this process won the race; use its pool (ours stays leaked,
        // which costs idle threads once, at start-up).
        Err(winner) => Ok(unsafe { &(*winner).pool }),
    }
}

/// Resizes the pool (0 = default). Meant for start-up; each resize leaves the old
/// pool's idle threads behind.
pub fn set_num_threads(threads: usize) -> Result<(), String> {
    REQUESTED.store(threads, Ordering::Relaxed);
    let seen = POOL.load(Ordering::Acquire);
    if let Some(p) = unsafe { seen.as_ref() } {
        if p.pid == std::process::id() && threads != 0 && p.threads == threads {
            return Ok(());
        }
    }
    let fresh = build(threads)?;
    POOL.store(fresh as *const Pool as *mut Pool, Ordering::Release);
    Ok(())
}

pub fn num_threads() -> Result<usize, String> {
    Ok(current()?.current_num_threads())
}
