//! Decoding: a batch's token columns into the flat slices mpo-core works on.
//!
//! One row is one trajectory; its token columns are lists. The mask column's list offsets
//! are the trajectory offsets, rebased to start at 0 (a sliced batch's offsets do not).
//! Float32 tokens and uint8 masks are borrowed from the Arrow buffers; other numeric types
//! are converted, and bit-packed boolean masks are unpacked to one byte per token.

use std::borrow::Cow;

use arrow::array::{downcast_integer_array, Array, ArrayRef, AsArray, BooleanArray, OffsetSizeTrait, RecordBatch};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes as dt;

use crate::error::DataError;
use crate::schema::{check_number, column, AnchorColumn, Columns, RewardColumn};

/// List offsets for the output columns, rebased to start at 0, in the input's width.
#[derive(Debug, Clone)]
pub enum ListOffsets {
    Small(OffsetBuffer<i32>),
    Large(OffsetBuffer<i64>),
}

/// A batch's token columns as flat slices, ready for mpo-core.
#[derive(Debug)]
pub struct Rollouts<'a> {
    /// Trajectory offsets (rows + 1), starting at 0.
    pub offsets: Cow<'a, [i64]>,
    /// The same offsets in the mask column's list width, for building outputs.
    pub list_offsets: ListOffsets,
    pub mask: Cow<'a, [u8]>,
    pub values: Option<Cow<'a, [f32]>>,
    pub rewards: RewardData<'a>,
    /// One flag per row, when a truncated column is read.
    pub truncated: Option<Vec<bool>>,
    /// The scores the turn rewards must sum to, when a check column is named.
    pub check_scores: Option<Cow<'a, [f32]>>,
    /// GiGPO's anchor states (ids per turn or token ids), when the estimator reads them.
    pub anchors: Option<AnchorData<'a>>,
}

#[derive(Debug)]
pub enum RewardData<'a> {
    Token(Cow<'a, [f32]>),
    Score(Cow<'a, [f32]>),
    /// Per-turn rewards and their offsets per row (rebased to 0).
    Turn {
        rewards: Cow<'a, [f32]>,
        offsets: Vec<i64>,
    },
}

/// A batch's anchor states as read.
#[derive(Debug)]
pub enum AnchorData<'a> {
    /// One id per turn; `offsets` (rows + 1, from 0) delimit each row's.
    TurnStates { ids: Cow<'a, [i64]>, offsets: Vec<i64> },
    /// One token id per token, aligned with the mask.
    Tokens(Cow<'a, [i64]>),
}

impl AnchorData<'_> {
    /// The anchors as the core reads them.
    pub fn as_core(&self) -> mpo_core::Anchors<'_> {
        match self {
            AnchorData::TurnStates { ids, offsets } => mpo_core::Anchors {
                turn_state_ids: Some(mpo_core::TurnIds { ids, offsets: Some(offsets) }),
                token_ids: None,
            },
            AnchorData::Tokens(t) => mpo_core::Anchors { turn_state_ids: None, token_ids: Some(t) },
        }
    }
}

/// The anchor column of `columns` (None for every estimator but gigpo): token ids must
/// have the mask's length in every row; the count of ids per turn is checked by the core.
pub(crate) fn read_anchors<'a>(
    batch: &'a RecordBatch,
    columns: &Columns,
    mask: &ListCol<'a, '_>,
) -> Result<Option<AnchorData<'a>>, DataError> {
    Ok(match &columns.anchors {
        None => None,
        Some(AnchorColumn::TurnStates(name)) => {
            let col = ListCol::get(batch, name)?;
            Some(AnchorData::TurnStates { ids: col.ints()?, offsets: col.offsets.rebased().into_owned() })
        }
        Some(AnchorColumn::Tokens(name)) => {
            let col = ListCol::get(batch, name)?;
            col.same_lengths_as(mask)?;
            Some(AnchorData::Tokens(col.ints()?))
        }
    })
}

