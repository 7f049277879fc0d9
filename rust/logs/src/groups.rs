//! Group baselines (GRPO, Dr. GRPO, RLOO) over groups scattered across batches, row
//! groups and files.
//!
//! Statistics are gathered in row order in up to two scans of the score and group columns
//! — sums and counts, then squared deviations from the now-known means (GRPO only) — and
//! the advantages follow mpo-core's formulas. Because the sums run in the same order as
//! `mpo_core::group_advantages` over the concatenated rows, the results are bitwise equal
//! to it. Memory is one entry per distinct group, not per row.
//!
//! For a log spread over workers (the Ray adapter), each worker reduces its rows to
//! partial statistics ([`GroupStats::of_batches`]), shipped as Arrow tables
//! ([`GroupStats::to_table`]), and [`GroupStats::merge`] combines them with the
//! parallel-variance formula; those agree with one machine up to float64 rounding.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, LargeStringArray, RecordBatch, UInt64Array};
use arrow::compute::cast;
use arrow::datatypes::{self as dt, DataType, Field, Schema};
use mpo_core::{group_advantage, GroupMoments, GroupParams};

use crate::error::DataError;
use crate::group_ids::{for_each_key, Key};
pub use crate::group_ids::{IdKind, IdKinds};
use crate::phase::Phase;
use crate::schema::column;
use crate::steps::StepStats;

/// Per-group count, sum and squared deviation, keyed by group id.
#[derive(Debug)]
pub struct GroupStats {
    params: GroupParams,
    ints: HashMap<i128, usize>,
    /// Non-integral float ids, by the bits of their f64 value.
    floats: HashMap<u64, usize>,
    strings: HashMap<Box<str>, usize>,
    count: Vec<u64>,
    sum: Vec<f64>,
    mean: Vec<f64>,
    sq_dev: Vec<f64>,
    phase: Phase,
    /// `sq_dev` is known (GRPO's std can be computed).
    deviations: bool,
    /// The kinds of group column seen and where: the log's one id type.
    kinds: IdKinds,
    /// The name of the input being scanned (a file, a statistics table), for errors.
    source: String,
    /// The group column's name, for errors.
    group_column: String,
    /// GiGPO's step groups (same group, same anchor state), gathered in the same scans.
    pub(crate) steps: Option<Box<StepStats>>,
}

/// The columns of a statistics table ([`GroupStats::to_table`]).
pub const STATISTICS_COLUMNS: [&str; 5] = ["group", "count", "sum", "mean", "m2"];

impl GroupStats {
    pub fn new(params: GroupParams) -> Self {
        Self {
            params,
            ints: HashMap::new(),
            floats: HashMap::new(),
            strings: HashMap::new(),
            count: Vec::new(),
            sum: Vec::new(),
            mean: Vec::new(),
            sq_dev: Vec::new(),
            phase: Phase::Sums,
            deviations: false,
            kinds: IdKinds::default(),
            source: "the input".into(),
            group_column: STATISTICS_COLUMNS[0].into(),
            steps: None,
        }
    }

    /// Names the input the following scans read (a file), for the errors of the group-id
    /// rule across inputs.
    pub fn set_source(&mut self, source: impl Into<String>) {
        self.source = source.into();
    }

    /// Notes the group column's type of an input before it is scanned (e.g. from a file's
    /// schema), so that a log mixing kinds is refused before any row is read.
    pub fn note_column(&mut self, column: &str, ty: &DataType, source: &str) -> Result<(), DataError> {
        self.group_column = column.into();
        self.kinds.column(ty, source).map_err(|detail| DataError::GroupIds { column: column.into(), detail })
    }

    /// The statistics of `batches` alone (each with its row scores): count, sum, mean and
    /// the squared deviations from that mean, whatever the estimator. One partial of a
    /// distributed run; [`GroupStats::merge`] combines them.
    pub fn of_batches(group_col: &str, batches: &[(&RecordBatch, &[f32])]) -> Result<Self, DataError> {
        let mut stats = GroupStats::new(GroupParams { norm_std: true, leave_one_out: false, ..Default::default() });
        while stats.wants_scan() {
            let mut base = 0u64;
            for (batch, scores) in batches {
                stats.scan(group_col, batch, scores).map_err(|e| e.shift_rows(base))?;
                base += batch.num_rows() as u64;
            }
            stats.finish_scan()?;
        }
        Ok(stats)
    }

