//! Limits as written, before merging: every field optional and located.
//!
//! A default limit and an origin's limit of the same name are both parsed into a
//! [`LimitSpec`]; [`LimitSpec::merged`] lays the origin's fields over the default's, field
//! by field, and [`super::resolve`] turns the result into a model [`Limit`]. Keeping the
//! location of every field lets a merged limit's errors point at the line that set the
//! offending value, whichever of the two it was.
//!
//! [`Limit`]: crate::config::model::Limit

use strum::IntoEnumIterator;

use crate::config::lease::LeaseSetting;
use crate::config::model::{Cost, HeadersMode, Kind, Mode};
use crate::config::report::{At, Pos};
use crate::limits::{AdaptiveBounds, KeyPart, LogWindow, Matcher, Tier};

/// Fields every kind takes.
pub(crate) const COMMON: [&str; 8] = [
    "kind",
    "key",
    "mode",
    "headers",
    "match",
    "overrides",
    "store",
    "top_keys",
];

/// The parameter fields only `kind` (and maybe other kinds) takes: the one table of which
/// field belongs to which kind.
pub(crate) fn own_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Inflight => &["max", "share", "sketch", "lease"],
        Kind::Tiered => &["tiers", "hard_limit", "global_limit", "max_keys"],
        Kind::Concurrency => &["max", "global", "groups", "max_keys", "lease"],
        Kind::SlidingLog => &["windows", "cost", "max_keys"],
        Kind::Rate => &["max", "per", "strict", "max_keys", "lease"],
        Kind::TokenBucket => &["capacity", "refill", "cost", "strict", "max_keys", "lease"],
    }
}

/// The fields a limit of `kind` must have, once merged with a default of its name (checked
/// in `resolve::base_params`); `refill` needs both `amount` and `every`.
pub(crate) fn required_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Inflight | Kind::Concurrency => &["max"],
        Kind::Rate => &["max", "per"],
        Kind::TokenBucket => &["capacity", "refill"],
        Kind::Tiered => &["tiers"],
        Kind::SlidingLog => &["windows"],
    }
}

/// Fields `kind` no longer uses but still accepts, with a warning, so that files written
/// for the previous release keep loading: rate's `sketch` (rate limits are exact per key
/// since; see `resolve::ignored_sketch`). Not listed in messages. To be removed next
/// release.
pub(crate) fn ignored_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Rate => &["sketch"],
        _ => &[],
    }
}

/// Whether a limit of `kind` takes `field`.
pub(crate) fn takes(kind: Kind, field: &str) -> bool {
    COMMON.contains(&field)
        || own_fields(kind).contains(&field)
        || ignored_fields(kind).contains(&field)
}

/// Every field of `kind`, for messages.
pub(crate) fn field_list(kind: Kind) -> String {
    let mut all: Vec<&str> = COMMON.to_vec();
    all.extend_from_slice(own_fields(kind));
    all.join(", ")
}

/// Every key a limit mapping may hold, whatever its kind: the common fields and every
/// kind's own, derived from [`own_fields`].
pub(crate) fn limit_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let mut keys = COMMON.to_vec();
        for kind in Kind::iter() {
            for field in own_fields(kind) {
                if !keys.contains(field) {
                    keys.push(field);
                }
            }
        }
        keys
    })
}

/// Keys an override item may hold.
pub(crate) const OVERRIDE_KEYS: [&str; 11] = [
    "match",
    "mode",
    "max",
    "per",
    "strict",
    "capacity",
    "refill",
    "cost",
    "windows",
    "tiers",
    "hard_limit",
];

/// Limit keys that an override may not change: they shape state shared by every variant
/// (a global count, the groups) or identify the limit.
pub(crate) const NOT_OVERRIDABLE: [&str; 12] = [
    "store",
    "lease",
    "top_keys",
    "kind",
    "key",
    "headers",
    "overrides",
    "sketch",
    "max_keys",
    "global",
    "global_limit",
    "groups",
];

