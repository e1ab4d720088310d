//! Smyte's commands and the ad-hoc bucket table against what the limiter API guide (docs/limiter-api.md) says (issue 19,
//! item 14): the table evicts before it is full, at the rates that guide gives (measured
//! here on the real table); `RL.PREDUCE` and `RL.PGET` take their times in milliseconds
//! (`redis-cli` against the binary); `AT`'s error says seconds, fractions allowed.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;

use api::redis_cli;
use common::start_api;
use tollgate::limits::{AdhocBuckets, AdhocParams};

/// The sentence of docs/limiter-api.md that gives the eviction rates this test measures.
const RATES: &str = "about 0.01% at 25%, 0.8% at 50%, 5% at 75% and 14% at 100%";

/// splitmix64: well-spread keys, as the API's seeded hash makes them.
fn key(i: u64) -> u64 {
    let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The share of new keys that evicted another when `load · slots` distinct keys each took
/// a token (so that each holds state) from a table of `slots`.
fn eviction_share(slots: usize, load: f64) -> f64 {
    let table = AdhocBuckets::new(slots);
    let params = AdhocParams {
        capacity: 10,
        amount: 10,
        every: 3_600_000_000_000,
    };
    let n = (slots as f64 * load) as u64;
    for i in 0..n {
        assert!(table.acquire(key(i), params, 1, false, 1).allowed);
    }
    table.evictions() as f64 / n as f64
}

#[test]
fn the_table_evicts_before_it_is_full_at_the_rates_the_readme_gives() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/limiter-api.md"))
            .unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        readme.contains(RATES),
        "the guide gives the eviction rates: {RATES}"
    );
    assert!(
        !readme.contains("when the table is full the bucket nearest to full is evicted"),
        "the guide no longer says it evicts only when full"
    );
    // The guide's figures, as measured on a 200 000-slot table (the size).
    for (load, documented) in [(0.25, 0.0001), (0.5, 0.008), (0.75, 0.05), (1.0, 0.14)] {
        let measured = eviction_share(200_000, load);
        let (low, high) = if load == 0.25 {
            (0.0, 0.0005)
        } else {
            (documented * 0.8, documented * 1.25)
        };
        assert!(
            (low..=high).contains(&measured),
            "at {load}: measured {measured}, documented {documented}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn millisecond_commands_and_the_at_message_through_redis_cli() {
    let (_t, port) = start_api("", "").await;
    // Two per 1.5 s, on the caller's clock in milliseconds.
    let at = |ms: &str| {
        redis_cli(port, &["RL.PREDUCE", "ms", "2", "1500", "AT", ms])
            .trim()
            .to_string()
    };
    assert_eq!(at("1700000000000"), "2");
    assert_eq!(at("1700000000001"), "1");
    assert_eq!(at("1700000001499.5"), "0");
    assert_eq!(at("1700000001500"), "2", "refilled after 1500 ms");
    let get = redis_cli(port, &["RL.PGET", "ms", "2", "1500", "AT", "1700000001500"]);
    assert_eq!(get.trim(), "1");
    // The same bucket as RL.REDUCE with the same period in seconds.
    assert_eq!(
        redis_cli(port, &["RL.PREDUCE", "s", "3", "60000"]).trim(),
        "3"
    );
    assert_eq!(redis_cli(port, &["RL.GET", "s", "3", "60"]).trim(), "2");
    let err = redis_cli(port, &["RL.REDUCE", "k", "2", "60", "AT", "1.5x"]);
    assert_eq!(
        err.trim(),
        "ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got '1.5x'"
    );
}
