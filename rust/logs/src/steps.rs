//! GiGPO's step groups over a whole log (docs/parquet.md, "GiGPO"): per (group, anchor
//! state) the statistics of the step returns G_{j,t}, gathered in the scans of
//! [`crate::groups::GroupStats`] that holds them, as its own statistics are.

use mpo_core::{AnchorStates, Candidate, GigpoInputs, GigpoParams, GroupMoments};

use crate::error::DataError;
use crate::phase::Phase;

/// GiGPO's step groups: per (group, anchor state) the count, sum, mean and squared
/// deviations of the step returns, in log order. Anchor states are keyed by their tokens
/// (hashes only find candidates: mpo_core::AnchorStates), so each keeps its tokens once.
#[derive(Debug)]
pub struct StepStats {
    pub(crate) params: GigpoParams,
    ids: AnchorStates<(usize, u64)>,
    count: Vec<u64>,
    sum: Vec<f64>,
    mean: Vec<f64>,
    sq_dev: Vec<f64>,
}

impl StepStats {
    pub(crate) fn new(params: GigpoParams) -> Self {
        StepStats {
            params,
            ids: AnchorStates::default(),
            count: Vec::new(),
            sum: Vec::new(),
            mean: Vec::new(),
            sq_dev: Vec::new(),
        }
    }

    /// Ends a scan: after the sums, the means are known.
    pub(crate) fn finish_scan(&mut self, phase: Phase) {
        if phase == Phase::Sums {
            self.mean = self.sum.iter().zip(&self.count).map(|(&s, &n)| s / n.max(1) as f64).collect();
        }
    }

    /// Feeds one batch's turns (`groups`: each row's group; `tokens`: the batch's token
    /// ids when the anchors are hashed from them) to the current scan.
    pub(crate) fn scan(
        &mut self,
        phase: Phase,
        groups: &[usize],
        x: &GigpoInputs,
        tokens: Option<&[i64]>,
        group_col: &str,
    ) -> Result<(), DataError> {
        let StepStats { ids, count, sum, mean, sq_dev, .. } = self;
        for (j, &g) in groups.iter().enumerate() {
            let mut prev = None;
            for t in x.turns.of_trajectory(j) {
                let (key, c, g_t) = ((g, x.anchor[t]), x.candidate(tokens, t, prev), x.step_return[t]);
                match phase {
                    Phase::Sums => {
                        let (k, fresh) = ids.resolve(key, &c);
                        if fresh {
                            count.push(0);
                            sum.push(0.0);
                            sq_dev.push(0.0);
                        }
                        prev = Some(k);
                        count[k as usize] += 1;
                        sum[k as usize] += g_t;
                    }
                    Phase::Deviations => {
                        let k = ids.find(&key, &c).ok_or_else(|| DataError::unknown_group(group_col, j))?;
                        prev = Some(k);
                        sq_dev[k as usize] += (g_t - mean[k as usize]).powi(2);
                    }
                    Phase::Ready => {}
                }
            }
        }
        Ok(())
    }

    /// The step group of turn `t`'s anchor state (`c`, `anchor` its hash) in group `g`,
    /// once seen in the sums, and its moments.
    pub(crate) fn moments(&self, g: usize, anchor: u64, c: &Candidate<'_>) -> Option<(u32, GroupMoments)> {
        let k = self.ids.find(&(g, anchor), c)?;
        let i = k as usize;
        Some((k, GroupMoments { count: self.count[i], sum: self.sum[i], mean: self.mean[i], sq_dev: self.sq_dev[i] }))
    }
}
