//! Which columns of a rollout log hold what, checked against a schema before any row is
//! read: the mask, values and reward columns an estimator reads (a token-level `rewards`
//! list or a per-trajectory `score`), the group column of the group estimators, and the
//! four output columns that must not exist yet (docs/parquet.md, "Columns").

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema};

use crate::error::{DataError, LogError};
use crate::observation::ObservationRewards;

/// One column of a rollout log as the tools know it: the key its option is named by
/// (`mask` → `mask_col`, `--mask-col`), its default name, its type, its role and a
/// one-line doc. [`COLUMNS`] is the one list every entry point (Arrow, the command line,
/// Ray, diagnose) reads its column names and defaults from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnRow {
    pub key: &'static str,
    /// The column's default name.
    pub default: &'static str,
    /// The Arrow types accepted (inputs) or written (outputs), as errors print them.
    pub data_type: &'static str,
    /// `"input"` (read), `"optional"` (read when present or named), `"named"` (read only
    /// when named), `"output"` (appended).
    pub role: &'static str,
    pub doc: &'static str,
}

const fn row(
    key: &'static str,
    default: &'static str,
    data_type: &'static str,
    role: &'static str,
    doc: &'static str,
) -> ColumnRow {
    ColumnRow { key, default, data_type, role, doc }
}

/// Default names tried, in order, when no rewards, score or turn-rewards column is named.
pub const DEFAULT_REWARDS: &str = "rewards";
pub const DEFAULT_SCORE: &str = "score";
pub const DEFAULT_TURN_REWARDS: &str = "turn_rewards";
/// Read when present (critic estimators), or when named.
pub const DEFAULT_TRUNCATED: &str = "truncated";
/// GiGPO's anchor states, tried in this order when neither is named.
pub const DEFAULT_TURN_STATE_IDS: &str = "turn_state_ids";
pub const DEFAULT_TOKEN_IDS: &str = "token_ids";

/// The types a group column may have (as errors print them).
pub const GROUP_TYPES: &str = "integer, float or string (or a dictionary of them)";

/// The columns of a rollout log (docs/parquet.md, "Columns").
pub const COLUMNS: [ColumnRow; 15] = [
    row(
        "mask",
        "loss_mask",
        "list<bool or integer>",
        "input",
        "policy-token mask: 1 on the tokens the policy generated",
    ),
    row("values", "values", "list<float or integer>", "input", "critic values per token (mae, gae)"),
    row("rewards", DEFAULT_REWARDS, "list<float or integer>", "optional", "token-level rewards"),
    row(
        "score",
        DEFAULT_SCORE,
        "float or integer",
        "optional",
        "one outcome per trajectory (when there are no token rewards)",
    ),
    row("group", "group_id", GROUP_TYPES, "input", "group ids of the group baselines (grpo, drgrpo, rloo)"),
    row("step", "step", "integer", "optional", "training step of the row (mpo-rs diagnose)"),
    row(
        "turn_rewards",
        DEFAULT_TURN_REWARDS,
        "list<float or integer>",
        "optional",
        "one reward per turn, placed on the turn's last policy token (when there are no token rewards or score)",
    ),
    row(
        "check_score",
        DEFAULT_SCORE,
        "float or integer",
        "named",
        "a score per row that the row's turn rewards must sum to (checked within --check-tolerance)",
    ),
    row(
        "truncated",
        DEFAULT_TRUNCATED,
        "bool",
        "optional",
        "the row was cut off before its episode ended: its end bootstraps from its last value (mae, gae)",
    ),
    row(
        "turn_state_ids",
        DEFAULT_TURN_STATE_IDS,
        "list<integer>",
        "optional",
        "one anchor-state id per turn (gigpo; read before token_ids)",
    ),
    row(
        "token_ids",
        DEFAULT_TOKEN_IDS,
        "list<integer>",
        "optional",
        "token ids aligned with the mask, hashed into anchor states (gigpo, when there are no turn_state_ids)",
    ),
    row("advantages", "advantages", "list<float32>", "output", "per-token advantages, 0 off-policy"),
    row("returns", "returns", "list<float32>", "output", "per-token value targets"),
    row("turn_index", "turn_index", "list<int32>", "output", "the token's turn in its trajectory, -1 off-policy"),
    row("turn_advantages", "turn_advantages", "list<float32>", "output", "one advantage per turn"),
];

