//! Errors of the core. Every variant says what is wrong and where (argument,
//! trajectory, token), so the binding can hand it to Python as one readable line.

use thiserror::Error;

/// Where a bad token sits: its flat index, its trajectory and its position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenAt {
    pub token: usize,
    pub trajectory: usize,
    pub position: usize,
}

impl std::fmt::Display for TokenAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "token {} (trajectory {}, position {})", self.token, self.trajectory, self.position)
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum MpoError {
    /// An argument's length disagrees with the batch layout.
    #[error("`{arg}` has length {got}, expected {expected} ({why})")]
    Length { arg: &'static str, got: usize, expected: usize, why: &'static str },
    /// `offsets` is not a valid ragged layout.
    #[error("`offsets` {0}")]
    Offsets(String),
    /// A mask entry other than 0 or 1.
    #[error("`mask` must hold 0 or 1, found {value} at {at}")]
    MaskValue { value: u8, at: TokenAt },
    /// NaN or ±Inf where a finite number is read.
    #[error("`{arg}` is not finite ({value}) at {at}")]
    NonFiniteToken { arg: &'static str, value: f32, at: TokenAt },
    /// NaN or ±Inf in a per-trajectory array.
    #[error("`{arg}` is not finite ({value}) at trajectory {trajectory}")]
    NonFiniteTrajectory { arg: &'static str, value: f32, trajectory: usize },
    /// A result that is not finite although every input was: finite values, rewards or a
    /// β so large that the estimate overflows float32.
    #[error("`{output}` would be {value} at {at}: the estimate overflows float32 (finite inputs, or beta, too large)")]
    NonFiniteOutput { output: &'static str, value: f32, at: TokenAt },
    /// A per-trajectory result that is not finite although every input was.
    #[error("`{output}` would be {value} at trajectory {trajectory}: the estimate overflows float32 (finite scores too large)")]
    NonFiniteTrajectoryOutput { output: &'static str, value: f32, trajectory: usize },
    /// NaN or ±Inf in a per-turn array.
    #[error("`{arg}` is not finite ({value}) at turn {turn} of trajectory {trajectory}")]
    NonFiniteTurn { arg: &'static str, value: f32, trajectory: usize, turn: usize },
    /// A trajectory given another number of per-turn rewards than it has turns.
    #[error("`turn_rewards` has {got} values for trajectory {trajectory}, which has {expected} turns (runs of mask == 1); give one reward per turn")]
    TurnRewardCount { trajectory: usize, got: usize, expected: usize },
    /// A trajectory given another number of per-turn ids than it has turns.
    #[error("`{arg}` has {got} values for trajectory {trajectory}, which has {expected} turns (runs of mask == 1); give one per turn")]
    TurnCount { arg: &'static str, trajectory: usize, got: usize, expected: usize },
    /// Per-turn rewards that do not sum to the trajectory's score (the optional check).
    #[error("`turn_rewards` of trajectory {trajectory} sum to {sum}, but its score is {score} (`check_scores`, tolerance {tolerance} x max(1, |score|))")]
    TurnRewardSum { trajectory: usize, sum: f64, score: f32, tolerance: f64 },
    /// A reward on a token the policy did not generate.
    #[error("`rewards` is {value} at observation {at}; rewards must be 0 where mask is 0")]
    ObservationReward { value: f32, at: TokenAt },
    /// A group index outside `[0, n_groups)`.
    #[error("`group_index` holds {value} at trajectory {trajectory}, outside [0, {n_groups})")]
    GroupIndex { value: i64, trajectory: usize, n_groups: usize },
    /// A batch larger than the output index types can address.
    #[error("{0}")]
    Capacity(String),
    /// A hyper-parameter outside its domain.
    #[error("`{name}` = {value} is out of range: it must be in {domain}")]
    Parameter { name: &'static str, value: f64, domain: &'static str },
    /// An estimator name, or an option name or value, that cannot be used (unknown, or an
    /// option the estimator does not take); `option` names the option (`estimator` for the
    /// estimator's name), None where no one option is at fault.
    #[error("{message}")]
    Option { option: Option<String>, message: String },
    /// A critic estimator called without the critic's values.
    #[error("the {estimator} estimator needs the critic's `values` (one per token)")]
    MissingValues { estimator: &'static str },
    /// An input the estimator needs that is not given (group ids, scores).
    #[error("{0}")]
    Input(String),
    /// An input the estimator does not read (it would be silently lost).
    #[error("{0}")]
    Inapplicable(String),
}

pub type Result<T> = std::result::Result<T, MpoError>;

impl MpoError {
    /// The argument (the column, for a log) the error is about, if one is.
    pub fn column(&self) -> Option<&str> {
        match self {
            MpoError::Length { arg, .. }
            | MpoError::NonFiniteToken { arg, .. }
            | MpoError::NonFiniteTrajectory { arg, .. }
            | MpoError::NonFiniteTurn { arg, .. }
            | MpoError::TurnCount { arg, .. } => Some(arg),
            MpoError::NonFiniteOutput { output, .. } | MpoError::NonFiniteTrajectoryOutput { output, .. } => {
                Some(output)
            }
            MpoError::Offsets(_) => Some("offsets"),
            MpoError::MaskValue { .. } => Some("mask"),
            MpoError::TurnRewardCount { .. } | MpoError::TurnRewardSum { .. } => Some("turn_rewards"),
            MpoError::ObservationReward { .. } => Some("rewards"),
            MpoError::GroupIndex { .. } => Some("group_index"),
            _ => None,
        }
    }

    /// The trajectory (row) the error is in, if one is.
    pub fn trajectory(&self) -> Option<usize> {
        match self {
            MpoError::MaskValue { at, .. }
            | MpoError::NonFiniteToken { at, .. }
            | MpoError::NonFiniteOutput { at, .. }
            | MpoError::ObservationReward { at, .. } => Some(at.trajectory),
            MpoError::NonFiniteTrajectory { trajectory, .. }
            | MpoError::NonFiniteTrajectoryOutput { trajectory, .. }
            | MpoError::NonFiniteTurn { trajectory, .. }
            | MpoError::TurnRewardCount { trajectory, .. }
            | MpoError::TurnCount { trajectory, .. }
            | MpoError::TurnRewardSum { trajectory, .. }
            | MpoError::GroupIndex { trajectory, .. } => Some(*trajectory),
            _ => None,
        }
    }

    /// The token the error is at, as its position in its trajectory, if one is.
    pub fn token(&self) -> Option<usize> {
        match self {
            MpoError::MaskValue { at, .. }
            | MpoError::NonFiniteToken { at, .. }
            | MpoError::NonFiniteOutput { at, .. }
            | MpoError::ObservationReward { at, .. } => Some(at.position),
            _ => None,
        }
    }

    /// The option the error is about (`estimator` for an estimator's name), if one is.
    pub fn option(&self) -> Option<&str> {
        match self {
            MpoError::Option { option, .. } => option.as_deref(),
            MpoError::Parameter { name, .. } => Some(name),
            _ => None,
        }
    }
}
