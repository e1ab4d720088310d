//! From a (merged) [`LimitSpec`] to a model [`Limit`]: kind checks, required fields,
//! per-kind defaults, override resolution, and the warnings about suspicious values.
//!
//! Every error points at the line that wrote the offending value; when a default's
//! value is at fault, the same error comes up for each origin using it and
//! [`super::report::Report::finish`] shows it once.

use std::time::Duration;

use crate::config::bounds;
use crate::config::lease::LeaseSetting;
use crate::config::model::{
    AutoMax, Connections, Cost, Group, Kind, LeaseParams, Limit, LimitParams, Members, Mode,
    Override, SegmentSpec, StoreSpec,
};
use crate::config::report::{At, Pos, Report};
use crate::config::spec::{
    field_list, required_fields, takes, Conditions, LimitSpec, OverrideSpec, ParamSpec, Setting,
};
use crate::config::stores::unknown_store;
use crate::config::suggest;
use crate::limits::tiered::{self, TieredParams};
use crate::limits::{
    KeyPart, KeySpec, MatchValue, Matcher, RateParams, SketchSize, TokenBucketParams,
};

/// `max_keys` when not given, for rate and token-bucket tables alike.
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// The most requests one process can have in flight, which an inflight limit's sketch is
/// checked against: its connection cap, since a client connection carries one request at a
/// time (downstream is HTTP/1.1). That is `server.max_connections` when set, else the
/// ceiling of the cap derived from the open-file limit,
/// [`Connections::DEFAULT_MAX_CONNECTIONS`] (4096; about what a 2-core tollgate holds:
/// 20 000 requests a second, `docs/performance.md`, times a 200 ms upstream).
fn max_in_flight(connections: &Connections) -> u64 {
    u64::from(
        connections
            .max_connections
            .unwrap_or(Connections::DEFAULT_MAX_CONNECTIONS),
    )
}

/// The share of new keys an inflight sketch may wrongly reject with the most requests in
/// flight ([`max_in_flight`]), at worst, before `check` warns.
const SATURATION_ODDS: f64 = 0.01;

const DAY_NANOS: u128 = 86_400 * 1_000_000_000;

/// What limits may refer to by name (the segments and the shared stores), and the
/// connection bounds their warnings are checked against.
pub(crate) struct Known<'a> {
    /// `segments:`.
    pub segments: &'a [SegmentSpec],
    /// `stores:` (Redis stores; `local` is always known).
    pub stores: &'a [StoreSpec],
    /// `server.max_connections` and the other connection bounds.
    pub connections: &'a Connections,
}

/// The shared store `spec` names (`None` for the in-process store), checked against
/// `stores:`. Every kind can keep its state there, with its in-process semantics.
fn store_of(r: &mut Report, spec: &LimitSpec, known: &Known<'_>) -> Option<String> {
    let name = spec.store.as_ref()?;
    if name.v == "local" {
        return None;
    }
    if !known.stores.iter().any(|s| s.name == name.v) {
        r.error(name.pos, &name.path, unknown_store(&name.v, known.stores));
        return None;
    }
    Some(name.v.clone())
}

/// A resolved limit, or `mode: off` (the origin does not get it).
#[derive(Debug, Clone, PartialEq)]
// Built once per limit while a config loads, and unpacked at once: its size is no cost.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Resolved {
    /// The limit runs.
    On(Limit),
    /// `mode: off`.
    Off,
}

