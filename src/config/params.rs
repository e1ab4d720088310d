//! The parameter fields a limit and its overrides share (`max`, `per`, `strict`,
//! `capacity`, `refill`, `cost`), read without knowing the kind yet.
//!
//! Each field has one type whatever the kind, so values are checked here, at once; whether
//! the field belongs to the limit's kind is decided after merging, in [`super::resolve`].

use std::time::Duration;

use crate::config::bounds;
use crate::config::model::Cost;
use crate::config::report::{child, located, At, Pos, Report};
use crate::config::scalar;
use crate::config::spec::ParamSpec;
use crate::config::suggest;
use crate::config::yaml::{Node, Value};

/// `per`: 100 ms to 1 day.
pub(crate) const PER_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(86_400));
/// `refill.every`: 1 ms to 1 day.
pub(crate) const EVERY_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(86_400));

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Reads `key: node` into `spec` when `key` is a parameter field, and returns the field's
/// name; `None` when it is not one. In an override `max` and `capacity` may be 0 (a
/// deliberate block).
pub(crate) fn param(
    r: &mut Report,
    key: &str,
    key_pos: Pos,
    node: &Node,
    path: &str,
    in_override: bool,
    spec: &mut ParamSpec,
) -> Option<&'static str> {
    let least = if in_override { 0 } else { 1 };
    let name = match key {
        "max" => {
            spec.max = scalar::int(r, node, path, least, u64::MAX).map(located(node.pos, path));
            "max"
        }
        "capacity" => {
            spec.capacity =
                scalar::int(r, node, path, least, u64::MAX).map(located(node.pos, path));
            "capacity"
        }
        "per" => {
            let d = scalar::duration(r, node, path, PER_RANGE, ("100ms", "1d"));
            spec.per = d.map(nanos).map(located(node.pos, path));
            "per"
        }
        "strict" => {
            spec.strict = scalar::boolean(r, node, path).map(located(node.pos, path));
            "strict"
        }
        "cost" => {
            spec.cost = cost(r, node, path).map(located(node.pos, path));
            "cost"
        }
        "refill" => {
            spec.refill = Some(At::new((), key_pos, path));
            refill(r, node, path, spec);
            "refill"
        }
        _ => return None,
    };
    spec.written.push(name);
    Some(name)
}

fn refill(r: &mut Report, node: &Node, path: &str, spec: &mut ParamSpec) {
    let Some(entries) = scalar::map(r, node, path) else {
        return;
    };
    for e in entries {
        let sub = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "amount" => {
                spec.written.push("refill.amount");
                let amount = scalar::int(r, v, &sub, 1, u64::MAX);
                spec.amount = amount.map(|a| At::new(a, v.pos, &sub));
            }
            "every" => {
                spec.written.push("refill.every");
                let d = scalar::duration(r, v, &sub, EVERY_RANGE, ("1ms", "1d"));
                spec.every = d.map(|d| At::new(nanos(d), v.pos, &sub));
            }
            other => {
                // A misspelt `amount` is reported as such, not also as missing.
                match suggest::closest(other, &["amount", "every"]) {
                    Some("amount") => spec.written.push("refill.amount"),
                    Some(_) => spec.written.push("refill.every"),
                    None => {}
                }
                r.error(
                    e.key_pos,
                    &sub,
                    suggest::unknown("key", other, &["amount", "every"]),
                );
            }
        }
    }
}

/// `cost`: an integer of at least 1, or `header:NAME` to read it from a request header.
fn cost(r: &mut Report, node: &Node, path: &str) -> Option<Cost> {
    if let Value::Scalar(s) = &node.value {
        if let Some(name) = s.text.strip_prefix("header:") {
            if crate::limits::key::is_header_name(name) {
                return Some(Cost::Header(name.to_ascii_lowercase()));
            }
            r.error(
                node.pos,
                path,
                format!("`{}` needs a valid header name after `header:`", s.text),
            );
            return None;
        }
        if scalar::is_string(node) {
            r.error(
                node.pos,
                path,
                format!(
                    "expected an integer of at least 1 or `header:NAME`, found `{}`",
                    s.text
                ),
            );
            return None;
        }
    }
    scalar::int(r, node, path, 1, u64::MAX).map(Cost::Fixed)
}

/// Reads `sketch: {hashes, slots}` for inflight and rate limits.
pub(crate) fn sketch(
    r: &mut Report,
    node: &Node,
    path: &str,
) -> (Option<At<usize>>, Option<At<usize>>) {
    let (mut hashes, mut slots) = (None, None);
    let Some(entries) = scalar::map(r, node, path) else {
        return (None, None);
    };
    for e in entries {
        let sub = child(path, &e.key);
        let v = &e.value;
        let read = |r: &mut Report, lo, hi| {
            scalar::int(r, v, &sub, lo, hi)
                .and_then(|n| usize::try_from(n).ok())
                .map(|n| At::new(n, v.pos, &sub))
        };
        match e.key.as_str() {
            "hashes" => hashes = read(r, 1, bounds::MAX_HASHES as u64),
            "slots" => slots = read(r, 16, bounds::MAX_SLOTS as u64),
            other => r.error(
                e.key_pos,
                &sub,
                suggest::unknown("key", other, &["hashes", "slots"]),
            ),
        }
    }
    (hashes, slots)
}
