//! Critic-free group baselines: GRPO, Dr. GRPO and RLOO over trajectories that share a
//! prompt (docs/estimators.md, "Group baselines"), and broadcasting per-trajectory values to
//! their policy tokens.

use rayon::prelude::*;

use crate::error::{MpoError, Result};
use crate::layout::{check_mask, expect_len, Layout};
use crate::output::OutBuf;
use crate::parallel::try_for_each_trajectory;
use crate::params::GroupParams;

/// `group_index[j]` in `0..n_groups` is trajectory `j`'s group (dense codes, e.g. from
/// `numpy.unique(..., return_inverse=True)`). Sums run in trajectory order, so results do
/// not depend on threads. A group of one gets 0. Finite scores can still give a result
/// beyond float32 (RLOO or Dr. GRPO over scores near ±3.4e38): that is an error naming the
/// trajectory, never an infinite advantage.
pub fn group_advantages(
    scores: &[f32],
    group_index: &[i64],
    n_groups: usize,
    params: &GroupParams,
) -> Result<Vec<f32>> {
    let sums = GroupSums::of(scores, group_index, n_groups, params)?;
    let out: Vec<f32> = scores
        .iter()
        .zip(group_index)
        .map(|(&s, &g)| {
            let g = g as usize;
            group_advantage(
                params,
                s,
                &GroupMoments { count: sums.count[g], sum: sums.sum[g], mean: sums.mean[g], sq_dev: sums.sq_dev[g] },
            )
        })
        .collect();
    if let Some(j) = out.iter().position(|a| !a.is_finite()) {
        return Err(MpoError::NonFiniteTrajectoryOutput { output: "advantages", value: out[j], trajectory: j });
    }
    Ok(out)
}

/// The statistics of one group that its members' advantages depend on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupMoments {
    /// Members of the group.
    pub count: u64,
    /// Sum of their scores (f64, in trajectory order).
    pub sum: f64,
    /// `sum / count`.
    pub mean: f64,
    /// Sum of squared deviations of the scores from `mean`.
    pub sq_dev: f64,
}

/// The advantage of one member with `score` in a group with moments `m`: GRPO
/// `(s − mean) / (unbiased std + eps)`, Dr. GRPO `s − mean`, RLOO `s − (sum − s)/(n − 1)`;
/// 0 for a group of one. The one place the formula is written (the numpy path and the
/// rollout-log tools both call it), so both round the same.
#[inline]
pub fn group_advantage(params: &GroupParams, score: f32, m: &GroupMoments) -> f32 {
    let n = m.count;
    if n < 2 {
        return 0.0;
    }
    let s = score as f64;
    let a = if params.leave_one_out {
        s - (m.sum - s) / (n - 1) as f64
    } else if params.norm_std {
        (s - m.mean) / ((m.sq_dev / (n - 1) as f64).sqrt() + params.eps)
    } else {
        s - m.mean
    };
    a as f32
}

/// Each trajectory's group baseline, in f64, for estimators that put the baseline in place
/// of a critic (verl's `mpo_mae_grpo` / `mpo_mae_rloo`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupBaselines {
    /// The group mean, or with `leave_one_out` the mean of the other members
    /// ((sum − s) / max(n − 1, 1)).
    pub baseline: Vec<f64>,
    /// 1 / (unbiased std + eps) with `norm_std` (and not `leave_one_out`), else 1.
    pub scale: Vec<f64>,
    /// The trajectory is alone in its group (it has no baseline; its advantage is 0).
    pub alone: Vec<bool>,
}

/// The baselines of [`group_advantages`] per trajectory, before they are applied: the same
/// sums in trajectory order, so `scale * (s − baseline)` rounded to f32 is its result.
pub fn group_baselines(
    scores: &[f32],
    group_index: &[i64],
    n_groups: usize,
    params: &GroupParams,
) -> Result<GroupBaselines> {
    let sums = GroupSums::of(scores, group_index, n_groups, params)?;
    let rows = scores.len();
    let mut out =
        GroupBaselines { baseline: Vec::with_capacity(rows), scale: vec![1.0; rows], alone: Vec::with_capacity(rows) };
    for (j, (&s, &g)) in scores.iter().zip(group_index).enumerate() {
        let g = g as usize;
        let n = sums.count[g];
        let others = n.saturating_sub(1).max(1) as f64;
        out.alone.push(n < 2);
        if params.leave_one_out {
            out.baseline.push((sums.sum[g] - s as f64) / others);
        } else {
            out.baseline.push(sums.mean[g]);
            if params.norm_std {
                out.scale[j] = 1.0 / ((sums.sq_dev[g] / others).sqrt() + params.eps);
            }
        }
    }
    Ok(out)
}

