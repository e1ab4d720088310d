//! The `resources:` section: named limits that limiter API callers ask for by name
//! (Charon's `CH.REQUEST`, `CH.RESERVE` ...), read by the same reader as an origin's
//! `limits:` (positions, suggestions, bounds, kinds, stores, overrides, segments).
//!
//! **The domain is the customer.** A command names a resource and a *domain* (the caller's
//! tenant, user or queue). A resource sees that domain as the `customer` key part, and
//! nothing else of the caller: its `key` defaults to `[customer]` (one count per domain),
//! `const:TEXT` parts may be added (`key: ["const:all"]` makes one count shared by every
//! domain), overrides match the domain with `match: {customer: bigco}` or
//! `match: {segment: NAME}` for a segment `of: customer`, and concurrency groups take
//! members the same two ways. Any other key part (`client_ip`, `header:...`) has no value
//! for an API caller, so it is an error here rather than a limit that silently never
//! applies.
//!
//! Kinds: `token_bucket`, `rate`, `tiered` and `sliding_log` (asked with `CH.REQUEST`) and
//! `concurrency` (`CH.RESERVE`/`CH.RELEASE`); `inflight` is an estimate of requests in
//! flight through the proxy and has no meaning here. A command's cost is its `copies`, so
//! `cost` is not a field of a resource, nor is `headers` (replies carry the limits).
//! `mode: off` removes the resource: it is then unconfigured.

use crate::config::bounds;
use crate::config::limit::parse_limits;
use crate::config::model::{Kind, Limit};
use crate::config::report::{At, Report};
use crate::config::resolve::{resolve, Known, Resolved};
use crate::config::spec::LimitSpec;
use crate::config::yaml::Node;
use crate::limits::KeyPart;

/// The name the limiter API gives resources it does not know, when
/// `api.allow_unconfigured` grants them: a label value, so no resource may take it.
pub const UNCONFIGURED: &str = "_unconfigured";

/// The `origin` its resources have in metrics (`tollgate_limit_decisions_total`), in
/// their state's identity over reloads and in their Redis key names: no origin may take it.
pub const API_ORIGIN: &str = "_api";

/// Resources one config may name: each has its own state and metrics series.
pub(crate) const MAX_RESOURCES: usize = 1_000;

/// Limit fields a resource does not take (see [`check`]): a command's cost is its
/// `copies`, replies carry the limits, no admin `/top` list is kept for the API,
/// resources are not leased, and a command names its resource (no `match` picks requests).
pub(crate) const NOT_RESOURCE_FIELDS: [&str; 5] = ["cost", "headers", "top_keys", "lease", "match"];

/// Override fields a resource's override does not take: its `match` picks domains, and a
/// command's cost is its `copies`.
pub(crate) const NOT_RESOURCE_OVERRIDE_FIELDS: [&str; 1] = ["cost"];

/// What a resource says instead of a key part an API caller cannot have.
fn no_such_part(part: &KeyPart) -> String {
    format!(
        "a resource sees only the command's domain, as `customer` (and `const:` text); `{part}` has no value for limiter API callers"
    )
}

/// Reads `resources:`, each located where the size of its state is written (for the
/// memory budget).
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, known: &Known<'_>) -> Vec<At<Limit>> {
    let Some(node) = node else {
        return Vec::new();
    };
    let specs = parse_limits(r, node, "resources");
    if specs.len() > MAX_RESOURCES {
        let message = bounds::too_many("resources", specs.len(), MAX_RESOURCES);
        r.error(node.pos, "resources", message);
        return Vec::new();
    }
    let mut out = Vec::with_capacity(specs.len());
    for mut spec in specs {
        if !check(r, &mut spec, known) {
            continue;
        }
        if let Some(Resolved::On(limit)) = resolve(r, &spec, false, known) {
            let (pos, path) = crate::config::merge::size_anchor(&spec);
            out.push(At::new(limit, pos, path));
        }
    }
    out
}

/// The checks only resources have (module doc); fills in the default key. `false` when
/// something was wrong (reported).
fn check(r: &mut Report, spec: &mut LimitSpec, known: &Known<'_>) -> bool {
    let before = r.error_count();
    if spec.name == UNCONFIGURED {
        r.error(
            spec.pos,
            &spec.path,
            format!("`{UNCONFIGURED}` is the name unconfigured resources are counted under; pick another"),
        );
    }
    if let Some(kind) = spec.kind.as_ref().filter(|k| k.v == Kind::Inflight) {
        r.error(
            kind.pos,
            &kind.path,
            "kind `inflight` estimates requests in flight through the proxy; a resource counts copies exactly with `kind: concurrency` (CH.RESERVE and CH.RELEASE), or a rate with `token_bucket`, `rate`, `tiered` or `sliding_log` (CH.REQUEST)",
        );
    }
    for f in &spec.fields {
        let why = match f.v {
            "cost" => "a command's cost is its `copies`; `cost` is not a field of a resource",
            "headers" => "`headers` has no meaning for a resource: API replies carry the limits",
            "top_keys" => "`top_keys` keeps the heaviest keys of a proxy limit for the admin API; a resource keeps none",
            "lease" => "`lease` is for limits the proxy decides; a resource keeps one store call per command",
            "match" => "a command names the resource it asks: `match` picks proxy requests; use `overrides` to treat domains differently",
            _ => continue,
        };
        r.error(f.pos, &f.path, why);
    }
    for o in spec.overrides.iter().flat_map(|list| list.v.iter()) {
        for f in (o.fields.iter()).filter(|f| NOT_RESOURCE_OVERRIDE_FIELDS.contains(&f.v)) {
            let why = "a command's cost is its `copies`; `cost` is not a field of a resource";
            r.error(f.pos, &f.path, why);
        }
        for m in &o.conditions.matchers {
            if m.v.part != KeyPart::Customer {
                r.error(m.pos, &m.path, no_such_part(&m.v.part));
            }
        }
        for name in &o.conditions.segments {
            segment_of_customer(r, name, known);
        }
    }
    for g in spec.groups.iter().flat_map(|list| list.v.iter()) {
        if let Some((part, _)) = &g.values {
            if *part != KeyPart::Customer {
                r.error(g.name.pos, &g.name.path, no_such_part(part));
            }
        }
        if let Some(name) = &g.segment {
            segment_of_customer(r, name, known);
        }
    }
    match &spec.key {
        Some(parts) => {
            for p in &parts.v {
                if !matches!(p.v, KeyPart::Customer | KeyPart::Const(_)) {
                    r.error(p.pos, &p.path, no_such_part(&p.v));
                }
            }
        }
        None => {
            spec.key = Some(At::new(
                vec![At::new(KeyPart::Customer, spec.pos, &spec.path)],
                spec.pos,
                &spec.path,
            ));
        }
    }
    r.error_count() == before
}

/// A segment named by a resource's override or group must hold domains: `of: customer`.
/// An unknown name is reported by the resolution that follows.
fn segment_of_customer(r: &mut Report, name: &At<String>, known: &Known<'_>) {
    if let Some(seg) = known.segments.iter().find(|s| s.name == name.v) {
        if seg.of != KeyPart::Customer {
            r.error(
                name.pos,
                &name.path,
                format!(
                    "segment `{}` holds values of `{}`; a resource matches only the command's domain, so its segments need `of: customer`",
                    seg.name, seg.of
                ),
            );
        }
    }
}
