//! The `stores:` section: where limit state lives. `local` (in the process) is the
//! default store and needs no entry; an entry named `local` sets its options (a snapshot
//! file). Any other entry is a Redis (or Valkey) store, standalone or Cluster, that limits
//! select with `store: NAME` to share their state across a fleet.
//!
//! Only the shape is checked here; the runtime connects (never failing on an unreachable
//! Redis: it starts failed open and recovers by itself).

use std::path::Path;
use std::time::Duration;

use crate::config::model::{Fallback, LocalStore, RedisEndpoint, RedisStoreSpec, StoreSpec};
use crate::config::names::{is_label, label_message};
use crate::config::report::{child, item, Report};
use crate::config::scalar;
use crate::config::secret;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys a Redis store takes.
pub(crate) const REDIS_KEYS: [&str; 12] = [
    "kind",
    "url",
    "urls",
    "cluster",
    "timeout",
    "breaker",
    "fallback",
    "instances",
    "prefix",
    "lease",
    "deny_cache",
    "password_file",
];

/// The keys the local store takes.
pub(crate) const LOCAL_KEYS: [&str; 3] = ["kind", "snapshot", "every"];

/// The keys a Redis store's `breaker:` takes.
pub(crate) const BREAKER_KEYS: [&str; 2] = ["failures", "probe_every"];

/// Stores a config may name.
pub(crate) const MAX_STORES: usize = 16;

/// Reads `stores:`; `file` is the config file, whose directory a relative `snapshot` path
/// starts in.
pub(crate) fn parse(
    r: &mut Report,
    node: Option<&Node>,
    file: &str,
) -> (Vec<StoreSpec>, LocalStore) {
    let mut local = LocalStore::default();
    let Some(entries) = node.and_then(|n| scalar::map(r, n, "stores")) else {
        return (Vec::new(), local);
    };
    if entries.len() > MAX_STORES {
        let pos = node.map(|n| n.pos).unwrap_or_default();
        let message = crate::config::bounds::too_many("stores", entries.len(), MAX_STORES);
        r.error(pos, "stores", message);
        return (Vec::new(), local);
    }
    let mut stores = Vec::new();
    for e in entries {
        let path = child("stores", &e.key);
        if !is_label(&e.key) {
            r.error(e.key_pos, &path, label_message("store", &e.key));
            continue;
        }
        let Some(fields) = scalar::map(r, &e.value, &path) else {
            continue;
        };
        let kind = fields.iter().find(|f| f.key == "kind").and_then(|f| {
            scalar::choice(
                r,
                &f.value,
                &child(&path, "kind"),
                "store kind",
                &["redis", "local"],
            )
        });
        let is_local = e.key == "local" || kind == Some(1);
        if e.key == "local" && kind == Some(0) {
            r.error(
                e.key_pos,
                &path,
                "the store named `local` is the in-process store; name a Redis store otherwise",
            );
            continue;
        }
        if is_local {
            if e.key != "local" {
                r.error(
                    e.key_pos,
                    &path,
                    "only the store named `local` can be of kind `local`",
                );
                continue;
            }
            local = local_store(r, fields, &path, file);
        } else if let Some(spec) = redis_store(r, &e.key, fields, (e.key_pos, &path), file) {
            stores.push(spec);
        }
    }
    (stores, local)
}

fn local_store(
    r: &mut Report,
    fields: &[crate::config::yaml::Entry],
    path: &str,
    file: &str,
) -> LocalStore {
    let mut local = LocalStore::default();
    let base = Path::new(file).parent().unwrap_or(Path::new(""));
    for f in fields {
        let sub = child(path, &f.key);
        match f.key.as_str() {
            "kind" => {}
            "snapshot" => {
                local.snapshot = scalar::text(r, &f.value, &sub).and_then(|t| {
                    if t.is_empty() || t.ends_with('/') || t.len() > 4096 || t.contains('\0') {
                        r.error(
                            f.value.pos,
                            &sub,
                            "`snapshot` must be a file path (not a directory), at most 4096 bytes",
                        );
                        return None;
                    }
                    Some(base.join(t))
                })
            }
            "every" => {
                let range = (Duration::from_millis(100), Duration::from_secs(86_400));
                if let Some(d) = scalar::duration(r, &f.value, &sub, range, ("100ms", "1d")) {
                    local.every = d;
                }
            }
            other => r.error(f.key_pos, &sub, suggest::unknown("key", other, &LOCAL_KEYS)),
        }
    }
    local
}

