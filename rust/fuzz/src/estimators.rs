//! The estimator fuzz target: bytes → a structured call of one mpo-core entry point
//! (segment_turns, mae_advantages, gae_advantages, bilevel_advantages, group_advantages,
//! broadcast_to_tokens)
//! → the result checked against the formulas and input rules (docs/estimators.md).
//!
//! Inputs are mostly well formed, with adversarial parts mixed in: NaN/±inf/huge/subnormal
//! numbers, mask bytes other than 0/1, broken offsets, wrong lengths, rewards on
//! observation tokens, parameters outside their domain, bad group indices. An independent
//! validator ([`verdict`]) says what the core must do with each:
//!
//! - invalid input: a typed error naming one of the problems the validator found, at a
//!   place that really has it (argument, trajectory, token, position);
//! - valid input with moderate numbers ("clean"): success, outputs of the right length,
//!   finite and equal to the slow reference ([`crate::reference`]) to 1e-5 relative; MAE,
//!   GAE and bi-level GAE bitwise equal on a one-thread pool;
//! - valid input with extreme numbers or `eps` = 0: success with finite outputs, or any
//!   typed error (the core may refuse to produce a non-finite result).
//!
//! Never a panic (caught and reported by the caller, see [`crate::guarded`]).

use std::sync::OnceLock;

use mpo_core::{MpoError, Rewards};

use crate::{reference, Failure};

mod case;
mod verdict;

pub use case::{Case, Kind};
use verdict::{check_error, judge};

/// Whether a non-finite output from accepted input is tolerated (counted as
/// `ok-nonfinite`) instead of failing the run. The core refuses such results (issue 11
/// item 7), so any non-finite output fails.
pub const ALLOW_NONFINITE_OUTPUT: bool = false;

fn close(got: f32, want: f64) -> bool {
    (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs())
}

fn compare(name: &str, got: &[f32], want: &[f64]) -> Result<(), Failure> {
    if got.len() != want.len() {
        return Err(Failure::new(format!("`{name}` has length {}, expected {}", got.len(), want.len())));
    }
    match got.iter().zip(want).position(|(&g, &w)| !close(g, w)) {
        None => Ok(()),
        Some(k) => Err(Failure::new(format!("`{name}`[{k}] = {} but the reference gives {}", got[k], want[k]))),
    }
}

fn all_finite(xs: &[f32]) -> bool {
    xs.iter().all(|x| x.is_finite())
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn one_thread() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool"))
}

/// What a call returned, for the counts.
enum Output {
    Turns(mpo_core::Turns),
    Mae(mpo_core::MaeOutput),
    Gae(mpo_core::GaeOutput),
    BiLevel(mpo_core::BiLevelOutput),
    Flat(Vec<f32>),
}

fn call(c: &Case) -> Result<Output, MpoError> {
    call_with(c, c.turn_rewards.is_some())
}

/// The call; `per_turn`: MAE/GAE get the per-turn rewards (else the token rewards).
fn call_with(c: &Case, per_turn: bool) -> Result<Output, MpoError> {
    let truncated = Some(c.truncated.as_slice()).filter(|t| !t.is_empty());
    let placed = match (&c.turn_rewards, per_turn) {
        (Some(t), true) => {
            let turn = mpo_core::TurnRewards { rewards: t, offsets: None };
            Some(mpo_core::place_turn_rewards(&c.mask, &c.offsets, turn, None)?)
        }
        _ => None,
    };
    let source = placed.as_deref().map_or_else(|| c.reward_source(), Rewards::Token);
    let (values, mask, offsets) = (&c.values, &c.mask, &c.offsets);
    Ok(match c.kind {
        Kind::Segment => Output::Turns(mpo_core::segment_turns(&c.mask, &c.offsets)?),
        Kind::Mae => {
            Output::Mae(mpo_core::mae_advantages_with_truncation(values, mask, offsets, source, truncated, &c.mae)?)
        }
        Kind::Gae => {
            Output::Gae(mpo_core::gae_advantages_with_truncation(values, mask, offsets, source, truncated, &c.gae)?)
        }
        Kind::BiLevel => Output::BiLevel(mpo_core::bilevel_advantages(values, mask, offsets, source, &c.bilevel)?),
        Kind::Group => Output::Flat(mpo_core::group_advantages(
            c.scores.as_deref().unwrap_or(&[]),
            &c.group_index,
            c.n_groups,
            &c.group,
        )?),
        Kind::Broadcast => Output::Flat(mpo_core::broadcast_to_tokens(&c.per_traj, &c.mask, &c.offsets)?),
    })
}

/// Runs one input and checks it. `Ok` is the outcome's class, for the counts.
/// `deep` also runs the one-thread determinism check.
pub fn check(data: &[u8], deep: bool) -> Result<&'static str, Failure> {
    let Ok(c) = Case::decode(data) else {
        return Ok("undecodable");
    };
    check_case(&c, deep)
}

