//! The releases a shared concurrency limiter sent to the store and that have not landed
//! yet, numbered, so that a reserve Redis refused can wait for the releases sent before it
//! began and ask again (`crate::store::shared_concurrency`, "A release is seen by the next
//! reserve").

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The releases a limiter sent to the store that have not landed yet, by number, so a
/// reserve can wait for those sent before it began (module doc).
#[derive(Default)]
pub(crate) struct Releases {
    /// The number of the next release.
    next: AtomicU64,
    /// Numbers of the releases on their way.
    pending: Mutex<BTreeSet<u64>>,
    /// Woken each time one lands.
    landed: Notify,
}

impl Releases {
    /// A release is sent: its number, for [`Releases::landed`].
    pub(crate) fn sent(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(n);
        n
    }

    /// Release `n` was answered, or given up.
    pub(crate) fn landed(&self, n: u64) {
        self.pending.lock().remove(&n);
        self.landed.notify_waiters();
    }

    /// The number the next release gets: those below it were sent before now.
    pub(crate) fn mark(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Whether a release sent before `mark` is still on its way.
    pub(crate) fn pending_before(&self, mark: u64) -> bool {
        self.pending.lock().first().is_some_and(|&n| n < mark)
    }

    /// Waits until every release sent before `mark` has landed.
    pub(crate) async fn all_landed_before(&self, mark: u64) {
        loop {
            let notified = self.landed.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a landing in between is not missed.
            notified.as_mut().enable();
            if !self.pending_before(mark) {
                return;
            }
            notified.await;
        }
    }
}
