//! YAML text to a validated [`Config`], with every problem located.
//!
//! The steps: [`super::yaml`] builds a marked tree; the sections are read by
//! [`super::server`], [`super::limit`] (defaults) and [`super::origin`]; defaults are
//! merged into origins by [`super::merge`]; cross-section checks run in
//! [`super::validate`]. Each step reports into one [`Report`] and carries on, so a file
//! with several mistakes gets all of them in one run.

use std::path::Path;

use crate::config::acme;
use crate::config::api;
use crate::config::bounds;
use crate::config::limit::parse_limits;
use crate::config::merge;
use crate::config::model::{Config, Diagnostic, Limit, Origin, Severity};
use crate::config::origin::{self, OriginDraft};
use crate::config::report::{At, Pos, Report};
use crate::config::resolve::Known;
use crate::config::resources;
use crate::config::rls;
use crate::config::scalar;
use crate::config::segments;
use crate::config::server;
use crate::config::spec::LimitSpec;
use crate::config::stores;
use crate::config::suggest;
use crate::config::text;
use crate::config::tls;
use crate::config::validate;
use crate::config::yaml::{self, Node, Value};

/// The top-level keys.
pub(crate) const TOP_KEYS: [&str; 9] = [
    "server",
    "tls",
    "api",
    "stores",
    "segments",
    "defaults",
    "origins",
    "resources",
    "rls",
];

/// The keys `defaults:` takes.
pub(crate) const DEFAULTS_KEYS: [&str; 2] = ["limits", "unmatched"];

/// A valid config and the warnings its normalizations produced.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The config.
    pub config: Config,
    /// Suspicious but valid settings, each located: an override raising its limit, a
    /// bucket that cannot refill within a day, `sni` without `tls`.
    pub warnings: Vec<Diagnostic>,
}

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read config: {source}")]
    Read {
        /// The path as given.
        file: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but has problems: every one found, in file order.
    #[error("{}", .0.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Diagnostic>),
}

/// Reads and parses the file at `path`.
pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let file = path.display().to_string();
    let bytes = read_bounded(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    parse_bytes(&bytes, &file)
}

/// The file's bytes, at most one more than [`text::MAX_FILE_BYTES`]: enough to tell that
/// it is too large without reading all of it.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let limit = u64::try_from(text::MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    crate::files::open_regular(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Parses a file's raw `bytes`, naming `file` in diagnostics: its size and encoding are
/// checked first (UTF-8, a leading byte-order mark dropped), each problem located.
pub fn parse_bytes(bytes: &[u8], file: &str) -> Result<Loaded, ConfigError> {
    if let Some(problem) = text::size(bytes.len()) {
        return Err(text_errors(file, vec![problem]));
    }
    match text::decode(bytes) {
        Ok(text) => parse_str(text, file),
        Err(problems) => Err(text_errors(file, problems)),
    }
}

fn text_errors(file: &str, problems: Vec<text::TextProblem>) -> ConfigError {
    let mut r = Report::new(file);
    for (pos, message) in problems {
        r.error(pos, text::PATH, message);
    }
    ConfigError::Invalid(r.finish().0)
}

/// Parses `text`, naming `file` in diagnostics.
///
/// A leading byte-order mark is dropped. Text with control characters (other than tab,
/// line feed and carriage return) is refused before any YAML is read: the YAML scanner
/// would take a NUL for the end of the file.
pub fn parse_str(text: &str, file: &str) -> Result<Loaded, ConfigError> {
    if let Some(problem) = text::size(text.len()) {
        return Err(text_errors(file, vec![problem]));
    }
    let text = text::strip_bom(text);
    let controls = text::control_characters(text);
    if !controls.is_empty() {
        return Err(text_errors(file, controls));
    }
    let mut r = Report::new(file);
    let doc = yaml::parse(text);
    let syntax_failed = !doc.errors.is_empty() && doc.root.is_none();
    for (pos, path, message) in doc.errors {
        r.error(pos, &path, message);
    }
    let config = if syntax_failed {
        None
    } else {
        build(&mut r, doc.root.as_ref(), file)
    };
    let (errors, warnings) = r.finish();
    match config {
        Some(config) if errors.is_empty() => Ok(Loaded { config, warnings }),
        _ if !errors.is_empty() => Err(ConfigError::Invalid(errors)),
        _ => Err(ConfigError::Invalid(vec![Diagnostic {
            severity: Severity::Error,
            file: file.to_string(),
            line: 1,
            column: 1,
            path: "(root)".to_string(),
            message: "the config could not be read".to_string(),
        }])),
    }
}

