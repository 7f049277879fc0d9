//! The estimator a run uses, built from user options (CLI flags or Python keywords) with
//! each option checked against the estimator it would apply to.

use mpo_core::{GaeParams, GroupParams, MaeParams};

use crate::error::LogError;
use crate::schema::Needs;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimator {
    /// Multiscale advantage estimation (spec §2.1).
    Mae(MaeParams),
    /// Token-level GAE over policy tokens (spec §2.2).
    Gae(GaeParams),
    /// A critic-free group baseline (spec §2.3): GRPO, Dr. GRPO or RLOO.
    Group(GroupParams),
}

/// Estimator options as given; `None` = the estimator's default.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EstimatorOptions {
    pub lam: Option<f64>,
    pub lam_intra: Option<f64>,
    pub beta: Option<f64>,
    pub gamma: Option<f64>,
    pub lam_critic: Option<f64>,
    pub eps: Option<f64>,
}

/// The names accepted for `--estimator`.
pub const ESTIMATORS: [&str; 5] = ["mae", "gae", "grpo", "drgrpo", "rloo"];

impl Estimator {
    /// Builds and validates an estimator. An option the estimator does not use is a usage
    /// error rather than silently ignored.
    pub fn from_options(name: &str, o: &EstimatorOptions) -> Result<Self, LogError> {
        let given = [
            ("lam", o.lam),
            ("lam_intra", o.lam_intra),
            ("beta", o.beta),
            ("gamma", o.gamma),
            ("lam_critic", o.lam_critic),
            ("eps", o.eps),
        ];
        let allowed: &[&str] = match name {
            "mae" => &["lam", "lam_intra", "beta", "gamma", "lam_critic"],
            "gae" => &["lam", "gamma", "lam_critic"],
            "grpo" => &["eps"],
            "drgrpo" | "rloo" => &[],
            _ => {
                return Err(LogError::Usage(format!(
                    "unknown estimator `{name}`; choose one of {}",
                    ESTIMATORS.join(", ")
                )))
            }
        };
        if let Some((option, _)) = given.iter().find(|(k, v)| v.is_some() && !allowed.contains(k)) {
            return Err(LogError::Usage(format!("`{option}` does not apply to the {name} estimator")));
        }
        let estimator = match name {
            "mae" => {
                let d = MaeParams::default();
                Estimator::Mae(MaeParams {
                    lam: o.lam.unwrap_or(d.lam),
                    lam_intra: o.lam_intra.unwrap_or(d.lam_intra),
                    beta: o.beta.unwrap_or(d.beta),
                    gamma: o.gamma.unwrap_or(d.gamma),
                    lam_critic: o.lam_critic.unwrap_or(d.lam_critic),
                })
            }
            "gae" => {
                let d = GaeParams::default();
                Estimator::Gae(GaeParams {
                    lam: o.lam.unwrap_or(d.lam),
                    gamma: o.gamma.unwrap_or(d.gamma),
                    lam_critic: o.lam_critic.unwrap_or(d.lam_critic),
                    length_adaptive_alpha: None,
                })
            }
            "grpo" => {
                Estimator::Group(GroupParams { eps: o.eps.unwrap_or(GroupParams::default().eps), ..Default::default() })
            }
            "drgrpo" => Estimator::Group(GroupParams { norm_std: false, ..Default::default() }),
            _ => Estimator::Group(GroupParams { leave_one_out: true, ..Default::default() }),
        };
        estimator.validate()?;
        Ok(estimator)
    }

    pub fn validate(&self) -> Result<(), LogError> {
        match self {
            Estimator::Mae(p) => p.validate(),
            Estimator::Gae(p) => p.validate(),
            Estimator::Group(p) => p.validate(),
        }
        .map_err(LogError::from)
    }

    /// Columns beyond the mask and the reward signal.
    pub fn needs(&self) -> Needs {
        match self {
            Estimator::Mae(_) | Estimator::Gae(_) => Needs { values: true, groups: false },
            Estimator::Group(_) => Needs { values: false, groups: true },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let e = Estimator::from_options("mae", &EstimatorOptions::default()).unwrap();
        assert_eq!(e, Estimator::Mae(MaeParams { lam: 0.8, lam_intra: 0.95, beta: 1.0, gamma: 1.0, lam_critic: 1.0 }));
    }

    #[test]
    fn inapplicable_or_out_of_range_options_are_usage_errors() {
        let beta = EstimatorOptions { beta: Some(0.5), ..Default::default() };
        let e = Estimator::from_options("gae", &beta).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains("`beta` does not apply to the gae"), "{e}");
        let lam = EstimatorOptions { lam: Some(1.5), ..Default::default() };
        assert!(Estimator::from_options("mae", &lam).unwrap_err().is_usage());
        assert!(Estimator::from_options("ppo", &EstimatorOptions::default()).unwrap_err().is_usage());
        let rloo = Estimator::from_options("rloo", &EstimatorOptions::default()).unwrap();
        assert_eq!(rloo, Estimator::Group(GroupParams { leave_one_out: true, ..Default::default() }));
    }
}
