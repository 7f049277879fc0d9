//! The estimators over numpy arrays. Each function takes contiguous arrays (the Python
//! wrappers in `mpo_rs.estimators` coerce anything else) and an `Estimator`, borrows the
//! arrays as slices without copying, releases the GIL while the core runs on the
//! extension's pool, and hands the output `Vec`s to numpy without copying.

use mpo_core::{Estimator as Core, MpoError, Rewards, SumCheck, TurnRewards, Turns};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::errors::{core_error, InvalidBatchError, InvalidOptionError};
use crate::options::Estimator;
use crate::pool;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(segment_turns, m)?)?;
    m.add_function(wrap_pyfunction!(advantages, m)?)?;
    m.add_function(wrap_pyfunction!(group_baselines, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast_to_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(value_structure, m)?)
}

/// An array's data, borrowed: the binding's one rule for an array that is not contiguous (a TypeError naming it).
pub(crate) fn slice<'a, T: numpy::Element>(arr: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    arr.as_slice().map_err(|_| PyTypeError::new_err(format!("`{name}` must be a C-contiguous 1-D array")))
}

/// Runs `f` through the binding's one call helper ([`pool::run`]).
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, MpoError> + Send) -> PyResult<T> {
    pool::run(py, core_error, f)
}

/// The optional inputs of the critic estimators beside the token rewards and scores.
struct Extras<'a> {
    truncated: Option<&'a [bool]>,
    turn_rewards: Option<TurnRewards<'a>>,
    check: Option<SumCheck<'a>>,
}

fn extras<'a>(
    truncated: &'a Option<PyReadonlyArray1<'_, bool>>,
    turn_rewards: &'a Option<PyReadonlyArray1<'_, f32>>,
    turn_offsets: &'a Option<PyReadonlyArray1<'_, i64>>,
    check_scores: &'a Option<PyReadonlyArray1<'_, f32>>,
    check_tolerance: Option<&Bound<'_, PyAny>>,
) -> PyResult<Extras<'a>> {
    let check_tolerance = crate::options::check_tolerance(check_tolerance)?;
    let turn_rewards = match turn_rewards {
        Some(r) => Some(TurnRewards {
            rewards: slice(r, "turn_rewards")?,
            offsets: turn_offsets.as_ref().map(|o| slice(o, "turn_offsets")).transpose()?,
        }),
        None => None,
    };
    let check = match (check_scores, check_tolerance) {
        (Some(s), Some(tolerance)) => Some(SumCheck { scores: slice(s, "check_scores")?, tolerance }),
        (None, _) => None,
        (Some(_), None) => return Err(InvalidOptionError::new_err("`check_scores` needs its `check_tolerance`")),
    };
    if check.is_some() && turn_rewards.is_none() {
        return Err(InvalidBatchError::new_err("`check_scores` checks `turn_rewards`; give them too"));
    }
    Ok(Extras { truncated: truncated.as_ref().map(|t| slice(t, "truncated")).transpose()?, turn_rewards, check })
}

/// The batch's reward source: the token rewards, the scores, or the per-turn rewards
/// (exactly one is given).
fn source_of<'a>(
    rewards: Option<&'a [f32]>,
    scores: Option<&'a [f32]>,
    extras: &Extras<'a>,
) -> PyResult<Result<Rewards<'a>, TurnRewards<'a>>> {
    match (rewards, scores, extras.turn_rewards) {
        (Some(r), None, None) => Ok(Ok(Rewards::Token(r))),
        (None, Some(s), None) => Ok(Ok(Rewards::Score(s))),
        (None, None, Some(turn)) => Ok(Err(turn)),
        _ => Err(InvalidBatchError::new_err(
            "give exactly one of `rewards` (token-level), `scores` (one per trajectory) and `turn_rewards` (one per turn)",
        )),
    }
}

