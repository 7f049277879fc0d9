//! Errors, in two layers. [`DataError`] says what is wrong with a batch of rollouts and
//! where inside it (row, column, token); [`LogError`] adds the file and row group for the
//! Parquet tool, and covers I/O, corrupt files and unusable options. Every message is one
//! line, meant to be shown to a user as is.

use std::path::PathBuf;

use mpo_core::MpoError;
use thiserror::Error;

/// A batch of rollouts the estimators cannot use. `row` is the row (trajectory) index in
/// the batch, or in the file once the pipeline has placed it; `token` is the position
/// inside that row's lists.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DataError {
    /// None of `columns` (one, or the alternatives a role may be read from) is in the input.
    #[error("missing column `{}` ({available})", columns.join("` or `"))]
    MissingColumn { columns: Vec<String>, available: String },

    #[error("column `{column}` has type {found}, expected {expected}")]
    ColumnType { column: String, found: String, expected: &'static str },

    #[error("row {row}, column `{column}`: null list (every row needs a list, possibly empty)")]
    NullList { column: String, row: u64 },

    #[error("row {row}, column `{column}`: null element at token {token}")]
    NullElement { column: String, row: u64, token: u64 },

    #[error("row {row}, column `{column}`: null value")]
    NullValue { column: String, row: u64 },

    #[error("row {row}: column `{column}` has {len} tokens but `{reference}` has {reference_len}")]
    LengthMismatch { row: u64, column: String, len: u64, reference: String, reference_len: u64 },

    #[error("row {row}, column `{column}`: the mask must hold 0 or 1, found {value} at token {token}")]
    MaskValue { column: String, row: u64, token: u64, value: i64 },

    #[error("row {row}, column `{column}`: {value} is not finite at token {token}")]
    NonFiniteToken { column: String, row: u64, token: u64, value: f32 },

    #[error("row {row}, column `{column}`: {value} is not finite")]
    NonFiniteRow { column: String, row: u64, value: f32 },

    /// An estimate that overflows float32 although every input was finite.
    #[error(
        "row {row}: `{output}` would be {value} at token {token}; the estimate overflows float32 (inputs too large)"
    )]
    NonFiniteOutput { output: String, row: u64, token: u64, value: f32 },

    #[error("row {row}: `{output}` would be {value}; the estimate overflows float32 (scores too large)")]
    NonFiniteOutputRow { output: String, row: u64, value: f32 },

    /// A finite float64 too large for float32 (it would become ±inf).
    #[error("row {row}, column `{column}`: {value:e} at token {token} is outside float32's range")]
    OutOfRangeToken { column: String, row: u64, token: u64, value: f64 },

    /// The same in a per-turn list: an element is a turn.
    #[error("row {row}, column `{column}`: {value:e} at turn {turn} is outside float32's range")]
    OutOfRangeTurn { column: String, row: u64, turn: u64, value: f64 },

    #[error("row {row}, column `{column}`: {value:e} is outside float32's range")]
    OutOfRangeRow { column: String, row: u64, value: f64 },

    #[error("row {row}, column `{column}`: the rewards sum to {value:e}, outside float32's range")]
    RewardSumOutOfRange { column: String, row: u64, value: f64 },

    /// The hint names the option in both spellings: the message is the same from every
    /// entry point.
    #[error(
        "row {row}, column `{column}`: reward {value} at observation token {token}; rewards must be 0 where the mask is 0 \
         (observation_rewards=\"credit\", `--observation-rewards credit`, moves such a reward to the last policy token \
         before it in its row, as a score written into a padded row's last column needs; \"drop\" ignores it)"
    )]
    ObservationReward { column: String, row: u64, token: u64, value: f32 },

    #[error("row {row}, column `{column}`: {value} is not finite at turn {turn}")]
    NonFiniteTurn { column: String, row: u64, turn: u64, value: f32 },

    #[error("row {row}, column `{column}`: {got} turn rewards, but the row has {expected} turns (runs of mask == 1); give one reward per turn")]
    TurnRewardCount { column: String, row: u64, got: u64, expected: u64 },

    #[error("row {row}, column `{column}`: {got} anchor-state ids, but the row has {expected} turns (runs of mask == 1); give one id per turn")]
    TurnIdCount { column: String, row: u64, got: u64, expected: u64 },

    #[error("row {row}, column `{column}`: the turn rewards sum to {sum}, but `{check_column}` is {score} (tolerance {tolerance} x max(1, |score|))")]
    TurnRewardSum { column: String, check_column: String, row: u64, sum: f64, score: f32, tolerance: f64 },

    #[error("row {row}, column `{column}`: {value} at index {index} of the row is beyond int64's range (ids are int64 values, compared by value on every path)")]
    IdOutOfRange { column: String, row: u64, index: u64, value: u64 },

    #[error(
        "row {row}, column `{column}`: group id not seen by the statistics pass (did the input change during the run?)"
    )]
    UnknownGroup { column: String, row: u64 },

    #[error("column `{column}` is already in the input; the tool appends it and will not overwrite it")]
    OutputColumnExists { column: String },

    /// Group ids of inputs (files, blocks) that one log cannot hold together (the
    /// group-id rule, [`crate::groups::IdKinds`]).
    #[error("column `{column}`: {detail}")]
    GroupIds { column: String, detail: String },

    #[error("{0}")]
    Capacity(String),

    /// The files of one log that resolve their columns differently (when not named, each
    /// file's columns are chosen alike; the log is refused rather than read by the first
    /// file's choice).
    #[error("{0}")]
    ColumnsDiffer(String),

    /// Anything else the core refused (its message names the argument and trajectory).
    #[error("{0}")]
    Estimator(MpoError),
}

