//! Grab's frequency caps through the real proxy: a sliding log over a day and a week, with
//! caps chosen per segment (a roaring-bitmap file built by `tollgate segment build`), a
//! rebuilt segment picked up live, and a corrupt one refused while the old one serves.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{build_segment, client, eventually, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

async fn send(t: &Tollgate, user: &str) -> reqwest::Response {
    client()
        .get(t.url("/"))
        .header("host", "app.test")
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
}

async fn statuses(t: &Tollgate, user: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(send(t, user).await.status().as_u16());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_per_segment_reload_with_the_file_and_refuse_a_corrupt_one() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let seg_dir = tempfile::tempdir().unwrap();
    let segment = seg_dir.path().join("new.roaring");
    build_segment(seg_dir.path(), &[7, 42], &segment);
    let config = format!(
        r#"
{SERVER}segments:
  new: {{ file: "{}", of: "header:x-user-id" }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{}"]
    limits:
      comms:
        kind: sliding_log
        key: [header:x-user-id]
        windows: [{{ max: 3, per: 1d }}, {{ max: 10, per: 7d }}]
        overrides:
          - match: {{ segment: new }}
            windows: [{{ max: 1, per: 1d }}, {{ max: 2, per: 7d }}]
"#,
        segment.display(),
        up.addr
    );
    let t = Tollgate::start(&config).await;
    // A new customer gets one a day; everyone else three.
    assert_eq!(statuses(&t, "7", 2).await, [200, 429]);
    assert_eq!(statuses(&t, "8", 4).await, [200, 200, 200, 429]);
    // A value that is not an integer is simply not a member.
    assert_eq!(statuses(&t, "abc", 4).await, [200, 200, 200, 429]);
    let capped = send(&t, "7").await;
    let retry: u64 = capped.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (86_000..=86_400).contains(&retry),
        "a day's cap frees after about a day: {retry}"
    );

    // A rebuilt file is picked up without a signal: user 9 becomes new.
    build_segment(seg_dir.path(), &[7, 9, 42], &segment);
    let reloads = "tollgate_config_reloads_total{result=\"success\"}";
    eventually("the rebuilt segment is loaded", 500, || async {
        t.metric(reloads).await >= 1.0
    })
    .await;
    assert_eq!(statuses(&t, "9", 2).await, [200, 429]);
    // User 7's log survived the reload (same limit, same override: same state).
    assert_eq!(statuses(&t, "7", 1).await, [429]);

    // A corrupt file is refused with the file named; the loaded segment keeps serving.
    std::fs::write(&segment, b"not a roaring bitmap at all").unwrap();
    let failures = "tollgate_config_reloads_total{result=\"failure\"}";
    eventually("the corrupt segment is refused", 500, || async {
        t.metric(failures).await >= 1.0
    })
    .await;
    assert!(
        t.log_text().contains(&segment.display().to_string()),
        "the log names the file:\n{}",
        t.log_text()
    );
    assert_eq!(statuses(&t, "42", 2).await, [200, 429], "42 is still new");
    assert_eq!(StatusCode::OK, send(&t, "100").await.status());
}
