//! GiGPO (docs/estimators.md, "GiGPO"): GRPO's episode baseline over the trajectories of a
//! group plus a step baseline over the group's turns that start from the same anchor state.
//!
//!   episode: R_j = Σ_t r_{j,t};  A_E(j) = R_j − mean_g(R)            [÷ (std_g(R) + ε)]
//!   step:    G_{j,t} = Σ_{k≥t} γ^{k−t} r_{j,k};  A_S(j,t) = G_{j,t} − mean_S(G)  [÷ (std_S(G) + ε)]
//!   token:   A_{j,t,i} = A_E(j) + w·A_S(j,t) on the policy tokens of turn t, 0 elsewhere
//!
//! S is the step group of (j, t): the turns of j's group with the same anchor id. A group
//! (or step group) of one gets 0; std is unbiased. Per-turn inputs are read in parallel
//! over trajectories, the baselines in parallel over groups, each group summed by one
//! thread in trajectory and turn order: results are bitwise identical for any thread count.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::error::{MpoError, Result};
use crate::estimate::Groups;
use crate::layout::{expect_len, split_by, Layout, Rewards};
use crate::output::OutBuf;
use crate::parallel::{try_for_each_trajectory, try_map_trajectories};
use crate::params::{Anchor, GigpoParams};
use crate::turns::{segment, Turns};

/// One id per turn: the batch's turns in order (`offsets` None), or with `offsets`
/// (`ids[offsets[j]..offsets[j+1]]` are trajectory `j`'s) so a count that disagrees is
/// named by trajectory.
#[derive(Debug, Clone, Copy)]
pub struct TurnIds<'a> {
    pub ids: &'a [i64],
    pub offsets: Option<&'a [i64]>,
}

/// Where GiGPO's anchor states come from: ids given per turn win; else the token ids
/// (aligned with the mask) are hashed per the `anchor` option.
#[derive(Debug, Clone, Copy, Default)]
pub struct Anchors<'a> {
    pub turn_state_ids: Option<TurnIds<'a>>,
    pub token_ids: Option<&'a [i64]>,
}

impl Anchors<'_> {
    pub fn is_empty(&self) -> bool {
        self.turn_state_ids.is_none() && self.token_ids.is_none()
    }
}

/// What GiGPO computes. `turn_advantages[t]` = A_E + w·A_S, the value on every policy token
/// of turn t; `step_groups` are dense ids, numbered group by group (groups in code order),
/// within a group in order of first appearance (trajectory, then turn order).
#[derive(Debug, Clone, PartialEq)]
pub struct GigpoOutput {
    pub advantages: Vec<f32>,
    pub turn_advantages: Vec<f32>,
    pub episode_advantages: Vec<f32>,
    pub step_advantages: Vec<f32>,
    pub step_groups: Vec<i64>,
    pub turns: Turns,
}

/// 64-bit FNV-1a over the little-endian bytes of each token id: the anchor hash.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[inline]
fn fnv_extend(mut h: u64, tokens: &[i64]) -> u64 {
    for &t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    h
}

/// The anchor hash of a token-id sequence (FNV-1a 64 of its little-endian int64 bytes).
pub fn anchor_hash(tokens: &[i64]) -> u64 {
    fnv_extend(FNV_OFFSET, tokens)
}

/// The message when neither anchor source is given.
pub(crate) const NO_ANCHORS: &str = "the gigpo estimator needs anchor states: give `turn_state_ids` (one int64 id per \
     turn) or `token_ids` (one per token, aligned with the mask; hashed per the `anchor` option)";

/// GiGPO's per-batch inputs, before any baseline: the turns, each trajectory's episode
/// return R_j and each turn's step return G_{j,t} and anchor id. A rollout log whose groups
/// span batches gathers its baselines from these ([`gigpo_centred`] over the statistics it
/// keeps) and writes them with [`gigpo_finish`], as [`gigpo_advantages`] does in one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct GigpoInputs {
    pub turns: Turns,
    pub episode_return: Vec<f64>,
    pub step_return: Vec<f64>,
    pub anchor: Vec<u64>,
}

