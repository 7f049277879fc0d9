//! Does the critic's value structure live on the turn scale? (docs/diagnostics.md)
//!
//! Per trajectory, the token-weighted variance of the values over its policy tokens splits
//! exactly into a between-turn part (turn means around the trajectory mean, weighted by
//! turn length) and a within-turn part (tokens around their turn mean). Per turn, the
//! boundary jump ΔV_t = V_{t+1,1} − V_{t,L_t} into the next turn of the same trajectory.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::error::{MpoError, Result};
use crate::layout::Layout;
use crate::output::OutBuf;
use crate::parallel::try_for_each_trajectory;
use crate::runs::all_finite;
use crate::turns::{segment, Turns};

/// Per-trajectory variance decomposition and per-turn boundary jumps.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueStructure {
    /// Token-weighted variance of the values over the trajectory's policy tokens
    /// (population variance: Σ (V − mean)² / n); 0 without policy tokens.
    pub total: Vec<f64>,
    /// Σ_t L_t·(mean_t − mean)² / n.
    pub between: Vec<f64>,
    /// Σ_t Σ_i (V_{t,i} − mean_t)² / n. `between + within == total` up to rounding.
    pub within: Vec<f64>,
    /// ΔV into the next turn of the same trajectory; NaN for a trajectory's last turn.
    pub jumps: Vec<f32>,
    pub turns: Turns,
}

pub fn value_structure(values: &[f32], mask: &[u8], offsets: &[i64]) -> Result<ValueStructure> {
    let layout = Layout::new(offsets, mask.len())?;
    layout.expect_tokens("values", values.len())?;
    let turns = segment(&layout, mask)?;
    let n = layout.n_trajectories();
    let mut total = OutBuf::<f64>::new(n);
    let mut between = OutBuf::<f64>::new(n);
    let mut within = OutBuf::<f64>::new(n);
    let mut jumps = OutBuf::<f32>::new(turns.n_turns());
    let one_each: Vec<usize> = (0..=n).collect();
    let parts = total
        .parts(&one_each)
        .into_par_iter()
        .zip(between.parts(&one_each))
        .zip(within.parts(&one_each))
        .zip(jumps.parts(&turns.traj_offsets));
    try_for_each_trajectory(parts, |j, (((total, between), within), jumps)| {
        let range = turns.of_trajectory(j);
        let (starts, ends) = (&turns.starts[range.clone()], &turns.ends[range]);
        for (&s, &e) in starts.iter().zip(ends) {
            let (s, e) = (s as usize, e as usize);
            if !all_finite(&values[s..e]) {
                let q = s + values[s..e].iter().position(|v| !v.is_finite()).unwrap_or(0);
                return Err(MpoError::NonFiniteToken { arg: "values", value: values[q], at: layout.at(j, q) });
            }
        }
        let (t, b, w) = decompose(values, starts, ends);
        total[0].write(t);
        between[0].write(b);
        within[0].write(w);
        write_jumps(values, starts, ends, jumps);
        Ok(())
    })?;
    // SAFETY: each trajectory wrote its one total/between/within and one jump per turn.
    unsafe {
        Ok(ValueStructure {
            total: total.assume_written(),
            between: between.assume_written(),
            within: within.assume_written(),
            jumps: jumps.assume_written(),
            turns,
        })
    }
}

/// (total, between, within) of one trajectory, two-pass in f64.
fn decompose(values: &[f32], starts: &[i64], ends: &[i64]) -> (f64, f64, f64) {
    let turn = |k: usize| &values[starts[k] as usize..ends[k] as usize];
    let n: usize = (0..starts.len()).map(|k| turn(k).len()).sum();
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    let sum: f64 = (0..starts.len()).flat_map(|k| turn(k).iter()).map(|&v| v as f64).sum();
    let mean = sum / n as f64;
    let (mut total, mut between, mut within) = (0.0f64, 0.0f64, 0.0f64);
    for k in 0..starts.len() {
        let vs = turn(k);
        let turn_mean = vs.iter().map(|&v| v as f64).sum::<f64>() / vs.len() as f64;
        between += vs.len() as f64 * (turn_mean - mean).powi(2);
        for &v in vs {
            total += (v as f64 - mean).powi(2);
            within += (v as f64 - turn_mean).powi(2);
        }
    }
    let n = n as f64;
    (total / n, between / n, within / n)
}

fn write_jumps(values: &[f32], starts: &[i64], ends: &[i64], out: &mut [MaybeUninit<f32>]) {
    for (k, o) in out.iter_mut().enumerate() {
        o.write(match starts.get(k + 1) {
            Some(&next) => values[next as usize] - values[ends[k] as usize - 1],
            None => f32::NAN,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_shares() {
        // turn values [1, 1] | obs | [3, 3]: all variance is between turns.
        let v = [1.0, 1.0, f32::NAN, 3.0, 3.0, 0.0, 2.0];
        let mask = [1, 1, 0, 1, 1, 1, 1];
        let s = value_structure(&v, &mask, &[0, 5, 7]).unwrap();
        assert_eq!(s.total[0], 1.0);
        assert_eq!(s.between[0], 1.0);
        assert_eq!(s.within[0], 0.0);
        assert_eq!(s.jumps[0], 2.0);
        assert!(s.jumps[1].is_nan());
        // trajectory 1: one turn [0, 2]: all within.
        assert_eq!((s.total[1], s.between[1], s.within[1]), (1.0, 0.0, 1.0));
    }

    #[test]
    fn nan_values_on_policy_tokens_are_rejected() {
        let e = value_structure(&[0.0, f32::NAN], &[1, 1], &[0, 2]).unwrap_err();
        assert!(e.to_string().contains("token 1"), "{e}");
    }
}