/// The default name of the column `key` of [`COLUMNS`].
pub const fn default_column(key: &str) -> &'static str {
    let mut i = 0;
    while i < COLUMNS.len() {
        if str_eq(COLUMNS[i].key, key) {
            return COLUMNS[i].default;
        }
        i += 1;
    }
    panic!("no such column key")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The names of the four columns the tool appends.
pub const OUTPUT_COLUMNS: [&str; 4] = [
    default_column("advantages"),
    default_column("returns"),
    default_column("turn_index"),
    default_column("turn_advantages"),
];

/// Column names as the user gave them; `None` means "choose by the default rule".
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub mask: String,
    pub values: String,
    /// Token-level rewards (a list column).
    pub rewards: Option<String>,
    /// One outcome per trajectory (a numeric column).
    pub score: Option<String>,
    /// One reward per turn (a list column).
    pub turn_rewards: Option<String>,
    /// A score per row the turn rewards must sum to, and the tolerance of that check.
    pub check_score: Option<(String, f64)>,
    /// Per-row truncation flags (a bool column); `None`: `truncated` if present.
    pub truncated: Option<String>,
    pub group: String,
    /// GiGPO's anchor states: one id per turn, or token ids to hash; `None`: the default
    /// column if present (`turn_state_ids` first).
    pub turn_state_ids: Option<String>,
    pub token_ids: Option<String>,
    /// What the estimators make of a token reward where the mask is 0.
    pub observation_rewards: ObservationRewards,
}

impl Default for ColumnSpec {
    fn default() -> Self {
        Self {
            mask: default_column("mask").into(),
            values: default_column("values").into(),
            rewards: None,
            score: None,
            turn_rewards: None,
            check_score: None,
            truncated: None,
            group: default_column("group").into(),
            turn_state_ids: None,
            token_ids: None,
            observation_rewards: ObservationRewards::Error,
        }
    }
}

/// Where a batch's reward signal comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewardColumn {
    Token(String),
    Score(String),
    /// One reward per turn, placed on each turn's last policy token.
    Turn(String),
}

impl RewardColumn {
    pub fn name(&self) -> &str {
        match self {
            RewardColumn::Token(n) | RewardColumn::Score(n) | RewardColumn::Turn(n) => n,
        }
    }
}

/// Where GiGPO's anchor states come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnchorColumn {
    /// A list of one id per turn.
    TurnStates(String),
    /// Token ids aligned with the mask, hashed per the estimator's `anchor` option.
    Tokens(String),
}

impl AnchorColumn {
    pub fn name(&self) -> &str {
        match self {
            AnchorColumn::TurnStates(n) | AnchorColumn::Tokens(n) => n,
        }
    }
}

/// The columns one estimator reads, checked against a schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns {
    pub mask: String,
    /// Absent for the critic-free (group) estimators, which never read values.
    pub values: Option<String>,
    pub reward: RewardColumn,
    /// Present only for the group estimators.
    pub group: Option<String>,
    pub observation_rewards: ObservationRewards,
    /// Per-row truncation flags (the estimators that take them only: mae, gae).
    pub truncated: Option<String>,
    /// The score column the turn rewards must sum to, and the tolerance.
    pub check: Option<(String, f64)>,
    /// GiGPO's anchor states (that estimator only).
    pub anchors: Option<AnchorColumn>,
}

/// Why a truncation column is refused (the numpy and torch functions of the other
/// estimators take no `truncated` at all).
pub const TRUNCATION_USAGE: &str = "a truncated column applies to the critic estimators mae and gae (they bootstrap \
     a cut-off row from its last value); the group baselines have no critic and the bi-level GAE (RAGEN's) defines \
     no truncation";

/// What an estimator needs beyond the mask and the reward signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    pub values: bool,
    pub groups: bool,
    /// Whether it reads truncation flags (bootstraps a cut-off row from its last value).
    pub truncation: bool,
    /// Whether it reads anchor states per turn (gigpo): a `turn_state_ids` or `token_ids`
    /// column.
    pub anchors: bool,
}