pub fn check_case(c: &Case, deep: bool) -> Result<&'static str, Failure> {
    let verdict = judge(c);
    let result = call(c);
    let out = match result {
        Err(e) => {
            // A result that would overflow float32 is refused after the inputs passed their
            // checks (issue 11 item 7): a typed, one-line error, allowed for any input.
            // TODO(fuzz): tell which inputs can overflow, and require it only for them.
            if matches!(e, MpoError::NonFiniteOutput { .. } | MpoError::NonFiniteTrajectoryOutput { .. }) {
                let msg = e.to_string();
                if msg.is_empty() || msg.contains('\n') {
                    return Err(Failure::new(format!("error message is not one line: {msg:?}")));
                }
                return Ok("error-overflow");
            }
            if !verdict.problems.is_empty() {
                check_error(c, &e, &verdict.problems)?;
                return Ok(error_class(&e));
            }
            if verdict.either {
                return Ok("error-on-extreme-input");
            }
            return Err(Failure::new(format!("valid input refused: {e}")));
        }
        Ok(out) => out,
    };
    if !verdict.problems.is_empty() {
        return Err(Failure::new(format!("invalid input accepted (problems: {:?})", verdict.problems)));
    }
    let n_tok = c.mask.len();
    let finite = match &out {
        Output::Turns(t) => {
            let r = reference::segment(&c.mask, &c.offsets);
            if (&t.starts, &t.ends, &t.traj_offsets, &t.token_turn)
                != (&r.starts, &r.ends, &r.traj_offsets, &r.token_turn)
            {
                return Err(Failure::new("segment_turns differs from the reference".into()));
            }
            true
        }
        Output::Mae(o) => {
            let lens = [o.advantages.len(), o.returns.len(), o.turns.token_turn.len()];
            if lens != [n_tok; 3] || o.turn_advantages.len() != o.turns.n_turns() {
                return Err(Failure::new(format!(
                    "MAE output lengths {lens:?} / {} turns, expected {n_tok}",
                    o.turn_advantages.len()
                )));
            }
            let finite = all_finite(&o.advantages) && all_finite(&o.returns) && all_finite(&o.turn_advantages);
            if !verdict.either {
                let m = &c.mae;
                let r = reference::token_rewards(
                    &c.mask,
                    &c.offsets,
                    Some(&c.rewards).filter(|_| c.scores.is_none()).map(|v| v.as_slice()),
                    c.scores.as_deref(),
                );
                let want = reference::mae_truncated(
                    &c.values,
                    &c.mask,
                    &c.offsets,
                    &r,
                    &c.truncated,
                    m.lam,
                    m.lam_intra,
                    m.beta,
                    m.gamma,
                    m.lam_critic,
                );
                compare("advantages", &o.advantages, &want.advantages)?;
                compare("returns", &o.returns, &want.returns)?;
                compare("turn_advantages", &o.turn_advantages, &want.turn_advantages)?;
                let t = reference::segment(&c.mask, &c.offsets);
                if o.turns.token_turn != t.token_turn || o.turns.starts != t.starts {
                    return Err(Failure::new("MAE turns differ from the reference segmentation".into()));
                }
            }
            if c.turn_rewards.is_some() {
                match call_with(c, false) {
                    Ok(Output::Mae(a))
                        if bits(&a.advantages) == bits(&o.advantages) && bits(&a.returns) == bits(&o.returns) => {}
                    _ => return Err(Failure::new("MAE with per-turn rewards differs from token rewards".into())),
                }
            }
            if deep {
                let again = one_thread().install(|| call(c));
                match again {
                    Ok(Output::Mae(a))
                        if bits(&a.advantages) == bits(&o.advantages) && bits(&a.returns) == bits(&o.returns) => {}
                    _ => return Err(Failure::new("MAE differs on a one-thread pool".into())),
                }
            }
            finite
        }
        Output::Gae(o) => {
            if o.advantages.len() != n_tok || o.returns.len() != n_tok {
                return Err(Failure::new(format!(
                    "GAE output lengths {} / {}, expected {n_tok}",
                    o.advantages.len(),
                    o.returns.len()
                )));
            }
            let finite = all_finite(&o.advantages) && all_finite(&o.returns);
            if !verdict.either {
                let g = &c.gae;
                let rw = if c.scores.is_none() { Some(c.rewards.as_slice()) } else { None };
                let r = reference::token_rewards(&c.mask, &c.offsets, rw, c.scores.as_deref());
                let (adv, ret) = reference::gae_truncated(
                    &c.values,
                    &c.mask,
                    &c.offsets,
                    &r,
                    &c.truncated,
                    g.gamma,
                    g.lam,
                    g.lam_critic,
                    g.length_adaptive_alpha,
                );
                compare("advantages", &o.advantages, &adv)?;
                compare("returns", &o.returns, &ret)?;
            }
            // Observation tokens: 0 and 0.
            if (0..n_tok).any(|q| c.mask[q] == 0 && (o.advantages[q] != 0.0 || o.returns[q] != 0.0)) {
                return Err(Failure::new("GAE wrote a nonzero result on an observation token".into()));
            }
            if c.turn_rewards.is_some() {
                match call_with(c, false) {
                    Ok(Output::Gae(a))
                        if bits(&a.advantages) == bits(&o.advantages) && bits(&a.returns) == bits(&o.returns) => {}
                    _ => return Err(Failure::new("GAE with per-turn rewards differs from token rewards".into())),
                }
            }
            if deep {
                match one_thread().install(|| call(c)) {
                    Ok(Output::Gae(a))
                        if bits(&a.advantages) == bits(&o.advantages) && bits(&a.returns) == bits(&o.returns) => {}
                    _ => return Err(Failure::new("GAE differs on a one-thread pool".into())),
                }
            }
            finite
        }
        Output::BiLevel(o) => {
            let lens = [o.advantages.len(), o.returns.len(), o.turns.token_turn.len()];
            if lens != [n_tok; 3] || o.turn_advantages.len() != o.turns.n_turns() {
                return Err(Failure::new(format!(
                    "bi-level GAE output lengths {lens:?} / {} turns, expected {n_tok}",
                    o.turn_advantages.len()
                )));
            }
            let finite = all_finite(&o.advantages) && all_finite(&o.returns) && all_finite(&o.turn_advantages);
            if !verdict.either {
                let b = &c.bilevel;
                let rw = if c.scores.is_none() { Some(c.rewards.as_slice()) } else { None };
                let r = reference::token_rewards(&c.mask, &c.offsets, rw, c.scores.as_deref());
                let want = reference::bilevel(&c.values, &c.mask, &c.offsets, &r, b.lam, b.gamma, b.high_level_gamma);
                compare("advantages", &o.advantages, &want.advantages)?;
                compare("returns", &o.returns, &want.returns)?;
                compare("turn_advantages", &o.turn_advantages, &want.turn_advantages)?;
                let t = reference::segment(&c.mask, &c.offsets);
                if o.turns
                    != (mpo_core::Turns {
                        starts: t.starts,
                        ends: t.ends,
                        traj_offsets: t.traj_offsets,
                        token_turn: t.token_turn,
                    })
                {
                    return Err(Failure::new("bi-level GAE turns differ from the reference segmentation".into()));
                }
            }
            if (0..n_tok).any(|q| c.mask[q] == 0 && (o.advantages[q] != 0.0 || o.returns[q] != 0.0)) {
                return Err(Failure::new("bi-level GAE wrote a nonzero result on an observation token".into()));
            }
            if deep {
                match one_thread().install(|| call(c)) {
                    Ok(Output::BiLevel(a))
                        if bits(&a.advantages) == bits(&o.advantages)
                            && bits(&a.returns) == bits(&o.returns)
                            && bits(&a.turn_advantages) == bits(&o.turn_advantages) => {}
                    _ => return Err(Failure::new("bi-level GAE differs on a one-thread pool".into())),
                }
            }
            finite
        }
        Output::Flat(adv) if c.kind == Kind::Group => {
            let scores = c.scores.as_deref().unwrap_or(&[]);
            if adv.len() != scores.len() {
                return Err(Failure::new(format!("group output has length {}, expected {}", adv.len(), scores.len())));
            }
            if !verdict.either {
                let g = &c.group;
                compare(
                    "group advantages",
                    adv,
                    &reference::group(scores, &c.group_index, g.norm_std, g.eps, g.leave_one_out),
                )?;
            }
            all_finite(adv)
        }
        Output::Flat(out) => {
            if out.len() != n_tok {
                return Err(Failure::new(format!("broadcast output has length {}, expected {n_tok}", out.len())));
            }
            for j in 0..c.offsets.len() - 1 {
                for q in c.offsets[j] as usize..c.offsets[j + 1] as usize {
                    let want = if c.mask[q] != 0 { c.per_traj[j] } else { 0.0 };
                    if out[q].to_bits() != want.to_bits() {
                        return Err(Failure::new(format!("broadcast token {q} is {}, expected {want}", out[q])));
                    }
                }
            }
            all_finite(out)
        }
    };
    if !finite {
        if !verdict.either {
            return Err(Failure::new("non-finite output from clean input".into()));
        }
        if !ALLOW_NONFINITE_OUTPUT {
            return Err(Failure::new("non-finite output from accepted input".into()));
        }
        return Ok("ok-nonfinite");
    }
    Ok(match c.kind {
        Kind::Segment => "ok-segment",
        Kind::Mae => "ok-mae",
        Kind::Gae => "ok-gae",
        Kind::Group => "ok-group",
        Kind::Broadcast => "ok-broadcast",
        Kind::BiLevel => "ok-bilevel",
    })
}

fn error_class(e: &MpoError) -> &'static str {
    match e {
        MpoError::Parameter { .. } => "error-parameter",
        MpoError::Offsets(_) => "error-offsets",
        MpoError::Length { .. } => "error-length",
        MpoError::MaskValue { .. } => "error-mask",
        MpoError::NonFiniteToken { .. } | MpoError::NonFiniteTrajectory { .. } => "error-non-finite",
        MpoError::ObservationReward { .. } => "error-observation-reward",
        MpoError::GroupIndex { .. } => "error-group-index",
        _ => "error-other",
    }
}

#[cfg(test)]
mod tests;
