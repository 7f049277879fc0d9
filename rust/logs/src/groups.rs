//! Group baselines (GRPO, Dr. GRPO, RLOO) over groups scattered across batches, row
//! groups and files.
//!
//! Statistics are gathered in row order in up to two scans of the score and group columns
//! — sums and counts, then squared deviations from the now-known means (GRPO only) — and
//! the advantages follow mpo-core's formulas. Because the sums run in the same order as
//! `mpo_core::group_advantages` over the concatenated rows, the results are bitwise equal
//! to it. Memory is one entry per distinct group, not per row.

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{self as dt, DataType};
use mpo_core::GroupParams;

use crate::error::DataError;
use crate::schema::column;

const EXPECTED: &str = "integer, float or string (or a dictionary of them)";

pub(crate) fn check_group_type(name: &str, ty: &DataType) -> Result<(), DataError> {
    let ok = |t: &DataType| {
        t.is_integer() || t.is_floating() || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    };
    let usable = match ty {
        DataType::Dictionary(_, v) => ok(v),
        t => ok(t),
    };
    if usable {
        Ok(())
    } else {
        Err(DataError::ColumnType { column: name.into(), found: ty.to_string(), expected: EXPECTED })
    }
}

/// Which scan of the statistics a [`GroupStats`] is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Sums,
    Deviations,
    Ready,
}

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
}

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
        }
    }

    /// True while another scan of the scores is needed: first the sums, then (for GRPO's
    /// std) the squared deviations.
    pub fn wants_scan(&self) -> bool {
        self.phase != Phase::Ready
    }

    /// Feeds one batch of the current scan, rows in file order.
    pub fn scan(&mut self, group_col: &str, batch: &RecordBatch, scores: &[f32]) -> Result<(), DataError> {
        match self.phase {
            Phase::Sums => for_each_key(batch, group_col, |row, key| {
                let g = self.intern(key);
                self.count[g] += 1;
                self.sum[g] += scores[row] as f64;
                Ok(())
            }),
            Phase::Deviations => for_each_key(batch, group_col, |row, key| {
                let g = self.find(key).ok_or_else(|| unknown(group_col, row))?;
                let d = scores[row] as f64 - self.mean[g];
                self.sq_dev[g] += d * d;
                Ok(())
            }),
            Phase::Ready => Ok(()),
        }
    }

    /// Ends the current scan.
    pub fn finish_scan(&mut self) {
        self.phase = match self.phase {
            Phase::Sums => {
                self.mean = self.sum.iter().zip(&self.count).map(|(&s, &n)| s / n.max(1) as f64).collect();
                if self.params.norm_std && !self.params.leave_one_out {
                    Phase::Deviations
                } else {
                    Phase::Ready
                }
            }
            _ => Phase::Ready,
        };
    }

    pub fn n_groups(&self) -> usize {
        self.count.len()
    }

    /// The advantage of each row of `batch` (mpo-core's group-baseline formulas).
    pub fn advantages(&self, group_col: &str, batch: &RecordBatch, scores: &[f32]) -> Result<Vec<f32>, DataError> {
        debug_assert_eq!(self.phase, Phase::Ready, "advantages need finished statistics");
        let mut out = vec![0f32; batch.num_rows()];
        for_each_key(batch, group_col, |row, key| {
            let g = self.find(key).ok_or_else(|| unknown(group_col, row))?;
            out[row] = self.advantage(g, scores[row]);
            // Finite scores near ±3.4e38 can overflow float32 (RLOO, Dr. GRPO).
            if !out[row].is_finite() {
                return Err(DataError::NonFiniteRow { column: "advantages".into(), row: row as u64, value: out[row] });
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn advantage(&self, g: usize, score: f32) -> f32 {
        let n = self.count[g];
        if n < 2 {
            return 0.0;
        }
        let s = score as f64;
        let a = if self.params.leave_one_out {
            s - (self.sum[g] - s) / (n - 1) as f64
        } else if self.params.norm_std {
            (s - self.mean[g]) / ((self.sq_dev[g] / (n - 1) as f64).sqrt() + self.params.eps)
        } else {
            s - self.mean[g]
        };
        a as f32
    }

    fn find(&self, key: Key<'_>) -> Option<usize> {
        match key {
            Key::Int(i) => self.ints.get(&i).copied(),
            Key::Float(bits) => self.floats.get(&bits).copied(),
            Key::Str(s) => self.strings.get(s).copied(),
        }
    }

    fn intern(&mut self, key: Key<'_>) -> usize {
        if let Some(g) = self.find(key) {
            return g;
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
        g
    }
}

fn unknown(column: &str, row: usize) -> DataError {
    DataError::UnknownGroup { column: column.into(), row: row as u64 }
}

/// A group id as read. Numbers compare by value, as in `mpo_rs.group_advantages`:
/// integers of any width, and floats with an integral value, are `Int` (so 1 and 1.0 are
/// one group); other floats are `Float`. Strings are a kind of their own.
#[derive(Clone, Copy)]
enum Key<'a> {
    Int(i128),
    Float(u64),
    Str(&'a str),
}

impl Key<'_> {
    /// The key of a finite float id (`None` for NaN or ±inf: a missing id).
    fn of_float(v: f64) -> Option<Self> {
        if !v.is_finite() {
            return None;
        }
        // Every integral f64 below 2^127 in magnitude is exactly an i128; -0.0 becomes 0.
        if v.fract() == 0.0 && v.abs() < 2f64.powi(127) {
            Some(Key::Int(v as i128))
        } else {
            Some(Key::Float(v.to_bits()))
        }
    }
}

/// Calls `f(row, key)` for every row of the group column, refusing nulls.
fn for_each_key(
    batch: &RecordBatch,
    name: &str,
    mut f: impl FnMut(usize, Key<'_>) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let array = column(batch, name)?;
    check_group_type(name, array.data_type())?;
    // Dictionaries (e.g. polars categoricals) are expanded once per batch.
    let expanded: ArrayRef;
    let array = match array.data_type() {
        DataType::Dictionary(_, v) => {
            expanded = cast(array, v).map_err(|e| DataError::ColumnType {
                column: name.into(),
                found: format!("{} ({e})", array.data_type()),
                expected: EXPECTED,
            })?;
            &expanded
        }
        _ => array,
    };
    if let Some(nulls) = array.logical_nulls() {
        if let Some(row) = (0..array.len()).find(|&i| nulls.is_null(i)) {
            return Err(DataError::NullValue { column: name.into(), row: row as u64 });
        }
    }
    macro_rules! ints {
        ($($t:ty),*) => {$(
            if let Some(p) = array.as_primitive_opt::<$t>() {
                for (row, &v) in p.values().iter().enumerate() {
                    f(row, Key::Int(v as i128))?;
                }
                return Ok(());
            }
        )*};
    }
    ints!(
        dt::Int8Type,
        dt::Int16Type,
        dt::Int32Type,
        dt::Int64Type,
        dt::UInt8Type,
        dt::UInt16Type,
        dt::UInt32Type,
        dt::UInt64Type
    );
    // NaN and ±inf ids are missing, refused like nulls (the rule of the Python API).
    macro_rules! floats {
        ($($t:ty),*) => {$(
            if let Some(p) = array.as_primitive_opt::<$t>() {
                for (row, &v) in p.values().iter().enumerate() {
                    let v = f64::from(v);
                    let key = Key::of_float(v).ok_or_else(|| DataError::NonFiniteRow {
                        column: name.into(),
                        row: row as u64,
                        value: v as f32,
                    })?;
                    f(row, key)?;
                }
                return Ok(());
            }
        )*};
    }
    floats!(dt::Float16Type, dt::Float32Type, dt::Float64Type);
    if let Some(s) = array.as_string_opt::<i32>() {
        return s.iter().enumerate().try_for_each(|(row, v)| f(row, Key::Str(v.unwrap_or_default())));
    }
    if let Some(s) = array.as_string_opt::<i64>() {
        return s.iter().enumerate().try_for_each(|(row, v)| f(row, Key::Str(v.unwrap_or_default())));
    }
    if let Some(s) = array.as_string_view_opt() {
        return s.iter().enumerate().try_for_each(|(row, v)| f(row, Key::Str(v.unwrap_or_default())));
    }
    Err(DataError::ColumnType { column: name.into(), found: array.data_type().to_string(), expected: EXPECTED })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{DictionaryArray, Int64Array, StringArray};
    use std::sync::Arc;

    fn stats_over(params: GroupParams, batches: &[(RecordBatch, Vec<f32>)]) -> GroupStats {
        let mut stats = GroupStats::new(params);
        while stats.wants_scan() {
            for (b, s) in batches {
                stats.scan("g", b, s).unwrap();
            }
            stats.finish_scan();
        }
        stats
    }

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn split_batches_match_the_core_bitwise() {
        let mut seed = 7u64;
        let n = 500;
        let ids: Vec<i64> = (0..n).map(|_| (lcg(&mut seed) % 37) as i64).collect();
        let scores: Vec<f32> = (0..n).map(|_| (lcg(&mut seed) % 1000) as f32 / 7.0 + 1e4).collect();
        let (_, codes) = {
            let mut uniq: Vec<i64> = ids.clone();
            uniq.sort();
            uniq.dedup();
            let codes: Vec<i64> = ids.iter().map(|i| uniq.binary_search(i).unwrap() as i64).collect();
            (uniq, codes)
        };
        let n_groups = codes.iter().max().unwrap() + 1;
        let cuts = [0usize, 1, 130, 131, 400, n];
        let batches: Vec<(RecordBatch, Vec<f32>)> = cuts
            .windows(2)
            .map(|w| {
                let g: ArrayRef = Arc::new(Int64Array::from(ids[w[0]..w[1]].to_vec()));
                (RecordBatch::try_from_iter([("g", g)]).unwrap(), scores[w[0]..w[1]].to_vec())
            })
            .collect();
        for params in [
            GroupParams::default(),
            GroupParams { norm_std: false, ..Default::default() },
            GroupParams { leave_one_out: true, ..Default::default() },
        ] {
            let want = mpo_core::group_advantages(&scores, &codes, n_groups as usize, &params).unwrap();
            let stats = stats_over(params, &batches);
            let got: Vec<f32> = batches.iter().flat_map(|(b, s)| stats.advantages("g", b, s).unwrap()).collect();
            assert_eq!(got, want, "{params:?}");
        }
    }

    #[test]
    fn float_ids_by_value_and_nan_refused() {
        // The group-id rule of mpo_rs.group_advantages (issue 11 item 6): numbers by value,
        // so 1.0 in a float column (or file) is the group 1 of an integer one, -0.0 is 0,
        // 2.5 a group of its own; NaN and ±inf are missing ids, refused like nulls.
        let floats: ArrayRef = Arc::new(arrow::array::Float64Array::from(vec![1.0, 2.5, -0.0, 2.5]));
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![1, 0]));
        let batches = vec![
            (RecordBatch::try_from_iter([("g", floats)]).unwrap(), vec![1.0, 5.0, 3.0, 7.0]),
            (RecordBatch::try_from_iter([("g", ints)]).unwrap(), vec![3.0, 1.0]),
        ];
        let params = GroupParams { norm_std: false, ..Default::default() };
        let stats = stats_over(params, &batches);
        assert_eq!(stats.n_groups(), 3);
        // group 1 = {1, 3} (mean 2), group 2.5 = {5, 7} (mean 6), group 0 = {3, 1} (mean 2)
        assert_eq!(stats.advantages("g", &batches[0].0, &batches[0].1).unwrap(), vec![-1.0, -1.0, 1.0, 1.0]);
        assert_eq!(stats.advantages("g", &batches[1].0, &batches[1].1).unwrap(), vec![1.0, -1.0]);
        assert!(check_group_type("g", &DataType::Float32).is_ok());

        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let g: ArrayRef = Arc::new(arrow::array::Float32Array::from(vec![1.0, bad]));
            let b = RecordBatch::try_from_iter([("g", g)]).unwrap();
            let e = GroupStats::new(params).scan("g", &b, &[0.0, 0.0]).unwrap_err();
            assert!(matches!(&e, DataError::NonFiniteRow { row: 1, .. }), "{e}");
            assert!(e.to_string().starts_with("row 1, column `g`:"), "{e}");
        }
    }

    #[test]
    fn overflowing_advantages_are_an_error_naming_the_row() {
        // RLOO over finite scores of ±3e38: 3e38 − (−3e38) is beyond f32 (issue 11 item 7).
        let g: ArrayRef = Arc::new(Int64Array::from(vec![0, 0]));
        let batches = vec![(RecordBatch::try_from_iter([("g", g)]).unwrap(), vec![3e38, -3e38])];
        let stats = stats_over(GroupParams { leave_one_out: true, ..Default::default() }, &batches);
        let e = stats.advantages("g", &batches[0].0, &batches[0].1).unwrap_err();
        assert!(matches!(e, DataError::NonFiniteRow { row: 0, .. }), "{e}");
    }

    #[test]
    fn strings_dictionaries_and_nulls() {
        let plain: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "a"]));
        let dict: ArrayRef = Arc::new(
            DictionaryArray::<dt::Int32Type>::try_new(
                arrow::array::Int32Array::from(vec![1, 0]),
                Arc::new(StringArray::from(vec!["a", "b"])),
            )
            .unwrap(),
        );
        let batches = vec![
            (RecordBatch::try_from_iter([("g", plain)]).unwrap(), vec![1.0, 5.0, 3.0]),
            (RecordBatch::try_from_iter([("g", dict)]).unwrap(), vec![7.0, 2.0]),
        ];
        let params = GroupParams { norm_std: false, ..Default::default() };
        let stats = stats_over(params, &batches);
        assert_eq!(stats.n_groups(), 2);
        // group a = {1, 3, 2} (mean 2), group b = {5, 7} (mean 6)
        assert_eq!(stats.advantages("g", &batches[0].0, &batches[0].1).unwrap(), vec![-1.0, -1.0, 1.0]);
        assert_eq!(stats.advantages("g", &batches[1].0, &batches[1].1).unwrap(), vec![1.0, 0.0]);

        let with_null: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
        let b = RecordBatch::try_from_iter([("g", with_null)]).unwrap();
        let e = GroupStats::new(params).scan("g", &b, &[0.0, 0.0]).unwrap_err();
        assert_eq!(e, DataError::NullValue { column: "g".into(), row: 1 });
    }
}
