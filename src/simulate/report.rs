//! What a simulation found, per origin and limit: allowed, rejected, shadow-rejected,
//! refunded and skipped counts (the runtime's own decision counters), the peak rates, the
//! top rejected keys and the `Retry-After` distribution. Rendered as JSON (`--json`) or
//! as a table for people, for one config or two side by side (`--compare`).

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::config::Mode;
use crate::limits::{Nanos, NANOS_PER_SEC};
use crate::simulate::replay::{Engine, LimitStats, RETRY_BOUNDS};
use crate::simulate::{Format, HostFrom, Input};

/// One whole run of one config.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The config file.
    pub config: String,
    /// The access log.
    pub log: String,
    /// Its format.
    pub format: Format,
    /// Where hosts came from.
    pub host_from: HostFrom,
    /// Reading the log: lines, unparseable ones (the first with numbers), clamped times.
    pub input: Input,
    /// The first line's time, RFC 3339.
    pub start: Option<String>,
    /// The newest line's time, RFC 3339.
    pub end: Option<String>,
    /// Lines whose host no origin serves (the proxy answers them 404).
    pub unrouted: u64,
    /// Lines without a host, with no `--origin` and more than one origin.
    pub hostless: u64,
    /// What was simulated differently from production (shared stores made local).
    pub notes: Vec<String>,
    /// Per origin, config order.
    pub origins: Vec<OriginReport>,
    /// Wall-clock seconds the replay took.
    pub elapsed_seconds: f64,
    /// Lines read per wall-clock second.
    pub lines_per_second: f64,
}

/// One origin.
#[derive(Debug, Clone, Serialize)]
pub struct OriginReport {
    /// Its name.
    pub name: String,
    /// Requests routed to it.
    pub requests: u64,
    /// The most requests in one second of log time.
    pub peak_rps: u64,
    /// When (RFC 3339), first reached.
    pub peak_at: Option<String>,
    /// Requests refused for a bad cost header (400).
    pub bad_cost: u64,
    /// Per limit, config order.
    pub limits: Vec<LimitReport>,
}

/// One limit.
#[derive(Debug, Clone, Serialize)]
pub struct LimitReport {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: &'static str,
    /// Its base mode: `enforce` or `shadow`.
    pub mode: &'static str,
    /// Admitted, and the request passed every limit.
    pub allowed: u64,
    /// Rejected (enforced).
    pub rejected: u64,
    /// Would have been rejected; shadow mode let it through.
    pub shadow_rejected: u64,
    /// Admitted, then given back because a later limit rejected the request.
    pub refunded: u64,
    /// The request lacked a key part: the limit did not apply.
    pub skipped: u64,
    /// The most enforced rejections in one second of log time.
    pub peak_rejected_per_second: u64,
    /// The keys rejected most, most first.
    pub top_rejected: Vec<KeyCount>,
    /// Rejections of keys beyond the ones remembered.
    pub other_keys: u64,
    /// Enforced rejections by `Retry-After` (seconds, upper bound of the bucket); `never`
    /// for a block. Empty buckets are left out.
    pub retry_after: Vec<RetryBucket>,
}

/// A rejected key and how often.
#[derive(Debug, Clone, Serialize)]
pub struct KeyCount {
    /// The key's parts, `part=value` separated by spaces.
    pub key: String,
    /// Rejections.
    pub count: u64,
}

/// One `Retry-After` bucket.
#[derive(Debug, Clone, Serialize)]
pub struct RetryBucket {
    /// `1`, `2`, ... `3600` (up to that many seconds), `>3600`, or `never`.
    pub seconds: String,
    /// Rejections.
    pub count: u64,
}

/// Unix nanoseconds as RFC 3339 (seconds).
pub fn rfc3339(t: Nanos) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(t)).to_string()
}

fn bucket_label(i: usize) -> String {
    match RETRY_BOUNDS.get(i) {
        Some(b) => b.to_string(),
        None if i == RETRY_BOUNDS.len() => format!(">{}", RETRY_BOUNDS[RETRY_BOUNDS.len() - 1]),
        None => "never".to_string(),
    }
}

