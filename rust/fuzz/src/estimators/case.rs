//! The estimator target's input: [`Case`], one call of a core entry point, decoded from
//! fuzzer bytes, mostly well formed with adversarial numbers, parameters and layouts
//! mixed in.

use arbitrary::Unstructured;
use mpo_core::{BiLevelParams, GaeParams, GroupParams, MaeParams, Rewards};

use crate::reference;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Segment,
    Mae,
    Gae,
    Group,
    Broadcast,
    BiLevel,
}

/// One call of a core entry point, with every argument as it will be passed.
#[derive(Debug, Clone)]
pub struct Case {
    pub kind: Kind,
    pub mask: Vec<u8>,
    pub offsets: Vec<i64>,
    pub values: Vec<f32>,
    /// Token-level rewards (MAE/GAE) when `scores` is None.
    pub rewards: Vec<f32>,
    /// Per-trajectory scores (MAE/GAE with a score, and the group estimators).
    pub scores: Option<Vec<f32>>,
    pub mae: MaeParams,
    pub gae: GaeParams,
    pub group: GroupParams,
    pub bilevel: BiLevelParams,
    pub group_index: Vec<i64>,
    pub n_groups: usize,
    /// Per-trajectory values for `broadcast_to_tokens`.
    pub per_traj: Vec<f32>,
    /// Truncation flags (MAE/GAE), one per trajectory of `offsets`; empty: not given.
    pub truncated: Vec<bool>,
    /// Per-turn rewards (MAE/GAE, well-formed layouts only): when set, `rewards` holds
    /// them placed on each turn's last policy token, so the validator judges the same
    /// batch, and the core is called with the per-turn form.
    pub turn_rewards: Option<Vec<f32>>,
}

/// Extreme numbers mixed into "dirty" inputs.
const SPECIAL_F32: [f32; 18] = [
    f32::NAN,
    -f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    3.0e38,
    -3.0e38,
    f32::MAX,
    f32::MIN,
    1e30,
    -1e30,
    1e20,
    f32::MIN_POSITIVE,
    1e-45, // subnormal
    -0.0,
    0.0,
    1e6,
    -1e6,
    65504.0,
];

fn number(u: &mut Unstructured<'_>, dirty: bool) -> arbitrary::Result<f32> {
    if dirty && u.ratio(1, 6)? {
        return Ok(*u.choose(&SPECIAL_F32)?);
    }
    let x: u16 = u.arbitrary()?;
    // Small integers now and then: ties and exact zeros.
    if x % 16 == 0 {
        return Ok((x / 16 % 5) as f32 - 2.0);
    }
    Ok(x as f32 / 65535.0 * 8.0 - 4.0)
}

/// A value in [0, 1] (edges included); dirty: sometimes outside or not finite.
fn unit(u: &mut Unstructured<'_>, dirty: bool) -> arbitrary::Result<f64> {
    if dirty && u.ratio(1, 4)? {
        return Ok(*u.choose(&[-0.1, 1.5, 1.0 + 1e-12, f64::NAN, f64::INFINITY, -0.0, -1e-300])?);
    }
    Ok(match u.int_in_range(0u8..=9)? {
        0 => 0.0,
        1 => 1.0,
        _ => u.int_in_range(0u32..=1_000_000)? as f64 / 1e6,
    })
}

fn gamma(u: &mut Unstructured<'_>, dirty: bool) -> arbitrary::Result<f64> {
    if dirty && u.ratio(1, 4)? {
        return Ok(*u.choose(&[0.0, -1.0, 1.01, f64::NAN, f64::NEG_INFINITY])?);
    }
    Ok(match u.int_in_range(0u8..=9)? {
        0..=2 => 1.0,
        3 => 1e-300,
        _ => u.int_in_range(1u32..=1_000_000)? as f64 / 1e6,
    })
}

