//! The GiGPO fuzz target: bytes → a structured call of `mpo_core::gigpo_advantages` → the
//! result checked against the input rules and the formulas (docs/estimators.md, "GiGPO").
//!
//! Inputs are mostly well formed, with adversarial parts mixed in: mask bytes other than
//! 0/1, wrong lengths (anchor ids, token ids, group ids), group codes out of range,
//! non-finite or huge rewards and scores, rewards on observation tokens, parameters
//! outside their domain, no anchors at all, both anchor sources, `anchor = prefix` beside
//! ids. Token ids come from a small vocabulary that holds a pair whose anchor hashes
//! collide ([`COLLIDING`]), so hashes alone would merge distinct states; anchor ids span
//! the whole int64 range (uint64 ids beyond it are refused before the core: the Python
//! fuzzer, tests/test_fuzz_api.py, holds that rule). An independent validator says what
//! the core must do:
//!
//! - invalid input: a typed error (never a panic, never a result);
//! - valid input with moderate numbers: success, outputs of the right lengths, equal to a
//!   slow reference written from the formulas (step groups keyed by the token sequences
//!   themselves, not by their hash) to 1e-5 relative, 0 on observation tokens, and bitwise
//!   equal on a one-thread and a four-thread pool;
//! - valid input with huge numbers: success with finite outputs, or a typed error.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::Unstructured;
use mpo_core::{gigpo_advantages, Anchor, Anchors, GigpoOutput, GigpoParams, Groups, MpoError, Rewards, TurnIds};

use crate::Failure;

/// Largest |number| of a "clean" input.
const CLEAN: f32 = 1e4;

/// Two token ids whose anchor hashes (FNV-1a 64 of their little-endian bytes) collide:
/// found by a parallel collision search (Pollard's rho, distinguished points); the unit
/// test below checks it.
pub const COLLIDING: [i64; 2] = [4017207813578192166, -348170734932881874];

/// One call of `gigpo_advantages`, every argument as it is passed.
#[derive(Debug, Clone)]
pub struct Case {
    pub mask: Vec<u8>,
    pub offsets: Vec<i64>,
    pub rewards: Vec<f32>,
    pub scores: Option<Vec<f32>>,
    pub group_index: Vec<i64>,
    pub n_groups: usize,
    pub turn_state_ids: Option<Vec<i64>>,
    pub token_ids: Option<Vec<i64>>,
    pub params: GigpoParams,
}

fn number(u: &mut Unstructured<'_>, dirty: bool) -> arbitrary::Result<f32> {
    if dirty && u.ratio(1, 8)? {
        return Ok(*u.choose(&[f32::NAN, f32::INFINITY, -3e38, 3e38, 1e20, -0.0, 1e-45])?);
    }
    Ok(match u.int_in_range(0u8..=4)? {
        0 => 0.0,
        1 => 1.0,
        _ => u.int_in_range(0u16..=800)? as f32 / 100.0 - 4.0,
    })
}