/// Per-group count, sum, mean and squared deviation from the mean, summed in trajectory
/// order; the scores, group codes and parameters checked.
struct GroupSums {
    count: Vec<u64>,
    sum: Vec<f64>,
    mean: Vec<f64>,
    sq_dev: Vec<f64>,
}

impl GroupSums {
    fn of(scores: &[f32], group_index: &[i64], n_groups: usize, params: &GroupParams) -> Result<Self> {
        params.validate()?;
        expect_len("group_index", group_index.len(), scores.len(), "one per score")?;
        let mut count = vec![0u64; n_groups];
        let mut sum = vec![0f64; n_groups];
        for (j, (&s, &g)) in scores.iter().zip(group_index).enumerate() {
            if !s.is_finite() {
                return Err(MpoError::NonFiniteTrajectory { arg: "scores", value: s, trajectory: j });
            }
            if g < 0 || g as u64 >= n_groups as u64 {
                return Err(MpoError::GroupIndex { value: g, trajectory: j, n_groups });
            }
            count[g as usize] += 1;
            sum[g as usize] += s as f64;
        }
        let mean: Vec<f64> = sum.iter().zip(&count).map(|(&s, &n)| s / n.max(1) as f64).collect();
        // Two-pass variance: exact enough for scores of any offset.
        let mut sq_dev = vec![0f64; n_groups];
        for (&s, &g) in scores.iter().zip(group_index) {
            let d = s as f64 - mean[g as usize];
            sq_dev[g as usize] += d * d;
        }
        Ok(Self { count, sum, mean, sq_dev })
    }
}

