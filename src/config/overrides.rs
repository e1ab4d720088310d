//! A limit's `overrides:` list: per-match special cases, read into [`OverrideSpec`]s.
//!
//! Each item is `{match: {PART: VALUE, ...}, FIELD: VALUE, ...}`. Match values are typed by
//! their part here (`client_ip`/`server_ip` take networks, `server_addr` an address, the
//! rest exact text); whether a field or part suits the limit's kind is checked in
//! [`super::resolve`].

use std::net::SocketAddr;

use crate::config::bounds;
use crate::config::model::Mode;
use crate::config::names::key_part;
use crate::config::params;
use crate::config::report::{child, item, At, Report};
use crate::config::scalar;
use crate::config::spec::{Conditions, OverrideSpec, ParamSpec, NOT_OVERRIDABLE, OVERRIDE_KEYS};
use crate::config::suggest;
use crate::config::yaml::{Entry, Node};
use crate::limits::path::normalize as normal_path;
use crate::limits::{KeyPart, MatchValue, Matcher};

/// Reads the `overrides:` list at `path`.
pub(crate) fn parse_list(r: &mut Report, node: &Node, path: &str) -> Option<At<Vec<OverrideSpec>>> {
    let items = scalar::seq(r, node, path)?;
    if items.len() > bounds::MAX_OVERRIDES {
        let message = bounds::too_many("overrides", items.len(), bounds::MAX_OVERRIDES);
        r.error(node.pos, path, message);
        return None;
    }
    let list = items
        .iter()
        .enumerate()
        .filter_map(|(i, n)| parse_one(r, n, &item(path, i)))
        .collect();
    Some(At::new(list, node.pos, path))
}

fn parse_one(r: &mut Report, node: &Node, path: &str) -> Option<OverrideSpec> {
    let entries = scalar::map(r, node, path)?;
    let mut spec = OverrideSpec {
        pos: node.pos,
        path: path.to_string(),
        conditions: Conditions::default(),
        mode: None,
        params: ParamSpec::default(),
        fields: Vec::new(),
    };
    let mut has_match = false;
    for e in entries {
        let sub = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "match" => {
                has_match = true;
                spec.conditions = conditions(r, v, &sub);
            }
            "mode" => {
                if scalar::text(r, v, &sub) == Some("off") {
                    r.error(
                        v.pos,
                        &sub,
                        "mode `off` cannot be used in an override; use `enforce` or `shadow`",
                    );
                } else if let Some(i) = scalar::choice(r, v, &sub, "mode", &["enforce", "shadow"]) {
                    let mode = if i == 0 { Mode::Enforce } else { Mode::Shadow };
                    spec.mode = Some(At::new(mode, v.pos, &sub));
                }
            }
            key => {
                if let Some(name) =
                    params::param(r, key, e.key_pos, v, &sub, true, &mut spec.params)
                {
                    spec.fields.push(At::new(name, e.key_pos, &sub));
                } else if NOT_OVERRIDABLE.contains(&key) {
                    r.error(
                        e.key_pos,
                        &sub,
                        format!("`{key}` cannot be overridden per match"),
                    );
                } else {
                    r.error(
                        e.key_pos,
                        &sub,
                        suggest::unknown("key", key, &OVERRIDE_KEYS),
                    );
                }
            }
        }
    }
    if !has_match {
        r.error(node.pos, path, "missing required field `match`");
    }
    Some(spec)
}

/// `match: {PART: VALUE, ...}` (an override's, or a limit's own): at least one condition;
/// `segment: NAME` conditions are kept apart, to be resolved against `segments:`.
pub(crate) fn conditions(r: &mut Report, node: &Node, path: &str) -> Conditions {
    let Some(entries) = scalar::map(r, node, path) else {
        return Conditions::default();
    };
    if entries.is_empty() {
        r.error(
            node.pos,
            path,
            "`match` needs at least one condition, e.g. `{customer: bigco}`",
        );
    }
    if entries.len() > bounds::MAX_MATCH {
        let message = bounds::too_many("conditions", entries.len(), bounds::MAX_MATCH);
        r.error(node.pos, path, message);
        return Conditions::default();
    }
    let (segments, parts): (Vec<&Entry>, Vec<&Entry>) =
        entries.iter().partition(|e| e.key == "segment");
    let segments = segments
        .into_iter()
        .filter_map(|e| {
            let sub = child(path, &e.key);
            let name = scalar::text(r, &e.value, &sub)?;
            Some(At::new(name.to_string(), e.value.pos, &sub))
        })
        .collect();
    let matchers = parts
        .into_iter()
        .filter_map(|e| matcher(r, e, path))
        .collect();
    Conditions { matchers, segments }
}

fn matcher(r: &mut Report, e: &Entry, parent: &str) -> Option<At<Matcher>> {
    let path = child(parent, &e.key);
    let part = key_part(r, &e.key, e.key_pos, &path);
    let text = scalar::text(r, &e.value, &path)?;
    let part = part?;
    let pos = e.value.pos;
    let value = match part {
        KeyPart::ClientIp | KeyPart::ServerIp => MatchValue::Net(scalar::net(r, &e.value, &path)?),
        KeyPart::ServerAddr => match text.parse::<SocketAddr>() {
            Ok(addr) => MatchValue::Addr(addr),
            Err(_) => {
                r.error(
                    pos,
                    &path,
                    format!("`{text}` is not an address of the form ip:port, e.g. `10.0.0.5:80`"),
                );
                return None;
            }
        },
        KeyPart::Host => MatchValue::Exact(text.to_ascii_lowercase().into_bytes().into()),
        // Requests' paths are compared in their normal form (`crate::limits::path`): the
        // condition's too, so `/a//b` names the path `/a/b` requests are read as.
        // A trailing `*`: the path and everything below it (`/api/*`).
        KeyPart::Path if text.starts_with('/') => match text.strip_suffix('*') {
            Some(prefix) => MatchValue::Prefix(normal_path(prefix.as_bytes()).into()),
            None => MatchValue::Exact(normal_path(text.as_bytes()).into()),
        },
        KeyPart::Path => {
            let message = format!("`{text}` is not a path: a path starts with `/`, e.g. `/login`");
            r.error(pos, &path, message);
            return None;
        }
        _ => MatchValue::Exact(text.as_bytes().into()),
    };
    Some(At::new(Matcher { part, value }, e.key_pos, &path))
}
