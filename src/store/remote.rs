//! The seam between a limit kind and a shared store: what is the same for every kind whose
//! state lives in Redis, written once. A kind supplies only its script call and how to
//! read the reply; [`Remote`] does the rest, and every answer says who gave it
//! ([`Sourced`]).
//!
//! A decision goes, in order, to:
//! 1. the local deny cache, for the kinds that have one (token bucket, rate and sliding
//!    log, not `strict`): a key the store rejected for `min` is rejected here until its
//!    `retry_after`, without a store call ([`Source::DenyCache`]);
//! 2. the store ([`Source::Store`]): the kind's one script call, which goes through the
//!    store's single call path (`RedisStore::eval`): not sent while the breaker is open,
//!    bounded by what is left of the request phase's budget (`crate::store::budget`),
//!    counted for the breaker. A rejection it answers is remembered by the deny cache;
//! 3. the fallback, when the call did not answer (past the budget, an error, the breaker
//!    open; [`Source::Fallback`], counted in `tollgate_store_fallback_decisions_total`):
//!    `local` decides with the kind's in-process limiter at this instance's share of the
//!    limit ([`share`]), `allow` admits, `deny` rejects, retrying after one probe interval
//!    ([`Remote::denied`]).
//!
//! Refunds and releases are sent in the background ([`Remote::spawn`]), never waited for.
//! Leased kinds (inflight, concurrency) renew what this instance holds every `lease / 3`
//! with one loop ([`Leased`], [`renew_every_third`]), and their guards give units back
//! by one rule ([`Leased::give_back`]).

use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::limits::clock::{nanos, Nanos};
use crate::limits::verdict::{Grant, Verdict};
use crate::store::deny_cache::DenyCache;
use crate::store::held::Held;
use crate::store::redis::{Fallback, LogGrant, RedisStore};
use crate::store::StoreError;

/// Where a shared decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The store decided.
    Store,
    /// The store could not answer in time (or its breaker is open): the fallback decided.
    Fallback,
    /// A rejection remembered from the store, answered locally.
    DenyCache,
}

/// An answer and who gave it: every shared limiter's result. It reads as the answer
/// (`Deref`); pass `source` back to the refund, which goes where the admission came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sourced<T> {
    /// The answer.
    pub value: T,
    /// Who gave it.
    pub source: Source,
}

impl<T> Sourced<T> {
    /// `value`, from `source`.
    pub fn new(value: T, source: Source) -> Self {
        Self { value, source }
    }

    /// The answer, changed by `f`, from the same source.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Sourced<U> {
        Sourced {
            value: f(self.value),
            source: self.source,
        }
    }
}

impl<T> Deref for Sourced<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

/// A store reply the deny cache learns from: its verdict.
pub(crate) trait Rejects {
    /// The verdict the store gave.
    fn verdict(&self) -> &Verdict;
}

impl Rejects for Verdict {
    fn verdict(&self) -> &Verdict {
        self
    }
}

impl Rejects for Grant {
    fn verdict(&self) -> &Verdict {
        &self.verdict
    }
}

impl Rejects for LogGrant {
    fn verdict(&self) -> &Verdict {
        &self.verdict
    }
}

/// A reply and what the call adds to it (the id its entries are named after).
impl<R: Rejects, X> Rejects for (R, X) {
    fn verdict(&self) -> &Verdict {
        self.0.verdict()
    }
}

/// The default size of a shared limiter's deny cache, in keys (41 bytes each).
pub const DEFAULT_DENY_CACHE_KEYS: usize = 4096;

/// `⌈v / n⌉`, this instance's share of `v` across `n` instances.
pub(crate) fn share(v: u64, n: u32) -> u64 {
    v.div_ceil(u64::from(n.max(1)))
}

/// What one shared limiter keeps besides its kind's state: its store and its deny cache
/// (module doc).
pub(crate) struct Remote {
    store: RedisStore,
    deny: Option<DenyCache>,
}

impl Remote {
    /// A limiter's seam to `store`, with a deny cache of `deny_cache_keys` keys (0: none).
    pub(crate) fn new(store: &RedisStore, deny_cache_keys: usize) -> Self {
        Self {
            store: store.clone(),
            deny: (deny_cache_keys > 0).then(|| DenyCache::new(deny_cache_keys)),
        }
    }

    /// The store.
    pub(crate) fn store(&self) -> &RedisStore {
        &self.store
    }