impl ColumnSpec {
    /// Picks the reward source (a named `rewards`, `score` or `turn_rewards` column, else
    /// the first of `rewards`, `score`, `turn_rewards` the schema has), the truncation
    /// flags (named, else `truncated` if present; only for an estimator that takes them) and checks that every needed column exists with a
    /// usable type and that no output column is already there.
    pub fn resolve(&self, schema: &Schema, needs: Needs) -> Result<Columns, LogError> {
        let anchors = self.anchor_column(schema, needs)?;
        let reward = match (&self.rewards, &self.score, &self.turn_rewards) {
            (Some(r), None, None) => RewardColumn::Token(r.clone()),
            (None, Some(s), None) => RewardColumn::Score(s.clone()),
            (None, None, Some(t)) => RewardColumn::Turn(t.clone()),
            (None, None, None) if schema.column_with_name(DEFAULT_REWARDS).is_some() => {
                RewardColumn::Token(DEFAULT_REWARDS.into())
            }
            (None, None, None) if schema.column_with_name(DEFAULT_SCORE).is_some() => {
                RewardColumn::Score(DEFAULT_SCORE.into())
            }
            (None, None, None) if schema.column_with_name(DEFAULT_TURN_REWARDS).is_some() => {
                RewardColumn::Turn(DEFAULT_TURN_REWARDS.into())
            }
            (None, None, None) => {
                return Err(LogError::Batch(DataError::MissingColumn {
                    columns: vec![DEFAULT_REWARDS.into(), DEFAULT_SCORE.into(), DEFAULT_TURN_REWARDS.into()],
                    available: available(schema, ""),
                }))
            }
            (Some(_), Some(_), None) => {
                return Err(LogError::Usage(
                    "give a token-level rewards column or a per-trajectory score column, not both".into(),
                ))
            }
            _ => {
                return Err(LogError::Usage(
                    "give one of a token-level rewards column, a per-trajectory score column and a per-turn \
                     rewards column, not two"
                        .into(),
                ))
            }
        };
        if self.check_score.is_some() && !matches!(reward, RewardColumn::Turn(_)) {
            return Err(LogError::Usage(format!(
                "a check score column checks that per-turn rewards sum to it; the rewards here are `{}`, not \
                 per-turn rewards",
                reward.name()
            )));
        }
        if let Some((_, tolerance)) = &self.check_score {
            mpo_core::check_tolerance(*tolerance)?;
        }
        // An estimator without truncation (the group baselines, the bi-level GAE) refuses a
        // named column and never reads a `truncated` column that is merely present.
        let truncated = match &self.truncated {
            Some(_) if !needs.truncation => return Err(LogError::Usage(TRUNCATION_USAGE.into())),
            Some(t) => Some(t.clone()),
            None if needs.truncation && schema.column_with_name(DEFAULT_TRUNCATED).is_some() => {
                Some(DEFAULT_TRUNCATED.into())
            }
            None => None,
        };
        let columns = Columns {
            mask: self.mask.clone(),
            values: needs.values.then(|| self.values.clone()),
            reward,
            group: needs.groups.then(|| self.group.clone()),
            observation_rewards: self.observation_rewards,
            truncated,
            check: self.check_score.clone(),
            anchors,
        };
        columns.check_schema(schema).map_err(LogError::Batch)?;
        Ok(columns)
    }

    /// GiGPO's anchor column: the one named, else `turn_state_ids`, else `token_ids` when
    /// present; an estimator without anchor states refuses a named one.
    fn anchor_column(&self, schema: &Schema, needs: Needs) -> Result<Option<AnchorColumn>, LogError> {
        let present = |name: &str| schema.column_with_name(name).is_some();
        Ok(match (&self.turn_state_ids, &self.token_ids) {
            (named, tokens) if !needs.anchors => {
                if let Some(name) = named.as_ref().or(tokens.as_ref()) {
                    return Err(LogError::Usage(format!(
                        "an anchor-state column (`{name}`) applies to the gigpo estimator only"
                    )));
                }
                None
            }
            (Some(_), Some(_)) => {
                return Err(LogError::Usage(
                    "give a turn_state_ids column or a token_ids column for the anchor states, not both".into(),
                ))
            }
            (Some(t), None) => Some(AnchorColumn::TurnStates(t.clone())),
            (None, Some(t)) => Some(AnchorColumn::Tokens(t.clone())),
            (None, None) if present(DEFAULT_TURN_STATE_IDS) => {
                Some(AnchorColumn::TurnStates(DEFAULT_TURN_STATE_IDS.into()))
            }
            (None, None) if present(DEFAULT_TOKEN_IDS) => Some(AnchorColumn::Tokens(DEFAULT_TOKEN_IDS.into())),
            (None, None) => {
                return Err(LogError::Batch(DataError::MissingColumn {
                    columns: vec![DEFAULT_TURN_STATE_IDS.into(), DEFAULT_TOKEN_IDS.into()],
                    available: format!(
                        "gigpo reads anchor states: one id per turn, or token ids to hash; {}",
                        available(schema, "")
                    ),
                }))
            }
        })
    }
}