/// GiGPO over a ragged batch: `rewards` per token (summed per turn) or a score per
/// trajectory (on its last turn; a trajectory without turns keeps it as its return),
/// `groups` one per trajectory, anchor states from `anchors`.
pub fn gigpo_advantages(
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    groups: Groups<'_>,
    anchors: Anchors<'_>,
    params: &GigpoParams,
) -> Result<GigpoOutput> {
    let n = offsets.len().saturating_sub(1);
    params.validate()?;
    Layout::new(offsets, mask.len())?;
    expect_len("group_ids", groups.index.len(), n, "one per trajectory, len(offsets) - 1")?;
    let GigpoInputs { turns, episode_return, step_return, anchor } =
        gigpo_inputs(mask, offsets, rewards, anchors, params)?;
    for (j, &g) in groups.index.iter().enumerate() {
        if g < 0 || g as u64 >= groups.n_groups as u64 {
            return Err(MpoError::GroupIndex { value: g, trajectory: j, n_groups: groups.n_groups });
        }
    }

    // Group members in trajectory order (a counting sort), then each group on one thread.
    let mut starts = vec![0usize; groups.n_groups + 1];
    for &g in groups.index {
        starts[g as usize + 1] += 1;
    }
    for g in 0..groups.n_groups {
        starts[g + 1] += starts[g];
    }
    let mut members = vec![0usize; n];
    let mut next = starts.clone();
    for (j, &g) in groups.index.iter().enumerate() {
        members[next[g as usize]] = j;
        next[g as usize] += 1;
    }
    let per_group: Vec<GroupOut> = (0..groups.n_groups)
        .into_par_iter()
        .with_min_len(4)
        .map(|g| one_group(&members[starts[g]..starts[g + 1]], &episode_return, &step_return, &anchor, &turns, params))
        .collect();

    // Scatter in group order: step-group ids are dense, group by group.
    let mut episode = vec![0f64; n];
    let mut step = vec![0f64; turns.n_turns()];
    let mut step_groups = vec![0i64; turns.n_turns()];
    let mut base = 0i64;
    for (g, out) in per_group.iter().enumerate() {
        for (&j, &a) in members[starts[g]..starts[g + 1]].iter().zip(&out.episode) {
            episode[j] = a;
        }
        for &(t, a, id) in &out.steps {
            step[t] = a;
            step_groups[t] = base + id as i64;
        }
        base += out.n_step_groups as i64;
    }
    let mut out = gigpo_finish(mask, offsets, turns, episode, step, params)?;
    out.step_groups = step_groups;
    Ok(out)
}

/// GiGPO's inputs checked (the parameters, the batch's layout, the rewards, the anchor
/// sources) and read: per trajectory R_j, per turn G_{j,t} (γ once per turn) and the anchor
/// id (ids given per turn, else the hash of the token ids per `params.anchor`).
pub fn gigpo_inputs(
    mask: &[u8],
    offsets: &[i64],
    rewards: Rewards<'_>,
    anchors: Anchors<'_>,
    params: &GigpoParams,
) -> Result<GigpoInputs> {
    params.validate()?;
    let layout = Layout::new(offsets, mask.len())?;
    rewards.check_shape(&layout)?;
    let n = layout.n_trajectories();
    if let Some(t) = anchors.token_ids {
        layout.expect_tokens("token_ids", t.len())?;
    }
    if anchors.is_empty() {
        return Err(MpoError::Input(NO_ANCHORS.into()));
    }
    let turns = segment(&layout, mask)?;
    if let Some(ids) = anchors.turn_state_ids {
        check_turn_ids(ids, &turns, n)?;
    }
    let n_turns = turns.n_turns();
    let mut step_return = vec![0f64; n_turns];
    let mut anchor = vec![0u64; n_turns];
    let parts =
        split_by(&mut step_return, &turns.traj_offsets).into_par_iter().zip(split_by(&mut anchor, &turns.traj_offsets));
    let episode_return: Vec<f64> = try_map_trajectories(n, |j| episode_inputs(&layout, mask, rewards, &turns, j))?;
    try_for_each_trajectory(parts, |j, (ret, anc)| {
        per_turn(&layout, rewards, anchors, &turns, params, j, ret, anc);
        Ok(())
    })?;
    Ok(GigpoInputs { turns, episode_return, step_return, anchor })
}