/// A Redis store named `name` at `(pos, path)`; `file` is the config file, whose directory
/// a relative `password_file` starts in.
fn redis_store(
    r: &mut Report,
    name: &str,
    fields: &[crate::config::yaml::Entry],
    (pos, path): (crate::config::report::Pos, &str),
    file: &str,
) -> Option<StoreSpec> {
    let mut spec = RedisStoreSpec::default();
    let (mut url, mut urls, mut cluster) = (None, None, false);
    let before = r.error_count();
    for f in fields {
        let sub = child(path, &f.key);
        let v = &f.value;
        match f.key.as_str() {
            "kind" => {}
            "url" => url = scalar::text(r, v, &sub).and_then(|u| redis_url(r, v, &sub, u)),
            "urls" => {
                if let Some(items) = scalar::seq(r, v, &sub) {
                    let list: Vec<String> = items
                        .iter()
                        .enumerate()
                        .filter_map(|(i, n)| {
                            let p = item(&sub, i);
                            scalar::text(r, n, &p).and_then(|u| redis_url(r, n, &p, u))
                        })
                        .collect();
                    if list.is_empty() {
                        r.error(v.pos, &sub, "`urls` needs at least one Redis URL");
                    }
                    urls = Some(list);
                }
            }
            "cluster" => cluster = scalar::boolean(r, v, &sub).unwrap_or(false),
            "timeout" => {
                let range = (Duration::from_micros(100), Duration::from_secs(1));
                if let Some(d) = scalar::duration(r, v, &sub, range, ("100us", "1s")) {
                    spec.tuning.timeout = d;
                }
            }
            "breaker" => breaker(r, v, &sub, &mut spec),
            "fallback" => {
                let options = ["local", "allow", "deny"];
                if let Some(i) = scalar::choice(r, v, &sub, "fallback", &options) {
                    spec.tuning.fallback = [Fallback::Local, Fallback::Allow, Fallback::Deny][i];
                }
            }
            "instances" => {
                if let Some(n) = scalar::int(r, v, &sub, 1, 10_000) {
                    spec.tuning.instances = u32::try_from(n).unwrap_or(1);
                }
            }
            "prefix" => {
                if let Some(p) = scalar::text(r, v, &sub) {
                    if p.len() > 64 || p.bytes().any(|b| !b.is_ascii_graphic()) {
                        r.error(
                            v.pos,
                            &sub,
                            "`prefix` must be at most 64 printable characters without spaces",
                        );
                    } else {
                        spec.tuning.prefix = p.to_string();
                    }
                }
            }
            "lease" => {
                let range = (Duration::from_millis(300), Duration::from_secs(3600));
                if let Some(d) = scalar::duration(r, v, &sub, range, ("300ms", "1h")) {
                    spec.tuning.lease = d;
                }
            }
            "deny_cache" => {
                if let Some(n) = scalar::int(r, v, &sub, 0, 1 << 20) {
                    spec.deny_cache = usize::try_from(n).unwrap_or(0);
                }
            }
            "password_file" => {
                if let Some(name) = scalar::text(r, v, &sub) {
                    let what = ("the Redis password", "Redis's `AUTH`");
                    spec.password = secret::read(r, v, &sub, file, name, what);
                }
            }
            other => r.error(f.key_pos, &sub, suggest::unknown("key", other, &REDIS_KEYS)),
        }
    }
    let written = match (&url, &urls) {
        (Some(u), _) => std::slice::from_ref(u),
        (None, Some(list)) => list.as_slice(),
        (None, None) => &[],
    };
    if spec.password.is_some() && written.iter().any(|u| secret::has_password(u)) {
        r.error(
            pos,
            path,
            "give the password in `password_file` or in the URL, not both",
        );
        return None;
    }
    spec.endpoint = match (url, urls, cluster) {
        (Some(u), None, false) => RedisEndpoint::Standalone(u),
        (None, Some(list), true) => RedisEndpoint::Cluster(list),
        (Some(u), None, true) => RedisEndpoint::Cluster(vec![u]),
        (None, Some(_), false) => {
            r.error(
                pos,
                path,
                "`urls` is for Redis Cluster: add `cluster: true`, or give one `url`",
            );
            return None;
        }
        (Some(_), Some(_), _) => {
            r.error(pos, path, "give `url` or `urls`, not both");
            return None;
        }
        (None, None, _) => {
            if r.error_count() == before {
                r.error(
                    pos,
                    path,
                    "missing required field `url` (or `urls` with `cluster: true`)",
                );
            }
            return None;
        }
    };
    (r.error_count() == before).then(|| StoreSpec {
        name: name.to_string(),
        redis: spec,
    })
}