    /// The size of the local fallback's table: `max_keys` when the fallback is `local`,
    /// else 1 (the table is never written; a table holds at least one set anyway).
    pub(crate) fn local_keys(&self, max_keys: usize) -> usize {
        match self.store.config().tuning.fallback {
            Fallback::Local => max_keys,
            Fallback::Allow | Fallback::Deny => 1,
        }
    }

    /// This instance's share of `v` (module doc).
    pub(crate) fn share(&self, v: u64) -> u64 {
        share(v, self.store.config().tuning.instances)
    }

    /// The fallback `deny` verdict: retry after one probe interval.
    pub(crate) fn denied(&self) -> Verdict {
        Verdict::reject(0, 0, nanos(self.store.config().tuning.probe_every).max(1))
    }

    /// Store calls the deny cache saved.
    pub(crate) fn deny_cache_hits(&self) -> u64 {
        self.deny.as_ref().map_or(0, DenyCache::hits)
    }

    /// Runs `work` (a refund, a release) on the store's runtime; nobody waits for it.
    pub(crate) fn spawn<F>(&self, work: F)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.store.handle().spawn(work);
    }

    /// The store's answer to `call`, read by `stored`, or the fallback's (`fallback`, given
    /// the configured [`Fallback`]) when the call did not answer: steps 2 and 3 of the
    /// module doc.
    pub(crate) async fn call<R, T>(
        &self,
        call: impl Future<Output = Result<R, StoreError>>,
        stored: impl FnOnce(R) -> T,
        fallback: impl FnOnce(Fallback) -> T,
    ) -> Sourced<T> {
        match call.await {
            Ok(reply) => Sourced::new(stored(reply), Source::Store),
            Err(_) => {
                self.store.metrics().fallback.inc();
                Sourced::new(
                    fallback(self.store.config().tuning.fallback),
                    Source::Fallback,
                )
            }
        }
    }

    /// [`Remote::call`] behind the deny cache (module doc, step 1): a request for at least
    /// `min` for `key` that the store rejected is answered by `cached` until its
    /// `retry_after`, without polling `call`; a rejection the store answers is remembered.
    /// `now` is the local clock.
    pub(crate) async fn decide<R: Rejects, T>(
        &self,
        (key, min, now): (u64, u64, Nanos),
        call: impl Future<Output = Result<R, StoreError>>,
        stored: impl FnOnce(R) -> T,
        cached: impl FnOnce(Verdict) -> T,
        fallback: impl FnOnce(Fallback) -> T,
    ) -> Sourced<T> {
        let Some(deny) = &self.deny else {
            return self.call(call, stored, fallback).await;
        };
        if let Some(verdict) = deny.check(key, min, now) {
            return Sourced::new(cached(verdict), Source::DenyCache);
        }
        let learn = async {
            let reply = call.await?;
            deny.insert(key, min, reply.verdict(), now);
            Ok(reply)
        };
        self.call(learn, stored, fallback).await
    }
}

/// A leased kind (inflight, concurrency): this instance's counts, renewed every
/// `lease / 3` while the limiter or one of its guards lives, each key's count written over
/// Redis's where Redis may disagree (`crate::store::held`).
pub(crate) trait Leased: Send + Sync + 'static {
    /// Its seam to the store and what this instance holds per key.
    fn lessee(&self) -> (&Remote, &Held);

    /// Whether renewals are sent now: while the store is up.
    fn renewing(&self) -> bool {
        self.lessee().0.store().is_up()
    }

    /// Gives back `n` units of `key` that `source` admitted, here at once (a guard's
    /// drop): whether to send the release to the store (only for units the store
    /// admitted, while it is up); if not, `key` is dirty, for the next renewal to write.
    fn give_back(&self, key: u64, n: u64, source: Source) -> bool {
        let (remote, held) = self.lessee();
        let send = source == Source::Store && remote.store().is_up();
        held.sub(key, n, !send);
        send
    }

    /// Renews the lease of `key`, whose count here is `count` (`dirty`: Redis may
    /// disagree); whether the store answered.
    fn renew_key(
        self: Arc<Self>,
        key: u64,
        count: u64,
        dirty: bool,
    ) -> impl Future<Output = bool> + Send;

    /// What else a round renews, as tasks added to `calls` (concurrency's global and
    /// group counters); nothing by default.
    fn renew_more(self: &Arc<Self>, calls: &mut tokio::task::JoinSet<()>) {
        let _ = calls;
    }
}

