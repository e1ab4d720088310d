//! Running an origin's limits against one request, one phase at a time, in one loop for
//! every kind.
//!
//! A request meets its limits in two phases (see `docs/architecture.md`): the
//! [`Phase::Request`] limits (quota kinds: rate, token bucket) when the request arrives, and
//! the [`Phase::Upstream`] limits (holding kinds: inflight) once an upstream server is
//! picked, because their key may name that server. Both phases run [`run`].
//!
//! **No-burn rule.** Every admission records what it took as a [`Taken`]; when a later
//! limit (of either phase) rejects, every `Taken` is undone, so a request that is turned
//! away never uses up an earlier limit's quota. **Shadow mode** evolves state exactly as
//! enforce would (a shadow rejection consumes nothing unless `strict`), so its counts
//! predict what enforcing would do; only the response differs.
//!
//! **Kill switch.** While it is on (`server.kill_switch`, or the admin API), every
//! rejection becomes a grant counted as `shadow_rejected`, exactly as if every limit were
//! in shadow mode: a misbehaving limit is neutralized at once, without an edit.
//!
//! **Counting.** `allowed` is counted once the request has passed every limit
//! ([`settle`]), so an admission that a later limit's rejection undid is counted as
//! `refunded`, never as `allowed`: `allowed + refunded + rejected + shadow_rejected +
//! skipped` is the requests that reached the limit.
//!
//! Nothing here allocates on the admit path: holds and header notes live in inline
//! `SmallVec`s in the request context.

use smallvec::SmallVec;

use crate::config::{HeadersMode, Mode};
use crate::limits::{Facts, Nanos, Verdict};
use crate::ratelog::suppressed_note;
use crate::runtime::limit::LimitRt;
use crate::runtime::limiter::{BadCost, Decision, Hold};
use crate::runtime::OriginRt;
use crate::store::stable_key_hash;

/// When a limit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// When the request arrives (`request_filter`).
    Request = 0,
    /// Once an upstream server is picked (`upstream_peer`); runs again on a retry.
    Upstream = 1,
}

/// One admission to undo if a later limit rejects (and, for holding kinds, to release when
/// the request ends).
pub struct Taken {
    /// The limit's phase.
    pub phase: Phase,
    /// The limit's index in its phase.
    pub limit: u16,
    /// The variant used.
    pub variant: u16,
    /// What it took.
    pub hold: Hold,
}

/// One limit's decision for one request: which limit, which variant, and the verdict. It
/// names the rejecting limit, and the limits with `headers: always` to report on an
/// admitted response.
#[derive(Debug, Clone, Copy)]
pub struct Decided {
    /// The limit's phase.
    pub phase: Phase,
    /// The limit's index in its phase.
    pub limit: u16,
    /// The variant used.
    pub variant: u16,
    /// Which of the variant's `RateLimit-Policy` members describes it (the current tier).
    pub policy: u8,
    /// The decision.
    pub verdict: Verdict,
}

/// Inline storage for admissions: four limits before spilling to the heap.
pub type Holds = SmallVec<[Taken; 4]>;
/// Inline storage for header notes.
pub type Notes = SmallVec<[Decided; 2]>;

/// Runs the limits of `phase` in config order. Admissions go into `holds`, `headers:
/// always` decisions into `notes`. On an enforced rejection everything in `holds` (both
/// phases) is undone and the rejection returned; a bad cost header undoes likewise and is
/// returned as an error (400).
///
/// A phase whose limits are all in-process never waits: callers decide it with
/// [`run_local`] instead (when `!origin.waits(phase)`), which makes the same decisions
/// without building a future per limit.
pub async fn run<F: Facts + Sync + ?Sized>(
    origin: &OriginRt,
    phase: Phase,
    facts: &F,
    now: Nanos,
    holds: &mut Holds,
    notes: &mut Notes,
) -> Result<Option<Decided>, BadCost> {
    let mut keys = KeyCache::default();
    // The kill switch turns every rejection into a grant, counted as shadow_rejected.
    let kill = origin.kill.on();
    for (index, limit) in origin.limits(phase).iter().enumerate() {
        let Some(key) = keys.key(limit, facts) else {
            limit.counters.skipped.inc();
            continue;
        };
        let v = limit.select(facts);
        let decision = limit.variants[v].limiter.decide(key, facts, now).await;
        let at = At { phase, index, v };
        if let Some(out) = record(origin, limit, at, decision, kill, now, holds, notes) {
            return out;
        }
    }
    Ok(None)
}