/// The pattern matching every [`DataError`] variant that carries a `row`, binding it to
/// `$row`: the one list [`DataError::shift_rows`] and [`DataError::row`] share, so a new
/// row-carrying variant is added in one place.
macro_rules! row_variants {
    ($row:ident) => {
        DataError::NullList { row: $row, .. }
            | DataError::NullElement { row: $row, .. }
            | DataError::NullValue { row: $row, .. }
            | DataError::LengthMismatch { row: $row, .. }
            | DataError::MaskValue { row: $row, .. }
            | DataError::NonFiniteToken { row: $row, .. }
            | DataError::NonFiniteRow { row: $row, .. }
            | DataError::NonFiniteOutput { row: $row, .. }
            | DataError::NonFiniteOutputRow { row: $row, .. }
            | DataError::OutOfRangeToken { row: $row, .. }
            | DataError::OutOfRangeTurn { row: $row, .. }
            | DataError::OutOfRangeRow { row: $row, .. }
            | DataError::RewardSumOutOfRange { row: $row, .. }
            | DataError::ObservationReward { row: $row, .. }
            | DataError::NonFiniteTurn { row: $row, .. }
            | DataError::TurnRewardCount { row: $row, .. }
            | DataError::TurnIdCount { row: $row, .. }
            | DataError::TurnRewardSum { row: $row, .. }
            | DataError::UnknownGroup { row: $row, .. }
            | DataError::IdOutOfRange { row: $row, .. }
    };
}

impl DataError {
    /// A row whose group the statistics never saw.
    pub(crate) fn unknown_group(column: &str, row: usize) -> Self {
        DataError::UnknownGroup { column: column.into(), row: row as u64 }
    }

    /// Moves the row of this error by `base` rows: a batch's row 3 is the file's row
    /// `base + 3`.
    pub fn shift_rows(mut self, base: u64) -> Self {
        if let row_variants!(row) = &mut self {
            *row += base;
        }
        self
    }

    /// The row this error is about, if it is about one.
    pub fn row(&self) -> Option<u64> {
        match self {
            row_variants!(row) => Some(*row),
            DataError::Estimator(e) => e.trajectory().map(|t| t as u64),
            _ => None,
        }
    }

    /// The column the error is about (the first of a missing column's alternatives).
    pub fn column(&self) -> Option<&str> {
        match self {
            DataError::MissingColumn { columns, .. } => columns.first().map(String::as_str),
            DataError::ColumnType { column, .. }
            | DataError::NullList { column, .. }
            | DataError::NullElement { column, .. }
            | DataError::NullValue { column, .. }
            | DataError::LengthMismatch { column, .. }
            | DataError::MaskValue { column, .. }
            | DataError::NonFiniteToken { column, .. }
            | DataError::NonFiniteRow { column, .. }
            | DataError::OutOfRangeToken { column, .. }
            | DataError::OutOfRangeTurn { column, .. }
            | DataError::OutOfRangeRow { column, .. }
            | DataError::RewardSumOutOfRange { column, .. }
            | DataError::ObservationReward { column, .. }
            | DataError::NonFiniteTurn { column, .. }
            | DataError::TurnRewardCount { column, .. }
            | DataError::TurnIdCount { column, .. }
            | DataError::TurnRewardSum { column, .. }
            | DataError::IdOutOfRange { column, .. }
            | DataError::UnknownGroup { column, .. }
            | DataError::OutputColumnExists { column }
            | DataError::GroupIds { column, .. } => Some(column),
            DataError::NonFiniteOutput { output, .. } | DataError::NonFiniteOutputRow { output, .. } => Some(output),
            DataError::Estimator(e) => e.column(),
            DataError::Capacity(_) | DataError::ColumnsDiffer(_) => None,
        }
    }

