//! The ragged batch: flat token arrays cut into trajectories by `offsets`, and the
//! checks every estimator shares.

use std::ops::Range;

use crate::error::{MpoError, Result, TokenAt};
use crate::runs::{all_finite, all_zero};

/// Validated trajectory boundaries: `offsets[j]..offsets[j+1]` is trajectory `j`.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    offsets: &'a [i64],
}

impl<'a> Layout<'a> {
    /// Checks that `offsets` starts at 0, never decreases and ends at `n_tokens`.
    pub fn new(offsets: &'a [i64], n_tokens: usize) -> Result<Self> {
        let Some(&first) = offsets.first() else {
            return Err(MpoError::Offsets(
                "is empty; a batch of N trajectories needs N+1 offsets (an empty batch is [0])".into(),
            ));
        };
        if first != 0 {
            return Err(MpoError::Offsets(format!("must start at 0, starts at {first}")));
        }
        for (j, w) in offsets.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(MpoError::Offsets(format!(
                    "decreases at trajectory {j}: offsets[{j}] = {} > offsets[{}] = {}",
                    w[0],
                    j + 1,
                    w[1]
                )));
            }
        }
        let last = *offsets.last().unwrap_or(&0);
        if last != n_tokens as i64 {
            let verb = if last > n_tokens as i64 { "overruns" } else { "stops short of" };
            return Err(MpoError::Offsets(format!(
                "{verb} the tokens: offsets[{}] = {last} but there are {n_tokens} tokens",
                offsets.len() - 1
            )));
        }
        Ok(Self { offsets })
    }

    pub fn n_trajectories(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn n_tokens(&self) -> usize {
        *self.offsets.last().unwrap_or(&0) as usize
    }

    pub fn offsets(&self) -> &'a [i64] {
        self.offsets
    }

    /// Flat token range of trajectory `j`.
    #[inline]
    pub fn range(&self, j: usize) -> Range<usize> {
        self.offsets[j] as usize..self.offsets[j + 1] as usize
    }

    #[inline]
    pub fn at(&self, j: usize, token: usize) -> TokenAt {
        TokenAt { token, trajectory: j, position: token - self.offsets[j] as usize }
    }

    /// Checks that a per-token array has one entry per token.
    pub fn expect_tokens(&self, arg: &'static str, len: usize) -> Result<()> {
        expect_len(arg, len, self.n_tokens(), "one per token, as offsets[-1]")
    }

    /// Checks that a per-trajectory array has one entry per trajectory.
    pub fn expect_trajectories(&self, arg: &'static str, len: usize) -> Result<()> {
        expect_len(arg, len, self.n_trajectories(), "one per trajectory, len(offsets) - 1")
    }
}

pub(crate) fn expect_len(arg: &'static str, got: usize, expected: usize, why: &'static str) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(MpoError::Length { arg, got, expected, why })
    }
}

/// Checks the count of the `len` per-turn values of `arg` against the batch's turns, whose
/// per-trajectory boundaries are `traj_turns` (trajectory j has turns
/// `traj_turns[j]..traj_turns[j+1]`). Without `offsets` (the flat form) only the total can
/// be checked; with them (the ragged form) they must run non-decreasing from 0 to `len`,
/// and a trajectory given another count than its turns is `count_error(j, got, expected)`.
pub(crate) fn check_turn_counts<O: Copy + TryInto<usize>>(
    arg: &'static str,
    len: usize,
    offsets: Option<&[i64]>,
    traj_turns: &[O],
    count_error: impl Fn(usize, usize, usize) -> MpoError,
) -> Result<()> {
    let turn = |j: usize| -> usize { traj_turns[j].try_into().unwrap_or(0) };
    let n = traj_turns.len() - 1;
    let Some(o) = offsets else {
        return expect_len(arg, len, turn(n), "one per turn of the batch, a turn being a run of mask == 1");
    };
    if o.len() != n + 1 || o.first() != Some(&0) || o.last() != Some(&(len as i64)) {
        return Err(MpoError::Capacity(format!(
            "the offsets of `{arg}` must be {} non-decreasing entries from 0 to {len}",
            n + 1
        )));
    }
    for j in 0..n {
        let got = o[j + 1] - o[j];
        if got < 0 {
            return Err(MpoError::Capacity(format!("the offsets of `{arg}` decrease at trajectory {j}")));
        }
        let expected = turn(j + 1) - turn(j);
        if got as usize != expected {
            return Err(count_error(j, got as usize, expected));
        }
    }
    Ok(())
}

