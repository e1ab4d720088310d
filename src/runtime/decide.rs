//! Running an origin's limits against one request, one phase at a time, in one loop for
//! every kind.
//!
//! A request meets its limits in two phases (see `docs/architecture.md`): the
//! [`Phase::Request`] limits (the quota kinds: rate, token bucket, sliding log, tiered) when
//! the request arrives, and the [`Phase::Upstream`] limits (the holding kinds: inflight,
//! concurrency) once an upstream server is picked, because their key may name that server.
//! Both phases run [`run`], one loop for all six kinds, whose state lives in this process or
//! in a shared store alike: each limit is one [`Limiter::decide`](crate::runtime::limiter::Limiter::decide),
//! or, in this process, its synchronous half
//! [`Limiter::decide_into`](crate::runtime::limiter::Limiter::decide_into) (no future, and
//! the hold pushed straight into the request's holds).
//!
//! **Holds.** An admission records what it took (a [`Hold`], one per kind, saying whether
//! this process or a store took it); an undo gives it back to the same place, and a hold
//! its limiter did not take is logged as the bug it is, never silently dropped.
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
//! **Store budget.** A phase's shared limits share one store budget ([`budget::phase`]):
//! the first store call starts it, later calls get what is left, and a limit reached after
//! it is spent is decided by its fallback at once. A phase without shared limits opens no
//! budget (nothing would read it).
//!
//! **Counting.** `allowed` is counted once the request has passed every limit
//! ([`settle`]), so an admission that a later limit's rejection undid is counted as
//! `refunded`, never as `allowed`: `allowed + refunded + rejected + shadow_rejected +
//! skipped` is the requests that reached the limit.
//!
//! **Heavy hitters.** A limit with `top_keys` counts each decision in its
//! [`HeavyHitters`](crate::limits::HeavyHitters) (admitted or rejected, by the verdict
//! before shadow and kill switch), for the admin API's `/top`.
//!
//! Nothing here allocates on the admit path: holds and header notes live in inline
//! `SmallVec`s in the request context.

use smallvec::SmallVec;

use crate::config::{HeadersMode, Mode};
use crate::limits::{Facts, Nanos, Verdict};
use crate::log_budget::suppressed_note;
use crate::runtime::admission::Judged;
use crate::runtime::limit::{LimitRt, Variant};
use crate::runtime::limiter::{BadCost, Decision, Hold};
use crate::runtime::OriginRt;
use crate::store::redis::gather::together;
use crate::store::{budget, stable_key_hash};

/// When a limit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// When the request arrives (`request_filter`).
    Request,
    /// Once an upstream server is picked (`upstream_peer`); runs again on a retry.
    Upstream,
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

/// A limit met in a phase: which, which variant, on which key.
#[derive(Clone, Copy)]
struct Met {
    limit: u16,
    variant: u16,
    key: u64,
}

/// Inline storage for a phase's shared limits, decided after its local ones.
type Deferred = SmallVec<[Met; 4]>;

