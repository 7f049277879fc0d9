//! Token-level GAE over policy tokens with verl's multi-turn convention (spec §2.2):
//! observation tokens are skipped, so a policy token bootstraps from the next *policy*
//! token's value, across observations.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::error::Result;
use crate::compact::{with_scratch, Compact};
use crate::layout::{first_problem, score_ok, Layout, RewardAt, Rewards, RewardsVisitor};
use crate::output::OutBuf;
use crate::params::GaeParams;
use crate::parallel::try_for_each_trajectory;

/// Per-token advantages and value targets, 0 off-policy.
#[derive(Debug, Clone, PartialEq)]
pub struct GaeOutput {
    pub advantages: Vec<f32>,
    pub returns: Vec<f32>,
}

pub fn gae_advantages(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    params: &GaeParams,
) -> Result<GaeOutput> {
    params.validate()?;
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_tokens("values", values.len())?;
    rewards.check_shape(&layout)?;

    let n_tokens = layout.n_tokens();
    let mut advantages = OutBuf::<f32>::new(n_tokens);
    let mut returns = OutBuf::<f32>::new(n_tokens);
    let parts = advantages.parts(offsets).into_par_iter().zip(returns.parts(offsets));
    try_for_each_trajectory(parts, |j, (adv, ret)| {
        let range = layout.range(j);
        let traj_mask = &mask[range.clone()];
        let last_policy = traj_mask.iter().rposition(|&m| m != 0).map(|k| range.start + k);
        let traj = Trajectory { base: range.start, mask: traj_mask, values, source: rewards, params, adv, ret };
        if !rewards.with_trajectory(j, last_policy, traj) {
            first_problem(&layout, mask, values, rewards, j)?;
        }
        score_ok(rewards, j)
    })?;
    // SAFETY: `Trajectory::visit` wrote every token of every trajectory (or failed).
    let (advantages, returns) = unsafe { (advantages.assume_written(), returns.assume_written()) };
    Ok(GaeOutput { advantages, returns })
}

struct Trajectory<'a, 'o> {
    base: usize,
    mask: &'a [u8],
    values: &'a [f32],
    source: Rewards<'a>,
    params: &'a GaeParams,
    adv: &'o mut [MaybeUninit<f32>],
    ret: &'o mut [MaybeUninit<f32>],
}

impl RewardsVisitor<bool> for Trajectory<'_, '_> {
    /// Gathers the policy tokens, runs one backward sweep over them and scatters the
    /// results (see [`crate::compact`]). Returns whether the fast input checks passed;
    /// the outputs are written only if they did.
    fn visit<R: RewardAt>(self, rewards: R) -> bool {
        let Trajectory { base, mask, values, source, params, adv, ret } = self;
        with_scratch(|cs| {
            if !cs.gather(mask, base, values, source, rewards) {
                return false;
            }
            cs.prepare_results();
            let Compact { values, rewards, advantages, returns, .. } = &mut *cs;
            let gamma = params.gamma;
            let gamma_lam = gamma * params.lam_for(values.len());
            let gamma_lam_critic = gamma * params.lam_critic;
            // A policy token bootstraps from the next policy token's value, across
            // observations: in the compact order that is simply the next element.
            let (mut next_v, mut a, mut c) = (0.0f64, 0.0f64, 0.0f64);
            let inputs = values.iter().zip(rewards.iter());
            let outputs = advantages.iter_mut().zip(returns.iter_mut());
            for ((&v, &r), (adv, ret)) in inputs.zip(outputs).rev() {
                let delta = r + gamma * next_v - v;
                a = delta + gamma_lam * a;
                c = delta + gamma_lam_critic * c;
                *adv = a as f32;
                *ret = (v + c) as f32;
                next_v = v;
            }
            cs.scatter(adv, ret);
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observation_tokens_are_skipped() {
        // policy values 1, 2 | obs | 3; reward 1 at the end; γ = 0.5, λ = 0.5.
        let values = [1.0, 2.0, 99.0, 3.0];
        let mask = [1, 1, 0, 1];
        let rewards = [0.0, 0.0, 0.0, 1.0];
        let p = GaeParams { gamma: 0.5, lam: 0.5, lam_critic: 0.5, length_adaptive_alpha: None };
        let out = gae_advantages(&values, &mask, &[0, 4], Rewards::Token(&rewards), &p).unwrap();
        // δ3 = 1 − 3 = −2; δ1 = 0.5·3 − 2 = −0.5; δ0 = 0.5·2 − 1 = 0.
        let a3 = -2.0;
        let a1 = -0.5 + 0.25 * a3;
        let a0 = 0.0 + 0.25 * a1;
        assert_eq!(out.advantages, vec![a0 as f32, a1 as f32, 0.0, a3 as f32]);
        assert_eq!(out.returns, vec![(a0 + 1.0) as f32, (a1 + 2.0) as f32, 0.0, (a3 + 3.0) as f32]);
    }

    #[test]
    fn lam_one_gives_returns_minus_values() {
        let values = [0.3, -0.2, 0.0, 0.7];
        let mask = [1, 1, 0, 1];
        let p = GaeParams { lam: 1.0, ..Default::default() };
        let out = gae_advantages(&values, &mask, &[0, 4], Rewards::Score(&[1.0]), &p).unwrap();
        for q in [0, 1, 3] {
            assert!((out.advantages[q] - (1.0 - values[q])).abs() < 1e-6);
            assert!((out.returns[q] - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn length_adaptive_lambda() {
        let p = GaeParams { length_adaptive_alpha: Some(0.05), ..Default::default() };
        assert!((p.lam_for(200) - 0.9).abs() < 1e-12);
        assert_eq!(p.lam_for(10), 0.0);
    }
}