/// Cuts `buf` at the (validated, non-decreasing, ending at `buf.len()`) `offsets`.
pub(crate) fn split_by<'b, T, O: Copy + TryInto<usize>>(mut buf: &'b mut [T], offsets: &[O]) -> Vec<&'b mut [T]> {
    let mut parts = Vec::with_capacity(offsets.len().saturating_sub(1));
    for w in offsets.windows(2) {
        let lo: usize = w[0].try_into().unwrap_or(0);
        let hi: usize = w[1].try_into().unwrap_or(0);
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(hi - lo);
        parts.push(head);
        buf = tail;
    }
    parts
}

/// Where the reward signal comes from (exactly one of the two).
#[derive(Debug, Clone, Copy)]
pub enum Rewards<'a> {
    /// Token-level rewards, one per token; only policy tokens may be nonzero.
    Token(&'a [f32]),
    /// One outcome per trajectory, placed on its last policy token.
    Score(&'a [f32]),
}

impl<'a> Rewards<'a> {
    pub(crate) fn check_shape(&self, layout: &Layout<'_>) -> Result<()> {
        match self {
            Rewards::Token(r) => layout.expect_tokens("rewards", r.len()),
            Rewards::Score(s) => layout.expect_trajectories("scores", s.len()),
        }
    }

    /// Calls `f` with the reward reader of trajectory `j` (whose mask is `traj_mask`,
    /// starting at flat token `base`), monomorphised per reward kind so the inner loops do
    /// not branch on it. A score sits on the trajectory's last policy token.
    #[inline]
    pub(crate) fn with_trajectory<R>(&self, j: usize, traj_mask: &[u8], base: usize, f: impl RewardsVisitor<R>) -> R {
        match *self {
            Rewards::Token(r) => f.visit(TokenRewards(r)),
            Rewards::Score(s) => {
                let last_policy = traj_mask.iter().rposition(|&m| m != 0).map_or(usize::MAX, |k| base + k);
                f.visit(ScoreReward { at: last_policy, score: s[j] as f64 })
            }
        }
    }
}

/// Reward of flat token `q` of one trajectory.
pub(crate) trait RewardAt: Copy {
    fn at(&self, q: usize) -> f64;

    /// Appends the rewards of flat tokens `flat` to `out`; `false` if one is not finite.
    fn gather(&self, flat: Range<usize>, out: &mut Vec<f64>) -> bool;
}

#[derive(Clone, Copy)]
pub(crate) struct TokenRewards<'a>(&'a [f32]);

impl RewardAt for TokenRewards<'_> {
    #[inline(always)]
    fn at(&self, q: usize) -> f64 {
        self.0[q] as f64
    }

    #[inline]
    fn gather(&self, flat: Range<usize>, out: &mut Vec<f64>) -> bool {
        let rs = &self.0[flat];
        out.extend(rs.iter().map(|&r| r as f64));
        all_finite(rs)
    }
}

/// A trajectory's score, sitting on its last policy token.
#[derive(Clone, Copy)]
pub(crate) struct ScoreReward {
    at: usize,
    score: f64,
}

impl RewardAt for ScoreReward {
    #[inline(always)]
    fn at(&self, q: usize) -> f64 {
        if q == self.at {
            self.score
        } else {
            0.0
        }
    }

    /// The score's finiteness is checked per trajectory (`score_ok`).
    #[inline]
    fn gather(&self, flat: Range<usize>, out: &mut Vec<f64>) -> bool {
        out.extend(flat.map(|q| self.at(q)));
        true
    }
}