/// `mode:` as written: `off` removes the limit from the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setting {
    /// `enforce` or `shadow`.
    On(Mode),
    /// `off`.
    Off,
}

/// The parameter fields a limit and its overrides share.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ParamSpec {
    /// `max` (inflight, rate).
    pub max: Option<At<u64>>,
    /// `max: auto` or `max: {auto: {min, max, initial}}` (inflight): replaces `max`.
    pub auto: Option<At<AdaptiveBounds>>,
    /// `share` in percent (inflight, with `max: auto`).
    pub share: Option<At<u8>>,
    /// `per` in nanoseconds (rate).
    pub per: Option<At<u64>>,
    /// `strict` (rate, token_bucket).
    pub strict: Option<At<bool>>,
    /// `capacity` (token_bucket).
    pub capacity: Option<At<u64>>,
    /// Where `refill:` itself is written (its key).
    pub refill: Option<At<()>>,
    /// `refill.amount`.
    pub amount: Option<At<u64>>,
    /// `refill.every` in nanoseconds.
    pub every: Option<At<u64>>,
    /// `cost` (token_bucket, sliding_log).
    pub cost: Option<At<Cost>>,
    /// `windows` (sliding_log).
    pub windows: Option<At<Vec<LogWindow>>>,
    /// `tiers` (tiered), as written (normalized when resolved).
    pub tiers: Option<At<Vec<Tier>>>,
    /// `hard_limit` (tiered).
    pub hard_limit: Option<At<u64>>,
    /// `global_limit` (tiered).
    pub global_limit: Option<At<u64>>,
    /// `global` (concurrency).
    pub global: Option<At<u64>>,
    /// Every parameter key written, valid or not (`refill.every` for sub-keys), so that an
    /// invalid value is not reported a second time as missing.
    pub written: Vec<&'static str>,
}

fn lay<T: Clone>(base: &mut Option<T>, over: &Option<T>) {
    if over.is_some() {
        base.clone_from(over);
    }
}

impl ParamSpec {
    /// Replaces every field that `over` sets; `refill`'s sub-fields one by one.
    pub fn apply(&mut self, over: &ParamSpec) {
        // A number and `auto` are two spellings of one field: the later one wins.
        if over.max.is_some() {
            self.auto = None;
        }
        if over.auto.is_some() {
            self.max = None;
        }
        lay(&mut self.max, &over.max);
        lay(&mut self.auto, &over.auto);
        lay(&mut self.share, &over.share);
        lay(&mut self.per, &over.per);
        lay(&mut self.strict, &over.strict);
        lay(&mut self.capacity, &over.capacity);
        lay(&mut self.refill, &over.refill);
        lay(&mut self.amount, &over.amount);
        lay(&mut self.every, &over.every);
        lay(&mut self.cost, &over.cost);
        lay(&mut self.windows, &over.windows);
        lay(&mut self.tiers, &over.tiers);
        lay(&mut self.hard_limit, &over.hard_limit);
        lay(&mut self.global_limit, &over.global_limit);
        lay(&mut self.global, &over.global);
        self.written.extend_from_slice(&over.written);
    }

    /// Whether `name` (`max`, `refill.every`, ...) was written at all.
    pub fn wrote(&self, name: &str) -> bool {
        self.written.contains(&name)
    }
}

/// One concurrency group as written: `{name, members, max}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupSpec {
    /// The group's name.
    pub name: At<String>,
    /// `members: {PART: [VALUES]}`: the part and its values.
    pub values: Option<(KeyPart, Vec<Box<[u8]>>)>,
    /// `members: {segment: NAME}`.
    pub segment: Option<At<String>>,
    /// `max`, located for the warning when it is above `global`.
    pub max: At<u64>,
}

/// A `match:` as written (an override's or a limit's own): `PART: VALUE` conditions, each
/// at its part's key, and `segment: NAME` ones, resolved against `segments:` later.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Conditions {
    /// The parsed `PART: VALUE` conditions.
    pub matchers: Vec<At<Matcher>>,
    /// The `segment: NAME` conditions.
    pub segments: Vec<At<String>>,
}