/// A Redis URL: `redis://`, `rediss://` (TLS) or `unix://`, at most 1 KiB, that the
/// Redis client parses. A refused URL is quoted with its password redacted.
fn redis_url(r: &mut Report, node: &Node, path: &str, url: &str) -> Option<String> {
    let scheme_ok = ["redis://", "rediss://", "unix://", "redis+unix://"]
        .iter()
        .any(|s| url.starts_with(s));
    let shown = secret::redact_written(url);
    if !scheme_ok || url.len() > 1024 {
        r.error(
            node.pos,
            path,
            format!("`{shown}` is not a Redis URL; write e.g. `redis://127.0.0.1:6379/0`"),
        );
        return None;
    }
    // What the store will parse at start: a URL that passes the scheme check but not
    // this (a bad port, an unclosed `[`) is reported here, at its line, not at start.
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url) {
        r.error(
            node.pos,
            path,
            format!("`{shown}` is not a usable Redis URL: {e}"),
        );
        return None;
    }
    Some(url.to_string())
}

fn breaker(r: &mut Report, node: &Node, path: &str, spec: &mut RedisStoreSpec) {
    let Some(entries) = scalar::map(r, node, path) else {
        return;
    };
    for e in entries {
        let sub = child(path, &e.key);
        match e.key.as_str() {
            "failures" => {
                if let Some(n) = scalar::int(r, &e.value, &sub, 1, 1000) {
                    spec.tuning.failures = u32::try_from(n).unwrap_or(5);
                }
            }
            "probe_every" => {
                let range = (Duration::from_millis(10), Duration::from_secs(60));
                if let Some(d) = scalar::duration(r, &e.value, &sub, range, ("10ms", "60s")) {
                    spec.tuning.probe_every = d;
                }
            }
            other => r.error(
                e.key_pos,
                &sub,
                suggest::unknown("key", other, &BREAKER_KEYS),
            ),
        }
    }
}

/// A section's `store:` value: `None` for `local` (the in-process store), else the name of
/// a Redis store under `stores:`. An unknown name is reported and read as `local`.
pub(crate) fn store_ref(
    r: &mut Report,
    node: &Node,
    path: &str,
    stores: &[StoreSpec],
) -> Option<String> {
    let name = scalar::text(r, node, path)?;
    if name == "local" {
        return None;
    }
    if stores.iter().any(|s| s.name == name) {
        return Some(name.to_string());
    }
    r.error(node.pos, path, unknown_store(name, stores));
    None
}

/// The error for a `store:` naming none of `stores` (nor `local`): the close name, or that
/// no Redis store is configured at all.
pub(crate) fn unknown_store(name: &str, stores: &[StoreSpec]) -> String {
    if stores.is_empty() {
        return format!("unknown store `{name}`: no Redis store is configured under `stores:`");
    }
    let mut all: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
    all.push("local");
    suggest::unknown("store", name, &all)
}
