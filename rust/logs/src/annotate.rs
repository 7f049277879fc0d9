//! Computing the output columns of a batch with mpo-core (docs/parquet.md, "Columns"):
//!
//! - `advantages` list<float32>: one per token, 0 on observation tokens;
//! - `returns` list<float32>: the critic's value targets (group estimators have no critic:
//!   returns equal advantages, as in verl);
//! - `turn_index` list<int32>: the token's turn counted *within its trajectory* (0, 1, …),
//!   −1 on observation tokens — per row, so it does not depend on how a log is split into
//!   batches, row groups or files;
//! - `turn_advantages` list<float32>: one per turn of the row. For MAE it is A_t^turn; for
//!   the other estimators it is the mean token advantage of the turn, which is what A_t^turn
//!   equals for MAE too (the intra-turn refinement is centred, so it keeps the turn mean).
//!
//! The lists take the mask column's width (list or large_list) and its offsets.

use std::sync::Arc;

use arrow::array::{ArrayRef, ArrowPrimitiveType, LargeListArray, ListArray, PrimitiveArray, RecordBatch};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Float32Type, Int32Type, Schema, SchemaRef};
use mpo_core::MpoError;
use rayon::prelude::*;

use crate::bridge::{core_rewards, from_core, placed_rewards};
use crate::decode::{read_row_scores, ListOffsets, Rollouts};
use crate::error::DataError;
use crate::estimator::Estimator;
use crate::groups::GroupStats;
use crate::relocate;
use crate::schema::{Columns, ListKind, RewardColumn, OUTPUT_COLUMNS};

// Re-exported where the crate has always named it.
pub use crate::observation::check_observation_rewards;

/// Counts of what one batch held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    pub rows: u64,
    pub tokens: u64,
    pub policy_tokens: u64,
    pub turns: u64,
}

impl std::ops::AddAssign for BatchCounts {
    fn add_assign(&mut self, o: Self) {
        self.rows += o.rows;
        self.tokens += o.tokens;
        self.policy_tokens += o.policy_tokens;
        self.turns += o.turns;
    }
}

/// The four output columns of a batch, in [`OUTPUT_COLUMNS`] order.
#[derive(Debug, Clone)]
pub struct Annotation {
    pub columns: [ArrayRef; 4],
    pub counts: BatchCounts,
}

/// The output fields for outputs of the given list width.
pub fn output_fields(kind: ListKind) -> [Field; 4] {
    let list = |item: DataType| {
        let item = Arc::new(Field::new("item", item, false));
        match kind {
            ListKind::Small => DataType::List(item),
            ListKind::Large => DataType::LargeList(item),
        }
    };
    [
        Field::new(OUTPUT_COLUMNS[0], list(DataType::Float32), false),
        Field::new(OUTPUT_COLUMNS[1], list(DataType::Float32), false),
        Field::new(OUTPUT_COLUMNS[2], list(DataType::Int32), false),
        Field::new(OUTPUT_COLUMNS[3], list(DataType::Float32), false),
    ]
}

/// The input schema with the output fields appended (metadata kept).
pub fn output_schema(input: &Schema, columns: &Columns) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = input.fields().iter().cloned().collect();
    fields.extend(output_fields(columns.list_kind(input)).into_iter().map(Arc::new));
    Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()))
}

/// `batch` with the annotation's columns appended, under `schema` (from [`output_schema`]).
pub fn append(batch: &RecordBatch, annotation: Annotation, schema: SchemaRef) -> Result<RecordBatch, DataError> {
    let mut cols = batch.columns().to_vec();
    cols.extend(annotation.columns);
    RecordBatch::try_new(schema, cols)
        .map_err(|e| DataError::Capacity(format!("cannot assemble the output batch: {e}")))
}