fn limit_report(
    limit: &crate::runtime::limit::LimitRt,
    stats: &LimitStats,
    top: usize,
) -> LimitReport {
    let c = &limit.counters;
    let mut keys: Vec<KeyCount> = stats
        .keys
        .values()
        .map(|(count, key)| KeyCount {
            key: key.clone(),
            count: *count,
        })
        .collect();
    keys.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    keys.truncate(top);
    let mode = match limit.variants.first().map(|v| v.mode) {
        Some(Mode::Shadow) => "shadow",
        _ => "enforce",
    };
    LimitReport {
        name: limit.name.clone(),
        kind: limit.kind.name(),
        mode,
        allowed: c.allowed.get(),
        rejected: c.rejected.get(),
        shadow_rejected: c.shadow_rejected.get(),
        refunded: c.refunded.get(),
        skipped: c.skipped.get(),
        peak_rejected_per_second: stats.peak.max,
        top_rejected: keys,
        other_keys: stats.other_keys,
        retry_after: stats
            .retry_after
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| RetryBucket {
                seconds: bucket_label(i),
                count: *n,
            })
            .collect(),
    }
}

/// What the run and its inputs were, for the report's header.
pub struct Run<'a> {
    /// The config file.
    pub config: &'a str,
    /// The log file.
    pub log: &'a str,
    /// Its format.
    pub format: Format,
    /// Where hosts came from.
    pub host_from: HostFrom,
    /// How many top keys to list.
    pub top: usize,
    /// Wall-clock time of the replay.
    pub elapsed: Duration,
}

/// The report of one engine after a replay.
pub fn build(run: &Run<'_>, input: &Input, engine: &Engine) -> Report {
    let origins = engine
        .rt
        .origins
        .iter()
        .zip(&engine.origins)
        .map(|(o, s)| {
            let limits: Vec<_> = o.all_limits().zip(&s.limits).collect();
            // Config order: the runtime keeps request-phase limits before upstream ones.
            let order = engine
                .rt
                .config
                .origins
                .iter()
                .chain(&engine.rt.config.unmatched)
                .find(|c| c.name == o.name)
                .map(|c| c.limits.iter().map(|l| l.name.as_str()).collect::<Vec<_>>())
                .unwrap_or_default();
            let mut reports: Vec<LimitReport> = limits
                .iter()
                .map(|(l, st)| limit_report(l, st, run.top))
                .collect();
            reports.sort_by_key(|r| order.iter().position(|n| *n == r.name));
            OriginReport {
                name: o.name.clone(),
                requests: s.requests,
                peak_rps: s.peak.max,
                peak_at: (s.peak.max > 0).then(|| rfc3339(s.peak.at * NANOS_PER_SEC)),
                bad_cost: s.bad_cost,
                limits: reports,
            }
        })
        .collect();
    let secs = run.elapsed.as_secs_f64();
    Report {
        config: run.config.to_string(),
        log: run.log.to_string(),
        format: run.format,
        host_from: run.host_from,
        input: input.clone(),
        start: input.start.map(rfc3339),
        end: input.end.map(rfc3339),
        unrouted: engine.unrouted,
        hostless: engine.hostless,
        notes: engine.notes.clone(),
        origins,
        elapsed_seconds: secs,
        lines_per_second: if secs > 0.0 {
            input.lines as f64 / secs
        } else {
            0.0
        },
    }
}

fn header(out: &mut String, r: &Report) {
    let i = &r.input;
    let _ = writeln!(
        out,
        "{} ({}): {} lines, {} replayed, {} unparseable, {} with time clamped (time never goes backwards)",
        r.log,
        match r.format {
            Format::Combined | Format::Auto => "combined",
            Format::Jsonl => "jsonl",
        },
        i.lines,
        i.replayed,
        i.unparseable,
        i.clamped
    );
    for bad in &i.first_unparseable {
        let _ = writeln!(out, "  line {}: {}", bad.line, bad.reason);
    }
    if i.unparseable > i.first_unparseable.len() as u64 {
        let _ = writeln!(
            out,
            "  ... and {} more",
            i.unparseable - i.first_unparseable.len() as u64
        );
    }
    if let (Some(start), Some(end)) = (&r.start, &r.end) {
        let _ = writeln!(out, "log time: {start} .. {end}");
    }
    let _ = writeln!(
        out,
        "replayed in {:.2} s ({:.0} lines/s)",
        r.elapsed_seconds, r.lines_per_second
    );
}