impl Case {
    /// Builds a case from fuzzer bytes (any bytes give a case; missing bytes read as 0).
    pub fn decode(data: &[u8]) -> arbitrary::Result<Self> {
        let mut u = Unstructured::new(data);
        let u = &mut u;
        let kind = *u.choose(&[Kind::Segment, Kind::Mae, Kind::Gae, Kind::Group, Kind::Broadcast, Kind::BiLevel])?;
        let dirty_numbers = u.ratio(1, 4)?;
        let dirty_params = u.ratio(1, 8)?;
        let dirty_layout = u.ratio(1, 5)?;

        // Trajectories: alternating observation / policy runs, possibly empty.
        let n_traj = u.int_in_range(0usize..=8)?;
        let mut mask = Vec::new();
        let mut offsets = vec![0i64];
        for _ in 0..n_traj {
            let mut policy = u.arbitrary::<bool>()?;
            for _ in 0..u.int_in_range(0usize..=6)? {
                let len = u.int_in_range(1usize..=8)?;
                mask.extend(std::iter::repeat_n(policy as u8, len));
                policy = !policy;
            }
            offsets.push(mask.len() as i64);
        }
        let n_tok = mask.len();
        let mut values = Vec::with_capacity(n_tok);
        for q in 0..n_tok {
            // Values off-policy are never read: anything goes there.
            values.push(if mask[q] == 0 && u.ratio(1, 3)? { f32::NAN } else { number(u, dirty_numbers)? });
        }
        let mut rewards = vec![0.0f32; n_tok];
        let dense = u.arbitrary::<bool>()?;
        for q in 0..n_tok {
            if mask[q] != 0 && (dense || u.ratio(1, 4)?) {
                rewards[q] = number(u, dirty_numbers)?;
            }
        }
        let mut scores = None;
        if matches!(kind, Kind::Group) || u.arbitrary::<bool>()? {
            let mut s = Vec::with_capacity(n_traj);
            for _ in 0..n_traj {
                s.push(number(u, dirty_numbers)?);
            }
            scores = Some(s);
        }
        let mae = MaeParams {
            lam: unit(u, dirty_params)?,
            lam_intra: unit(u, dirty_params)?,
            beta: if dirty_params && u.ratio(1, 4)? {
                *u.choose(&[-0.5, f64::NAN, f64::INFINITY, 1e300, 1e30])?
            } else {
                u.int_in_range(0u32..=4_000_000)? as f64 / 1e6
            },
            gamma: gamma(u, dirty_params)?,
            lam_critic: unit(u, dirty_params)?,
        };
        let alpha = if u.arbitrary::<bool>()? {
            None
        } else if dirty_params && u.ratio(1, 3)? {
            Some(*u.choose(&[0.0, -1.0, f64::NAN, f64::INFINITY])?)
        } else {
            Some(u.int_in_range(1u32..=10_000_000)? as f64 / 1e6)
        };
        let gae = GaeParams {
            gamma: gamma(u, dirty_params)?,
            lam: unit(u, dirty_params)?,
            lam_critic: unit(u, dirty_params)?,
            length_adaptive_alpha: alpha,
        };
        let eps = if dirty_params && u.ratio(1, 3)? {
            *u.choose(&[0.0, -1e-6, f64::NAN, f64::INFINITY, -0.0])?
        } else {
            *u.choose(&[1e-6, 1e-8, 1e-300, 0.1, 1.0])?
        };
        let group = GroupParams { norm_std: u.arbitrary()?, eps, leave_one_out: u.ratio(1, 3)? };
        let n_groups = u.int_in_range(1usize..=n_traj.max(1) + 1)?;
        let mut group_index = Vec::with_capacity(n_traj);
        for _ in 0..n_traj {
            group_index.push(u.int_in_range(0..=n_groups as i64 - 1)?);
        }
        let mut per_traj = Vec::with_capacity(n_traj);
        for _ in 0..n_traj {
            per_traj.push(number(u, dirty_numbers)?);
        }
        // Decoded last, so the bytes of the other parameters read as before.
        let bilevel = BiLevelParams {
            lam: unit(u, dirty_params)?,
            gamma: gamma(u, dirty_params)?,
            high_level_gamma: gamma(u, dirty_params)?,
        };
        let mut case = Case {
            kind,
            mask,
            offsets,
            values,
            rewards,
            scores,
            mae,
            gae,
            group,
            bilevel,
            group_index,
            n_groups,
            per_traj,
            truncated: Vec::new(),
            turn_rewards: None,
        };
        if dirty_layout {
            case.break_layout(u)?;
        }
        // Drawn last, so the earlier draws (and so older corpora) decode as before.
        if u.ratio(1, 3)? {
            for _ in 0..case.offsets.len().saturating_sub(1) {
                case.truncated.push(u.arbitrary()?);
            }
        }
        if !dirty_layout && matches!(kind, Kind::Mae | Kind::Gae) && u.ratio(1, 3)? {
            let turns = reference::segment(&case.mask, &case.offsets);
            let mut per_turn = Vec::with_capacity(turns.ends.len());
            case.rewards.iter_mut().for_each(|r| *r = 0.0);
            for &end in &turns.ends {
                let r = number(u, false)?;
                case.rewards[end as usize - 1] = r;
                per_turn.push(r);
            }
            case.scores = None;
            case.turn_rewards = Some(per_turn);
        }
        Ok(case)
    }