    /// Merges statistics tables (from [`GroupStats::to_table`], in the order given):
    /// n = Σ n_i, sum = Σ sum_i, mean = sum / n, and
    /// m2 = Σ (m2_i + n_i (sum_i / n_i − mean)²) (Chan et al.'s parallel variance).
    /// One table merged alone gives back its own statistics.
    /// `labels` name the tables in errors (default: "statistics table i").
    pub fn merge(params: GroupParams, tables: &[RecordBatch], labels: Option<&[String]>) -> Result<Self, DataError> {
        let mut out = GroupStats::new(params);
        let mut members = Vec::with_capacity(tables.len());
        for (i, table) in tables.iter().enumerate() {
            let (count, sum, m2) = (numbers_of(table, 1)?, numbers_of(table, 2)?, numbers_of(table, 4)?);
            let mut groups = Vec::with_capacity(table.num_rows());
            out.source = labels.and_then(|l| l.get(i)).cloned().unwrap_or_else(|| format!("statistics table {i}"));
            // An empty table (of an empty block) holds no ids, whatever its type.
            if table.num_rows() > 0 {
                let ty = column(table, STATISTICS_COLUMNS[0])?.data_type().clone();
                let source = out.source.clone();
                out.note_column(STATISTICS_COLUMNS[0], &ty, &source)?;
            }
            for_each_key(table, STATISTICS_COLUMNS[0], |row, key| {
                let n = count[row];
                let usable = n >= 1.0 && n.fract() == 0.0 && sum[row].is_finite() && m2[row] >= 0.0;
                if !usable {
                    return Err(DataError::Capacity(format!(
                        "row {row} of a group statistics table: count {n}, sum {}, m2 {} are not statistics",
                        sum[row], m2[row]
                    )));
                }
                let g = out.intern(STATISTICS_COLUMNS[0], key)?;
                out.count[g] += n as u64;
                out.sum[g] += sum[row];
                groups.push(g);
                Ok(())
            })?;
            members.push((groups, count, sum, m2));
        }
        out.mean = out.sum.iter().zip(&out.count).map(|(&s, &n)| s / n.max(1) as f64).collect();
        for (groups, count, sum, m2) in &members {
            for (row, &g) in groups.iter().enumerate() {
                let d = sum[row] / count[row] - out.mean[g];
                out.sq_dev[g] += m2[row] + count[row] * (d * d);
            }
        }
        out.phase = Phase::Ready;
        out.deviations = true;
        out.check_ids()?;
        Ok(out)
    }

    /// The statistics as a table, one row per group sorted by id: `group` (int64, uint64,
    /// float64 or large_string: the one type of the ids, see [`IdKinds`]), `count` int64, `sum`, `mean`, `m2` float64 (fields
    /// nullable, as pyarrow builds them; no value is null).
    pub fn to_table(&self) -> Result<RecordBatch, DataError> {
        let mut order: Vec<usize> = (0..self.count.len()).collect();
        self.check_ids()?;
        let group: ArrayRef = match self.kinds.data_type() {
            DataType::LargeUtf8 => {
                let mut keys = vec![""; self.count.len()];
                for (k, &g) in &self.strings {
                    keys[g] = k;
                }
                order.sort_by_key(|&g| keys[g]);
                Arc::new(LargeStringArray::from_iter_values(order.iter().map(|&g| keys[g])))
            }
            DataType::Float64 => {
                // Every integral id is exact in f64 (the rule, checked above).
                let mut keys = vec![0f64; self.count.len()];
                for (&k, &g) in &self.ints {
                    keys[g] = k as f64;
                }
                for (&bits, &g) in &self.floats {
                    keys[g] = f64::from_bits(bits);
                }
                order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
                Arc::new(Float64Array::from_iter_values(order.iter().map(|&g| keys[g])))
            }
            DataType::UInt64 => {
                let mut keys = vec![0u64; self.count.len()];
                for (&k, &g) in &self.ints {
                    keys[g] = u64::try_from(k).map_err(|_| capacity(k, "uint64"))?;
                }
                order.sort_by_key(|&g| keys[g]);
                Arc::new(UInt64Array::from_iter_values(order.iter().map(|&g| keys[g])))
            }
            _ => {
                let mut keys = vec![0i64; self.count.len()];
                for (&k, &g) in &self.ints {
                    keys[g] = i64::try_from(k).map_err(|_| capacity(k, "int64"))?;
                }
                order.sort_by_key(|&g| keys[g]);
                Arc::new(Int64Array::from_iter_values(order.iter().map(|&g| keys[g])))
            }
        };
        let floats = |v: &[f64]| -> ArrayRef { Arc::new(Float64Array::from_iter_values(order.iter().map(|&g| v[g]))) };
        let schema = Schema::new(vec![
            Field::new(STATISTICS_COLUMNS[0], group.data_type().clone(), true),
            Field::new(STATISTICS_COLUMNS[1], DataType::Int64, true),
            Field::new(STATISTICS_COLUMNS[2], DataType::Float64, true),
            Field::new(STATISTICS_COLUMNS[3], DataType::Float64, true),
            Field::new(STATISTICS_COLUMNS[4], DataType::Float64, true),
        ]);
        let count: ArrayRef = Arc::new(Int64Array::from_iter_values(order.iter().map(|&g| self.count[g] as i64)));
        RecordBatch::try_new(
            Arc::new(schema),
            vec![group, count, floats(&self.sum), floats(&self.mean), floats(&self.sq_dev)],
        )
        .map_err(|e| DataError::Capacity(format!("cannot build the statistics table: {e}")))
    }

