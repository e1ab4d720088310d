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
use crate::runtime::limit::{BadCost, Hold, LimitRt};
use crate::runtime::OriginRt;

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
pub fn run<F: Facts + ?Sized>(
    origin: &OriginRt,
    phase: Phase,
    facts: &F,
    now: Nanos,
    holds: &mut Holds,
    notes: &mut Notes,
) -> Result<Option<Decided>, BadCost> {
    for (index, limit) in origin.limits(phase).iter().enumerate() {
        let Some(key) = limit.key.hash(facts) else {
            limit.counters.skipped.inc();
            continue;
        };
        let v = limit.select(facts);
        let variant = &limit.variants[v];
        let (verdict, hold) = match variant.limiter.decide(key, facts, now) {
            Ok(decided) => decided,
            Err(e) => {
                undo(origin, holds, now);
                return Err(e);
            }
        };
        let decided = Decided {
            phase,
            limit: index as u16,
            variant: v as u16,
            verdict,
        };
        if let Some(hold) = hold {
            holds.push(Taken {
                phase,
                limit: decided.limit,
                variant: decided.variant,
                hold,
            });
        } else if !verdict.allowed && variant.mode == Mode::Shadow {
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
            return Ok(Some(decided));
        }
        if limit.headers == HeadersMode::Always {
            notes.push(decided);
        }
    }
    Ok(None)
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
        matches!(t.hold, Hold::Inflight(_))
    });
}