/// The per-turn ids' count: the batch's turns, per trajectory with offsets.
fn check_turn_ids(ids: TurnIds<'_>, turns: &Turns, n: usize) -> Result<()> {
    let Some(o) = ids.offsets else {
        return expect_len(
            "turn_state_ids",
            ids.ids.len(),
            turns.n_turns(),
            "one per turn of the batch, a turn being a run of mask == 1",
        );
    };
    if o.len() != n + 1 || o.first() != Some(&0) || o.last() != Some(&(ids.ids.len() as i64)) {
        return Err(MpoError::Capacity(format!(
            "the offsets of `turn_state_ids` must be {} non-decreasing entries from 0 to {}",
            n + 1,
            ids.ids.len()
        )));
    }
    for j in 0..n {
        let got = o[j + 1] - o[j];
        let expected = turns.of_trajectory(j).len();
        if got < 0 {
            return Err(MpoError::Capacity(format!("the offsets of `turn_state_ids` decrease at trajectory {j}")));
        }
        if got as usize != expected {
            return Err(MpoError::TurnCount { arg: "turn_state_ids", trajectory: j, got: got as usize, expected });
        }
    }
    Ok(())
}

/// Checks trajectory `j`'s rewards (finite on policy tokens, zero elsewhere; a finite
/// score) and returns its episode return R_j: the sum of its turn rewards, or its score.
fn episode_inputs(layout: &Layout<'_>, mask: &[u8], rewards: Rewards<'_>, turns: &Turns, j: usize) -> Result<f64> {
    match rewards {
        Rewards::Score(s) => {
            let score = s[j];
            if !score.is_finite() {
                return Err(MpoError::NonFiniteTrajectory { arg: "scores", value: score, trajectory: j });
            }
            Ok(score as f64)
        }
        Rewards::Token(r) => {
            for q in layout.range(j) {
                if !r[q].is_finite() {
                    return Err(MpoError::NonFiniteToken { arg: "rewards", value: r[q], at: layout.at(j, q) });
                }
                if mask[q] == 0 && r[q] != 0.0 {
                    return Err(MpoError::ObservationReward { value: r[q], at: layout.at(j, q) });
                }
            }
            Ok(turns.of_trajectory(j).map(|t| turn_reward(r, turns, t)).sum())
        }
    }
}

/// The sum of turn `t`'s token rewards, in f64, in token order.
#[inline]
fn turn_reward(r: &[f32], turns: &Turns, t: usize) -> f64 {
    r[turns.starts[t] as usize..turns.ends[t] as usize].iter().map(|&x| x as f64).sum()
}

/// Trajectory `j`'s step returns G_{j,t} (γ once per turn) and anchor ids, into its turns'
/// slices; its inputs were checked by [`episode_inputs`].
#[allow(clippy::too_many_arguments)] // one trajectory's inputs and its two output slices
fn per_turn(
    layout: &Layout<'_>,
    rewards: Rewards<'_>,
    anchors: Anchors<'_>,
    turns: &Turns,
    params: &GigpoParams,
    j: usize,
    ret: &mut [f64],
    anc: &mut [u64],
) {
    let own = turns.of_trajectory(j);
    let mut next = 0f64;
    for (k, t) in own.clone().enumerate().rev() {
        let r = match rewards {
            Rewards::Token(r) => turn_reward(r, turns, t),
            Rewards::Score(s) => {
                if t + 1 == own.end {
                    s[j] as f64
                } else {
                    0.0
                }
            }
        };
        next = r + params.gamma * next;
        ret[k] = next;
    }
    if let Some(ids) = anchors.turn_state_ids {
        let first = ids.offsets.map_or(own.start, |o| o[j] as usize);
        for (a, &id) in anc.iter_mut().zip(&ids.ids[first..first + own.len()]) {
            *a = id as u64;
        }
        return;
    }
    let Some(tokens) = anchors.token_ids else { return };
    let range = layout.range(j);
    let (mut prefix, mut hashed) = (FNV_OFFSET, range.start);
    for (k, t) in own.enumerate() {
        let start = turns.starts[t] as usize;
        anc[k] = match params.anchor {
            Anchor::Prefix => {
                prefix = fnv_extend(prefix, &tokens[hashed..start]);
                hashed = start;
                prefix
            }
            Anchor::Observation => {
                let since = if t == turns.traj_offsets[j] as usize { range.start } else { turns.ends[t - 1] as usize };
                anchor_hash(&tokens[since..start])
            }
        };
    }
}

