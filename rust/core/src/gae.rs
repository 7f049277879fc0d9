//! Token-level GAE over policy tokens with verl's multi-turn convention (docs/estimators.md):
//! observation tokens are skipped, so a policy token bootstraps from the next *policy*
//! token's value, across observations.

use std::ops::Range;

use rayon::prelude::*;

use crate::compact::{with_scratch_pair, Compact};
use crate::error::Result;
use crate::layout::{first_problem, score_ok, Layout, RewardAt, Rewards, RewardsVisitor};
use crate::output::OutBuf;
use crate::parallel::try_for_each_chunk;
use crate::params::GaeParams;

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
    gae_advantages_with_truncation(values, mask, offsets, rewards, None, params)
}

/// [`gae_advantages`] where `truncated[j]` (one per trajectory; `None`: none truncated)
/// marks a trajectory cut off before its episode ended: its last policy token bootstraps
/// from its own value, `δ_last = r_last + γ·V_last − V_last`, in place of `r_last − V_last`;
/// advantages and returns follow from the same δ. A trajectory not truncated is computed
/// bitwise as before.
pub fn gae_advantages_with_truncation(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    truncated: Option<&[bool]>,
    params: &GaeParams,
) -> Result<GaeOutput> {
    params.validate()?;
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_tokens("values", values.len())?;
    rewards.check_shape(&layout)?;
    if let Some(t) = truncated {
        layout.expect_trajectories("truncated", t.len())?;
    }

    let n_tokens = layout.n_tokens();
    let mut advantages = OutBuf::<f32>::new(n_tokens);
    let mut returns = OutBuf::<f32>::new(n_tokens);
    let parts = advantages.parts(offsets).into_par_iter().zip(returns.parts(offsets));
    // Trajectories go two at a time: the recursion is latency-bound (a multiply and an add
    // per token on each of two chains), so two trajectories' chains run interleaved.
    try_for_each_chunk(parts, 2, |first, chunk| {
        with_scratch_pair(|scratch| {
            let mut chains = [Chain::default(), Chain::default()];
            // The chunk's trajectories with good inputs, up to the first bad one, whose
            // error waits until the ones before it are checked for overflow (the lowest
            // trajectory's error is the one reported).
            let mut good = 0;
            let mut input_error = None;
            for (k, cs) in scratch.iter_mut().enumerate().take(chunk.len()) {
                let j = first + k;
                let range = layout.range(j);
                let traj_mask = &mask[range.clone()];
                let gather = Gather { base: range.start, mask: traj_mask, values, source: rewards, cs: &mut *cs };
                let checked = if rewards.with_trajectory(j, traj_mask, range.start, gather) {
                    Ok(())
                } else {
                    first_problem(&layout, mask, values, rewards, j)
                };
                if let Err(e) = checked.and_then(|()| score_ok(rewards, j)) {
                    input_error = Some(e);
                    break;
                }
                cs.prepare_results();
                // A truncated trajectory's last policy token bootstraps from its own value.
                let bootstrap = match cs.values.last() {
                    Some(&last) if truncated.is_some_and(|t| t[j]) => last,
                    _ => 0.0,
                };
                chains[k] = Chain::new(params, cs.n_policy(), bootstrap);
                good += 1;
            }
            let [a, b] = scratch;
            let [chain_a, chain_b] = &mut chains;
            match good {
                2 => sweep_pair(a, chain_a, b, chain_b),
                1 => sweep(a, chain_a, a.n_policy()),
                _ => {}
            }
            for (k, ((adv, ret), cs)) in chunk.into_iter().zip(scratch.iter()).take(good).enumerate() {
                if !cs.scatter(adv, ret) {
                    let j = first + k;
                    return Err(cs.overflow(j, layout.range(j).start));
                }
            }
            input_error.map_or(Ok(()), Err)
        })
    })?;
    // SAFETY: every trajectory was gathered, swept and scattered (or the call failed).
    let (advantages, returns) = unsafe { (advantages.assume_written(), returns.assume_written()) };
    Ok(GaeOutput { advantages, returns })
}

