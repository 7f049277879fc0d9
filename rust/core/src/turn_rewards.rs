//! Per-turn rewards: one reward per turn of a trajectory (AReaL's and NeMo-RL's native
//! multi-turn reward), placed on each turn's last policy token. The result is an ordinary
//! token-level reward array, so every estimator reads it as it reads `rewards`, and the
//! results are bitwise those of the same rewards given per token (docs/estimators.md,
//! "Per-turn rewards").

use crate::error::{MpoError, Result};
use crate::layout::{check_mask, check_turn_counts, expect_len, Layout};

/// One reward per turn (a turn is a maximal run of policy tokens), in trajectory order.
#[derive(Debug, Clone, Copy)]
pub struct TurnRewards<'a> {
    pub rewards: &'a [f32],
    /// `rewards[offsets[j]..offsets[j+1]]` are trajectory `j`'s (the ragged form: a
    /// mismatch names the trajectory). `None`: the flat form, the batch's turns in order;
    /// only the total count can then be checked.
    pub offsets: Option<&'a [i64]>,
}

/// The optional check that a trajectory's turn rewards sum to its score:
/// `|Σ_t r_t − score_j| ≤ tolerance · max(1, |score_j|)` (the sum in f64).
#[derive(Debug, Clone, Copy)]
pub struct SumCheck<'a> {
    pub scores: &'a [f32],
    pub tolerance: f64,
}

/// The token-level rewards of `turn` (zero except on each turn's last policy token, which
/// holds its turn's reward), after checking the mask, the counts, finiteness and, with
/// `check`, the sums. Errors: [`MpoError::TurnRewardCount`] (ragged form) or
/// [`MpoError::Length`] (flat form) for a count that is not the number of turns,
/// [`MpoError::NonFiniteTurn`] for NaN/±Inf, [`MpoError::TurnRewardSum`] for a failed check.
pub fn place_turn_rewards(
    mask: &[u8],
    offsets: &[i64],
    turn: TurnRewards<'_>,
    check: Option<SumCheck<'_>>,
) -> Result<Vec<f32>> {
    let layout = Layout::new(offsets, mask.len())?;
    let n = layout.n_trajectories();
    if let Some(c) = &check {
        check_sum_shape(c, n)?;
    }
    // The last policy token of every turn, per trajectory.
    let mut ends: Vec<usize> = Vec::new();
    let mut traj_turns: Vec<usize> = Vec::with_capacity(n + 1);
    traj_turns.push(0);
    for j in 0..n {
        check_mask(&layout, mask, j)?;
        let range = layout.range(j);
        for q in range.clone() {
            if mask[q] == 1 && (q + 1 == range.end || mask[q + 1] == 0) {
                ends.push(q);
            }
        }
        traj_turns.push(ends.len());
    }
    check_turn_counts("turn_rewards", turn.rewards.len(), turn.offsets, &traj_turns, |trajectory, got, expected| {
        MpoError::TurnRewardCount { trajectory, got, expected }
    })?;
    // With the counts equal, the flat and ragged forms hold the same rewards in the same order.
    let mut out = vec![0.0f32; mask.len()];
    for j in 0..n {
        let (lo, hi) = (traj_turns[j], traj_turns[j + 1]);
        let mut sum = 0.0f64;
        for (t, (&r, &q)) in turn.rewards[lo..hi].iter().zip(&ends[lo..hi]).enumerate() {
            if !r.is_finite() {
                return Err(MpoError::NonFiniteTurn { arg: "turn_rewards", value: r, trajectory: j, turn: t });
            }
            out[q] = r;
            sum += r as f64;
        }
        if let Some(c) = check {
            let score = c.scores[j];
            if !score.is_finite() {
                return Err(MpoError::NonFiniteTrajectory { arg: "check_scores", value: score, trajectory: j });
            }
            if (sum - score as f64).abs() > c.tolerance * (score as f64).abs().max(1.0) {
                return Err(MpoError::TurnRewardSum { trajectory: j, sum, score, tolerance: c.tolerance });
            }
        }
    }
    Ok(out)
}

/// Checks the shape of a [`SumCheck`] and its tolerance (before any trajectory is read).
fn check_sum_shape(check: &SumCheck<'_>, n_trajectories: usize) -> Result<()> {
    expect_len("check_scores", check.scores.len(), n_trajectories, "one per trajectory, len(offsets) - 1")?;
    check_tolerance(check.tolerance).map(|_| ())
}

/// `tolerance` if it is in the domain of `check_tolerance`, [0, inf): the one check of
/// that setting, which every entry point applies whether or not a sum check is asked for.
pub fn check_tolerance(tolerance: f64) -> Result<f64> {
    if !(tolerance >= 0.0 && tolerance.is_finite()) {
        return Err(MpoError::Parameter { name: "check_tolerance", value: tolerance, domain: "[0, inf)" });
    }
    Ok(tolerance)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two trajectories: [obs, t0 t0, obs, t1] and [t0, obs, obs].
    const MASK: [u8; 8] = [0, 1, 1, 0, 1, 1, 0, 0];
    const OFFSETS: [i64; 3] = [0, 5, 8];

    #[test]
    fn rewards_land_on_each_turns_last_policy_token() {
        let flat = TurnRewards { rewards: &[1.0, 2.0, 3.0], offsets: None };
        let out = place_turn_rewards(&MASK, &OFFSETS, flat, None).unwrap();
        assert_eq!(out, vec![0.0, 0.0, 1.0, 0.0, 2.0, 3.0, 0.0, 0.0]);
        let ragged = TurnRewards { rewards: &[1.0, 2.0, 3.0], offsets: Some(&[0, 2, 3]) };
        assert_eq!(place_turn_rewards(&MASK, &OFFSETS, ragged, None).unwrap(), out);
    }

    #[test]
    fn a_count_mismatch_names_the_trajectory_and_both_counts() {
        let ragged = TurnRewards { rewards: &[1.0, 2.0, 3.0], offsets: Some(&[0, 1, 3]) };
        let e = place_turn_rewards(&MASK, &OFFSETS, ragged, None).unwrap_err();
        assert_eq!(e, MpoError::TurnRewardCount { trajectory: 0, got: 1, expected: 2 });
        assert!(e.to_string().starts_with("`turn_rewards` has 1 values for trajectory 0, which has 2 turns"), "{e}");
        let flat = TurnRewards { rewards: &[1.0, 2.0], offsets: None };
        let e = place_turn_rewards(&MASK, &OFFSETS, flat, None).unwrap_err().to_string();
        assert!(e.starts_with("`turn_rewards` has length 2, expected 3"), "{e}");
    }

    #[test]
    fn non_finite_rewards_and_failed_sums_are_refused() {
        let flat = TurnRewards { rewards: &[1.0, f32::NAN, 3.0], offsets: None };
        let e = place_turn_rewards(&MASK, &OFFSETS, flat, None).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteTurn { trajectory: 0, turn: 1, .. }), "{e}");
        let flat = TurnRewards { rewards: &[1.0, 2.0, 3.0], offsets: None };
        let ok = SumCheck { scores: &[3.0, 3.0], tolerance: 1e-6 };
        assert!(place_turn_rewards(&MASK, &OFFSETS, flat, Some(ok)).is_ok());
        let bad = SumCheck { scores: &[3.0, 2.5], tolerance: 1e-6 };
        let e = place_turn_rewards(&MASK, &OFFSETS, flat, Some(bad)).unwrap_err();
        assert!(matches!(e, MpoError::TurnRewardSum { trajectory: 1, score: 2.5, .. }), "{e}");
        assert!(e.to_string().contains("trajectory 1"), "{e}");
    }
}
