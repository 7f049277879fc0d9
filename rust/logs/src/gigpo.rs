//! GiGPO over a rollout log whose groups span batches, row groups and files
//! (docs/parquet.md, "GiGPO"). Its two baselines are statistics of the whole log: per
//! group the episode returns R_j (one per row), per step group — a group's turns with one
//! anchor state — the step returns G_{j,t}. They are gathered in the scans of the group
//! estimators ([`GroupStats`]: sums, then squared deviations when `norm_std` divides by
//! the std), each batch read by [`mpo_core::gigpo_inputs`]; then each batch is written
//! with [`mpo_core::gigpo_centred`] and [`mpo_core::gigpo_finish`]. A group's rows and
//! turns are summed in log order, the order in which `mpo_core::gigpo_advantages` sums
//! them over the concatenated rows. Memory is one entry per group and per step group.
//!
//! Anchor states come from a `turn_state_ids` list column (one integer id per turn) or a
//! `token_ids` list column aligned with the mask, hashed as the numpy path hashes them.

use arrow::array::RecordBatch;
use mpo_core::{GigpoInputs, GigpoOutput, GigpoParams, GroupParams, Rewards};

use crate::bridge::{core_rewards, from_core, placed_rewards};
use crate::decode::Rollouts;
use crate::error::DataError;
use crate::groups::GroupStats;
use crate::phase::Phase;
use crate::relocate;
use crate::schema::Columns;

// Re-exported where the crate has always named them.
pub use crate::decode::AnchorData;
pub use crate::steps::StepStats;

impl GroupStats {
    /// Statistics for GiGPO: the group estimators' per group (of the episode returns),
    /// and per step group (of the step returns).
    pub fn gigpo(params: &GigpoParams) -> Self {
        let mut stats =
            GroupStats::new(GroupParams { norm_std: params.norm_std, eps: params.eps, leave_one_out: false });
        stats.steps = Some(Box::new(StepStats::new(*params)));
        stats
    }

    /// Feeds one batch (holding the columns of [`Columns::score_pass_columns`]) to the
    /// current scan: the row scores of the group estimators, or GiGPO's returns.
    pub fn scan_batch(&mut self, batch: &RecordBatch, columns: &Columns) -> Result<(), DataError> {
        let group_col = columns.group.as_deref().unwrap_or_default();
        let Some(params) = self.steps.as_ref().map(|s| s.params) else {
            let scores = relocate::statistics_scores(batch, columns)?;
            return self.scan(group_col, batch, &scores);
        };
        let r = relocate::apply(Rollouts::read(batch, columns)?, columns)?;
        let placed = placed_rewards(&r, columns)?;
        let x = inputs(&r, core_rewards(&r, &placed), columns, &params)?;
        let phase = self.phase();
        let groups = self.scan_rows(group_col, batch, |row| x.episode_return[row])?;
        match self.steps.as_mut() {
            Some(steps) => steps.scan(phase, &groups, &x, tokens(&r), group_col),
            None => Ok(()),
        }
    }
}

/// The batch's token ids, when its anchor states are hashed from them.
fn tokens<'a>(r: &'a Rollouts<'_>) -> Option<&'a [i64]> {
    match r.anchors.as_ref()? {
        AnchorData::Tokens(t) => Some(t),
        AnchorData::TurnStates { .. } => None,
    }
}

/// The batch's returns and anchor ids (mpo_core::gigpo_inputs), errors naming columns.
fn inputs(
    r: &Rollouts<'_>,
    rewards: Rewards<'_>,
    columns: &Columns,
    params: &GigpoParams,
) -> Result<GigpoInputs, DataError> {
    let anchors = r.anchors.as_ref().map(AnchorData::as_core).unwrap_or_default();
    mpo_core::gigpo_inputs(&r.mask, &r.offsets, rewards, anchors, params).map_err(|e| from_core(e, columns))
}

