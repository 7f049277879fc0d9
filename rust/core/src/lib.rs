//! mpo-core: turn segmentation and advantage estimators for multi-turn LLM-agent
//! trajectories (MPO's MAE, GAE, bi-level GAE, group baselines, GiGPO; the formulas are in
//! docs/estimators.md), over ragged batches (flat token arrays plus trajectory offsets).
//!
//! Every estimator runs in parallel over trajectories on the *current* rayon pool (call it
//! inside `ThreadPool::install` to choose one), accumulates in f64 and writes f32. Each
//! trajectory is computed by one thread in a fixed order, so results are bitwise
//! identical for any thread count. No function panics on bad input: it returns an
//! [`MpoError`] that names the argument and the trajectory/token.

mod anchor_states;
mod bilevel;
mod compact;
mod diagnostics;
mod error;
mod estimate;
mod estimator;
mod gae;
mod gigpo;
mod group;
mod layout;
mod mae;
mod output;
mod parallel;
mod params;
mod runs;
mod suggest;
mod turn_output;
mod turn_rewards;
mod turns;

pub use anchor_states::{AnchorSpan, AnchorStates, Candidate};
pub use bilevel::{bilevel_advantages, BiLevelOutput};
pub use diagnostics::{value_structure, ValueStructure};
pub use error::{MpoError, Result, TokenAt};
pub use estimate::{estimate, Batch, Estimate, Groups, Tokens};
pub use estimator::{Estimator, OptionKind, OptionSpec, OptionValue, ESTIMATORS, OPTIONS};
pub use gae::{gae_advantages, gae_advantages_with_truncation, GaeOutput};
pub use gigpo::{
    anchor_hash, gigpo_advantages, gigpo_centred, gigpo_finish, gigpo_inputs, Anchors, GigpoInputs, GigpoOutput,
    TurnIds,
};
pub use group::{
    broadcast_to_tokens, group_advantage, group_advantages, group_baselines, GroupBaselines, GroupMoments,
};
pub use layout::{Layout, Rewards};
pub use mae::{mae_advantages, mae_advantages_with_truncation, MaeOutput};
pub use params::{Anchor, BiLevelParams, GaeParams, GigpoParams, GroupParams, MaeParams};
pub use suggest::{closest, did_you_mean};
pub use turn_output::TurnOutput;
pub use turn_rewards::{check_tolerance, place_turn_rewards, SumCheck, TurnRewards};
pub use turns::{segment_turns, Turns};
