//! A kept-alive connection's idle timeout (`server.keepalive_timeout`), armed once per
//! timeout rather than once per request.
//!
//! Registering a timer in Pingora's timer wheel costs about 1 100 instructions (a clock
//! read, a lookup under the wheel's read lock, an `Arc<Notify>` subscription and its drop):
//! a connection that sends a request every few milliseconds paid it on every request (1%
//! of a proxied request, `docs/performance.md`). Here one timer is armed when the
//! connection first waits, and each later wait only records when it began ([`start`]).
//! When the timer fires, the connection has timed out if its current wait began at least
//! `timeout` ago; otherwise the timer is armed again for what is left of it. So a
//! connection still closes between `timeout` and `timeout` + the wheel's 10 ms resolution
//! after its last wait began, and a busy one re-arms about once per `timeout`.
//!
//! [`start`]: IdleTimer::start

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pingora_timeout::fast_timeout::fast_sleep;

/// One connection's idle timer (module doc).
pub struct IdleTimer {
    /// The timeout of the current wait.
    timeout: Duration,
    /// When the current wait began.
    since: Instant,
    /// The armed timer, if any: it fires no later than `since + timeout` plus the wheel's
    /// resolution, and never before the previous wait's deadline.
    armed: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Default for IdleTimer {
    fn default() -> Self {
        Self {
            timeout: Duration::ZERO,
            since: Instant::now(),
            armed: None,
        }
    }
}

impl IdleTimer {
    /// A wait of at most `timeout` begins now. A timeout other than the armed one (a
    /// reload changed it) disarms the timer, so a shorter one is not served late.
    pub fn start(&mut self, timeout: Duration) {
        self.since = Instant::now();
        if timeout != self.timeout {
            self.timeout = timeout;
            self.armed = None;
        }
    }

    /// The current wait's timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Ready once the current wait has lasted its whole timeout; registers `cx` to be woken
    /// by the timer otherwise.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(timer) = self.armed.as_mut() {
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            // Fired (or not armed yet): what is left of the current wait's timeout.
            let left = self.timeout.saturating_sub(self.since.elapsed());
            if left.is_zero() {
                self.armed = None;
                return Poll::Ready(());
            }
            self.armed = Some(Box::pin(fast_sleep(left)));
        }
    }
}
