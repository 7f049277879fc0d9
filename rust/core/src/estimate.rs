//! One entry for every estimator: the batch in one struct, the estimator's enum matched
//! once. Every layer (numpy, torch, Arrow, the rollout-log tools) calls [`estimate`], so a
//! new estimator is one arm here and one kernel, not one function per layer.

use crate::error::{MpoError, Result};
use crate::estimator::Estimator;
use crate::gigpo::Anchors;
use crate::layout::Rewards;
use crate::turns::Turns;

/// Dense group codes in `0..n_groups`, one per trajectory (rollouts of one prompt).
#[derive(Debug, Clone, Copy)]
pub struct Groups<'a> {
    pub index: &'a [i64],
    pub n_groups: usize,
}

/// Where a batch's tokens lie.
#[derive(Debug, Clone, Copy)]
pub enum Tokens<'a> {
    /// Flat tokens: trajectory `j` is `offsets[j]..offsets[j + 1]`; `mask` marks the tokens
    /// the policy generated.
    Flat { mask: &'a [u8], offsets: &'a [i64] },
    /// One policy token per trajectory, nothing else (a group estimator's scores alone): the
    /// per-token advantages are the per-trajectory ones, so [`Estimate::advantages`] holds
    /// them and `per_trajectory` is `None` (no layout to scan, no second copy). Only the
    /// group estimators take it.
    OnePerTrajectory,
}

/// A ragged batch and every input an estimator may read. Which are needed depends on the
/// estimator: the critic estimators read `values` (and mae, gae `truncated`), the group
/// estimators `groups` and one score per trajectory, gigpo `groups` and `anchors`.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub tokens: Tokens<'a>,
    pub rewards: Rewards<'a>,
    pub values: Option<&'a [f32]>,
    pub truncated: Option<&'a [bool]>,
    pub groups: Option<Groups<'a>>,
    /// GiGPO's anchor states (ids per turn, or token ids to hash).
    pub anchors: Anchors<'a>,
}

/// What an estimator computes; the fields an estimator does not define are `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Per token, 0 off-policy (a group estimator's per-trajectory advantage written on its
    /// policy tokens).
    pub advantages: Vec<f32>,
    /// Per token, the critic's targets (critic estimators).
    pub returns: Option<Vec<f32>>,
    /// Per turn (mae, bilevel; gigpo: A_E + w·A_S, the value on the turn's tokens).
    pub turn_advantages: Option<Vec<f32>>,
    /// The segmentation the turn advantages index (mae, bilevel, gigpo).
    pub turns: Option<Turns>,
    /// Per trajectory (group estimators, except on [`Tokens::OnePerTrajectory`] where
    /// `advantages` are those; gigpo: the episode advantages A_E).
    pub per_trajectory: Option<Vec<f32>>,
    /// Per turn, gigpo's step advantages A_S.
    pub step_advantages: Option<Vec<f32>>,
    /// Per turn, gigpo's step-group ids (dense, int64).
    pub step_groups: Option<Vec<i64>>,
}

