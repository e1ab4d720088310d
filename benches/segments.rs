//! Segment benchmark: file size, resident memory, load time and membership time of
//! roaring-bitmap segments (`tollgate::segments`), for random and dense ID sets.
//!
//! Per row: the set is built with `Segment::from_ids` (or `from_treemap` for dense ranges),
//! written with `write_to` into a temporary directory, dropped, and loaded back with
//! `Segment::load`: the row describes the loaded segment, as the proxy holds it.
//! - *file bytes*: the file `write_to` wrote.
//! - *heap*: live heap of the loaded segment, from a counting global allocator over
//!   mimalloc (the proxy's allocator) that adds up `mi_usable_size` of each block, so size
//!   classes are counted; mimalloc's page-level slack is not.
//! - *cold ns*: ns per `contains(u64)` and per `contains_bytes` (ASCII decimal) over a stream
//!   of probes, half drawn from the set, half uniform in `[0, 2 × max]`, in random order: the
//!   worst case, every lookup a likely cache miss on a large set.
//! - *hot ns*: `contains_bytes` over 1024 distinct probes cycled (same mix), which stay in
//!   cache: what repeat customers cost.
//! - *sorted Vec ns*: a yardstick, `binary_search` over the same IDs as a sorted `Vec<u64>`
//!   with the same cold and hot probes: the machine's memory latency and noise, not ours.
//!
//! Timings are this thread's CPU time (not wall time: the machine is shared), median of
//! 3 rounds; load ms is CPU time too. Nothing is asserted: targets are printed as PASS/MISS
//! lines (10 M random 32-bit IDs in ≤ 25 MB of heap; membership ≤ 50 ns).
//!
//! Run: `nice cargo bench --bench segments` (about 30 s on 2 cores). The 100 M random row
//! needs `TOLLGATE_SEGMENTS_100M=1` (about 1 min more and ~2 GB of transient memory).
//! `cargo test --all-targets` runs this binary without `--bench`, as a smoke test on tiny
//! sets.

// A benchmark may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use mimalloc::MiMalloc;
use roaring::RoaringTreemap;
use tollgate::segments::Segment;

// ---------------------------------------------------------------------------------------
// Counting allocator over mimalloc: live bytes as mimalloc's usable sizes.

extern "C" {
    // Part of the mimalloc library the `mimalloc` crate links; the crate only wraps it
    // behind its `extended` feature.
    fn mi_usable_size(p: *const c_void) -> usize;
}

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

