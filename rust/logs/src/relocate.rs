//! Moving a reward on an observation token (mask 0) as the `observation_rewards` option
//! ([`crate::observation`]) says (docs/parquet.md, "Rewards on observation tokens"). The
//! estimators refuse such a reward; a trainer that writes a trajectory's score into a
//! padded row's last column puts it exactly there. `drop` zeroes it, `credit` adds it to
//! the last policy token before it in its row (the action the observation answered),
//! dropping it when the row has none — as `mpo_rs.torch`'s padded API does.
//!
//! Only what the estimators (and the group scores, and diagnose) see is moved: the input
//! columns, the rewards column included, are written out as the user gave them. A
//! non-finite reward is never moved, so it is refused where it is; with the default
//! (`error`) nothing is read or copied.

use std::borrow::Cow;

use arrow::array::RecordBatch;

use crate::decode::{read_row_scores, row_sums, RewardData, Rollouts};
use crate::error::DataError;
use crate::observation::check_observation_rewards;
use crate::schema::{Columns, RewardColumn};

// Re-exported where the crate has always named them.
pub use crate::observation::{ObservationRewards, OBSERVATION_REWARDS};

/// `rewards` as the estimators see them under `mode`: borrowed as given when nothing moves
/// (always with `Error`), else a copy with each finite nonzero reward on a mask-0 token
/// moved. Credit adds in token order in float32 (as `mpo_rs.torch`); a sum that overflows
/// float32 is refused naming the row.
pub fn relocate<'a>(
    rewards: Cow<'a, [f32]>,
    mask: &[u8],
    offsets: &[i64],
    mode: ObservationRewards,
    column: &str,
) -> Result<Cow<'a, [f32]>, DataError> {
    let stray = |m: u8, r: f32| m == 0 && r != 0.0 && r.is_finite();
    if mode == ObservationRewards::Error || !mask.iter().zip(rewards.iter()).any(|(&m, &r)| stray(m, r)) {
        return Ok(rewards);
    }
    let mut out = rewards.into_owned();
    for (row, w) in offsets.windows(2).enumerate() {
        let mut last_policy = None;
        for q in w[0] as usize..w[1] as usize {
            if mask[q] != 0 {
                last_policy = Some(q);
                continue;
            }
            let r = out[q];
            if !stray(0, r) {
                continue;
            }
            out[q] = 0.0;
            if let (ObservationRewards::Credit, Some(p)) = (mode, last_policy) {
                let before = out[p];
                out[p] += r;
                if before.is_finite() && !out[p].is_finite() {
                    return Err(DataError::RewardSumOutOfRange {
                        column: column.into(),
                        row: row as u64,
                        value: before as f64 + r as f64,
                    });
                }
            }
        }
    }
    Ok(Cow::Owned(out))
}

/// `r` with its token rewards relocated as `columns.observation_rewards` says.
pub fn apply<'a>(mut r: Rollouts<'a>, columns: &Columns) -> Result<Rollouts<'a>, DataError> {
    if let RewardData::Token(t) = r.rewards {
        let moved = relocate(t, &r.mask, &r.offsets, columns.observation_rewards, columns.reward.name())?;
        r.rewards = RewardData::Token(moved);
    }
    Ok(r)
}

/// The score of each row for the group baselines (and `mpo-rs diagnose`'s outcome): the
/// score column, or the sum of the row's token rewards as `r` (read from `batch` and
/// passed through [`apply`]) holds them. With `Error` a reward on an observation token is
/// refused; the column's own checks (finite rewards, a sum within float32) come first.
pub fn group_scores<'a>(
    batch: &'a RecordBatch,
    columns: &Columns,
    r: &Rollouts<'_>,
) -> Result<Cow<'a, [f32]>, DataError> {
    let scores = read_row_scores(batch, &columns.reward)?;
    let (RewardData::Token(t), RewardColumn::Token(name)) = (&r.rewards, &columns.reward) else {
        return Ok(scores);
    };
    if columns.observation_rewards == ObservationRewards::Error {
        check_observation_rewards(t, &r.mask, &r.offsets, name)?;
        return Ok(scores);
    }
    // Summed as `read_row_scores` sums, over the relocated rewards (finite: the checks
    // above refused any other, and relocation refuses a credited sum beyond float32).
    row_sums(t, &r.offsets, name, false).map(Cow::Owned)
}

/// The row scores of a group-statistics pass over `batch` (holding the columns of
/// [`Columns::score_pass_columns`]). With `Error`, only the reward column is read and a
/// reward on an observation token is left for the annotation to refuse, as before the
/// option existed.
pub fn statistics_scores<'a>(batch: &'a RecordBatch, columns: &Columns) -> Result<Cow<'a, [f32]>, DataError> {
    if columns.observation_rewards == ObservationRewards::Error || !matches!(columns.reward, RewardColumn::Token(_)) {
        return read_row_scores(batch, &columns.reward);
    }
    let r = apply(Rollouts::read(batch, columns)?, columns)?;
    group_scores(batch, columns, &r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ObservationRewards::{Credit, Drop, Error};

    fn moved(rewards: &[f32], mask: &[u8], offsets: &[i64], mode: ObservationRewards) -> Vec<f32> {
        relocate(Cow::Borrowed(rewards), mask, offsets, mode, "rewards").unwrap().into_owned()
    }

    #[test]
    fn nothing_to_move_borrows_the_rewards() {
        let (rewards, mask, offsets) = ([0.0, 1.0, -0.0, 0.0], [1, 1, 0, 0], [0, 4]);
        for mode in [Error, Drop, Credit] {
            let out = relocate(Cow::Borrowed(&rewards[..]), &mask, &offsets, mode, "rewards").unwrap();
            assert!(matches!(out, Cow::Borrowed(_)), "{mode:?}");
        }
        // Error never looks: a stray reward stays for the estimator to refuse.
        let stray = [0.0, 0.0, 0.0, 1.0];
        let out = relocate(Cow::Borrowed(&stray[..]), &mask, &offsets, Error, "rewards").unwrap();
        assert!(matches!(out, Cow::Borrowed(r) if r == stray));
    }

    #[test]
    fn credit_moves_to_the_last_policy_token_before_in_the_row_and_drop_zeroes() {
        // Row 0: [1,1,1,0] with the score in the padding column; row 1: a leading
        // observation reward (no policy token before it) and one after a turn; row 2: two
        // rewards on one observation run, after a policy reward.
        let mask = [1, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0];
        let rewards = [0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 0.0, 0.5, 0.25, 0.125];
        let offsets = [0, 4, 8, 11];
        assert_eq!(moved(&rewards, &mask, &offsets, Credit), [0.0, 0.0, 1.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.875, 0.0, 0.0]);
        assert_eq!(moved(&rewards, &mask, &offsets, Drop), [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0]);
        // A row never credits the row before it.
        assert_eq!(moved(&[0.0, 7.0, 0.0], &[1, 0, 1], &[0, 1, 3], Credit), [0.0; 3]);
    }

    #[test]
    fn non_finite_rewards_stay_and_overflow_is_refused() {
        let mask = [1, 0, 0];
        let out = moved(&[0.0, f32::NAN, 1.0], &mask, &[0, 3], Credit);
        assert!(out[1].is_nan() && out[0] == 1.0 && out[2] == 0.0);
        let e = relocate(Cow::Borrowed(&[f32::MAX, f32::MAX, 0.0][..]), &mask, &[0, 3], Credit, "r").unwrap_err();
        assert_eq!(e, DataError::RewardSumOutOfRange { column: "r".into(), row: 0, value: 2.0 * f32::MAX as f64 });
    }
}