impl<'a> ListCol<'a, '_> {
    /// An integer list's elements as int64 values (borrowed when they are int64; narrower
    /// integers are widened). A uint64 beyond int64's range is refused, naming its row, as
    /// the numpy path refuses it: ids compare by value, and no int64 holds it (taking its
    /// bits would make 2^64 - 1 the id -1).
    fn ints(&self) -> Result<Cow<'a, [i64]>, DataError> {
        let span = self.offsets.span();
        let child = self.child;
        if let Some(p) = child.as_primitive_opt::<dt::Int64Type>() {
            return Ok(Cow::Borrowed(&p.values()[span]));
        }
        if let Some(p) = child.as_primitive_opt::<dt::UInt64Type>() {
            let values = &p.values()[span.clone()];
            if let Some(k) = values.iter().position(|&x| i64::try_from(x).is_err()) {
                let (row, index) = self.offsets.locate(span.start + k);
                return Err(DataError::IdOutOfRange { column: self.name.into(), row, index, value: values[k] });
            }
            return Ok(Cow::Owned(values.iter().map(|&x| x as i64).collect()));
        }
        if !child.data_type().is_integer() {
            return Err(DataError::ColumnType {
                column: self.name.into(),
                found: format!("list<{}>", child.data_type()),
                expected: "list<integer>",
            });
        }
        let wide = arrow::compute::cast(&child.slice(span.start, span.len()), &dt::DataType::Int64)
            .map_err(|e| DataError::Capacity(format!("cannot widen `{}` to int64: {e}", self.name)))?;
        Ok(Cow::Owned(wide.as_primitive::<dt::Int64Type>().values().to_vec()))
    }
}

impl<'a> Rollouts<'a> {
    /// Reads the columns of `batch`. Lists of every token column must have the mask's
    /// length in each row; nulls are refused wherever they are.
    pub fn read(batch: &'a RecordBatch, columns: &Columns) -> Result<Self, DataError> {
        let mask_col = ListCol::get(batch, &columns.mask)?;
        let mask = mask_col.mask()?;
        let values = match &columns.values {
            Some(name) => {
                let col = ListCol::get(batch, name)?;
                col.same_lengths_as(&mask_col)?;
                Some(col.numbers()?)
            }
            None => None,
        };
        let rewards = match &columns.reward {
            RewardColumn::Token(name) => {
                let col = ListCol::get(batch, name)?;
                col.same_lengths_as(&mask_col)?;
                RewardData::Token(col.numbers()?)
            }
            RewardColumn::Score(name) => RewardData::Score(read_numbers(batch, name)?),
            RewardColumn::Turn(name) => {
                let col = ListCol::get(batch, name)?;
                RewardData::Turn { rewards: col.turn_numbers()?, offsets: col.offsets.rebased().into_owned() }
            }
        };
        let truncated = columns.truncated.as_deref().map(|name| read_flags(batch, name)).transpose()?;
        let check_scores = columns.check.as_ref().map(|(name, _)| read_numbers(batch, name)).transpose()?;
        let anchors = read_anchors(batch, columns, &mask_col)?;
        Ok(Self {
            offsets: mask_col.offsets.rebased(),
            list_offsets: mask_col.offsets.rebased_buffer(),
            mask,
            values,
            rewards,
            truncated,
            check_scores,
            anchors,
        })
    }

    pub fn n_rows(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn n_tokens(&self) -> usize {
        self.mask.len()
    }
}

/// A bool column without nulls, one flag per row.
pub fn read_flags(batch: &RecordBatch, name: &str) -> Result<Vec<bool>, DataError> {
    let array = column(batch, name)?;
    let Some(flags) = array.as_boolean_opt() else {
        return Err(DataError::ColumnType {
            column: name.into(),
            found: array.data_type().to_string(),
            expected: "bool",
        });
    };
    if let Some(row) = first_null(flags.nulls(), 0..flags.len()) {
        return Err(DataError::NullValue { column: name.into(), row: row as u64 });
    }
    Ok(flags.values().iter().collect())
}

/// One score per row: the score column, or the sum of each row's token (or turn) rewards.
/// Reads only that column, so the group-statistics pass can project it alone.
pub fn read_row_scores<'a>(batch: &'a RecordBatch, reward: &RewardColumn) -> Result<Cow<'a, [f32]>, DataError> {
    match reward {
        RewardColumn::Score(name) => read_numbers(batch, name),
        RewardColumn::Token(name) | RewardColumn::Turn(name) => {
            let per_turn = matches!(reward, RewardColumn::Turn(_));
            let col = ListCol::get(batch, name)?;
            let rewards = col.numbers_per(per_turn)?;
            row_sums(&rewards, &col.offsets.rebased(), name, per_turn).map(Cow::Owned)
        }
    }
}

