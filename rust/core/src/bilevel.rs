//! RAGEN's bi-level GAE: a GAE over turns on the values at each turn's last token, then a
//! token-level GAE inside each turn whose last token is rewarded with the turn's return
//! (the formulas are in docs/estimators.md, "Bi-level GAE"). Turns come from the mask.

use std::mem::MaybeUninit;

use crate::compact::Compact;
use crate::error::Result;
use crate::layout::Rewards;
use crate::params::BiLevelParams;
use crate::turn_output::{turn_estimates, TurnKernel, TurnOutput};

/// Per-token advantages and value targets (0 off-policy), the turn-level advantages
/// A_t^hi (each is also the advantage of its turn's last token), and the segmentation
/// they were computed on.
pub type BiLevelOutput = TurnOutput;

pub fn bilevel_advantages(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    params: &BiLevelParams,
) -> Result<BiLevelOutput> {
    params.validate()?;
    turn_estimates(values, mask, offsets, rewards, None, params)
}

impl TurnKernel for BiLevelParams {
    /// No trajectory is truncated here (the driver is given none). A turn advantage is its
    /// last token's advantage (same f32), so the scatter's check covers it: never a bad turn.
    fn estimate(&self, cs: &mut Compact, _truncated: bool, turn_adv: &mut [MaybeUninit<f32>]) -> Option<(usize, f32)> {
        estimate(cs, self, turn_adv);
        None
    }
}