/// Runs `estimator` on `batch`. An input the estimator needs but lacks, or one it would not
/// read, is refused ([`MpoError::MissingValues`], [`MpoError::Input`]) rather than ignored.
pub fn estimate(estimator: &Estimator, batch: &Batch<'_>) -> Result<Estimate> {
    let name = estimator.family();
    let b = batch;
    if !matches!(estimator, Estimator::Gigpo(_)) {
        let given =
            [(b.anchors.turn_state_ids.is_some(), "`turn_state_ids`"), (b.anchors.token_ids.is_some(), "`token_ids`")];
        if let Some((_, what)) = given.iter().find(|(g, _)| *g) {
            return Err(MpoError::Inapplicable(format!(
                "{what} do not apply to the {name} estimator (only gigpo reads anchor states)"
            )));
        }
    }
    if let Estimator::Group(params) = estimator {
        for (given, what) in [(b.values.is_some(), "`values`"), (b.truncated.is_some(), "`truncated`")] {
            if given {
                return Err(MpoError::Inapplicable(format!(
                    "{what} does not apply to the group estimators (critic-free: no values, no bootstrap)"
                )));
            }
        }
        let Some(groups) = b.groups else {
            return Err(MpoError::Input("the group estimators need `group_ids`: one group id per trajectory".into()));
        };
        let Rewards::Score(scores) = b.rewards else {
            return Err(MpoError::Input("the group estimators read one score per trajectory: give `scores`".into()));
        };
        let per_trajectory = crate::group_advantages(scores, groups.index, groups.n_groups, params)?;
        let (advantages, per_trajectory) = match b.tokens {
            Tokens::OnePerTrajectory => (per_trajectory, None),
            Tokens::Flat { mask, offsets } => {
                (crate::broadcast_to_tokens(&per_trajectory, mask, offsets)?, Some(per_trajectory))
            }
        };
        return Ok(Estimate {
            advantages,
            returns: None,
            turn_advantages: None,
            turns: None,
            per_trajectory,
            step_advantages: None,
            step_groups: None,
        });
    }
    let Tokens::Flat { mask, offsets } = b.tokens else {
        return Err(MpoError::Input(format!(
            "the {name} estimator reads the batch's tokens: give `mask` and `offsets`"
        )));
    };
    if let Estimator::Gigpo(params) = estimator {
        return gigpo(params, b, mask, offsets);
    }
    if b.groups.is_some() {
        return Err(MpoError::Inapplicable(format!(
            "`group_ids` do not apply to the {name} estimator (it baselines with the critic's values)"
        )));
    }
    let Some(values) = b.values else { return Err(MpoError::MissingValues { estimator: name }) };
    let turn = |out: crate::TurnOutput| Estimate {
        advantages: out.advantages,
        returns: Some(out.returns),
        turn_advantages: Some(out.turn_advantages),
        turns: Some(out.turns),
        per_trajectory: None,
        step_advantages: None,
        step_groups: None,
    };
    match estimator {
        Estimator::Mae(p) => {
            crate::mae_advantages_with_truncation(values, mask, offsets, b.rewards, b.truncated, p).map(turn)
        }
        Estimator::BiLevel(p) => {
            if b.truncated.is_some() {
                return Err(MpoError::Inapplicable(
                    "`truncated` does not apply to the bilevel estimator (RAGEN's bi-level GAE defines no truncation)"
                        .into(),
                ));
            }
            crate::bilevel_advantages(values, mask, offsets, b.rewards, p).map(turn)
        }
        Estimator::Gae(p) => {
            let out = crate::gae_advantages_with_truncation(values, mask, offsets, b.rewards, b.truncated, p)?;
            Ok(Estimate {
                advantages: out.advantages,
                returns: Some(out.returns),
                turn_advantages: None,
                turns: None,
                per_trajectory: None,
                step_advantages: None,
                step_groups: None,
            })
        }
        Estimator::Group(_) | Estimator::Gigpo(_) => unreachable!("matched above"),
    }
}

