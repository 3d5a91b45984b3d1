//! Reading JSON values with their place in the plan: every accessor takes the path of what it
//! reads, so that an error names the field (`gpus[1].threadblocks[0].ops[3].src_buff[1].index`)
//! rather than only the problem. Array reads are capped by the caller's limit before anything
//! is built from them.

use std::fmt;

use mscclpp_hal::{Error, Result};
use serde_json::{Map, Value};

use super::types::{BufferType, ChannelType};

/// Where in the plan a value is: a JSON path for error messages.
#[derive(Clone)]
pub(super) struct Path(String);

impl Path {
    /// The plan itself.
    pub(super) fn root() -> Path {
        Path(String::new())
    }
    pub(super) fn key(&self, k: &str) -> Path {
        if self.0.is_empty() {
            Path(k.to_owned())
        } else {
            Path(format!("{}.{k}", self.0))
        }
    }
    pub(super) fn at(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("(the plan)")
        } else {
            f.write_str(&self.0)
        }
    }
}

pub(super) fn bad(path: &Path, why: impl fmt::Display) -> Error {
    Error::invalid(format!("execution plan field {path}: {why}"))
}

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn object<'a>(v: &'a Value, path: &Path) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| bad(path, format!("expected an object, found {}", kind_of(v))))
}

pub(super) fn get<'a>(o: &'a Map<String, Value>, k: &str, path: &Path) -> Result<&'a Value> {
    o.get(k)
        .ok_or_else(|| bad(&path.key(k), "missing (a required field)"))
}

pub(super) fn as_u64(v: &Value, path: &Path) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| bad(path, format!("expected a non-negative integer, found {v}")))
}

pub(super) fn u64_field(o: &Map<String, Value>, k: &str, path: &Path) -> Result<u64> {
    as_u64(get(o, k, path)?, &path.key(k))
}

pub(super) fn u64_or(o: &Map<String, Value>, k: &str, default: u64, path: &Path) -> Result<u64> {
    o.get(k).map_or(Ok(default), |v| as_u64(v, &path.key(k)))
}

pub(super) fn index_field(o: &Map<String, Value>, k: &str, path: &Path) -> Result<usize> {
    let v = u64_field(o, k, path)?;
    usize::try_from(v).map_err(|_| bad(&path.key(k), format!("{v} is too large")))
}

pub(super) fn bool_field(
    o: &Map<String, Value>,
    k: &str,
    default: Option<bool>,
    path: &Path,
) -> Result<bool> {
    match (o.get(k), default) {
        (None, Some(d)) => Ok(d),
        (None, None) => Err(bad(&path.key(k), "missing (a required field)")),
        (Some(v), _) => v.as_bool().ok_or_else(|| {
            bad(
                &path.key(k),
                format!("expected a boolean, found {}", kind_of(v)),
            )
        }),
    }
}

pub(super) fn str_field<'a>(o: &'a Map<String, Value>, k: &str, path: &Path) -> Result<&'a str> {
    let v = get(o, k, path)?;
    v.as_str().ok_or_else(|| {
        bad(
            &path.key(k),
            format!("expected a string, found {}", kind_of(v)),
        )
    })
}

pub(super) fn array<'a>(v: &'a Value, path: &Path, max: usize) -> Result<&'a [Value]> {
    let a = v
        .as_array()
        .ok_or_else(|| bad(path, format!("expected an array, found {}", kind_of(v))))?;
    if a.len() > max {
        return Err(bad(
            path,
            format!(
                "{} entries, more than the {max} this executor accepts",
                a.len()
            ),
        ));
    }
    Ok(a)
}

pub(super) fn array_or_empty<'a>(
    o: &'a Map<String, Value>,
    k: &str,
    path: &Path,
    max: usize,
) -> Result<&'a [Value]> {
    match o.get(k) {
        None => Ok(&[]),
        Some(v) => array(v, &path.key(k), max),
    }
}

pub(super) fn indexes(v: &Value, path: &Path, max: usize) -> Result<Vec<usize>> {
    array(v, path, max)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let n = as_u64(x, &path.at(i))?;
            usize::try_from(n).map_err(|_| bad(&path.at(i), format!("{n} is too large")))
        })
        .collect()
}

pub(super) fn buffer_type(s: &str, path: &Path) -> Result<BufferType> {
    BufferType::parse(s).ok_or_else(|| {
        bad(
            path,
            format!("unknown buffer type {s:?} (expected \"i\", \"o\" or \"s\")"),
        )
    })
}

pub(super) fn channel_type(s: &str, path: &Path) -> Result<ChannelType> {
    ChannelType::parse(s).ok_or_else(|| {
        bad(
            path,
            format!("unknown channel type {s:?} (expected \"memory\", \"port\" or \"switch\")"),
        )
    })
}