impl Case {
    pub fn from_bytes(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let dirty = u.ratio(1, 4)?;
        let n = u.int_in_range(0usize..=8)?;
        let (mut mask, mut offsets, mut tokens) = (Vec::new(), vec![0i64], Vec::new());
        let mut n_turns = 0;
        for _ in 0..n {
            let mut policy = u.arbitrary::<bool>()?;
            for _ in 0..u.int_in_range(0usize..=6)? {
                n_turns += usize::from(policy);
                for _ in 0..u.int_in_range(1usize..=3)? {
                    mask.push(policy as u8);
                    tokens.push(u.int_in_range(0i64..=2)?);
                }
                policy = !policy;
            }
            offsets.push(mask.len() as i64);
        }
        if dirty && !mask.is_empty() && u.ratio(1, 8)? {
            let q = u.choose_index(mask.len())?;
            mask[q] = 2;
        }
        let mut rewards = vec![0f32; mask.len()];
        let scores = if u.arbitrary()? {
            Some((0..n).map(|_| number(u, dirty)).collect::<arbitrary::Result<Vec<_>>>()?)
        } else {
            for (r, &m) in rewards.iter_mut().zip(&mask) {
                if m == 1 || (dirty && u.ratio(1, 40)?) {
                    *r = number(u, dirty)?;
                }
            }
            None
        };
        let n_groups = u.int_in_range(1usize..=3)?;
        let mut group_index: Vec<i64> =
            (0..n).map(|_| u.int_in_range(0..=n_groups as i64 - 1)).collect::<arbitrary::Result<_>>()?;
        if dirty && n > 0 && u.ratio(1, 10)? {
            group_index[n - 1] = *u.choose(&[-1, n_groups as i64])?;
        }
        // Some batches read their tokens over a vocabulary with a colliding pair.
        if u.ratio(1, 3)? {
            for t in &mut tokens {
                *t = [COLLIDING[0], COLLIDING[1], 2][*t as usize];
            }
        }
        let mut turn_state_ids = None;
        let mut token_ids = None;
        let mut ids_given = false;
        match u.int_in_range(0u8..=4)? {
            0 | 1 => {
                let extra = if dirty && u.ratio(1, 8)? { 1 } else { 0 };
                let id = |u: &mut Unstructured<'_>| -> arbitrary::Result<i64> {
                    Ok(*u.choose(&[0, 1, 2, 3, -1, i64::MIN, i64::MAX])?)
                };
                let ids = (0..n_turns + extra).map(|_| id(u)).collect::<arbitrary::Result<_>>()?;
                turn_state_ids = Some(ids);
                ids_given = true;
                if dirty && u.ratio(1, 8)? {
                    token_ids = Some(tokens); // both sources: refused
                }
            }
            2 | 3 => {
                if dirty && u.ratio(1, 8)? {
                    tokens.push(0);
                }
                token_ids = Some(tokens);
            }
            _ if dirty => {}
            _ => token_ids = Some(tokens),
        }
        let pick = |u: &mut Unstructured<'_>, clean: f64, bad: &[f64]| -> arbitrary::Result<f64> {
            if dirty && u.ratio(1, 10)? {
                Ok(*u.choose(bad)?)
            } else {
                Ok(clean)
            }
        };
        let gamma = u.int_in_range(1u32..=100)? as f64 / 100.0;
        let step_weight = u.int_in_range(0u32..=30)? as f64 / 10.0;
        let params = GigpoParams {
            gamma: pick(u, gamma, &[0.0, 1.5, f64::NAN])?,
            step_weight: pick(u, step_weight, &[-1.0, f64::INFINITY])?,
            norm_std: u.arbitrary()?,
            eps: pick(u, 1e-6, &[0.0, -1e-6, f64::NAN])?,
            // `prefix` reads token ids; beside ids it would do nothing (refused): dirty only.
            anchor: if u.arbitrary()? && (!ids_given || (dirty && u.ratio(1, 4)?)) {
                Anchor::Prefix
            } else {
                Anchor::Observation
            },
        };
        Ok(Case { mask, offsets, rewards, scores, group_index, n_groups, turn_state_ids, token_ids, params })
    }

    fn call(&self) -> Result<GigpoOutput, MpoError> {
        let rewards = match &self.scores {
            Some(s) => Rewards::Score(s),
            None => Rewards::Token(&self.rewards),
        };
        let anchors = Anchors {
            turn_state_ids: self.turn_state_ids.as_deref().map(|ids| TurnIds { ids, offsets: None }),
            token_ids: self.token_ids.as_deref(),
        };
        let groups = Groups { index: &self.group_index, n_groups: self.n_groups };
        gigpo_advantages(&self.mask, &self.offsets, rewards, groups, anchors, &self.params)
    }
}

/// The turns of each trajectory, as flat (start, end).
fn turns(c: &Case) -> Vec<Vec<(usize, usize)>> {
    c.offsets
        .windows(2)
        .map(|w| {
            let (mut out, mut q) = (Vec::new(), w[0] as usize);
            while q < w[1] as usize {
                if c.mask[q] == 1 {
                    let start = q;
                    while q < w[1] as usize && c.mask[q] == 1 {
                        q += 1;
                    }
                    out.push((start, q));
                } else {
                    q += 1;
                }
            }
            out
        })
        .collect()
}

