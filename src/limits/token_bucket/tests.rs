//! The token bucket's tests, beside its file (`token_bucket.rs`) to keep it one job long.

use super::*;
use crate::limits::table::WAYS;
use crate::limits::testing::{
    admitted_on_threads, fill_past_the_slots, fresh_keys_on_threads, spread,
};
use proptest::prelude::*;
use std::collections::HashMap;

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;

fn params(capacity: u64, amount: u64, every: Nanos, strict: bool) -> TokenBucketParams {
    TokenBucketParams {
        capacity,
        amount,
        every,
        strict,
    }
}

impl TokenBucket {
    /// The tokens of [`TokenBucket::state`]: the tests' shorthand.
    pub(crate) fn tokens(&self, key: u64, now: Nanos) -> u64 {
        self.state(key, now).0
    }
}

#[test]
fn the_table_never_exceeds_max_keys() {
    let p = params(5, 1, SEC, false);
    // Valid sizes are kept exactly: whole sets of 8, 25 bytes a key.
    assert_eq!(TokenBucket::new(p, 1000).table.sets(), 125);
    assert_eq!(TokenBucket::new(p, 1001).table.sets(), 126);
    assert_eq!(TokenBucket::table_bytes(100_000), 2_500_000);
    assert_eq!(
        TokenBucket::table_bytes(TokenBucket::MAX_KEYS),
        400 << 20,
        "the largest table is 400 MiB"
    );
    // Anything larger is cut to the bound instead of overflowing or allocating
    // terabytes (building that table here would touch 400 MiB, so the size it would
    // take is checked through the same function `new` uses).
    for huge in [TokenBucket::MAX_KEYS + 1, 1_000_000_000_000, usize::MAX] {
        assert_eq!(TokenBucket::sets_for(huge), TokenBucket::MAX_KEYS / WAYS);
        assert_eq!(TokenBucket::table_bytes(huge), 400 << 20);
    }
    assert_eq!(TokenBucket::new(p, 0).table.sets(), 1);
}

#[test]
fn new_key_is_full_and_full_keys_hold_no_state() {
    let b = TokenBucket::new(params(5, 1, SEC, false), 100);
    assert_eq!(b.tokens(1, 0), 5);
    assert!(b.is_empty());
    assert_eq!(b.acquire(1, 0, 0), Verdict::allow(5, 0));
    assert!(b.is_empty(), "cost 0 leaves the bucket full");
    assert_eq!(b.acquire(1, 2, 0), Verdict::allow(3, 2 * SEC));
    assert!(b.acquire(2, 5, 0).allowed);
    assert_eq!(b.len(), 2);
    assert_eq!(b.acquire(1, 0, 2 * SEC), Verdict::allow(5, 0));
    assert_eq!(b.len(), 1, "key 1 refilled to full: its slot is freed");
    assert_eq!(b.params(), params(5, 1, SEC, false));
    // Key 0 marks empty slots, so it is stored as key 1: a harmless hash collision.
    assert!(b.acquire(0, 1, 2 * SEC).allowed);
    assert_eq!((b.tokens(1, 2 * SEC), b.len()), (4, 2));
}

#[test]
fn refills_are_discrete() {
    let b = TokenBucket::new(params(5, 2, SEC, false), 100);
    assert_eq!(b.acquire(1, 5, 0), Verdict::allow(0, 3 * SEC));
    assert_eq!(b.tokens(1, SEC - 1), 0);
    assert_eq!(b.tokens(1, SEC), 2);
    assert_eq!(b.tokens(1, 2 * SEC - 1), 2);
    assert_eq!(b.tokens(1, 2 * SEC), 4);
    assert_eq!(b.tokens(1, 3 * SEC), 5);
    // A refill clock that keeps its phase: last moves by whole intervals.
    assert_eq!(
        b.acquire(1, 1, SEC + SEC / 2),
        Verdict::allow(1, SEC / 2 + SEC)
    );
    assert_eq!(b.tokens(1, 2 * SEC), 3);
    assert_eq!(b.acquire(1, 3, 2 * SEC), Verdict::allow(0, 3 * SEC));
}

