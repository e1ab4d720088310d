//! The JSON Schema (draft 2020-12) of the config file, for editors and other tools:
//! `tollgate schema` prints it and `conf/tollgate.schema.json` is a copy of its output.
//!
//! It is generated from the reader's own tables, so that it cannot drift from what the
//! reader accepts: every mapping's keys come from the key table its reader matches
//! against (`SERVER_KEYS`, `REDIS_KEYS`, [`own_fields`], ...), each kind's fields from
//! [`own_fields`] and [`COMMON`], the kinds and key parts from their strum enums, and the
//! sizes from [`super::bounds`] and the other bounds the reader checks. A key in a table
//! with no schema here is an error ([`SchemaError`]), so a field added to the reader fails
//! `tollgate schema` and the tests until it is described here.
//!
//! What a schema cannot say is left to `tollgate check`: cross-references (a limit's
//! `store`, a `segment:` name, an origin limit that takes its kind from a default of its
//! name), the range of a duration (given in its description), the memory budget, and
//! values that only parse (`10.0.0.0/8`, `redis://...`). Mappings may be null, as in the
//! reader (`server:` with every line commented out). Free-text fields accept numbers and
//! booleans as written (`customer: 123`), as the reader does.

use serde_json::{json, Map, Value};
use strum::IntoEnumIterator;

use crate::config::access_log::{
    ACCESS_LOG_KEYS, FORMATS, MAX_HEADERS, ONLY, QUERY, SECRET_HEADERS,
};
use crate::config::acme::{ACME_KEYS, CHALLENGES, MAX_ACME_HOSTS, RETRY_KEYS};
use crate::config::api::API_KEYS;
use crate::config::bounds;
use crate::config::lease::LEASE_KEYS;
use crate::config::limit::GROUP_KEYS;
use crate::config::model::{Kind, UpstreamProtocol};
use crate::config::origin::{ORIGIN_KEYS, UNMATCHED};
use crate::config::params::{MAX_WINDOWS, REFILL_KEYS, SKETCH_KEYS, TIER_KEYS, WINDOW_KEYS};
use crate::config::parse::{DEFAULTS_KEYS, TOP_KEYS};
use crate::config::resources::{
    API_ORIGIN, MAX_RESOURCES, NOT_RESOURCE_FIELDS, NOT_RESOURCE_OVERRIDE_FIELDS, UNCONFIGURED,
};
use crate::config::rls::{RLS_KEYS, RLS_ORIGIN, WINDOWS};
use crate::config::segments::{MAX_SEGMENTS, SEGMENT_KEYS};
use crate::config::server::{
    MAX_CONNECTIONS, MAX_H2_HEADER_LIST, MAX_H2_RESETS, MAX_H2_STREAMS, RLS_LISTENER_KEYS,
    SERVER_KEYS,
};
use crate::config::spec::{
    ignored_fields, limit_keys, own_fields, required_fields, COMMON, OVERRIDE_KEYS,
};
use crate::config::stores::{BREAKER_KEYS, LOCAL_KEYS, MAX_STORES, REDIS_KEYS};
use crate::config::tls::{CERT_KEYS, LISTENER_KEYS, MAX_CERTIFICATES, TLS_KEYS};
use crate::limits::concurrency::MAX_GROUPS;
use crate::limits::tiered::{MAX_GLOBAL_LIMIT, MAX_LIMIT};
use crate::limits::KeyPart;

/// The draft the schema follows.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Keys the reader accepts that the generator does not describe.
#[derive(Debug, thiserror::Error)]
#[error("the config schema does not describe {}: add them to src/config/schema.rs", .0.join(", "))]
pub struct SchemaError(pub Vec<String>);

/// Where a limit mapping is written: what it may hold differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// `defaults.limits`: `kind` and the kind's required fields must be there.
    Default,
    /// An origin's `limits`: may take its kind and fields from a default of its name.
    Origin,
    /// `resources`: as a default, without `inflight`, `cost` and `headers`, and keyed by
    /// the domain only.
    Resource,
}

/// Collects the schema of each key of a table, and the keys it has none for.
struct Keys<'a> {
    missing: &'a mut Vec<String>,
}