/// Whether the core must accept the input, and whether its numbers are moderate.
fn judge(c: &Case) -> (bool, bool) {
    let p = &c.params;
    let params_ok = p.gamma > 0.0 && p.gamma <= 1.0 && p.step_weight >= 0.0 && p.step_weight.is_finite() && p.eps > 0.0;
    let mask_ok = c.mask.iter().all(|&m| m <= 1);
    let n_turns: usize = turns(c).iter().map(Vec::len).sum();
    // Exactly one source; `anchor = prefix` only with token ids.
    let anchors_ok = match (&c.turn_state_ids, &c.token_ids) {
        (Some(ids), None) => ids.len() == n_turns && p.anchor == Anchor::Observation,
        (None, Some(t)) => t.len() == c.mask.len(),
        _ => false,
    };
    let groups_ok = c.group_index.iter().all(|&g| g >= 0 && (g as usize) < c.n_groups);
    let rewards_ok = match &c.scores {
        Some(s) => s.iter().all(|x| x.is_finite()),
        None => c.rewards.iter().zip(&c.mask).all(|(r, &m)| r.is_finite() && (m == 1 || *r == 0.0)),
    };
    let clean = c.rewards.iter().chain(c.scores.iter().flatten()).all(|x| x.abs() <= CLEAN);
    (params_ok && mask_ok && anchors_ok && groups_ok && rewards_ok, clean)
}

/// The slow reference: dictionaries of groups, f64, from the formulas.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let p = &c.params;
    let traj_turns = turns(c);
    let n = traj_turns.len();
    let mut r: Vec<Vec<f64>> = Vec::new();
    let mut ret = Vec::new();
    for (j, own) in traj_turns.iter().enumerate() {
        let row: Vec<f64> = match &c.scores {
            Some(s) => (0..own.len()).map(|t| if t + 1 == own.len() { s[j] as f64 } else { 0.0 }).collect(),
            None => own.iter().map(|&(a, b)| c.rewards[a..b].iter().map(|&x| x as f64).sum()).collect(),
        };
        ret.push(c.scores.as_ref().map_or_else(|| row.iter().sum(), |s| s[j] as f64));
        r.push(row);
    }
    let mut flat_turn = 0;
    let mut state: Vec<Vec<Vec<i64>>> = Vec::new();
    for (j, own) in traj_turns.iter().enumerate() {
        let mut row = Vec::new();
        for (t, &(a, _)) in own.iter().enumerate() {
            row.push(match (&c.turn_state_ids, &c.token_ids) {
                (Some(ids), _) => vec![ids[flat_turn + t], i64::MIN],
                (None, Some(tok)) => {
                    let since = if p.anchor == Anchor::Prefix || t == 0 { c.offsets[j] as usize } else { own[t - 1].1 };
                    tok[since..a].to_vec()
                }
                _ => unreachable!("judged valid"),
            });
        }
        flat_turn += own.len();
        state.push(row);
    }
    let centred = |x: f64, xs: &[f64]| -> f64 {
        if xs.len() < 2 {
            return 0.0;
        }
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        if !p.norm_std {
            return x - mean;
        }
        let std = (xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt();
        (x - mean) / (std + p.eps)
    };
    let g: Vec<Vec<f64>> = r
        .iter()
        .map(|row| {
            (0..row.len()).map(|t| (t..row.len()).map(|k| p.gamma.powi((k - t) as i32) * row[k]).sum()).collect()
        })
        .collect();
    let mut episode = vec![0f64; n];
    let mut step: Vec<Vec<f64>> = g.iter().map(|row| vec![0.0; row.len()]).collect();
    for group in 0..c.n_groups as i64 {
        let members: Vec<usize> = (0..n).filter(|&j| c.group_index[j] == group).collect();
        let rs: Vec<f64> = members.iter().map(|&j| ret[j]).collect();
        let mut by_state: BTreeMap<&[i64], Vec<(usize, usize)>> = BTreeMap::new();
        for &j in &members {
            episode[j] = centred(ret[j], &rs);
            for t in 0..g[j].len() {
                by_state.entry(&state[j][t]).or_default().push((j, t));
            }
        }
        for pairs in by_state.values() {
            let gs: Vec<f64> = pairs.iter().map(|&(j, t)| g[j][t]).collect();
            for &(j, t) in pairs {
                step[j][t] = centred(g[j][t], &gs);
            }
        }
    }
    let mut tokens = vec![0f64; c.mask.len()];
    for (j, own) in traj_turns.iter().enumerate() {
        for (t, &(a, b)) in own.iter().enumerate() {
            tokens[a..b].fill(episode[j] + p.step_weight * step[j][t]);
        }
    }
    (tokens, episode, step.concat())
}

