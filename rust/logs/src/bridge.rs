//! What passes between a batch and mpo-core: the reward signal as the core reads it, and
//! the core's errors named by the batch's columns and rows.

use mpo_core::{MpoError, Rewards, SumCheck, TurnRewards};

use crate::decode::{RewardData, Rollouts};
use crate::error::DataError;
use crate::schema::Columns;

/// Per-turn rewards placed as token rewards on each turn's last policy token (checked for
/// every estimator: counts, finiteness, the optional sums); None for other reward columns.
pub(crate) fn placed_rewards(r: &Rollouts<'_>, columns: &Columns) -> Result<Option<Vec<f32>>, DataError> {
    let RewardData::Turn { rewards, offsets } = &r.rewards else { return Ok(None) };
    let turn = TurnRewards { rewards, offsets: Some(offsets) };
    let check = match (&r.check_scores, &columns.check) {
        (Some(scores), Some((_, tolerance))) => Some(SumCheck { scores, tolerance: *tolerance }),
        _ => None,
    };
    mpo_core::place_turn_rewards(&r.mask, &r.offsets, turn, check).map(Some).map_err(|e| from_core(e, columns))
}

/// The reward signal as the core reads it: the placed turn rewards, else the batch's own.
pub(crate) fn core_rewards<'a>(r: &'a Rollouts<'_>, placed: &'a Option<Vec<f32>>) -> Rewards<'a> {
    match (&r.rewards, placed) {
        (_, Some(placed)) => Rewards::Token(placed),
        (RewardData::Score(s), None) => Rewards::Score(s),
        (RewardData::Token(t) | RewardData::Turn { rewards: t, .. }, None) => Rewards::Token(t),
    }
}

/// Names the column and row of a core error (the core names arguments and trajectories).
pub(crate) fn from_core(e: MpoError, columns: &Columns) -> DataError {
    let column = |arg: &str| match arg {
        "values" => columns.values.clone().unwrap_or_else(|| arg.into()),
        "rewards" | "scores" | "turn_rewards" => columns.reward.name().into(),
        "check_scores" => columns.check.as_ref().map_or_else(|| arg.into(), |(c, _)| c.clone()),
        "truncated" => columns.truncated.clone().unwrap_or_else(|| arg.into()),
        "turn_state_ids" | "token_ids" => columns.anchors.as_ref().map_or_else(|| arg.into(), |a| a.name().into()),
        "mask" => columns.mask.clone(),
        other => other.into(),
    };
    match e {
        MpoError::NonFiniteTurn { arg, value, trajectory, turn } => {
            DataError::NonFiniteTurn { column: column(arg), row: trajectory as u64, turn: turn as u64, value }
        }
        MpoError::TurnRewardCount { trajectory, got, expected } => DataError::TurnRewardCount {
            column: columns.reward.name().into(),
            row: trajectory as u64,
            got: got as u64,
            expected: expected as u64,
        },
        MpoError::TurnCount { arg: "turn_state_ids", trajectory, got, expected } => DataError::TurnIdCount {
            column: column("turn_state_ids"),
            row: trajectory as u64,
            got: got as u64,
            expected: expected as u64,
        },
        MpoError::TurnRewardSum { trajectory, sum, score, tolerance } => DataError::TurnRewardSum {
            column: columns.reward.name().into(),
            check_column: column("check_scores"),
            row: trajectory as u64,
            sum,
            score,
            tolerance,
        },
        MpoError::MaskValue { value, at } => DataError::MaskValue {
            column: columns.mask.clone(),
            row: at.trajectory as u64,
            token: at.position as u64,
            value: value as i64,
        },
        MpoError::NonFiniteToken { arg, value, at } => DataError::NonFiniteToken {
            column: column(arg),
            row: at.trajectory as u64,
            token: at.position as u64,
            value,
        },
        MpoError::NonFiniteTrajectory { arg, value, trajectory } => {
            DataError::NonFiniteRow { column: column(arg), row: trajectory as u64, value }
        }
        MpoError::ObservationReward { value, at } => DataError::ObservationReward {
            column: columns.reward.name().into(),
            row: at.trajectory as u64,
            token: at.position as u64,
            value,
        },
        MpoError::NonFiniteOutput { output, value, at } => DataError::NonFiniteOutput {
            output: output.into(),
            row: at.trajectory as u64,
            token: at.position as u64,
            value,
        },
        MpoError::NonFiniteTrajectoryOutput { output, value, trajectory } => {
            DataError::NonFiniteOutputRow { output: output.into(), row: trajectory as u64, value }
        }
        MpoError::Capacity(m) => DataError::Capacity(m),
        other => DataError::Estimator(other),
    }
}
