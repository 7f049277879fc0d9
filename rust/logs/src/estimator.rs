//! The estimator a run uses. The estimators, their options and the building of one from
//! user options live in mpo-core ([`mpo_core::Estimator`], [`mpo_core::OPTIONS`]); this
//! module adds what the rollout-log tools need to know about one: its columns.

pub use mpo_core::{Estimator, OptionKind, OptionSpec, OptionValue, ESTIMATORS, OPTIONS};

use crate::schema::Needs;

/// The columns an estimator reads beyond the mask and the reward signal.
pub trait EstimatorColumns {
    fn needs(&self) -> Needs;
}

impl EstimatorColumns for Estimator {
    fn needs(&self) -> Needs {
        // Truncation bootstraps the end from the critic's value: MAE and GAE define it; the
        // group baselines have no critic and RAGEN's bi-level GAE defines none.
        match self {
            Estimator::Mae(_) | Estimator::Gae(_) => {
                Needs { values: true, groups: false, truncation: true, anchors: false }
            }
            Estimator::BiLevel(_) => Needs { values: true, groups: false, truncation: false, anchors: false },
            Estimator::Group(_) => Needs { values: false, groups: true, truncation: false, anchors: false },
            Estimator::Gigpo(_) => Needs { values: false, groups: true, truncation: false, anchors: true },
        }
    }
}

#[cfg(test)]
mod tests {
    use mpo_core::GroupParams;

    use super::*;
    use crate::LogError;

    #[test]
    fn inapplicable_or_out_of_range_options_are_usage_errors() {
        let usage = |name: &str, given: &[(&str, OptionValue)]| {
            let e = LogError::from(Estimator::from_options(name, given).unwrap_err());
            assert!(e.is_usage(), "{e}");
            e.to_string()
        };
        let e = usage("gae", &[("beta", OptionValue::Float(0.5))]);
        assert!(e.contains("`beta` does not apply to the gae"), "{e}");
        usage("mae", &[("lam", OptionValue::Float(1.5))]);
        usage("ppo", &[]);
        let rloo = Estimator::from_options("rloo", &[]).unwrap();
        assert_eq!(rloo, Estimator::Group(GroupParams { leave_one_out: true, ..Default::default() }));
        assert!(rloo.needs().groups);
        assert!(!rloo.needs().truncation);
        assert!(!Estimator::from_options("bilevel", &[]).unwrap().needs().truncation);
        assert!(Estimator::from_options("gae", &[]).unwrap().needs().truncation);
        // gigpo reads anchor states: a turn_state_ids or token_ids column, else refused
        // before any row, naming both.
        let gigpo = Estimator::from_options("gigpo", &[]).unwrap();
        let schema = arrow::datatypes::Schema::empty();
        let e = crate::ColumnSpec::default().resolve(&schema, gigpo.needs()).unwrap_err();
        assert!(!e.is_usage() && e.to_string().contains("missing column `turn_state_ids` or `token_ids`"), "{e}");
        let named = crate::ColumnSpec { token_ids: Some("t".into()), ..Default::default() };
        let e = named.resolve(&schema, rloo.needs()).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains("applies to the gigpo estimator only"), "{e}");
    }
}