/// Runs `f` on the reward source, per-turn rewards placed on each turn's last policy token.
fn with_source<T>(
    tokens: mpo_core::Tokens<'_>,
    source: Result<Rewards<'_>, TurnRewards<'_>>,
    check: Option<SumCheck<'_>>,
    f: impl FnOnce(Rewards<'_>) -> Result<T, MpoError>,
) -> Result<T, MpoError> {
    match (source, tokens) {
        (Ok(rewards), _) => f(rewards),
        (Err(turn), mpo_core::Tokens::Flat { mask, offsets }) => {
            f(Rewards::Token(&mpo_core::place_turn_rewards(mask, offsets, turn, check)?))
        }
        (Err(_), mpo_core::Tokens::OnePerTrajectory) => {
            Err(MpoError::Input("`turn_rewards` are placed on the batch's tokens: give `mask` and `offsets`".into()))
        }
    }
}

/// The error for an estimator of another family than the function computes.
fn wrong_family(function: &str, wants: &str, e: &Estimator) -> PyErr {
    InvalidOptionError::new_err(format!(
        "{function} computes the {wants} estimator; got the {} estimator (use the function of its family)",
        e.name()
    ))
}

type Floats<'py> = Bound<'py, PyArray1<f32>>;
type Doubles<'py> = Bound<'py, PyArray1<f64>>;

type TurnArrays<'py> =
    (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i32>>);

fn turn_arrays(py: Python<'_>, t: Turns) -> TurnArrays<'_> {
    (
        PyArray1::from_vec(py, t.starts),
        PyArray1::from_vec(py, t.ends),
        PyArray1::from_vec(py, t.traj_offsets),
        PyArray1::from_vec(py, t.token_turn),
    )
}

/// (starts, ends, traj_offsets, token_turn)
#[pyfunction]
fn segment_turns<'py>(
    py: Python<'py>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<TurnArrays<'py>> {
    let (m, o) = (slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let turns = run(py, || mpo_core::segment_turns(m, o))?;
    Ok(turn_arrays(py, turns))
}

type Estimated<'py> = (
    Floats<'py>,
    Option<Floats<'py>>,
    Option<Floats<'py>>,
    Option<TurnArrays<'py>>,
    Option<Floats<'py>>,
    Option<Floats<'py>>,
    Option<Bound<'py, PyArray1<i64>>>,
);

/// (advantages, returns, turn_advantages, (starts, ends, traj_offsets, token_turn),
/// per_trajectory, step_advantages, step_groups): every estimator through
/// [`mpo_core::estimate`]; the outputs an estimator does not define are None. Group ids are
/// dense codes in `0..n_groups`. Without `mask` and `offsets` each trajectory is one policy
/// token (a group estimator's scores alone): the advantages are the per-trajectory ones and
/// `per_trajectory` is None. `turn_state_ids` (with `turn_state_offsets` when given per
/// trajectory) and `token_ids` are gigpo's anchor states.
#[pyfunction]
#[pyo3(signature = (
    estimator, mask=None, offsets=None, values=None, rewards=None, scores=None, group_index=None, n_groups=0,
    truncated=None, turn_rewards=None, turn_offsets=None, check_scores=None, check_tolerance=None,
    turn_state_ids=None, turn_state_offsets=None, token_ids=None
))]
#[allow(clippy::too_many_arguments)] // the batch's optional inputs of `mpo_rs.advantages`
fn advantages<'py>(
    py: Python<'py>,
    estimator: &Bound<'py, Estimator>,
    mask: Option<PyReadonlyArray1<'py, u8>>,
    offsets: Option<PyReadonlyArray1<'py, i64>>,
    values: Option<PyReadonlyArray1<'py, f32>>,
    rewards: Option<PyReadonlyArray1<'py, f32>>,
    scores: Option<PyReadonlyArray1<'py, f32>>,
    group_index: Option<PyReadonlyArray1<'py, i64>>,
    n_groups: usize,
    truncated: Option<PyReadonlyArray1<'py, bool>>,
    turn_rewards: Option<PyReadonlyArray1<'py, f32>>,
    turn_offsets: Option<PyReadonlyArray1<'py, i64>>,
    check_scores: Option<PyReadonlyArray1<'py, f32>>,
    check_tolerance: Option<Bound<'py, PyAny>>,
    turn_state_ids: Option<PyReadonlyArray1<'py, i64>>,
    turn_state_offsets: Option<PyReadonlyArray1<'py, i64>>,
    token_ids: Option<PyReadonlyArray1<'py, i64>>,
) -> PyResult<Estimated<'py>> {
    let core = estimator.get().core;
    let v = values.as_ref().map(|a| slice(a, "values")).transpose()?;
    let r = rewards.as_ref().map(|a| slice(a, "rewards")).transpose()?;
    let s = scores.as_ref().map(|a| slice(a, "scores")).transpose()?;
    let tokens = match (&mask, &offsets) {
        (Some(m), Some(o)) => mpo_core::Tokens::Flat { mask: slice(m, "mask")?, offsets: slice(o, "offsets")? },
        (None, None) => mpo_core::Tokens::OnePerTrajectory,
        _ => return Err(InvalidBatchError::new_err("give both `mask` and `offsets`, or neither")),
    };
    let groups = match &group_index {
        Some(g) => Some(mpo_core::Groups { index: slice(g, "group_ids")?, n_groups }),
        None => None,
    };
    let anchors = mpo_core::Anchors {
        turn_state_ids: match &turn_state_ids {
            Some(ids) => Some(mpo_core::TurnIds {
                ids: slice(ids, "turn_state_ids")?,
                offsets: turn_state_offsets.as_ref().map(|o| slice(o, "turn_state_offsets")).transpose()?,
            }),
            None => None,
        },
        token_ids: token_ids.as_ref().map(|t| slice(t, "token_ids")).transpose()?,
    };
    let x = extras(&truncated, &turn_rewards, &turn_offsets, &check_scores, check_tolerance.as_ref())?;
    let source = source_of(r, s, &x)?;
    let out = run(py, || {
        with_source(tokens, source, x.check, |rewards| {
            let batch = mpo_core::Batch { tokens, rewards, values: v, truncated: x.truncated, groups, anchors };
            mpo_core::estimate(&core, &batch)
        })
    })?;
    let array = |a: Vec<f32>| PyArray1::from_vec(py, a);
    Ok((
        array(out.advantages),
        out.returns.map(array),
        out.turn_advantages.map(array),
        out.turns.map(|t| turn_arrays(py, t)),
        out.per_trajectory.map(array),
        out.step_advantages.map(array),
        out.step_groups.map(|g| PyArray1::from_vec(py, g)),
    ))
}

