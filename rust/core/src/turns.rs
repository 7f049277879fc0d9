//! Turn segmentation: a turn is a maximal run of policy tokens (mask = 1) inside one
//! trajectory.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::error::{MpoError, Result};
use crate::layout::{check_mask, Layout};
use crate::output::{fill, OutBuf};
use crate::parallel::{try_for_each_trajectory, try_map_trajectories};
use crate::runs::{or_all, runs};

/// The turns of a batch, as flat ranges plus a per-token index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Turns {
    /// Flat index of each turn's first token.
    pub starts: Vec<i64>,
    /// Flat index one past each turn's last token.
    pub ends: Vec<i64>,
    /// Turns of trajectory `j` are `traj_offsets[j]..traj_offsets[j+1]`.
    pub traj_offsets: Vec<i64>,
    /// Global turn index of each token, −1 off-policy.
    pub token_turn: Vec<i32>,
}

impl Turns {
    pub fn n_turns(&self) -> usize {
        self.starts.len()
    }

    /// Global turn range of trajectory `j`.
    #[inline]
    pub fn of_trajectory(&self, j: usize) -> std::ops::Range<usize> {
        self.traj_offsets[j] as usize..self.traj_offsets[j + 1] as usize
    }
}

/// Segments every trajectory of the batch into turns.
pub fn segment_turns(mask: &[u8], offsets: &[i64]) -> Result<Turns> {
    let layout = Layout::new(offsets, mask.len())?;
    segment(&layout, mask)
}

pub(crate) fn segment(layout: &Layout<'_>, mask: &[u8]) -> Result<Turns> {
    let mut bufs = TurnBufs::count(layout, mask)?;
    let (traj_offsets, starts, ends, token_turn) = bufs.split(layout);
    let parts = starts.into_par_iter().zip(ends).zip(token_turn);
    try_for_each_trajectory(parts, |j, ((starts, ends), token_turn)| {
        fill_trajectory(layout, mask, j, traj_offsets[j], starts, ends, token_turn);
        Ok(())
    })?;
    // SAFETY: `fill_trajectory` ran on every trajectory.
    Ok(unsafe { bufs.finish() })
}

/// The turn offsets and per-trajectory output slices of a segmentation:
/// (traj_offsets, starts, ends, token_turn).
pub(crate) type TurnSlices<'b> =
    (&'b [i64], Vec<&'b mut [MaybeUninit<i64>]>, Vec<&'b mut [MaybeUninit<i64>]>, Vec<&'b mut [MaybeUninit<i32>]>);

/// A segmentation's outputs, sized by a counting pass and filled trajectory by trajectory
/// with [`fill_trajectory`] -- by `segment`, or inside an estimator's own per-trajectory
/// pass so the mask is read while it is hot.
pub(crate) struct TurnBufs {
    traj_offsets: Vec<i64>,
    starts: OutBuf<i64>,
    ends: OutBuf<i64>,
    token_turn: OutBuf<i32>,
}

impl TurnBufs {
    /// Counts every trajectory's turns (checking the mask is 0/1) and allocates.
    pub(crate) fn count(layout: &Layout<'_>, mask: &[u8]) -> Result<Self> {
        let counts = try_map_trajectories(layout.n_trajectories(), |j| {
            let (count, max) = count_turns(&mask[layout.range(j)]);
            if max > 1 {
                check_mask(layout, mask, j)?; // reports the first bad entry
            }
            Ok(count)
        })?;
        let mut traj_offsets = Vec::with_capacity(counts.len() + 1);
        traj_offsets.push(0i64);
        let mut total = 0i64;
        for c in counts {
            total += c as i64;
            traj_offsets.push(total);
        }
        if total > i32::MAX as i64 {
            return Err(MpoError::Capacity(format!(
                "the batch has {total} turns; turn indices are int32, split the batch"
            )));
        }
        Ok(Self {
            traj_offsets,
            starts: OutBuf::new(total as usize),
            ends: OutBuf::new(total as usize),
            token_turn: OutBuf::new(layout.n_tokens()),
        })
    }