fn notes(out: &mut String, r: &Report) {
    if r.unrouted > 0 {
        let _ = writeln!(out, "unrouted (no origin serves the host): {}", r.unrouted);
    }
    if r.hostless > 0 {
        let _ = writeln!(out, "without a host (give --origin NAME): {}", r.hostless);
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
}

/// The human table of one report.
pub fn human(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "config: {}", r.config);
    header(&mut out, r);
    notes(&mut out, r);
    for o in &r.origins {
        let _ = writeln!(
            out,
            "\norigin {}: {} requests, peak {} req/s{}{}",
            o.name,
            o.requests,
            o.peak_rps,
            o.peak_at
                .as_deref()
                .map(|t| format!(" at {t}"))
                .unwrap_or_default(),
            if o.bad_cost > 0 {
                format!(", {} bad cost header", o.bad_cost)
            } else {
                String::new()
            }
        );
        if o.limits.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<20} {:<13} {:<7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10}",
            "limit",
            "kind",
            "mode",
            "allowed",
            "rejected",
            "shadow",
            "refunded",
            "skipped",
            "peak rej/s"
        );
        for l in &o.limits {
            let _ = writeln!(
                out,
                "  {:<20} {:<13} {:<7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10}",
                l.name,
                l.kind,
                l.mode,
                l.allowed,
                l.rejected,
                l.shadow_rejected,
                l.refunded,
                l.skipped,
                l.peak_rejected_per_second
            );
        }
        for l in o.limits.iter().filter(|l| l.rejected > 0) {
            let _ = writeln!(out, "  {}:", l.name);
            let retry: Vec<String> = l
                .retry_after
                .iter()
                .map(|b| match b.seconds.as_str() {
                    "never" => format!("never: {}", b.count),
                    s => format!("<={s}s: {}", b.count),
                })
                .collect();
            let _ = writeln!(out, "    Retry-After  {}", retry.join("  "));
            for k in &l.top_rejected {
                let _ = writeln!(out, "    {:>10}  {}", k.count, k.key);
            }
            if l.other_keys > 0 {
                let _ = writeln!(out, "    {:>10}  (other keys)", l.other_keys);
            }
        }
    }
    out
}

fn find_limit<'r>(origin: Option<&'r OriginReport>, name: &str) -> Option<&'r LimitReport> {
    origin.and_then(|o| o.limits.iter().find(|l| l.name == name))
}

/// Two reports side by side: every limit of either config, old and new counts.
pub fn human_compare(old: &Report, new: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "old: {}\nnew: {}", old.config, new.config);
    header(&mut out, old);
    for (tag, r) in [("old", old), ("new", new)] {
        let mut part = String::new();
        notes(&mut part, r);
        for line in part.lines() {
            let _ = writeln!(out, "{tag} {line}");
        }
    }
    let mut names: Vec<&str> = old.origins.iter().map(|o| o.name.as_str()).collect();
    for o in &new.origins {
        if !names.contains(&o.name.as_str()) {
            names.push(&o.name);
        }
    }
    for name in names {
        let (a, b) = (
            old.origins.iter().find(|o| o.name == name),
            new.origins.iter().find(|o| o.name == name),
        );
        let reqs = |o: Option<&OriginReport>| o.map_or("-".to_string(), |o| o.requests.to_string());
        let _ = writeln!(
            out,
            "\norigin {name}: {} requests (old) / {} (new)",
            reqs(a),
            reqs(b)
        );
        let _ = writeln!(
            out,
            "  {:<20} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "limit",
            "allowed old",
            "allowed new",
            "rejected old",
            "rejected new",
            "shadow old",
            "shadow new"
        );
        let mut limits: Vec<&str> = a
            .map(|o| o.limits.iter().map(|l| l.name.as_str()).collect())
            .unwrap_or_default();
        for l in b.iter().flat_map(|o| &o.limits) {
            if !limits.contains(&l.name.as_str()) {
                limits.push(&l.name);
            }
        }
        for limit in limits {
            let (x, y) = (find_limit(a, limit), find_limit(b, limit));
            let cell = |l: Option<&LimitReport>, f: fn(&LimitReport) -> u64| {
                l.map_or("-".to_string(), |l| f(l).to_string())
            };
            let _ = writeln!(
                out,
                "  {:<20} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
                limit,
                cell(x, |l| l.allowed),
                cell(y, |l| l.allowed),
                cell(x, |l| l.rejected),
                cell(y, |l| l.rejected),
                cell(x, |l| l.shadow_rejected),
                cell(y, |l| l.shadow_rejected),
            );
        }
    }
    out
}