#[test]
fn strict_blocks_a_hammering_client_until_it_pauses() {
    let lax = TokenBucket::new(params(2, 1, SEC, false), 100);
    let strict = TokenBucket::new(params(2, 1, SEC, true), 100);
    for b in [&lax, &strict] {
        assert!(b.acquire(1, 2, 0).allowed);
    }
    let hammer = |b: &TokenBucket| -> Vec<bool> {
        (1..=6)
            .map(|i| b.acquire(1, 1, i * SEC / 2).allowed)
            .collect()
    };
    assert_eq!(hammer(&lax), [false, true, false, true, false, true]);
    assert_eq!(hammer(&strict), [false; 6]);
    let v = strict.acquire(1, 1, 3 * SEC + SEC / 2);
    assert_eq!(v, Verdict::reject(0, 2 * SEC, SEC));
    // A pause of a whole interval gets a token.
    assert!(!strict.acquire(1, 1, 4 * SEC + SEC / 2 - 1).allowed);
    assert!(strict.acquire(1, 1, 5 * SEC + SEC / 2 - 1).allowed);
}

#[test]
fn cost_above_tokens_and_above_capacity() {
    let b = TokenBucket::new(params(10, 2, SEC, false), 100);
    assert!(b.acquire(1, 7, 0).allowed);
    // 3 tokens, cost 8: ceil(5 / 2) = 3 refills, the first 0.4 s away; full after 4.
    let v = b.acquire(1, 8, 600 * MS);
    assert_eq!(
        v,
        Verdict::reject(3, 4 * SEC - 600 * MS, 3 * SEC - 600 * MS)
    );
    assert_eq!(b.tokens(1, 600 * MS), 3, "a rejection takes nothing");
    // Capacity 10, cost 11: never, so no retry is invited.
    let v = b.acquire(2, 11, 0);
    assert_eq!(v, Verdict::reject(10, 0, NEVER));
    assert!(v.is_block());
    assert_eq!(b.len(), 1, "the full key 2 holds no state");
}

#[test]
fn refund_gives_back_up_to_capacity() {
    let b = TokenBucket::new(params(4, 1, SEC, false), 100);
    assert!(b.acquire(1, 3, 0).allowed);
    b.refund(1, 2, 0);
    assert_eq!(b.tokens(1, 0), 3);
    // Refills first (one due at 1 s), then the refund, capped: full, so dropped.
    b.refund(1, 5, SEC);
    assert_eq!(b.tokens(1, SEC), 4);
    assert!(b.is_empty());
    b.refund(2, 3, SEC);
    assert!(b.is_empty(), "refunding a full key is a no-op");
    assert_eq!(b.tokens(2, SEC), 4);
}

#[test]
fn the_table_never_holds_more_than_its_slots() {
    // max_keys 1 000: 125 sets of 8 ways.
    let b = TokenBucket::new(params(10, 1, SEC, false), 1_000);
    let len = fill_past_the_slots(|key| b.acquire(key, 1, 0).allowed, || b.len());
    // Every set filled up, then each newcomer evicted exactly one bucket.
    assert_eq!((len, b.evictions()), (1_000, 199_000));
    // 25 bytes per key and a 256-byte header, as documented.
    assert_eq!(
        [size_of::<table::Set<Bucket>>(), size_of::<TokenBucket>()],
        [200, 256]
    );
    let sets = |n| TokenBucket::new(params(10, 1, SEC, false), n).table.sets();
    assert_eq!([sets(100_000), sets(9), sets(1)], [12_500, 2, 1]);
    // max_keys 0 is 1: one set of 8 ways.
    let b = TokenBucket::new(params(10, 1, SEC, false), 0);
    for key in 1..=9 {
        assert!(b.acquire(key, 10, 0).allowed);
    }
    assert_eq!((b.len(), b.evictions()), (8, 1));
}

