//! When to order: a certificate is renewed two thirds into its lifetime (30 days before
//! the end of a 90-day Let's Encrypt certificate, 2 days before the end of a 6-day one),
//! and a failed order is tried again after a backoff that doubles from `retry.min` up to
//! `retry.max`, each wait jittered by ±25 % so that a fleet's instances (and the hosts of
//! one instance) do not retry in step.
//!
//! Pure functions of their inputs: time and randomness are passed in.

use std::time::Duration;

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is renewed:
/// two thirds into its lifetime.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    let life = (not_after - not_before).max(0);
    not_before + life * 2 / 3
}

/// The wait after the `failures`-th failure in a row (1 for the first): `min × 2^(n-1)`,
/// at most `max`, times a factor in [0.75, 1.25) drawn from `random` (uniform over u64),
/// never more than `max` nor less than `min / 2`.
pub fn backoff(failures: u32, min: Duration, max: Duration, random: u64) -> Duration {
    let doublings = failures.saturating_sub(1).min(40);
    let base = min
        .checked_mul(1u32 << doublings.min(31))
        .unwrap_or(max)
        .min(max);
    let unit = random as f64 / u64::MAX as f64;
    let jittered = base.mul_f64(0.75 + 0.5 * unit);
    jittered.min(max).max(min / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_two_thirds_in() {
        let day = 86_400;
        assert_eq!(renew_at(0, 90 * day), 60 * day);
        assert_eq!(renew_at(1000, 1000 + 6 * day), 1000 + 4 * day);
        assert_eq!(
            renew_at(10, 5),
            10,
            "a certificate ending before it starts: now"
        );
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_bounded_jitter() {
        let (min, max) = (Duration::from_secs(60), Duration::from_secs(3600));
        let mid = u64::MAX / 2;
        let secs = |n| backoff(n, min, max, mid).as_secs_f64().round() as u64;
        assert_eq!([secs(1), secs(2), secs(3), secs(4)], [60, 120, 240, 480]);
        assert_eq!(secs(7), 3600, "capped");
        assert_eq!(secs(1000), 3600, "no overflow");
        assert_eq!(backoff(1, min, max, 0), Duration::from_secs(45));
        assert!(backoff(1, min, max, u64::MAX) <= Duration::from_secs(75));
        assert_eq!(backoff(7, min, max, u64::MAX), max, "never past the cap");
    }
}
