//! Typed reads of tree nodes: integers, booleans, text, durations, addresses, networks,
//! choices, lists and mappings, each reporting a located "expected X, found Y" on mismatch.
//!
//! Scalars follow YAML 1.2's core schema: a plain `10` is an integer, a quoted `"10"` is
//! text, `true`/`false` are booleans, `~`/`null`/empty are null. Text fields accept plain
//! numbers and booleans as written (`customer: 123`), but number fields never accept text.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use crate::config::bounds;
use crate::config::report::Report;
use crate::config::suggest;
use crate::config::yaml::{Entry, Node, Scalar, Value};

/// What a plain or quoted scalar means under the core schema.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Null,
    Bool(bool),
    /// An integer; `None` when it does not fit in 128 bits.
    Int(Option<i128>),
    Float,
    Str,
}

fn classify(s: &Scalar) -> Class {
    if !s.plain {
        return Class::Str;
    }
    let t = s.text.as_str();
    match t {
        "" | "~" | "null" | "Null" | "NULL" => return Class::Null,
        "true" | "True" | "TRUE" => return Class::Bool(true),
        "false" | "False" | "FALSE" => return Class::Bool(false),
        ".inf" | "+.inf" | "-.inf" | ".Inf" | "+.Inf" | "-.Inf" | ".INF" | "+.INF" | "-.INF"
        | ".nan" | ".NaN" | ".NAN" => return Class::Float,
        _ => {}
    }
    if let Some(hex) = t.strip_prefix("0x") {
        if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Class::Int(i128::from_str_radix(hex, 16).ok());
        }
    }
    if let Some(oct) = t.strip_prefix("0o") {
        if !oct.is_empty() && oct.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Class::Int(i128::from_str_radix(oct, 8).ok());
        }
    }
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Class::Int(t.parse::<i128>().ok());
    }
    let looks_float = digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if looks_float && t.parse::<f64>().is_ok() {
        return Class::Float;
    }
    Class::Str
}

/// How a node is described in "found ..." messages.
pub(crate) fn describe(node: &Node) -> &'static str {
    match &node.value {
        Value::Seq(_) => "a list",
        Value::Map(_) => "a mapping",
        Value::Bad => "an invalid value",
        Value::Scalar(s) => match classify(s) {
            Class::Null => "null",
            Class::Bool(_) => "a boolean",
            Class::Int(_) => "an integer",
            Class::Float => "a float",
            Class::Str => "a string",
        },
    }
}

/// Whether a node is null (`~`, `null`, or nothing at all).
pub(crate) fn is_null(node: &Node) -> bool {
    matches!(&node.value, Value::Scalar(s) if classify(s) == Class::Null)
}

/// Whether a node is text under the core schema (quoted, or plain but not a number,
/// boolean or null).
pub(crate) fn is_string(node: &Node) -> bool {
    matches!(&node.value, Value::Scalar(s) if classify(s) == Class::Str)
}

fn mismatch(r: &mut Report, node: &Node, path: &str, expected: &str) {
    if node.value != Value::Bad {
        r.error(
            node.pos,
            path,
            format!("expected {expected}, found {}", describe(node)),
        );
    }
}

/// A mapping's entries; null counts as an empty mapping (`server:` with every line
/// commented out).
pub(crate) fn map<'n>(r: &mut Report, node: &'n Node, path: &str) -> Option<&'n [Entry]> {
    match &node.value {
        Value::Map(entries) => Some(entries),
        Value::Scalar(s) if classify(s) == Class::Null => Some(&[]),
        _ => {
            mismatch(r, node, path, "a mapping");
            None
        }
    }
}

/// A list's items.
pub(crate) fn seq<'n>(r: &mut Report, node: &'n Node, path: &str) -> Option<&'n [Node]> {
    match &node.value {
        Value::Seq(items) => Some(items),
        _ => {
            mismatch(r, node, path, "a list");
            None
        }
    }
}

/// A scalar's text: strings, and numbers or booleans as written. Null is refused.
pub(crate) fn text<'n>(r: &mut Report, node: &'n Node, path: &str) -> Option<&'n str> {
    match &node.value {
        Value::Scalar(s) if classify(s) != Class::Null => Some(&s.text),
        _ => {
            mismatch(r, node, path, "a string");
            None
        }
    }
}

