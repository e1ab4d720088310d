//! Limiter state to snapshot sections and back: which limiters are saved, how each is
//! identified, and the records of each kind.
//!
//! Saved: the in-process token buckets, rate windows, sliding logs and tiers, the kinds
//! whose state outlives a request. Not saved: inflight and concurrency (units held by
//! requests of this process, which end with it), the tiered global limit (one second of
//! count), and limits in a shared store (their state is in Redis).
//!
//! ```text
//! section = 0x01 kind:u8 label:str identity:blob shape:blob [tiers:u32 rings:u32] record* 0x00
//! record  = 0x01 key:u64 ...
//!   token_bucket  tokens:u64 last:u64
//!   rate          period_start:u64 prev:u64 curr:u64
//!   sliding_log   n:u32 entry:u64 * n
//!   tiered        entered:u64 * tiers (u64::MAX: never)  (n:u32 hit:u64 * n) * rings
//! ```
//!
//! A section is matched to a live limiter by its identity (the bytes of the [`StateId`]
//! a reload matches state by: origin, limit, override match, key parts) and its shape (every
//! parameter that shapes the state, `max_keys` included), compared byte for byte: a state
//! whose identity or shape is no longer in the config is skipped. Every time is written as
//! Unix nanoseconds and mapped back into the loading process's clock ([`TimeMap`]).

use std::collections::HashMap;
use std::io::{self, Read, Write};

use crate::config::rls::RLS_ORIGIN;
use crate::limits::tiered::TieredLimiter;
use crate::limits::tiered::{MAX_LIMIT, MAX_TIERS};
use crate::limits::{BucketEntry, MatchValue, Nanos, RateWindowEntry, Restored, TieredEntry};
use crate::limits::{RateLimiter, SlidingLog, TokenBucket};
use crate::runtime::limit::StateId;
use crate::runtime::limiter::{Limiter, RateRt, SlidingLogRt, TieredRt, TokenBucketRt};
use crate::runtime::place::Place;
use crate::runtime::Runtime;
use crate::snapshot::format::{corrupt, FormatError, Sink, Source, MAX_BLOB};

/// Section and record tags.
const MORE: u8 = 1;
const DONE: u8 = 0;

/// A tiered entry time meaning "never entered".
const NEVER: Nanos = Nanos::MAX;

/// Maps instants between a process's clock and Unix time, from one reading of both.
#[derive(Debug, Clone, Copy)]
pub struct TimeMap {
    mono: Nanos,
    wall: Nanos,
}

impl TimeMap {
    /// The map of a clock reading `mono` while the wall clock reads `wall` (Unix ns).
    pub fn new(mono: Nanos, wall: Nanos) -> Self {
        Self { mono, wall }
    }

    /// The process's instant `t` in Unix nanoseconds.
    pub fn to_wall(&self, t: Nanos) -> u64 {
        shift(t, self.mono, self.wall)
    }

    /// Unix nanoseconds `w` as the process's instant.
    pub fn from_wall(&self, w: u64) -> Nanos {
        shift(w, self.wall, self.mono)
    }
}

/// `t - from + to`, kept within `[0, u64::MAX - 1]` (`u64::MAX` is the "never" of tiers).
fn shift(t: u64, from: u64, to: u64) -> u64 {
    let v = i128::from(t) - i128::from(from) + i128::from(to);
    v.clamp(0, i128::from(u64::MAX - 1)) as u64
}

/// A kind of saved state, as numbered in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SavedKind {
    /// `token_bucket`.
    TokenBucket = 1,
    /// `rate`.
    Rate = 2,
    /// `sliding_log`.
    SlidingLog = 3,
    /// `tiered`.
    Tiered = 4,
}

impl SavedKind {
    const ALL: [SavedKind; 4] = [
        SavedKind::TokenBucket,
        SavedKind::Rate,
        SavedKind::SlidingLog,
        SavedKind::Tiered,
    ];

    fn of(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == code)
    }

    /// The config's name of the kind (a metrics label).
    pub fn name(self) -> &'static str {
        match self {
            SavedKind::TokenBucket => "token_bucket",
            SavedKind::Rate => "rate",
            SavedKind::SlidingLog => "sliding_log",
            SavedKind::Tiered => "tiered",
        }
    }
}

/// Keys per saved kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KindCounts(pub [u64; 4]);

