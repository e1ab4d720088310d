//! Running an origin's limits against one request: request-time kinds in
//! `request_filter`, inflight in `upstream_peer`.
//!
//! No-burn rule: request-time limits consume on admission and record a [`Ticket`]; when a
//! later limit (request-time or inflight) rejects, every ticket is refunded, so a request
//! that is turned away never uses up an earlier limit's quota. Shadow mode evolves state
//! exactly as enforce would (a shadow rejection consumes nothing unless `strict`), so its
//! counts predict what enforcing would do; only the response differs.
//!
//! Nothing here allocates on the admit path: tickets and header notes live in inline
//! `SmallVec`s in the request context.

use smallvec::SmallVec;

use crate::config::{Cost, HeadersMode, LimitParams, Mode};
use crate::limits::{InflightGuard, Nanos, Verdict};
use crate::proxy::identity::RequestFacts;
use crate::proxy::runtime::{OriginRt, State};

/// One admission to undo if a later limit rejects.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    limit: u16,
    variant: u16,
    key: u64,
    cost: u64,
}

/// One limit's decision for one request: which limit (request-time or inflight), which
/// variant, and the verdict. It names the rejecting limit, and the limits with
/// `headers: always` to report on an admitted response.
#[derive(Debug, Clone, Copy)]
pub struct Decided {
    /// Index into the origin's request or inflight limits.
    pub limit: u16,
    /// Whether `limit` indexes inflight limits.
    pub inflight: bool,
    /// Variant used.
    pub variant: u16,
    /// The decision.
    pub verdict: Verdict,
}

/// Inline storage for tickets: four limits before spilling to the heap.
pub type Tickets = SmallVec<[Ticket; 4]>;
/// Inline storage for header notes.
pub type Notes = SmallVec<[Decided; 2]>;
/// Inline storage for inflight guards.
pub type Guards = SmallVec<[InflightGuard; 2]>;

/// A cost header that is not a positive integer: answered with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header `{header}` must be a positive integer token cost")]
pub struct BadCost {
    /// The header's name.
    pub header: String,
}

/// The request's token cost under `params` (an override may set its own `cost`): a fixed
/// number, or a header clamped to `[1, capacity]`; 1 for other kinds.
fn cost_of(params: &LimitParams, facts: &RequestFacts<'_>) -> Result<u64, BadCost> {
    let LimitParams::TokenBucket { bucket, cost, .. } = params else {
        return Ok(1);
    };
    match cost {
        Cost::Fixed(c) => Ok(*c),
        Cost::Header(name) => match facts.headers.get(name.as_str()) {
            None => Ok(1),
            Some(v) => std::str::from_utf8(v.as_bytes())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(|c| c.clamp(1, bucket.capacity.max(1)))
                .ok_or_else(|| BadCost {
                    header: name.clone(),
                }),
        },
    }
}

/// Runs the request-time limits in config order. On a rejection every ticket taken so far
/// is refunded and the rejection returned.
pub fn request_limits(
    origin: &OriginRt,
    facts: &RequestFacts<'_>,
    now: Nanos,
    tickets: &mut Tickets,
    notes: &mut Notes,
) -> Result<Option<Decided>, BadCost> {
    for (index, limit) in origin.request_limits.iter().enumerate() {
        let Some(key) = limit.key.hash(facts) else {
            limit.counters.skipped.inc();
            continue;
        };
        let v = limit.select(facts);
        let variant = &limit.variants[v];
        let cost = match cost_of(&variant.params, facts) {
            Ok(c) => c,
            Err(e) => {
                refund(origin, tickets, now);
                return Err(e);
            }
        };
        let verdict = match (&*variant.state, &variant.params) {
            (State::Rate(r), LimitParams::Rate { rate, .. }) => {
                r.acquire(key, rate.max, cost, rate.strict, now)
            }
            (State::TokenBucket(tb), _) => tb.acquire(key, cost, now),
            // Inflight limits never sit in `request_limits`.
            _ => continue,
        };
        let (limit_i, variant_i) = (index as u16, v as u16);
        if verdict.allowed {
            limit.counters.allowed.inc();
            tickets.push(Ticket {
                limit: limit_i,
                variant: variant_i,
                key,
                cost,
            });
        } else if variant.mode == Mode::Shadow {
            limit.counters.shadow_rejected.inc();
            log::info!(
                "shadow: limit `{}` of origin `{}` would reject client {} ({})",
                limit.name,
                origin.name,
                facts.client_ip,
                variant.policy_text
            );
        } else {
            limit.counters.rejected.inc();
            refund(origin, tickets, now);
            return Ok(Some(Decided {
                limit: limit_i,
                inflight: false,
                variant: variant_i,
                verdict,
            }));
        }
        if limit.headers == HeadersMode::Always {
            notes.push(Decided {
                limit: limit_i,
                inflight: false,
                variant: variant_i,
                verdict,
            });
        }
    }
    Ok(None)
}

/// Gives back every ticket: a later limit rejected the request.
pub fn refund(origin: &OriginRt, tickets: &mut Tickets, now: Nanos) {
    for t in tickets.drain(..) {
        let Some(limit) = origin.request_limits.get(t.limit as usize) else {
            continue;
        };
        let Some(variant) = limit.variants.get(t.variant as usize) else {
            continue;
        };
        match &*variant.state {
            State::Rate(r) => r.refund(t.key, t.cost, now),
            State::TokenBucket(tb) => tb.refund(t.key, t.cost, now),
            State::Inflight(_) => {}
        }
    }
}

/// Runs the inflight limits in config order, pushing one guard per admitting limit into
/// `guards` (the caller clears it first on a retry, so guards are replaced, never doubled).
/// On a rejection the guards taken so far are dropped (decrementing) and the rejection
/// returned.
pub fn inflight_limits(
    origin: &OriginRt,
    facts: &RequestFacts<'_>,
    guards: &mut Guards,
    notes: &mut Notes,
) -> Option<Decided> {
    for (index, limit) in origin.inflight_limits.iter().enumerate() {
        let Some(key) = limit.key.hash(facts) else {
            limit.counters.skipped.inc();
            continue;
        };
        let v = limit.select(facts);
        let variant = &limit.variants[v];
        let (State::Inflight(inflight), LimitParams::Inflight { max, .. }) =
            (&*variant.state, &variant.params)
        else {
            continue;
        };
        let (limit_i, variant_i) = (index as u16, v as u16);
        let verdict = match inflight.acquire(key, *max) {
            Ok((guard, estimate)) => {
                limit.counters.allowed.inc();
                guards.push(guard);
                Verdict::allow(max.saturating_sub(estimate), 0)
            }
            Err(estimate) => {
                // Concurrency frees up as soon as any request ends; one second is the
                // smallest honest Retry-After.
                let verdict = Verdict::reject(
                    max.saturating_sub(estimate),
                    0,
                    crate::limits::clock::NANOS_PER_SEC,
                );
                if variant.mode == Mode::Shadow {
                    limit.counters.shadow_rejected.inc();
                    log::info!(
                        "shadow: inflight limit `{}` of origin `{}` would reject ({})",
                        limit.name,
                        origin.name,
                        variant.policy_text
                    );
                    verdict
                } else {
                    limit.counters.rejected.inc();
                    guards.clear();
                    return Some(Decided {
                        limit: limit_i,
                        inflight: true,
                        variant: variant_i,
                        verdict,
                    });
                }
            }
        };
        if limit.headers == HeadersMode::Always {
            notes.push(Decided {
                limit: limit_i,
                inflight: true,
                variant: variant_i,
                verdict,
            });
        }
    }
    None
}