/// A computation generic over the reward reader (a closure cannot be generic).
pub(crate) trait RewardsVisitor<R> {
    fn visit<W: RewardAt>(self, rewards: W) -> R;
}

#[inline]
pub(crate) fn check_mask(layout: &Layout<'_>, mask: &[u8], j: usize) -> Result<()> {
    for q in layout.range(j) {
        if mask[q] > 1 {
            return Err(MpoError::MaskValue { value: mask[q], at: layout.at(j, q) });
        }
    }
    Ok(())
}

/// Fast check of an observation run (vectorised, no early exit): its rewards, if token
/// rewards are given, are all zero. Policy runs are checked inside the estimators' loops.
/// `false` means "look closer with [`first_problem`]".
#[inline]
pub(crate) fn observation_run_ok(rewards: Rewards<'_>, run: Range<usize>) -> bool {
    match rewards {
        Rewards::Token(r) => all_zero(&r[run]),
        Rewards::Score(_) => true,
    }
}

/// Scans trajectory `j` token by token, in order, and reports its first problem: a mask
/// entry other than 0/1, a non-finite value or reward on a policy token, a nonzero reward
/// elsewhere, a non-finite score. Values off-policy are never read. The estimators call it
/// only when their fast per-run checks failed, so the error named is always the first.
pub(crate) fn first_problem(
    layout: &Layout<'_>,
    mask: &[u8],
    values: &[f32],
    rewards: Rewards<'_>,
    j: usize,
) -> Result<()> {
    for q in layout.range(j) {
        match mask[q] {
            0 => {
                if let Rewards::Token(r) = rewards {
                    if r[q] != 0.0 {
                        if !r[q].is_finite() {
                            return Err(MpoError::NonFiniteToken { arg: "rewards", value: r[q], at: layout.at(j, q) });
                        }
                        return Err(MpoError::ObservationReward { value: r[q], at: layout.at(j, q) });
                    }
                }
            }
            1 => {
                if !values[q].is_finite() {
                    return Err(MpoError::NonFiniteToken { arg: "values", value: values[q], at: layout.at(j, q) });
                }
                if let Rewards::Token(r) = rewards {
                    if !r[q].is_finite() {
                        return Err(MpoError::NonFiniteToken { arg: "rewards", value: r[q], at: layout.at(j, q) });
                    }
                }
            }
            m => return Err(MpoError::MaskValue { value: m, at: layout.at(j, q) }),
        }
    }
    score_ok(rewards, j)
}

/// A trajectory's score, if scores are the reward source, must be finite.
#[inline]
pub(crate) fn score_ok(rewards: Rewards<'_>, j: usize) -> Result<()> {
    match rewards {
        Rewards::Score(s) if !s[j].is_finite() => {
            Err(MpoError::NonFiniteTrajectory { arg: "scores", value: s[j], trajectory: j })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_must_start_at_zero_grow_and_cover_the_tokens() {
        assert!(Layout::new(&[0, 2, 5], 5).is_ok());
        assert!(Layout::new(&[0], 0).is_ok());
        assert!(matches!(Layout::new(&[], 0), Err(MpoError::Offsets(_))));
        assert!(matches!(Layout::new(&[1, 5], 5), Err(MpoError::Offsets(_))));
        let e = Layout::new(&[0, 3, 2, 5], 5).unwrap_err().to_string();
        assert!(e.contains("decreases at trajectory 1"), "{e}");
        let e = Layout::new(&[0, 6], 5).unwrap_err().to_string();
        assert!(e.contains("overruns"), "{e}");
        let e = Layout::new(&[0, 4], 5).unwrap_err().to_string();
        assert!(e.contains("stops short"), "{e}");
    }

    #[test]
    fn split_gives_one_slice_per_trajectory() {
        let mut buf = [0u8; 6];
        let parts = split_by(&mut buf, &[0i64, 2, 2, 6]);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![2, 0, 4]);
    }
}