/// Starts the renewals of `leased` on `store`'s runtime, every third of its lease (at
/// least 1 ms); they end when the last `Arc` of `leased` is gone.
pub(crate) fn renew_every_third<L: Leased>(store: &RedisStore, leased: &Arc<L>) {
    let every = (store.config().tuning.lease / 3).max(Duration::from_millis(1));
    store
        .handle()
        .spawn(renew_loop(Arc::downgrade(leased), every));
}

/// One round of renewals every `every` while `leased` lives: every key it holds (or that
/// Redis may disagree about), sent together (one pipelined burst on the multiplexed
/// connection), and whatever else the kind renews.
async fn renew_loop<L: Leased>(leased: Weak<L>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(l) = leased.upgrade() else {
            return;
        };
        if !l.renewing() {
            continue;
        }
        let mut calls = tokio::task::JoinSet::new();
        for (key, count, dirty) in l.lessee().1.to_renew() {
            let l = Arc::clone(&l);
            calls.spawn(async move {
                let held = Arc::clone(&l);
                if l.renew_key(key, count, dirty).await {
                    held.lessee().1.renewed(key, count);
                }
            });
        }
        l.renew_more(&mut calls);
        while calls.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::*;
    use crate::metrics::StoreMetrics;
    use crate::store::redis::{Endpoint, RedisStoreConfig};

    /// A store that never answers (nothing listens on port 1): enough for the seam, whose
    /// calls here are fakes.
    fn store(fallback: Fallback) -> RedisStore {
        let mut config =
            RedisStoreConfig::new("seam", Endpoint::Standalone("redis://127.0.0.1:1/0".into()));
        config.tuning.fallback = fallback;
        config.tuning.probe_every = Duration::from_millis(700);
        RedisStore::new(config, StoreMetrics::unregistered("seam").unwrap()).unwrap()
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// A fake store call: answers `reply`, and says whether it was polled.
    async fn answers<R>(
        polled: &AtomicBool,
        reply: Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        polled.store(true, Ordering::Relaxed);
        reply
    }

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn the_store_answers_and_its_rejections_are_cached_until_retry_after() {
        let remote = Remote::new(&store(Fallback::Local), 64);
        let polled = AtomicBool::new(false);
        let fallback = |_| panic!("the store answered");
        let ask = |at, reply: Verdict| {
            remote.decide(at, answers(&polled, Ok(reply)), |v| v, |v| v, fallback)
        };
        block_on(async {
            let allowed = Verdict::allow(4, 0);
            let got = ask((7, 1, 0), allowed).await;
            assert_eq!((got.value, got.source), (allowed, Source::Store));
            assert!(polled.swap(false, Ordering::Relaxed));
            // A rejection of 2 for 1 s is remembered: a request of 2 or more is answered
            // locally, counting down, without a call; a request of 1 may fit: it asks.
            let rejected = Verdict::reject(0, 3 * SEC, SEC);
            let got = ask((7, 2, 0), rejected).await;
            assert_eq!((got.value, got.source), (rejected, Source::Store));
            polled.store(false, Ordering::Relaxed);
            let got = ask((7, 3, SEC / 4), allowed).await;
            assert_eq!(got.source, Source::DenyCache);
            assert_eq!(*got, Verdict::reject(0, 3 * SEC - SEC / 4, SEC - SEC / 4));
            assert!(!polled.load(Ordering::Relaxed), "no store call");
            assert_eq!(remote.deny_cache_hits(), 1);
            let got = ask((7, 1, SEC / 4), allowed).await;
            assert_eq!(got.source, Source::Store);
            // Past retry_after the store is asked again.
            let got = ask((7, 2, SEC), allowed).await;
            assert_eq!(got.source, Source::Store);
        });
        assert_eq!(remote.store().metrics().fallback.get(), 0);
    }

    #[test]
    fn a_call_that_times_out_or_errs_is_decided_by_the_configured_fallback() {
        let failures = || {
            [
                StoreError::Timeout,
                StoreError::BreakerOpen,
                StoreError::Reply("a reply of another shape".into()),
            ]
        };
        for fallback in [Fallback::Local, Fallback::Allow, Fallback::Deny] {
            let remote = Remote::new(&store(fallback), 64);
            let polled = AtomicBool::new(false);
            for (i, failure) in failures().into_iter().enumerate() {
                let got = block_on(remote.decide(
                    (1, 1, 0),
                    answers::<Verdict>(&polled, Err(failure)),
                    |_| panic!("no reply"),
                    |_| panic!("nothing cached"),
                    |f| match f {
                        Fallback::Local => Verdict::allow(9, 0),
                        Fallback::Allow => Verdict::allow(100, 0),
                        Fallback::Deny => remote.denied(),
                    },
                ));
                assert_eq!(got.source, Source::Fallback, "{fallback:?}");
                let want = match fallback {
                    Fallback::Local => Verdict::allow(9, 0),
                    Fallback::Allow => Verdict::allow(100, 0),
                    Fallback::Deny => Verdict::reject(0, 0, 700_000_000),
                };
                assert_eq!(got.value, want, "{fallback:?}");
                assert_eq!(remote.store().metrics().fallback.get(), i as u64 + 1);
            }
            // A fallback's rejection is not the store's: never cached.
            assert_eq!(remote.deny_cache_hits(), 0);
        }
    }

    #[test]
    fn without_a_deny_cache_every_request_reaches_the_store() {
        let remote = Remote::new(&store(Fallback::Local), 0);
        let polled = AtomicBool::new(false);
        block_on(async {
            for _ in 0..3 {
                let got = remote
                    .decide(
                        (5, 1, 0),
                        answers(&polled, Ok(Verdict::reject(0, SEC, SEC))),
                        |v| v,
                        |_| panic!("no cache"),
                        |_| panic!("the store answered"),
                    )
                    .await;
                assert_eq!(got.source, Source::Store);
                assert!(polled.swap(false, Ordering::Relaxed));
            }
        });
        let got = block_on(remote.call(
            answers(&polled, Ok(3u64)),
            |n| n + 1,
            |_| panic!("answered"),
        ));
        assert_eq!((got.value, got.source), (4, Source::Store));
        let got = block_on(remote.call(
            answers::<u64>(&polled, Err(StoreError::Timeout)),
            |n| n + 1,
            |_| 0,
        ));
        assert_eq!((got.value, got.source), (0, Source::Fallback));
        assert_eq!(got.map(|n| n + 2).value, 2);
    }

    /// A leased kind whose renewals are counted, not sent.
    struct Fake {
        remote: Remote,
        held: Held,
        up: AtomicBool,
        renewed: AtomicU64,
        more: AtomicU64,
    }

    impl Leased for Fake {
        fn renewing(&self) -> bool {
            self.up.load(Ordering::Relaxed)
        }

        fn lessee(&self) -> (&Remote, &Held) {
            (&self.remote, &self.held)
        }

        async fn renew_key(self: Arc<Self>, key: u64, count: u64, dirty: bool) -> bool {
            assert!(key == 1 && count == 2 || key == 3 && count == 1 && !dirty);
            self.renewed.fetch_add(1, Ordering::Relaxed);
            true
        }

        fn renew_more(self: &Arc<Self>, _calls: &mut tokio::task::JoinSet<()>) {
            self.more.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn renewals_run_while_the_store_is_up_and_end_with_the_limiter() {
        let fake = Arc::new(Fake {
            remote: Remote::new(&store(Fallback::Local), 0),
            held: Held::new(),
            up: AtomicBool::new(false),
            renewed: AtomicU64::new(0),
            more: AtomicU64::new(0),
        });
        fake.held.add(1, 2, true);
        fake.held.add(3, 1, false);
        block_on(async move {
            let rounds = tokio::spawn(renew_loop(Arc::downgrade(&fake), Duration::from_millis(1)));
            // Down: nothing is sent.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(fake.renewed.load(Ordering::Relaxed), 0);
            assert_eq!(fake.more.load(Ordering::Relaxed), 0);
            fake.up.store(true, Ordering::Relaxed);
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while fake.more.load(Ordering::Relaxed) < 2 {
                assert!(std::time::Instant::now() < deadline, "no renewal round");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // Each round renews both keys (one held, one dirty) and the kind's rest.
            assert!(fake.renewed.load(Ordering::Relaxed) >= 2);
            drop(fake);
            tokio::time::timeout(Duration::from_secs(30), rounds)
                .await
                .expect("the renewals end with the limiter")
                .unwrap();
        });
    }
}