/// Resolves `spec`. `inherited` is set for an origin's limit laid over a default: then a
/// missing kind was already reported at the default. `None` when anything was wrong.
pub(crate) fn resolve(
    r: &mut Report,
    spec: &LimitSpec,
    inherited: bool,
    known: &Known<'_>,
) -> Option<Resolved> {
    let before = r.error_count();
    let Some(kind) = spec.kind.as_ref().map(|k| k.v) else {
        let written = spec.fields.iter().any(|f| f.v == "kind");
        if !inherited && !written {
            let message = format!(
                "missing required field `kind` (one of {})",
                Kind::names().join(", ")
            );
            r.error(spec.pos, &spec.path, message);
        }
        return None;
    };
    for f in &spec.fields {
        if f.v == "lease" && !takes(kind, f.v) {
            r.error(f.pos, &f.path, exact_kind(kind));
        } else if !takes(kind, f.v) {
            r.error(f.pos, &f.path, wrong_kind(f.v, kind));
        }
    }
    let key = match &spec.key {
        Some(parts) => {
            for p in &parts.v {
                check_part(r, kind, &p.v, p.pos, &p.path);
            }
            parts.v.iter().map(|p| p.v.clone()).collect()
        }
        None => kind.default_key(),
    };
    let params = base_params(r, kind, spec, inherited, known);
    let store = store_of(r, spec, known);
    if let (Some(auto), Some(_)) = (&spec.params.auto, &store) {
        let message = "`max: auto` is learned in each instance from its own upstream \
             latencies and keeps its counts in process: remove `store:` (or set a number)";
        r.error(auto.pos, &auto.path, message);
        return None;
    }
    let lease = lease_of(r, kind, spec, store.is_some());
    let mode = match spec.mode.as_ref().map(|m| m.v) {
        Some(Setting::On(mode)) => mode,
        Some(Setting::Off) | None => Mode::Enforce,
    };
    let scope = match &spec.scope {
        Some(c) => matchers_of(r, kind, &c.v, known).unwrap_or_default(),
        None => Vec::new(),
    };
    let mut overrides = Vec::new();
    for o in spec.overrides.iter().flat_map(|list| list.v.iter()) {
        if let Some(o) = resolve_override(r, kind, spec, o, mode, known) {
            overrides.push(o);
        }
    }
    if let Some(LimitParams::Inflight { sketch, .. }) = &params {
        sketch_fits(r, spec, *sketch);
    }
    match &params {
        Some(LimitParams::TokenBucket { bucket, .. }) => {
            let (pos, path) = fill_anchor(spec);
            fill_warning(r, bucket, pos, path);
        }
        Some(LimitParams::Inflight { max, sketch, .. }) => {
            saturation_warning(r, spec, *max, *sketch, known.connections);
        }
        // A resource's copies are held by limiter API connections, not proxy requests.
        Some(LimitParams::Concurrency { max_keys, .. }) if !spec.path.starts_with("resources") => {
            untracked_warning(r, spec, *max_keys, known.connections);
        }
        _ => {}
    }
    if kind == Kind::Rate {
        ignored_sketch(r, spec);
    }
    if let Some(params) = &params {
        let p = &spec.params;
        let own = |path: &str| path.starts_with(&spec.path);
        let cost = p.cost.as_ref().map(|c| (c.pos, &c.path));
        let capacity = p.capacity.as_ref().map(|c| (c.pos, &c.path));
        let anchor = [cost, capacity]
            .into_iter()
            .flatten()
            .find(|(_, path)| own(path))
            .or(cost);
        cost_fits(r, params, anchor);
    }
    if r.error_count() > before {
        return None;
    }
    if spec.mode.as_ref().map(|m| m.v) == Some(Setting::Off) {
        return Some(Resolved::Off);
    }
    Some(Resolved::On(Limit {
        name: spec.name.clone(),
        key: KeySpec::new(key),
        mode,
        headers: spec.headers.as_ref().map(|h| h.v).unwrap_or_default(),
        params: params?,
        store,
        lease,
        overrides,
        scope,
        top_keys: spec.top_keys.as_ref().map(|t| t.v),
    }))
}