/// The sum of each row's rewards (`offsets` cut `rewards` into rows), in float64 and in
/// order, as float32: a non-finite reward (per turn or per token) or a sum beyond
/// float32's range is refused, naming `column` and the row.
pub(crate) fn row_sums(rewards: &[f32], offsets: &[i64], column: &str, per_turn: bool) -> Result<Vec<f32>, DataError> {
    let mut sums = Vec::with_capacity(offsets.len().saturating_sub(1));
    for (row, w) in offsets.windows(2).enumerate() {
        let row = row as u64;
        let mut sum = 0f64;
        for (k, &value) in rewards[w[0] as usize..w[1] as usize].iter().enumerate() {
            if !value.is_finite() {
                let (column, k) = (column.into(), k as u64);
                return Err(match per_turn {
                    true => DataError::NonFiniteTurn { column, row, turn: k, value },
                    false => DataError::NonFiniteToken { column, row, token: k, value },
                });
            }
            sum += value as f64;
        }
        if (sum as f32).is_infinite() {
            return Err(DataError::RewardSumOutOfRange { column: column.into(), row, value: sum });
        }
        sums.push(sum as f32);
    }
    Ok(sums)
}

/// A numeric (non-list) column as f32, one value per row; NaN/Inf refused.
pub fn read_numbers<'a>(batch: &'a RecordBatch, name: &str) -> Result<Cow<'a, [f32]>, DataError> {
    let array = column(batch, name)?;
    check_number(name, array.data_type())?;
    if let Some(row) = first_null(array.nulls(), 0..array.len()) {
        return Err(DataError::NullValue { column: name.into(), row: row as u64 });
    }
    let scores = to_f32(array, 0..array.len())
        .ok_or_else(|| DataError::ColumnType {
            column: name.into(),
            found: array.data_type().to_string(),
            expected: "float or integer",
        })?
        .map_err(|(row, value)| DataError::OutOfRangeRow { column: name.into(), row: row as u64, value })?;
    if let Some(row) = scores.iter().position(|s| !s.is_finite()) {
        return Err(DataError::NonFiniteRow { column: name.into(), row: row as u64, value: scores[row] });
    }
    Ok(scores)
}
/// The list offsets of a column as given (not rebased), in either width.
#[derive(Clone, Copy)]
pub(crate) enum RawOffsets<'a> {
    Small(&'a OffsetBuffer<i32>),
    Large(&'a OffsetBuffer<i64>),
}

impl RawOffsets<'_> {
    fn len(&self) -> usize {
        match self {
            RawOffsets::Small(o) => o.len(),
            RawOffsets::Large(o) => o.len(),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> i64 {
        match self {
            RawOffsets::Small(o) => o[i] as i64,
            RawOffsets::Large(o) => o[i],
        }
    }

    /// The child range the rows cover.
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        self.get(0) as usize..self.get(self.len() - 1) as usize
    }

    pub(crate) fn rebased(&self) -> Cow<'static, [i64]> {
        let base = self.get(0);
        Cow::Owned((0..self.len()).map(|i| self.get(i) - base).collect())
    }

    fn rebased_buffer(&self) -> ListOffsets {
        fn rebase<O: OffsetSizeTrait>(o: &OffsetBuffer<O>) -> OffsetBuffer<O> {
            let base = o[0];
            if base == O::usize_as(0) {
                o.clone() // shares the input's buffer
            } else {
                OffsetBuffer::new(ScalarBuffer::from(o.iter().map(|&x| x - base).collect::<Vec<O>>()))
            }
        }
        match self {
            RawOffsets::Small(o) => ListOffsets::Small(rebase(o)),
            RawOffsets::Large(o) => ListOffsets::Large(rebase(o)),
        }
    }

    /// (row, token within the row) of child element `k` (an index into the child array).
    pub(crate) fn locate(&self, k: usize) -> (u64, u64) {
        // The first row that ends after k; empty rows end where they start, so they are
        // skipped.
        let (mut lo, mut hi) = (0usize, self.len() - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid + 1) as usize <= k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo as u64, (k - self.get(lo) as usize) as u64)
    }
}

