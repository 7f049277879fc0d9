//! Running one closure per trajectory on the current rayon pool, with errors reported
//! deterministically: the error of the lowest trajectory wins, whatever the thread count.

use rayon::prelude::*;

use crate::error::{MpoError, Result};

/// Calls `f(j, item)` for every trajectory `j` in parallel; the first failing
/// trajectory (by index) is the one reported.
pub(crate) fn try_for_each_trajectory<I, F>(items: I, f: F) -> Result<()>
where
    I: IndexedParallelIterator,
    F: Fn(usize, I::Item) -> Result<()> + Sync + Send,
{
    match items.enumerate().with_min_len(4).map(|(j, item)| f(j, item)).find_map_first(|r| r.err()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Calls `f(first, chunk)` for consecutive chunks of `size` trajectories (the last may be
/// shorter), `first` being the index of the chunk's first trajectory, in parallel; `f`
/// must report a chunk's errors in trajectory order, so the first failing trajectory (by
/// index) is the one reported.
pub(crate) fn try_for_each_chunk<I, F>(items: I, size: usize, f: F) -> Result<()>
where
    I: IndexedParallelIterator,
    F: Fn(usize, Vec<I::Item>) -> Result<()> + Sync + Send,
{
    try_for_each_trajectory(items.chunks(size), |c, chunk| f(c * size, chunk))
}

/// Maps every trajectory in `0..n` to a value in parallel, in order; the first failing
/// trajectory (by index) is the one reported.
pub(crate) fn try_map_trajectories<T, F>(n: usize, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(usize) -> Result<T> + Sync + Send,
{
    let results: Vec<Result<T>> = (0..n).into_par_iter().with_min_len(4).map(f).collect();
    results.into_iter().collect::<std::result::Result<Vec<T>, MpoError>>()
}