/// The lease settings of a limit of `kind`, `shared` or not: `auto` unless written, on a
/// Redis store, for the kinds that lease; `None` for the others and for `lease: off`. A
/// `lease` on a local limit is refused (the kinds that stay exact are refused in
/// [`resolve`], with [`exact_kind`]).
fn lease_of(r: &mut Report, kind: Kind, spec: &LimitSpec, shared: bool) -> Option<LeaseParams> {
    // A resource's copies are held by limiter API connections (`lease` is not one of its
    // fields): they keep one call per command.
    let leases = matches!(
        kind,
        Kind::TokenBucket | Kind::Rate | Kind::Concurrency | Kind::Inflight
    ) && !spec.path.starts_with("resources");
    match &spec.lease {
        Some(l) if !shared && leases => {
            let message = "`lease` needs a Redis store (`store: NAME`): a local limit decides in process, with no call to save";
            r.error(l.pos, &l.path, message);
            None
        }
        Some(
            l @ At {
                v: LeaseSetting::On(_),
                ..
            },
        ) if leases && kind == Kind::Concurrency && spans_counters(spec) => {
            let message = "`lease` needs a concurrency limit without `global` or `groups`: a block of slots spans one counter (write `lease: off`, or leave it out: such a limit decides every reserve in the store)";
            r.error(l.pos, &l.path, message);
            None
        }
        Some(At {
            v: LeaseSetting::On(p),
            ..
        }) if leases => Some(*p),
        Some(_) => None,
        // A concurrency limit with global or group counters decides every reserve in the
        // store: `lease` shows as off for it.
        None => (shared && leases && !(kind == Kind::Concurrency && spans_counters(spec)))
            .then(LeaseParams::default),
    }
}

/// Whether a concurrency limit counts copies beyond its key's (`global`, `groups`).
fn spans_counters(spec: &LimitSpec) -> bool {
    spec.params.global.is_some() || spec.groups.as_ref().is_some_and(|g| !g.v.is_empty())
}

/// Why `lease` is refused on a sliding log or tiered limit.
fn exact_kind(kind: Kind) -> String {
    format!(
        "`lease` is not a field of kind `{}`: sliding logs and tiers stay exact (per-user caps and burst rules, whose keys are rarely hot); leases apply to token_bucket, rate, concurrency and inflight",
        kind.name()
    )
}

fn wrong_kind(field: &str, kind: Kind) -> String {
    format!(
        "`{field}` is not a field of kind `{}`; fields of `{}` are: {}",
        kind.name(),
        kind.name(),
        field_list(kind)
    )
}

fn check_part(r: &mut Report, kind: Kind, part: &KeyPart, pos: Pos, path: &str) {
    if part.needs_server() && !kind.holds_upstream() {
        r.error(
            pos,
            path,
            format!(
                "`{part}` is only known to inflight limits (it is chosen after request-time limits run)"
            ),
        );
    }
}

/// The limit's own parameters, reporting the required fields it lacks. A limit laid over
/// a default lacks one only when the default does, which is reported there.
fn base_params(
    r: &mut Report,
    kind: Kind,
    spec: &LimitSpec,
    inherited: bool,
    known: &Known<'_>,
) -> Option<LimitParams> {
    let p = &spec.params;
    let missing = |name: &str, present: bool| !inherited && !present && !p.wrote(name);
    let present = |name: &str| match name {
        "max" => p.max.is_some() || p.auto.is_some(),
        "per" => p.per.is_some(),
        "capacity" => p.capacity.is_some(),
        "refill" => p.refill.is_some(),
        "tiers" => p.tiers.is_some(),
        "windows" => p.windows.is_some(),
        _ => false,
    };
    for &name in required_fields(kind) {
        if missing(name, present(name)) {
            let message = format!("missing required field `{name}` for kind `{}`", kind.name());
            r.error(spec.pos, &spec.path, message);
        }
    }
    if let (Kind::TokenBucket, Some(refill)) = (kind, &p.refill) {
        for (name, present) in [("amount", p.amount.is_some()), ("every", p.every.is_some())] {
            if missing(&format!("refill.{name}"), present) {
                let message = format!("missing required field `{name}`");
                r.error(refill.pos, &refill.path, message);
            }
        }
    }
    params_of(r, kind, spec, p, known)
}

