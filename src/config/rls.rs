//! The `rls:` section and the files it names: envoyproxy/ratelimit's own configuration
//! (a directory of YAML files, each one `domain` with nested `descriptors`), read as it is
//! and turned into tollgate limits.
//!
//! Each file is read with tollgate's own YAML reader, so every problem is reported as
//! `FILE:LINE:COLUMN: path: message` naming the ratelimit file, beside the main config's
//! problems. The rules follow envoyproxy/ratelimit's loader: a descriptor needs a `key`;
//! `key` and `value` together (`key_value`) are unique in their list; a `rate_limit` has a
//! `unit` and `requests_per_unit`, or `unlimited: true` and no unit; `replaces` entries
//! have a name that is not the rule's own; a domain is defined once. Each limited rule
//! becomes a `rate` limit ([`Limit`]) named `DOMAIN.KEY_VALUE.KEY...` (its path, as their
//! stats name it) with `max = requests_per_unit` and `per` = the unit (a sliding window,
//! or with `rls.window: fixed` one aligned to the unit as theirs are), keyed by the
//! request's descriptor (see `docs/envoy-rls.md`); the runtime builds it like any other
//! limit, in `rls.store`.
//!
//! This is the one place besides secret files where reading the config opens other files
//! (see "Config is pure, but for its secret files" in `docs/architecture.md`): the
//! directory is listed and each `*.yaml`/`*.yml` file read, at most [`MAX_FILES`] of at
//! most [`text::MAX_FILE_BYTES`] each, so `tollgate check`, a start and a reload refuse
//! the same broken file.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::config::bounds;
use crate::config::model::{HeadersMode, Limit, LimitParams, Mode, StoreSpec};
use crate::config::report::{child, item, At, Pos, Report};
use crate::config::resolve::DEFAULT_MAX_KEYS;
use crate::config::scalar;
use crate::config::stores::store_ref;
use crate::config::suggest;
use crate::config::text;
use crate::config::yaml::{self, Node, Value};
use crate::files::Stamp;
use crate::limits::lease::LeaseParams;
use crate::limits::{KeyPart, KeySpec, RateParams, RateWindow};

/// The keys `rls:` takes.
pub(crate) const RLS_KEYS: [&str; 4] = ["config_dir", "store", "max_keys", "window"];

/// The windows `rls.window` may name: sliding (the default) or fixed, as
/// envoyproxy/ratelimit counts.
pub(crate) const WINDOWS: [&str; 2] = ["sliding", "fixed"];

/// The keys of a ratelimit file's root.
pub(crate) const FILE_KEYS: [&str; 2] = ["domain", "descriptors"];

/// The keys of a descriptor. `value_to_metric` is read and ignored: tollgate's metrics
/// never carry request values (see the guide).
pub(crate) const DESCRIPTOR_KEYS: [&str; 8] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];

/// The keys of a `rate_limit` block.
pub(crate) const RATE_LIMIT_KEYS: [&str; 5] =
    ["unit", "requests_per_unit", "unlimited", "name", "replaces"];

/// The units a rate limit may use, as envoyproxy/ratelimit spells them (any case).
pub(crate) const UNITS: [&str; 4] = ["second", "minute", "hour", "day"];

/// At most this many files in the directory.
pub const MAX_FILES: usize = 256;

/// At most this many descriptors in all files together.
pub const MAX_DESCRIPTORS: usize = 10_000;

/// Descriptors nest at most this deep (Envoy's actions rarely pass five).
pub const MAX_DEPTH: usize = 16;

/// The heaviest keys a `detailed_metric: true` rule keeps for the admin API's `/top`.
pub const DETAILED_TOP_KEYS: usize = 100;

/// The origin name RLS limits are built, counted and stored under.
pub const RLS_ORIGIN: &str = "_rls";

/// `rls:`: the rate limit service's settings and the domains read from `config_dir`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rls {
    /// The directory as resolved (relative to the config file's directory).
    pub config_dir: Option<PathBuf>,
    /// The store the limits live in (`None`: in-process).
    pub store: Option<String>,
    /// Keys each rule holds state for (in-process store).
    pub max_keys: usize,
    /// `window`: every rule's window, sliding (the default: no double burst at a unit's
    /// edge) or fixed (aligned to the unit, reset at each boundary: envoyproxy/ratelimit's
    /// answers byte for byte).
    pub window: RateWindow,
    /// The domains, by file name order.
    pub domains: Vec<RlsDomain>,
    /// Every file read, with its stamp before reading: the reloader compares them, and
    /// the directory's listing, with the disk.
    pub files: Vec<(PathBuf, Option<Stamp>)>,
}

