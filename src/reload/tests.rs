//! The reloader's tests, beside its file (`reload.rs`) to keep it one job long.

use super::*;

/// A file containing this line makes its reload panic: the fault the reloader must
/// survive (a bug in a build step, say), injected in tests only.
const PANIC_MARKER: &str = "# test: panic while reloading";

pub(super) fn fault(snapshot: &Snapshot) {
    let text = String::from_utf8_lossy(&snapshot.bytes);
    if text.contains(PANIC_MARKER) {
        panic!("injected fault");
    }
}

fn origin(name: &str, extra: &str) -> String {
    format!(
        "  {name}:\n    hosts: [{name}.test, www.{name}.test]\n    upstreams: [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n{extra}"
    )
}

const LIMITS: &str = "    limits:\n      r:\n        kind: rate\n        max: 5\n        per: 1s\n        overrides:\n          - match: {customer: x}\n            max: 1\n          - match: {customer: y}\n            max: 2\n      t:\n        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n";

fn config(text: &str) -> Config {
    match config::parse_str(text, "t.yaml") {
        Ok(l) => l.config,
        Err(e) => panic!("{e}"),
    }
}

fn full() -> String {
    format!("origins:\n{}{}", origin("a", LIMITS), origin("b", ""))
}

#[test]
fn removals_name_everything_a_cut_can_lose() {
    let old = config(&full());
    assert_eq!(removals(&old, &old), Vec::<String>::new());
    let text = full();
    // Every line-boundary prefix that still parses loses something, or is the whole.
    let mut valid_prefixes = 0;
    for (cut, _) in text.match_indices('\n') {
        let prefix = &text[..=cut];
        if let Ok(l) = config::parse_str(prefix, "t.yaml") {
            valid_prefixes += 1;
            if prefix.len() < text.len() {
                assert!(
                    !removals(&old, &l.config).is_empty() || prefix_keeps_all(prefix),
                    "a cut after byte {cut} loses nothing:\n{prefix}"
                );
            }
        }
    }
    assert!(valid_prefixes >= 3);

    let cut_b = config(&format!("origins:\n{}", origin("a", LIMITS)));
    assert_eq!(removals(&old, &cut_b), ["origin `b`"]);
    let fewer = full()
        .replace(", www.a.test]", "]")
        .replace(", \"127.0.0.1:2\"]\n    limits", "]\n    limits")
        .replace("          - match: {customer: y}\n            max: 2\n", "")
        .replace("      t:\n        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n", "");
    assert_eq!(
        removals(&old, &config(&fewer)),
        [
            "host `www.a.test` of origin `a`",
            "upstream `127.0.0.1:2` of origin `a`",
            "1 override(s) of limit `r` of origin `a`",
            "limit `t` of origin `a`"
        ]
    );
    // Additions and changed values are not removals.
    let more = full().replace("max: 5", "max: 50") + &origin("c", "");
    assert_eq!(removals(&old, &config(&more)), Vec::<String>::new());
}

/// A prefix that only lost trailing fields that do not remove anything (e.g. the
/// second override's `max`, which then falls back to the limit's): the line-break
/// and settle rules are what cover those.
fn prefix_keeps_all(prefix: &str) -> bool {
    prefix.ends_with("- match: {customer: y}\n")
}

fn snapshot(text: &str) -> Snapshot {
    Snapshot {
        inode: (1, 1),
        len: text.len() as u64,
        modified: None,
        bytes: text.as_bytes().to_vec(),
    }
}

#[test]
fn only_in_place_rewrites_are_held() {
    let old = config(&full());
    let cut_text = format!("origins:\n{}", origin("a", LIMITS));
    let cut = config(&cut_text);
    let in_place = Arrival::InPlace {
        had_final_newline: true,
    };
    let why = looks_partial(in_place, &snapshot(&cut_text), &old, &cut);
    assert_eq!(why.as_deref(), Some("the new text removes origin `b`"));
    for how in [Arrival::Signal, Arrival::Replaced] {
        assert_eq!(looks_partial(how, &snapshot(&cut_text), &old, &cut), None);
    }
    // A cut inside the last line: nothing removed, but the final line break is gone.
    let text = full();
    let mid_line = text.trim_end_matches('\n');
    let new = config(mid_line);
    assert_eq!(
        looks_partial(in_place, &snapshot(mid_line), &old, &new).as_deref(),
        Some("the new text does not end with a line break, as the running one did")
    );
    let without = Arrival::InPlace {
        had_final_newline: false,
    };
    assert_eq!(
        looks_partial(without, &snapshot(mid_line), &old, &new),
        None
    );
}