/// Computes the output columns of `batch`. `groups` must hold finished statistics for the
/// group estimators (see [`GroupStats`]) and is ignored by the others.
pub fn annotate(
    batch: &RecordBatch,
    columns: &Columns,
    estimator: &Estimator,
    groups: Option<&GroupStats>,
) -> Result<Annotation, DataError> {
    // Only the estimators see moved rewards; the input columns are written out as given.
    let r = relocate::apply(Rollouts::read(batch, columns)?, columns)?;
    let core_err = |e: MpoError| from_core(e, columns);
    let placed = placed_rewards(&r, columns)?;
    let rewards = core_rewards(&r, &placed);
    let (advantages, returns, turns, turn_advantages) = match estimator {
        Estimator::Group(params) => {
            // The group baselines come from the statistics of the whole log (groups may span
            // batches and files), not from this batch alone as `mpo_core::estimate` takes them.
            let (Some(stats), Some(group_col)) = (groups, columns.group.as_deref()) else {
                return Err(DataError::Capacity("group estimators need the statistics pass first".into()));
            };
            let scores = relocate::group_scores(batch, columns, &r)?;
            let per_row = stats.advantages_for(params, group_col, batch, &scores)?;
            let adv = mpo_core::broadcast_to_tokens(&per_row, &r.mask, &r.offsets).map_err(core_err)?;
            let turns = mpo_core::segment_turns(&r.mask, &r.offsets).map_err(core_err)?;
            let turn_adv =
                (0..r.n_rows()).flat_map(|j| std::iter::repeat_n(per_row[j], turns.of_trajectory(j).len())).collect();
            (adv.clone(), adv, turns, turn_adv)
        }
        Estimator::Gigpo(params) => {
            // GiGPO's baselines too come from the statistics of the whole log.
            let Some(stats) = groups else {
                return Err(DataError::Capacity("gigpo needs the statistics pass first".into()));
            };
            let out = crate::gigpo::advantages(stats, params, batch, columns, &r, rewards)?;
            (out.advantages.clone(), out.advantages, out.turns, out.turn_advantages)
        }
        critic => {
            let input = mpo_core::Batch {
                tokens: mpo_core::Tokens::Flat { mask: &r.mask, offsets: &r.offsets },
                rewards,
                values: r.values.as_deref(),
                truncated: r.truncated.as_deref(),
                groups: None,
                anchors: Default::default(),
            };
            let out = mpo_core::estimate(critic, &input).map_err(core_err)?;
            let turns = match out.turns {
                Some(turns) => turns,
                None => mpo_core::segment_turns(&r.mask, &r.offsets).map_err(core_err)?,
            };
            // GAE defines no turn advantage: the log shows each turn's mean.
            let turn_adv = out.turn_advantages.unwrap_or_else(|| turn_means(&out.advantages, &turns));
            (out.advantages, out.returns.unwrap_or_default(), turns, turn_adv)
        }
    };
    let counts = BatchCounts {
        rows: r.n_rows() as u64,
        tokens: r.n_tokens() as u64,
        policy_tokens: turns.starts.iter().zip(&turns.ends).map(|(s, e)| (e - s) as u64).sum(),
        turns: turns.n_turns() as u64,
    };
    let turn_offsets = list_offsets_like(&r.list_offsets, turns.traj_offsets.clone())?;
    let turn_index = local_turn_index(turns.token_turn, &turns.traj_offsets, &r.offsets);
    Ok(Annotation {
        columns: [
            list_of::<Float32Type>(&r.list_offsets, advantages)?,
            list_of::<Float32Type>(&r.list_offsets, returns)?,
            list_of::<Int32Type>(&r.list_offsets, turn_index)?,
            list_of::<Float32Type>(&turn_offsets, turn_advantages)?,
        ],
        counts,
    })
}

/// The group statistics of `batches` alone (one partial of a distributed run, see
/// [`GroupStats::of_batches`]), the rows read and checked as [`annotate`] reads them.
/// `columns.group` must be set; with a score column the mask is not read.
pub fn partial_group_statistics(batches: &[RecordBatch], columns: &Columns) -> Result<GroupStats, DataError> {
    let group_col = columns.group.as_deref().unwrap_or_default();
    let mut scores = Vec::with_capacity(batches.len());
    let mut base = 0u64;
    for batch in batches {
        let shifted = |e: DataError| e.shift_rows(base);
        scores.push(match &columns.reward {
            RewardColumn::Score(_) => read_row_scores(batch, &columns.reward).map_err(shifted)?,
            RewardColumn::Token(_) | RewardColumn::Turn(_) => {
                let r = relocate::apply(Rollouts::read(batch, columns).map_err(shifted)?, columns).map_err(shifted)?;
                relocate::group_scores(batch, columns, &r).map_err(shifted)?
            }
        });
        base += batch.num_rows() as u64;
    }
    let inputs: Vec<(&RecordBatch, &[f32])> = batches.iter().zip(&scores).map(|(b, s)| (b, &**s)).collect();
    GroupStats::of_batches(group_col, &inputs)
}

