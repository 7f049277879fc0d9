//! The driver of the estimators that write, per trajectory, token advantages and value
//! targets plus one advantage per turn (MAE, bi-level GAE): validation, the segmentation,
//! the parallel walk over trajectories, the gather/scatter of the policy tokens and the
//! error of the first bad trajectory. Each estimator supplies only its recursion
//! ([`TurnKernel`]), so the scaffolding and its safety argument are written once.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::compact::{with_scratch, Compact};
use crate::error::{MpoError, Result, TokenAt};
use crate::layout::{first_problem, score_ok, Layout, RewardAt, Rewards, RewardsVisitor};
use crate::output::OutBuf;
use crate::parallel::try_for_each_trajectory;
use crate::turns::{fill_turns, TurnBufs, Turns};

/// Per-token advantages and value targets (0 off-policy), per-turn advantages, and the
/// segmentation they were computed on.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutput {
    pub advantages: Vec<f32>,
    pub returns: Vec<f32>,
    pub turn_advantages: Vec<f32>,
    pub turns: Turns,
}

/// One estimator's recursion over one gathered trajectory ([`Compact`]: its policy tokens'
/// values and rewards, its runs). It fills `cs.advantages` and `cs.returns` (compact
/// indices) and writes every one of the trajectory's `turn_adv`, and returns the
/// trajectory-local index and value of the first turn advantage that is not finite when
/// that can happen without a token result overflowing (the scatter checks the tokens).
pub(crate) trait TurnKernel: Sync {
    fn estimate(&self, cs: &mut Compact, truncated: bool, turn_adv: &mut [MaybeUninit<f32>]) -> Option<(usize, f32)>;
}

/// Runs `kernel` on every trajectory of the batch in parallel. `truncated[j]` (one per
/// trajectory; `None`: none truncated) is handed to the kernel.
pub(crate) fn turn_estimates(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    truncated: Option<&[bool]>,
    kernel: &impl TurnKernel,
) -> Result<TurnOutput> {
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_tokens("values", values.len())?;
    rewards.check_shape(&layout)?;
    if let Some(t) = truncated {
        layout.expect_trajectories("truncated", t.len())?;
    }
    let mut turn_bufs = TurnBufs::count(&layout, mask)?;
    let (traj_offsets, starts, ends, token_turn) = turn_bufs.split(&layout);

    let n_tokens = layout.n_tokens();
    let mut advantages = OutBuf::<f32>::new(n_tokens);
    let mut returns = OutBuf::<f32>::new(n_tokens);
    let mut turn_advantages = OutBuf::<f32>::new(*traj_offsets.last().unwrap_or(&0) as usize);
    let parts = advantages
        .parts(offsets)
        .into_par_iter()
        .zip(returns.parts(offsets))
        .zip(turn_advantages.parts(traj_offsets))
        .zip(starts.into_par_iter().zip(ends).zip(token_turn));
    try_for_each_trajectory(parts, |j, (((adv, ret), turn_adv), ((starts, ends), token_turn))| {
        let range = layout.range(j);
        let traj_mask = &mask[range.clone()];
        let traj = Trajectory {
            j,
            base: range.start,
            mask: traj_mask,
            values,
            source: rewards,
            kernel,
            truncated: truncated.is_some_and(|t| t[j]),
            first_turn: traj_offsets[j],
            out: Outputs { adv, ret, turn_adv, starts, ends, token_turn },
        };
        if !rewards.with_trajectory(j, traj_mask, range.start, traj)? {
            first_problem(&layout, mask, values, rewards, j)?;
        }
        Ok(())
    })?;
    // SAFETY: `Trajectory::visit` succeeded on every trajectory, and then wrote every token
    // of it, its segmentation, and (the kernel's contract) every one of its turns.
    let (advantages, returns, turn_advantages, turns) = unsafe {
        (advantages.assume_written(), returns.assume_written(), turn_advantages.assume_written(), turn_bufs.finish())
    };
    Ok(TurnOutput { advantages, returns, turn_advantages, turns })
}

/// One trajectory's output slices (local indices).
struct Outputs<'o> {
    adv: &'o mut [MaybeUninit<f32>],
    ret: &'o mut [MaybeUninit<f32>],
    turn_adv: &'o mut [MaybeUninit<f32>],
    starts: &'o mut [MaybeUninit<i64>],
    ends: &'o mut [MaybeUninit<i64>],
    token_turn: &'o mut [MaybeUninit<i32>],
}

/// One trajectory: its index, where it starts, its mask, the inputs and where to write.
struct Trajectory<'a, 'o, K> {
    j: usize,
    base: usize,
    mask: &'a [u8],
    values: &'a [f32],
    source: Rewards<'a>,
    kernel: &'a K,
    /// Bootstrap the end from the last policy token's value (else from 0), where the
    /// estimator takes it.
    truncated: bool,
    /// Global index of the trajectory's first turn.
    first_turn: i64,
    out: Outputs<'o>,
}

impl<K: TurnKernel> RewardsVisitor<Result<bool>> for Trajectory<'_, '_, K> {
    /// Gathers the policy tokens (see [`crate::compact`]), writes the segmentation, runs the
    /// kernel and scatters the results. Returns `Ok(false)` if the fast input checks failed
    /// (nothing is then written), the error of a non-finite score or of a result that
    /// overflows float32.
    fn visit<R: RewardAt>(self, rewards: R) -> Result<bool> {
        let Trajectory { j, base, mask, values, source, kernel, truncated, first_turn, out } = self;
        let Outputs { adv, ret, turn_adv, starts, ends, token_turn } = out;
        with_scratch(|cs| {
            if !cs.gather(mask, base, values, source, rewards) {
                return Ok(false);
            }
            score_ok(source, j)?;
            let turns = cs.runs.iter().map(|r| (r.tokens.clone(), r.policy as u8));
            fill_turns(turns, base, first_turn as i32, starts, ends, token_turn);
            cs.prepare_results();
            let bad_turn = kernel.estimate(cs, truncated, turn_adv);
            if !cs.scatter(adv, ret) {
                return Err(cs.overflow(j, base));
            }
            if let Some((t, value)) = bad_turn {
                let first = cs.runs.iter().filter(|r| r.policy).nth(t).map_or(0, |r| r.tokens.start);
                let at = TokenAt { token: base + first, trajectory: j, position: first };
                return Err(MpoError::NonFiniteOutput { output: "turn_advantages", value, at });
            }
            Ok(true)
        })
    }
}
