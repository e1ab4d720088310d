//! The outcome of one request-time limit decision.

use crate::limits::clock::Nanos;

/// A `retry_after` meaning "no retry will ever pass": the limit is a deliberate block
/// (`max: 0`, `capacity: 0`) or the request can never fit. Responses then carry no
/// `Retry-After`, because inviting a client to retry a block only brings it back.
pub const NEVER: Nanos = Nanos::MAX;

/// What a limiter decided for one event, with what the RateLimit headers need.
///
/// It is `Copy` and holds no references, so a remote backend can build one from a reply
/// as easily as a local limiter builds one from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the event may happen.
    pub allowed: bool,
    /// Quota units left after this decision (`r` in the `RateLimit` header).
    pub remaining: u64,
    /// Nanoseconds until the quota is fully restored if nothing else happens (`t` when
    /// admitted).
    pub reset_after: Nanos,
    /// Nanoseconds until a retry of the same cost could be admitted; 0 when admitted, and
    /// [`NEVER`] when no retry can pass. `Retry-After` is this, rounded up to whole
    /// seconds, at least 1 (and absent for [`NEVER`]).
    pub retry_after: Nanos,
}

impl Verdict {
    /// An admission.
    pub fn allow(remaining: u64, reset_after: Nanos) -> Self {
        Self {
            allowed: true,
            remaining,
            reset_after,
            retry_after: 0,
        }
    }

    /// Whether a retry can never pass (a block): see [`NEVER`].
    pub fn is_block(&self) -> bool {
        !self.allowed && self.retry_after == NEVER
    }

    /// A rejection that can be retried after `retry_after` ([`NEVER`] for a block).
    pub fn reject(remaining: u64, reset_after: Nanos, retry_after: Nanos) -> Self {
        Self {
            allowed: false,
            remaining,
            reset_after,
            retry_after,
        }
    }

    /// This verdict, whose rejection says [`NEVER`] when the request can never fit
    /// (`never`: it asks for more than a limit can ever hold, a `max: 0` block among
    /// them), so that no retry is invited: the one place of that rule, for every kind and
    /// both stores.
    pub fn never_if(self, never: bool) -> Self {
        if never && !self.allowed {
            Self {
                retry_after: NEVER,
                ..self
            }
        } else {
            self
        }
    }
}

/// A decision on a request for *between* `min` and `want` units (the limiter API's
/// `CH.REQUEST resource domain copies MIN n`): the largest count in `[min, want]` that fits
/// is granted, or nothing when not even `min` fits.
///
/// The verdict describes the decision as one request of the granted count: `remaining` is
/// what is left after the grant, and a rejection's `retry_after` is the time until `min`
/// units would fit (so a caller that can make do with `min` knows when to come back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Admitted or rejected, as above.
    pub verdict: Verdict,
    /// Units granted: in `[min, want]` when admitted, 0 when rejected.
    pub granted: u64,
}

impl Grant {
    /// A rejection of a request whose `min` did not fit.
    pub fn rejected(verdict: Verdict) -> Self {
        Self {
            verdict,
            granted: 0,
        }
    }
}