/// Builds a kind's parameters from `p`, or `None` when a required one is absent or a value
/// is unusable (reported here: tiers the limiter refuses, unknown segments). The paper's
/// normalization of tiers is applied, with its warnings.
fn params_of(
    r: &mut Report,
    kind: Kind,
    spec: &LimitSpec,
    p: &ParamSpec,
    known: &Known<'_>,
) -> Option<LimitParams> {
    let sketch = SketchSize {
        hashes: spec
            .hashes
            .as_ref()
            .map_or(SketchSize::DEFAULT.hashes, |h| h.v),
        slots: spec
            .slots
            .as_ref()
            .map_or(SketchSize::DEFAULT.slots, |s| s.v),
    };
    let strict = p.strict.as_ref().is_some_and(|s| s.v);
    let max_keys = spec.max_keys.as_ref().map_or(DEFAULT_MAX_KEYS, |m| m.v);
    if let (Some(auto), false) = (&p.auto, kind == Kind::Inflight) {
        let message = format!(
            "`max: auto` is learned only by inflight limits, not kind `{}`",
            kind.name()
        );
        r.error(auto.pos, &auto.path, message);
        return None;
    }
    if let (Some(share), None) = (&p.share, &p.auto) {
        let message = "`share` divides a learned max: it needs `max: auto`";
        r.error(share.pos, &share.path, message);
        return None;
    }
    Some(match kind {
        Kind::Inflight => match &p.auto {
            Some(auto) => LimitParams::Inflight {
                max: auto.v.initial,
                sketch,
                auto: Some(AutoMax {
                    bounds: auto.v,
                    share: p.share.as_ref().map_or(100, |s| s.v),
                }),
            },
            None => LimitParams::Inflight {
                max: p.max.as_ref()?.v,
                sketch,
                auto: None,
            },
        },
        Kind::Rate => LimitParams::Rate {
            rate: RateParams {
                max: p.max.as_ref()?.v,
                per: p.per.as_ref()?.v,
                strict,
                window: crate::limits::RateWindow::Sliding,
            },
            max_keys,
        },
        Kind::TokenBucket => LimitParams::TokenBucket {
            bucket: TokenBucketParams {
                capacity: p.capacity.as_ref()?.v,
                amount: p.amount.as_ref()?.v,
                every: p.every.as_ref()?.v,
                strict,
            },
            cost: p.cost.as_ref().map_or(Cost::Fixed(1), |c| c.v.clone()),
            max_keys,
        },
        Kind::Tiered => {
            let tiers = p.tiers.as_ref()?;
            let written = TieredParams {
                tiers: tiers.v.clone(),
                hard_limit: p.hard_limit.as_ref().map(|h| h.v),
                global_limit: p.global_limit.as_ref().map(|g| g.v),
            };
            match tiered::normalize(&written) {
                Ok(normalized) => {
                    for change in normalized.changes.iter().filter(|c| c.is_warning()) {
                        r.warn(tiers.pos, &tiers.path, change.to_string());
                    }
                    LimitParams::Tiered {
                        tiered: normalized.params,
                        max_keys,
                    }
                }
                Err(e) => {
                    r.error(tiers.pos, &tiers.path, e.to_string());
                    return None;
                }
            }
        }
        Kind::Concurrency => {
            let global = p.global.as_ref().map(|g| g.v);
            let max = p.max.as_ref()?;
            LimitParams::Concurrency {
                max: lowered(r, global, max, "max"),
                global,
                groups: groups(r, spec, global, known)?,
                max_keys,
            }
        }
        Kind::SlidingLog => LimitParams::SlidingLog {
            windows: p.windows.as_ref()?.v.clone(),
            cost: p.cost.as_ref().map_or(Cost::Fixed(1), |c| c.v.clone()),
            max_keys,
        },
    })
}

/// A concurrency `max` (a key's, or a group's) above `global` can never be reached: the
/// effective limit is `global`. It is lowered to it, with a warning at the field, so the
/// runtime, `check --print-effective` and `tollgate_concurrency_max` all show what holds.
fn lowered(r: &mut Report, global: Option<u64>, max: &At<u64>, what: &str) -> u64 {
    match global {
        Some(global) if max.v > global => {
            r.warn(
                max.pos,
                &max.path,
                format!(
                    "{what} {} is above global {global}: lowered to {global}, as all keys together hold at most {global} copies",
                    max.v
                ),
            );
            global
        }
        _ => max.v,
    }
}