/// Pass 1 of one trajectory (see [`crate::compact`]), generic over the reward reader.
struct Gather<'a, 's> {
    base: usize,
    mask: &'a [u8],
    values: &'a [f32],
    source: Rewards<'a>,
    cs: &'s mut Compact,
}

impl RewardsVisitor<bool> for Gather<'_, '_> {
    /// Whether the fast input checks passed.
    fn visit<R: RewardAt>(self, rewards: R) -> bool {
        self.cs.gather(self.mask, self.base, self.values, self.source, rewards)
    }
}

/// The backward recursions of one trajectory. A policy token bootstraps from the next
/// policy token's value, across observations: in the gathered order, the next element.
#[derive(Default)]
struct Chain {
    gamma: f64,
    gamma_lam: f64,
    gamma_lam_critic: f64,
    next_v: f64,
    a: f64,
    c: f64,
}

impl Chain {
    /// `bootstrap` is the value after the last policy token: 0, or V_last if truncated.
    fn new(params: &GaeParams, n_policy: usize, bootstrap: f64) -> Self {
        let gamma = params.gamma;
        Chain {
            gamma,
            gamma_lam: gamma * params.lam_for(n_policy),
            gamma_lam_critic: gamma * params.lam_critic,
            next_v: bootstrap,
            ..Chain::default()
        }
    }

    /// One token, last to first: its advantage and value target.
    #[inline(always)]
    fn step(&mut self, v: f64, r: f64) -> (f32, f32) {
        let delta = r + self.gamma * self.next_v - v;
        self.a = delta + self.gamma_lam * self.a;
        self.c = delta + self.gamma_lam_critic * self.c;
        self.next_v = v;
        (self.a as f32, (v + self.c) as f32)
    }
}

/// The gathered tokens `tokens` of `cs` (its inputs, and its results to write).
#[inline(always)]
fn lanes(
    cs: &mut Compact,
    tokens: Range<usize>,
) -> impl DoubleEndedIterator<Item = ((&f64, &f64), (&mut f32, &mut f32))> + ExactSizeIterator {
    let Compact { values, rewards, advantages, returns, .. } = cs;
    let inputs = values[tokens.clone()].iter().zip(&rewards[tokens.clone()]);
    inputs.zip(advantages[tokens.clone()].iter_mut().zip(&mut returns[tokens]))
}

/// Pass 2 for tokens `..end` of one trajectory, last to first.
fn sweep(cs: &mut Compact, chain: &mut Chain, end: usize) {
    for ((&v, &r), (adv, ret)) in lanes(cs, 0..end).rev() {
        (*adv, *ret) = chain.step(v, r);
    }
}