impl Keys<'_> {
    /// An object whose keys are exactly `table`, each described by `describe` (`None`:
    /// not described, recorded as `at.KEY`).
    fn object(
        &mut self,
        at: &str,
        table: &[&str],
        describe: impl Fn(&str) -> Option<Value>,
    ) -> Value {
        let mut props = Map::new();
        for &key in table {
            match describe(key) {
                Some(schema) => {
                    props.insert(key.to_string(), schema);
                }
                None => self.missing.push(format!("{at}.{key}")),
            }
        }
        json!({
            "type": ["object", "null"],
            "properties": props,
            "additionalProperties": false,
        })
    }
}

/// The schema as a JSON value; an error names the keys the reader takes that it lacks.
pub fn schema() -> Result<Value, SchemaError> {
    let mut missing = Vec::new();
    let mut keys = Keys {
        missing: &mut missing,
    };
    let mut defs = Map::new();
    for (name, place) in [
        ("default_limit", Place::Default),
        ("origin_limit", Place::Origin),
        ("resource", Place::Resource),
    ] {
        let at = match place {
            Place::Default => "defaults.limits.NAME",
            Place::Origin => "origins.NAME.limits.NAME",
            Place::Resource => "resources.NAME",
        };
        defs.insert(name.to_string(), limit(&mut keys, at, place));
    }
    defs.insert("origin".to_string(), origin(&mut keys, false));
    defs.insert("unmatched_origin".to_string(), origin(&mut keys, true));
    let sections = [
        ("server", server(&mut keys)),
        ("tls", tls(&mut keys)),
        ("api", api(&mut keys)),
        ("stores", stores(&mut keys)),
        ("segments", segments(&mut keys)),
        ("defaults", defaults(&mut keys)),
        ("origins", origins()),
        ("resources", resources()),
        ("rls", rls(&mut keys)),
    ];
    let root = keys.object("(root)", &TOP_KEYS, |key| {
        sections
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, schema)| schema.clone())
    });
    if !missing.is_empty() {
        return Err(SchemaError(missing));
    }
    let mut out = Map::new();
    out.insert("$schema".into(), json!(DIALECT));
    out.insert("$id".into(), json!("tollgate.schema.json"));
    out.insert("title".into(), json!("tollgate configuration"));
    out.insert(
        "description".into(),
        json!("Generated by `tollgate schema` from the config reader's own tables; `tollgate check` checks what a schema cannot (references, duration ranges, memory)."),
    );
    if let Value::Object(fields) = root {
        out.extend(fields);
    }
    out.insert("type".into(), json!("object"));
    out.insert("required".into(), json!(["origins"]));
    out.insert("$defs".into(), Value::Object(defs));
    Ok(Value::Object(out))
}

/// The schema as `tollgate schema` prints it: pretty JSON, keys sorted, one final newline.
pub fn schema_text() -> Result<String, SchemaError> {
    let value = schema()?;
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    Ok(text)
}

// ---- scalars ----------------------------------------------------------------------------