type Baselines<'py> = (Doubles<'py>, Doubles<'py>, Bound<'py, PyArray1<bool>>);

/// (baseline, scale, alone): each trajectory's group baseline, 1 / (std + eps) or 1, and
/// whether it is alone in its group; from dense group codes in `0..n_groups`.
#[pyfunction]
fn group_baselines<'py>(
    py: Python<'py>,
    scores: PyReadonlyArray1<'py, f32>,
    group_index: PyReadonlyArray1<'py, i64>,
    n_groups: usize,
    estimator: &Bound<'py, Estimator>,
) -> PyResult<Baselines<'py>> {
    let estimator = estimator.get();
    let Core::Group(params) = estimator.core else {
        return Err(wrong_family("group_baselines", "group (grpo, drgrpo, rloo)", estimator));
    };
    let (s, g) = (slice(&scores, "scores")?, slice(&group_index, "group_ids")?);
    let out = run(py, || mpo_core::group_baselines(s, g, n_groups, &params))?;
    Ok((PyArray1::from_vec(py, out.baseline), PyArray1::from_vec(py, out.scale), PyArray1::from_vec(py, out.alone)))
}

/// Per-trajectory values written on each trajectory's policy tokens.
#[pyfunction]
fn broadcast_to_tokens<'py>(
    py: Python<'py>,
    per_trajectory: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (p, m, o) = (slice(&per_trajectory, "per_trajectory")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let out = run(py, || mpo_core::broadcast_to_tokens(p, m, o))?;
    Ok(PyArray1::from_vec(py, out))
}

/// (total, between, within, jumps, (starts, ends, traj_offsets, token_turn))
#[pyfunction]
fn value_structure<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    mask: PyReadonlyArray1<'py, u8>,
    offsets: PyReadonlyArray1<'py, i64>,
) -> PyResult<(Doubles<'py>, Doubles<'py>, Doubles<'py>, Floats<'py>, TurnArrays<'py>)> {
    let (v, m, o) = (slice(&values, "values")?, slice(&mask, "mask")?, slice(&offsets, "offsets")?);
    let out = run(py, || mpo_core::value_structure(v, m, o))?;
    Ok((
        PyArray1::from_vec(py, out.total),
        PyArray1::from_vec(py, out.between),
        PyArray1::from_vec(py, out.within),
        PyArray1::from_vec(py, out.jumps),
        turn_arrays(py, out.turns),
    ))
}