/// Pass 2 for two trajectories: their last `min(len)` tokens interleaved, then the rest of
/// the longer one. Each chain sees its own tokens in the same order as alone.
fn sweep_pair(a: &mut Compact, chain_a: &mut Chain, b: &mut Compact, chain_b: &mut Chain) {
    let (na, nb) = (a.n_policy(), b.n_policy());
    let common = na.min(nb);
    for (((&v1, &r1), (adv1, ret1)), ((&v2, &r2), (adv2, ret2))) in
        lanes(a, na - common..na).zip(lanes(b, nb - common..nb)).rev()
    {
        (*adv1, *ret1) = chain_a.step(v1, r1);
        (*adv2, *ret2) = chain_b.step(v2, r2);
    }
    sweep(a, chain_a, na - common);
    sweep(b, chain_b, nb - common);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{MpoError, TokenAt};

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
    fn a_truncated_trajectory_bootstraps_from_its_last_value() {
        let values = [1.0, 2.0, 99.0, 3.0, 7.0];
        let mask = [1, 1, 0, 1, 0];
        let rewards = [0.0, 0.0, 0.0, 1.0, 0.0];
        let p = GaeParams { gamma: 0.5, lam: 0.5, lam_critic: 0.5, length_adaptive_alpha: None };
        let run = |t: Option<&[bool]>| {
            gae_advantages_with_truncation(&values, &mask, &[0, 5], Rewards::Token(&rewards), t, &p).unwrap()
        };
        let plain = gae_advantages(&values, &mask, &[0, 5], Rewards::Token(&rewards), &p).unwrap();
        assert_eq!(run(Some(&[false])), plain);
        let cut = run(Some(&[true]));
        // δ3 = 1 + 0.5·3 − 3 = −0.5 (the value of the last policy token, not of the
        // observation after it); δ1 = 0.5·3 − 2 = −0.5; δ0 = 0.
        let a3 = -0.5;
        let a1 = -0.5 + 0.25 * a3;
        let a0 = 0.0 + 0.25 * a1;
        assert_eq!(cut.advantages, vec![a0 as f32, a1 as f32, 0.0, a3 as f32, 0.0]);
        assert_eq!(cut.returns[3], 2.5);
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
    fn a_trajectory_gets_the_same_bits_alone_as_paired_with_another() {
        // Three trajectories of different policy lengths: (0, 1) are swept as a pair, 2 alone.
        let mask: Vec<u8> = [vec![0, 1, 1, 1, 0, 1], vec![1, 1, 0, 0, 1, 1, 1, 1, 1], vec![0, 1, 1]].concat();
        let offsets = [0i64, 6, 15, 18];
        let values: Vec<f32> = (0..mask.len()).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let rewards: Vec<f32> =
            mask.iter().enumerate().map(|(i, &m)| if m == 1 { (i % 3) as f32 * 0.5 } else { 0.0 }).collect();
        let p = GaeParams { gamma: 0.97, lam: 0.9, lam_critic: 0.8, length_adaptive_alpha: None };
        let batch = gae_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p).unwrap();
        for w in offsets.windows(2) {
            let (s, e) = (w[0] as usize, w[1] as usize);
            let alone =
                gae_advantages(&values[s..e], &mask[s..e], &[0, (e - s) as i64], Rewards::Token(&rewards[s..e]), &p)
                    .unwrap();
            assert_eq!(
                batch.advantages[s..e].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                alone.advantages.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(
                batch.returns[s..e].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                alone.returns.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn finite_inputs_that_overflow_float32_are_an_error_naming_the_token() {
        // λ = 1: A = G − V = 3e38 + 3e38, beyond f32::MAX (issue 11 item 7).
        let p = GaeParams { lam: 1.0, ..Default::default() };
        let e = gae_advantages(&[-3e38], &[1], &[0, 1], Rewards::Score(&[3e38]), &p).unwrap_err();
        assert!(
            matches!(
                e,
                MpoError::NonFiniteOutput { output: "advantages", at: TokenAt { token: 0, trajectory: 0, .. }, .. }
            ),
            "{e}"
        );
        // The second of a swept pair, behind an observation token.
        let e = gae_advantages(&[0.0, 0.0, 5.0, -3e38], &[1, 1, 0, 1], &[0, 2, 4], Rewards::Score(&[1.0, 3e38]), &p)
            .unwrap_err();
        assert_eq!(
            e.to_string().split(':').next().unwrap(),
            "`advantages` would be inf at token 3 (trajectory 1, position 1)"
        );
        // An overflow in trajectory 0 is reported before a bad input in trajectory 1.
        let e = gae_advantages(&[-3e38, f32::NAN], &[1, 1], &[0, 1, 2], Rewards::Score(&[3e38, 0.0]), &p).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteOutput { at: TokenAt { trajectory: 0, .. }, .. }), "{e}");
        // ... and a bad input in trajectory 0 before an overflow in trajectory 1.
        let e = gae_advantages(&[f32::NAN, -3e38], &[1, 1], &[0, 1, 2], Rewards::Score(&[0.0, 3e38]), &p).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteToken { arg: "values", .. }), "{e}");
        // Returns overflow too: the return of two rewards of 3e38 (λ = 0 keeps A = δ finite).
        let rewards = [3e38, 3e38];
        let e = gae_advantages(&[0.0, 0.0], &[1, 1], &[0, 2], Rewards::Token(&rewards), &GaeParams { lam: 0.0, ..p })
            .unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteOutput { output: "returns", .. }), "{e}");
    }

    #[test]
    fn length_adaptive_lambda() {
        let p = GaeParams { length_adaptive_alpha: Some(0.05), ..Default::default() };
        assert!((p.lam_for(200) - 0.9).abs() < 1e-12);
        assert_eq!(p.lam_for(10), 0.0);
    }
}
