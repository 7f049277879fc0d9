//! Group ids: how a group column is read, row by row ([`for_each_key`]: numbers by value,
//! strings as they are, dictionaries expanded, missing ids refused), and the group-id rule
//! across the inputs of one log ([`IdKinds`]).

use arrow::array::{downcast_integer_array, Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{self as dt, DataType};

use crate::error::DataError;
use crate::schema::{check_group_type, column, GROUP_TYPES};

/// The kind of a group column (dictionaries by their values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Signed,
    Unsigned,
    Float,
    Str,
}

impl IdKind {
    pub fn of(ty: &DataType) -> Self {
        match ty {
            DataType::Dictionary(_, v) => Self::of(v),
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => IdKind::Unsigned,
            t if t.is_integer() => IdKind::Signed,
            t if t.is_floating() => IdKind::Float,
            _ => IdKind::Str,
        }
    }
}

/// The group-id rule across the files or blocks of one log (docs/estimators.md): the ids
/// of every input share one column type — the one Arrow unifies their types to (Ray reads
/// a log that way) — and each id is exact in it. Numbers of any width compare by value
/// (int + float: float64, signed + unsigned: int64); strings never share a log with
/// numbers (`1` and `"1"` are two groups, and no Arrow column holds both). So an int id
/// beyond ±2^53 cannot sit beside float ids, nor a uint64 id above int64's range beside
/// signed ids: refused, naming the inputs, rather than merged by a rounded value.
#[derive(Debug, Default)]
pub struct IdKinds {
    /// Where each kind of column was first seen (signed, unsigned, float, string).
    signed: Option<String>,
    unsigned: Option<String>,
    float: Option<String>,
    string: Option<String>,
    /// The first id (from an integer column) that float64 cannot hold exactly, and where.
    inexact: Option<(i128, String)>,
    /// The first id above int64's range, and where.
    above_i64: Option<(i128, String)>,
}

impl IdKinds {
    /// Notes a group column of type `ty` in the input `source`.
    pub fn column(&mut self, ty: &DataType, source: &str) -> Result<(), String> {
        let slot = match IdKind::of(ty) {
            IdKind::Signed => &mut self.signed,
            IdKind::Unsigned => &mut self.unsigned,
            IdKind::Float => &mut self.float,
            IdKind::Str => &mut self.string,
        };
        if slot.is_some() {
            return Ok(());
        }
        *slot = Some(source.to_string());
        self.check(false)
    }

    /// Notes a new integral id `k` (the first time it is seen) in `source`.
    pub(crate) fn int(&mut self, k: i128, source: &str) -> Result<(), String> {
        let mut changed = false;
        if self.inexact.is_none() && (k as f64) as i128 != k {
            self.inexact = Some((k, source.to_string()));
            changed = true;
        }
        if self.above_i64.is_none() && k > i64::MAX as i128 {
            self.above_i64 = Some((k, source.to_string()));
            changed = true;
        }
        if changed {
            self.check(false)
        } else {
            Ok(())
        }
    }

    /// The rule, over what has been seen so far. Strings beside numbers and an inexact int
    /// beside floats stay broken whatever comes next; an id beyond int64 beside signed ids
    /// is fine if float ids come later (float64 then holds them), so that part is checked
    /// only when every input is in (`all_in`).
    pub(crate) fn check(&self, all_in: bool) -> Result<(), String> {
        let number = self.float.as_ref().or(self.signed.as_ref()).or(self.unsigned.as_ref());
        if let (Some(strings), Some(numbers)) = (&self.string, number) {
            return Err(format!(
                "string group ids in {strings} but number ids in {numbers}: a log's group ids are all numbers or \
                 all strings (1 and \"1\" are two groups, and no one column type holds both); write them with one \
                 type in every file"
            ));
        }
        if let (Some(floats), Some((k, at))) = (&self.float, &self.inexact) {
            return Err(format!(
                "group id {k} in {at} has no exact float64, and {floats} holds float ids: integer ids share a log \
                 with float ids only within ±2^53 (they compare by value); write the ids with one type in every file"
            ));
        }
        if let (true, None, Some(signed), Some((k, at))) = (all_in, &self.float, &self.signed, &self.above_i64) {
            return Err(format!(
                "group id {k} in {at} is beyond int64, and {signed} holds signed integer ids: no one integer \
                 type holds both; write the ids with one type in every file"
            ));
        }
        Ok(())
    }

    /// The one column type of the ids seen (int64 when none were).
    pub(crate) fn data_type(&self) -> DataType {
        if self.string.is_some() {
            DataType::LargeUtf8
        } else if self.float.is_some() {
            DataType::Float64
        } else if self.unsigned.is_some() && self.signed.is_none() {
            DataType::UInt64
        } else {
            DataType::Int64
        }
    }
}

/// A group id as read. Numbers compare by value, as in `mpo_rs.group_advantages`:
/// integers of any width, and floats with an integral value, are `Int` (so 1 and 1.0 are
/// one group); other floats are `Float`. Strings are a kind of their own.
#[derive(Clone, Copy)]
pub(crate) enum Key<'a> {
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
pub(crate) fn for_each_key(
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
                expected: GROUP_TYPES,
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
    downcast_integer_array!(
        array => {
            for (row, &v) in array.values().iter().enumerate() {
                f(row, Key::Int(v as i128))?;
            }
            return Ok(());
        }
        _ => {}
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
    Err(DataError::ColumnType { column: name.into(), found: array.data_type().to_string(), expected: GROUP_TYPES })
}