    /// One structural defect: offsets, lengths, mask bytes, observation rewards, groups.
    fn break_layout(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let n_off = self.offsets.len();
        match u.int_in_range(0u8..=13)? {
            0 => self.offsets.clear(),
            1 => self.offsets[0] = *u.choose(&[1, -1, i64::MIN])?,
            2 if n_off >= 3 => {
                let k = u.int_in_range(1..=n_off - 2)?;
                self.offsets[k] = self.offsets[k + 1] + u.int_in_range(1i64..=3)?;
            }
            3 => {
                *self.offsets.last_mut().expect("break_layout makes one defect; the offsets start as [0]") +=
                    u.int_in_range(1i64..=3)?
            }
            4 => *self.offsets.last_mut().expect("break_layout makes one defect; the offsets start as [0]") -= 1,
            5 => {
                let k = u.choose_index(n_off)?;
                self.offsets[k] = *u.choose(&[i64::MAX, i64::MIN, -1, 1 << 40])?;
            }
            6 => {
                if u.arbitrary()? {
                    self.values.pop();
                } else {
                    self.values.push(0.0);
                }
            }
            7 => {
                if u.arbitrary()? {
                    self.rewards.pop();
                } else {
                    self.rewards.push(0.0);
                }
            }
            8 => match &mut self.scores {
                Some(s) if u.arbitrary()? => {
                    s.pop();
                }
                Some(s) => s.push(1.0),
                None => self.per_traj.push(1.0),
            },
            9 | 10 if !self.mask.is_empty() => {
                let q = u.choose_index(self.mask.len())?;
                self.mask[q] = u.int_in_range(2u8..=255)?;
            }
            11 => {
                let obs: Vec<usize> = (0..self.mask.len()).filter(|&q| self.mask[q] == 0).collect();
                if !obs.is_empty() {
                    let q = *u.choose(&obs)?;
                    self.rewards[q] = *u.choose(&[0.5, -1.0, f32::NAN, f32::INFINITY, 1e-45])?;
                }
            }
            12 if !self.group_index.is_empty() => {
                let k = u.choose_index(self.group_index.len())?;
                self.group_index[k] = *u.choose(&[-1, self.n_groups as i64, i64::MAX, i64::MIN])?;
            }
            _ => {
                if u.arbitrary()? {
                    self.group_index.pop();
                } else {
                    self.group_index.push(0);
                }
            }
        }
        Ok(())
    }

    pub(super) fn reward_source(&self) -> Rewards<'_> {
        match &self.scores {
            Some(s) => Rewards::Score(s),
            None => Rewards::Token(&self.rewards),
        }
    }
}