/// A list column of a batch: its name, offsets, list-level nulls and child values.
pub(crate) struct ListCol<'a, 'n> {
    pub(crate) name: &'n str,
    pub(crate) offsets: RawOffsets<'a>,
    pub(crate) child: &'a ArrayRef,
}

impl<'a, 'n> ListCol<'a, 'n> {
    pub(crate) fn get(batch: &'a RecordBatch, name: &'n str) -> Result<Self, DataError> {
        let array = column(batch, name)?;
        let (offsets, child, nulls) = if let Some(l) = array.as_list_opt::<i32>() {
            (RawOffsets::Small(l.offsets()), l.values(), l.nulls())
        } else if let Some(l) = array.as_list_opt::<i64>() {
            (RawOffsets::Large(l.offsets()), l.values(), l.nulls())
        } else {
            return Err(DataError::ColumnType {
                column: name.into(),
                found: array.data_type().to_string(),
                expected: "a list or large_list column",
            });
        };
        if let Some(row) = first_null(nulls, 0..array.len()) {
            return Err(DataError::NullList { column: name.into(), row: row as u64 });
        }
        let col = Self { name, offsets, child };
        if let Some(k) = first_null(child.nulls(), col.offsets.span()) {
            let (row, token) = col.offsets.locate(k);
            return Err(DataError::NullElement { column: name.into(), row, token });
        }
        Ok(col)
    }

    pub(crate) fn same_lengths_as(&self, reference: &ListCol<'_, '_>) -> Result<(), DataError> {
        let (a, b) = (self.offsets, reference.offsets);
        let (a0, b0) = (a.get(0), b.get(0));
        for row in 0..a.len() - 1 {
            // Equal rebased offsets at every row boundary <=> equal lengths in every row.
            if a.get(row + 1) - a0 != b.get(row + 1) - b0 {
                return Err(DataError::LengthMismatch {
                    row: row as u64,
                    column: self.name.into(),
                    len: (a.get(row + 1) - a.get(row)) as u64,
                    reference: reference.name.into(),
                    reference_len: (b.get(row + 1) - b.get(row)) as u64,
                });
            }
        }
        Ok(())
    }

    /// A token list's elements as f32.
    fn numbers(&self) -> Result<Cow<'a, [f32]>, DataError> {
        self.numbers_per(false)
    }

    /// A per-turn list's elements as f32: an error names the turn, not a token.
    fn turn_numbers(&self) -> Result<Cow<'a, [f32]>, DataError> {
        self.numbers_per(true)
    }

    fn numbers_per(&self, turns: bool) -> Result<Cow<'a, [f32]>, DataError> {
        to_f32(self.child, self.offsets.span())
            .ok_or_else(|| DataError::ColumnType {
                column: self.name.into(),
                found: format!("list<{}>", self.child.data_type()),
                expected: "list<float or integer>",
            })?
            .map_err(|(k, value)| {
                let (row, i) = self.offsets.locate(k);
                let column = self.name.into();
                match turns {
                    true => DataError::OutOfRangeTurn { column, row, turn: i, value },
                    false => DataError::OutOfRangeToken { column, row, token: i, value },
                }
            })
    }

    fn mask(&self) -> Result<Cow<'a, [u8]>, DataError> {
        let span = self.offsets.span();
        let bad = |k: usize, value: i64| {
            let (row, token) = self.offsets.locate(k);
            DataError::MaskValue { column: self.name.into(), row, token, value }
        };
        let child = self.child;
        if let Some(b) = child.as_boolean_opt() {
            return Ok(Cow::Owned(unpack_bits(b, span)));
        }
        if let Some(p) = child.as_primitive_opt::<dt::UInt8Type>() {
            let m = &p.values()[span.clone()];
            return match m.iter().position(|&x| x > 1) {
                None => Ok(Cow::Borrowed(m)),
                Some(i) => Err(bad(span.start + i, m[i] as i64)),
            };
        }
        // The other integer types (uint8 took the borrowing path above).
        downcast_integer_array!(
            child => {
                let vals = &child.values()[span.clone()];
                let mut out = Vec::with_capacity(vals.len());
                #[allow(clippy::unnecessary_cast, reason = "one body serves every integer type, some of them i64")]
                for (i, &x) in vals.iter().enumerate() {
                    if x != 0 && x != 1 {
                        return Err(bad(span.start + i, x as i64));
                    }
                    out.push(x as u8);
                }
                return Ok(Cow::Owned(out));
            }
            _ => {}
        );
        Err(DataError::ColumnType {
            column: self.name.into(),
            found: format!("list<{}>", child.data_type()),
            expected: "list<bool or integer>",
        })
    }
}

