//! The one argument `columns` of every native function that reads a rollout log: an
//! `mpo_rs.Columns` (python/mpo_rs/columns.py), read by its attributes and turned into
//! mpo-logs' `ColumnSpec`.

use mpo_logs::ColumnSpec;
use pyo3::prelude::*;

use crate::errors::InvalidOptionError;

/// The column names of an `mpo_rs.Columns`; None: the column's default rule.
#[derive(FromPyObject)]
pub(crate) struct LogColumns {
    pub mask: String,
    pub values: String,
    pub rewards: Option<String>,
    pub score: Option<String>,
    pub group: String,
    pub turn_rewards: Option<String>,
    pub check_score: Option<String>,
    pub truncated: Option<String>,
    pub turn_state_ids: Option<String>,
    pub token_ids: Option<String>,
}

impl LogColumns {
    /// The spec mpo-logs resolves against a schema. `check_tolerance` (None: no check of
    /// turn rewards against a score, so `check_score` must be unset) is the sum check's;
    /// `observation_rewards` a name of `observation_rewards_spec()` (None: the default).
    pub(crate) fn spec(
        self,
        check_tolerance: Option<&Bound<'_, PyAny>>,
        observation_rewards: Option<&str>,
    ) -> PyResult<ColumnSpec> {
        let check_score = match (self.check_score, crate::options::check_tolerance(check_tolerance)?) {
            (Some(c), Some(t)) => Some((c, t)),
            (None, _) => None,
            (Some(_), None) => {
                return Err(InvalidOptionError::new_err("`check_score_col` needs its `check_tolerance`"))
            }
        };
        Ok(ColumnSpec {
            mask: self.mask,
            values: self.values,
            rewards: self.rewards,
            score: self.score,
            turn_rewards: self.turn_rewards,
            check_score,
            truncated: self.truncated,
            group: self.group,
            turn_state_ids: self.turn_state_ids,
            token_ids: self.token_ids,
            observation_rewards: observation_rewards
                .map(crate::arrow::observation_rewards)
                .transpose()?
                .unwrap_or_default(),
        })
    }
}