impl Columns {
    /// Checks names and types against `schema` (before any row is read).
    pub fn check_schema(&self, schema: &Schema) -> Result<(), DataError> {
        let ty = |name: &str| -> Result<&DataType, DataError> {
            schema.field_with_name(name).map(|f| f.data_type()).map_err(|_| DataError::MissingColumn {
                columns: vec![name.to_string()],
                available: available(schema, name),
            })
        };
        check_list(&self.mask, ty(&self.mask)?, ElementKind::Mask)?;
        if let Some(values) = &self.values {
            check_list(values, ty(values)?, ElementKind::Number)?;
        }
        match &self.reward {
            RewardColumn::Token(r) | RewardColumn::Turn(r) => check_list(r, ty(r)?, ElementKind::Number)?,
            RewardColumn::Score(s) => check_number(s, ty(s)?)?,
        }
        if let Some((s, _)) = &self.check {
            check_number(s, ty(s)?)?;
        }
        if let Some(t) = &self.truncated {
            let found = ty(t)?;
            if found != &DataType::Boolean {
                return Err(DataError::ColumnType { column: t.clone(), found: found.to_string(), expected: "bool" });
            }
        }
        if let Some(group) = &self.group {
            check_group_type(group, ty(group)?)?;
        }
        if let Some(a) = &self.anchors {
            check_list(a.name(), ty(a.name())?, ElementKind::Integer)?;
        }
        for out in OUTPUT_COLUMNS {
            if schema.column_with_name(out).is_some() {
                return Err(DataError::OutputColumnExists { column: out.into() });
            }
        }
        Ok(())
    }

    /// The list kind of the outputs: the mask column's (list → list, large_list →
    /// large_list), so a batch keeps one offset width.
    pub fn list_kind(&self, schema: &Schema) -> ListKind {
        match schema.field_with_name(&self.mask).map(|f| f.data_type()) {
            Ok(DataType::LargeList(_)) => ListKind::Large,
            _ => ListKind::Small,
        }
    }

    /// Names of the columns [`crate::partial_group_statistics`] reads: the score or
    /// rewards, the group, and with token or per-turn rewards the mask (rewards on
    /// observation tokens are refused; per-turn rewards are counted against the turns).
    pub fn partial_statistics_columns(&self) -> Vec<&str> {
        let mut cols = self.score_pass_columns();
        // Token rewards are checked against the mask, per-turn rewards counted against its turns.
        if matches!(self.reward, RewardColumn::Token(_) | RewardColumn::Turn(_)) && !cols.contains(&self.mask.as_str())
        {
            cols.push(&self.mask);
        }
        cols
    }

    /// Names of the columns read in the group-statistics pass (rewards or score, group;
    /// the mask too where token rewards on observation tokens are moved; for gigpo, whose
    /// statistics are per turn, the mask, the anchor column and a check-score column).
    pub fn score_pass_columns(&self) -> Vec<&str> {
        let mut cols = vec![self.reward.name()];
        cols.extend(self.group.as_deref());
        if let Some(a) = &self.anchors {
            cols.extend([self.mask.as_str(), a.name()]);
            cols.extend(self.check.as_ref().map(|(c, _)| c.as_str()));
            cols.dedup();
            return cols;
        }
        if self.observation_rewards != ObservationRewards::Error && matches!(self.reward, RewardColumn::Token(_)) {
            cols.push(&self.mask);
        }
        cols
    }
}

/// The columns there are, for a message about the missing column `wanted` (led by the
/// closest one's name when `wanted` looks like its misspelling).
pub(crate) fn available(schema: &Schema, wanted: &str) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    if names.is_empty() {
        return "the input has no columns".into();
    }
    let hint =
        mpo_core::closest(wanted, names.iter().copied()).map(|c| format!("did you mean `{c}`? ")).unwrap_or_default();
    format!("{hint}columns are: {}", names.join(", "))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ElementKind {
    Mask,
    Number,
    Integer,
}

fn check_list(name: &str, ty: &DataType, kind: ElementKind) -> Result<(), DataError> {
    let (expected, ok): (&'static str, fn(&DataType) -> bool) = match kind {
        ElementKind::Mask => ("list<bool or integer>", |t| t == &DataType::Boolean || t.is_integer()),
        ElementKind::Number => ("list<float or integer>", |t| t.is_floating() || t.is_integer()),
        ElementKind::Integer => ("list<integer>", |t| t.is_integer()),
    };
    match ty {
        DataType::List(f) | DataType::LargeList(f) if ok(f.data_type()) => Ok(()),
        _ => Err(DataError::ColumnType { column: name.into(), found: ty.to_string(), expected }),
    }
}