/// One file's domain.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsDomain {
    /// `domain:`.
    pub name: String,
    /// The top-level descriptors, file order.
    pub descriptors: Vec<RlsDescriptor>,
}

/// One descriptor of a domain's tree.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsDescriptor {
    /// `key`.
    pub key: String,
    /// `value`; `None` matches any value. A value with `*` is a wildcard.
    pub value: Option<String>,
    /// `DOMAIN.KEY_VALUE...`: the rule's name in metrics and the limit's name.
    pub path: String,
    /// The rule, if the descriptor has a `rate_limit`.
    pub rule: Option<RlsRule>,
    /// `shadow_mode: true`: an over-limit answer says OK (counted as shadow).
    pub shadow_mode: bool,
    /// `detailed_metric: true`: the rule's heaviest keys are kept (admin `/top`).
    pub detailed_metric: bool,
    /// `share_threshold: true` (wildcards only): every matching value shares one count.
    pub share_threshold: bool,
    /// Nested descriptors.
    pub descriptors: Vec<RlsDescriptor>,
}

/// A descriptor's `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsRule {
    /// `name`, which other rules' `replaces` name.
    pub name: Option<String>,
    /// `replaces: [{name}]`.
    pub replaces: Vec<String>,
    /// The limit; `None` for `unlimited: true`.
    pub limit: Option<RlsLimit>,
}

/// A limited rule: the envoy unit and count, and the tollgate limit that enforces it.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsLimit {
    /// The unit's index in [`UNITS`] (0 second .. 3 day); Envoy's enum is this plus 1.
    pub unit: usize,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// The `rate` limit built for it.
    pub limit: Limit,
}

/// The unit's length in nanoseconds.
pub fn unit_nanos(unit: usize) -> u64 {
    const SECOND: u64 = 1_000_000_000;
    match unit {
        0 => SECOND,
        1 => 60 * SECOND,
        2 => 3_600 * SECOND,
        _ => 86_400 * SECOND,
    }
}

/// Reads `rls:` (and the files its `config_dir` names). `stores` are the configured
/// shared stores; `file` is the config file, whose directory a relative `config_dir`
/// starts in.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, stores: &[StoreSpec], file: &str) -> Rls {
    let mut rls = Rls {
        max_keys: DEFAULT_MAX_KEYS,
        ..Rls::default()
    };
    let Some(node) = node else {
        return rls;
    };
    let entries = scalar::map(r, node, "rls").unwrap_or_default();
    let mut dir_at = None;
    for e in entries {
        let path = child("rls", &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "config_dir" => {
                if let Some(name) = scalar::text(r, v, &path) {
                    let base = Path::new(file).parent().unwrap_or_else(|| Path::new(""));
                    rls.config_dir = Some(base.join(name));
                    dir_at = Some((v.pos, path));
                }
            }
            "max_keys" => {
                if let Some(n) = scalar::max_keys(r, v, &path) {
                    rls.max_keys = n;
                }
            }
            "window" => {
                if let Some(i) = scalar::choice(r, v, &path, "window", &WINDOWS) {
                    rls.window = if i == 1 {
                        RateWindow::Fixed
                    } else {
                        RateWindow::Sliding
                    };
                }
            }
            "store" => {
                if let Some(name) = store_ref(r, v, &path, stores) {
                    rls.store = Some(name);
                }
            }
            other => r.error(e.key_pos, &path, suggest::unknown("key", other, &RLS_KEYS)),
        }
    }
    match (&rls.config_dir, dir_at) {
        (Some(dir), Some((pos, path))) => {
            let dir = dir.clone();
            read_dir(r, &dir, pos, &path, &mut rls);
            let limits: Vec<At<Limit>> = limits(&rls)
                .map(|l| At::new(l.clone(), pos, &path))
                .collect();
            bounds::state_budget(r, &limits);
        }
        _ => r.error(
            node.pos,
            "rls.config_dir",
            "missing required field `config_dir`: the directory of envoyproxy/ratelimit's YAML files",
        ),
    }
    rls
}