#[test]
fn buckets_full_by_now_are_reused_before_any_eviction() {
    // max_keys 8: one set, shared by every key.
    let b = TokenBucket::new(params(10, 1, SEC, false), 8);
    for key in 1..=8 {
        let cost = if key <= 4 { 10 } else { 1 };
        assert!(b.acquire(key, cost, 0).allowed);
    }
    // Keys 5..=8 are full again at 1 s: four newcomers take their slots, exactly.
    for key in 9..=12 {
        assert!(b.acquire(key, 10, SEC).allowed);
    }
    assert_eq!((b.len(), b.evictions()), (8, 0));
    assert!((1..=4).all(|key| b.tokens(key, SEC) == 1));
    assert!((9..=12).all(|key| b.tokens(key, SEC) == 0));
    // Nothing is full now: the next newcomer evicts.
    assert!(b.acquire(13, 1, SEC).allowed);
    assert_eq!((b.len(), b.evictions()), (8, 1));
}

#[test]
fn eviction_takes_the_nearest_to_full_which_starts_full_again() {
    let b = TokenBucket::new(params(10, 1, SEC, false), 8);
    // Key k keeps 10 - k tokens.
    for key in 1..=8 {
        assert!(b.acquire(key, key, 0).allowed);
    }
    assert!(b.acquire(9, 10, 0).allowed);
    assert_eq!(b.evictions(), 1);
    assert_eq!(b.tokens(1, 0), 10, "key 1 (9 tokens) evicted: full again");
    assert!((2..=8).all(|key| b.tokens(key, 0) == 10 - key));
    assert_eq!(b.tokens(9, 0), 0);
    // Key 1 fails open once, and its new state evicts key 2 (8 tokens).
    assert!(b.acquire(1, 10, 0).allowed);
    assert_eq!((b.tokens(2, 0), b.tokens(1, 0), b.evictions()), (10, 0, 2));

    // Among equal tokens, the earliest refilled is the nearest to full, whatever its way.
    let b = TokenBucket::new(params(10, 1, SEC, false), 8);
    for key in 10..=17 {
        assert!(b.acquire(key, if key <= 11 { 1 } else { 5 }, 0).allowed);
    }
    b.refund(10, 1, 500 * MS);
    assert_eq!(b.len(), 7, "key 10 refunded to full: way 0 freed");
    assert!(b.acquire(20, 1, 500 * MS).allowed);
    // Key 20 (way 0) and key 11 hold 9 tokens; key 11 is full at 1 s, key 20 at 1.5 s.
    assert!(b.acquire(21, 1, 900 * MS).allowed);
    assert_eq!((b.tokens(11, 900 * MS), b.tokens(20, 900 * MS)), (10, 9));
    assert_eq!(b.evictions(), 1);
}