/// One group's baselines: its members' episode advantages (member order), and per turn of
/// its members (global turn, step advantage, local step-group id).
struct GroupOut {
    episode: Vec<f64>,
    steps: Vec<(usize, f64, u32)>,
    n_step_groups: usize,
}

/// x − mean, divided by (unbiased std + eps) with `norm_std`; 0 for a group of one. The
/// baseline of both GiGPO's groups: `count` members, their `mean` and the sum of their
/// squared deviations from it.
#[inline]
pub fn gigpo_centred(x: f64, count: usize, mean: f64, sq_dev: f64, params: &GigpoParams) -> f64 {
    if count < 2 {
        return 0.0;
    }
    if params.norm_std {
        (x - mean) / ((sq_dev / (count - 1) as f64).sqrt() + params.eps)
    } else {
        x - mean
    }
}

fn one_group(
    members: &[usize],
    episode_return: &[f64],
    step_return: &[f64],
    anchor: &[u64],
    turns: &Turns,
    params: &GigpoParams,
) -> GroupOut {
    // Episode: each trajectory once, summed in trajectory order (two-pass variance).
    let n = members.len();
    let mean = members.iter().map(|&j| episode_return[j]).sum::<f64>() / n.max(1) as f64;
    let sq_dev: f64 = members.iter().map(|&j| (episode_return[j] - mean).powi(2)).sum();
    let episode = members.iter().map(|&j| gigpo_centred(episode_return[j], n, mean, sq_dev, params)).collect();

    // Step groups: ids by first appearance; count, sum, then squared deviations.
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut steps: Vec<(usize, f64, u32)> = Vec::new();
    let (mut count, mut sum): (Vec<usize>, Vec<f64>) = (Vec::new(), Vec::new());
    for &j in members {
        for t in turns.of_trajectory(j) {
            let fresh = ids.len() as u32;
            let id = *ids.entry(anchor[t]).or_insert(fresh);
            if id == fresh {
                count.push(0);
                sum.push(0.0);
            }
            count[id as usize] += 1;
            sum[id as usize] += step_return[t];
            steps.push((t, step_return[t], id));
        }
    }
    let means: Vec<f64> = sum.iter().zip(&count).map(|(&s, &c)| s / c as f64).collect();
    let mut sq = vec![0f64; means.len()];
    for &(_, g, id) in &steps {
        sq[id as usize] += (g - means[id as usize]).powi(2);
    }
    for s in &mut steps {
        let id = s.2 as usize;
        s.1 = gigpo_centred(s.1, count[id], means[id], sq[id], params);
    }
    GroupOut { episode, steps, n_step_groups: means.len() }
}