/// Checks that a group column's type can hold group ids.
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
        Err(DataError::ColumnType { column: name.into(), found: ty.to_string(), expected: GROUP_TYPES })
    }
}

pub(crate) fn check_number(name: &str, ty: &DataType) -> Result<(), DataError> {
    if ty.is_floating() || ty.is_integer() {
        Ok(())
    } else {
        Err(DataError::ColumnType { column: name.into(), found: ty.to_string(), expected: "float or integer" })
    }
}

/// Offset width of a list column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `list`, 32-bit offsets.
    Small,
    /// `large_list`, 64-bit offsets (polars' list type).
    Large,
}

/// The column `name` of `batch`, or an error that lists the columns there are.
pub(crate) fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, DataError> {
    batch.column_by_name(name).ok_or_else(|| DataError::MissingColumn {
        columns: vec![name.into()],
        available: available(batch.schema_ref(), name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;

    #[test]
    fn resolve_prefers_rewards_then_score() {
        let mask = Field::new("loss_mask", DataType::new_list(DataType::Boolean, true), false);
        let values = Field::new("values", DataType::new_list(DataType::Float32, true), false);
        let rewards = Field::new("rewards", DataType::new_list(DataType::Float32, true), false);
        let score = Field::new("score", DataType::Float32, false);
        let needs = Needs { values: true, groups: false, truncation: true, anchors: false };
        let spec = ColumnSpec::default();
        let s = Schema::new(vec![mask.clone(), values.clone(), rewards, score.clone()]);
        assert_eq!(spec.resolve(&s, needs).unwrap().reward, RewardColumn::Token("rewards".into()));
        let s = Schema::new(vec![mask.clone(), values.clone(), score]);
        assert_eq!(spec.resolve(&s, needs).unwrap().reward, RewardColumn::Score("score".into()));
        let s = Schema::new(vec![mask, values]);
        let e = spec.resolve(&s, needs).unwrap_err().to_string();
        assert!(e.contains("missing column `rewards` or `score`"), "{e}");
        let both = ColumnSpec { rewards: Some("r".into()), score: Some("s".into()), ..Default::default() };
        assert!(both.resolve(&s, needs).unwrap_err().is_usage());
    }

    #[test]
    fn only_the_estimators_with_truncation_read_a_truncated_column() {
        let list = |t: DataType| DataType::new_list(t, true);
        let s = Schema::new(vec![
            Field::new("loss_mask", list(DataType::Boolean), false),
            Field::new("values", list(DataType::Float32), false),
            Field::new("rewards", list(DataType::Float32), false),
            Field::new("truncated", DataType::Boolean, true),
            Field::new("group_id", DataType::Int64, false),
        ]);
        let named = ColumnSpec { truncated: Some("truncated".into()), ..Default::default() };
        for needs in [
            Needs { values: true, groups: false, truncation: false, anchors: false },
            Needs { values: false, groups: true, truncation: false, anchors: false },
        ] {
            let e = named.resolve(&s, needs).unwrap_err();
            assert!(e.is_usage() && e.to_string() == TRUNCATION_USAGE, "{e}");
            assert_eq!(ColumnSpec::default().resolve(&s, needs).unwrap().truncated, None);
        }
        let mae = Needs { values: true, groups: false, truncation: true, anchors: false };
        assert_eq!(ColumnSpec::default().resolve(&s, mae).unwrap().truncated.as_deref(), Some("truncated"));
        assert_eq!(named.resolve(&s, mae).unwrap().truncated.as_deref(), Some("truncated"));
    }

    #[test]
    fn the_column_table_names_every_default_once() {
        let keys: Vec<&str> = COLUMNS.iter().map(|c| c.key).collect();
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(default_column("rewards"), DEFAULT_REWARDS);
        assert_eq!(default_column("score"), DEFAULT_SCORE);
        let outputs: Vec<&str> = COLUMNS.iter().filter(|c| c.role == "output").map(|c| c.default).collect();
        assert_eq!(outputs, OUTPUT_COLUMNS);
        assert_eq!(ColumnSpec::default().mask, "loss_mask");
        assert_eq!(ColumnSpec::default().group, "group_id");
    }
}