#[test]
fn retry_after_is_exact() {
    // (params, script of (now, cost), probe (now, cost))
    type Case = (TokenBucketParams, &'static [(Nanos, u64)], (Nanos, u64));
    let cases: [Case; 5] = [
        (params(5, 1, SEC, false), &[(0, 5)], (300 * MS, 1)),
        (
            params(5, 2, SEC, false),
            &[(0, 4), (1500 * MS, 3)],
            (1700 * MS, 4),
        ),
        (
            params(8, 3, 100 * MS, true),
            &[(0, 8), (50 * MS, 1)],
            (70 * MS, 7),
        ),
        (params(3, 1, 86_400 * SEC, false), &[(5, 3)], (10 * SEC, 3)),
        (
            params(10, 10, SEC, true),
            &[(0, 10), (999 * MS, 1)],
            (999 * MS, 10),
        ),
    ];
    for (p, script, (at, cost)) in cases {
        let replay = || {
            let b = TokenBucket::new(p, 100);
            for &(now, c) in script {
                b.acquire(1, c, now);
            }
            let v = b.acquire(1, cost, at);
            assert!(!v.allowed, "{p:?}");
            (b, v.retry_after)
        };
        let (early, retry) = replay();
        assert!(!early.acquire(1, cost, at + retry - 1).allowed, "{p:?}");
        let (on_time, _) = replay();
        assert!(on_time.acquire(1, cost, at + retry).allowed, "{p:?}");
    }
}

#[test]
fn threads_share_one_bucket_exactly() {
    let b = TokenBucket::new(params(1_000, 1, Nanos::MAX / 2, false), 100);
    let admitted = admitted_on_threads(8, 500, |_, _| b.acquire(9, 1, 0).allowed);
    assert_eq!(admitted, 1_000);
    assert_eq!(b.tokens(9, 0), 0);
}

#[test]
fn threads_on_many_keys_keep_the_bound() {
    let b = TokenBucket::new(params(10, 1, SEC, false), 64);
    fresh_keys_on_threads(|key, at| b.acquire(key, 1, at).allowed);
    assert!(b.len() <= 64 && b.evictions() > 0, "len {}", b.len());
}

/// The semantics written literally, with no eviction: the oracle of the proptests.
#[derive(Debug, Clone)]
struct Model {
    p: TokenBucketParams,
    tokens: u64,
    last: Nanos,
}

impl Model {
    fn new(p: TokenBucketParams) -> Self {
        Self {
            p,
            tokens: p.capacity,
            last: 0,
        }
    }

    fn refill(&mut self, now: Nanos) {
        let n = (now - self.last) / self.p.every;
        self.tokens = (self.tokens + n * self.p.amount).min(self.p.capacity);
        self.last += n * self.p.every;
        if self.tokens == self.p.capacity {
            self.last = now;
        }
    }

    fn acquire(&mut self, cost: u64, now: Nanos) -> (bool, u64) {
        self.refill(now);
        if self.tokens >= cost {
            self.tokens -= cost;
            return (true, self.tokens);
        }
        if self.p.strict {
            self.last = now;
        }
        (false, self.tokens)
    }

    /// The largest `n` in `[min, want]` that the bucket holds, taken; or `None`.
    fn acquire_many(&mut self, min: u64, want: u64, now: Nanos) -> (Option<u64>, u64) {
        self.refill(now);
        let n = (min..=want).rev().find(|&n| n <= self.tokens);
        match n {
            Some(n) => self.tokens -= n,
            None if self.p.strict => self.last = now,
            None => {}
        }
        (n, self.tokens)
    }

    fn refund(&mut self, cost: u64, now: Nanos) {
        self.refill(now);
        self.tokens = (self.tokens + cost).min(self.p.capacity);
        if self.tokens == self.p.capacity {
            self.last = now;
        }
    }
}

fn arb_params() -> impl Strategy<Value = TokenBucketParams> {
    (1u64..12, 1u64..5, 1u64..1_000, any::<bool>()).prop_map(|(c, a, e, s)| params(c, a, e, s))
}

/// Steps of (key, advance in thousandths of `every`, cost, refund instead of acquire).
fn arb_steps(keys: u64) -> impl Strategy<Value = Vec<(u64, u64, u64, bool)>> {
    prop::collection::vec((0..keys, 0u64..3_000, 0u64..14, any::<bool>()), 1..120)
}

fn check_against_model(
    p: TokenBucketParams,
    steps: &[(u64, u64, u64, bool)],
) -> Result<(), TestCaseError> {
    let b = TokenBucket::new(p, 1 << 16);
    let mut models: HashMap<u64, Model> = HashMap::new();
    let mut now = 0;
    for &(key, advance, cost, refund) in steps {
        now += advance * p.every / 1_000;
        let cost = cost % (p.capacity + 2);
        let model = models.entry(key).or_insert_with(|| Model::new(p));
        if refund {
            b.refund(spread(key), cost, now);
            model.refund(cost, now);
            prop_assert_eq!(b.tokens(spread(key), now), model.tokens);
            continue;
        }
        let before = model.clone();
        let v = b.acquire(spread(key), cost, now);
        prop_assert_eq!((v.allowed, v.remaining), model.acquire(cost, now));
        if !v.allowed && cost <= p.capacity {
            // retry_after against the oracle: a retry one nanosecond early fails.
            let (mut early, mut on_time) = (before.clone(), before);
            early.acquire(cost, now);
            on_time.acquire(cost, now);
            prop_assert!(!early.acquire(cost, now + v.retry_after - 1).0);
            prop_assert!(on_time.acquire(cost, now + v.retry_after).0);
        }
    }
    Ok(())
}

#[test]
fn acquire_many_grants_the_largest_count_that_fits() {
    let b = TokenBucket::new(params(10, 2, SEC, false), 100);
    // 10 tokens: a request for 4 to 6 gets 6.
    assert_eq!(
        b.acquire_many(1, 4, 6, 0),
        Grant {
            verdict: Verdict::allow(4, 3 * SEC),
            granted: 6
        }
    );
    // 4 left: a request for 3 to 8 gets the 4.
    assert_eq!(b.acquire_many(1, 3, 8, 0).granted, 4);
    // Empty: a request for at least 3 is refused until two refills (2 s) bring 4.
    let g = b.acquire_many(1, 3, 8, 0);
    assert_eq!(g, Grant::rejected(Verdict::reject(0, 5 * SEC, 2 * SEC)));
    assert!(!b.acquire_many(1, 3, 8, 2 * SEC - 1).verdict.allowed);
    assert_eq!(b.acquire_many(1, 3, 8, 2 * SEC).granted, 4);
    // min above capacity never fits; a min above want is lowered to want.
    let never = b.acquire_many(2, 11, 20, 0);
    assert_eq!((never.granted, never.verdict.retry_after), (0, NEVER));
    assert_eq!(b.acquire_many(2, 7, 5, 0).granted, 5);
    // A fixed cost decides exactly as `acquire`.
    let (x, y) = (
        TokenBucket::new(params(3, 1, SEC, true), 100),
        TokenBucket::new(params(3, 1, SEC, true), 100),
    );
    for (i, cost) in [2u64, 2, 1, 3, 1].into_iter().enumerate() {
        let now = i as u64 * SEC / 3;
        assert_eq!(
            x.acquire_many(5, cost, cost, now).verdict,
            y.acquire(5, cost, now)
        );
    }
}

#[test]
fn a_strict_bucket_refusing_min_resets_its_clock() {
    let b = TokenBucket::new(params(4, 1, SEC, true), 100);
    assert_eq!(b.acquire_many(1, 1, 4, 0).granted, 4);
    assert!(!b.acquire_many(1, 2, 2, SEC + SEC / 2).verdict.allowed);
    // The refill due at 1 s was applied, then the rejection moved the clock to 1.5 s:
    // the next refill is at 2.5 s.
    assert_eq!(b.tokens(1, 2 * SEC + SEC / 2 - 1), 1);
    assert_eq!(b.tokens(1, 2 * SEC + SEC / 2), 2);
}

/// Steps of (key, advance in thousandths of `every`, min, want).
fn arb_many_steps() -> impl Strategy<Value = Vec<(u64, u64, u64, u64)>> {
    prop::collection::vec((0u64..3, 0u64..3_000, 0u64..14, 0u64..14), 1..120)
}

proptest! {
    #[test]
    fn acquire_many_matches_the_model(p in arb_params(), steps in arb_many_steps()) {
        let b = TokenBucket::new(p, 1 << 16);
        let mut models: HashMap<u64, Model> = HashMap::new();
        let mut now = 0;
        for &(key, advance, min, want) in &steps {
            now += advance * p.every / 1_000;
            let min = min.min(want);
            let model = models.entry(key).or_insert_with(|| Model::new(p));
            let before = model.clone();
            let g = b.acquire_many(spread(key), min, want, now);
            let (n, left) = model.acquire_many(min, want, now);
            prop_assert_eq!((g.verdict.allowed, g.granted, g.verdict.remaining),
                (n.is_some(), n.unwrap_or(0), left));
            if n.is_none() && min <= p.capacity {
                // retry_after: `min` fits at it and not a nanosecond before.
                let (mut early, mut on_time) = (before.clone(), before);
                early.acquire_many(min, want, now);
                on_time.acquire_many(min, want, now);
                let at = now + g.verdict.retry_after;
                prop_assert!(early.acquire_many(min, min, at - 1).0.is_none());
                prop_assert!(on_time.acquire_many(min, min, at).0.is_some());
            }
        }
    }

    #[test]
    fn matches_the_model_for_one_key(p in arb_params(), steps in arb_steps(1)) {
        check_against_model(p, &steps)?;
    }

    #[test]
    fn matches_the_model_for_several_keys(p in arb_params(), steps in arb_steps(4)) {
        check_against_model(p, &steps)?;
    }
}
