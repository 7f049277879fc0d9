//! What a reward on an observation token (mask 0) means to the log tools: the
//! `observation_rewards` option (docs/parquet.md, "Rewards on observation tokens") and the
//! estimators' rule that refuses such a reward. How `drop` and `credit` move it is
//! [`crate::relocate`].

use crate::error::{DataError, LogError};

/// What to do with a nonzero reward where the mask is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObservationRewards {
    /// Refuse it, naming row and token (the estimators' rule).
    #[default]
    Error,
    /// Ignore it.
    Drop,
    /// Add it to the last policy token before it in its row; drop it if there is none.
    Credit,
}

/// The modes by name, with a one-line doc: the one table the Python keyword
/// `observation_rewards=`, the `--observation-rewards` flag and `mpo_rs.torch` read.
pub const OBSERVATION_REWARDS: [(&str, ObservationRewards, &str); 3] = [
    ("error", ObservationRewards::Error, "refuse it, naming the row and token"),
    ("drop", ObservationRewards::Drop, "ignore it"),
    (
        "credit",
        ObservationRewards::Credit,
        "move it to the last policy token before it in its row (dropped if there is none)",
    ),
];

impl ObservationRewards {
    pub fn name(self) -> &'static str {
        OBSERVATION_REWARDS.iter().find(|(_, m, _)| *m == self).map_or("error", |(n, _, _)| n)
    }

    /// The mode called `name`, or a usage error listing the names.
    pub fn from_name(name: &str) -> Result<Self, LogError> {
        OBSERVATION_REWARDS.iter().find(|(n, _, _)| *n == name).map(|(_, m, _)| *m).ok_or_else(|| {
            let names: Vec<String> = OBSERVATION_REWARDS.iter().map(|(n, _, _)| format!("'{n}'")).collect();
            LogError::Usage(format!("unknown observation_rewards={name:?}; expected one of {}", names.join(", ")))
        })
    }
}

/// Rewards must be 0 on observation tokens (with `observation_rewards` "error"); the
/// critic estimators check this in the core, the group estimators only sum rewards, so
/// they check here (and so does `mpo-rs diagnose`, which refuses what `advantages`
/// refuses). Rows and tokens are those of the batch.
pub fn check_observation_rewards(rewards: &[f32], mask: &[u8], offsets: &[i64], column: &str) -> Result<(), DataError> {
    for (row, w) in offsets.windows(2).enumerate() {
        for q in w[0] as usize..w[1] as usize {
            if mask[q] == 0 && rewards[q] != 0.0 {
                return Err(DataError::ObservationReward {
                    column: column.into(),
                    row: row as u64,
                    token: q as u64 - w[0] as u64,
                    value: rewards[q],
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_usage_errors() {
        for (name, mode, _) in OBSERVATION_REWARDS {
            assert_eq!(ObservationRewards::from_name(name).unwrap(), mode);
            assert_eq!(mode.name(), name);
        }
        assert_eq!(ObservationRewards::default(), ObservationRewards::Error);
        let e = ObservationRewards::from_name("keep").unwrap_err();
        assert!(e.is_usage());
        assert_eq!(e.to_string(), "unknown observation_rewards=\"keep\"; expected one of 'error', 'drop', 'credit'");
    }
}
