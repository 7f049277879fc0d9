//! One trajectory's policy tokens gathered into contiguous f64 scratch.
//!
//! The recursions run backwards and turns are short (~10² tokens) between longer
//! observations, so a backward sweep over the flat arrays starts a new descending memory
//! stream at every turn, and its latency-bound loop keeps too few loads in flight to hide
//! the misses. Instead every estimator works in three passes over one trajectory:
//! 1. [`Compact::gather`] streams the trajectory forwards: it checks the inputs (vectorised)
//!    and converts the policy tokens' values and rewards to f64, back to back;
//! 2. the estimator's recursions run backwards over that scratch, which stays in L1/L2,
//!    and write compact f32 results;
//! 3. [`Compact::scatter`] writes the outputs forwards: zeros on observation runs, the
//!    compact results on policy runs.
//!
//! The arithmetic is the same, in the same order, as a sweep over the flat arrays.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use crate::error::{MpoError, TokenAt};
use crate::layout::{observation_run_ok, RewardAt, Rewards};
use crate::output::{copy_into, fill};
use crate::runs::{all_finite, runs};

/// A maximal run of one mask value, in trajectory-local token indices.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) tokens: Range<usize>,
    pub(crate) policy: bool,
}

#[derive(Default)]
pub(crate) struct Compact {
    /// The trajectory's runs, in order.
    pub(crate) runs: Vec<Run>,
    /// Values and rewards of its policy tokens, in order.
    pub(crate) values: Vec<f64>,
    pub(crate) rewards: Vec<f64>,
    /// Per policy token results, written by the estimator and scattered.
    pub(crate) advantages: Vec<f32>,
    pub(crate) returns: Vec<f32>,
    /// Estimator-private per policy token scratch.
    pub(crate) work: Vec<f64>,
}

thread_local! {
    /// One per worker thread; grows to the longest trajectory the thread has seen, so
    /// there is no allocation per trajectory.
    static SCRATCH: RefCell<[Compact; 2]> = RefCell::new([Compact::default(), Compact::default()]);
}

/// Asks for the cache lines of `xs` ahead of use (a hint: no effect on results).
#[inline]
fn prefetch(xs: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in xs.chunks(16) {
        // SAFETY: SSE is part of x86-64; a prefetch never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = xs;
}

/// Runs `f` with this thread's scratch.
pub(crate) fn with_scratch<T>(f: impl FnOnce(&mut Compact) -> T) -> T {
    SCRATCH.with(|s| f(&mut s.borrow_mut()[0]))
}

/// Runs `f` with this thread's two scratches (two trajectories at a time).
pub(crate) fn with_scratch_pair<T>(f: impl FnOnce(&mut [Compact; 2]) -> T) -> T {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

impl Compact {
    /// Pass 1: records the runs of `mask` (the trajectory starting at flat token `base`)
    /// and gathers its policy tokens. Returns whether the fast input checks passed: mask
    /// bytes 0/1, finite values and rewards on policy tokens, zero token rewards elsewhere.
    /// On `false` the caller looks closer (`first_problem`); the scratch is then partial.
    pub(crate) fn gather<R: RewardAt>(
        &mut self,
        mask: &[u8],
        base: usize,
        values: &[f32],
        source: Rewards<'_>,
        rewards: R,
    ) -> bool {
        self.runs.clear();
        self.values.clear();
        self.rewards.clear();
        let mut ok = true;
        for (tokens, m) in runs(mask) {
            ok &= m <= 1;
            self.runs.push(Run { tokens, policy: m == 1 });
        }
        // Values are read on policy runs only, so their stream jumps over every observation
        // run and the hardware prefetcher loses it at each turn: fetch the next turn's
        // values while this one is converted.
        let turn = |i: usize| self.runs.get(i).filter(|r| r.policy).map(|r| base + r.tokens.start..base + r.tokens.end);
        if let Some(first) = turn(0).or_else(|| turn(1)) {
            prefetch(&values[first]);
        }
        for (i, run) in self.runs.iter().enumerate() {
            let flat = base + run.tokens.start..base + run.tokens.end;
            if run.policy {
                if let Some(next) = turn(i + 2) {
                    prefetch(&values[next]);
                }
                let vs = &values[flat.clone()];
                ok &= all_finite(vs);
                self.values.extend(vs.iter().map(|&v| v as f64));
                ok &= rewards.gather(flat, &mut self.rewards);
            } else {
                ok &= observation_run_ok(source, flat);
            }
        }
        ok
    }

    pub(crate) fn n_policy(&self) -> usize {
        self.values.len()
    }

    /// Sizes the result buffers to the policy tokens (their contents are overwritten).
    pub(crate) fn prepare_results(&mut self) {
        let n = self.n_policy();
        self.advantages.resize(n, 0.0);
        self.returns.resize(n, 0.0);
    }

    /// Pass 3: the trajectory's outputs, forwards: 0 on observation runs, the compact
    /// results on policy runs. Returns whether every result is finite (finite inputs can
    /// still overflow float32); on `false` the caller names the place with
    /// [`Compact::overflow`] and the outputs are discarded.
    pub(crate) fn scatter(&self, adv: &mut [MaybeUninit<f32>], ret: &mut [MaybeUninit<f32>]) -> bool {
        // Checked over the compact results, which are in L1/L2, in one vectorised pass
        // each; a check fused into the per-run copies below made them scalar (callgrind:
        // the scatter's instructions ×2.4).
        let ok = all_finite(&self.advantages) & all_finite(&self.returns);
        let mut k = 0;
        for run in &self.runs {
            let n = run.tokens.len();
            if run.policy {
                copy_into(&mut adv[run.tokens.clone()], &self.advantages[k..k + n]);
                copy_into(&mut ret[run.tokens.clone()], &self.returns[k..k + n]);
                k += n;
            } else {
                fill(&mut adv[run.tokens.clone()], 0.0);
                fill(&mut ret[run.tokens.clone()], 0.0);
            }
        }
        ok
    }

    /// The error for trajectory `j` (starting at flat token `base`) after [`Compact::scatter`]
    /// found a non-finite result: it names the first one, in token order, advantages
    /// before returns.
    pub(crate) fn overflow(&self, j: usize, base: usize) -> MpoError {
        self.first_overflow(j, base).unwrap_or_else(|| {
            MpoError::Capacity(format!("trajectory {j}: a result is not finite but could not be located"))
        })
    }

    fn first_overflow(&self, j: usize, base: usize) -> Option<MpoError> {
        let policy_tokens = self.runs.iter().filter(|r| r.policy).flat_map(|r| r.tokens.clone());
        for (k, local) in policy_tokens.enumerate() {
            for (output, xs) in [("advantages", &self.advantages), ("returns", &self.returns)] {
                if !xs[k].is_finite() {
                    let at = TokenAt { token: base + local, trajectory: j, position: local };
                    return Some(MpoError::NonFiniteOutput { output, value: xs[k], at });
                }
            }
        }
        None
    }
}