    /// True while another scan of the scores is needed: first the sums, then (for GRPO's
    /// std) the squared deviations.
    pub fn wants_scan(&self) -> bool {
        self.phase != Phase::Ready
    }

    /// Feeds one batch of the current scan, rows in file order.
    pub fn scan(&mut self, group_col: &str, batch: &RecordBatch, scores: &[f32]) -> Result<(), DataError> {
        self.scan_rows(group_col, batch, |row| scores[row] as f64).map(drop)
    }

    /// [`GroupStats::scan`] with a float64 score per row; returns each row's group index.
    pub(crate) fn scan_rows(
        &mut self,
        group_col: &str,
        batch: &RecordBatch,
        score: impl Fn(usize) -> f64,
    ) -> Result<Vec<usize>, DataError> {
        let mut groups = Vec::with_capacity(batch.num_rows());
        match self.phase {
            Phase::Sums => {
                if let Some(array) = batch.column_by_name(group_col).filter(|a| !a.is_empty()) {
                    let (ty, source) = (array.data_type().clone(), self.source.clone());
                    self.note_column(group_col, &ty, &source)?;
                }
                for_each_key(batch, group_col, |row, key| {
                    let g = self.intern(group_col, key)?;
                    self.count[g] += 1;
                    self.sum[g] += score(row);
                    groups.push(g);
                    Ok(())
                })?;
            }
            Phase::Deviations => for_each_key(batch, group_col, |row, key| {
                let g = self.find(key).ok_or_else(|| DataError::unknown_group(group_col, row))?;
                let d = score(row) - self.mean[g];
                self.sq_dev[g] += d * d;
                groups.push(g);
                Ok(())
            })?,
            Phase::Ready => {}
        }
        Ok(groups)
    }

    /// The scan [`GroupStats::wants_scan`] is in.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// The group index of each row of `batch` (finished statistics).
    pub(crate) fn rows(&self, group_col: &str, batch: &RecordBatch) -> Result<Vec<usize>, DataError> {
        let mut groups = Vec::with_capacity(batch.num_rows());
        for_each_key(batch, group_col, |row, key| {
            groups.push(self.find(key).ok_or_else(|| DataError::unknown_group(group_col, row))?);
            Ok(())
        })?;
        Ok(groups)
    }

    /// Group `g`'s count, sum, mean and squared deviations.
    pub(crate) fn moments(&self, g: usize) -> GroupMoments {
        GroupMoments { count: self.count[g], sum: self.sum[g], mean: self.mean[g], sq_dev: self.sq_dev[g] }
    }

    /// The group-id rule over every input seen (after the last one).
    fn check_ids(&self) -> Result<(), DataError> {
        self.kinds.check(true).map_err(|detail| DataError::GroupIds { column: self.group_column.clone(), detail })
    }