/// GiGPO's outputs for the rows of `batch` (read as `r`), from finished statistics.
pub(crate) fn advantages(
    stats: &GroupStats,
    params: &GigpoParams,
    batch: &RecordBatch,
    columns: &Columns,
    r: &Rollouts<'_>,
    rewards: Rewards<'_>,
) -> Result<GigpoOutput, DataError> {
    let (Some(steps), Phase::Ready) = (stats.steps.as_deref(), stats.phase()) else {
        return Err(DataError::Capacity("the gigpo statistics are not finished".into()));
    };
    let group_col = columns.group.as_deref().unwrap_or_default();
    let x = inputs(r, rewards, columns, params)?;
    let groups = stats.rows(group_col, batch)?;
    let mut episode = Vec::with_capacity(groups.len());
    let mut step = vec![0f64; x.turns.n_turns()];
    for (j, &g) in groups.iter().enumerate() {
        let m = stats.moments(g);
        episode.push(mpo_core::gigpo_centred(x.episode_return[j], m.count as usize, m.mean, m.sq_dev, params));
        let mut prev = None;
        for t in x.turns.of_trajectory(j) {
            let c = x.candidate(tokens(r), t, prev);
            let (k, s) = steps.moments(g, x.anchor[t], &c).ok_or_else(|| DataError::unknown_group(group_col, j))?;
            prev = Some(k);
            step[t] = mpo_core::gigpo_centred(x.step_return[t], s.count as usize, s.mean, s.sq_dev, params);
        }
    }
    mpo_core::gigpo_finish(&r.mask, &r.offsets, x.turns, episode, step, params).map_err(|e| from_core(e, columns))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, AsArray, Float32Array, Int64Array, ListArray};
    use arrow::datatypes::{Float32Type, Int64Type, UInt8Type};

    use super::*;
    use crate::estimator::{Estimator, EstimatorColumns, OptionValue};
    use crate::schema::{AnchorColumn, ColumnSpec};

    /// One row: its mask, token ids, token rewards and group id.
    type Row = (Vec<u8>, Vec<i64>, Vec<f32>, i64);

    fn batch(rows: &[Row]) -> RecordBatch {
        let mask = ListArray::from_iter_primitive::<UInt8Type, _, _>(
            rows.iter().map(|r| Some(r.0.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        );
        let tokens = ListArray::from_iter_primitive::<Int64Type, _, _>(
            rows.iter().map(|r| Some(r.1.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        );
        let rewards = ListArray::from_iter_primitive::<Float32Type, _, _>(
            rows.iter().map(|r| Some(r.2.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        );
        RecordBatch::try_from_iter([
            ("loss_mask", Arc::new(mask) as ArrayRef),
            ("token_ids", Arc::new(tokens) as ArrayRef),
            ("rewards", Arc::new(rewards) as ArrayRef),
            ("group_id", Arc::new(Int64Array::from(rows.iter().map(|r| r.3).collect::<Vec<_>>())) as ArrayRef),
        ])
        .unwrap()
    }

    fn rows() -> Vec<Row> {
        let mut seed = 11u64;
        let mut next = move |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        (0..60)
            .map(|_| {
                let len = 1 + next(12) as usize;
                let mask: Vec<u8> = (0..len).map(|_| (next(3) != 0) as u8).collect();
                let tokens = (0..len).map(|_| next(3) as i64).collect();
                let rewards = mask.iter().map(|&m| if m == 1 { next(7) as f32 / 3.0 - 1.0 } else { 0.0 }).collect();
                (mask, tokens, rewards, next(5) as i64)
            })
            .collect()
    }

    #[test]
    fn split_batches_equal_the_core_on_the_whole() {
        let rows = rows();
        let whole = batch(&rows);
        let parts = [batch(&rows[..17]), batch(&rows[17..18]), batch(&rows[18..])];
        for norm_std in [false, true] {
            let est = Estimator::from_options("gigpo", &[("norm_std", OptionValue::Bool(norm_std))]).unwrap();
            let Estimator::Gigpo(p) = est else { unreachable!() };
            let cols = ColumnSpec::default().resolve(whole.schema_ref(), est.needs()).unwrap();
            assert_eq!(cols.anchors, Some(AnchorColumn::Tokens("token_ids".into())));
            let (out, _) = crate::annotate_table(&parts, whole.schema_ref(), &cols, &est).unwrap();
            let got: Vec<f32> = out
                .iter()
                .flat_map(|b| b.column(0).as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec())
                .collect();
            let mask: Vec<u8> = rows.iter().flat_map(|r| r.0.clone()).collect();
            let tokens: Vec<i64> = rows.iter().flat_map(|r| r.1.clone()).collect();
            let rewards: Vec<f32> = rows.iter().flat_map(|r| r.2.clone()).collect();
            let groups: Vec<i64> = rows.iter().map(|r| r.3).collect();
            let mut offsets = vec![0i64];
            for r in &rows {
                offsets.push(offsets.last().unwrap() + r.0.len() as i64);
            }
            let want = mpo_core::gigpo_advantages(
                &mask,
                &offsets,
                Rewards::Token(&rewards),
                mpo_core::Groups { index: &groups, n_groups: 5 },
                mpo_core::Anchors { turn_state_ids: None, token_ids: Some(&tokens) },
                &p,
            )
            .unwrap();
            assert!(want.step_advantages.iter().any(|&a| a != 0.0));
            assert_eq!(got, want.advantages, "norm_std {norm_std}");
        }
    }

    #[test]
    fn anchor_columns_are_checked_with_row_and_column() {
        let rows = rows();
        let b = batch(&rows[..3]);
        let est = Estimator::from_options("gigpo", &[]).unwrap();
        // Token ids one short in row 1.
        let mut short = rows[..3].to_vec();
        short[1].1.pop();
        let bad = batch(&short);
        let cols = ColumnSpec::default().resolve(b.schema_ref(), est.needs()).unwrap();
        let e = crate::annotate_table(&[bad], b.schema_ref(), &cols, &est).unwrap_err().to_string();
        assert!(e.contains("row 1: column `token_ids` has"), "{e}");
        // One id per turn: a row with the wrong count is named.
        let turns =
            ListArray::from_iter_primitive::<Int64Type, _, _>([Some(vec![Some(1)]), Some(vec![]), Some(vec![])]);
        let with_ids = |ids: ListArray| {
            let mut cols: Vec<(&str, ArrayRef)> = vec![("turn_state_ids", Arc::new(ids) as ArrayRef)];
            for name in ["loss_mask", "rewards", "group_id"] {
                cols.push((name, b.column_by_name(name).unwrap().clone()));
            }
            RecordBatch::try_from_iter(cols).unwrap()
        };
        let t = with_ids(turns);
        let cols = ColumnSpec::default().resolve(t.schema_ref(), est.needs()).unwrap();
        assert_eq!(cols.anchors, Some(AnchorColumn::TurnStates("turn_state_ids".into())));
        let e = crate::annotate_table(std::slice::from_ref(&t), t.schema_ref(), &cols, &est).unwrap_err().to_string();
        assert!(e.contains("column `turn_state_ids`") && e.contains("anchor-state ids, but the row has"), "{e}");
        let floats = Arc::new(Float32Array::from(vec![1.0f32]));
        let item = Arc::new(arrow::datatypes::Field::new_list_field(arrow::datatypes::DataType::Float32, true));
        let wrong = ListArray::new(item, arrow::buffer::OffsetBuffer::from_lengths([1, 0, 0]), floats, None);
        let w = with_ids(wrong);
        let e = ColumnSpec::default().resolve(w.schema_ref(), est.needs()).unwrap_err().to_string();
        assert!(e.contains("`turn_state_ids`") && e.contains("list<integer>"), "{e}");
    }
}