/// One byte (0/1) per bit of `b[span]`, 64 bits at a time.
fn unpack_bits(b: &BooleanArray, span: std::ops::Range<usize>) -> Vec<u8> {
    let bits = b.values().slice(span.start, span.len());
    let chunks = bits.bit_chunks();
    let mut out = Vec::with_capacity(span.len());
    for word in chunks.iter() {
        out.extend((0..64).map(|i| ((word >> i) & 1) as u8));
    }
    let rem = chunks.remainder_bits();
    out.extend((0..chunks.remainder_len()).map(|i| ((rem >> i) & 1) as u8));
    out
}

/// Values as f32, or the first float64 beyond float32's range as `Err((index, value))`.
type Narrowed<'a> = Result<Cow<'a, [f32]>, (usize, f64)>;

/// `array[span]` as f32: borrowed for float32, converted for other numeric types; None
/// for anything else. A finite float64 beyond float32's range would turn into ±inf and
/// be reported as "inf is not finite", so the first one is returned as an error instead.
fn to_f32(array: &ArrayRef, span: std::ops::Range<usize>) -> Option<Narrowed<'_>> {
    if let Some(p) = array.as_primitive_opt::<dt::Float32Type>() {
        return Some(Ok(Cow::Borrowed(&p.values()[span])));
    }
    if let Some(p) = array.as_primitive_opt::<dt::Float16Type>() {
        return Some(Ok(Cow::Owned(p.values()[span].iter().map(|x| x.to_f32()).collect())));
    }
    if let Some(p) = array.as_primitive_opt::<dt::Float64Type>() {
        let wide = &p.values()[span.clone()];
        let mut infinite = false;
        let narrow: Vec<f32> = wide
            .iter()
            .map(|&x| {
                let v = x as f32;
                infinite |= v.is_infinite();
                v
            })
            .collect();
        // Only an infinite result can be an overflow, so the search runs only then.
        if infinite {
            if let Some(i) = wide.iter().zip(&narrow).position(|(x, v)| x.is_finite() && v.is_infinite()) {
                return Some(Err((span.start + i, wide[i])));
            }
        }
        return Some(Ok(Cow::Owned(narrow)));
    }
    // Every integer type fits float32's range (u64::MAX is about 1.8e19).
    downcast_integer_array!(
        array => Some(Ok(Cow::Owned(array.values()[span].iter().map(|&x| x as f32).collect()))),
        _ => None,
    )
}

/// The first null index of `nulls` within `span`.
fn first_null(nulls: Option<&NullBuffer>, span: std::ops::Range<usize>) -> Option<usize> {
    let nulls = nulls?;
    if nulls.null_count() == 0 || span.is_empty() {
        return None;
    }
    // `set_slices` yields the runs of *valid* entries; the first null is where the first
    // run stops, or the window's start if it does not begin with a valid entry.
    let window = nulls.inner().slice(span.start, span.len());
    let first = match window.set_slices().next() {
        Some((0, end)) => end,
        _ => 0,
    };
    (first < span.len()).then_some(span.start + first)
}

#[cfg(test)]
mod tests;
