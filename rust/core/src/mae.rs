//! Multiscale advantage estimation (spec §2.1): a GAE over turns, refined inside each
//! turn by a centred token-level GAE, plus the critic's value targets.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use crate::error::Result;
use crate::layout::{first_problem, observation_run_ok, score_ok, Layout, RewardAt, Rewards, RewardsVisitor};
use crate::output::{fill, OutBuf};
use crate::params::MaeParams;
use crate::parallel::try_for_each_trajectory;
use crate::turns::{fill_trajectory, TurnBufs, Turns};

/// Per-token advantages and value targets (0 off-policy), per-turn advantages, and the
/// segmentation they were computed on.
#[derive(Debug, Clone, PartialEq)]
pub struct MaeOutput {
    pub advantages: Vec<f32>,
    pub returns: Vec<f32>,
    pub turn_advantages: Vec<f32>,
    pub turns: Turns,
}

pub fn mae_advantages(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    params: &MaeParams,
) -> Result<MaeOutput> {
    params.validate()?;
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_tokens("values", values.len())?;
    rewards.check_shape(&layout)?;
    let mut turn_bufs = TurnBufs::count(&layout, mask)?;
    let (traj_offsets, starts, ends, token_turn) = turn_bufs.split(&layout);

    let n_tokens = layout.n_tokens();
    let mut advantages = OutBuf::<f32>::new(n_tokens);
    let mut returns = OutBuf::<f32>::new(n_tokens);
    let mut turn_advantages = OutBuf::<f32>::new(*traj_offsets.last().unwrap_or(&0) as usize);
    let parts = advantages
        .parts(offsets)
        .into_par_iter()
        .zip(returns.parts(offsets))
        .zip(turn_advantages.parts(traj_offsets))
        .zip(starts.into_par_iter().zip(ends).zip(token_turn));
    try_for_each_trajectory(parts, |j, (((adv, ret), turn_adv), ((starts, ends), token_turn))| {
        // Segment while the trajectory's mask is hot, then estimate on its turns.
        let (starts, ends) = fill_trajectory(&layout, mask, j, traj_offsets[j], starts, ends, token_turn);
        let last_policy = ends.last().map(|&e| e as usize - 1);
        let traj = Trajectory {
            range: layout.range(j),
            values,
            source: rewards,
            starts,
            ends,
            params,
            out: Outputs { adv, ret, turn_adv },
        };
        if !rewards.with_trajectory(j, last_policy, traj) {
            first_problem(&layout, mask, values, rewards, j)?;
        }
        score_ok(rewards, j)
    })?;
    // SAFETY: every trajectory ran `fill_trajectory`, and `Trajectory::visit` wrote every
    // token of its trajectory (turn tokens in the passes, observation gaps with 0) and
    // every one of its turns.
    let (advantages, returns, turn_advantages, turns) = unsafe {
        (
            advantages.assume_written(),
            returns.assume_written(),
            turn_advantages.assume_written(),
            turn_bufs.finish(),
        )
    };
    Ok(MaeOutput { advantages, returns, turn_advantages, turns })
}

/// One trajectory's output slices (local indices).
struct Outputs<'o> {
    adv: &'o mut [MaybeUninit<f32>],
    ret: &'o mut [MaybeUninit<f32>],
    turn_adv: &'o mut [MaybeUninit<f32>],
}

/// One trajectory: its flat token range, its turns (flat ranges) and where to write.
struct Trajectory<'a, 'o> {
    range: Range<usize>,
    values: &'a [f32],
    source: Rewards<'a>,
    starts: &'a [i64],
    ends: &'a [i64],
    params: &'a MaeParams,
    out: Outputs<'o>,
}

impl RewardsVisitor<bool> for Trajectory<'_, '_> {
    /// Turns are visited last to first. Inside a turn, one backward pass runs the two
    /// dependent recursions (intra-turn GAE, critic targets) side by side and keeps the
    /// intra advantages in a per-thread scratch buffer; a second, dependency-free pass
    /// centres them on the turn mean. Observation gaps get 0. Returns whether the fast
    /// input checks passed.
    fn visit<R: RewardAt>(self, rewards: R) -> bool {
        SCRATCH.with(|scratch| self.estimate(rewards, &mut scratch.borrow_mut()))
    }
}

thread_local! {
    /// Intra-turn advantages of the current turn (f64, so centring loses nothing); grows
    /// to the longest turn a thread has seen, so no allocation per turn.
    static SCRATCH: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

impl Trajectory<'_, '_> {
    fn estimate<R: RewardAt>(self, rewards: R, intra_buf: &mut Vec<f64>) -> bool {
        let Trajectory { range, values, source, starts, ends, params: p, out } = self;
        let Outputs { adv, ret, turn_adv } = out;
        let base = range.start;
        let v = |q: usize| values[q] as f64;
        // Token residual of flat token q in a turn ending (exclusively) at `end`: it
        // bootstraps from the next token inside the turn, else from γ·V of the next turn.
        let delta = |q: usize, end: usize, next_turn_v: f64| {
            let next = if q + 1 == end { p.gamma * next_turn_v } else { v(q + 1) };
            rewards.at(q) + next - v(q)
        };

        let mut next_turn_v = 0.0f64; // V_{t+1,1}, 0 past the last turn
        let mut next_turn_adv = 0.0f64; // A^turn_{t+1}
        let mut carry = 0.0f64; // C at the first token of turn t+1
        let mut gap_end = range.end; // observation tokens after the current turn end here
        let mut ok = true;
        for t in (0..starts.len()).rev() {
            let (s, e) = (starts[t] as usize, ends[t] as usize);
            ok &= observation_run_ok(source, e..gap_end);
            fill(&mut adv[e - base..gap_end - base], 0.0);
            fill(&mut ret[e - base..gap_end - base], 0.0);

            intra_buf.clear();
            intra_buf.resize(e - s, 0.0);
            let mut intra = 0.0f64;
            let mut intra_sum = 0.0f64;
            let mut turn_reward = 0.0f64;
            let mut poison = 0.0f64; // NaN unless every value and reward of the turn is finite
            for q in (s..e).rev() {
                poison += v(q) * 0.0 + rewards.at(q) * 0.0;
                let d = delta(q, e, next_turn_v);
                intra = d + p.lam_intra * intra;
                intra_buf[q - s] = intra;
                intra_sum += intra;
                turn_reward += rewards.at(q);
                let g = if q + 1 == e { p.gamma } else { 1.0 };
                carry = d + g * p.lam_critic * carry;
                ret[q - base].write((v(q) + carry) as f32);
            }

            ok &= poison == 0.0;
            let first_v = v(s);
            let a_turn = turn_reward + p.gamma * next_turn_v - first_v + p.gamma * p.lam * next_turn_adv;
            turn_adv[t].write(a_turn as f32);

            let turn_out = &mut adv[s - base..e - base];
            if p.beta == 0.0 {
                fill(turn_out, a_turn as f32);
            } else {
                let mean = intra_sum / (e - s) as f64;
                for (o, &intra) in turn_out.iter_mut().zip(intra_buf.iter()) {
                    o.write((a_turn + p.beta * (intra - mean)) as f32);
                }
            }

            next_turn_v = first_v;
            next_turn_adv = a_turn;
            gap_end = s;
        }
        ok &= observation_run_ok(source, base..gap_end);
        fill(&mut adv[..gap_end - base], 0.0);
        fill(&mut ret[..gap_end - base], 0.0);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let by_reward = mae_advantages(&values, &mask, &[0, 4], Rewards::Token(&rewards), &MaeParams::default()).unwrap();
        assert_eq!(by_score, by_reward);
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