/// Runs the limits of `phase`: the local ones in config order, then the shared ones all at
/// once (one round trip per store, see below). Admissions go into `holds`, `headers:
/// always` decisions and shadow rejections into `notes` (in config order). On an enforced
/// rejection everything in `holds` (both phases) is undone and the rejection returned; a
/// bad cost header undoes likewise and is returned as an error (400).
///
/// **One round trip per phase.** A local rejection ends the phase before any store call.
/// The shared limits that remain are decided concurrently under
/// [`together`](crate::store::redis::gather::together), so their script calls leave as
/// one pipeline per store (leased hot keys and deny-cache hits make none); their answers
/// are then taken in config order, exactly as the loop would have taken them one by one:
/// the first enforced rejection is the one returned, and a limit after it is not counted
/// (it was not reached), its admission given back.
pub async fn run<F: Facts + Sync + ?Sized>(
    origin: &OriginRt,
    phase: Phase,
    facts: &F,
    now: Nanos,
    holds: &mut Holds,
    notes: &mut Notes,
) -> Result<Option<Decided>, BadCost> {
    let at = At {
        origin,
        phase,
        // The kill switch turns every rejection into a grant, counted as shadow_rejected.
        kill: origin.kill.on(),
        now,
    };
    let noted = notes.len();
    let mut shared = Deferred::new();
    // The local limits decide synchronously: no future, no store budget.
    if let Some(end) = at.local(facts, holds, notes, &mut shared) {
        return end;
    }
    if shared.is_empty() {
        return Ok(None);
    }
    // One store budget for every shared limit of the phase (docs/architecture.md): only
    // store calls use it, so it is opened once a shared limit remains.
    let out = budget::phase(at.shared(&shared, facts, holds, notes)).await;
    // Shared limits were noted after the local ones: config order again (the phase's
    // indexes are distinct, so an unstable sort is exact, and it does not allocate).
    if let Some(tail) = notes.get_mut(noted..) {
        tail.sort_unstable_by_key(|d| d.limit);
    }
    out
}

/// What every decision of one phase of one request shares.
#[derive(Clone, Copy)]
struct At<'a> {
    origin: &'a OriginRt,
    phase: Phase,
    kill: bool,
    now: Nanos,
}

/// The variant `v` of `limit` (`select` returns an index in range).
fn variant_of(limit: &LimitRt, v: usize) -> &Variant {
    &limit.variants[v]
}

type Ended = Result<Option<Decided>, BadCost>;