    /// The turn offsets and the per-trajectory output slices.
    pub(crate) fn split(&mut self, layout: &Layout<'_>) -> TurnSlices<'_> {
        (
            &self.traj_offsets,
            self.starts.parts(&self.traj_offsets),
            self.ends.parts(&self.traj_offsets),
            self.token_turn.parts(layout.offsets()),
        )
    }

    /// # Safety
    /// [`fill_trajectory`] must have run on every trajectory's slices.
    pub(crate) unsafe fn finish(self) -> Turns {
        // SAFETY: `fill_trajectory` writes every token of its trajectory, and a start and
        // an end for each of the turns `count_turns` counted in it.
        unsafe {
            Turns {
                starts: self.starts.assume_written(),
                ends: self.ends.assume_written(),
                traj_offsets: self.traj_offsets,
                token_turn: self.token_turn.assume_written(),
            }
        }
    }
}

/// Writes trajectory `j`'s turns (its first turn has global index `first_turn`) and
/// returns their flat (starts, ends), now initialised.
pub(crate) fn fill_trajectory<'b>(
    layout: &Layout<'_>,
    mask: &[u8],
    j: usize,
    first_turn: i64,
    starts: &'b mut [MaybeUninit<i64>],
    ends: &'b mut [MaybeUninit<i64>],
    token_turn: &mut [MaybeUninit<i32>],
) -> (&'b [i64], &'b [i64]) {
    let range = layout.range(j);
    fill_turns(runs(&mask[range.clone()]), range.start, first_turn as i32, starts, ends, token_turn);
    // SAFETY: `fill_turns` wrote one start and one end per turn of the trajectory, and
    // the slices hold exactly its turns (sized by `count_turns` on the same mask).
    unsafe { (assume_init(starts), assume_init(ends)) }
}

/// # Safety
/// Every element of `s` must be initialised.
unsafe fn assume_init<T>(s: &[MaybeUninit<T>]) -> &[T] {
    // SAFETY: MaybeUninit<T> has T's layout; the caller guarantees initialisation.
    unsafe { &*(s as *const [MaybeUninit<T>] as *const [T]) }
}

/// Number of turns (policy runs) and the OR of all mask bytes (> 1 iff one is not 0/1).
#[inline]
fn count_turns(mask: &[u8]) -> (usize, u8) {
    let bits = or_all(mask);
    if bits > 1 {
        return (0, bits);
    }
    (runs(mask).filter(|&(_, m)| m == 1).count(), bits)
}

/// Writes one trajectory's turns from its runs (local ranges; mask byte 1 = policy).
/// `base` is its first flat token, `first_turn` the global index of its first turn.
pub(crate) fn fill_turns(
    runs: impl Iterator<Item = (std::ops::Range<usize>, u8)>,
    base: usize,
    first_turn: i32,
    starts: &mut [MaybeUninit<i64>],
    ends: &mut [MaybeUninit<i64>],
    token_turn: &mut [MaybeUninit<i32>],
) {
    let mut t = 0usize;
    for (run, m) in runs {
        if m == 0 {
            fill(&mut token_turn[run], -1);
        } else {
            starts[t].write((base + run.start) as i64);
            ends[t].write((base + run.end) as i64);
            fill(&mut token_turn[run], first_turn + t as i32);
            t += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_maximal_policy_runs_within_a_trajectory() {
        // traj 0: [0 1 1 0 1]  traj 1: [1 1]  traj 2: []  traj 3: [0 0]
        let mask = [0, 1, 1, 0, 1, 1, 1, 0, 0];
        let t = segment_turns(&mask, &[0, 5, 7, 7, 9]).unwrap();
        assert_eq!(t.starts, vec![1, 4, 5]);
        assert_eq!(t.ends, vec![3, 5, 7]);
        assert_eq!(t.traj_offsets, vec![0, 2, 3, 3, 3]);
        assert_eq!(t.token_turn, vec![-1, 0, 0, -1, 1, 2, 2, -1, -1]);
    }

    #[test]
    fn a_turn_does_not_cross_a_trajectory_boundary() {
        let t = segment_turns(&[1, 1, 1, 1], &[0, 2, 4]).unwrap();
        assert_eq!(t.starts, vec![0, 2]);
        assert_eq!(t.ends, vec![2, 4]);
    }

    #[test]
    fn mask_values_other_than_0_1_are_rejected_with_their_place() {
        let e = segment_turns(&[1, 0, 0, 2], &[0, 2, 4]).unwrap_err();
        assert_eq!(e.to_string(), "`mask` must hold 0 or 1, found 2 at token 3 (trajectory 1, position 1)");
    }

    #[test]
    fn empty_batch() {
        let t = segment_turns(&[], &[0]).unwrap();
        assert_eq!(t.n_turns(), 0);
        assert_eq!(t.traj_offsets, vec![0]);
    }
}
