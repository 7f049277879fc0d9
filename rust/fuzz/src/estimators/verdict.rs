//! The estimator target's independent validator: the input rules of the estimators
//! (docs/estimators.md) written out, saying what the core must do with a [`Case`]
//! ([`judge`]) and whether an error it returns names a problem the case has, at a place
//! that has it ([`check_error`]).

use mpo_core::MpoError;

use super::{Case, Kind};
use crate::Failure;

/// Largest |number| of a "clean" input: its results cannot overflow f32.
const CLEAN: f32 = 1e4;

/// A problem the validator found, matched against the core's error.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Problem {
    Parameter(&'static str),
    Offsets,
    Length(&'static str),
    MaskValue,
    NonFiniteToken(&'static str),
    NonFiniteTrajectory(&'static str),
    ObservationReward,
    GroupIndex,
}

/// What the core must do with a case.
#[derive(Debug, Default)]
pub(super) struct Verdict {
    pub(super) problems: Vec<Problem>,
    /// Valid, but an error is as acceptable as a result (eps = 0, extreme numbers).
    pub(super) either: bool,
}

fn param(ok: bool, value: f64, name: &'static str, problems: &mut Vec<Problem>) {
    if !(ok && value.is_finite()) {
        problems.push(Problem::Parameter(name));
    }
}

fn unit_ok(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

fn is_clean(x: f32) -> bool {
    x.is_finite() && x.abs() <= CLEAN
}

/// The independent validator: the input rules of the estimators, written out.
pub(super) fn judge(c: &Case) -> Verdict {
    let mut v = Verdict::default();
    let p = &mut v.problems;
    match c.kind {
        Kind::Mae => {
            let m = &c.mae;
            param(unit_ok(m.lam), m.lam, "lam", p);
            param(unit_ok(m.lam_intra), m.lam_intra, "lam_intra", p);
            param(unit_ok(m.lam_critic), m.lam_critic, "lam_critic", p);
            param(m.gamma > 0.0 && m.gamma <= 1.0, m.gamma, "gamma", p);
            param(m.beta >= 0.0, m.beta, "beta", p);
            v.either |= m.beta > 10.0;
        }
        Kind::Gae => {
            let g = &c.gae;
            param(g.gamma > 0.0 && g.gamma <= 1.0, g.gamma, "gamma", p);
            param(unit_ok(g.lam), g.lam, "lam", p);
            param(unit_ok(g.lam_critic), g.lam_critic, "lam_critic", p);
            if let Some(a) = g.length_adaptive_alpha {
                param(a > 0.0, a, "length_adaptive_alpha", p);
            }
        }
        Kind::BiLevel => {
            let b = &c.bilevel;
            param(unit_ok(b.lam), b.lam, "lam", p);
            param(b.gamma > 0.0 && b.gamma <= 1.0, b.gamma, "gamma", p);
            param(b.high_level_gamma > 0.0 && b.high_level_gamma <= 1.0, b.high_level_gamma, "high_level_gamma", p);
        }
        Kind::Group => {
            let e = c.group.eps;
            param(e > 0.0, e, "eps", p);
        }
        Kind::Broadcast | Kind::Segment => {}
    }
    if c.kind == Kind::Group {
        let scores = c.scores.as_deref().unwrap_or(&[]);
        if c.group_index.len() != scores.len() {
            p.push(Problem::Length("group_index"));
            return v;
        }
        for (j, (&s, &g)) in scores.iter().zip(&c.group_index).enumerate() {
            let _ = j;
            if !s.is_finite() {
                p.push(Problem::NonFiniteTrajectory("scores"));
            }
            if g < 0 || g >= c.n_groups as i64 {
                p.push(Problem::GroupIndex);
            }
            v.either |= !is_clean(s);
        }
        return v;
    }

    // The layout: offsets start at 0, never decrease, end at the number of tokens.
    let o = &c.offsets;
    let n_tok = c.mask.len() as i64;
    if o.is_empty() || o[0] != 0 || o.windows(2).any(|w| w[1] < w[0]) || o.last() != Some(&n_tok) {
        p.push(Problem::Offsets);
        return v;
    }
    let n_traj = o.len() - 1;
    let reads_values = matches!(c.kind, Kind::Mae | Kind::Gae | Kind::BiLevel);
    if reads_values {
        if c.values.len() != c.mask.len() {
            p.push(Problem::Length("values"));
        }
        match &c.scores {
            Some(s) if s.len() != n_traj => p.push(Problem::Length("scores")),
            None if c.rewards.len() != c.mask.len() => p.push(Problem::Length("rewards")),
            _ => {}
        }
    }
    if c.kind == Kind::Broadcast && c.per_traj.len() != n_traj {
        p.push(Problem::Length("per_trajectory"));
    }
    if !p.is_empty() {
        return v;
    }
    if c.mask.iter().any(|&m| m > 1) {
        p.push(Problem::MaskValue);
    }
    match c.kind {
        Kind::Broadcast => {
            // broadcast_to_tokens refuses NaN and inf per-trajectory values (issue 11 item 7),
            // checked per trajectory alongside the mask, so either may be reported first.
            if c.per_traj.iter().any(|x| !x.is_finite()) {
                p.push(Problem::NonFiniteTrajectory("per_trajectory"));
            }
        }
        Kind::Mae | Kind::Gae | Kind::BiLevel => {
            for q in 0..c.mask.len() {
                if c.mask[q] == 1 {
                    if !c.values[q].is_finite() {
                        p.push(Problem::NonFiniteToken("values"));
                    }
                    v.either |= !is_clean(c.values[q]);
                }
                if c.scores.is_none() {
                    let r = c.rewards[q];
                    if c.mask[q] == 1 && !r.is_finite() {
                        p.push(Problem::NonFiniteToken("rewards"));
                    }
                    if c.mask[q] == 0 && r != 0.0 {
                        p.push(if r.is_finite() {
                            Problem::ObservationReward
                        } else {
                            Problem::NonFiniteToken("rewards")
                        });
                    }
                    v.either |= !is_clean(r);
                }
            }
            if let Some(s) = &c.scores {
                for &x in s {
                    if !x.is_finite() {
                        p.push(Problem::NonFiniteTrajectory("scores"));
                    }
                    v.either |= !is_clean(x);
                }
            }
        }
        Kind::Segment | Kind::Group => {}
    }
    v
}

/// Checks that `e` is one of `problems` and that the place it names really has it.
pub(super) fn check_error(c: &Case, e: &MpoError, problems: &[Problem]) -> Result<(), Failure> {
    let msg = e.to_string();
    if msg.is_empty() || msg.contains('\n') {
        return Err(Failure::new(format!("error message is not one line: {msg:?}")));
    }
    let place_ok = |at: &mpo_core::TokenAt| {
        at.trajectory + 1 < c.offsets.len()
            && (c.offsets[at.trajectory]..c.offsets[at.trajectory + 1]).contains(&(at.token as i64))
            && at.position as i64 == at.token as i64 - c.offsets[at.trajectory]
    };
    let (problem, place) = match e {
        MpoError::Parameter { name, .. } => (Problem::Parameter(name), true),
        MpoError::Offsets(_) => (Problem::Offsets, true),
        MpoError::Length { arg, got, .. } => {
            let actual = match *arg {
                "values" => c.values.len(),
                "rewards" => c.rewards.len(),
                "scores" => c.scores.as_ref().map_or(usize::MAX, Vec::len),
                "per_trajectory" => c.per_traj.len(),
                "group_index" => c.group_index.len(),
                _ => usize::MAX,
            };
            (Problem::Length(arg), *got == actual)
        }
        MpoError::MaskValue { value, at } => {
            (Problem::MaskValue, place_ok(at) && c.mask[at.token] == *value && *value > 1)
        }
        MpoError::NonFiniteToken { arg, value, at } => {
            let here = match *arg {
                "values" => c.values.get(at.token).copied(),
                "rewards" => c.rewards.get(at.token).copied(),
                _ => None,
            };
            let same = here.is_some_and(|h| h.to_bits() == value.to_bits() && !h.is_finite());
            (Problem::NonFiniteToken(arg), place_ok(at) && same)
        }
        MpoError::NonFiniteTrajectory { arg, value, trajectory } => {
            let here = if *arg == "per_trajectory" {
                c.per_traj.get(*trajectory).copied()
            } else {
                c.scores.as_ref().and_then(|s| s.get(*trajectory)).copied()
            };
            (Problem::NonFiniteTrajectory(arg), here.is_some_and(|h| h.to_bits() == value.to_bits()))
        }
        MpoError::ObservationReward { value, at } => {
            let ok = place_ok(at) && c.mask[at.token] == 0 && c.rewards[at.token].to_bits() == value.to_bits();
            (Problem::ObservationReward, ok)
        }
        MpoError::GroupIndex { value, trajectory, n_groups } => {
            let ok = c.group_index.get(*trajectory) == Some(value) && *n_groups == c.n_groups;
            (Problem::GroupIndex, ok)
        }
        // Anything else (capacity, and the errors other changes add) is judged by the
        // caller: acceptable only where any error is.
        _ => return Err(Failure::new(format!("unexpected error kind: {msg}"))),
    };
    if !problems.contains(&problem) {
        return Err(Failure::new(format!(
            "the error names a problem the input does not have: {msg} (problems: {problems:?})"
        )));
    }
    if !place {
        return Err(Failure::new(format!("the error names the wrong place: {msg}")));
    }
    Ok(())
}