    /// Ends the current scan; after the first, checks the group-id rule over all inputs.
    pub fn finish_scan(&mut self) -> Result<(), DataError> {
        if self.phase == Phase::Sums {
            self.check_ids()?;
        }
        if let Some(steps) = &mut self.steps {
            steps.finish_scan(self.phase);
        }
        self.phase = match self.phase {
            Phase::Sums => {
                self.mean = self.sum.iter().zip(&self.count).map(|(&s, &n)| s / n.max(1) as f64).collect();
                if self.params.norm_std && !self.params.leave_one_out {
                    Phase::Deviations
                } else {
                    Phase::Ready
                }
            }
            Phase::Deviations => {
                self.deviations = true;
                Phase::Ready
            }
            Phase::Ready => Phase::Ready,
        };
        Ok(())
    }

    pub fn n_groups(&self) -> usize {
        self.count.len()
    }

    /// The advantage of each row of `batch` (mpo-core's group-baseline formulas).
    pub fn advantages(&self, group_col: &str, batch: &RecordBatch, scores: &[f32]) -> Result<Vec<f32>, DataError> {
        self.advantages_for(&self.params, group_col, batch, scores)
    }

    /// [`GroupStats::advantages`] by the formula of `params` (statistics from
    /// [`GroupStats::merge`] serve every group estimator).
    pub fn advantages_for(
        &self,
        params: &GroupParams,
        group_col: &str,
        batch: &RecordBatch,
        scores: &[f32],
    ) -> Result<Vec<f32>, DataError> {
        if self.phase != Phase::Ready || (params.norm_std && !params.leave_one_out && !self.deviations) {
            return Err(DataError::Capacity("the group statistics are not finished for this estimator".into()));
        }
        let mut out = vec![0f32; batch.num_rows()];
        for_each_key(batch, group_col, |row, key| {
            let g = self.find(key).ok_or_else(|| DataError::unknown_group(group_col, row))?;
            out[row] = self.advantage(params, g, scores[row]);
            // Finite scores near ±3.4e38 can overflow float32 (RLOO, Dr. GRPO).
            if !out[row].is_finite() {
                return Err(DataError::NonFiniteRow { column: "advantages".into(), row: row as u64, value: out[row] });
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn advantage(&self, params: &GroupParams, g: usize, score: f32) -> f32 {
        group_advantage(params, score, &self.moments(g))
    }

    fn find(&self, key: Key<'_>) -> Option<usize> {
        match key {
            Key::Int(i) => self.ints.get(&i).copied(),
            Key::Float(bits) => self.floats.get(&bits).copied(),
            Key::Str(s) => self.strings.get(s).copied(),
        }
    }

    /// The index of `key`, added if new (checked against the group-id rule).
    fn intern(&mut self, column: &str, key: Key<'_>) -> Result<usize, DataError> {
        if let Some(g) = self.find(key) {
            return Ok(g);
        }
        if let Key::Int(k) = key {
            self.kinds.int(k, &self.source).map_err(|detail| DataError::GroupIds { column: column.into(), detail })?;
        }
        let g = self.count.len();
        match key {
            Key::Int(i) => self.ints.insert(i, g),
            Key::Float(bits) => self.floats.insert(bits, g),
            Key::Str(s) => self.strings.insert(s.into(), g),
        };
        self.count.push(0);
        self.sum.push(0.0);
        self.sq_dev.push(0.0);
        Ok(g)
    }
}

/// Column `index` of a statistics table as f64 (count is int64, the others float64).
fn numbers_of(table: &RecordBatch, index: usize) -> Result<Vec<f64>, DataError> {
    let name = STATISTICS_COLUMNS[index];
    let array = column(table, name)?;
    if array.null_count() > 0 {
        let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or_default();
        return Err(DataError::NullValue { column: name.into(), row: row as u64 });
    }
    let as_f64 = cast(array, &DataType::Float64).ok().filter(|_| array.data_type().is_numeric());
    let Some(values) = as_f64 else {
        return Err(DataError::ColumnType {
            column: name.into(),
            found: array.data_type().to_string(),
            expected: "a number (a group statistics table)",
        });
    };
    Ok(values.as_primitive::<dt::Float64Type>().values().to_vec())
}

fn capacity(k: i128, ty: &str) -> DataError {
    DataError::Capacity(format!("group id {k} does not fit in {ty}"))
}

#[cfg(test)]
mod tests;
