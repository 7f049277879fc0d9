//! Token-level GAE over policy tokens with verl's multi-turn convention (spec §2.2):
//! observation tokens are skipped, so a policy token bootstraps from the next *policy*
//! token's value, across observations.

use rayon::prelude::*;

use crate::error::Result;
use crate::layout::{check_trajectory, Layout, Rewards};
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
    let mut advantages = vec![0f32; n_tokens];
    let mut returns = vec![0f32; n_tokens];
    let parts = layout
        .split_tokens(&mut advantages)
        .into_par_iter()
        .zip(layout.split_tokens(&mut returns));
    try_for_each_trajectory(parts, |j, (adv, ret)| {
        let (n_policy, last_policy) = check_trajectory(&layout, mask, values, rewards, j)?;
        let rewards = rewards.of_trajectory(j, last_policy);
        let range = layout.range(j);
        let base = range.start;
        let gamma = params.gamma;
        let gamma_lam = gamma * params.lam_for(n_policy);
        let gamma_lam_critic = gamma * params.lam_critic;
        let (mut next_v, mut a, mut c) = (0.0f64, 0.0f64, 0.0f64);
        for q in range.rev() {
            if mask[q] == 0 {
                continue;
            }
            let v = values[q] as f64;
            let delta = rewards.get(q) + gamma * next_v - v;
            a = delta + gamma_lam * a;
            c = delta + gamma_lam_critic * c;
            adv[q - base] = a as f32;
            ret[q - base] = (v + c) as f32;
            next_v = v;
        }
        Ok(())
    })?;
    Ok(GaeOutput { advantages, returns })
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
