//! One `limits.NAME` mapping, in `defaults` or in an origin, read into a [`LimitSpec`].
//!
//! Only types and ranges are checked here. Which fields the kind accepts, which are
//! required, and what the defaults are is decided after merging, in [`super::resolve`],
//! because an origin's limit may take its kind from a default of the same name.

use crate::config::bounds;
use crate::config::lease;
use crate::config::model::{HeadersMode, Kind, Mode};
use crate::config::names::{is_label, key_part, label_message};
use crate::config::overrides;
use crate::config::params;
use crate::config::report::{child, item, located, At, Report};
use crate::config::scalar;
use crate::config::spec::{limit_keys, GroupSpec, LimitSpec, Setting};
use crate::config::suggest;
use crate::config::yaml::{Entry, Node};
use crate::limits::KeyPart;

/// The keys one concurrency group takes.
pub(crate) const GROUP_KEYS: [&str; 3] = ["name", "members", "max"];

/// Reads every entry of a `limits:` mapping at `path`.
pub(crate) fn parse_limits(r: &mut Report, node: &Node, path: &str) -> Vec<LimitSpec> {
    let Some(entries) = scalar::map(r, node, path) else {
        return Vec::new();
    };
    entries.iter().map(|e| parse_limit(r, e, path)).collect()
}

/// Reads the limit `entry` of the `limits:` mapping at `parent`.
fn parse_limit(r: &mut Report, entry: &Entry, parent: &str) -> LimitSpec {
    let path = child(parent, &entry.key);
    let mut spec = LimitSpec::new(&entry.key, entry.key_pos, &path);
    if !is_label(&entry.key) {
        r.error(entry.key_pos, &path, label_message("limit", &entry.key));
    }
    let Some(fields) = scalar::map(r, &entry.value, &path) else {
        return spec;
    };
    for e in fields {
        let sub = child(&path, &e.key);
        let Some(&known) = limit_keys().iter().find(|k| **k == e.key) else {
            if let Some(meant) = suggest::closest(&e.key, limit_keys()) {
                // A misspelt required field is reported as such, not also as missing.
                spec.params.written.push(meant);
                if meant == "kind" {
                    spec.fields.push(At::new("kind", e.key_pos, &sub));
                }
            }
            r.error(
                e.key_pos,
                &sub,
                suggest::unknown("key", &e.key, limit_keys()),
            );
            continue;
        };
        spec.fields.push(At::new(known, e.key_pos, &sub));
        field(r, &mut spec, e, &sub);
    }
    spec
}

fn field(r: &mut Report, spec: &mut LimitSpec, e: &Entry, path: &str) {
    let v = &e.value;
    match e.key.as_str() {
        "kind" => {
            let kind = scalar::choice(r, v, path, "kind", Kind::names())
                .and_then(|i| Kind::names().get(i))
                .and_then(|name| name.parse::<Kind>().ok());
            spec.kind = kind.map(located(v.pos, path));
        }
        "key" => spec.key = key(r, v, path),
        "mode" => {
            let options = ["enforce", "shadow", "off"];
            spec.mode = scalar::choice(r, v, path, "mode", &options)
                .map(|i| match i {
                    0 => Setting::On(Mode::Enforce),
                    1 => Setting::On(Mode::Shadow),
                    _ => Setting::Off,
                })
                .map(located(v.pos, path));
        }
        "headers" => {
            let options = ["on_reject", "always"];
            spec.headers = scalar::choice(r, v, path, "`headers` value", &options)
                .map(|i| {
                    if i == 0 {
                        HeadersMode::OnReject
                    } else {
                        HeadersMode::Always
                    }
                })
                .map(located(v.pos, path));
        }
        "sketch" => (spec.hashes, spec.slots) = params::sketch(r, v, path),
        "max_keys" => {
            spec.max_keys = scalar::max_keys(r, v, path).map(located(v.pos, path));
        }
        "top_keys" => {
            spec.top_keys = scalar::int(r, v, path, 1, bounds::MAX_TOP_KEYS as u64)
                .and_then(|n| usize::try_from(n).ok())
                .map(located(v.pos, path));
        }
        "overrides" => spec.overrides = overrides::parse_list(r, v, path),
        "match" => spec.scope = Some(At::new(overrides::conditions(r, v, path), v.pos, path)),
        "groups" => spec.groups = groups(r, v, path).map(located(v.pos, path)),
        "store" => {
            spec.store = scalar::text(r, v, path).map(|t| At::new(t.to_string(), v.pos, path));
        }
        "lease" => spec.lease = lease::parse(r, v, path),
        other => {
            params::param(r, other, e.key_pos, v, path, false, &mut spec.params);
        }
    }
}