/// A `max_keys` value: the keys a limiter keeps state for, 1 to [`bounds::MAX_KEYS`].
pub(crate) fn max_keys(r: &mut Report, node: &Node, path: &str) -> Option<usize> {
    int(r, node, path, 1, bounds::MAX_KEYS as u64).and_then(|n| usize::try_from(n).ok())
}

/// An integer in `lo..=hi`.
pub(crate) fn int(r: &mut Report, node: &Node, path: &str, lo: u64, hi: u64) -> Option<u64> {
    let Value::Scalar(s) = &node.value else {
        mismatch(r, node, path, "an integer");
        return None;
    };
    let Class::Int(value) = classify(s) else {
        mismatch(r, node, path, "an integer");
        return None;
    };
    // `None`: beyond 128 bits, so far above any bound.
    let too_large = value.is_none_or(|v| v > i128::from(hi));
    match value.and_then(|v| u64::try_from(v).ok()) {
        Some(v) if (lo..=hi).contains(&v) => Some(v),
        _ if too_large => {
            r.error(
                node.pos,
                path,
                format!("too large: must be at most {hi}, found {}", s.text),
            );
            None
        }
        _ => {
            let range = if hi == u64::MAX {
                format!("must be at least {lo}")
            } else {
                format!("must be between {lo} and {hi}")
            };
            r.error(node.pos, path, format!("{range}, found {}", s.text));
            None
        }
    }
}

/// `true` or `false`.
pub(crate) fn boolean(r: &mut Report, node: &Node, path: &str) -> Option<bool> {
    if let Value::Scalar(s) = &node.value {
        if let Class::Bool(b) = classify(s) {
            return Some(b);
        }
    }
    mismatch(r, node, path, "a boolean (`true` or `false`)");
    None
}

/// A duration such as `250ms` or `1d`, within `lo..=hi` (`names` spell the bounds).
pub(crate) fn duration(
    r: &mut Report,
    node: &Node,
    path: &str,
    (lo, hi): (Duration, Duration),
    names: (&str, &str),
) -> Option<Duration> {
    let Value::Scalar(s) = &node.value else {
        mismatch(r, node, path, "a duration such as `1s`");
        return None;
    };
    let t = s.text.trim();
    let number_only = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if matches!(classify(s), Class::Int(_) | Class::Float) || number_only {
        r.error(node.pos, path, "durations need a unit, e.g. `1s`");
        return None;
    }
    if classify(s) != Class::Str {
        mismatch(r, node, path, "a duration such as `1s`");
        return None;
    }
    let (lo_name, hi_name) = names;
    let message = match humantime::parse_duration(t) {
        Ok(d) if (lo..=hi).contains(&d) => return Some(d),
        Ok(_) => format!("duration `{t}` is out of range: must be between {lo_name} and {hi_name}"),
        Err(humantime::DurationError::NumberOverflow) => {
            format!("duration `{t}` is too large: must be at most {hi_name}")
        }
        Err(_) => format!("`{t}` is not a duration; write e.g. `250ms`, `1s`, `5m`, `1h` or `1d`"),
    };
    r.error(node.pos, path, message);
    None
}

/// One of `options`, as an index; `what` names the choice in the message.
pub(crate) fn choice(
    r: &mut Report,
    node: &Node,
    path: &str,
    what: &str,
    options: &[&str],
) -> Option<usize> {
    let t = text(r, node, path)?;
    match options.iter().position(|o| *o == t) {
        Some(i) => Some(i),
        None => {
            r.error(node.pos, path, suggest::unknown(what, t, options));
            None
        }
    }
}

/// An `ip:port` literal (`[v6]:port` for IPv6).
pub(crate) fn socket_addr(r: &mut Report, node: &Node, path: &str) -> Option<SocketAddr> {
    let t = text(r, node, path)?;
    match t.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            r.error(
                node.pos,
                path,
                format!("`{t}` is not an address of the form ip:port, e.g. `127.0.0.1:8080`"),
            );
            None
        }
    }
}

/// An IP network: `10.0.0.0/8`, or a bare address as a single-host network.
pub(crate) fn parse_net(t: &str) -> Option<IpNet> {
    t.parse::<IpNet>()
        .ok()
        .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from))
}

/// [`parse_net`] with a located error.
pub(crate) fn net(r: &mut Report, node: &Node, path: &str) -> Option<IpNet> {
    let t = text(r, node, path)?;
    let parsed = parse_net(t);
    if parsed.is_none() {
        r.error(
            node.pos,
            path,
            format!("`{t}` is not an IP address or network, e.g. `10.0.0.0/8`"),
        );
    }
    parsed
}
