//! One budget for every store call of one request phase.
//!
//! A store's `timeout` bounds what a request phase waits for the store, whatever the number
//! of shared limits in it: [`phase`] runs a phase (the decision loop,
//! `crate::runtime::decide::run`) with a deadline that the phase's first store call starts,
//! at that call's store budget, and every later call of the phase gets only what is left.
//! A call with nothing left is not sent: it returns
//! [`StoreError::Timeout`](crate::store::StoreError::Timeout) at once, counted as `timeout`
//! but not as a failure for the breaker (the store did not miss anything), and its limit's
//! fallback decides. So six shared limits in a frozen Redis cost a request one budget per
//! phase, not six.
//!
//! The deadline is a tokio task-local of the phase's future, so the store calls under it
//! need no extra argument: a call made outside any phase (the limiter API, the admin API,
//! background refunds and renewals) has its own budget. Calls a phase makes together (the
//! two halves of a Cluster concurrency decision) share the deadline. Each call is bounded
//! by its own store's budget counted from the phase's first call, so with two stores of
//! different budgets neither waits past its own.

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

tokio::task_local! {
    /// The start of the running phase's first store call (`None` until it is made).
    static PHASE: Cell<Option<Instant>>;
}

/// Runs `work`, one request phase, with one store budget for all its calls (module doc).
pub async fn phase<F: Future>(work: F) -> F::Output {
    PHASE.scope(Cell::new(None), work).await
}

/// What a store call whose store's budget is `budget` may wait now: all of it outside a
/// phase or for the phase's first call, what is left of it from the first call's start
/// otherwise (zero once spent).
pub(crate) fn left(budget: Duration) -> Duration {
    PHASE
        .try_with(|start| match start.get() {
            Some(first) => budget.saturating_sub(first.elapsed()),
            None => {
                start.set(Some(Instant::now()));
                budget
            }
        })
        .unwrap_or(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_shares_one_budget_and_outside_each_call_has_its_own() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let budget = Duration::from_millis(40);
        assert_eq!(left(budget), budget, "no phase: the whole budget");
        rt.block_on(async {
            let (first, later) = phase(async {
                let first = left(budget);
                tokio::time::sleep(Duration::from_millis(15)).await;
                (first, left(budget))
            })
            .await;
            assert_eq!(first, budget);
            assert!(later <= budget - Duration::from_millis(15), "{later:?}");
            let spent = phase(async {
                left(budget);
                tokio::time::sleep(budget).await;
                left(budget)
            })
            .await;
            assert_eq!(spent, Duration::ZERO);
            // A new phase starts afresh.
            assert_eq!(phase(async { left(budget) }).await, budget);
        });
    }
}