/// The f32 outputs from the f64 baselines (`episode` A_E per trajectory, `step` A_S per
/// turn of `turns`): per turn A_E + w·A_S, written on its policy tokens; a result beyond
/// float32 is an error naming where. `turns` is the batch's segmentation (from
/// [`gigpo_inputs`]); `step_groups` is left empty for the caller to number.
pub fn gigpo_finish(
    mask: &[u8],
    offsets: &[i64],
    turns: Turns,
    episode: Vec<f64>,
    step: Vec<f64>,
    params: &GigpoParams,
) -> Result<GigpoOutput> {
    let layout = Layout::new(offsets, mask.len())?;
    let (n, n_turns) = (layout.n_trajectories(), turns.n_turns());
    expect_len("episode advantages", episode.len(), n, "one per trajectory")?;
    expect_len("step advantages", step.len(), n_turns, "one per turn")?;
    // `turns` must be this batch's segmentation (from [`gigpo_inputs`]).
    expect_len("turns", turns.token_turn.len(), layout.n_tokens(), "the batch's segmentation, one per token")?;
    expect_len("turns", turns.traj_offsets.len(), n + 1, "the batch's segmentation, len(offsets) entries")?;
    let episode_advantages: Vec<f32> = episode.iter().map(|&a| a as f32).collect();
    if let Some(j) = episode_advantages.iter().position(|a| !a.is_finite()) {
        return Err(MpoError::NonFiniteTrajectoryOutput {
            output: "episode_advantages",
            value: episode_advantages[j],
            trajectory: j,
        });
    }
    let mut turn_traj = vec![0usize; turns.n_turns()];
    for j in 0..n {
        for t in turns.of_trajectory(j) {
            turn_traj[t] = j;
        }
    }
    let step_advantages: Vec<f32> = step.iter().map(|&a| a as f32).collect();
    let turn_advantages: Vec<f32> =
        step.iter().zip(&turn_traj).map(|(&s, &j)| (episode[j] + params.step_weight * s) as f32).collect();
    for (t, (&s, &a)) in step_advantages.iter().zip(&turn_advantages).enumerate() {
        let bad =
            if !s.is_finite() { Some(("step_advantages", s)) } else { (!a.is_finite()).then_some(("advantages", a)) };
        if let Some((output, value)) = bad {
            let j = turn_traj[t];
            let at = layout.at(j, turns.starts[t] as usize);
            return Err(MpoError::NonFiniteOutput { output, value, at });
        }
    }
    let mut advantages = OutBuf::<f32>::new(layout.n_tokens());
    let parts = advantages.parts(layout.offsets()).into_par_iter();
    try_for_each_trajectory(parts, |j, out| {
        for (o, q) in out.iter_mut().zip(layout.range(j)) {
            let t = turns.token_turn[q];
            o.write(if t < 0 { 0.0 } else { turn_advantages[t as usize] });
        }
        Ok(())
    })?;
    // SAFETY: every token of every trajectory was written above.
    let advantages = unsafe { advantages.assume_written() };
    Ok(GigpoOutput { advantages, turn_advantages, episode_advantages, step_advantages, step_groups: Vec::new(), turns })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TokenAt;

    // Group 0: A = [obs, t0 t0, obs, t1], B = [obs, t0, obs, t1]; group 1: C = [obs, t0].
    const MASK: [u8; 11] = [0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1];
    const OFFSETS: [i64; 4] = [0, 5, 9, 11];
    const GROUPS: [i64; 3] = [0, 0, 1];
    const SCORES: [f32; 3] = [1.0, 0.0, 5.0];
    // Observations: A [100] then [200]; B [100] then [200]; C [100]. B's first turn differs
    // from A's, so their second turns share an observation but not a prefix.
    const TOKENS: [i64; 11] = [100, 1, 2, 200, 3, 100, 4, 200, 5, 100, 9];

    fn run(anchors: Anchors<'_>, params: &GigpoParams) -> Result<GigpoOutput> {
        let groups = Groups { index: &GROUPS, n_groups: 2 };
        gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&SCORES), groups, anchors, params)
    }

    fn ids(ids: &[i64]) -> Anchors<'_> {
        Anchors { turn_state_ids: Some(TurnIds { ids, offsets: None }), token_ids: None }
    }

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn hand_computed_example() {
        // gamma 0.5: G(A) = [0.5, 1], G(B) = [0, 0], G(C) = [5]. Episode: A +0.5, B −0.5,
        // C alone 0. Step groups: {A0, B0} (state 10) → ±0.25; A1 (20), B1 (30), C0 alone → 0.
        let p = GigpoParams { gamma: 0.5, ..Default::default() };
        let out = run(ids(&[10, 20, 10, 30, 10]), &p).unwrap();
        close(&out.episode_advantages, &[0.5, -0.5, 0.0]);
        close(&out.step_advantages, &[0.25, 0.0, -0.25, 0.0, 0.0]);
        assert_eq!(out.step_groups, vec![0, 1, 0, 2, 3]);
        close(&out.turn_advantages, &[0.75, 0.5, -0.75, -0.5, 0.0]);
        close(&out.advantages, &[0.0, 0.75, 0.75, 0.0, 0.5, 0.0, -0.75, 0.0, -0.5, 0.0, 0.0]);
        assert_eq!(out.turns.n_turns(), 5);
        // step_weight scales A_S only; norm_std divides both by (unbiased std + eps).
        let w = run(ids(&[10, 20, 10, 30, 10]), &GigpoParams { step_weight: 2.0, ..p }).unwrap();
        close(&w.turn_advantages, &[1.0, 0.5, -1.0, -0.5, 0.0]);
        let s = run(ids(&[10, 20, 10, 30, 10]), &GigpoParams { norm_std: true, ..p }).unwrap();
        let (ep_std, step_std) = (0.5f64.sqrt(), (0.125f64).sqrt());
        close(&s.episode_advantages, &[0.5 / (ep_std + 1e-6), -0.5 / (ep_std + 1e-6), 0.0]);
        close(&s.step_advantages, &[0.25 / (step_std + 1e-6), 0.0, -0.25 / (step_std + 1e-6), 0.0, 0.0]);
    }

    #[test]
    fn anchors_from_token_ids() {
        let p = GigpoParams { gamma: 0.5, ..Default::default() };
        let tokens = Anchors { turn_state_ids: None, token_ids: Some(&TOKENS) };
        // Observation: A1 and B1 both follow [200]: one step group, G = 1 and 0.
        let obs = run(tokens, &p).unwrap();
        assert_eq!(obs.step_groups, vec![0, 1, 0, 1, 2]);
        close(&obs.step_advantages, &[0.25, 0.5, -0.25, -0.5, 0.0]);
        // Prefix: their histories differ (B's first turn is another action).
        let prefix = run(tokens, &GigpoParams { anchor: Anchor::Prefix, ..p }).unwrap();
        assert_eq!(prefix.step_groups, vec![0, 1, 0, 2, 3]);
        // Ids given per turn win over token ids.
        let both = Anchors { turn_state_ids: Some(TurnIds { ids: &[1, 2, 3, 4, 5], offsets: None }), ..tokens };
        assert_eq!(run(both, &p).unwrap().step_groups, vec![0, 1, 2, 3, 4]);
        // The hash is FNV-1a 64 over little-endian int64 bytes (fixed: logs may store it).
        assert_eq!(anchor_hash(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(anchor_hash(&[1, 2]), anchor_hash(&[2, 1]));
        assert_ne!(anchor_hash(&[0]), anchor_hash(&[]));
    }

    #[test]
    fn token_rewards_are_summed_per_turn() {
        let mut r = [0f32; 11];
        (r[1], r[2], r[4]) = (0.25, 0.5, 1.0); // A: turn rewards 0.75, 1
        r[8] = 2.0; // B: 0, 2
        r[10] = -1.0;
        let groups = Groups { index: &GROUPS, n_groups: 2 };
        let p = GigpoParams { gamma: 0.5, ..Default::default() };
        let out =
            gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[10, 20, 10, 30, 10]), &p).unwrap();
        // R(A) = 1.75, R(B) = 2: A_E = ∓0.125. G(A0) = 0.75 + 0.5, G(B0) = 1: A_S = ±0.125.
        close(&out.episode_advantages, &[-0.125, 0.125, 0.0]);
        close(&out.step_advantages, &[0.125, 0.0, -0.125, 0.0, 0.0]);
    }

    #[test]
    fn bad_inputs_name_where() {
        let p = GigpoParams::default();
        let e = run(Anchors::default(), &p).unwrap_err();
        assert!(e.to_string().contains("`turn_state_ids`"), "{e}");
        let e = run(ids(&[1, 2, 3]), &p).unwrap_err().to_string();
        assert!(e.contains("`turn_state_ids` has length 3, expected 5"), "{e}");
        let ragged = Anchors {
            turn_state_ids: Some(TurnIds { ids: &[1, 2, 3, 4, 5], offsets: Some(&[0, 1, 4, 5]) }),
            token_ids: None,
        };
        let e = run(ragged, &p).unwrap_err();
        assert_eq!(e, MpoError::TurnCount { arg: "turn_state_ids", trajectory: 0, got: 1, expected: 2 });
        let e = run(Anchors { turn_state_ids: None, token_ids: Some(&TOKENS[..10]) }, &p).unwrap_err().to_string();
        assert!(e.contains("`token_ids` has length 10, expected 11"), "{e}");
        let groups = Groups { index: &[0, 2, 1], n_groups: 2 };
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&SCORES), groups, ids(&[0; 5]), &p).unwrap_err();
        assert!(matches!(e, MpoError::GroupIndex { trajectory: 1, .. }), "{e}");
        let groups = Groups { index: &GROUPS, n_groups: 2 };
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&[1.0, f32::NAN, 0.0]), groups, ids(&[0; 5]), &p)
            .unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteTrajectory { trajectory: 1, .. }), "{e}");
        let mut r = [0f32; 11];
        r[7] = 1.0; // an observation token of B
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0; 5]), &p).unwrap_err();
        assert!(e.to_string().contains("trajectory 1, position 2"), "{e}");
        r[7] = 0.0;
        r[6] = f32::INFINITY;
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0; 5]), &p).unwrap_err();
        assert!(matches!(e, MpoError::NonFiniteToken { arg: "rewards", .. }), "{e}");
        let mut m = MASK;
        m[3] = 2;
        let e = gigpo_advantages(&m, &OFFSETS, Rewards::Score(&SCORES), groups, ids(&[0; 5]), &p).unwrap_err();
        assert!(matches!(e, MpoError::MaskValue { value: 2, .. }), "{e}");
        // Scores near float32's limit: A_E + A_S overflows and is named; so does a return
        // summed over turns beyond float32.
        let big = [3e38f32, -3e38, 0.0];
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&big), groups, ids(&[0; 5]), &p).unwrap_err();
        assert!(
            matches!(e, MpoError::NonFiniteOutput { output: "advantages", at: TokenAt { token: 1, .. }, .. }),
            "{e}"
        );
        let mut r = [0f32; 11];
        (r[2], r[4], r[8]) = (3e38, 3e38, -3e38);
        let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0, 1, 2, 3, 4]), &p).unwrap_err();
        assert!(
            matches!(e, MpoError::NonFiniteTrajectoryOutput { output: "episode_advantages", trajectory: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn bitwise_identical_for_any_thread_count() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        let (mut mask, mut offsets, mut tokens, mut rewards) = (vec![], vec![0i64], vec![], vec![]);
        let n = 2000;
        for _ in 0..n {
            let len = 1 + next() % 40;
            for _ in 0..len {
                let m = (next() % 3 != 0) as u8;
                mask.push(m);
                tokens.push((next() % 4) as i64);
                rewards.push(if m == 1 { (next() % 100) as f32 / 37.0 - 1.0 } else { 0.0 });
            }
            offsets.push(mask.len() as i64);
        }
        let groups: Vec<i64> = (0..n).map(|_| (next() % 150) as i64).collect();
        let compute = |threads: usize, anchor: Anchor| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let g = Groups { index: &groups, n_groups: 150 };
                let a = Anchors { turn_state_ids: None, token_ids: Some(&tokens) };
                let p = GigpoParams { norm_std: true, anchor, ..Default::default() };
                gigpo_advantages(&mask, &offsets, Rewards::Token(&rewards), g, a, &p).unwrap()
            })
        };
        for anchor in [Anchor::Observation, Anchor::Prefix] {
            let one = compute(1, anchor);
            assert!(one.step_advantages.iter().any(|&a| a != 0.0));
            for threads in [2, 3, 8] {
                let many = compute(threads, anchor);
                let bits = |o: &GigpoOutput| {
                    let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    (f(&o.advantages), f(&o.episode_advantages), f(&o.step_advantages), o.step_groups.clone())
                };
                assert_eq!(bits(&one), bits(&many), "{threads} threads, {anchor:?}");
            }
        }
    }
}
