//! Slow, independent reference estimators, written from the formulas (docs/estimators.md)
//! as explicit sums (a Rust port of tests/reference.py): they share nothing with mpo-core
//! but the formulas. Everything in f64; quadratic in a turn's length, so for small inputs.

/// Turns: maximal runs of policy tokens inside one trajectory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RefTurns {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    pub traj_offsets: Vec<i64>,
    pub token_turn: Vec<i32>,
}

pub fn segment(mask: &[u8], offsets: &[i64]) -> RefTurns {
    let mut t = RefTurns { token_turn: vec![-1; mask.len()], traj_offsets: vec![0], ..Default::default() };
    for j in 0..offsets.len() - 1 {
        let (lo, hi) = (offsets[j] as usize, offsets[j + 1] as usize);
        let mut q = lo;
        while q < hi {
            if mask[q] != 0 {
                let s = q;
                while q < hi && mask[q] != 0 {
                    t.token_turn[q] = t.starts.len() as i32;
                    q += 1;
                }
                t.starts.push(s as i64);
                t.ends.push(q as i64);
            } else {
                q += 1;
            }
        }
        t.traj_offsets.push(t.starts.len() as i64);
    }
    t
}

impl RefTurns {
    /// Trajectory j's turn ids, and each of those turns' token positions.
    fn of_trajectory(&self, j: usize) -> (Vec<usize>, Vec<Vec<usize>>) {
        let tids: Vec<usize> = (self.traj_offsets[j] as usize..self.traj_offsets[j + 1] as usize).collect();
        let toks = tids.iter().map(|&t| (self.starts[t] as usize..self.ends[t] as usize).collect()).collect();
        (tids, toks)
    }
}

/// Token rewards: given per token, or a score on its trajectory's last policy token.
pub fn token_rewards(mask: &[u8], offsets: &[i64], rewards: Option<&[f32]>, scores: Option<&[f32]>) -> Vec<f64> {
    if let Some(r) = rewards {
        return r.iter().map(|&x| x as f64).collect();
    }
    let scores = scores.expect("rewards or scores");
    let mut out = vec![0.0; mask.len()];
    for j in 0..offsets.len() - 1 {
        let range = offsets[j] as usize..offsets[j + 1] as usize;
        if let Some(last) = range.rev().find(|&q| mask[q] != 0) {
            out[last] = scores[j] as f64;
        }
    }
    out
}

/// What the turn-level estimators (MAE, bi-level GAE) give: per token and per turn.
#[derive(Debug)]
pub struct TurnLevelRef {
    pub advantages: Vec<f64>,
    pub returns: Vec<f64>,
    pub turn_advantages: Vec<f64>,
}

/// Zeroed outputs filled by `body(v, j, turn ids, their token positions, out)` for every
/// trajectory j of the batch, `v` being the values in f64.
fn over_turns(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    mut body: impl FnMut(&[f64], usize, &[usize], &[Vec<usize>], &mut TurnLevelRef),
) -> TurnLevelRef {
    let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    let turns = segment(mask, offsets);
    let n_tokens = mask.len();
    let mut out = TurnLevelRef {
        advantages: vec![0.0; n_tokens],
        returns: vec![0.0; n_tokens],
        turn_advantages: vec![0.0; turns.starts.len()],
    };
    for j in 0..offsets.len() - 1 {
        let (tids, toks) = turns.of_trajectory(j);
        body(&v, j, &tids, &toks, &mut out);
    }
    out
}

/// MAE, every quantity by its defining sum; trajectory j with `truncated[j]` (missing:
/// false) has V_{T+1,1} := V at its last policy token instead of 0.
#[allow(clippy::too_many_arguments)]
pub fn mae_truncated(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    r: &[f64],
    truncated: &[bool],
    lam: f64,
    lam_intra: f64,
    beta: f64,
    gamma: f64,
    lam_critic: f64,
) -> TurnLevelRef {
    over_turns(values, mask, offsets, |v, j, tids, toks, out| {
        let n = tids.len();
        let end_v = if n > 0 && truncated.get(j) == Some(&true) { v[toks[n - 1][toks[n - 1].len() - 1]] } else { 0.0 };
        let first_v = |k: usize| if k < n { v[toks[k][0]] } else { end_v };
        // token residuals δ_{t,i}
        let deltas: Vec<Vec<f64>> = (0..n)
            .map(|k| {
                let tk = &toks[k];
                (0..tk.len())
                    .map(|i| {
                        let q = tk[i];
                        if i + 1 < tk.len() {
                            r[q] + v[tk[i + 1]] - v[q]
                        } else {
                            r[q] + gamma * first_v(k + 1) - v[q]
                        }
                    })
                    .collect()
            })
            .collect();
        // stage 1: δ^turn_t = R_t + γ V_{t+1,1} − V_{t,1};  A^turn_t = Σ_l (γλ)^l δ^turn_{t+l}
        let d_turn: Vec<f64> =
            (0..n).map(|k| toks[k].iter().map(|&q| r[q]).sum::<f64>() + gamma * first_v(k + 1) - first_v(k)).collect();
        let a_turn: Vec<f64> =
            (0..n).map(|k| (0..n - k).map(|l| (gamma * lam).powi(l as i32) * d_turn[k + l]).sum()).collect();
        for k in 0..n {
            out.turn_advantages[tids[k]] = a_turn[k];
            let len = toks[k].len();
            // stage 2: A^intra_{t,i} = Σ_k λ_intra^k δ_{t,i+k}, centred on the turn mean
            let intra: Vec<f64> =
                (0..len).map(|i| (0..len - i).map(|m| lam_intra.powi(m as i32) * deltas[k][i + m]).sum()).collect();
            let mean = intra.iter().sum::<f64>() / len as f64;
            for (i, &q) in toks[k].iter().enumerate() {
                out.advantages[q] = a_turn[k] + beta * (intra[i] - mean);
            }
        }
        // critic targets: C_q = δ_q + g_q λc C_{q+1}; G_q = V_q + C_q
        let mut c = 0.0;
        for k in (0..n).rev() {
            for i in (0..toks[k].len()).rev() {
                let last = i + 1 == toks[k].len();
                c = deltas[k][i] + if last { gamma } else { 1.0 } * lam_critic * c;
                out.returns[toks[k][i]] = v[toks[k][i]] + c;
            }
        }
    })
}