/// Both levels over one gathered trajectory, turns last to first: the turn-level step on
/// the turn's last value, then the token-level recursion inside the turn, which starts
/// from nothing at the turn's last token (nothing bootstraps across a turn boundary there:
/// the next turn enters through G_t only).
fn estimate(cs: &mut Compact, p: &BiLevelParams, turn_adv: &mut [MaybeUninit<f32>]) {
    let Compact { runs, values: v, rewards: r, advantages, returns, .. } = cs;
    let gamma_lam = p.gamma * p.lam;
    let hi_gamma_lam = p.high_level_gamma * p.lam;
    let mut next_end_v = 0.0f64; // V_{e_{t+1}}, 0 past the last turn
    let mut next_a_hi = 0.0f64; // A^hi_{t+1}
    let mut end = v.len(); // compact end of the current turn
    let turns = runs.iter().rev().filter(|run| run.policy);
    for (t, run) in (0..turn_adv.len()).rev().zip(turns) {
        let start = end - run.tokens.len();
        let last = end - 1;
        let turn_reward: f64 = r[start..end].iter().sum();
        let end_v = v[last];
        let a_hi = turn_reward + p.high_level_gamma * next_end_v - end_v + hi_gamma_lam * next_a_hi;
        turn_adv[t].write(a_hi as f32);
        // The last token's residual is G_t + γ·0 − V_{e_t} = A^hi_t, taken as is rather
        // than as (A^hi_t + V) − V, which would round.
        let mut a = a_hi;
        advantages[last] = a as f32;
        returns[last] = (a + end_v) as f32;
        let mut next_v = end_v;
        for k in (start..last).rev() {
            let d = p.gamma * next_v - v[k];
            a = d + gamma_lam * a;
            advantages[k] = a as f32;
            returns[k] = (a + v[k]) as f32;
            next_v = v[k];
        }
        next_end_v = end_v;
        next_a_hi = a_hi;
        end = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{MpoError, TokenAt};
    use crate::{gae_advantages, GaeParams};

    fn close(a: f32, b: f64) -> bool {
        (a as f64 - b).abs() < 1e-5
    }

    #[test]
    fn hand_computed_two_turns() {
        // Turn 0 = tokens 0, 1 (values 1, 2), an observation, turn 1 = tokens 3, 4, 5
        // (values 3, 4, 5); rewards 0.5 inside turn 0 and 1 at the end.
        let values = [1.0, 2.0, f32::NAN, 3.0, 4.0, 5.0];
        let mask = [1, 1, 0, 1, 1, 1];
        let rewards = [0.5, 0.0, 0.0, 0.0, 0.0, 1.0];
        let p = BiLevelParams { lam: 0.5, gamma: 0.8, high_level_gamma: 0.9 };
        let out = bilevel_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap();
        // High level, on the last values V_e = (2, 5):
        // turn 1: δ = 1 + 0 − 5 = −4 = A^hi_1, G_1 = 1.
        // turn 0: δ = 0.5 + 0.9·5 − 2 = 3; A^hi_0 = 3 + 0.9·0.5·(−4) = 1.2, G_0 = 3.2.
        assert!(close(out.turn_advantages[1], -4.0));
        assert!(close(out.turn_advantages[0], 1.2));
        // Low level, turn 1 (γλ = 0.4): A_5 = −4; A_4 = 0.8·5 − 4 + 0.4·(−4) = −1.6;
        // A_3 = 0.8·4 − 3 + 0.4·(−1.6) = −0.44.
        let want = [(0, 1.2 * 0.4 + 0.8 * 2.0 - 1.0), (1, 1.2), (3, -0.44), (4, -1.6), (5, -4.0)];
        for (q, a) in want {
            assert!(close(out.advantages[q], a), "{q}: {} vs {a}", out.advantages[q]);
            assert!(close(out.returns[q], a + values[q] as f64), "{q}");
        }
        assert!(close(out.returns[1], 3.2)); // G_0
        assert!(close(out.returns[5], 1.0)); // G_1
        assert_eq!((out.advantages[2], out.returns[2]), (0.0, 0.0));
        assert_eq!(out.turns.token_turn, vec![0, 0, -1, 1, 1, 1]);
        // Not mean-preserving: turn 1's mean is not A^hi_1.
        let mean1 = (-0.44 - 1.6 - 4.0) / 3.0;
        assert!((mean1 - -4.0f64).abs() > 1.0);
    }

    #[test]
    fn the_turn_advantage_is_the_last_tokens_advantage() {
        let values = [0.3, -1.0, 0.0, 0.0, 2.0, 0.25, 7.0];
        let mask = [1, 1, 0, 0, 1, 1, 1];
        let p = BiLevelParams { lam: 0.7, gamma: 0.9, high_level_gamma: 0.6 };
        let out = bilevel_advantages(&values, &mask, &[0, 7], Rewards::Score(&[1.5]), &p).unwrap();
        for t in 0..out.turns.n_turns() {
            let last = out.turns.ends[t] as usize - 1;
            assert_eq!(out.turn_advantages[t].to_bits(), out.advantages[last].to_bits());
        }
    }

    #[test]
    fn one_token_turns_are_token_gae_with_the_turn_discount() {
        // One token per turn: the low level is the turn level, so this is GAE over the
        // policy tokens with γ = γ_hi (the token γ never applies), returns = A + V.
        let values = [0.5, 0.0, -0.25, 0.0, 0.0, 1.0, 2.0];
        let mask = [1, 0, 1, 0, 0, 1, 0];
        let rewards = [0.1, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        for gamma in [1.0, 0.3] {
            let p = BiLevelParams { lam: 0.8, gamma, high_level_gamma: 0.9 };
            let bi = bilevel_advantages(&values, &mask, &[0, 7], Rewards::Token(&rewards), &p).unwrap();
            let g = GaeParams { gamma: 0.9, lam: 0.8, lam_critic: 0.8, length_adaptive_alpha: None };
            let gae = gae_advantages(&values, &mask, &[0, 7], Rewards::Token(&rewards), &g).unwrap();
            for q in 0..7 {
                assert!(close(bi.advantages[q], gae.advantages[q] as f64), "{q}");
                assert!(close(bi.returns[q], gae.returns[q] as f64), "{q}");
            }
        }
    }

    #[test]
    fn lam_one_gives_the_turn_return_minus_each_value() {
        // λ = 1, γ = 1: A_{t,i} = G_t − V_{t,i}, G_t = Σ_k γ_hi^k R_{t+k}.
        let values = [0.5, 0.1, 0.0, -0.3, 0.2];
        let mask = [1, 1, 0, 1, 1];
        let rewards = [0.0, 2.0, 0.0, 0.0, 1.0];
        let p = BiLevelParams { lam: 1.0, gamma: 1.0, high_level_gamma: 0.5 };
        let out = bilevel_advantages(&values, &mask, &[0, 5], Rewards::Token(&rewards), &p).unwrap();
        let g = [2.0 + 0.5, 2.5, 0.0, 1.0, 1.0];
        for q in [0, 1, 3, 4] {
            assert!(close(out.advantages[q], g[q] - values[q] as f64), "{q}");
            assert!(close(out.returns[q], g[q]), "{q}");
        }
    }

    #[test]
    fn values_inside_a_turn_do_not_reach_other_turns() {
        // The high level reads V only at turn ends; the low level stays inside its turn.
        let mask = [1, 1, 1, 0, 1, 1];
        let rewards = [0.0, 0.0, 0.5, 0.0, 0.0, 1.0];
        let p = BiLevelParams { lam: 0.9, gamma: 0.95, high_level_gamma: 0.8 };
        let a = bilevel_advantages(&[1.0, 2.0, 3.0, 0.0, 4.0, 5.0], &mask, &[0, 6], Rewards::Token(&rewards), &p);
        let b = bilevel_advantages(&[1.0, -7.0, 3.0, 0.0, 9.0, 5.0], &mask, &[0, 6], Rewards::Token(&rewards), &p);
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.turn_advantages, b.turn_advantages);
        assert_eq!(a.advantages[2], b.advantages[2]);
        assert_eq!(a.advantages[5], b.advantages[5]);
    }

    #[test]
    fn observation_tokens_change_nothing_and_trajectories_are_independent() {
        let p = BiLevelParams { lam: 0.85, gamma: 0.9, high_level_gamma: 0.7 };
        // Two trajectories: [1 1 0 1] and [0 1 1 1 0 1].
        let mask = [1, 1, 0, 1, 0, 1, 1, 1, 0, 1];
        let values = [0.2, -0.4, 9.0, 0.6, 9.0, 1.0, 0.5, -0.5, 9.0, 0.3];
        let rewards = [0.0, 0.3, 0.0, 1.0, 0.0, 0.0, 0.0, -0.2, 0.0, 0.5];
        let offsets = [0, 4, 10];
        let out = bilevel_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p).unwrap();
        for (q, &m) in mask.iter().enumerate() {
            if m == 0 {
                assert_eq!((out.advantages[q], out.returns[q], out.turns.token_turn[q]), (0.0, 0.0, -1));
            }
        }
        // Each trajectory alone: the same bits.
        for w in offsets.windows(2) {
            let (s, e) = (w[0] as usize, w[1] as usize);
            let rw = Rewards::Token(&rewards[s..e]);
            let alone = bilevel_advantages(&values[s..e], &mask[s..e], &[0, (e - s) as i64], rw, &p).unwrap();
            assert_eq!(alone.advantages, out.advantages[s..e]);
            assert_eq!(alone.returns, out.returns[s..e]);
        }
        // Every observation run three times as long: policy tokens keep their bits.
        let mut longer = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), vec![0i64]);
        for (q, &m) in mask.iter().enumerate() {
            let extra = if m == 0 { 3 } else { 1 };
            for _ in 0..extra {
                longer.0.push(m);
                longer.1.push(values[q]);
                longer.2.push(rewards[q]);
                longer.3.push(q);
            }
            if offsets.contains(&(q as i64 + 1)) {
                longer.4.push(longer.0.len() as i64);
            }
        }
        let (m2, v2, r2, from, o2) = longer;
        let out2 = bilevel_advantages(&v2, &m2, &o2, Rewards::Token(&r2), &p).unwrap();
        for (k, &q) in from.iter().enumerate() {
            if m2[k] == 1 {
                assert_eq!(out2.advantages[k].to_bits(), out.advantages[q].to_bits(), "{q}");
                assert_eq!(out2.returns[k].to_bits(), out.returns[q].to_bits(), "{q}");
            }
        }
        assert_eq!(out2.turn_advantages, out.turn_advantages);
    }

    #[test]
    fn score_lands_on_the_last_policy_token() {
        let values = [0.5, 0.5, 0.0, 0.0];
        let mask = [1, 1, 0, 0];
        let p = BiLevelParams::default();
        let by_score = bilevel_advantages(&values, &mask, &[0, 4], Rewards::Score(&[2.0]), &p).unwrap();
        let rewards = [0.0, 2.0, 0.0, 0.0];
        let by_reward = bilevel_advantages(&values, &mask, &[0, 4], Rewards::Token(&rewards), &p).unwrap();
        assert_eq!(by_score, by_reward);
    }

    #[test]
    fn overflow_and_bad_inputs_are_errors_naming_the_place() {
        let p = BiLevelParams::default();
        let e = bilevel_advantages(&[-3e38], &[1], &[0, 1], Rewards::Score(&[3e38]), &p).unwrap_err();
        assert!(
            matches!(
                e,
                MpoError::NonFiniteOutput { output: "advantages", at: TokenAt { token: 0, trajectory: 0, .. }, .. }
            ),
            "{e}"
        );
        let e = bilevel_advantages(&[0.0, 0.0], &[1, 1], &[0, 1, 2], Rewards::Score(&[0.0, f32::NAN]), &p).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteTrajectory { arg: "scores", trajectory: 1, .. }), "{e}");
        let e = bilevel_advantages(&[0.0, 0.0], &[1, 0], &[0, 2], Rewards::Token(&[0.0, 1.0]), &p).unwrap_err();
        assert!(e.to_string().contains("observation token 1"), "{e}");
        let e = bilevel_advantages(&[0.0, f32::NAN], &[1, 1], &[0, 2], Rewards::Token(&[0.0; 2]), &p).unwrap_err();
        assert!(e.to_string().starts_with("`values` is not finite (NaN) at token 1"), "{e}");
        let bad = BiLevelParams { high_level_gamma: 0.0, ..p };
        let e = bilevel_advantages(&[0.0], &[1], &[0, 1], Rewards::Token(&[0.0]), &bad).unwrap_err();
        assert!(matches!(e, MpoError::Parameter { name: "high_level_gamma", .. }), "{e}");
    }
}