/// [`run`] for a phase whose limits are all in-process (`!origin.waits(phase)`): the same
/// loop, synchronous. A shared limit met here anyway (it cannot be, by `waits`) is skipped
/// rather than waited for.
pub fn run_local<F: Facts + Sync + ?Sized>(
    origin: &OriginRt,
    phase: Phase,
    facts: &F,
    now: Nanos,
    holds: &mut Holds,
    notes: &mut Notes,
) -> Result<Option<Decided>, BadCost> {
    let mut keys = KeyCache::default();
    let kill = origin.kill.on();
    for (index, limit) in origin.limits(phase).iter().enumerate() {
        let Some(key) = keys.key(limit, facts) else {
            limit.counters.skipped.inc();
            continue;
        };
        let v = limit.select(facts);
        let Some(decision) = limit.variants[v].limiter.decide_local(key, facts, now) else {
            limit.counters.skipped.inc();
            continue;
        };
        let at = At { phase, index, v };
        if let Some(out) = record(origin, limit, at, decision, kill, now, holds, notes) {
            return out;
        }
    }
    Ok(None)
}

/// Where a decision was made: phase, limit index, variant index.
#[derive(Clone, Copy)]
struct At {
    phase: Phase,
    index: usize,
    v: usize,
}

/// Acts on one limit's decision: keeps what it took, counts and logs a shadow rejection,
/// or undoes everything on an enforced rejection or a bad cost. `Some` ends the phase
/// with that result; `None` goes on to the next limit.
#[allow(clippy::too_many_arguments)]
#[inline]
fn record(
    origin: &OriginRt,
    limit: &LimitRt,
    at: At,
    decision: Result<Decision, BadCost>,
    kill: bool,
    now: Nanos,
    holds: &mut Holds,
    notes: &mut Notes,
) -> Option<Result<Option<Decided>, BadCost>> {
    let decision = match decision {
        Ok(decision) => decision,
        Err(e) => {
            undo(origin, holds, now);
            return Some(Err(e));
        }
    };
    let variant = &limit.variants[at.v];
    let verdict = decision.verdict;
    let decided = Decided {
        phase: at.phase,
        limit: at.index as u16,
        variant: at.v as u16,
        policy: decision.policy,
        verdict,
    };
    if let Some(hold) = decision.hold {
        holds.push(Taken {
            phase: at.phase,
            limit: decided.limit,
            variant: decided.variant,
            hold,
        });
    } else if !verdict.allowed && (variant.mode == Mode::Shadow || kill) {
        limit.counters.shadow_rejected.inc();
        if let Some(suppressed) = limit.log.admit(now) {
            log::info!(
                "shadow: limit `{}` of origin `{}` would reject ({}){}",
                limit.name,
                origin.name,
                variant.policy.text,
                suppressed_note(suppressed)
            );
        }
    } else if !verdict.allowed {
        limit.counters.rejected.inc();
        undo(origin, holds, now);
        return Some(Ok(Some(decided)));
    }
    if limit.headers == HeadersMode::Always {
        notes.push(decided);
    }
    None
}

/// The keys of one phase of one request, each hashed at most once: limits that share a key
/// spec (the runtime numbers an origin's distinct specs) reuse the hash. Fixed-size, on
/// the stack; a spec numbered past its size is simply hashed each time.
#[derive(Default)]
struct KeyCache {
    hashes: [u64; 16],
    /// Bit `i`: slot `i` was computed (as `hashes[i]`, or as missing when `missing` has it).
    known: u16,
    missing: u16,
}

impl KeyCache {
    /// The key of `limit` for this request: state shared through a store is named by the
    /// portable hash every instance computes alike; in-process state by the fast one,
    /// shared between limits.
    #[inline]
    fn key<F: Facts + ?Sized>(&mut self, limit: &LimitRt, facts: &F) -> Option<u64> {
        if limit.shared {
            stable_key_hash(&limit.key, facts)
        } else {
            self.hash(limit, facts)
        }
    }

    fn hash<F: Facts + ?Sized>(&mut self, limit: &LimitRt, facts: &F) -> Option<u64> {
        let slot = limit.key_slot;
        let Some(bit) = u16::try_from(slot)
            .ok()
            .and_then(|s| 1u16.checked_shl(s.into()))
        else {
            return limit.key.hash(facts);
        };
        if self.known & bit != 0 {
            return (self.missing & bit == 0).then(|| self.hashes[slot]);
        }
        self.known |= bit;
        let hash = limit.key.hash(facts);
        match hash {
            Some(h) => self.hashes[slot] = h,
            None => self.missing |= bit,
        }
        hash
    }
}