impl KindCounts {
    fn add(&mut self, kind: SavedKind) {
        self.0[kind as usize - 1] += 1;
    }

    /// The count of `kind`.
    pub fn get(&self, kind: SavedKind) -> u64 {
        self.0[kind as usize - 1]
    }

    /// Every kind's count.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `token_bucket 3, rate 0, ...` for the logs.
    pub fn describe(&self) -> String {
        SavedKind::ALL
            .iter()
            .map(|k| format!("{} {}", k.name(), self.get(*k)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What a load did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys restored, per kind.
    pub restored: KindCounts,
    /// Keys whose state was equal to a new key's by now (refilled, expired): nothing lost.
    pub empty: u64,
    /// Keys that found no free slot (a table fuller than the one they came from).
    pub no_room: u64,
    /// Sections whose identity or shape is no longer in the config.
    pub skipped_sections: u64,
    /// Keys in those sections.
    pub skipped_keys: u64,
}

/// A live limiter whose state is in this process (`state`), with its parameters (the
/// variant's, read through it).
struct Local<'a, R, S> {
    rt: &'a R,
    state: &'a S,
}

impl<'a, R, S> Local<'a, R, S> {
    /// `rt` with the state its `place` keeps in this process; `None` for a shared limit.
    fn of<T>(rt: &'a R, place: &'a Place<S, T>) -> Option<Self> {
        let state = place.local()?;
        Some(Self { rt, state })
    }
}

impl<R, S> Clone for Local<'_, R, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R, S> Copy for Local<'_, R, S> {}

impl<R, S> std::ops::Deref for Local<'_, R, S> {
    type Target = R;

    fn deref(&self) -> &R {
        self.rt
    }
}

/// A live limiter whose state is saved: the in-process state of a kind that keeps per-key
/// state in a table (a shared limiter's state is in its store).
#[derive(Clone, Copy)]
enum Saved<'a> {
    TokenBucket(Local<'a, TokenBucketRt, TokenBucket>),
    Rate(Local<'a, RateRt, RateLimiter>),
    SlidingLog(Local<'a, SlidingLogRt, SlidingLog>),
    Tiered(Local<'a, TieredRt, TieredLimiter>),
}

impl<'a> Saved<'a> {
    fn of(limiter: &'a Limiter) -> Option<Self> {
        Some(match limiter {
            Limiter::TokenBucket(rt) => Saved::TokenBucket(Local::of(rt, &rt.state)?),
            Limiter::Rate(rt) => Saved::Rate(Local::of(rt, &rt.state)?),
            Limiter::SlidingLog(rt) => Saved::SlidingLog(Local::of(rt, &rt.state)?),
            Limiter::Tiered(rt) => Saved::Tiered(Local::of(rt, &rt.state)?),
            Limiter::Inflight(_) | Limiter::Concurrency(_) => return None,
        })
    }

    fn kind(self) -> SavedKind {
        match self {
            Saved::TokenBucket(_) => SavedKind::TokenBucket,
            Saved::Rate(_) => SavedKind::Rate,
            Saved::SlidingLog(_) => SavedKind::SlidingLog,
            Saved::Tiered(_) => SavedKind::Tiered,
        }
    }

    /// Every parameter that shapes the state, as bytes: equal bytes, same shape.
    fn shape(self) -> Vec<u8> {
        let mut b = Blob::default();
        match self {
            Saved::TokenBucket(l) => {
                let p = l.state.params();
                b.u64(p.capacity).u64(p.amount).u64(p.every);
                b.u64(u64::from(p.strict)).u64(l.max_keys as u64);
            }
            Saved::Rate(l) => {
                b.u64(l.rate.per).u64(l.max_keys as u64);
            }
            Saved::SlidingLog(l) => {
                b.u64(l.windows.len() as u64);
                for w in &l.windows {
                    b.u64(w.max).u64(w.per);
                }
                b.u64(l.max_keys as u64);
            }
            Saved::Tiered(l) => {
                let p = &l.params;
                b.u64(p.tiers.len() as u64);
                for t in &p.tiers {
                    b.u64(t.limit).u64(t.window).u64(t.active).u64(t.cooldown);
                    b.u64(u64::from(t.skippable));
                }
                b.u64(p.hard_limit.map_or(0, |h| h + 1));
                b.u64(p.global_limit.map_or(0, |g| g + 1));
                b.u64(l.max_keys as u64);
            }
        }
        b.0
    }

    /// (tiers, rings) of a tiered limiter's records.
    fn tier_layout(self) -> Option<(u32, u32)> {
        match self {
            Saved::Tiered(l) => {
                let tiers = l.state.params().tiers.len() as u32;
                Some((tiers, tiers + 1))
            }
            Saved::TokenBucket(_) | Saved::Rate(_) | Saved::SlidingLog(_) => None,
        }
    }

    /// Slots the table holds: whole sets of 8.
    fn slots(self) -> u64 {
        let max_keys = match self {
            Saved::TokenBucket(l) => l.max_keys,
            Saved::Rate(l) => l.max_keys,
            Saved::SlidingLog(l) => l.max_keys,
            Saved::Tiered(l) => l.max_keys,
        };
        (max_keys.max(1) as u64).div_ceil(8) * 8
    }

    /// The most bytes one record of this limiter takes.
    fn record_bytes(self) -> u64 {
        9 + match self {
            Saved::TokenBucket(_) => 16,
            Saved::Rate(_) => 24,
            Saved::SlidingLog(l) => 4 + 8 * u64::from(l.state.entries_per_key()),
            Saved::Tiered(l) => {
                let p = l.state.params();
                let hits: u64 =
                    p.tiers.iter().map(|t| t.limit).sum::<u64>() + p.hard_limit.unwrap_or(0);
                let tiers = p.tiers.len() as u64;
                8 * tiers + 4 * (tiers + 1) + 8 * hits
            }
        }
    }
}

/// Bytes built for an identity or a shape.
#[derive(Default)]
struct Blob(Vec<u8>);

impl Blob {
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }
}

/// The identity of a variant's state as bytes: origin, limit, key parts, override match.
pub fn identity(id: &StateId) -> Vec<u8> {
    let mut b = Blob::default();
    b.bytes(id.origin.as_bytes()).bytes(id.limit.as_bytes());
    b.u64(id.key.parts().len() as u64);
    for part in id.key.parts() {
        b.bytes(part.to_string().as_bytes());
    }
    match &id.matchers {
        None => {
            b.u64(0);
        }
        Some(ms) => {
            b.u64(1 + ms.len() as u64);
            for m in ms {
                b.bytes(m.part.to_string().as_bytes());
                match &m.value {
                    MatchValue::Exact(v) => b.u64(0).bytes(v),
                    MatchValue::Net(n) => b.u64(1).bytes(n.to_string().as_bytes()),
                    MatchValue::Addr(a) => b.u64(2).bytes(a.to_string().as_bytes()),
                    MatchValue::Segment(s) => b.u64(3).bytes(s.as_bytes()),
                    MatchValue::Prefix(v) => b.u64(4).bytes(v),
                };
            }
        }
    }
    b.0
}

/// Every saved limiter of `rt`, with its label (for logs), identity and kind.
fn saved(rt: &Runtime) -> Vec<(String, Vec<u8>, Saved<'_>)> {
    let mut out = Vec::new();
    for o in &rt.origins {
        for l in o.all_limits() {
            for (i, (id, limiter)) in l.states(&o.name).enumerate() {
                let Some(s) = Saved::of(limiter) else {
                    continue;
                };
                let label = match i {
                    0 => format!("{}/{}", o.name, l.name),
                    i => format!("{}/{} override {}", o.name, l.name, i - 1),
                };
                out.push((label, identity(&id), s));
            }
        }
    }
    // The rate limit service's rules, in the process's store (a shared store's are not
    // saved): one variant each.
    for l in rt.rls.limits() {
        for (id, limiter) in l.states(RLS_ORIGIN) {
            if let Some(s) = Saved::of(limiter) {
                out.push((format!("{RLS_ORIGIN}/{}", l.name), identity(&id), s));
            }
        }
    }
    out
}

/// The most bytes a snapshot of `rt` can take: every table full, every log at its longest.
pub fn max_bytes(rt: &Runtime) -> u64 {
    let sections: u64 = saved(rt)
        .iter()
        .map(|(label, id, s)| {
            let head = 64 + label.len() as u64 + id.len() as u64 + s.shape().len() as u64;
            head.saturating_add(s.slots().saturating_mul(s.record_bytes()))
        })
        .fold(0, u64::saturating_add);
    sections.saturating_add(2 * crate::snapshot::format::MAX_TEXT as u64 + 1024)
}

/// Writes every saved limiter of `rt` as sections, times mapped by `map`; returns the keys
/// written per kind. Each table is read one set (or one way) at a time: decisions are
/// never blocked for longer than one copy.
pub fn write_all<W: Write>(
    sink: &mut Sink<W>,
    rt: &Runtime,
    map: &TimeMap,
) -> io::Result<KindCounts> {
    let mut counts = KindCounts::default();
    for (label, id, s) in saved(rt) {
        if id.len() > MAX_BLOB as usize {
            log::warn!("snapshot: `{label}` not saved: its identity is over {MAX_BLOB} bytes");
            continue;
        }
        sink.u8(MORE)?;
        sink.u8(s.kind() as u8)?;
        sink.text(&label)?;
        sink.bytes(&id)?;
        sink.bytes(&s.shape())?;
        if let Some((tiers, rings)) = s.tier_layout() {
            sink.u32(tiers)?;
            sink.u32(rings)?;
        }
        let mut result = Ok(());
        let mut written = 0;
        let mut record = |sink: &mut Sink<W>, f: &mut dyn FnMut(&mut Sink<W>) -> io::Result<()>| {
            if result.is_ok() {
                result = sink.u8(MORE).and_then(|()| f(sink));
                written += 1;
            }
        };
        match s {
            Saved::TokenBucket(l) => l.state.export(|e| {
                record(sink, &mut |w| {
                    w.u64(e.key)?;
                    w.u64(e.tokens)?;
                    w.u64(map.to_wall(e.last))
                })
            }),
            Saved::Rate(l) => {
                let per = l.state.per();
                l.state.export(|e| {
                    record(sink, &mut |w| {
                        w.u64(e.key)?;
                        w.u64(map.to_wall(e.period.saturating_mul(per)))?;
                        w.u64(e.prev)?;
                        w.u64(e.curr)
                    })
                })
            }
            Saved::SlidingLog(l) => {
                let mut buf = Vec::new();
                l.state.export(&mut buf, |key, entries| {
                    record(sink, &mut |w| {
                        w.u64(key)?;
                        w.u32(entries.len() as u32)?;
                        entries.iter().try_for_each(|t| w.u64(map.to_wall(*t)))
                    })
                })
            }
            Saved::Tiered(l) => {
                let mut entry = TieredEntry::default();
                l.state.export(&mut entry, |e| {
                    record(sink, &mut |w| {
                        w.u64(e.key)?;
                        for at in &e.entered {
                            w.u64(if *at == NEVER {
                                NEVER
                            } else {
                                map.to_wall(*at)
                            })?;
                        }
                        for hits in &e.hits {
                            w.u32(hits.len() as u32)?;
                            hits.iter().try_for_each(|t| w.u64(map.to_wall(*t)))?;
                        }
                        Ok(())
                    })
                })
            }
        }
        result?;
        for _ in 0..written {
            counts.add(s.kind());
        }
        sink.u8(DONE)?;
    }
    Ok(counts)
}

/// Reads the sections after the header and restores each whose identity and shape `rt`
/// still has, at `now` (the process's clock), times mapped by `map`; without `rt`, only
/// checks that every section parses. Memory is bounded by one record: a sliding log's
/// entries or a tiered key's hits, at most what its table holds per key.
pub fn read_all<R: Read>(
    src: &mut Source<R>,
    rt: Option<&Runtime>,
    map: &TimeMap,
    now: Nanos,
) -> Result<LoadReport, FormatError> {
    let live: HashMap<(SavedKind, Vec<u8>), Saved<'_>> = rt
        .map(saved)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, id, s)| ((s.kind(), id), s))
        .collect();
    let mut report = LoadReport::default();
    let mut buf: Vec<Nanos> = Vec::new();
    let mut entry = TieredEntry::default();
    while src.u8()? == MORE {
        let kind = SavedKind::of(src.u8()?).ok_or_else(|| corrupt("unknown kind"))?;
        let label = src.text("label")?;
        let id = src.bytes(MAX_BLOB, "identity")?;
        let shape = src.bytes(MAX_BLOB, "shape")?;
        let layout = if kind == SavedKind::Tiered {
            let (tiers, rings) = (src.u32()?, src.u32()?);
            if tiers as usize > MAX_TIERS || rings != tiers + 1 {
                return Err(corrupt("a tiered section's layout"));
            }
            Some((tiers, rings))
        } else {
            None
        };
        let target = live
            .get(&(kind, id))
            .copied()
            .filter(|s| s.shape() == shape && s.tier_layout() == layout);
        if target.is_none() && rt.is_some() {
            log::debug!("snapshot: skipped `{label}`: no limit with its identity and shape");
            report.skipped_sections += 1;
        }
        while src.u8()? == MORE {
            let key = src.u64()?;
            let Some(target) = target else {
                skip_record(src, kind, layout)?;
                report.skipped_keys += 1;
                continue;
            };
            let restored = match target {
                Saved::TokenBucket(l) => {
                    let e = BucketEntry {
                        key,
                        tokens: src.u64()?,
                        last: map.from_wall(src.u64()?),
                    };
                    l.state.import(e, now)
                }
                Saved::Rate(l) => {
                    let per = l.state.per();
                    let start = map.from_wall(src.u64()?);
                    let e = RateWindowEntry {
                        key,
                        // Periods are aligned to the clock's zero, near Unix time in every
                        // process: the nearest period is the one it was.
                        period: start.saturating_add(per / 2) / per,
                        prev: src.u64()?,
                        curr: src.u64()?,
                    };
                    l.state.import(e, now)
                }
                Saved::SlidingLog(l) => {
                    let n = src.u32()?;
                    if n > l.state.entries_per_key() {
                        return Err(corrupt("a log longer than its ring"));
                    }
                    buf.clear();
                    for _ in 0..n {
                        buf.push(map.from_wall(src.u64()?));
                    }
                    l.state.import(key, &mut buf, now)
                }
                Saved::Tiered(l) => {
                    let (tiers, rings) = layout.unwrap_or_default();
                    entry.key = key;
                    entry.entered.clear();
                    for _ in 0..tiers {
                        let at = src.u64()?;
                        entry.entered.push(if at == NEVER {
                            NEVER
                        } else {
                            map.from_wall(at)
                        });
                    }
                    entry.hits.resize_with(rings as usize, Vec::new);
                    let p = l.state.params();
                    let limits = p.tiers.iter().map(|t| t.limit);
                    let limits = limits.chain(std::iter::once(p.hard_limit.unwrap_or(0)));
                    for (hits, limit) in entry.hits.iter_mut().zip(limits) {
                        let n = src.u32()?;
                        if u64::from(n) > limit.min(MAX_LIMIT) {
                            return Err(corrupt("a tier log longer than its limit"));
                        }
                        hits.clear();
                        for _ in 0..n {
                            hits.push(map.from_wall(src.u64()?));
                        }
                    }
                    l.state.import(&mut entry, now)
                }
            };
            match restored {
                Restored::Stored => report.restored.add(kind),
                Restored::Empty => report.empty += 1,
                Restored::NoRoom => report.no_room += 1,
            }
        }
    }
    Ok(report)
}

/// Reads past one record (after its key) of a section that is not restored.
fn skip_record<R: Read>(
    src: &mut Source<R>,
    kind: SavedKind,
    layout: Option<(u32, u32)>,
) -> Result<(), FormatError> {
    match kind {
        SavedKind::TokenBucket => src.skip(16),
        SavedKind::Rate => src.skip(24),
        SavedKind::SlidingLog => {
            let n = src.u32()?;
            src.skip(8 * u64::from(n))
        }
        SavedKind::Tiered => {
            let (tiers, rings) = layout.unwrap_or_default();
            src.skip(8 * u64::from(tiers))?;
            for _ in 0..rings {
                let n = src.u32()?;
                src.skip(8 * u64::from(n))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_map_through_unix_time_and_stay_in_range() {
        // The writer's clock read 1 000 while Unix time was 5 000; the loader's reads 300
        // at Unix 9 000: an instant 100 before the write is 4 100 before the load.
        let writer = TimeMap::new(1_000, 5_000);
        let loader = TimeMap::new(300, 9_000);
        assert_eq!(writer.to_wall(900), 4_900);
        assert_eq!(
            loader.from_wall(4_900),
            0,
            "before the loader's zero: clamped"
        );
        let loader = TimeMap::new(10_000, 9_000);
        assert_eq!(loader.from_wall(writer.to_wall(900)), 10_000 - 4_100);
        assert_eq!(writer.to_wall(u64::MAX), u64::MAX - 1);
    }
}