/// Plain or quoted text; plain numbers and booleans are read as written.
fn text() -> Value {
    json!({"type": ["string", "number", "boolean"]})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

/// An integer in `lo..=hi` (no upper bound when `hi` is `u64::MAX`).
fn int(lo: u64, hi: u64) -> Value {
    if hi == u64::MAX {
        json!({"type": "integer", "minimum": lo})
    } else {
        json!({"type": "integer", "minimum": lo, "maximum": hi})
    }
}

/// The unit names `humantime` (the reader's duration parser) accepts.
const DURATION_UNITS: &str = "nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y";

/// A humantime duration (`250ms`, `1h 30m`) between `lo` and `hi` as spelt by the reader.
fn duration((lo, hi): (&str, &str)) -> Value {
    json!({
        "type": "string",
        "pattern": format!("^\\s*(?:[0-9]+(?:\\.[0-9]+)?\\s*(?:{DURATION_UNITS})\\s*)+$"),
        "description": format!("A duration with a unit (`250ms`, `1s`, `5m`, `1h`, `1d`), between {lo} and {hi}."),
    })
}

/// `lease: auto | off | {hot_above, max_share, renew_every, idle}` (config::lease).
fn lease(keys: &mut Keys<'_>, at: &str) -> Value {
    let settings = keys.object(&format!("{at}.lease"), &LEASE_KEYS, |key| {
        Some(match key {
            "hot_above" => json!({
                "type": ["string", "integer"],
                "pattern": "^\\s*[0-9]+\\s*(?:/s)?\\s*$",
                "minimum": 1,
                "description": "Decisions per second on one instance above which a key is hot, e.g. `20/s`.",
            }),
            "max_share" => json!({
                "type": "string",
                "pattern": "^\\s*[0-9]+(?:\\.[0-9]+)?\\s*%\\s*$",
                "description": "The most of the limit one slice takes, above 0% and at most 100%, e.g. `1%`.",
            }),
            "renew_every" => duration(("1ms", "1m")),
            "idle" => duration(("10ms", "1h")),
            _ => return None,
        })
    });
    json!({"anyOf": [{"enum": ["auto", "off"]}, settings]})
}

/// `ip:port` (`[v6]:port`).
fn socket_addr() -> Value {
    json!({
        "type": "string",
        "pattern": "^(?:[0-9.]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}$",
        "description": "An address of the form ip:port, e.g. `127.0.0.1:8080` or `[::1]:8080`.",
    })
}

/// A name that is also a metrics label.
const LABEL: &str = "^[A-Za-z0-9_-]+$";

/// An RFC 9110 token, as `is_header_name` checks.
const HEADER_NAME: &str = "[A-Za-z0-9!#$%&'*+.^_`|~-]+";

/// A list of `items`, `lo..=hi` long.
fn list(items: Value, lo: usize, hi: Option<usize>) -> Value {
    let mut v = json!({"type": "array", "items": items, "minItems": lo});
    if let (Some(hi), Value::Object(m)) = (hi, &mut v) {
        m.insert("maxItems".into(), json!(hi));
    }
    v
}

/// A mapping from labels to `value`, at most `max` entries; `reserved` names refused.
fn named(value: Value, max: usize, reserved: &[&str]) -> Value {
    let mut names = json!({"pattern": LABEL});
    if !reserved.is_empty() {
        names["not"] = json!({"enum": reserved});
    }
    json!({
        "type": ["object", "null"],
        "maxProperties": max,
        "propertyNames": names,
        "additionalProperties": value,
    })
}

/// A key part (`client_ip`, `header:NAME`, `const:TEXT`); `plain` limits the names
/// written without an argument, `args` the `header:`/`const:` forms allowed.
fn key_part(plain: &[&str], args: &[&str]) -> Value {
    let mut any = vec![json!({"enum": plain})];
    if args.contains(&"header") {
        any.push(json!({"pattern": format!("^header:{HEADER_NAME}$")}));
    }
    if args.contains(&"const") {
        any.push(json!({"pattern": "^const:"}));
    }
    json!({
        "type": "string",
        "maxLength": bounds::MAX_KEY_PART_BYTES,
        "anyOf": any,
    })
}

// ---- sections ---------------------------------------------------------------------------

fn server(keys: &mut Keys<'_>) -> Value {
    let mut listener = keys.object("server.listen[]", &LISTENER_KEYS, |key| {
        Some(match key {
            "addr" => socket_addr(),
            "tls" | "h2c" | "proxy_protocol" => boolean(),
            _ => return None,
        })
    });
    listener["type"] = json!("object");
    listener["required"] = json!(["addr"]);
    listener["not"] = json!({
        "required": ["tls", "h2c"],
        "properties": {"tls": {"const": true}, "h2c": {"const": true}},
    });
    let listen_item = json!({"oneOf": [socket_addr(), listener]});
    let mut rls = keys.object("server.rls", &RLS_LISTENER_KEYS, |key| {
        Some(match key {
            "addr" => socket_addr(),
            "tls" => boolean(),
            _ => return None,
        })
    });
    rls["type"] = json!("object");
    rls["required"] = json!(["addr"]);
    let rls = json!({"oneOf": [socket_addr(), rls]});
    let mut access_log = keys.object("server.access_log", &ACCESS_LOG_KEYS, |key| {
        Some(match key {
            "path" => json!({"type": "string", "minLength": 1, "maxLength": 4096}),
            "format" => json!({"enum": FORMATS}),
            "only" => json!({"enum": ONLY}),
            "query" => json!({"enum": QUERY}),
            "headers" => list(
                json!({
                    "type": "string",
                    "pattern": format!("^{HEADER_NAME}$"),
                    "not": {"enum": SECRET_HEADERS},
                }),
                0,
                Some(MAX_HEADERS),
            ),
            _ => return None,
        })
    });
    access_log["type"] = json!("object");
    access_log["required"] = json!(["path"]);
    keys.object("server", &SERVER_KEYS, |key| {
        Some(match key {
            "access_log" => access_log.clone(),
            "listen" => list(listen_item.clone(), 1, None),
            "rls" => rls.clone(),
            "metrics" | "limiter_api" | "demo_upstream" | "admin" => socket_addr(),
            "admin_token_file" => json!({"type": "string", "minLength": 1}),
            "instance" => json!({
                "type": ["string", "number", "boolean"],
                "pattern": "^[!-~]{1,128}$",
            }),
            "kill_switch" => boolean(),
            "threads" => int(1, 1024),
            "grace_period" | "keepalive_timeout" => duration(("0s", "1h")),
            "header_timeout" => duration(("100ms", "1h")),
            "trusted_proxies" => list(json!({"type": "string"}), 0, None),
            "customer_header" => json!({"type": "string", "pattern": format!("^{HEADER_NAME}$")}),
            "max_connections" | "max_connections_per_ip" => int(1, MAX_CONNECTIONS),
            "h2_max_streams" => int(1, MAX_H2_STREAMS),
            "h2_max_header_list" => int(1024, MAX_H2_HEADER_LIST),
            "h2_max_resets" => int(1, MAX_H2_RESETS),
            _ => return None,
        })
    })
}

fn tls(keys: &mut Keys<'_>) -> Value {
    let file = json!({"type": "string", "minLength": 1, "maxLength": 4096});
    let mut cert = keys.object("tls.certificates[]", &CERT_KEYS, |key| {
        Some(match key {
            "cert" | "key" => file.clone(),
            _ => return None,
        })
    });
    cert["type"] = json!("object");
    cert["required"] = json!(["cert", "key"]);
    let retry = keys.object("tls.acme.retry", &RETRY_KEYS, |key| {
        Some(match key {
            "min" | "max" => duration(("100ms", "7d")),
            _ => return None,
        })
    });
    let mut acme = keys.object("tls.acme", &ACME_KEYS, |key| {
        Some(match key {
            "directory" => json!({"type": "string", "pattern": "^https://[!-~]+$", "maxLength": 2048}),
            "email" => json!({"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", "maxLength": 254}),
            "hosts" => list(json!({"type": "string", "minLength": 1, "maxLength": 253, "pattern": "^[^*]"}), 0, Some(MAX_ACME_HOSTS)),
            "from_origins" => boolean(),
            "storage" | "ca_roots" => file.clone(),
            "store" => text(),
            "challenge" => json!({"enum": CHALLENGES}),
            "retry" => retry.clone(),
            _ => return None,
        })
    });
    acme["type"] = json!("object");
    acme["required"] = json!(["directory"]);
    acme["oneOf"] = json!([{"required": ["storage"]}, {"required": ["store"]}]);
    keys.object("tls", &TLS_KEYS, |key| {
        Some(match key {
            "certificates" => list(cert.clone(), 0, Some(MAX_CERTIFICATES)),
            "default" => file.clone(),
            "min_version" => json!({"enum": ["1.2", "1.3", 1.2, 1.3]}),
            "ciphers" => json!({"type": "string", "minLength": 1, "maxLength": 4096}),
            "handshake_timeout" => duration(("100ms", "5m")),
            "acme" => acme.clone(),
            _ => return None,
        })
    })
}

fn api(keys: &mut Keys<'_>) -> Value {
    keys.object("api", &API_KEYS, |key| {
        Some(match key {
            "max_keys" => int(1, bounds::MAX_KEYS as u64),
            "allow_unconfigured" => boolean(),
            "store" => text(),
            "password_file" => json!({"type": "string", "minLength": 1}),
            _ => return None,
        })
    })
}

fn rls(keys: &mut Keys<'_>) -> Value {
    keys.object("rls", &RLS_KEYS, |key| {
        Some(match key {
            "config_dir" => json!({"type": "string", "minLength": 1}),
            "store" => text(),
            "max_keys" => int(1, bounds::MAX_KEYS as u64),
            "window" => json!({"enum": WINDOWS}),
            _ => return None,
        })
    })
}

fn stores(keys: &mut Keys<'_>) -> Value {
    let breaker = keys.object("stores.NAME.breaker", &BREAKER_KEYS, |key| {
        Some(match key {
            "failures" => int(1, 1000),
            "probe_every" => duration(("10ms", "60s")),
            _ => return None,
        })
    });
    let redis_url = json!({
        "type": "string",
        "maxLength": 1024,
        "pattern": "^(?:redis|rediss|unix|redis\\+unix)://",
    });
    let mut redis = keys.object("stores.NAME", &REDIS_KEYS, |key| {
        Some(match key {
            "kind" => json!({"const": "redis"}),
            "url" => redis_url.clone(),
            "urls" => list(redis_url.clone(), 1, None),
            "cluster" => boolean(),
            "timeout" => duration(("100us", "1s")),
            "breaker" => breaker.clone(),
            "fallback" => json!({"enum": ["local", "allow", "deny"]}),
            "instances" => int(1, 10_000),
            "prefix" => {
                json!({"type": ["string", "number", "boolean"], "pattern": "^[!-~]{0,64}$"})
            }
            "lease" => duration(("300ms", "1h")),
            "deny_cache" => int(0, 1 << 20),
            "password_file" => json!({"type": "string", "minLength": 1}),
            _ => return None,
        })
    });
    redis["type"] = json!("object");
    redis["allOf"] = json!([
        {"anyOf": [{"required": ["url"]}, {"required": ["urls"]}]},
        {"not": {"required": ["url", "urls"]}},
        {
            "if": {"required": ["urls"]},
            "then": {"required": ["cluster"], "properties": {"cluster": {"const": true}}},
        },
    ]);
    let local = keys.object("stores.local", &LOCAL_KEYS, |key| {
        Some(match key {
            "kind" => json!({"const": "local"}),
            "snapshot" => {
                json!({"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "[^/]$"})
            }
            "every" => duration(("100ms", "1d")),
            _ => return None,
        })
    });
    let mut out = named(redis, MAX_STORES, &[]);
    out["properties"] = json!({"local": local});
    out
}

fn segments(keys: &mut Keys<'_>) -> Value {
    let plain: Vec<&str> = KeyPart::plain_names()
        .iter()
        .copied()
        .filter(|p| p.parse::<KeyPart>().is_ok_and(|k| !k.needs_server()))
        .collect();
    let mut one = keys.object("segments.NAME", &SEGMENT_KEYS, |key| {
        Some(match key {
            "file" => json!({"type": "string", "minLength": 1}),
            "of" => key_part(&plain, &["header", "const"]),
            _ => return None,
        })
    });
    one["type"] = json!("object");
    one["required"] = json!(SEGMENT_KEYS);
    named(one, MAX_SEGMENTS, &[])
}

fn defaults(keys: &mut Keys<'_>) -> Value {
    keys.object("defaults", &DEFAULTS_KEYS, |key| {
        Some(match key {
            "limits" => limits("default_limit"),
            "unmatched" => json!({"$ref": "#/$defs/unmatched_origin"}),
            _ => return None,
        })
    })
}

/// A `limits:` mapping of `def` limits.
fn limits(def: &str) -> Value {
    named(
        json!({"$ref": format!("#/$defs/{def}")}),
        bounds::MAX_LIMITS,
        &[],
    )
}

fn origins() -> Value {
    let mut out = named(
        json!({"$ref": "#/$defs/origin"}),
        bounds::MAX_ORIGINS,
        &[API_ORIGIN, RLS_ORIGIN],
    );
    out["type"] = json!("object");
    out["minProperties"] = json!(1);
    out
}

fn resources() -> Value {
    named(
        json!({"$ref": "#/$defs/resource"}),
        MAX_RESOURCES,
        &[UNCONFIGURED],
    )
}

fn origin(keys: &mut Keys<'_>, unmatched: bool) -> Value {
    let at = if unmatched {
        "defaults.unmatched"
    } else {
        "origins.NAME"
    };
    let table: Vec<&str> = ORIGIN_KEYS
        .iter()
        .copied()
        .filter(|k| !(unmatched && *k == "hosts"))
        .collect();
    let mut out = keys.object(at, &table, |key| {
        Some(match key {
            "hosts" => list(
                json!({"type": "string", "minLength": 1}),
                1,
                Some(bounds::MAX_HOSTS),
            ),
            "upstreams" => list(
                json!({"type": "string", "pattern": ":[0-9]+$"}),
                1,
                Some(bounds::MAX_UPSTREAMS),
            ),
            "tls" | "tls_verify" => boolean(),
            "sni" | "customer" => text(),
            "connect_timeout" | "read_timeout" => duration(("1ms", "1h")),
            "upstream_protocol" => json!({"enum": UpstreamProtocol::NAMES}),
            "limits" => limits("origin_limit"),
            _ => return None,
        })
    });
    out["type"] = json!("object");
    out["required"] = if unmatched {
        json!(["upstreams"])
    } else {
        json!(["hosts", "upstreams"])
    };
    if unmatched {
        out["description"] = json!(format!(
            "The origin (`{UNMATCHED}` in metrics) for every host no origin names."
        ));
    }
    out
}

// ---- limits -----------------------------------------------------------------------------

/// The schema of a parameter field (a limit's or an override's); `least` is 0 in an
/// override (a deliberate block) and 1 in a limit.
fn param(key: &str, least: u64, keys: &mut Keys<'_>, at: &str) -> Option<Value> {
    Some(match key {
        // A limit's inflight `max` may be learned (`auto`); an override's is a number.
        "max" if least > 0 => {
            let bound = int(1, crate::limits::adaptive::MAX_LIMIT);
            let bounds = json!({
                "type": ["object", "null"],
                "properties": {"min": bound, "max": bound, "initial": bound},
                "additionalProperties": false,
            });
            json!({
                "anyOf": [
                    int(least, u64::MAX),
                    {"const": "auto"},
                    {
                        "type": "object",
                        "properties": {"auto": bounds},
                        "required": ["auto"],
                        "additionalProperties": false,
                    },
                ],
            })
        }
        "max" | "capacity" => int(least, u64::MAX),
        "share" => json!({"type": "string", "pattern": "^(100|[1-9][0-9]?)%$"}),
        "global" => int(1, u64::MAX),
        "per" => duration(("100ms", "1d")),
        "strict" => boolean(),
        "refill" => {
            let mut refill = keys.object(&format!("{at}.refill"), &REFILL_KEYS, |k| {
                Some(match k {
                    "amount" => int(1, u64::MAX),
                    "every" => duration(("1ms", "1d")),
                    _ => return None,
                })
            });
            refill["type"] = json!("object");
            refill
        }
        "cost" => json!({
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": format!("^header:{HEADER_NAME}$")},
            ],
        }),
        "windows" => {
            let mut window = keys.object(&format!("{at}.windows[]"), &WINDOW_KEYS, |k| {
                Some(match k {
                    "max" => int(least, u64::from(u32::MAX)),
                    "per" => duration(("1s", "366d")),
                    _ => return None,
                })
            });
            window["type"] = json!("object");
            window["required"] = json!(WINDOW_KEYS);
            list(window, 1, Some(MAX_WINDOWS))
        }
        "tiers" => {
            let mut tier = keys.object(&format!("{at}.tiers[]"), &TIER_KEYS, |k| {
                Some(match k {
                    "limit" => int(0, MAX_LIMIT),
                    "window" | "active" | "cooldown" => duration(("0s", "366d")),
                    "skippable" => boolean(),
                    _ => return None,
                })
            });
            tier["type"] = json!("object");
            tier["required"] = json!(["limit", "window", "active"]);
            list(tier, 1, Some(crate::limits::tiered::MAX_TIERS))
        }
        "hard_limit" => int(1, MAX_LIMIT),
        "global_limit" => int(1, MAX_GLOBAL_LIMIT),
        _ => return None,
    })
}

/// The key parts a limit at `place` may use, and the `header:`/`const:` forms.
fn parts_for(place: Place) -> (Vec<&'static str>, Vec<&'static str>) {
    if place == Place::Resource {
        (vec!["customer"], vec!["const"])
    } else {
        (KeyPart::plain_names().to_vec(), vec!["header", "const"])
    }
}

fn limit(keys: &mut Keys<'_>, at: &str, place: Place) -> Value {
    let (plain, args) = parts_for(place);
    let kinds: Vec<&str> = Kind::iter()
        .filter(|k| !(place == Place::Resource && *k == Kind::Inflight))
        .map(Kind::name)
        .collect();
    let table: Vec<&str> = limit_keys()
        .iter()
        .copied()
        .filter(|k| !(place == Place::Resource && NOT_RESOURCE_FIELDS.contains(k)))
        .collect();
    let over = override_item(keys, &format!("{at}.overrides[]"), place);
    let lease_schema = lease(keys, at);
    let params: Vec<(&str, Option<Value>)> =
        table.iter().map(|&k| (k, param(k, 1, keys, at))).collect();
    let mut out = keys.object(at, &table, |key| {
        Some(match key {
            "kind" => json!({"enum": kinds}),
            "key" => list(key_part(&plain, &args), 1, Some(bounds::MAX_KEY_PARTS)),
            "mode" => json!({"enum": ["enforce", "shadow", "off"]}),
            "headers" => json!({"enum": ["on_reject", "always"]}),
            "overrides" => list(over.clone(), 0, Some(bounds::MAX_OVERRIDES)),
            "match" => conditions(&plain, &args),
            "store" => text(),
            "max_keys" => int(1, bounds::MAX_KEYS as u64),
            "top_keys" => int(1, bounds::MAX_TOP_KEYS as u64),
            "lease" => lease_schema.clone(),
            "sketch" => {
                let mut sketch = json!({
                    "type": ["object", "null"],
                    "properties": {},
                    "additionalProperties": false,
                });
                for k in SKETCH_KEYS {
                    let schema = match k {
                        "hashes" => int(1, bounds::MAX_HASHES as u64),
                        "slots" => int(16, bounds::MAX_SLOTS as u64),
                        _ => return None,
                    };
                    sketch["properties"][k] = schema;
                }
                sketch
            }
            "groups" => {
                let members = json!({
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "propertyNames": {"anyOf": [{"const": "segment"}, key_part(&plain, &args)]},
                    "properties": {"segment": text()},
                    "additionalProperties": list(text(), 0, None),
                });
                let group: Vec<(&str, Value)> = GROUP_KEYS
                    .iter()
                    .map(|&k| {
                        let schema = match k {
                            "name" => json!({"type": "string", "pattern": LABEL}),
                            "members" => members.clone(),
                            "max" => int(0, u64::MAX),
                            _ => Value::Null,
                        };
                        (k, schema)
                    })
                    .collect();
                if group.iter().any(|(_, s)| s.is_null()) {
                    return None;
                }
                let props: Map<String, Value> =
                    group.into_iter().map(|(k, s)| (k.to_string(), s)).collect();
                list(
                    json!({
                        "type": "object",
                        "properties": props,
                        "required": GROUP_KEYS,
                        "additionalProperties": false,
                    }),
                    0,
                    Some(MAX_GROUPS),
                )
            }
            other => {
                return params
                    .iter()
                    .find(|(k, _)| *k == other)
                    .and_then(|(_, schema)| schema.clone())
            }
        })
    });
    out["type"] = json!("object");
    if place != Place::Origin {
        out["required"] = json!(["kind"]);
    }
    let mut per_kind = Vec::new();
    for kind in Kind::iter().filter(|k| kinds.contains(&k.name())) {
        let mut fields: Vec<&str> = COMMON.to_vec();
        fields.extend_from_slice(own_fields(kind));
        fields.extend_from_slice(ignored_fields(kind));
        fields.retain(|f| table.contains(f));
        let overridable: Vec<&str> = ["match", "mode"]
            .into_iter()
            .chain(
                own_fields(kind)
                    .iter()
                    .copied()
                    .filter(|f| OVERRIDE_KEYS.contains(f)),
            )
            .collect();
        let mut then = json!({
            "propertyNames": {"enum": fields},
            "properties": {"overrides": {"items": {"propertyNames": {"enum": overridable}}}},
        });
        if place != Place::Origin {
            then["required"] = json!(required_fields(kind));
            if required_fields(kind).contains(&"refill") {
                // Complete where it is written; an origin or override may set one half.
                then["properties"]["refill"] = json!({"required": REFILL_KEYS});
            }
        }
        per_kind.push(json!({
            "if": {"required": ["kind"], "properties": {"kind": {"const": kind.name()}}},
            "then": then,
        }));
    }
    out["allOf"] = Value::Array(per_kind);
    out
}

/// A `match:` (an override's or a limit's own): `PART: VALUE` or `segment: NAME`.
fn conditions(plain: &[&str], args: &[&str]) -> Value {
    json!({
        "type": "object",
        "minProperties": 1,
        "maxProperties": bounds::MAX_MATCH,
        "propertyNames": {"anyOf": [{"const": "segment"}, key_part(plain, args)]},
        "additionalProperties": text(),
    })
}

/// One `overrides:` item.
fn override_item(keys: &mut Keys<'_>, at: &str, place: Place) -> Value {
    let (plain, args) = parts_for(place);
    let table: Vec<&str> = OVERRIDE_KEYS
        .iter()
        .copied()
        .filter(|k| !(place == Place::Resource && NOT_RESOURCE_OVERRIDE_FIELDS.contains(k)))
        .collect();
    let mut params = Map::new();
    for &key in &table {
        let schema = match key {
            "match" => conditions(&plain, &args),
            "mode" => json!({"enum": ["enforce", "shadow"]}),
            other => match param(other, 0, keys, at) {
                Some(s) => s,
                None => {
                    keys.missing.push(format!("{at}.{other}"));
                    continue;
                }
            },
        };
        params.insert(key.to_string(), schema);
    }
    json!({
        "type": "object",
        "properties": params,
        "required": ["match"],
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key every reader table takes appears where the schema describes that mapping:
    /// a key added to a table without a schema fails here (and `schema()` fails).
    #[test]
    fn every_key_the_reader_takes_is_in_the_schema() {
        let s = schema().unwrap();
        let has = |pointer: &str, keys: &[&str]| {
            let props = s
                .pointer(pointer)
                .and_then(Value::as_object)
                .unwrap_or_else(|| panic!("no {pointer}"));
            for k in keys {
                assert!(props.contains_key(*k), "{pointer} lacks `{k}`");
            }
            assert_eq!(props.len(), keys.len(), "{pointer}: {:?}", props.keys());
        };
        has("/properties", &TOP_KEYS);
        has("/properties/server/properties", &SERVER_KEYS);
        has("/properties/api/properties", &API_KEYS);
        has("/properties/defaults/properties", &DEFAULTS_KEYS);
        has(
            "/properties/stores/additionalProperties/properties",
            &REDIS_KEYS,
        );
        has(
            "/properties/stores/additionalProperties/properties/breaker/properties",
            &BREAKER_KEYS,
        );
        has(
            "/properties/stores/properties/local/properties",
            &LOCAL_KEYS,
        );
        has(
            "/properties/segments/additionalProperties/properties",
            &SEGMENT_KEYS,
        );
        has("/$defs/origin/properties", &ORIGIN_KEYS);
        for def in ["default_limit", "origin_limit"] {
            let base = format!("/$defs/{def}/properties");
            has(&base, limit_keys());
            has(
                &format!("{base}/overrides/items/properties"),
                &OVERRIDE_KEYS,
            );
            has(&format!("{base}/refill/properties"), &REFILL_KEYS);
            has(&format!("{base}/windows/items/properties"), &WINDOW_KEYS);
            has(&format!("{base}/tiers/items/properties"), &TIER_KEYS);
            has(&format!("{base}/sketch/properties"), &SKETCH_KEYS);
            has(&format!("{base}/groups/items/properties"), &GROUP_KEYS);
        }
        let resource = s.pointer("/$defs/resource/properties").unwrap();
        for k in limit_keys() {
            let excluded = NOT_RESOURCE_FIELDS.contains(k);
            assert_eq!(resource.get(*k).is_none(), excluded, "resources.NAME.{k}");
        }
    }

    /// Each kind's `then` lists exactly the fields the reader's `takes` allows.
    #[test]
    fn each_kind_is_checked_with_its_own_fields() {
        let s = schema().unwrap();
        let all = s.pointer("/$defs/default_limit/allOf").unwrap();
        assert_eq!(all.as_array().unwrap().len(), Kind::iter().count());
        for (kind, rule) in Kind::iter().zip(all.as_array().unwrap()) {
            assert_eq!(rule["if"]["properties"]["kind"]["const"], kind.name());
            let fields: Vec<&str> = rule["then"]["propertyNames"]["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            for k in limit_keys() {
                assert_eq!(
                    fields.contains(k),
                    crate::config::spec::takes(kind, k),
                    "{kind:?} {k}"
                );
            }
        }
    }

    #[test]
    fn output_is_stable_json_with_a_final_newline() {
        let a = schema_text().unwrap();
        assert_eq!(a, schema_text().unwrap());
        assert!(a.ends_with("}\n"));
        let v: Value = serde_json::from_str(&a).unwrap();
        assert_eq!(v["$schema"], DIALECT);
    }
}
