//! The parameter fields a limit and its overrides share (`max` (a number or `auto`),
//! `share`, `per`, `strict`,
//! `capacity`, `refill`, `cost`, `windows`, `tiers`, `hard_limit`, `global_limit`,
//! `global`), read without knowing the kind yet.
//!
//! Each field has one type whatever the kind, so values are checked here, at once; whether
//! the field belongs to the limit's kind is decided after merging, in [`super::resolve`].

use std::time::Duration;

use crate::config::bounds;
use crate::config::model::Cost;
use crate::config::report::{child, item, located, At, Pos, Report};
use crate::config::scalar;
use crate::config::spec::ParamSpec;
use crate::config::suggest;
use crate::config::yaml::{Entry, Node, Value};
use crate::limits::adaptive::MAX_LIMIT;
use crate::limits::{AdaptiveBounds, LogWindow, Tier};

/// `per`: 100 ms to 1 day.
pub(crate) const PER_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(86_400));
/// `refill.every`: 1 ms to 1 day.
pub(crate) const EVERY_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(86_400));
/// A sliding log window's `per`: 1 s to 366 days (a leap year of frequency caps).
pub(crate) const LOG_PER_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(366 * 86_400));
/// A tier's `window`, `active` and `cooldown`: up to 366 days (`active`/`cooldown` may be
/// 0; a zero window is refused by the tiered limiter's own check).
pub(crate) const TIER_RANGE: (Duration, Duration) =
    (Duration::ZERO, Duration::from_secs(366 * 86_400));
/// Windows a sliding log may check at once.
pub(crate) const MAX_WINDOWS: usize = 8;
/// The keys `refill:` takes.
pub(crate) const REFILL_KEYS: [&str; 2] = ["amount", "every"];
/// The keys one sliding-log window takes.
pub(crate) const WINDOW_KEYS: [&str; 2] = ["max", "per"];
/// The keys one tier takes.
pub(crate) const TIER_KEYS: [&str; 5] = ["limit", "window", "active", "cooldown", "skippable"];
/// The keys `sketch:` takes.
pub(crate) const SKETCH_KEYS: [&str; 2] = ["hashes", "slots"];

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
            // A quoted number is still a wrong integer, reported as such; other text and
            // mappings are meant as `auto`.
            let quoted_number = matches!(&node.value, Value::Scalar(s)
                if !s.text.is_empty() && s.text.bytes().all(|b| b.is_ascii_digit()));
            if (scalar::is_string(node) && !quoted_number) || matches!(node.value, Value::Map(_)) {
                spec.auto = auto(r, node, path).map(located(node.pos, path));
                spec.max = None;
            } else {
                spec.max = scalar::int(r, node, path, least, u64::MAX).map(located(node.pos, path));
                spec.auto = None;
            }
            "max"
        }
        "share" => {
            spec.share = share(r, node, path).map(located(node.pos, path));
            "share"
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
        "windows" => {
            spec.windows = windows(r, node, path, least).map(located(node.pos, path));
            "windows"
        }
        "tiers" => {
            spec.tiers = tiers(r, node, path).map(located(node.pos, path));
            "tiers"
        }
        "hard_limit" => {
            spec.hard_limit = scalar::int(r, node, path, 1, crate::limits::tiered::MAX_LIMIT)
                .map(located(node.pos, path));
            "hard_limit"
        }
        "global_limit" => {
            let max = crate::limits::tiered::MAX_GLOBAL_LIMIT;
            spec.global_limit = scalar::int(r, node, path, 1, max).map(located(node.pos, path));
            "global_limit"
        }
        "global" => {
            spec.global = scalar::int(r, node, path, 1, u64::MAX).map(located(node.pos, path));
            "global"
        }
        _ => return None,
    };
    spec.written.push(name);
    Some(name)
}