fn usable(p: *mut u8) -> usize {
    // SAFETY: `p` is a live block from mimalloc (callers check for null).
    unsafe { mi_usable_size(p as *const c_void) }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = MiMalloc.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(usable(p), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = MiMalloc.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(usable(p), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        LIVE.fetch_sub(usable(p), Ordering::Relaxed);
        MiMalloc.dealloc(p, layout);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = usable(p);
        let q = MiMalloc.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_sub(old, Ordering::Relaxed);
            LIVE.fetch_add(usable(q), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------------------------
// Sets and probes

/// splitmix64: a fixed, seedable stream of well-mixed `u64`s.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (Lemire's multiply-high; the tiny bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

enum Kind {
    /// `n` distinct IDs uniform in `[0, span)`.
    Random { span: u64 },
    /// `[0, n)`.
    Dense,
}

struct Case {
    name: String,
    n: u64,
    kind: Kind,
}

fn build(case: &Case, rng: &mut SplitMix) -> Segment {
    match case.kind {
        Kind::Dense => {
            let mut ids = RoaringTreemap::new();
            ids.insert_range(0..case.n);
            Segment::from_treemap(ids)
        }
        Kind::Random { span } => {
            // Draw until `n` distinct: a roaring set dedups as it goes.
            let mut ids = RoaringTreemap::new();
            while ids.len() < case.n {
                let missing = case.n - ids.len();
                let mut batch: Vec<u64> = (0..missing).map(|_| rng.below(span)).collect();
                batch.sort_unstable();
                ids.extend(batch);
            }
            Segment::from_treemap(ids)
        }
    }
}

/// Half members (uniform over the set by rank), half uniform in `[0, 2 × max]`, shuffled.
fn probes(segment: &Segment, count: usize, rng: &mut SplitMix) -> Vec<u64> {
    let ids = segment.ids();
    let len = ids.len().max(1);
    let span = ids.max().unwrap_or(0).saturating_mul(2).saturating_add(1);
    let mut ranks: Vec<u64> = (0..count / 2).map(|_| rng.below(len)).collect();
    ranks.sort_unstable();
    // One ordered pass to turn ranks into members.
    let mut members = Vec::with_capacity(ranks.len());
    let mut iter = ids.iter().enumerate();
    let mut current = iter.next();
    for rank in ranks {
        while let Some((i, id)) = current {
            if i as u64 == rank {
                members.push(id);
                break;
            }
            current = iter.next();
        }
    }
    let mut all: Vec<u64> = members;
    all.extend((0..count - all.len()).map(|_| rng.below(span)));
    for i in (1..all.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    all
}

/// Probes as ASCII decimal, packed: `(bytes, ends)`.
fn decimal(probes: &[u64]) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::with_capacity(probes.len() * 12);
    let mut ends = Vec::with_capacity(probes.len());
    for p in probes {
        bytes.extend_from_slice(p.to_string().as_bytes());
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// This thread's CPU time in ns: on a shared, loaded machine, wall time would count the
/// time other processes hold the core; CPU time only counts ours (cache pollution by
/// neighbours still shows).
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn median3(mut f: impl FnMut() -> f64) -> f64 {
    let mut t = [f(), f(), f()];
    t.sort_by(f64::total_cmp);
    t[1]
}

fn ns_contains(segment: &Segment, probes: &[u64]) -> f64 {
    median3(|| {
        let start = cpu_ns();
        let mut hits = 0u64;
        for &p in probes {
            hits += u64::from(segment.contains(black_box(p)));
        }
        black_box(hits);
        (cpu_ns() - start) as f64 / probes.len() as f64
    })
}

fn ns_contains_bytes(
    segment: &Segment,
    (bytes, ends): &(Vec<u8>, Vec<usize>),
    rounds: usize,
) -> f64 {
    median3(|| {
        let start = cpu_ns();
        let mut hits = 0u64;
        for _ in 0..rounds {
            let mut from = 0;
            for &end in ends {
                hits += u64::from(segment.contains_bytes(black_box(&bytes[from..end])));
                from = end;
            }
        }
        black_box(hits);
        (cpu_ns() - start) as f64 / (ends.len() * rounds) as f64
    })
}

fn ns_binary_search(sorted: &[u64], probes: &[u64], rounds: usize) -> f64 {
    median3(|| {
        let start = cpu_ns();
        let mut hits = 0u64;
        for _ in 0..rounds {
            for &p in probes {
                hits += u64::from(sorted.binary_search(&black_box(p)).is_ok());
            }
        }
        black_box(hits);
        (cpu_ns() - start) as f64 / (probes.len() * rounds) as f64
    })
}

struct Row {
    name: String,
    ids: u64,
    file_bytes: u64,
    heap: usize,
    load_ms: f64,
    cold_contains: f64,
    cold_bytes: f64,
    hot_bytes: f64,
    vec_cold: f64,
    vec_hot: f64,
    member_share: f64,
}

fn run(case: &Case, probe_count: usize, dir: &std::path::Path) -> Row {
    let mut rng = SplitMix(0x5E67_3E47 ^ case.n);
    let path = dir.join("segment.roaring");
    {
        let built = build(case, &mut rng);
        built.write_to(&path).expect("write the segment");
    }
    let before = LIVE.load(Ordering::Relaxed);
    let start = cpu_ns();
    let segment = Segment::load(&path).expect("load the segment");
    let load_ms = (cpu_ns() - start) as f64 / 1e6;
    let heap = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    let file_bytes = std::fs::metadata(&path).expect("file").len();

    let cold = probes(&segment, probe_count, &mut rng);
    let member_share =
        cold.iter().filter(|&&p| segment.contains(p)).count() as f64 / cold.len() as f64;
    let cold_contains = ns_contains(&segment, &cold);
    let cold_text = decimal(&cold);
    let cold_bytes = ns_contains_bytes(&segment, &cold_text, 1);
    let hot = decimal(&cold[..1024.min(cold.len())]);
    let hot_bytes = ns_contains_bytes(&segment, &hot, probe_count / 1024);
    // Yardstick: a binary search over the IDs as a sorted Vec<u64> (8 bytes per ID), on
    // the same probes, to tell the machine's memory latency from the structure's cost.
    let sorted: Vec<u64> = segment.ids().iter().collect();
    let vec_cold = ns_binary_search(&sorted, &cold, 1);
    let hot_probes: Vec<u64> = cold[..1024.min(cold.len())].to_vec();
    let vec_hot = ns_binary_search(&sorted, &hot_probes, probe_count / 1024);
    drop(sorted);
    Row {
        name: case.name.clone(),
        ids: segment.len(),
        file_bytes,
        heap,
        load_ms,
        cold_contains,
        cold_bytes,
        hot_bytes,
        vec_cold,
        vec_hot,
        member_share,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without
    // it, as a smoke test that the bench still builds and runs, on tiny sets.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let big = std::env::var("TOLLGATE_SEGMENTS_100M").is_ok_and(|v| v == "1");
    let (m, probe_count) = if smoke {
        (1_000, 20_000)
    } else {
        (1_000_000, 2_000_000)
    };
    let u32_span = 1u64 << 32;
    let mut cases = vec![
        Case {
            name: "random 32-bit".into(),
            n: m,
            kind: Kind::Random { span: u32_span },
        },
        Case {
            name: "random 32-bit".into(),
            n: 10 * m,
            kind: Kind::Random { span: u32_span },
        },
    ];
    if big {
        cases.push(Case {
            name: "random 32-bit".into(),
            n: 100 * m,
            kind: Kind::Random { span: u32_span },
        });
    }
    cases.extend([
        Case {
            name: "random in [0, 4n)".into(),
            n: 10 * m,
            kind: Kind::Random { span: 40 * m },
        },
        Case {
            name: "random 64-bit".into(),
            n: m,
            kind: Kind::Random { span: u64::MAX },
        },
        Case {
            name: "dense [0, n)".into(),
            n: m,
            kind: Kind::Dense,
        },
        Case {
            name: "dense [0, n)".into(),
            n: 10 * m,
            kind: Kind::Dense,
        },
        Case {
            name: "dense [0, n)".into(),
            n: 100 * m,
            kind: Kind::Dense,
        },
    ]);

    let dir = tempfile::tempdir().expect("temporary directory");
    println!(
        "| set | IDs | file bytes | bytes/ID | heap MB | heap bytes/ID | load ms | \
         contains ns (cold) | contains_bytes ns (cold) | contains_bytes ns (hot) | sorted Vec ns (cold / hot) | \
         probes in set |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for case in &cases {
        let row = run(case, probe_count, dir.path());
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {:.0}% |",
            row.name,
            row.ids,
            row.file_bytes,
            row.file_bytes as f64 / row.ids as f64,
            row.heap as f64 / 1e6,
            row.heap as f64 / row.ids as f64,
            row.load_ms,
            row.cold_contains,
            row.cold_bytes,
            row.hot_bytes,
            row.vec_cold,
            row.vec_hot,
            row.member_share * 100.0,
        );
        rows.push(row);
    }
    if smoke {
        return;
    }
    if let Some(ten_m) = rows
        .iter()
        .find(|r| r.name == "random 32-bit" && r.ids == 10 * m)
    {
        let verdict = if ten_m.heap <= 25_000_000 {
            "PASS"
        } else {
            "MISS"
        };
        println!(
            "{verdict}: 10 M random 32-bit IDs take {:.2} MB of heap (target ≤ 25 MB)",
            ten_m.heap as f64 / 1e6
        );
    }
    for row in &rows {
        let worst = row.cold_bytes.max(row.hot_bytes);
        let verdict = if worst <= 50.0 { "PASS" } else { "MISS" };
        println!(
            "{verdict}: {} ({} IDs) membership: cold {:.1} ns, hot {:.1} ns (target ≤ 50 ns)",
            row.name, row.ids, row.cold_bytes, row.hot_bytes
        );
    }
}