/// A concurrency limit's groups, with `members: {segment: NAME}` resolved and each `max`
/// above `global` lowered to it.
fn groups(
    r: &mut Report,
    spec: &LimitSpec,
    global: Option<u64>,
    known: &Known<'_>,
) -> Option<Vec<Group>> {
    let Some(list) = &spec.groups else {
        return Some(Vec::new());
    };
    let mut out = Vec::with_capacity(list.v.len());
    let mut ok = true;
    for g in &list.v {
        let members = match (&g.values, &g.segment) {
            (Some((part, values)), _) => Members::Values {
                part: part.clone(),
                values: values.clone(),
            },
            (None, Some(name)) => match segment(r, name, known) {
                Some(seg) => Members::Segment {
                    part: seg.of.clone(),
                    name: seg.name.clone(),
                },
                None => {
                    ok = false;
                    continue;
                }
            },
            (None, None) => {
                ok = false;
                continue;
            }
        };
        let what = format!("group `{}` max", g.name.v);
        out.push(Group {
            name: g.name.v.clone(),
            members,
            max: lowered(r, global, &g.max, &what),
        });
    }
    ok.then_some(out)
}

/// The segment `name` refers to, or an error at the reference naming the known ones.
fn segment<'s>(r: &mut Report, name: &At<String>, known: &Known<'s>) -> Option<&'s SegmentSpec> {
    let found = known.segments.iter().find(|s| s.name == name.v);
    if found.is_none() {
        let known: Vec<&str> = known.segments.iter().map(|s| s.name.as_str()).collect();
        let message = if known.is_empty() {
            format!(
                "unknown segment `{}`: no `segments:` are configured",
                name.v
            )
        } else {
            suggest::unknown("segment", &name.v, &known)
        };
        r.error(name.pos, &name.path, message);
    }
    found
}

/// A `match:`'s conditions (an override's or the limit's own), each part checked against
/// the kind and each segment against `segments:`.
fn matchers_of(
    r: &mut Report,
    kind: Kind,
    conditions: &Conditions,
    known: &Known<'_>,
) -> Option<Vec<Matcher>> {
    for m in &conditions.matchers {
        check_part(r, kind, &m.v.part, m.pos, &m.path);
    }
    let mut matchers: Vec<Matcher> = conditions.matchers.iter().map(|m| m.v.clone()).collect();
    for name in &conditions.segments {
        let seg = segment(r, name, known)?;
        check_part(r, kind, &seg.of, name.pos, &name.path);
        matchers.push(Matcher {
            part: seg.of.clone(),
            value: MatchValue::Segment(seg.name.clone()),
        });
    }
    Some(matchers)
}

fn resolve_override(
    r: &mut Report,
    kind: Kind,
    spec: &LimitSpec,
    o: &OverrideSpec,
    mode: Mode,
    known: &Known<'_>,
) -> Option<Override> {
    for f in &o.fields {
        if !takes(kind, f.v) {
            r.error(f.pos, &f.path, wrong_kind(f.v, kind));
        }
    }
    let matchers = matchers_of(r, kind, &o.conditions, known)?;
    if let Some(auto) = &o.params.auto {
        let message = "an override sets a number: `max: auto` is learned by the limit itself";
        r.error(auto.pos, &auto.path, message);
        return None;
    }
    let mut p = spec.params.clone();
    p.apply(&o.params);
    let params = params_of(r, kind, spec, &p, known)?;
    let raised = match kind {
        Kind::Inflight | Kind::Rate | Kind::Concurrency => {
            Some(("max", (&spec.params.max, &o.params.max)))
        }
        Kind::TokenBucket => Some(("capacity", (&spec.params.capacity, &o.params.capacity))),
        Kind::Tiered | Kind::SlidingLog => None,
    };
    if let Some((own, (Some(base), Some(new)))) = raised {
        raise_warning(r, own, base, new);
    }
    let changes_bucket =
        o.params.capacity.is_some() || o.params.amount.is_some() || o.params.every.is_some();
    if let (LimitParams::TokenBucket { bucket, .. }, true) = (&params, changes_bucket) {
        fill_warning(r, bucket, o.pos, &o.path);
    }
    let anchor = (o.params.capacity.as_ref().map(|c| (c.pos, &c.path)))
        .or_else(|| o.params.cost.as_ref().map(|c| (c.pos, &c.path)))
        .or_else(|| p.cost.as_ref().map(|c| (c.pos, &c.path)));
    cost_fits(r, &params, anchor);
    Some(Override {
        matchers,
        params,
        mode: o.mode.as_ref().map_or(mode, |m| m.v),
    })
}