/// `max: auto` or `max: {auto: {min, max, initial}}` (each optional, defaults from
/// [`AdaptiveBounds::DEFAULT`]; `min ≤ initial ≤ max` is checked).
fn auto(r: &mut Report, node: &Node, path: &str) -> Option<AdaptiveBounds> {
    let expected = "`max` takes an integer, `auto`, or `{auto: {min, max, initial}}`";
    if scalar::is_string(node) {
        let text = scalar::text(r, node, path)?;
        if text == "auto" {
            return Some(AdaptiveBounds::DEFAULT);
        }
        r.error(node.pos, path, format!("{expected}, found `{text}`"));
        return None;
    }
    let entries = scalar::map(r, node, path)?;
    let mut found = None;
    for e in entries {
        let sub = child(path, &e.key);
        if e.key != "auto" {
            r.error(e.key_pos, &sub, suggest::unknown("key", &e.key, &["auto"]));
            continue;
        }
        found = auto_bounds(r, &e.value, &sub);
    }
    if entries.is_empty() {
        r.error(
            node.pos,
            path,
            format!("{expected}, found an empty mapping"),
        );
    }
    found
}

/// The keys `max: {auto: ...}` takes.
pub(crate) const AUTO_KEYS: [&str; 3] = ["min", "max", "initial"];

fn auto_bounds(r: &mut Report, node: &Node, path: &str) -> Option<AdaptiveBounds> {
    let d = AdaptiveBounds::DEFAULT;
    if scalar::is_null(node) {
        return Some(d);
    }
    let entries = scalar::map(r, node, path)?;
    let (mut min, mut max, mut initial) = (None, None, None);
    let mut ok = true;
    for e in entries {
        let sub = child(path, &e.key);
        let slot = match e.key.as_str() {
            "min" => &mut min,
            "max" => &mut max,
            "initial" => &mut initial,
            other => {
                r.error(e.key_pos, &sub, suggest::unknown("key", other, &AUTO_KEYS));
                ok = false;
                continue;
            }
        };
        match scalar::int(r, &e.value, &sub, 1, MAX_LIMIT) {
            Some(v) => *slot = Some((v, e.value.pos, sub)),
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    let value = |s: &Option<(u64, Pos, String)>| s.as_ref().map(|s| s.0);
    let lo = value(&min).unwrap_or(d.min);
    let hi = value(&max).unwrap_or(d.max.max(lo));
    if lo > hi {
        let (pos, at) = min
            .as_ref()
            .map_or((node.pos, path.to_string()), |m| (m.1, m.2.clone()));
        r.error(pos, &at, format!("`min` {lo} is above `max` {hi}"));
        return None;
    }
    // No `clamp` before `lo ≤ hi` is known: it panics otherwise.
    let start = value(&initial).unwrap_or(d.initial.max(lo).min(hi));
    if !(lo..=hi).contains(&start) {
        let (pos, at) = initial
            .as_ref()
            .map_or((node.pos, path.to_string()), |m| (m.1, m.2.clone()));
        r.error(
            pos,
            &at,
            format!("`initial` {start} is outside `min` {lo} to `max` {hi}"),
        );
        return None;
    }
    Some(AdaptiveBounds {
        min: lo,
        max: hi,
        initial: start,
    })
}

/// `share: 50%`: a percentage from 1% to 100%.
fn share(r: &mut Report, node: &Node, path: &str) -> Option<u8> {
    let message = "`share` takes a percentage from `1%` to `100%`, e.g. `50%`";
    let text = scalar::text(r, node, path)?;
    let value = text
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u8>().ok())
        .filter(|n| (1..=100).contains(n));
    if value.is_none() {
        r.error(node.pos, path, format!("{message}, found `{text}`"));
    }
    value
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
                match suggest::closest(other, &REFILL_KEYS) {
                    Some("amount") => spec.written.push("refill.amount"),
                    Some(_) => spec.written.push("refill.every"),
                    None => {}
                }
                r.error(
                    e.key_pos,
                    &sub,
                    suggest::unknown("key", other, &REFILL_KEYS),
                );
            }
        }
    }
}