/// Reads the sections of the root mapping into a config.
fn build(r: &mut Report, root: Option<&Node>, file: &str) -> Option<Config> {
    let start = Pos { line: 1, col: 1 };
    let entries = match root.map(|n| (&n.value, n)) {
        Some((Value::Map(entries), _)) => entries,
        Some((Value::Bad, _)) => return None,
        Some((_, node)) if !scalar::is_null(node) => {
            let found = scalar::describe(node);
            let message = format!(
                "the config must be a mapping with `server`, `defaults` and `origins`, found {found}"
            );
            r.error(node.pos, "", message);
            return None;
        }
        _ => {
            r.error(
                start,
                "",
                "the file is empty; a config needs at least `origins`",
            );
            return None;
        }
    };
    let section = |name: &str| entries.iter().find(|e| e.key == name).map(|e| &e.value);
    for e in entries
        .iter()
        .filter(|e| !TOP_KEYS.contains(&e.key.as_str()))
    {
        r.error(
            e.key_pos,
            &e.key,
            suggest::unknown("key", &e.key, &TOP_KEYS),
        );
    }
    let server = server::parse(r, section("server"), file);
    let (mut tls, acme) = tls::parse(r, section("tls"), file);
    tls::check_listeners(r, &server.listeners, &tls, acme.is_some());
    tls::check_listeners(r, server.rls.as_slice(), &tls, acme.is_some());
    let segments = segments::parse(r, section("segments"), file);
    let (stores, local_store) = stores::parse(r, section("stores"), file);
    let api = api::parse(r, section("api"), &stores, file);
    let known = Known {
        segments: &segments,
        stores: &stores,
        connections: &server.server.connections,
    };
    let resources = resources::parse(r, section("resources"), &known);
    let rls = rls::parse(r, section("rls"), &stores, file);
    let (default_specs, unmatched) = section("defaults")
        .map(|n| defaults(r, n))
        .unwrap_or_default();
    let default_count = default_specs.len();
    let defaults_pos = section("defaults").map_or(start, |n| n.pos);
    let defaults = merge::resolve_defaults(r, default_specs, &known);
    let drafts = match section("origins") {
        Some(node) => origin::parse_origins(r, node),
        None => {
            let pos = root.map_or(start, |n| n.pos);
            r.error(pos, "origins", "missing required field `origins`");
            Vec::new()
        }
    };
    validate::hosts(r, &drafts);
    validate::listeners(r, &server.binds);
    let too_many_defaults = default_count > bounds::MAX_LIMITS;
    if too_many_defaults {
        let message = bounds::too_many("default limits", default_count, bounds::MAX_LIMITS);
        r.error(defaults_pos, "defaults.limits", message);
    }
    let merged: Vec<(OriginDraft, Vec<At<Limit>>)> = drafts
        .into_iter()
        .chain(unmatched)
        .map(|d| {
            let limits = merge::origin_limits(r, &defaults, &d.limits, &known);
            if limits.len() > bounds::MAX_LIMITS && !too_many_defaults {
                let message = format!(
                    "origin `{}` runs {} limits (defaults included); at most {} are allowed",
                    d.name,
                    limits.len(),
                    bounds::MAX_LIMITS
                );
                r.error(d.pos, &format!("origins.{}", d.name), message);
            }
            (d, limits)
        })
        .collect();
    bounds::state_budget(
        r,
        merged
            .iter()
            .flat_map(|(_, limits)| limits)
            .chain(&resources),
    );
    let mut origins: Vec<Origin> = merged
        .into_iter()
        .map(|(d, limits)| {
            let limits: Vec<Limit> = limits.into_iter().map(|l| l.v).collect();
            (d, limits)
        })
        .map(|(d, limits)| Origin {
            limits,
            name: d.name.clone(),
            hosts: d.hosts.into_iter().map(|h| h.v).collect(),
            upstreams: d.upstreams,
            tls: d.tls,
            sni: d.sni,
            // Every request has a customer: the origin's name when nothing else says,
            // so a customer-keyed limit (the default inflight key) always applies.
            customer: d.customer.or_else(|| Some(d.name.clone())),
            tls_verify: d.tls_verify,
            connect_timeout: d.connect_timeout,
            read_timeout: d.read_timeout,
            upstream_protocol: d.upstream_protocol,
        })
        .collect();
    if let Some(mut acme) = acme {
        acme::resolve(r, &mut acme, &stores, &origins);
        tls.acme = Some(acme.v);
    }
    let unmatched = origins
        .last()
        .is_some_and(|o| o.name == origin::UNMATCHED)
        .then(|| origins.pop())
        .flatten();
    Some(Config {
        server: server.server,
        api,
        segments,
        stores,
        local_store,
        tls,
        origins,
        unmatched,
        resources: resources.into_iter().map(|l| l.v).collect(),
        rls,
    })
}

/// `defaults: {limits: {...}, unmatched: {...}}`.
fn defaults(r: &mut Report, node: &Node) -> (Vec<LimitSpec>, Option<OriginDraft>) {
    let Some(entries) = scalar::map(r, node, "defaults") else {
        return (Vec::new(), None);
    };
    let (mut specs, mut unmatched) = (Vec::new(), None);
    for e in entries {
        match e.key.as_str() {
            "limits" => specs = parse_limits(r, &e.value, "defaults.limits"),
            "unmatched" => unmatched = Some(origin::parse_unmatched(r, e)),
            other => {
                let path = format!("defaults.{other}");
                r.error(
                    e.key_pos,
                    &path,
                    suggest::unknown("key", other, &DEFAULTS_KEYS),
                );
            }
        }
    }
    (specs, unmatched)
}
