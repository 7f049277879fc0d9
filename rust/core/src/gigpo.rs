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

use rayon::prelude::*;

use crate::anchor_states::{AnchorSpan, AnchorStates, Candidate};
use crate::error::{MpoError, Result};
use crate::estimate::Groups;
use crate::layout::{check_turn_counts, expect_len, split_by, Layout, Rewards};
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

/// Where GiGPO's anchor states come from, exactly one of: ids given per turn, or the token
/// ids (aligned with the mask) read per the `anchor` option (states keyed by their tokens,
/// the hash finding candidates: [`crate::AnchorStates`]).
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
    /// Per turn the anchor hash (ids given per turn: the id's bits), which finds the
    /// candidate states; the tokens of `spans` decide ([`GigpoInputs::candidate`]).
    pub anchor: Vec<u64>,
    /// Per turn, its anchor tokens in the batch's token ids, when the anchors are hashed
    /// from them (empty for ids given per turn).
    pub spans: Vec<AnchorSpan>,
}

impl GigpoInputs {
    /// Turn `t`'s anchor state as [`AnchorStates`] looks it up: its tokens in `tokens` (the
    /// batch's token ids, those the inputs were read from), `prev` the state of its
    /// trajectory's previous turn; an id alone when the ids were given per turn.
    pub fn candidate<'a>(&self, tokens: Option<&'a [i64]>, t: usize, prev: Option<u32>) -> Candidate<'a> {
        match (tokens, self.spans.get(t)) {
            (Some(tokens), Some(span)) => {
                Candidate { tokens: &tokens[span.content.clone()], own: span.own - span.content.start, parent: prev }
            }
            _ => Candidate::ID,
        }
    }
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
    let x = gigpo_inputs(mask, offsets, rewards, anchors, params)?;
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
        .map(|g| one_group(&members[starts[g]..starts[g + 1]], &x, anchors.token_ids, params))
        .collect();

    // Scatter in group order: step-group ids are dense, group by group.
    let mut episode = vec![0f64; n];
    let mut step = vec![0f64; x.turns.n_turns()];
    let mut step_groups = vec![0i64; x.turns.n_turns()];
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
    let mut out = gigpo_finish(mask, offsets, x.turns, episode, step, params)?;
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
    check_anchor_sources(anchors, params)?;
    let turns = segment(&layout, mask)?;
    if let Some(ids) = anchors.turn_state_ids {
        check_turn_ids(ids, &turns)?;
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
    let spans = match anchors.token_ids {
        Some(_) => anchor_spans(&layout, &turns, params.anchor),
        None => Vec::new(),
    };
    Ok(GigpoInputs { turns, episode_return, step_return, anchor, spans })
}

/// One anchor source, and no option it would not read: both sources given, or an `anchor`
/// option (which says how token ids are read) beside ids given per turn, would be an input
/// silently not read (docs/reliability.md, "One input rule").
fn check_anchor_sources(anchors: Anchors<'_>, params: &GigpoParams) -> Result<()> {
    if anchors.turn_state_ids.is_some() && anchors.token_ids.is_some() {
        return Err(MpoError::Inapplicable(
            "give `turn_state_ids` or `token_ids` for the anchor states, not both (ids given per turn would \
             leave the token ids unread)"
                .into(),
        ));
    }
    if anchors.turn_state_ids.is_some() && params.anchor != Anchor::Observation {
        return Err(MpoError::Inapplicable(format!(
            "`anchor` = \"{}\" does not apply with `turn_state_ids` (it says how token ids are read as anchor \
             states; ids given per turn are the states); leave it out",
            params.anchor.name()
        )));
    }
    Ok(())
}

/// Per turn, its anchor tokens (docs/estimators.md, "GiGPO"): `observation`, the tokens
/// since the previous turn's last policy token (the trajectory's first tokens for its first
/// turn); `prefix`, every token of the trajectory before the turn, of which those since the
/// previous turn's start extend that turn's state.
fn anchor_spans(layout: &Layout<'_>, turns: &Turns, anchor: Anchor) -> Vec<AnchorSpan> {
    let mut spans = Vec::with_capacity(turns.n_turns());
    for j in 0..layout.n_trajectories() {
        let first = layout.range(j).start;
        for t in turns.of_trajectory(j) {
            let start = turns.starts[t] as usize;
            let opening = t == turns.traj_offsets[j] as usize;
            spans.push(match anchor {
                Anchor::Observation => {
                    let since = if opening { first } else { turns.ends[t - 1] as usize };
                    AnchorSpan { content: since..start, own: since }
                }
                Anchor::Prefix => {
                    let own = if opening { first } else { turns.starts[t - 1] as usize };
                    AnchorSpan { content: first..start, own }
                }
            });
        }
    }
    spans
}

/// The per-turn ids' count: the batch's turns, per trajectory with offsets.
fn check_turn_ids(ids: TurnIds<'_>, turns: &Turns) -> Result<()> {
    check_turn_counts("turn_state_ids", ids.ids.len(), ids.offsets, &turns.traj_offsets, |trajectory, got, expected| {
        MpoError::TurnCount { arg: "turn_state_ids", trajectory, got, expected }
    })
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

fn one_group(members: &[usize], x: &GigpoInputs, tokens: Option<&[i64]>, params: &GigpoParams) -> GroupOut {
    let (episode_return, step_return, turns) = (&x.episode_return, &x.step_return, &x.turns);
    // Episode: each trajectory once, summed in trajectory order (two-pass variance).
    let n = members.len();
    let mean = members.iter().map(|&j| episode_return[j]).sum::<f64>() / n.max(1) as f64;
    let sq_dev: f64 = members.iter().map(|&j| (episode_return[j] - mean).powi(2)).sum();
    let episode = members.iter().map(|&j| gigpo_centred(episode_return[j], n, mean, sq_dev, params)).collect();

    // Step groups: ids by first appearance, one per anchor state (its tokens, not only
    // its hash); count, sum, then squared deviations.
    let mut ids = AnchorStates::<u64>::default();
    let mut steps: Vec<(usize, f64, u32)> = Vec::new();
    let (mut count, mut sum): (Vec<usize>, Vec<f64>) = (Vec::new(), Vec::new());
    for &j in members {
        let mut prev = None;
        for t in turns.of_trajectory(j) {
            let (id, fresh) = ids.resolve(x.anchor[t], &x.candidate(tokens, t, prev));
            prev = Some(id);
            if fresh {
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
