//! Helpers the limiters' unit tests share (test builds only): spreading small keys over a
//! table's sets or mixing them into hash-like keys, racing threads on one key or on fresh
//! keys, filling a table past its slots and flooding it with fresh keys.

use crate::limits::clock::Nanos;

/// Spreads small test keys over the sets, as real (hashed) keys are.
pub(crate) fn spread(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Keys as the limiters see them, well-mixed 64-bit hashes: SplitMix64's finaliser of `i`
/// (every bit of the key depends on every bit of `i`, unlike [`spread`]'s).
pub(crate) fn mixed(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `threads` threads at once, thread `t` making the attempts `admit(t, i)` for `i` in
/// `0..tries`; returns how many were admitted over all of them.
pub(crate) fn admitted_on_threads(
    threads: u64,
    tries: u64,
    admit: impl Fn(u64, u64) -> bool + Sync,
) -> u64 {
    let admit = &admit;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (0..tries).filter(|&i| admit(t, i)).count() as u64))
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    })
}

/// Four threads at once each send 20 000 fresh keys (`admit(key, at)`, key `i` at `i`
/// ns), every one of which must be admitted: a small table evicts all along.
pub(crate) fn fresh_keys_on_threads(admit: impl Fn(u64, Nanos) -> bool + Sync) {
    let admit = &admit;
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || assert!((0..20_000).all(|i| admit(spread(t << 20 | i), i))));
        }
    });
}

/// Admits 200 000 fresh keys (`admit(key)` must allow each) into a table of `max_keys`
/// 1 000, checking every 997th that `len()` never exceeds it; returns `len()` at the end.
pub(crate) fn fill_past_the_slots(
    mut admit: impl FnMut(u64) -> bool,
    len: impl Fn() -> usize,
) -> usize {
    for i in 0..200_000 {
        assert!(admit(spread(i)));
        if i % 997 == 0 {
            assert!(len() <= 1_000, "len {}", len());
        }
    }
    len()
}

/// Requests sent by fresh keys, `times` each (`send(key, at)`, 10 µs apart from `from`),
/// until `freed(at)` says a capped key would be admitted again; `None` if it still is not
/// after `most`.
pub(crate) fn flood_frees(
    mut send: impl FnMut(u64, Nanos),
    freed: impl Fn(Nanos) -> bool,
    (times, most): (u64, u64),
    from: Nanos,
) -> Option<u64> {
    let mut sent = 0;
    for i in 0.. {
        let key = spread(1_000_000 + i);
        for _ in 0..times {
            send(key, from + sent * 10_000);
            sent += 1;
        }
        if freed(from + sent * 10_000) {
            return Some(sent);
        }
        if sent >= most {
            return None;
        }
    }
    None
}
