//! Multiscale advantage estimation: a GAE over turns, refined inside each turn by a
//! centred token-level GAE, plus the critic's value targets (the formulas are in
//! docs/estimators.md, "MAE").

use std::mem::MaybeUninit;

use crate::compact::Compact;
use crate::error::Result;
use crate::layout::Rewards;
use crate::params::MaeParams;
use crate::turn_output::{turn_estimates, TurnKernel, TurnOutput};

/// Per-token advantages and value targets (0 off-policy), per-turn advantages, and the
/// segmentation they were computed on.
pub type MaeOutput = TurnOutput;

pub fn mae_advantages(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    params: &MaeParams,
) -> Result<MaeOutput> {
    mae_advantages_with_truncation(values, mask, offsets, rewards, None, params)
}

/// [`mae_advantages`] where `truncated[j]` (one per trajectory; `None`: none truncated)
/// marks a trajectory cut off before its episode ended: its last policy token bootstraps
/// from its own value, `V_{T+1,1} := V_{T,L_T}`, in place of 0. So its last token residual
/// is `δ_{T,L_T} = r_{T,L_T} + γ·V_{T,L_T} − V_{T,L_T}`, its last turn residual
/// `δ_T^turn = R_T + γ·V_{T,L_T} − V_{T,1}`, and the critic targets follow from the same δ
/// (`C = 0` past the end). A trajectory not truncated is computed bitwise as before.
pub fn mae_advantages_with_truncation(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    truncated: Option<&[bool]>,
    params: &MaeParams,
) -> Result<MaeOutput> {
    params.validate()?;
    turn_estimates(values, mask, offsets, rewards, truncated, params)
}

impl TurnKernel for MaeParams {
    fn estimate(&self, cs: &mut Compact, truncated: bool, turn_adv: &mut [MaybeUninit<f32>]) -> Option<(usize, f32)> {
        cs.work.resize(cs.n_policy(), 0.0);
        // A turn advantage is the mean of its tokens', so a bad one is rare: a mean just past
        // f32::MAX whose tokens all rounded to finite values.
        estimate(cs, self, truncated, turn_adv)
    }
}