/// Mean token advantage of each turn.
fn turn_means(advantages: &[f32], turns: &mpo_core::Turns) -> Vec<f32> {
    turns
        .starts
        .par_iter()
        .zip(&turns.ends)
        .map(|(&s, &e)| {
            let sum: f64 = advantages[s as usize..e as usize].iter().map(|&a| a as f64).sum();
            (sum / (e - s).max(1) as f64) as f32
        })
        .collect()
}

/// Global turn indices (as the core numbers them over the batch) made local to each row.
fn local_turn_index(mut token_turn: Vec<i32>, traj_offsets: &[i64], offsets: &[i64]) -> Vec<i32> {
    let mut rows = Vec::with_capacity(offsets.len().saturating_sub(1));
    let mut rest = token_turn.as_mut_slice();
    for w in offsets.windows(2) {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut((w[1] - w[0]) as usize);
        rows.push(head);
        rest = tail;
    }
    rows.into_par_iter().with_min_len(64).enumerate().for_each(|(j, row)| {
        let first = traj_offsets[j] as i32;
        for t in row.iter_mut() {
            if *t >= 0 {
                *t -= first;
            }
        }
    });
    token_turn
}

/// `offsets` (from 0) in the same list width as `like`.
fn list_offsets_like(like: &ListOffsets, offsets: Vec<i64>) -> Result<ListOffsets, DataError> {
    Ok(match like {
        ListOffsets::Large(_) => ListOffsets::Large(OffsetBuffer::new(ScalarBuffer::from(offsets))),
        ListOffsets::Small(_) => {
            let last = offsets.last().copied().unwrap_or(0);
            if last > i32::MAX as i64 {
                return Err(DataError::Capacity(format!(
                    "a batch of {last} turns does not fit a list column's 32-bit offsets; use large_list columns or smaller row groups"
                )));
            }
            ListOffsets::Small(OffsetBuffer::new(ScalarBuffer::from(
                offsets.into_iter().map(|o| o as i32).collect::<Vec<i32>>(),
            )))
        }
    })
}