/// One `overrides:` item as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverrideSpec {
    /// Where the item starts.
    pub pos: Pos,
    /// `...overrides[i]`.
    pub path: String,
    /// Its `match:`.
    pub conditions: Conditions,
    /// `mode:` (enforce or shadow).
    pub mode: Option<At<Mode>>,
    /// The parameter fields it changes.
    pub params: ParamSpec,
    /// The parameter fields written, at their keys, for the kind check.
    pub fields: Vec<At<&'static str>>,
}

/// One `limits.NAME` entry as written, in `defaults` or in an origin.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LimitSpec {
    /// The limit's name.
    pub name: String,
    /// Where the name is written.
    pub pos: Pos,
    /// `...limits.NAME`.
    pub path: String,
    /// `kind`.
    pub kind: Option<At<Kind>>,
    /// The key parts, each located, and where the list is.
    pub key: Option<At<Vec<At<KeyPart>>>>,
    /// `mode`.
    pub mode: Option<At<Setting>>,
    /// `headers`.
    pub headers: Option<At<HeadersMode>>,
    /// The kind's parameters.
    pub params: ParamSpec,
    /// `sketch.hashes`.
    pub hashes: Option<At<usize>>,
    /// `sketch.slots`.
    pub slots: Option<At<usize>>,
    /// `max_keys`.
    pub max_keys: Option<At<usize>>,
    /// `groups` (concurrency), replaced as a whole when an origin sets it.
    pub groups: Option<At<Vec<GroupSpec>>>,
    /// `store`: the shared store's name.
    pub store: Option<At<String>>,
    /// `lease`: how a hot key's quota is taken from the store.
    pub lease: Option<At<LeaseSetting>>,
    /// `top_keys`: the heavy-hitter list's size.
    pub top_keys: Option<At<usize>>,
    /// `overrides`, replaced as a whole when an origin sets it.
    pub overrides: Option<At<Vec<OverrideSpec>>>,
    /// `match`: the limit's own conditions (which requests it applies to), replaced as a
    /// whole when an origin sets it.
    pub scope: Option<At<Conditions>>,
    /// Every known field written, at its key, for the kind check.
    pub fields: Vec<At<&'static str>>,
}

impl LimitSpec {
    /// An empty spec named `name`, written at `pos`.
    pub fn new(name: &str, pos: Pos, path: &str) -> Self {
        Self {
            name: name.to_string(),
            pos,
            path: path.to_string(),
            kind: None,
            key: None,
            mode: None,
            headers: None,
            params: ParamSpec::default(),
            hashes: None,
            slots: None,
            max_keys: None,
            groups: None,
            store: None,
            lease: None,
            top_keys: None,
            overrides: None,
            scope: None,
            fields: Vec::new(),
        }
    }

    /// This default with `origin`'s fields laid over it. The result is located at the
    /// origin's entry; the kind stays the default's (a change is reported elsewhere).
    pub fn merged(&self, origin: &LimitSpec) -> LimitSpec {
        let mut out = self.clone();
        out.name.clone_from(&origin.name);
        out.pos = origin.pos;
        out.path.clone_from(&origin.path);
        lay(&mut out.kind, &origin.kind);
        if self.kind.is_some() {
            out.kind.clone_from(&self.kind);
        }
        lay(&mut out.key, &origin.key);
        lay(&mut out.mode, &origin.mode);
        lay(&mut out.headers, &origin.headers);
        out.params.apply(&origin.params);
        lay(&mut out.hashes, &origin.hashes);
        lay(&mut out.slots, &origin.slots);
        lay(&mut out.max_keys, &origin.max_keys);
        lay(&mut out.groups, &origin.groups);
        lay(&mut out.store, &origin.store);
        lay(&mut out.lease, &origin.lease);
        lay(&mut out.top_keys, &origin.top_keys);
        lay(&mut out.overrides, &origin.overrides);
        lay(&mut out.scope, &origin.scope);
        out.fields.extend(origin.fields.iter().cloned());
        out
    }
}