/// `windows: [{max, per}, ...]` of a sliding log: one to [`MAX_WINDOWS`], each `max` at
/// least `least` (0 in an override: a block) and `per` within [`LOG_PER_RANGE`].
fn windows(r: &mut Report, node: &Node, path: &str, least: u64) -> Option<Vec<LogWindow>> {
    maps(
        r,
        node,
        path,
        ("windows", MAX_WINDOWS),
        |r, n, entries, p| {
            let (mut max, mut per) = (None, None);
            for e in entries {
                let sub = child(p, &e.key);
                match e.key.as_str() {
                    "max" => max = scalar::int(r, &e.value, &sub, least, u64::from(u32::MAX)),
                    "per" => {
                        let range = LOG_PER_RANGE;
                        per = scalar::duration(r, &e.value, &sub, range, ("1s", "366d")).map(nanos);
                    }
                    other => r.error(
                        e.key_pos,
                        &sub,
                        suggest::unknown("key", other, &WINDOW_KEYS),
                    ),
                }
            }
            match (max, per) {
                (Some(max), Some(per)) => Some(LogWindow { max, per }),
                _ => {
                    required(
                        r,
                        (n, p),
                        entries,
                        [("max", max.is_some()), ("per", per.is_some())],
                    );
                    None
                }
            }
        },
    )
}

/// `tiers: [{limit, window, active, cooldown, skippable}, ...]` of a tiered limit, as
/// written; the paper's load-time normalization happens when the limit is resolved.
fn tiers(r: &mut Report, node: &Node, path: &str) -> Option<Vec<Tier>> {
    let most = crate::limits::tiered::MAX_TIERS;
    maps(r, node, path, ("tiers", most), |r, n, entries, p| {
        let mut tier = Tier {
            limit: 0,
            window: 0,
            active: 0,
            cooldown: 0,
            skippable: false,
        };
        let mut seen = [false; 3];
        for e in entries {
            let sub = child(p, &e.key);
            let v = &e.value;
            let span = |r: &mut Report| {
                scalar::duration(r, v, &sub, TIER_RANGE, ("0s", "366d")).map(nanos)
            };
            match e.key.as_str() {
                "limit" => {
                    let max = crate::limits::tiered::MAX_LIMIT;
                    if let Some(l) = scalar::int(r, v, &sub, 0, max) {
                        (tier.limit, seen[0]) = (l, true);
                    }
                }
                "window" => {
                    if let Some(w) = span(r) {
                        (tier.window, seen[1]) = (w, true);
                    }
                }
                "active" => {
                    if let Some(a) = span(r) {
                        (tier.active, seen[2]) = (a, true);
                    }
                }
                "cooldown" => tier.cooldown = span(r).unwrap_or(0),
                "skippable" => tier.skippable = scalar::boolean(r, v, &sub).unwrap_or(false),
                other => r.error(e.key_pos, &sub, suggest::unknown("key", other, &TIER_KEYS)),
            }
        }
        let fields = [("limit", seen[0]), ("window", seen[1]), ("active", seen[2])];
        required(r, (n, p), entries, fields).then_some(tier)
    })
}

/// A list of 1 to `most` maps under `field` (`windows`, `tiers`), each read by `each` from
/// its node, its entries and its path; `None` if the list's length or any item is wrong
/// (every error reported).
fn maps<T>(
    r: &mut Report,
    node: &Node,
    path: &str,
    (field, most): (&str, usize),
    mut each: impl FnMut(&mut Report, &Node, &[Entry], &str) -> Option<T>,
) -> Option<Vec<T>> {
    let items = scalar::seq(r, node, path)?;
    if items.is_empty() || items.len() > most {
        let message = format!("`{field}` needs 1 to {most} {field}, found {}", items.len());
        r.error(node.pos, path, message);
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        match scalar::map(r, n, &p).and_then(|entries| each(r, n, entries, &p)) {
            Some(v) => out.push(v),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Whether every required field of a map item was read; a field absent from `entries`
/// is reported as missing (one present but wrong was reported as such already).
fn required<const N: usize>(
    r: &mut Report,
    (node, path): (&Node, &str),
    entries: &[Entry],
    fields: [(&str, bool); N],
) -> bool {
    for (name, present) in fields {
        if !present && entries.iter().all(|e| e.key != name) {
            r.error(node.pos, path, format!("missing required field `{name}`"));
        }
    }
    fields.iter().all(|(_, present)| *present)
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
                suggest::unknown("key", other, &SKETCH_KEYS),
            ),
        }
    }
    (hashes, slots)
}