/// Token GAE over policy tokens: A_q = Σ_k (γλ)^k δ_{q+k}; trajectory j with
/// `truncated[j]` (missing: false) bootstraps its last policy token from its own value
/// instead of 0.
#[allow(clippy::too_many_arguments, reason = "the estimator's parameters, one argument each")]
pub fn gae_truncated(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    r: &[f64],
    truncated: &[bool],
    gamma: f64,
    lam: f64,
    lam_critic: f64,
    alpha: Option<f64>,
) -> (Vec<f64>, Vec<f64>) {
    let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    let mut adv = vec![0.0; mask.len()];
    let mut ret = vec![0.0; mask.len()];
    for j in 0..offsets.len() - 1 {
        let pol: Vec<usize> = (offsets[j] as usize..offsets[j + 1] as usize).filter(|&q| mask[q] != 0).collect();
        let n = pol.len();
        let lam_j = match alpha {
            None => lam,
            Some(a) => (1.0 - 1.0 / (a * n.max(1) as f64)).clamp(0.0, 1.0),
        };
        let end_v = if n > 0 && truncated.get(j) == Some(&true) { v[pol[n - 1]] } else { 0.0 };
        let deltas: Vec<f64> =
            (0..n).map(|i| r[pol[i]] + gamma * if i + 1 < n { v[pol[i + 1]] } else { end_v } - v[pol[i]]).collect();
        for i in 0..n {
            adv[pol[i]] = (0..n - i).map(|k| (gamma * lam_j).powi(k as i32) * deltas[i + k]).sum();
            ret[pol[i]] =
                v[pol[i]] + (0..n - i).map(|k| (gamma * lam_critic).powi(k as i32) * deltas[i + k]).sum::<f64>();
        }
    }
    (adv, ret)
}

/// GRPO / Dr. GRPO / RLOO: each group's members listed, then the formula.
pub fn group(scores: &[f32], group_index: &[i64], norm_std: bool, eps: f64, leave_one_out: bool) -> Vec<f64> {
    let mut out = vec![0.0; scores.len()];
    let mut ids: Vec<i64> = group_index.to_vec();
    ids.sort_unstable();
    ids.dedup();
    for g in ids {
        let idx: Vec<usize> = (0..scores.len()).filter(|&j| group_index[j] == g).collect();
        let n = idx.len();
        if n < 2 {
            continue;
        }
        let s: Vec<f64> = idx.iter().map(|&j| scores[j] as f64).collect();
        let total: f64 = s.iter().sum();
        let mean = total / n as f64;
        let std = (s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64).sqrt();
        for (&j, &x) in idx.iter().zip(&s) {
            out[j] = if leave_one_out {
                x - (total - x) / (n - 1) as f64
            } else if norm_std {
                (x - mean) / (std + eps)
            } else {
                x - mean
            };
        }
    }
    out
}

/// RAGEN's bi-level GAE, each level by its defining sum. e_t is turn t's last token.
/// High level: δ^hi_t = R_t + γ_hi V_{e_{t+1}} − V_{e_t}, A^hi_t = Σ_l (γ_hi λ)^l δ^hi_{t+l},
/// G_t = A^hi_t + V_{e_t}. Low level, inside turn t, with r' = G_t on e_t and 0 before:
/// δ_{t,i} = r'_{t,i} + γ V_{t,i+1} − V_{t,i} (0 after e_t), A_{t,i} = Σ_k (γλ)^k δ_{t,i+k}.
pub fn bilevel(
    values: &[f32],
    mask: &[u8],
    offsets: &[i64],
    r: &[f64],
    lam: f64,
    gamma: f64,
    high_level_gamma: f64,
) -> TurnLevelRef {
    over_turns(values, mask, offsets, |v, _, tids, toks, out| {
        let n = tids.len();
        let end_v = |k: usize| if k < n { v[*toks[k].last().expect("a turn has a token")] } else { 0.0 };
        let d_hi: Vec<f64> = (0..n)
            .map(|k| toks[k].iter().map(|&q| r[q]).sum::<f64>() + high_level_gamma * end_v(k + 1) - end_v(k))
            .collect();
        for k in 0..n {
            let a_hi: f64 = (0..n - k).map(|l| (high_level_gamma * lam).powi(l as i32) * d_hi[k + l]).sum();
            out.turn_advantages[tids[k]] = a_hi;
            let g = a_hi + end_v(k);
            let tk = &toks[k];
            let len = tk.len();
            let deltas: Vec<f64> = (0..len)
                .map(|i| {
                    let reward = if i + 1 == len { g } else { 0.0 };
                    let next = if i + 1 < len { v[tk[i + 1]] } else { 0.0 };
                    reward + gamma * next - v[tk[i]]
                })
                .collect();
            for i in 0..len {
                let a: f64 = (0..len - i).map(|m| (gamma * lam).powi(m as i32) * deltas[i + m]).sum();
                out.advantages[tk[i]] = a;
                out.returns[tk[i]] = a + v[tk[i]];
            }
        }
    })
}