fn list_of<T: ArrowPrimitiveType>(offsets: &ListOffsets, values: Vec<T::Native>) -> Result<ArrayRef, DataError> {
    let child = Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), None));
    let item = Arc::new(Field::new("item", T::DATA_TYPE, false));
    let built: Result<ArrayRef, _> = match offsets {
        ListOffsets::Small(o) => ListArray::try_new(item, o.clone(), child, None).map(|a| Arc::new(a) as ArrayRef),
        ListOffsets::Large(o) => LargeListArray::try_new(item, o.clone(), child, None).map(|a| Arc::new(a) as ArrayRef),
    };
    built.map_err(|e| DataError::Capacity(format!("cannot build an output list: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LogError;
    use crate::estimator::{EstimatorColumns, OptionValue};
    use crate::observation::ObservationRewards;
    use crate::schema::ColumnSpec;
    use arrow::array::{AsArray, BooleanBuilder, Int64Array, ListBuilder};
    use mpo_core::Rewards;

    fn bool_list(rows: &[Vec<u8>]) -> ArrayRef {
        let mut b = ListBuilder::new(BooleanBuilder::new());
        for r in rows {
            for &x in r {
                b.values().append_value(x != 0);
            }
            b.append(true);
        }
        Arc::new(b.finish())
    }

    fn f32_list(rows: &[Vec<f32>]) -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
            rows.iter().map(|r| Some(r.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        ))
    }

    fn sample() -> (RecordBatch, Vec<u8>, Vec<f32>, Vec<f32>, Vec<i64>) {
        let masks = vec![vec![0, 1, 1, 0, 0, 1], vec![1, 1], vec![0, 0], vec![]];
        let values: Vec<Vec<f32>> = masks.iter().map(|m| (0..m.len()).map(|i| 0.1 * i as f32).collect()).collect();
        let mut rewards: Vec<Vec<f32>> = masks.iter().map(|m| vec![0.0; m.len()]).collect();
        rewards[0][5] = 1.0;
        rewards[1][1] = -0.5;
        let batch = RecordBatch::try_from_iter([
            ("prompt", Arc::new(Int64Array::from(vec![10, 11, 12, 13])) as ArrayRef),
            ("loss_mask", bool_list(&masks)),
            ("values", f32_list(&values)),
            ("rewards", f32_list(&rewards)),
            ("group_id", Arc::new(Int64Array::from(vec![0, 0, 1, 1])) as ArrayRef),
        ])
        .unwrap();
        let offsets = vec![0, 6, 8, 10, 10];
        (batch, masks.concat(), values.concat(), rewards.concat(), offsets)
    }

    #[test]
    fn mae_columns_match_the_core_and_turns_are_per_row() {
        let (batch, mask, values, rewards, offsets) = sample();
        let est = Estimator::from_options("mae", &[]).unwrap();
        let cols = ColumnSpec::default().resolve(batch.schema_ref(), est.needs()).unwrap();
        let a = annotate(&batch, &cols, &est, None).unwrap();
        let Estimator::Mae(p) = est else { unreachable!() };
        let want = mpo_core::mae_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p).unwrap();
        let flat = |c: &ArrayRef| c.as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec();
        assert_eq!(flat(&a.columns[0]), want.advantages);
        assert_eq!(flat(&a.columns[1]), want.returns);
        assert_eq!(flat(&a.columns[3]), want.turn_advantages);
        let ti = a.columns[2].as_list::<i32>().values().as_primitive::<Int32Type>().values().to_vec();
        assert_eq!(ti, vec![-1, 0, 0, -1, -1, 1, 0, 0, -1, -1]);
        assert_eq!(a.columns[3].as_list::<i32>().value_offsets(), &[0, 2, 3, 3, 3]);
        assert_eq!(a.counts, BatchCounts { rows: 4, tokens: 10, policy_tokens: 5, turns: 3 });

        let out = append(&batch, a, output_schema(batch.schema_ref(), &cols)).unwrap();
        assert_eq!(out.num_columns(), 9);
        assert_eq!(out.schema().field(5).name(), "advantages");
    }

    #[test]
    fn bilevel_columns_match_the_core() {
        let (batch, mask, values, rewards, offsets) = sample();
        let est = Estimator::from_options("bilevel", &[("lam", OptionValue::Float(0.9))]).unwrap();
        let cols = ColumnSpec::default().resolve(batch.schema_ref(), est.needs()).unwrap();
        let a = annotate(&batch, &cols, &est, None).unwrap();
        let Estimator::BiLevel(p) = est else { unreachable!() };
        let want = mpo_core::bilevel_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p).unwrap();
        let flat = |c: &ArrayRef| c.as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec();
        assert_eq!(flat(&a.columns[0]), want.advantages);
        assert_eq!(flat(&a.columns[1]), want.returns);
        assert_eq!(flat(&a.columns[3]), want.turn_advantages);
        assert_eq!(a.columns[3].as_list::<i32>().value_offsets(), &[0, 2, 3, 3, 3]);
    }

    #[test]
    fn gae_turn_advantages_are_turn_means() {
        let (batch, ..) = sample();
        let est = Estimator::from_options("gae", &[]).unwrap();
        let cols = ColumnSpec::default().resolve(batch.schema_ref(), est.needs()).unwrap();
        let a = annotate(&batch, &cols, &est, None).unwrap();
        let adv = a.columns[0].as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec();
        let turn = a.columns[3].as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec();
        assert!((turn[0] - (adv[1] + adv[2]) / 2.0).abs() < 1e-6);
        assert_eq!(turn[1], adv[5]);
    }

    #[test]
    fn group_estimators_broadcast_the_row_advantage() {
        let (batch, ..) = sample();
        let est = Estimator::from_options("drgrpo", &[]).unwrap();
        let cols = ColumnSpec::default().resolve(batch.schema_ref(), est.needs()).unwrap();
        let Estimator::Group(p) = est else { unreachable!() };
        let mut stats = GroupStats::new(p);
        let scores = read_row_scores(&batch, &cols.reward).unwrap();
        assert_eq!(&*scores, &[1.0, -0.5, 0.0, 0.0]);
        while stats.wants_scan() {
            stats.scan("group_id", &batch, &scores).unwrap();
            stats.finish_scan().unwrap();
        }
        let a = annotate(&batch, &cols, &est, Some(&stats)).unwrap();
        let adv = a.columns[0].as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec();
        assert_eq!(adv, vec![0.0, 0.75, 0.75, 0.0, 0.0, 0.75, -0.75, -0.75, 0.0, 0.0]);
        let turn = a.columns[3].as_list::<i32>().values().as_primitive::<Float32Type>();
        assert_eq!(turn.values().to_vec(), vec![0.75, 0.75, -0.75]);
        assert_eq!(a.columns[1].as_list::<i32>().values().as_primitive::<Float32Type>().values().to_vec(), adv);
    }

    /// A padded row [1,1,1,0] with its score in the padding column, a row whose reward sits
    /// on a leading observation (no policy token before it) and a clean row.
    fn padded(rewards: [[f32; 4]; 3]) -> RecordBatch {
        let masks = vec![vec![1, 1, 1, 0], vec![0, 1, 1, 0], vec![1, 1, 0, 1]];
        let values: Vec<Vec<f32>> = (0..3).map(|j| (0..4).map(|i| 0.1 * (i + j) as f32).collect()).collect();
        RecordBatch::try_from_iter([
            ("loss_mask", bool_list(&masks)),
            ("values", f32_list(&values)),
            ("rewards", f32_list(&rewards.map(|r| r.to_vec()))),
            ("group_id", Arc::new(Int64Array::from(vec![0, 0, 0])) as ArrayRef),
        ])
        .unwrap()
    }

    fn table(batch: &RecordBatch, name: &str, mode: ObservationRewards) -> Result<Vec<ArrayRef>, LogError> {
        let est = Estimator::from_options(name, &[]).unwrap();
        let spec = ColumnSpec { observation_rewards: mode, ..Default::default() };
        let cols = spec.resolve(batch.schema_ref(), est.needs()).unwrap();
        let (out, _) = crate::annotate_table(std::slice::from_ref(batch), batch.schema_ref(), &cols, &est)?;
        Ok(out[0].columns().to_vec())
    }

    #[test]
    fn observation_rewards_are_refused_with_the_hint_or_moved_as_by_hand() {
        let given = padded([[0.0, 0.0, 0.0, 1.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0]]);
        let credited = padded([[0.0, 0.0, 1.0, 0.0], [0.0; 4], [0.0, 0.5, 0.0, 0.0]]);
        let dropped = padded([[0.0; 4], [0.0; 4], [0.0, 0.5, 0.0, 0.0]]);
        for name in ["mae", "gae", "grpo", "drgrpo", "rloo"] {
            let e = table(&given, name, ObservationRewards::Error).unwrap_err().to_string();
            assert!(e.starts_with("row 0, column `rewards`: reward 1 at observation token 3;"), "{name}: {e}");
            assert!(e.contains("observation_rewards=\"credit\", `--observation-rewards credit`"), "{e}");
            for (mode, by_hand) in [(ObservationRewards::Credit, &credited), (ObservationRewards::Drop, &dropped)] {
                let want = table(by_hand, name, ObservationRewards::Error).unwrap();
                assert_eq!(table(&given, name, mode).unwrap(), want, "{name} {mode:?}");
                assert_eq!(table(by_hand, name, mode).unwrap(), want, "{name} {mode:?} on clean rows");
            }
        }
    }

    #[test]
    fn core_errors_name_row_and_column() {
        let (batch, ..) = sample();
        let mut vals: Vec<Vec<f32>> = vec![vec![0.0; 6], vec![0.0, f32::NAN], vec![0.0; 2], vec![]];
        vals[0][1] = 0.5;
        let idx = batch.schema().index_of("values").unwrap();
        let mut cols = batch.columns().to_vec();
        cols[idx] = f32_list(&vals);
        let batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
        let est = Estimator::from_options("mae", &[]).unwrap();
        let c = ColumnSpec::default().resolve(batch.schema_ref(), est.needs()).unwrap();
        let e = annotate(&batch, &c, &est, None).unwrap_err();
        assert_eq!(e.to_string(), "row 1, column `values`: NaN is not finite at token 1");
    }
}