    /// The option a usage error is about ([`DataError::is_usage`]), if one is.
    pub fn option(&self) -> Option<&str> {
        match self {
            DataError::Estimator(e) => e.option(),
            _ => None,
        }
    }

    /// A missing column's alternatives (one name, or the names a role may be read from);
    /// empty for any other error.
    pub fn missing_columns(&self) -> &[String] {
        match self {
            DataError::MissingColumn { columns, .. } => columns,
            _ => &[],
        }
    }

    /// The token the error is at, as its position in its row, if one is.
    pub fn token(&self) -> Option<u64> {
        match self {
            DataError::NullElement { token, .. }
            | DataError::MaskValue { token, .. }
            | DataError::NonFiniteToken { token, .. }
            | DataError::NonFiniteOutput { token, .. }
            | DataError::OutOfRangeToken { token, .. }
            | DataError::ObservationReward { token, .. } => Some(*token),
            DataError::Estimator(e) => e.token().map(|t| t as u64),
            _ => None,
        }
    }
}

/// Where in a Parquet input an error was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAt {
    pub path: PathBuf,
    /// None when the problem is with the file as a whole (its footer or schema).
    pub row_group: Option<usize>,
}

impl std::fmt::Display for FileAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(g) = self.row_group {
            write!(f, ": row group {g}")?;
        }
        Ok(())
    }
}

/// Errors of the Parquet tool and of the Arrow entry points.
#[derive(Debug, Error)]
pub enum LogError {
    /// Bad rollout data (exit code 1).
    #[error("{at}: {error}")]
    Data { at: FileAt, error: DataError },

    /// Bad rollout data in an in-memory table (no file).
    #[error("{0}")]
    Batch(DataError),

    /// A file that is not Parquet, is truncated, or fails to decode (exit code 1).
    /// `column` is the first column that fails to decode on its own, when one does.
    #[error(
        "{at}: {}cannot read Parquet: {message}",
        .column.as_ref().map(|c| format!("column `{c}`: ")).unwrap_or_default()
    )]
    Corrupt { at: FileAt, column: Option<String>, message: String },

    /// The operating system refused an operation (exit code 1).
    #[error("{}: {action}: {source}", path.display())]
    Io { path: PathBuf, action: &'static str, source: std::io::Error },

    /// Encoding the output failed (exit code 1).
    #[error("{}: cannot write Parquet: {message}", path.display())]
    Write { path: PathBuf, message: String },

    /// An option, estimator parameter or path combination the tool will not use
    /// (a usage error, exit code 2).
    #[error("{0}")]
    Usage(String),

    /// An estimator option or parameter the core refuses (a usage error, exit code 2); it
    /// keeps the core's error, which names the option.
    #[error("{0}")]
    Option(MpoError),

    /// The progress callback asked to stop (e.g. Ctrl-C); nothing was written.
    #[error("interrupted")]
    Interrupted,
}

impl LogError {
    pub(crate) fn io(path: impl Into<PathBuf>, action: &'static str, source: std::io::Error) -> Self {
        LogError::Io { path: path.into(), action, source }
    }

    /// True for errors that are the caller's choice of options rather than the data (an
    /// option the core refuses on reading a batch included).
    pub fn is_usage(&self) -> bool {
        match self {
            LogError::Usage(_) | LogError::Option(_) => true,
            LogError::Batch(e) | LogError::Data { error: e, .. } => e.is_usage(),
            _ => false,
        }
    }

    /// The batch error inside, for a file's data or an in-memory batch.
    pub fn data(&self) -> Option<&DataError> {
        match self {
            LogError::Data { error, .. } | LogError::Batch(error) => Some(error),
            _ => None,
        }
    }
}

impl DataError {
    /// An option or an input the estimator does not read, refused by the core when it read
    /// a batch: the caller's choice, not the data.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            DataError::Estimator(MpoError::Parameter { .. } | MpoError::Option { .. } | MpoError::Inapplicable(_))
        )
    }
}

impl From<MpoError> for LogError {
    /// Only option and parameter checks reach this conversion; data errors go through
    /// [`DataError`] so they can name rows and columns.
    fn from(e: MpoError) -> Self {
        match e {
            MpoError::Parameter { .. } | MpoError::Option { .. } | MpoError::Inapplicable(_) => LogError::Option(e),
            other => LogError::Batch(DataError::Estimator(other)),
        }
    }
}