/// The limit a hold or decision refers to.
pub fn limit_of(origin: &OriginRt, phase: Phase, limit: u16) -> Option<&LimitRt> {
    origin.limits(phase).get(usize::from(limit))
}

/// Gives back everything in `holds`: a limit rejected the request. Each undone admission
/// counts as `refunded`.
pub fn undo(origin: &OriginRt, holds: &mut Holds, now: Nanos) {
    for t in holds.drain(..) {
        let Some(limit) = limit_of(origin, t.phase, t.limit) else {
            continue;
        };
        limit.counters.refunded.inc();
        if let Some(variant) = limit.variants.get(usize::from(t.variant)) {
            variant.limiter.undo(t.hold, now);
        }
    }
}

/// The request passed every limit: counts each admission as `allowed`, once. Request-time
/// admissions are done with (nothing is given back when the request ends); holding kinds
/// stay in `holds` until the upstream is done.
pub fn settle(origin: &OriginRt, holds: &mut Holds) {
    holds.retain(|t| {
        if let Some(limit) = limit_of(origin, t.phase, t.limit) {
            limit.counters.allowed.inc();
        }
        t.hold.held_upstream()
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::limits::{Fact, KeyPart};
    use crate::runtime::tests::block_on;

    /// Counts how often a key part is read.
    struct Counting(AtomicUsize);

    impl Facts for Counting {
        fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            (*part == KeyPart::Method).then_some(Fact::Bytes(b"GET"))
        }
    }

    #[test]
    fn limits_sharing_a_key_hash_it_once_per_phase() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        let text = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      r1: {kind: rate, key: [method], max: 9, per: 1s}\n      r2: {kind: rate, key: [method], max: 9, per: 1s}\n      tb: {kind: token_bucket, key: [method], capacity: 9, refill: {amount: 1, every: 1s}}\n      absent: {kind: rate, key: [path], max: 9, per: 1s}\n      absent2: {kind: rate, key: [path], max: 9, per: 1s}\n";
        let config = crate::config::parse_str(text, "t.yaml").unwrap().config;
        let (rt, _) =
            crate::runtime::Runtime::build(std::sync::Arc::new(config), None, &metrics).unwrap();
        let facts = Counting(AtomicUsize::new(0));
        let (mut holds, mut notes) = (Holds::new(), Notes::new());
        let out = block_on(run(
            &rt.origins[0],
            Phase::Request,
            &facts,
            0,
            &mut holds,
            &mut notes,
        ));
        assert!(matches!(out, Ok(None)));
        assert_eq!(holds.len(), 3);
        // One read for [method], one for the missing [path], shared by two limits each.
        assert_eq!(facts.0.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn run_local_decides_as_run_does() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        let text = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      tb: {kind: token_bucket, key: [method], capacity: 3, refill: {amount: 1, every: 1s}, headers: always}\n      r: {kind: rate, key: [method], max: 2, per: 1s}\n";
        let config = crate::config::parse_str(text, "t.yaml").unwrap().config;
        let (rt, _) =
            crate::runtime::Runtime::build(std::sync::Arc::new(config), None, &metrics).unwrap();
        let origin = &rt.origins[0];
        assert!(!origin.waits(Phase::Request));
        let facts = Counting(AtomicUsize::new(0));
        let mut outcomes = [Vec::new(), Vec::new()];
        // Two fresh runtimes would be needed to compare state; instead, one key per loop:
        // `run` at second 0 and `run_local` at second 10, each from full state.
        for (i, base) in [0u64, 10_000_000_000].into_iter().enumerate() {
            for n in 0..4u64 {
                let (mut holds, mut notes) = (Holds::new(), Notes::new());
                let now = base + n;
                let out = if i == 0 {
                    block_on(run(
                        origin,
                        Phase::Request,
                        &facts,
                        now,
                        &mut holds,
                        &mut notes,
                    ))
                } else {
                    run_local(origin, Phase::Request, &facts, now, &mut holds, &mut notes)
                };
                let rejected = out.unwrap().map(|d| (d.limit, d.verdict.remaining));
                settle(origin, &mut holds);
                outcomes[i].push((rejected, notes.len(), holds.len()));
            }
        }
        assert_eq!(outcomes[0], outcomes[1]);
        // Two pass both limits, the third is refused by the rate limit (index 1) and its
        // token is given back.
        assert_eq!(outcomes[0][2].0, Some((1, 0)));
        assert_eq!(origin.request_limits[0].counters.refunded.get(), 4);
    }
}