/// Every limit of `rls`, tree order.
pub fn limits(rls: &Rls) -> impl Iterator<Item = &Limit> {
    let mut stack: Vec<&RlsDescriptor> = rls
        .domains
        .iter()
        .flat_map(|d| d.descriptors.iter().rev())
        .collect();
    stack.reverse();
    let mut out = Vec::new();
    while let Some(d) = stack.pop() {
        if let Some(l) = d.rule.as_ref().and_then(|r| r.limit.as_ref()) {
            out.push(&l.limit);
        }
        stack.extend(d.descriptors.iter().rev());
    }
    out.into_iter()
}

/// The `*.yaml` and `*.yml` files of `dir`, sorted by name.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if yaml && !hidden {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_dir(r: &mut Report, dir: &Path, pos: Pos, path: &str, rls: &mut Rls) {
    let files = match list_files(dir) {
        Ok(files) => files,
        Err(e) => {
            let message = format!("cannot read the directory `{}`: {e}", dir.display());
            r.error(pos, path, message);
            return;
        }
    };
    if files.len() > MAX_FILES {
        let message = bounds::too_many("ratelimit files", files.len(), MAX_FILES);
        r.error(pos, path, message);
        return;
    }
    let mut seen = HashSet::new();
    let mut count = 0usize;
    for f in files {
        let stamp = Stamp::read(&f);
        rls.files.push((f.clone(), stamp));
        let name = f.display().to_string();
        let mut fr = Report::new(&name);
        if let Some(domain) = read_file(&mut fr, &f, &mut count, rls.store.as_deref(), rls) {
            if seen.insert(domain.name.clone()) {
                rls.domains.push(domain);
            } else {
                let message = format!(
                    "domain `{}` is defined in another file too; each domain is defined once",
                    domain.name
                );
                fr.error(Pos { line: 1, col: 1 }, "domain", message);
            }
        }
        r.absorb(fr);
    }
    if count > MAX_DESCRIPTORS {
        let message = bounds::too_many("ratelimit descriptors", count, MAX_DESCRIPTORS);
        r.error(pos, path, message);
    }
}

fn read_file(
    r: &mut Report,
    f: &Path,
    count: &mut usize,
    store: Option<&str>,
    rls: &Rls,
) -> Option<RlsDomain> {
    let start = Pos { line: 1, col: 1 };
    let limit = u64::try_from(text::MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    let read = crate::files::open_regular(f)
        .and_then(|file| file.take(limit.saturating_add(1)).read_to_end(&mut bytes));
    if let Err(e) = read {
        r.error(start, "", format!("cannot read ratelimit file: {e}"));
        return None;
    }
    if let Some((pos, message)) = text::size(bytes.len()) {
        r.error(pos, text::PATH, message);
        return None;
    }
    let content = match text::decode(&bytes) {
        Ok(t) => text::strip_bom(t),
        Err(problems) => {
            for (pos, message) in problems {
                r.error(pos, text::PATH, message);
            }
            return None;
        }
    };
    let controls = text::control_characters(content);
    if !controls.is_empty() {
        for (pos, message) in controls {
            r.error(pos, text::PATH, message);
        }
        return None;
    }
    let doc = yaml::parse(content);
    let failed = !doc.errors.is_empty() && doc.root.is_none();
    for (pos, path, message) in doc.errors {
        r.error(pos, &path, message);
    }
    if failed {
        return None;
    }
    let root = doc.root?;
    let Value::Map(entries) = &root.value else {
        r.error(
            root.pos,
            "",
            "a ratelimit file must be a mapping with `domain` and `descriptors`",
        );
        return None;
    };
    let mut name = None;
    let mut descriptors = Vec::new();
    let mut descriptors_node = None;
    for e in entries {
        match e.key.as_str() {
            "domain" => name = scalar::text(r, &e.value, "domain").map(str::to_string),
            "descriptors" => descriptors_node = Some(&e.value),
            other => r.error(e.key_pos, other, suggest::unknown("key", other, &FILE_KEYS)),
        }
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        r.error(
            root.pos,
            "domain",
            "missing required field `domain` (not empty)",
        );
        return None;
    };
    let at = Place {
        store,
        max_keys: rls.max_keys,
        window: rls.window,
    };
    if let Some(node) = descriptors_node {
        let mut walk = Walk { r, at, count };
        descriptors = walk.list(node, "descriptors", &name, 1);
    }
    Some(RlsDomain { name, descriptors })
}

/// What building a rule's limit needs.
struct Place<'a> {
    store: Option<&'a str>,
    max_keys: usize,
    window: RateWindow,
}