/// A fixed `cost` above `capacity` can never pass: every request would get 429 with a
/// `Retry-After` that no wait honours. It is an error at `anchor`, the field that made it
/// so (the callers pick the one this entry or override wrote). `capacity: 0` is a
/// deliberate block and exempt.
fn cost_fits(r: &mut Report, params: &LimitParams, anchor: Option<(Pos, &String)>) {
    let LimitParams::TokenBucket {
        bucket,
        cost: Cost::Fixed(cost),
        ..
    } = params
    else {
        return;
    };
    if *cost <= bucket.capacity || bucket.capacity == 0 {
        return;
    }
    if let Some((pos, path)) = anchor {
        r.error(
            pos,
            path,
            format!(
                "cost {cost} is above capacity {}: no request could ever pass; lower `cost` or raise `capacity` (use `capacity: 0` for a deliberate block)",
                bucket.capacity
            ),
        );
    }
}

/// A sketch of more than [`bounds::MAX_COUNTERS`] counters is an error at the field that
/// made it so (`slots`, else `hashes`).
fn sketch_fits(r: &mut Report, spec: &LimitSpec, sketch: SketchSize) {
    if sketch.counters() <= bounds::MAX_COUNTERS {
        return;
    }
    let anchor = (spec.slots.as_ref().map(|s| (s.pos, s.path.as_str())))
        .or_else(|| spec.hashes.as_ref().map(|h| (h.pos, h.path.as_str())))
        .unwrap_or((spec.pos, spec.path.as_str()));
    r.error(
        anchor.0,
        anchor.1,
        format!(
            "a sketch of {} hashes × {} slots has {} counters ({}); at most {} counters ({}) are allowed: lower `slots` or `hashes`",
            sketch.hashes,
            sketch.slots,
            sketch.counters(),
            bounds::human(sketch.bytes() as u128),
            bounds::MAX_COUNTERS,
            bounds::human((bounds::MAX_COUNTERS * SketchSize::COUNTER_BYTES) as u128),
        ),
    );
}

fn raise_warning(r: &mut Report, field: &str, base: &At<u64>, new: &At<u64>) {
    if new.v > base.v {
        r.warn(
            new.pos,
            &new.path,
            format!(
                "override {field} {} is above the limit's {field} {}; it raises the limit for matching requests",
                new.v, base.v
            ),
        );
    }
}

/// Where a bucket's fill warning points: at what this entry itself wrote (`refill`, else
/// `capacity`), so an origin changing only a default's `capacity` is warned at its line.
fn fill_anchor(spec: &LimitSpec) -> (Pos, &str) {
    let p = &spec.params;
    let own = |path: &str| path.starts_with(&spec.path);
    match (&p.refill, &p.capacity) {
        (Some(refill), _) if own(&refill.path) => (refill.pos, &refill.path),
        (_, Some(capacity)) if own(&capacity.path) => (capacity.pos, &capacity.path),
        (Some(refill), _) => (refill.pos, &refill.path),
        _ => (spec.pos, &spec.path),
    }
}

/// Warns when an emptied bucket cannot fill up again within a day.
fn fill_warning(r: &mut Report, b: &TokenBucketParams, pos: Pos, path: &str) {
    let amount = u128::from(b.amount.max(1));
    let fill = u128::from(b.capacity) * u128::from(b.every);
    if fill > DAY_NANOS * amount {
        let takes = Duration::from_nanos(u64::try_from(fill / amount).unwrap_or(u64::MAX));
        let every = Duration::from_nanos(b.every);
        r.warn(
            pos,
            path,
            format!(
                "refilling {} every {} takes {} to fill capacity {}; an emptied bucket will not recover within a day",
                b.amount,
                humantime::format_duration(every),
                humantime::format_duration(takes),
                b.capacity
            ),
        );
    }
}

/// `sketch` on a rate limit: accepted for one release, so that existing files keep
/// loading, and ignored, because rate limits are exact per key. Warned at each place it is
/// written (a default's is shown once).
fn ignored_sketch(r: &mut Report, spec: &LimitSpec) {
    for f in spec.fields.iter().filter(|f| f.v == "sketch") {
        r.warn(
            f.pos,
            &f.path,
            "rate limits are exact per key; `sketch` is ignored, size the table with `max_keys`",
        );
    }
}

