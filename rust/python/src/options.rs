//! `mpo_rs.Estimator`: an estimator name plus its options, built and validated by the
//! options table of mpo-core. Frozen, comparable, hashable and picklable (Ray ships it to
//! its workers).

use mpo_core::{Estimator as Core, OptionKind, OptionSpec, OptionValue, ESTIMATORS, OPTIONS};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple, PyType};

use crate::errors::{core_error, InvalidOptionError};

/// An advantage estimator and its options: ``Estimator("mae", lam=0.9)``.
///
/// ``name`` is one of ``Estimator.names()``; each keyword overrides one of that
/// estimator's options (``Estimator.option_table()``), ``None`` meaning its default. An
/// unknown estimator or option, an option the estimator does not take, or a value outside
/// its domain raises ``InvalidOptionError`` naming it.
#[pyclass(frozen, module = "mpo_rs.options", name = "Estimator")]
#[derive(Debug)]
pub struct Estimator {
    name: &'static str,
    pub(crate) core: Core,
}

impl Estimator {
    /// Builds `name` with the keyword `overrides` (None values skipped).
    pub fn build(name: &str, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Some(name) = ESTIMATORS.iter().copied().find(|&n| n == name) else {
            // The core's error names the estimators to choose from.
            let unknown = || InvalidOptionError::new_err(format!("unknown estimator `{name}`"));
            return Err(Core::named(name).err().map_or_else(unknown, core_error));
        };
        let mut given: Vec<(String, OptionValue)> = Vec::new();
        if let Some(overrides) = overrides {
            for (key, value) in overrides.iter() {
                let key: String = key.extract()?;
                let spec = OptionSpec::find(&key);
                // None means "the default" for an option of the table; a name the table
                // does not know is refused even then (a misspelt option must not pass).
                if value.is_none() && spec.is_some() {
                    continue;
                }
                // An option the estimator does not take is reported by the table, by name.
                let value = match spec.filter(|s| s.applies_to(name)) {
                    Some(spec) => option_value(&key, spec.kind, &value)?,
                    None => OptionValue::Unset,
                };
                given.push((key, value));
            }
        }
        let given: Vec<(&str, OptionValue)> = given.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let core = Core::from_options(name, &given).map_err(core_error)?;
        Ok(Self { name, core })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The applicable options and their values, in table order.
    fn values(&self) -> impl Iterator<Item = (&'static str, OptionValue)> + '_ {
        Core::options_of(self.name).filter_map(|s| self.core.option(s.name).map(|v| (s.name, v)))
    }

    fn options_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in self.values() {
            d.set_item(name, to_python(py, value)?)?;
        }
        Ok(d)
    }

    /// The options that differ from the named estimator's defaults: what rebuilds it
    /// (`replace`, pickling), without giving explicitly an option its other options make
    /// a no-op (grpo's eps with `norm_std=False`).
    fn changed_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let defaults = Core::named(self.name).map_err(core_error)?;
        let d = PyDict::new(py);
        for (name, value) in self.values() {
            if defaults.option(name) != Some(value) {
                d.set_item(name, to_python(py, value)?)?;
            }
        }
        Ok(d)
    }
}

/// `value` as errors show it: its repr, cut short (an int of 400 digits is not printed).
fn short_repr(value: &Bound<'_, PyAny>) -> String {
    const MAX: usize = 40;
    let repr = value.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into());
    if repr.chars().count() <= MAX {
        return repr;
    }
    let head: String = repr.chars().take(MAX - 12).collect();
    format!("{head}… ({} characters)", repr.chars().count())
}

/// ``check_tolerance`` (of the sum check of per-turn rewards) as a float, judged whether or
/// not a check is asked for, by every entry point (numpy, Arrow, Parquet, the command): a
/// real number (not a bool or a string) in the core's domain (`mpo_core::check_tolerance`).
pub(crate) fn check_tolerance(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
    let Some(value) = value.filter(|v| !v.is_none()) else { return Ok(None) };
    // Every call passes one (the default): a plain float needs no type checks.
    if let Ok(x) = value.cast_exact::<PyFloat>() {
        return mpo_core::check_tolerance(x.value()).map(Some).map_err(core_error);
    }
    let type_name = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    let wrong = || {
        InvalidOptionError::new_err(format!(
            "`check_tolerance` must be a number in [0, inf), got {type_name} {}",
            short_repr(value)
        ))
    };
    let flag = value.is_instance_of::<PyBool>() || type_name == "bool_";
    if flag || value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(wrong());
    }
    let x: f64 = value.extract().map_err(|_| wrong())?;
    mpo_core::check_tolerance(x).map(Some).map_err(core_error)
}

