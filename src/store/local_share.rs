//! This instance's share of a fleet-wide limit, what its fallback decides with while the
//! store cannot answer, so that a fleet whose store is down admits about what it would
//! with the store.
//!
//! With `n = instances`, every `max` (a rate's, an inflight or concurrency limit's and its
//! global and group maxes, a sliding log's windows', a tiered limit's) becomes
//! `⌈max / n⌉`; a bucket's capacity `⌈capacity / n⌉` and its refill `⌈amount / n⌉` tokens
//! every `every · n · ⌈amount / n⌉ / amount`, so the fleet's refill rate is kept exactly
//! while refills stay whole tokens (1 token a second across 3 instances becomes 1 token
//! every 3 s each). The local state is separate from Redis's: when the store comes back,
//! decisions continue from Redis's state, and local state is left to age out.

use crate::limits::token_bucket::TokenBucketParams;
use crate::store::remote::share;

/// A bucket's local share (module doc): capacity and refill divided by `n`, rounded up,
/// the refill interval stretched so that the refill rate is exactly `1/n` of the fleet's.
pub fn local_bucket_share(p: TokenBucketParams, n: u32) -> TokenBucketParams {
    let n = n.max(1);
    let amount = p.amount.max(1);
    let local_amount = share(amount, n);
    let every =
        u128::from(p.every.max(1)) * u128::from(n) * u128::from(local_amount) / u128::from(amount);
    TokenBucketParams {
        capacity: share(p.capacity, n),
        amount: local_amount,
        every: u64::try_from(every).unwrap_or(u64::MAX).max(1),
        strict: p.strict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::clock::Nanos;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn local_share_keeps_the_fleet_rate() {
        let p = |capacity, amount, every| TokenBucketParams {
            capacity,
            amount,
            every,
            strict: false,
        };
        assert_eq!(local_bucket_share(p(60, 1, SEC), 1), p(60, 1, SEC));
        assert_eq!(local_bucket_share(p(60, 1, SEC), 3), p(20, 1, 3 * SEC));
        assert_eq!(local_bucket_share(p(60, 60, SEC), 3), p(20, 20, SEC));
        // 10 every second over 3: 4 every 1.2 s, 3.33 a second each.
        assert_eq!(
            local_bucket_share(p(10, 10, SEC), 3),
            p(4, 4, 1_200_000_000)
        );
        assert_eq!(local_bucket_share(p(1, 1, SEC), 5), p(1, 1, 5 * SEC));
        assert_eq!(local_bucket_share(p(0, 0, 0), 0), p(0, 1, 1));
        assert_eq!((share(100, 3), share(0, 3), share(7, 0)), (34, 0, 7));
    }
}