/// GiGPO's inputs checked and its kernel run: groups, anchors, and a reward per token or a
/// score per trajectory; no critic values, no truncation.
fn gigpo(params: &crate::GigpoParams, b: &Batch<'_>, mask: &[u8], offsets: &[i64]) -> Result<Estimate> {
    for (given, what) in [(b.values.is_some(), "`values`"), (b.truncated.is_some(), "`truncated`")] {
        if given {
            return Err(MpoError::Inapplicable(format!(
                "{what} does not apply to the gigpo estimator (critic-free: no values, no bootstrap)"
            )));
        }
    }
    let Some(groups) = b.groups else {
        return Err(MpoError::Input("the gigpo estimator needs `group_ids`: one group id per trajectory".into()));
    };
    let out = crate::gigpo_advantages(mask, offsets, b.rewards, groups, b.anchors, params)?;
    Ok(Estimate {
        returns: None,
        advantages: out.advantages,
        turn_advantages: Some(out.turn_advantages),
        turns: Some(out.turns),
        per_trajectory: Some(out.episode_advantages),
        step_advantages: Some(out.step_advantages),
        step_groups: Some(out.step_groups),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GaeParams, GroupParams, MaeParams};

    const MASK: [u8; 6] = [1, 1, 0, 1, 1, 1];
    const OFFSETS: [i64; 3] = [0, 3, 6];
    const VALUES: [f32; 6] = [0.1, 0.2, 0.0, -0.3, 0.4, 0.5];
    const SCORES: [f32; 2] = [1.0, -0.5];

    fn batch() -> Batch<'static> {
        Batch {
            tokens: Tokens::Flat { mask: &MASK, offsets: &OFFSETS },
            rewards: Rewards::Score(&SCORES),
            values: Some(&VALUES),
            truncated: None,
            groups: None,
            anchors: Anchors::default(),
        }
    }

    #[test]
    fn each_family_is_its_own_function() {
        let p = MaeParams::default();
        let out = estimate(&Estimator::Mae(p), &batch()).unwrap();
        let direct = crate::mae_advantages(&VALUES, &MASK, &OFFSETS, Rewards::Score(&SCORES), &p).unwrap();
        assert_eq!(out.advantages, direct.advantages);
        assert_eq!(out.turns, Some(direct.turns));
        let g = GaeParams::default();
        let out = estimate(&Estimator::Gae(g), &batch()).unwrap();
        let direct = crate::gae_advantages(&VALUES, &MASK, &OFFSETS, Rewards::Score(&SCORES), &g).unwrap();
        assert_eq!((out.advantages, out.returns), (direct.advantages, Some(direct.returns)));
        assert!(out.turns.is_none());
        let groups = Some(Groups { index: &[0, 0], n_groups: 1 });
        let b = Batch { values: None, groups, ..batch() };
        let out = estimate(&Estimator::Group(GroupParams::default()), &b).unwrap();
        let per = crate::group_advantages(&SCORES, &[0, 0], 1, &GroupParams::default()).unwrap();
        assert_eq!(out.advantages, crate::broadcast_to_tokens(&per, &MASK, &OFFSETS).unwrap());
        assert_eq!(out.per_trajectory, Some(per.clone()));
        // One policy token per trajectory: the tokens' advantages are the trajectories', once.
        let one_each = Batch { tokens: Tokens::OnePerTrajectory, ..b };
        let out = estimate(&Estimator::Group(GroupParams::default()), &one_each).unwrap();
        assert_eq!((Some(out.advantages), out.per_trajectory), (Some(per), None));
        let b = Batch { tokens: Tokens::Flat { mask: &[1, 1], offsets: &[0, 1, 2] }, ..one_each };
        let out = estimate(&Estimator::Group(GroupParams::default()), &b).unwrap();
        assert_eq!(Some(out.advantages), out.per_trajectory);
    }

    #[test]
    fn missing_and_inapplicable_inputs_are_refused() {
        let mae = Estimator::Mae(MaeParams::default());
        let e = estimate(&mae, &Batch { values: None, ..batch() }).unwrap_err();
        assert!(matches!(e, MpoError::MissingValues { estimator: "mae" }), "{e}");
        let groups = Some(Groups { index: &[0, 0], n_groups: 1 });
        assert!(matches!(estimate(&mae, &Batch { groups, ..batch() }), Err(MpoError::Inapplicable(_))));
        let group = Estimator::Group(GroupParams::default());
        assert!(matches!(estimate(&group, &batch()), Err(MpoError::Inapplicable(_))));
        assert!(matches!(estimate(&group, &Batch { values: None, ..batch() }), Err(MpoError::Input(_))));
        let tokens = Rewards::Token(&[0.0; 6]);
        let b = Batch { values: None, groups, rewards: tokens, ..batch() };
        assert!(matches!(estimate(&group, &b), Err(MpoError::Input(_))));
        // Only the group estimators take a batch without its tokens.
        let e = estimate(&mae, &Batch { tokens: Tokens::OnePerTrajectory, ..batch() }).unwrap_err();
        assert!(matches!(&e, MpoError::Input(m) if m.contains("`mask` and `offsets`")), "{e}");
        let bilevel = Estimator::BiLevel(crate::BiLevelParams::default());
        let b = Batch { truncated: Some(&[false, true]), ..batch() };
        assert!(matches!(estimate(&bilevel, &b), Err(MpoError::Inapplicable(_))));
        // Anchor states are gigpo's alone; gigpo refuses values and needs groups and anchors.
        let tokens = [7i64; 6];
        let anchors = Anchors { turn_state_ids: None, token_ids: Some(&tokens) };
        let e = estimate(&mae, &Batch { anchors, ..batch() }).unwrap_err();
        assert!(matches!(&e, MpoError::Inapplicable(m) if m.contains("`token_ids`")), "{e}");
        let gigpo = Estimator::Gigpo(crate::GigpoParams::default());
        assert!(matches!(estimate(&gigpo, &Batch { anchors, ..batch() }), Err(MpoError::Inapplicable(_))));
        let e = estimate(&gigpo, &Batch { anchors, values: None, ..batch() }).unwrap_err();
        assert!(matches!(&e, MpoError::Input(m) if m.contains("`group_ids`")), "{e}");
        let e = estimate(&gigpo, &Batch { values: None, groups, ..batch() }).unwrap_err();
        assert!(matches!(&e, MpoError::Input(m) if m.contains("`turn_state_ids`") && m.contains("`token_ids`")), "{e}");
        let out = estimate(&gigpo, &Batch { anchors, values: None, groups, ..batch() }).unwrap();
        assert_eq!(out.step_groups.map(|g| g.len()), Some(2));
        assert!(out.returns.is_none());
    }
}