/// Warns when a concurrency limit's table holds fewer keys than the requests the proxy can
/// have in flight ([`max_in_flight`]: the connection cap, one request a connection). Past
/// its size a key whose set of 8 slots is full is admitted *untracked*: its own `max` is
/// not checked against the copies it already holds (`limits::concurrency`, counted in
/// `tollgate_concurrency_untracked_total`). At `max_keys` ≥ 10 × the cap that practically
/// never happens, which is what the warning suggests. It points at `max_keys` when written,
/// else at the limit.
fn untracked_warning(r: &mut Report, spec: &LimitSpec, max_keys: usize, connections: &Connections) {
    let in_flight = max_in_flight(connections);
    if max_keys as u64 >= in_flight {
        return;
    }
    let (pos, path) = (spec.max_keys.as_ref())
        .filter(|m| m.path.starts_with(&spec.path))
        .map_or((spec.pos, &spec.path), |m| (m.pos, &m.path));
    let cap = match connections.max_connections {
        Some(_) => format!("`server.max_connections` ({in_flight})"),
        None => format!("the connection cap (at most {in_flight})"),
    };
    r.warn(
        pos,
        path,
        format!(
            "max_keys {max_keys} is fewer keys than the requests {cap} can hold at once: past it, a key whose slots are full is admitted untracked, its own max unchecked (counted in tollgate_concurrency_untracked_total); raise `max_keys` to {} or more",
            in_flight.saturating_mul(10)
        ),
    );
}

/// Warns when an inflight sketch is small for its `max` with the most requests in flight
/// ([`max_in_flight`]: the connection cap).
///
/// A new key is wrongly rejected only when, in every one of the `h` rows, the slot it
/// hashes to already holds `max` units of other keys. With `n` units in flight a row has
/// at most `n / max` such slots, so whatever the keys, the odds are at most
/// `(n / (max · slots))^h`; for `n` single-request keys they are
/// `P(Poisson(n / slots) ≥ max)^h`, lower (see `limits::inflight`). The warning uses the
/// bound, which needs no assumption about the traffic: it fires when the bound exceeds
/// [`SATURATION_ODDS`], e.g. for `max: 1` on the default 4 × 8192 (up to 6.25% at 4 096 in
/// flight, 2.4% if every request is its own key), never for `max` ≥ 2 on the default size
/// and connection cap.
/// It points at `sketch.slots` when written, else at `max`.
fn saturation_warning(
    r: &mut Report,
    spec: &LimitSpec,
    max: u64,
    sketch: SketchSize,
    connections: &Connections,
) {
    let in_flight = max_in_flight(connections);
    let (hashes, slots) = (sketch.hashes.max(1), sketch.slots.max(1));
    let capacity = max.max(1) as f64 * slots as f64;
    let exponent = i32::try_from(hashes).unwrap_or(i32::MAX);
    let odds = (in_flight as f64 / capacity).min(1.0).powi(exponent);
    if odds <= SATURATION_ODDS {
        return;
    }
    // The smallest `slots` whose bound is within the odds, as a power of two.
    let root = SATURATION_ODDS.powf(1.0 / hashes as f64);
    let need = (in_flight as f64 / (max.max(1) as f64 * root)).ceil() as u64;
    let need = need.next_power_of_two();
    let own = |path: &str| path.starts_with(&spec.path);
    let slots_at = spec.slots.as_ref().filter(|s| own(&s.path));
    let max_at = spec.params.max.as_ref().map(|m| (m.pos, &m.path));
    let (pos, path) = slots_at
        .map(|s| (s.pos, &s.path))
        .or(max_at)
        .unwrap_or((spec.pos, &spec.path));
    // Say where the number comes from when the config set it.
    let in_flight = match connections.max_connections {
        Some(_) => format!("`server.max_connections` ({in_flight})"),
        None => in_flight.to_string(),
    };
    r.warn(
        pos,
        path,
        format!(
            "a sketch of {hashes} × {slots} with max {max} may wrongly reject up to {:.1}% of new keys when {in_flight} requests are in flight (a key is rejected when each row's slot already holds {max} of other keys); raise `sketch.slots` to {need} or more",
            odds * 100.0
        ),
    );
}