/// Writes `per_trajectory[j]` on every policy token of trajectory `j`, 0 elsewhere. A
/// non-finite `per_trajectory[j]` is an error naming `j` (as for any estimator input).
pub fn broadcast_to_tokens(per_trajectory: &[f32], mask: &[u8], offsets: &[i64]) -> Result<Vec<f32>> {
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_trajectories("per_trajectory", per_trajectory.len())?;
    let mut out = OutBuf::<f32>::new(layout.n_tokens());
    let parts = out.parts(offsets).into_par_iter();
    try_for_each_trajectory(parts, |j, out| {
        check_mask(&layout, mask, j)?;
        let value = per_trajectory[j];
        if !value.is_finite() {
            return Err(MpoError::NonFiniteTrajectory { arg: "per_trajectory", value, trajectory: j });
        }
        for (o, &m) in out.iter_mut().zip(&mask[layout.range(j)]) {
            o.write(if m != 0 { value } else { 0.0 });
        }
        Ok(())
    })?;
    // SAFETY: every token of every trajectory was written above.
    Ok(unsafe { out.assume_written() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpo_drgrpo_rloo() {
        let scores = [1.0, 0.0, 0.0, 1.0, 5.0];
        let groups = [0, 0, 0, 0, 1];
        let grpo = group_advantages(&scores, &groups, 2, &GroupParams::default()).unwrap();
        let std = (1.0f64 / 3.0).sqrt(); // unbiased std of [1, 0, 0, 1]
        assert!((grpo[0] as f64 - 0.5 / (std + 1e-6)).abs() < 1e-6);
        assert_eq!(grpo[4], 0.0, "a group of one gets 0");
        let dr = group_advantages(&scores, &groups, 2, &GroupParams { norm_std: false, ..Default::default() }).unwrap();
        assert_eq!(dr[..4], [0.5, -0.5, -0.5, 0.5]);
        let rloo =
            group_advantages(&scores, &groups, 2, &GroupParams { leave_one_out: true, ..Default::default() }).unwrap();
        assert!((rloo[0] as f64 - (1.0 - 1.0 / 3.0)).abs() < 1e-6);
        assert!((rloo[1] as f64 - (0.0 - 2.0 / 3.0)).abs() < 1e-6);
    }

    /// The baselines as a slow reference computes them: each group's members gathered, then
    /// summed in trajectory order.
    fn reference(scores: &[f32], groups: &[i64], p: &GroupParams) -> GroupBaselines {
        let mut out = GroupBaselines { baseline: vec![], scale: vec![], alone: vec![] };
        for (j, &g) in groups.iter().enumerate() {
            let members: Vec<f64> = (0..scores.len()).filter(|&k| groups[k] == g).map(|k| scores[k] as f64).collect();
            let n = members.len() as f64;
            let total = members.iter().fold(0.0, |a, &x| a + x);
            let mean = total / n;
            let others = (n - 1.0).max(1.0);
            let sq = members.iter().fold(0.0, |a, &x| a + (x - mean) * (x - mean));
            out.alone.push(members.len() < 2);
            if p.leave_one_out {
                out.baseline.push((total - scores[j] as f64) / others);
                out.scale.push(1.0);
            } else {
                out.baseline.push(mean);
                out.scale.push(if p.norm_std { 1.0 / ((sq / others).sqrt() + p.eps) } else { 1.0 });
            }
        }
        out
    }

    #[test]
    fn baselines_match_a_slow_reference_and_the_advantages() {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        let n = 300;
        // Groups 0..41 shared, and every 50th trajectory alone in a group of its own.
        let groups: Vec<i64> =
            (0..n).map(|j| if j % 50 == 0 { 41 + j as i64 / 50 } else { (next() % 41) as i64 }).collect();
        let scores: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32 / 7.0 - 30.0).collect();
        for p in [
            GroupParams::default(),
            GroupParams { norm_std: false, ..Default::default() },
            GroupParams { leave_one_out: true, ..Default::default() },
            GroupParams { eps: 0.5, ..Default::default() },
        ] {
            let got = group_baselines(&scores, &groups, 47, &p).unwrap();
            assert_eq!(got, reference(&scores, &groups, &p), "{p:?}");
            assert!(got.alone.iter().any(|&a| a) && got.alone.iter().any(|&a| !a));
            // scale * (s - baseline) is the advantage of group_advantages, bitwise.
            let adv = group_advantages(&scores, &groups, 47, &p).unwrap();
            for j in 0..n {
                let want =
                    if got.alone[j] { 0.0 } else { ((scores[j] as f64 - got.baseline[j]) * got.scale[j]) as f32 };
                if p.norm_std && !p.leave_one_out {
                    // GRPO divides by (std + eps) where this multiplies by its inverse.
                    assert!((adv[j] - want).abs() <= 1e-5 * want.abs().max(1.0), "{j}");
                } else {
                    assert_eq!(adv[j], want, "{p:?} {j}");
                }
            }
        }
        let e = group_baselines(&[1.0, f32::NAN], &[0, 0], 1, &GroupParams::default()).unwrap_err();
        assert!(e.to_string().contains("trajectory 1"), "{e}");
        let e = group_baselines(&[1.0], &[0], 1, &GroupParams { eps: 0.0, ..Default::default() }).unwrap_err();
        assert!(matches!(e, MpoError::Parameter { name: "eps", .. }), "{e}");
    }

    #[test]
    fn bad_group_index() {
        let e = group_advantages(&[1.0, 2.0], &[0, 3], 2, &GroupParams::default()).unwrap_err();
        assert!(e.to_string().contains("trajectory 1"), "{e}");
    }

    #[test]
    fn eps_zero_is_refused_and_overflow_names_the_trajectory() {
        // eps = 0 with equal scores was 0/0 = NaN (issue 11 item 7).
        let e = group_advantages(&[1.0, 1.0], &[0, 0], 1, &GroupParams { eps: 0.0, ..Default::default() }).unwrap_err();
        assert!(matches!(e, MpoError::Parameter { name: "eps", .. }), "{e}");
        // RLOO over finite scores of ±3e38: 3e38 − (−3e38) overflows f32.
        let rloo = GroupParams { leave_one_out: true, ..Default::default() };
        let e = group_advantages(&[0.0, 3e38, -3e38], &[1, 0, 0], 2, &rloo).unwrap_err();
        assert_eq!(
            e,
            MpoError::NonFiniteTrajectoryOutput { output: "advantages", value: f32::INFINITY, trajectory: 1 }
        );
        // GRPO is bounded by the std: the same scores are fine.
        let grpo = group_advantages(&[0.0, 3e38, -3e38], &[1, 0, 0], 2, &GroupParams::default()).unwrap();
        assert!(grpo.iter().all(|a| a.is_finite()));
    }

    #[test]
    fn broadcast_refuses_non_finite_values() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = broadcast_to_tokens(&[2.0, bad], &[0, 1, 1, 1, 0], &[0, 3, 5]).unwrap_err();
            assert!(matches!(e, MpoError::NonFiniteTrajectory { arg: "per_trajectory", trajectory: 1, .. }), "{e}");
        }
    }

    #[test]
    fn broadcast() {
        let out = broadcast_to_tokens(&[2.0, 3.0], &[0, 1, 1, 1, 0], &[0, 3, 5]).unwrap();
        assert_eq!(out, vec![0.0, 2.0, 2.0, 3.0, 0.0]);
    }
}