fn compare(name: &str, got: &[f32], want: &[f64]) -> Result<(), Failure> {
    if got.len() != want.len() {
        return Err(Failure::new(format!("{name}: {} values, expected {}", got.len(), want.len())));
    }
    match got.iter().zip(want).position(|(&g, &w)| (g as f64 - w).abs() > 1e-5 * (1.0 + w.abs())) {
        Some(i) => Err(Failure::new(format!("{name}[{i}] = {}, the reference says {}", got[i], want[i]))),
        None => Ok(()),
    }
}

fn pool(threads: usize) -> &'static rayon::ThreadPool {
    static POOLS: OnceLock<[rayon::ThreadPool; 2]> = OnceLock::new();
    let pools = POOLS.get_or_init(|| {
        let build = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a thread pool");
        [build(1), build(4)]
    });
    &pools[usize::from(threads > 1)]
}

/// Runs one input; returns the outcome's class or a failure.
pub fn check(data: &[u8]) -> Result<&'static str, Failure> {
    let mut u = Unstructured::new(data);
    let Ok(c) = Case::from_bytes(&mut u) else { return Ok("gigpo-short-input") };
    check_case(&c)
}

pub fn check_case(c: &Case) -> Result<&'static str, Failure> {
    let (valid, clean) = judge(c);
    let got = pool(1).install(|| c.call());
    match (valid, got) {
        (false, Err(_)) => Ok("gigpo-refused"),
        (false, Ok(_)) => Err(Failure::new(format!("invalid input accepted: {c:?}"))),
        (true, Err(e)) if !clean => {
            Ok(if e.to_string().contains("overflows") { "gigpo-overflow" } else { "gigpo-refused-huge" })
        }
        (true, Err(e)) => Err(Failure::new(format!("valid input refused: {e}; {c:?}"))),
        (true, Ok(out)) => {
            let finite = out.advantages.iter().chain(&out.episode_advantages).chain(&out.step_advantages);
            if !finite.clone().all(|x| x.is_finite()) {
                return Err(Failure::new(format!("a non-finite output from accepted input: {c:?}")));
            }
            if c.mask.iter().zip(&out.advantages).any(|(&m, &a)| m == 0 && a != 0.0) {
                return Err(Failure::new(format!("an observation token got an advantage: {c:?}")));
            }
            if !clean {
                return Ok("gigpo-ok-huge");
            }
            let (tokens, episode, step) = reference(c);
            compare("advantages", &out.advantages, &tokens)?;
            compare("episode_advantages", &out.episode_advantages, &episode)?;
            compare("step_advantages", &out.step_advantages, &step)?;
            let many = pool(4).install(|| c.call()).map_err(|e| Failure::new(format!("4 threads refused: {e}")))?;
            let bits =
                |o: &GigpoOutput| (o.advantages.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), o.step_groups.clone());
            if bits(&out) != bits(&many) {
                return Err(Failure::new(format!("results differ between 1 and 4 threads: {c:?}")));
            }
            Ok("gigpo-ok")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_class_is_reached() {
        let mut seen = std::collections::BTreeSet::new();
        let mut state = 5u64;
        for _ in 0..4000 {
            let data: Vec<u8> = (0..300)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (state >> 33) as u8
                })
                .collect();
            match check(&data) {
                Ok(class) => seen.insert(class),
                Err(f) => panic!("{f}"),
            };
        }
        for class in ["gigpo-ok", "gigpo-refused"] {
            assert!(seen.contains(class), "{seen:?}");
        }
    }

    #[test]
    fn the_colliding_pair_collides_and_is_two_states() {
        assert_eq!(mpo_core::anchor_hash(&COLLIDING[..1]), mpo_core::anchor_hash(&COLLIDING[1..]));
        // Two trajectories of one group whose observations are the pair: two step groups.
        let c = Case {
            mask: vec![0, 1, 0, 1],
            offsets: vec![0, 2, 4],
            rewards: vec![0.0, 1.0, 0.0, -1.0],
            scores: None,
            group_index: vec![0, 0],
            n_groups: 1,
            turn_state_ids: None,
            token_ids: Some(vec![COLLIDING[0], 7, COLLIDING[1], 7]),
            params: GigpoParams::default(),
        };
        assert_eq!(check_case(&c), Ok("gigpo-ok"));
        assert_eq!(c.call().unwrap().step_groups, vec![0, 1]);
    }
}