/// A walk over one ratelimit file's descriptors: its report, what building a rule's limit
/// needs, and the descriptors counted so far (over every file).
struct Walk<'a> {
    r: &'a mut Report,
    at: Place<'a>,
    count: &'a mut usize,
}

/// A descriptor's composite key: `KEY_VALUE`, or `KEY` when it matches any value.
fn composite(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_string(),
    }
}

impl Walk<'_> {
    fn list(&mut self, node: &Node, path: &str, parent: &str, depth: usize) -> Vec<RlsDescriptor> {
        if scalar::is_null(node) {
            return Vec::new();
        }
        let Some(items) = scalar::seq(self.r, node, path) else {
            return Vec::new();
        };
        if depth > MAX_DEPTH {
            let message = format!("descriptors nest at most {MAX_DEPTH} deep");
            self.r.error(node.pos, path, message);
            return Vec::new();
        }
        let mut out: Vec<RlsDescriptor> = Vec::with_capacity(items.len());
        let mut keys = HashSet::new();
        for (i, n) in items.iter().enumerate() {
            *self.count += 1;
            let p = item(path, i);
            let Some(d) = self.descriptor(n, &p, parent, depth) else {
                continue;
            };
            if !keys.insert(composite(&d.key, d.value.as_deref())) {
                let message = format!("duplicate descriptor composite key `{}`", d.path);
                self.r.error(n.pos, &p, message);
                continue;
            }
            out.push(d);
        }
        out
    }

    fn descriptor(
        &mut self,
        node: &Node,
        path: &str,
        parent: &str,
        depth: usize,
    ) -> Option<RlsDescriptor> {
        let entries = scalar::map(self.r, node, path)?;
        let mut key = None;
        let mut value = None;
        let mut rule_node = None;
        let mut nested = None;
        let (mut shadow_mode, mut detailed_metric, mut share_threshold) = (false, false, false);
        for e in entries {
            let p = child(path, &e.key);
            let v = &e.value;
            match e.key.as_str() {
                "key" => key = scalar::text(self.r, v, &p).map(str::to_string),
                "value" => {
                    if !scalar::is_null(v) {
                        value = scalar::text(self.r, v, &p)
                            .filter(|t| !t.is_empty())
                            .map(str::to_string);
                    }
                }
                "rate_limit" => rule_node = Some((v, p)),
                "descriptors" => nested = Some((v, p)),
                "shadow_mode" => shadow_mode = scalar::boolean(self.r, v, &p).unwrap_or(false),
                "detailed_metric" => {
                    detailed_metric = scalar::boolean(self.r, v, &p).unwrap_or(false)
                }
                "share_threshold" => {
                    share_threshold = scalar::boolean(self.r, v, &p).unwrap_or(false)
                }
                "value_to_metric" => {
                    let _ = scalar::boolean(self.r, v, &p);
                }
                other => self.r.error(
                    e.key_pos,
                    &p,
                    suggest::unknown("key", other, &DESCRIPTOR_KEYS),
                ),
            }
        }
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            self.r
                .error(node.pos, &child(path, "key"), "descriptor has empty key");
            return None;
        };
        if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            self.r.error(
                node.pos,
                &child(path, "share_threshold"),
                "share_threshold can only be used with wildcard values (containing `*`)",
            );
        }
        let full = format!("{parent}.{}", composite(&key, value.as_deref()));
        let flags = (shadow_mode, detailed_metric);
        let rule = rule_node.and_then(|(v, p)| read_rule(self.r, v, &p, &full, flags, &self.at));
        let descriptors = match nested {
            Some((v, p)) => self.list(v, &p, &full, depth + 1),
            None => Vec::new(),
        };
        Some(RlsDescriptor {
            key,
            value,
            path: full,
            rule,
            shadow_mode,
            detailed_metric,
            share_threshold,
            descriptors,
        })
    }
}

