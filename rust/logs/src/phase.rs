//! The scans of the whole-log statistics ([`crate::groups::GroupStats`] and GiGPO's
//! [`crate::steps::StepStats`]): the sums, then the squared deviations when a std is
//! needed, then ready.

/// Which scan of the statistics a [`crate::groups::GroupStats`] is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Sums,
    Deviations,
    Ready,
}