fn counted(metrics: &Metrics, result: &str) -> u64 {
    metrics
        .config_reloads_total
        .with_label_values(&[result])
        .get()
}

#[test]
fn a_panicking_attempt_is_a_counted_failure() {
    let metrics = Metrics::new().unwrap();
    let result = attempt(&metrics, || panic!("boom {}", 7));
    assert!(
        matches!(&result, Err(ReloadError::Panicked(m)) if m == "boom 7"),
        "{result:?}"
    );
    assert_eq!(counted(&metrics, "failure"), 1);
    assert_eq!(counted(&metrics, "success"), 0);
    assert!(attempt(&metrics, || Ok(Carried::default())).is_ok());
    assert_eq!(counted(&metrics, "success"), 1);
}

/// Polls `cond` every 20 ms, at most `tries` times.
async fn eventually(what: &str, tries: usize, cond: impl Fn() -> bool) {
    for _ in 0..tries {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

fn write_in_place(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reloader_survives_a_panic_and_reads_the_next_edit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    let one = format!("origins:\n{}", origin("a", LIMITS));
    std::fs::write(&path, &one).unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let initial = Snapshot::read(&path).unwrap();
    let loaded = initial.parse(&path).unwrap();
    let (rt, _) = Runtime::build(Arc::new(loaded.config), None, &metrics).unwrap();
    let runtime = Arc::new(ArcSwap::from_pointee(rt));
    let reloader = Reloader::new(
        path.clone(),
        runtime.clone(),
        metrics.clone(),
        Some(initial),
        None,
    );
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let (ready, mut is_ready) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let ready = ServiceReadyNotifier::new(ready);
        reloader.start_with_ready_notifier(shutdown, ready).await
    });
    // Edits made before the directory is watched would go unseen.
    is_ready.wait_for(|r| *r).await.unwrap();
    let origins = || runtime.load().config.origins.len();
    let (m, failures, successes) = (&metrics, "failure", "success");

    // 1. An edit whose reload panics: a counted failure, nothing changes.
    write_in_place(&path, &format!("{one}{PANIC_MARKER}\n{}", origin("b", "")));
    eventually("the panic was counted", 1_000, || counted(m, failures) == 1).await;
    assert_eq!(origins(), 1);

    // 2. The next edit is still read, and applies.
    write_in_place(&path, &format!("{one}{}", origin("b", "")));
    eventually("the next edit applied", 1_000, || {
        counted(m, successes) == 1
    })
    .await;
    assert_eq!(origins(), 2);

    // 3. Rewritten in place without `b`: held (a failure), `b` keeps serving.
    write_in_place(&path, &one);
    eventually("the removal was held", 1_000, || counted(m, failures) == 2).await;
    assert_eq!(origins(), 2);

    // 4. The same text saved by renaming a new file over it: applied.
    let tmp = dir.path().join("tollgate.yaml.tmp");
    std::fs::write(&tmp, &one).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually("the rename applied", 1_000, || counted(m, successes) == 2).await;
    assert_eq!(origins(), 1);

    // 5. The renamed-in file is now the one rewritten in place: an addition applies.
    std::fs::write(dir.path().join("other.txt"), "x").unwrap();
    write_in_place(&path, &format!("{one}{}", origin("c", "")));
    eventually("the next edit applied", 1_000, || {
        counted(m, successes) == 3
    })
    .await;
    assert_eq!(counted(m, failures), 2);
    assert_eq!(origins(), 2);

    stop.send(true).unwrap();
    task.await.unwrap();
}
