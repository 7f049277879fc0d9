//! GiGPO's step groups over a whole log (docs/parquet.md, "GiGPO"): per (group, anchor
//! state) the statistics of the step returns G_{j,t}, gathered in the scans of
//! [`crate::groups::GroupStats`] that holds them, as its own statistics are.

use std::collections::HashMap;

use mpo_core::{GigpoInputs, GigpoParams, GroupMoments};

use crate::error::DataError;
use crate::phase::Phase;

/// GiGPO's step groups: per (group, anchor id) the count, sum, mean and squared
/// deviations of the step returns, in log order.
#[derive(Debug)]
pub struct StepStats {
    pub(crate) params: GigpoParams,
    ids: HashMap<(usize, u64), usize>,
    count: Vec<u64>,
    sum: Vec<f64>,
    mean: Vec<f64>,
    sq_dev: Vec<f64>,
}

impl StepStats {
    pub(crate) fn new(params: GigpoParams) -> Self {
        StepStats {
            params,
            ids: HashMap::new(),
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

    /// Feeds one batch's turns (`groups`: each row's group) to the current scan.
    pub(crate) fn scan(
        &mut self,
        phase: Phase,
        groups: &[usize],
        x: &GigpoInputs,
        group_col: &str,
    ) -> Result<(), DataError> {
        let StepStats { ids, count, sum, mean, sq_dev, .. } = self;
        for (j, &g) in groups.iter().enumerate() {
            for t in x.turns.of_trajectory(j) {
                let (key, g_t) = ((g, x.anchor[t]), x.step_return[t]);
                match phase {
                    Phase::Sums => {
                        let k = *ids.entry(key).or_insert_with(|| {
                            count.push(0);
                            sum.push(0.0);
                            sq_dev.push(0.0);
                            count.len() - 1
                        });
                        count[k] += 1;
                        sum[k] += g_t;
                    }
                    Phase::Deviations => {
                        let k = *ids.get(&key).ok_or_else(|| DataError::unknown_group(group_col, j))?;
                        sq_dev[k] += (g_t - mean[k]).powi(2);
                    }
                    Phase::Ready => {}
                }
            }
        }
        Ok(())
    }

    /// The step group of `anchor` in group `g`, once seen in the sums.
    pub(crate) fn moments(&self, g: usize, anchor: u64) -> Option<GroupMoments> {
        let k = *self.ids.get(&(g, anchor))?;
        Some(GroupMoments { count: self.count[k], sum: self.sum[k], mean: self.mean[k], sq_dev: self.sq_dev[k] })
    }
}