impl At<'_> {
    /// Decides the phase's local limits in config order, synchronously, and leaves its
    /// shared limits in `shared`; `Some` when the phase ends here (see [`At::take`]).
    fn local<F: Facts + ?Sized>(
        self,
        facts: &F,
        holds: &mut Holds,
        notes: &mut Notes,
        shared: &mut Deferred,
    ) -> Option<Ended> {
        let mut keys = KeyCache::default();
        for (index, limit) in self.origin.limits(self.phase).iter().enumerate() {
            // A request its `match:` does not pick passes the limit untouched.
            if !limit.applies(facts) {
                limit.counters.skipped.inc();
                continue;
            }
            // State shared through a store is named by the portable hash every instance
            // computes alike; in-process state by the fast one, shared between limits.
            let key = if limit.shared {
                stable_key_hash(&limit.key, facts)
            } else {
                keys.hash(limit, facts)
            };
            let Some(key) = key else {
                limit.counters.skipped.inc();
                continue;
            };
            let v = limit.select(facts);
            let met = Met {
                limit: index as u16,
                variant: v as u16,
                key,
            };
            if limit.shared {
                shared.push(met);
                continue;
            }
            // An admission's hold goes straight into `holds`.
            let put = |hold| holds.push(self.taken(met, hold));
            let judged = variant_of(limit, v)
                .limiter
                .decide_into(key, facts, self.now, put);
            // A limit in a store (every variant of it is) is decided with the others.
            let Some(judged) = judged else {
                shared.push(met);
                continue;
            };
            let end = match judged {
                Ok(j) => self.judge(limit, met, j, facts, holds, notes),
                Err(e) => {
                    undo(self.origin, holds, self.now);
                    Some(Err(e))
                }
            };
            if end.is_some() {
                return end;
            }
        }
        None
    }

    /// Decides the phase's shared limits together and takes their answers in config order.
    async fn shared<F: Facts + Sync + ?Sized>(
        self,
        shared: &[Met],
        facts: &F,
        holds: &mut Holds,
        notes: &mut Notes,
    ) -> Ended {
        let limits = self.origin.limits(self.phase);
        let decide = |d: &Met| {
            let limit = &limits[usize::from(d.limit)];
            let variant = variant_of(limit, usize::from(d.variant));
            variant.limiter.decide(d.key, facts, self.now)
        };
        let [one] = shared else {
            let all = shared.iter().map(decide);
            let decisions = together(futures_util::future::join_all(all)).await;
            let mut answers = shared.iter().zip(decisions);
            for (d, decision) in answers.by_ref() {
                let limit = &limits[usize::from(d.limit)];
                if let Some(end) = self.take(limit, *d, decision, facts, holds, notes) {
                    // Not reached in config order: not counted, its admission given back.
                    for (d, decision) in answers {
                        if let Ok(Decision {
                            hold: Some(hold), ..
                        }) = decision
                        {
                            give_back(&limits[usize::from(d.limit)], d.variant, hold, self.now);
                        }
                    }
                    return end;
                }
            }
            return Ok(None);
        };
        let decision = decide(one).await;
        let limit = &limits[usize::from(one.limit)];
        self.take(limit, *one, decision, facts, holds, notes)
            .unwrap_or(Ok(None))
    }

    /// Takes one limit's decision: records an admission in `holds`, counts a rejection, and
    /// returns `Some` when the phase ends here (an enforced rejection, a bad cost), after
    /// undoing `holds`.
    fn take<F: Facts + ?Sized>(
        self,
        limit: &LimitRt,
        at: Met,
        decision: Result<Decision, BadCost>,
        facts: &F,
        holds: &mut Holds,
        notes: &mut Notes,
    ) -> Option<Ended> {
        let decision = match decision {
            Ok(decision) => decision,
            Err(e) => {
                undo(self.origin, holds, self.now);
                return Some(Err(e));
            }
        };
        let held = decision.hold.is_some();
        if let Some(hold) = decision.hold {
            holds.push(self.taken(at, hold));
        }
        let judged = Judged {
            verdict: decision.verdict,
            policy: decision.policy,
            held,
        };
        self.judge(limit, at, judged, facts, holds, notes)
    }

    /// What `holds` records of an admission of limit `at`.
    #[inline(always)]
    fn taken(self, at: Met, hold: Hold) -> Taken {
        Taken {
            phase: self.phase,
            limit: at.limit,
            variant: at.variant,
            hold,
        }
    }

    /// [`take`](Self::take) once the admission's hold, if any, is in `holds`: counts a
    /// rejection, notes what the headers and the access log need, and returns `Some` on an
    /// enforced rejection, after undoing `holds`.
    #[inline(always)]
    fn judge<F: Facts + ?Sized>(
        self,
        limit: &LimitRt,
        at: Met,
        judged: Judged,
        facts: &F,
        holds: &mut Holds,
        notes: &mut Notes,
    ) -> Option<Ended> {
        let (origin, now) = (self.origin, self.now);
        let verdict = judged.verdict;
        if let Some(top) = &limit.top {
            // Off (`None`) by default; the key's text is built only when it enters a list.
            top.record(at.key, !verdict.allowed, now, || {
                limit.key.text(facts).unwrap_or_default()
            });
        }
        let decided = Decided {
            phase: self.phase,
            limit: at.limit,
            variant: at.variant,
            policy: judged.policy,
            verdict,
        };
        let variant = variant_of(limit, usize::from(at.variant));
        if judged.held {
            // Admitted, its hold in `holds`.
        } else if !verdict.allowed && (variant.mode == Mode::Shadow || self.kill) {
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
        // A shadow rejection is noted too (its verdict says so), for the access log's
        // `shadow_rejected`; only `headers: always` notes become response headers.
        if limit.headers == HeadersMode::Always || !verdict.allowed {
            notes.push(decided);
        }
        None
    }
}

/// Gives back what `limit`'s `variant` admitted.
fn give_back(limit: &LimitRt, variant: u16, hold: Hold, now: Nanos) {
    if let Some(variant) = limit.variants.get(usize::from(variant)) {
        if let Err(e) = variant.limiter.undo(hold, now) {
            // A bug, not a client's doing: say so rather than lose the refund silently.
            log::error!("limit {}: {e}", limit.name);
        }
    }
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
        give_back(limit, t.variant, t.hold, now);
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
}