fn read_rule(
    r: &mut Report,
    node: &Node,
    path: &str,
    full: &str,
    (shadow, detailed): (bool, bool),
    at: &Place<'_>,
) -> Option<RlsRule> {
    let entries = scalar::map(r, node, path)?;
    let (mut unit, mut rpu, mut unlimited, mut name) = (None, None, false, None);
    let mut replaces = Vec::new();
    let mut unit_pos = node.pos;
    for e in entries {
        let p = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "unit" => {
                unit_pos = v.pos;
                if let Some(t) = scalar::text(r, v, &p) {
                    let lower = t.to_ascii_lowercase();
                    match UNITS.iter().position(|u| *u == lower) {
                        Some(i) => unit = Some(i),
                        None if ["week", "month", "year"].contains(&lower.as_str()) => r.error(
                            v.pos,
                            &p,
                            format!("unit `{t}` is not supported: tollgate's rate windows go up to a day (second, minute, hour, day)"),
                        ),
                        None => r.error(v.pos, &p, format!("invalid rate limit unit `{t}`; expected one of second, minute, hour, day")),
                    }
                }
            }
            "requests_per_unit" => {
                rpu = scalar::int(r, v, &p, 0, u64::from(u32::MAX))
                    .and_then(|n| u32::try_from(n).ok());
            }
            "unlimited" => unlimited = scalar::boolean(r, v, &p).unwrap_or(false),
            "name" => {
                name = scalar::text(r, v, &p)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
            }
            "replaces" => {
                let Some(items) = scalar::seq(r, v, &p) else {
                    continue;
                };
                for (i, n) in items.iter().enumerate() {
                    let ip = item(&p, i);
                    let Some(m) = scalar::map(r, n, &ip) else {
                        continue;
                    };
                    let replaced = m
                        .iter()
                        .find(|e| e.key == "name")
                        .and_then(|e| scalar::text(r, &e.value, &child(&ip, "name")));
                    for extra in m.iter().filter(|e| e.key != "name") {
                        let message = suggest::unknown("key", &extra.key, &["name"]);
                        r.error(extra.key_pos, &child(&ip, &extra.key), message);
                    }
                    match replaced.filter(|t| !t.is_empty()) {
                        Some(t) => replaces.push(t.to_string()),
                        None => r.error(n.pos, &ip, "should not have an empty replaces entry"),
                    }
                }
            }
            other => r.error(
                e.key_pos,
                &p,
                suggest::unknown("key", other, &RATE_LIMIT_KEYS),
            ),
        }
    }
    if name.is_some() && replaces.iter().any(|x| Some(x) == name.as_ref()) {
        r.error(
            node.pos,
            &child(path, "replaces"),
            "replaces should not contain name of same descriptor",
        );
    }
    if unlimited {
        if unit.is_some() {
            r.error(
                unit_pos,
                &child(path, "unit"),
                "should not specify rate limit unit when unlimited",
            );
        }
        return Some(RlsRule {
            name,
            replaces,
            limit: None,
        });
    }
    let Some(unit) = unit else {
        r.error(
            node.pos,
            &child(path, "unit"),
            "missing required field `unit` (second, minute, hour or day), or set `unlimited: true`",
        );
        return None;
    };
    let Some(requests_per_unit) = rpu else {
        r.error(
            node.pos,
            &child(path, "requests_per_unit"),
            "missing required field `requests_per_unit`",
        );
        return None;
    };
    let limit = Limit {
        name: full.to_string(),
        key: KeySpec::new(vec![KeyPart::Customer]),
        mode: if shadow { Mode::Shadow } else { Mode::Enforce },
        headers: HeadersMode::OnReject,
        params: LimitParams::Rate {
            rate: RateParams {
                max: u64::from(requests_per_unit),
                per: unit_nanos(unit),
                strict: false,
                window: at.window,
            },
            max_keys: at.max_keys,
        },
        store: at.store.map(str::to_string),
        overrides: Vec::new(),
        scope: Vec::new(),
        // detailed_metric: per-value visibility through the heavy hitters (admin `/top`),
        // never through metric labels.
        top_keys: detailed.then_some(DETAILED_TOP_KEYS),
        // In a Redis store Envoy's limits lease like the proxy's (`lease: auto`, the
        // default there): a hot descriptor's decisions cost no call. A fixed window stays
        // exact (the store's rate never leases one).
        lease: at.store.is_some().then(LeaseParams::default),
    };
    Some(RlsRule {
        name,
        replaces,
        limit: Some(RlsLimit {
            unit,
            requests_per_unit,
            limit,
        }),
    })
}
