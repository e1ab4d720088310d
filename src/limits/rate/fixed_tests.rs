//! The fixed window's tests ([`RateWindow::Fixed`]), at injected instants: counts reset
//! at each multiple of `per`, `reset_after` and `retry_after` name that boundary.

use super::*;

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;

fn fixed(per: Nanos) -> RateLimiter {
    RateLimiter::with_window(per, RateWindow::Fixed, 1_000)
}

/// Admissions of unit events for key 1 at `now` until the first rejection (at most 1 000).
fn admit_all(l: &RateLimiter, max: u64, now: Nanos) -> u64 {
    (0..1_000)
        .take_while(|_| l.acquire(1, max, 1, false, now).allowed)
        .count() as u64
}

#[test]
fn a_full_quota_on_each_side_of_a_boundary() {
    let (f, s) = (fixed(SEC), RateLimiter::new(SEC, 1_000));
    // The last millisecond of period 4, then the first of period 5.
    let before = 5 * SEC - MS;
    assert_eq!(admit_all(&f, 10, before), 10);
    assert_eq!(
        admit_all(&f, 10, 5 * SEC),
        10,
        "the documented double burst"
    );
    // A sliding window lets almost nothing more through at the boundary.
    assert_eq!(admit_all(&s, 10, before), 10);
    assert_eq!(admit_all(&s, 10, 5 * SEC), 0);
    assert_eq!(f.window(), RateWindow::Fixed);
    assert_eq!(s.window(), RateWindow::Sliding);
}

#[test]
fn reset_after_counts_down_to_the_boundary() {
    let l = fixed(60 * SEC);
    // 12.5 s into a minute.
    let now = 600 * SEC + 12_500 * MS;
    let v = l.acquire(1, 3, 1, false, now);
    assert!(v.allowed);
    assert_eq!((v.remaining, v.reset_after), (2, 47_500 * MS));
    let later = l.acquire(1, 3, 1, false, now + 40 * SEC);
    assert_eq!((later.remaining, later.reset_after), (1, 7_500 * MS));
    // Rejected: retry exactly at the boundary, not a nanosecond before.
    assert!(l.acquire(1, 3, 1, false, now + 41 * SEC).allowed);
    let refused = l.acquire(1, 3, 1, false, now + 41 * SEC);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, 6_500 * MS);
    assert_eq!(refused.reset_after, 6_500 * MS);
    let boundary = now + 41 * SEC + refused.retry_after;
    assert_eq!(boundary, 660 * SEC);
    assert!(!l.acquire(1, 3, 1, false, boundary - 1).allowed);
    let next = l.acquire(1, 3, 1, false, boundary);
    assert!(next.allowed);
    assert_eq!((next.remaining, next.reset_after), (2, 60 * SEC));
}

#[test]
fn a_window_frees_its_slot_at_the_boundary() {
    let l = fixed(SEC);
    l.acquire(7, 5, 1, false, 3 * SEC + 900 * MS);
    assert_eq!(l.state(7, 3 * SEC + 999 * MS), 1.0);
    // One period on, nothing weighs (a sliding window would still hold 0.9).
    assert_eq!(l.state(7, 4 * SEC + 100 * MS), 0.0);
    l.acquire(8, 5, 1, false, 4 * SEC + 100 * MS);
    assert_eq!(l.len(), 2, "key 7 keeps its slot until touched or reused");
    l.refund(7, 1, 4 * SEC + 200 * MS);
    assert_eq!(l.len(), 1);
}

#[test]
fn grants_strict_counts_and_blocks() {
    let l = fixed(SEC);
    // Between 2 and 8 of a room of 5: 5 counted.
    let g = l.acquire_many(1, 5, 2, 8, false, 0);
    assert_eq!((g.granted, g.verdict.remaining), (5, 0));
    let refused = l.acquire_many(1, 5, 1, 1, true, 100 * MS);
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.retry_after, 900 * MS);
    // Strict counted the refusal; still reset at the boundary.
    assert_eq!(l.state(1, 100 * MS), 6.0);
    assert_eq!(admit_all(&l, 5, SEC), 5);
    // A cost above max never passes and invites no retry.
    let never = l.acquire(2, 5, 6, false, 0);
    assert_eq!((never.allowed, never.retry_after), (false, NEVER));
}

#[test]
fn an_import_drops_the_previous_period() {
    let l = fixed(SEC);
    let saved = RateWindowEntry {
        key: 9,
        period: 4,
        prev: 7,
        curr: 2,
    };
    l.import(saved, 4 * SEC + 10 * MS);
    assert_eq!(l.state(9, 4 * SEC + 10 * MS), 2.0);
    assert_eq!(admit_all_key(&l, 9, 5, 4 * SEC + 20 * MS), 3);
    // A window saved in an earlier period is empty now.
    let stale = RateWindowEntry { key: 10, ..saved };
    l.import(stale, 5 * SEC);
    assert_eq!(l.state(10, 5 * SEC), 0.0);
}

fn admit_all_key(l: &RateLimiter, key: u64, max: u64, now: Nanos) -> u64 {
    (0..1_000)
        .take_while(|_| l.acquire(key, max, 1, false, now).allowed)
        .count() as u64
}