/// The recursions over one gathered trajectory. Turns are visited last to first. Inside a
/// turn, one backward pass runs the two dependent recursions (intra-turn GAE, critic
/// targets) side by side and keeps the intra advantages in `work`; a second,
/// dependency-free pass centres them on the turn mean.
///
/// Returns the trajectory-local index and value of the first turn advantage that is not
/// finite (the token results are checked by the scatter).
fn estimate(
    cs: &mut Compact,
    p: &MaeParams,
    truncated: bool,
    turn_adv: &mut [MaybeUninit<f32>],
) -> Option<(usize, f32)> {
    let Compact { runs, values: v, rewards: r, advantages, returns, work: intra_buf } = cs;
    // V_{t+1,1}; past the last turn 0, or for a truncated trajectory V at its last policy token.
    let mut next_turn_v = match v.last() {
        Some(&last) if truncated => last,
        _ => 0.0f64,
    };
    let mut next_turn_adv = 0.0f64; // A^turn_{t+1}
    let mut carry = 0.0f64; // C at the first token of turn t+1
    let mut end = v.len(); // compact end of the current turn
    let mut bad_turn = None;
    let turns = runs.iter().rev().filter(|run| run.policy);
    for (t, run) in (0..turn_adv.len()).rev().zip(turns) {
        let start = end - run.tokens.len();
        let mut intra = 0.0f64;
        let mut intra_sum = 0.0f64;
        let mut turn_reward = 0.0f64;
        // The turn's last token bootstraps from γ·V of the next turn and discounts the
        // critic's carry by γ; inside the turn, from the next token, undiscounted.
        let mut next = p.gamma * next_turn_v;
        let mut g = p.gamma;
        for k in (start..end).rev() {
            let d = r[k] + next - v[k];
            intra = d + p.lam_intra * intra;
            intra_buf[k] = intra;
            intra_sum += intra;
            turn_reward += r[k];
            carry = d + g * p.lam_critic * carry;
            returns[k] = (v[k] + carry) as f32;
            next = v[k];
            g = 1.0;
        }

        let first_v = v[start];
        let a_turn = turn_reward + p.gamma * next_turn_v - first_v + p.gamma * p.lam * next_turn_adv;
        let a_turn32 = a_turn as f32;
        turn_adv[t].write(a_turn32);
        if !a_turn32.is_finite() {
            bad_turn = Some((t, a_turn32)); // turns go last to first: the lowest one stays
        }
        let turn_out = &mut advantages[start..end];
        if p.beta == 0.0 {
            turn_out.fill(a_turn as f32);
        } else {
            let mean = intra_sum / (end - start) as f64;
            for (o, &intra) in turn_out.iter_mut().zip(&intra_buf[start..end]) {
                *o = (a_turn + p.beta * (intra - mean)) as f32;
            }
        }

        next_turn_v = first_v;
        next_turn_adv = a_turn;
        end = start;
    }
    bad_turn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{MpoError, TokenAt};

    fn close(a: f32, b: f64) -> bool {
        (a as f64 - b).abs() < 1e-5
    }

    /// Two turns [v=1,2] and [v=3,4,5] separated by an observation, reward 1 at the end.
    fn two_turn_batch() -> (Vec<f32>, Vec<u8>, Vec<f32>) {
        let values = vec![1.0, 2.0, f32::NAN, 3.0, 4.0, 5.0];
        let mask = vec![1, 1, 0, 1, 1, 1];
        let rewards = vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        (values, mask, rewards)
    }

    #[test]
    fn hand_computed_two_turns() {
        let (values, mask, rewards) = two_turn_batch();
        let p = MaeParams { lam: 0.5, lam_intra: 0.5, beta: 1.0, gamma: 0.9, lam_critic: 1.0 };
        let out = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap();
        // turn 1: δ_turn = 1 + 0 − 3 = −2 = A^turn_1.
        // turn 0: δ_turn = 0 + 0.9·3 − 1 = 1.7; A^turn_0 = 1.7 + 0.9·0.5·(−2) = 0.8.
        assert!(close(out.turn_advantages[1], -2.0));
        assert!(close(out.turn_advantages[0], 0.8));
        // turn 1 token residuals: δ = (4−3, 5−4, 1−5) = (1, 1, −4);
        // intra = (1 + 0.5·(−1), 1 + 0.5·(−4), −4) = (0.5, −1, −4), mean −1.5.
        let expect1 = [-2.0 + 2.0, -2.0 + 0.5, -2.0 - 2.5];
        for (k, e) in expect1.iter().enumerate() {
            assert!(close(out.advantages[3 + k], *e), "{k}: {}", out.advantages[3 + k]);
        }
        // turn 0: δ = (2−1, 0.9·3 − 2) = (1, 0.7); intra = (1.35, 0.7), mean 1.025.
        assert!(close(out.advantages[0], 0.8 + 0.325));
        assert!(close(out.advantages[1], 0.8 - 0.325));
        assert_eq!(out.advantages[2], 0.0);
        assert_eq!(out.returns[2], 0.0);
        // λ_critic = 1: discounted Monte-Carlo return, γ once per turn boundary.
        assert!(close(out.returns[5], 1.0));
        assert!(close(out.returns[3], 1.0));
        assert!(close(out.returns[1], 0.9));
        assert!(close(out.returns[0], 0.9));
        assert_eq!(out.turns.token_turn, vec![0, 0, -1, 1, 1, 1]);
    }

    #[test]
    fn a_truncated_trajectory_bootstraps_from_its_last_value() {
        let (values, mask, rewards) = two_turn_batch();
        let p = MaeParams { lam: 0.5, lam_intra: 0.5, beta: 1.0, gamma: 0.9, lam_critic: 1.0 };
        let run = |t: Option<&[bool]>| {
            mae_advantages_with_truncation(&values, &mask, &[0, 6], Rewards::Token(&rewards), t, &p).unwrap()
        };
        let plain = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap();
        assert_eq!(run(None), plain);
        assert_eq!(run(Some(&[false])), plain);
        let cut = run(Some(&[true]));
        // V_{T+1,1} := V_{1,3} = 5: turn 1's δ_turn = 1 + 0.9·5 − 3 = 2.5 = A^turn_1;
        // turn 0: 1.7 + 0.9·0.5·2.5 = 2.825.
        assert!(close(cut.turn_advantages[1], 2.5));
        assert!(close(cut.turn_advantages[0], 2.825));
        // Last token residual 1 + 0.9·5 − 5 = 0.5; its return 1 + 0.9·5 = 5.5.
        assert!(close(cut.returns[5], 5.5));
        assert!(close(cut.returns[0], 0.9 * 5.5));
        // Turn 1 token residuals (1, 1, 0.5): intra = (1.625, 1.25, 0.5), mean 1.125.
        assert!(close(cut.advantages[3], 2.5 + 0.5));
        assert!(close(cut.advantages[5], 2.5 - 0.625));
        let e = mae_advantages_with_truncation(&values, &mask, &[0, 6], Rewards::Token(&rewards), Some(&[]), &p)
            .unwrap_err();
        assert!(e.to_string().starts_with("`truncated` has length 0, expected 1"), "{e}");
    }

    #[test]
    fn turn_mean_is_preserved_and_beta_zero_broadcasts() {
        let (values, mask, rewards) = two_turn_batch();
        for beta in [0.0, 0.3, 1.0, 2.5] {
            let p = MaeParams { beta, ..Default::default() };
            let out = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap();
            for t in 0..2 {
                let (s, e) = (out.turns.starts[t] as usize, out.turns.ends[t] as usize);
                let mean: f64 = out.advantages[s..e].iter().map(|&a| a as f64).sum::<f64>() / (e - s) as f64;
                assert!(close(out.turn_advantages[t], mean));
                if beta == 0.0 {
                    assert!(out.advantages[s..e].iter().all(|&a| a == out.turn_advantages[t]));
                }
            }
        }
    }

    #[test]
    fn score_lands_on_the_last_policy_token() {
        let values = vec![0.5, 0.5, 0.0, 0.0];
        let mask = vec![1, 1, 0, 0];
        let by_score = mae_advantages(&values, &mask, &[0, 4], Rewards::Score(&[2.0]), &MaeParams::default()).unwrap();
        let rewards = vec![0.0, 2.0, 0.0, 0.0];
        let by_reward =
            mae_advantages(&values, &mask, &[0, 4], Rewards::Token(&rewards), &MaeParams::default()).unwrap();
        assert_eq!(by_score, by_reward);
    }

    #[test]
    fn a_huge_beta_or_huge_values_are_an_error_naming_the_token() {
        // Intra-turn spread 0.525 × β = 1e308 overflows f32 (issue 11 item 7: --beta 1e308).
        let mask = [0, 1, 1];
        let p = MaeParams { beta: 1e308, ..Default::default() };
        let e = mae_advantages(&[9.0, 0.0, 1.0], &mask, &[0, 3], Rewards::Token(&[0.0; 3]), &p).unwrap_err();
        assert!(
            matches!(
                e,
                MpoError::NonFiniteOutput {
                    output: "advantages",
                    at: TokenAt { token: 1, trajectory: 0, position: 1 },
                    ..
                }
            ),
            "{e}"
        );
        // A second trajectory: the error names it.
        let values = [0.0, 0.0, 0.0, 1.0];
        let e = mae_advantages(&values, &[1, 1, 1, 1], &[0, 2, 4], Rewards::Score(&[0.0, 0.0]), &p).unwrap_err();
        assert!(e.to_string().starts_with("`advantages` would be inf at token 2 (trajectory 1, position 0)"), "{e}");
        // β = 1e308 with no spread inside the turn is fine (0 × β).
        let flat = mae_advantages(&[0.0, 0.0], &[1, 1], &[0, 2], Rewards::Token(&[0.0, 0.0]), &p).unwrap();
        assert!(flat.advantages.iter().all(|a| a.is_finite()));
        // Finite values of ±3e38: the turn advantage overflows.
        let e = mae_advantages(&[-3e38], &[1], &[0, 1], Rewards::Score(&[3e38]), &MaeParams::default()).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteOutput { at: TokenAt { trajectory: 0, .. }, .. }), "{e}");
        // A NaN score is still reported as a bad input, not as an overflow.
        let e = mae_advantages(&[0.0], &[1], &[0, 1], Rewards::Score(&[f32::NAN]), &MaeParams::default()).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteTrajectory { arg: "scores", .. }), "{e}");
    }

    #[test]
    fn bad_inputs_name_the_place() {
        let (mut values, mask, mut rewards) = two_turn_batch();
        let p = MaeParams::default();
        rewards[2] = 0.5;
        let e = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap_err();
        assert!(e.to_string().contains("observation token 2"), "{e}");
        rewards[2] = 0.0;
        values[4] = f32::INFINITY;
        let e = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap_err();
        assert!(e.to_string().starts_with("`values` is not finite (inf) at token 4"), "{e}");
        let e = mae_advantages(&values[..5], &mask, &[0, 6], Rewards::Token(&rewards), &p).unwrap_err();
        assert!(e.to_string().starts_with("`values` has length 5, expected 6"), "{e}");
        let bad = MaeParams { lam_intra: 1.5, ..p };
        let e = mae_advantages(&values, &mask, &[0, 6], Rewards::Token(&rewards), &bad).unwrap_err();
        assert!(e.to_string().contains("lam_intra"), "{e}");
    }
}