/// A Python value as the kind of option `key` is. Strings are refused for every kind
/// (`"false"` is not converted to a bool nor `"0.9"` to a float): a value must already be
/// of its kind, whoever passes it (a config file's adapter included).
fn option_value(key: &str, kind: OptionKind, value: &Bound<'_, PyAny>) -> PyResult<OptionValue> {
    let spec_domain = OptionSpec::find(key).map_or("", |s| s.domain);
    let type_name = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    let wrong = || {
        InvalidOptionError::new_err(format!(
            "`{key}` takes a {} ({spec_domain}), got {type_name} {}",
            kind.name(),
            short_repr(value)
        ))
    };
    if let OptionKind::Choice(_) = kind {
        // A choice is a name: a str, one of the kind's (the table's error names them).
        let spec = OptionSpec::find(key).filter(|s| s.kind == kind);
        return match (value.cast::<PyString>(), spec) {
            (Ok(name), Some(spec)) => spec.choice(&name.to_cow()?).map_err(core_error),
            _ => Err(wrong()),
        };
    }
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(InvalidOptionError::new_err(format!(
            "`{key}` takes a {} ({spec_domain}), got the string {}; strings are not converted, pass the value itself",
            kind.name(),
            short_repr(value)
        )));
    }
    match kind {
        OptionKind::Bool => {
            // True/False, numpy's bool (`bool_` before numpy 2), and the integers 0 and 1 (config
            // files write them).
            let is_flag = value.is_instance_of::<PyBool>()
                || type_name == "bool_"
                || type_name == "bool"
                || value.extract::<i64>().is_ok_and(|i| i == 0 || i == 1) && !value.is_instance_of::<PyFloat>();
            if is_flag {
                Ok(OptionValue::Bool(value.is_truthy()?))
            } else {
                Err(wrong())
            }
        }
        OptionKind::Choice(_) => Err(wrong()),
        OptionKind::Float | OptionKind::OptionalFloat => match value.extract::<f64>() {
            Ok(x) => Ok(OptionValue::Float(x)),
            // An int too large for a float (10**400) is a number out of range, not a wrong kind.
            Err(e) if value.is_instance_of::<PyInt>() && e.is_instance_of::<PyOverflowError>(value.py()) => {
                Err(InvalidOptionError::new_err(format!(
                    "`{key}` = {} is out of range: it is not representable as a float, and it must be in {spec_domain}",
                    short_repr(value)
                )))
            }
            Err(_) => Err(wrong()),
        },
    }
}

fn to_python(py: Python<'_>, value: OptionValue) -> PyResult<Py<PyAny>> {
    Ok(match value {
        OptionValue::Float(x) => x.into_pyobject(py)?.into_any().unbind(),
        OptionValue::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        OptionValue::Choice(name) => name.into_pyobject(py)?.into_any().unbind(),
        OptionValue::Unset => py.None(),
    })
}

#[pymethods]
impl Estimator {
    #[new]
    #[pyo3(signature = (name, **overrides))]
    fn new(name: &str, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::build(name, overrides)
    }

    /// The estimator's name: one of ``Estimator.names()``.
    #[getter(name)]
    fn py_name(&self) -> &'static str {
        self.name
    }

    /// ``"mae"``, ``"gae"``, ``"group"`` (grpo, drgrpo, rloo), ``"bilevel"`` or ``"gigpo"``.
    #[getter]
    fn family(&self) -> &'static str {
        self.core.family()
    }

    /// The options this estimator takes, with their values (defaults filled in).
    #[getter]
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.options_dict(py)
    }

    /// A copy with some options changed (validated like the constructor).
    /// None resets an option to its default; an unknown name is refused even then.
    #[pyo3(signature = (**overrides))]
    fn replace(&self, py: Python<'_>, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let merged = self.changed_dict(py)?;
        if let Some(overrides) = overrides {
            merged.update(overrides.as_mapping())?;
        }
        Self::build(self.name, Some(&merged))
    }

    /// The estimator names, in the order the docs list them.
    #[staticmethod]
    fn names<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, ESTIMATORS)
    }

    /// The options table, one dict per option: ``name``, ``kind`` ("float", "optional
    /// float", "bool" or "choice"), ``choices`` (a choice's names, else empty),
    /// ``defaults`` (estimator name -> default), ``domain``, ``doc`` and ``estimators``
    /// (the names that take it).
    #[staticmethod]
    fn option_table<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let rows = OPTIONS
            .iter()
            .map(|spec| {
                let row = PyDict::new(py);
                row.set_item("name", spec.name)?;
                row.set_item("kind", spec.kind.name())?;
                row.set_item("choices", PyTuple::new(py, spec.kind.choices())?)?;
                let defaults = PyDict::new(py);
                for &estimator in spec.estimators {
                    let default = Core::named(estimator).ok().and_then(|e| e.option(spec.name));
                    defaults.set_item(estimator, to_python(py, default.unwrap_or(OptionValue::Unset))?)?;
                }
                row.set_item("defaults", defaults)?;
                row.set_item("domain", spec.domain)?;
                row.set_item("doc", spec.doc)?;
                row.set_item("estimators", PyTuple::new(py, spec.estimators)?)?;
                Ok(row)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, rows)
    }

    /// Rebuilds a pickled estimator.
    #[classmethod]
    fn _from_options(_cls: &Bound<'_, PyType>, name: &str, options: &Bound<'_, PyDict>) -> PyResult<Self> {
        Self::build(name, Some(options))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let rebuild = slf.get_type().getattr("_from_options")?;
        let this = slf.get();
        let args = (this.name, this.changed_dict(py)?).into_pyobject(py)?;
        PyTuple::new(py, [rebuild, args.into_any()])
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = vec![format!("{:?}", self.name)];
        for (name, value) in self.values() {
            let value = to_python(py, value)?;
            parts.push(format!("{name}={}", value.bind(py).repr()?));
        }
        Ok(format!("Estimator({})", parts.join(", ")).replacen('"', "'", 2))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Self>().is_ok_and(|o| {
            let o = o.get();
            o.name == self.name && o.core == self.core
        })
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        let values = self.values().map(|(_, v)| to_python(py, v)).collect::<PyResult<Vec<_>>>()?;
        (self.name, PyTuple::new(py, values)?).into_pyobject(py)?.hash()
    }
}