/// `key: [PART, ...]`: at least one part, each a valid [`KeyPart`].
fn key(r: &mut Report, node: &Node, path: &str) -> Option<At<Vec<At<KeyPart>>>> {
    let items = scalar::seq(r, node, path)?;
    if items.is_empty() {
        r.error(
            node.pos,
            path,
            "a key needs at least one part, e.g. `[client_ip]`",
        );
        return None;
    }
    if items.len() > bounds::MAX_KEY_PARTS {
        let message = bounds::too_many("key parts", items.len(), bounds::MAX_KEY_PARTS);
        r.error(node.pos, path, message);
        return None;
    }
    let mut parts = Vec::with_capacity(items.len());
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        if let Some(part) = scalar::text(r, n, &p).and_then(|t| key_part(r, t, n.pos, &p)) {
            parts.push(At::new(part, n.pos, &p));
        }
    }
    Some(At::new(parts, node.pos, path))
}

/// `groups: [{name, members, max}, ...]` of a concurrency limit: at most
/// [`MAX_GROUPS`](crate::limits::concurrency::MAX_GROUPS), names unique labels.
fn groups(r: &mut Report, node: &Node, path: &str) -> Option<Vec<GroupSpec>> {
    let items = scalar::seq(r, node, path)?;
    let most = crate::limits::concurrency::MAX_GROUPS;
    if items.len() > most {
        r.error(
            node.pos,
            path,
            bounds::too_many("groups", items.len(), most),
        );
        return None;
    }
    let mut out: Vec<GroupSpec> = Vec::with_capacity(items.len());
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        let Some(entries) = scalar::map(r, n, &p) else {
            continue;
        };
        let (mut name, mut max, mut members) = (None, None, None);
        for e in entries {
            let sub = child(&p, &e.key);
            match e.key.as_str() {
                "name" => {
                    if let Some(t) = scalar::text(r, &e.value, &sub) {
                        if !is_label(t) {
                            r.error(e.value.pos, &sub, label_message("group", t));
                        } else if out.iter().any(|g| g.name.v == t) {
                            r.error(e.value.pos, &sub, format!("group `{t}` is listed twice"));
                        } else {
                            name = Some(At::new(t.to_string(), e.value.pos, &sub));
                        }
                    }
                }
                "max" => {
                    max = scalar::int(r, &e.value, &sub, 0, u64::MAX)
                        .map(|m| At::new(m, e.value.pos, &sub));
                }
                "members" => members = group_members(r, &e.value, &sub),
                other => r.error(e.key_pos, &sub, suggest::unknown("key", other, &GROUP_KEYS)),
            }
        }
        for (field, present) in [
            ("name", name.is_some()),
            ("members", members.is_some()),
            ("max", max.is_some()),
        ] {
            if !present && entries.iter().all(|e| e.key != field) {
                r.error(n.pos, &p, format!("missing required field `{field}`"));
            }
        }
        if let (Some(name), Some(max), Some((values, segment))) = (name, max, members) {
            out.push(GroupSpec {
                name,
                values,
                segment,
                max,
            });
        }
    }
    Some(out)
}

/// `members: {PART: [VALUES...]}` or `members: {segment: NAME}`.
type Members = (Option<(KeyPart, Vec<Box<[u8]>>)>, Option<At<String>>);

fn group_members(r: &mut Report, node: &Node, path: &str) -> Option<Members> {
    let entries = scalar::map(r, node, path)?;
    let [e] = entries else {
        r.error(
            node.pos,
            path,
            "`members` needs exactly one of `{customer: [a, b]}` (any key part) or `{segment: NAME}`",
        );
        return None;
    };
    let sub = child(path, &e.key);
    if e.key == "segment" {
        let name = scalar::text(r, &e.value, &sub)?;
        return Some((None, Some(At::new(name.to_string(), e.value.pos, &sub))));
    }
    let part = key_part(r, &e.key, e.key_pos, &sub)?;
    let items = scalar::seq(r, &e.value, &sub)?;
    let mut values = Vec::with_capacity(items.len());
    for (i, n) in items.iter().enumerate() {
        if let Some(t) = scalar::text(r, n, &item(&sub, i)) {
            values.push(t.as_bytes().into());
        }
    }
    Some((Some((part, values)), None))
}
