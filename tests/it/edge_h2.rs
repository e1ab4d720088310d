//! HTTP/2 to clients (issue 20, part B) against the real binary: curl's prior-knowledge
//! h2c, h2load over TLS and h2c against an origin with an inflight and a rate limit (each
//! rejection answers on its stream, every other stream completes, no connection error, the
//! inflight gauge back to 0), units given back when a stream is reset or its connection
//! dies (the `h2` crate as the client, holding requests at a real upstream), and rapid
//! reset for 6 s by reconnecting attackers: each abusive connection is closed before the
//! origin sees more than its reset budget, while a normal client is served throughout.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::{certs, eventually, free_port, Tollgate, Upstream};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2load_streams_get_their_own_rejections_over_tls_and_h2c() {
    let dir = tempfile::tempdir().unwrap();
    let cert = certs::write(dir.path(), "tls", "tls.test", &["tls.test"], 30);
    let (h2c, demo) = (free_port(), free_port());
    // Both limits are reached whatever the machine's speed: the demo upstream holds each
    // request 300 ms while h2load keeps 30 streams open (so more than 15 are in flight),
    // and h2load's pace (100 requests a second per client, so the run lasts at least 2 s)
    // lets more than 20 through the inflight limit before the end.
    let limits = "    limits:\n      rate: { kind: rate, key: [host], max: 20, per: 1m }\n      inflight: { kind: inflight, key: [host], max: 15 }\n";
    let config = format!(
        "server:\n  listen: [{{ addr: \"{{listen}}\", tls: true }}, {{ addr: \"127.0.0.1:{h2c}\", h2c: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n  demo_upstream: \"127.0.0.1:{demo}\"\ntls:\n  certificates:\n    - {{ cert: \"{}\", key: \"{}\" }}\norigins:\n  tls:\n    hosts: [\"tls.test\"]\n    upstreams: [\"127.0.0.1:{demo}\"]\n{limits}  h2c:\n    hosts: [\"h2c.test\"]\n    upstreams: [\"127.0.0.1:{demo}\"]\n{limits}",
        cert.cert.display(),
        cert.key.display()
    );
    let t = Tollgate::start(&config).await;
    eventually("the demo upstream and h2c listener accept", 250, || async {
        std::net::TcpStream::connect(("127.0.0.1", demo)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", h2c)).is_ok()
    })
    .await;
    let tls_url = format!("https://tls.test:{}/?sleep=300ms", t.listen.port());
    let connect_to = format!("--connect-to=127.0.0.1:{}", t.listen.port());
    let h2c_url = format!("http://127.0.0.1:{h2c}/?sleep=300ms");
    for (name, args) in [
        ("tls", vec![tls_url.as_str(), connect_to.as_str()]),
        ("h2c", vec![h2c_url.as_str(), "-H", ":authority: h2c.test"]),
    ] {
        let mut all = vec!["-n", "600", "-c", "3", "-m", "10", "--rps", "100"];
        all.extend(args);
        let common::h2load::Summary {
            ok,
            too_many,
            unavailable,
            errored,
            done,
            text,
        } = common::h2load::run(&all);
        assert_eq!(errored, 0, "{name}: no stream or connection error: {text}");
        assert_eq!(done, 600, "{name}: every stream completes: {text}");
        assert_eq!(ok + too_many + unavailable, 600, "{name}: {text}");
        assert!(too_many > 0, "{name}: the rate limit answers 429: {text}");
        assert!(
            unavailable > 0,
            "{name}: the inflight limit answers 503: {text}"
        );
        assert!(ok > 0, "{name}: {text}");
        t.wait_metric(
            &format!("tollgate_inflight_requests{{origin=\"{name}\"}}"),
            0.0,
        )
        .await;
        let text = t.metrics_text().await;
        let rejected = |kind: &str, limit: &str| {
            common::sample(
                &text,
                &format!("tollgate_limit_decisions_total{{decision=\"rejected\",kind=\"{kind}\",limit=\"{limit}\",origin=\"{name}\"}}"),
            )
        };
        assert_eq!(rejected("rate", "rate"), too_many as f64, "{text}");
        assert_eq!(
            rejected("inflight", "inflight"),
            unavailable as f64,
            "{text}"
        );
    }
    // curl's prior-knowledge h2c, and HTTP/1.1 on the same listener.
    for (flag, version) in [("--http2-prior-knowledge", "2"), ("--http1.1", "1.1")] {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_version}", flag])
            .args(["-H", "host: h2c.test", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{h2c}/"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), version);
    }
}

/// An h2c client on `addr`: the request sender, with its connection driven on a task.
async fn h2_client(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.unwrap()
}

fn get(path: &str) -> http::Request<()> {
    http::Request::builder()
        .uri(format!("http://app.test{path}"))
        .body(())
        .unwrap()
}

/// `{listen}` and an h2c listener on `h2c`, `server` keys, and origin `app.test` on `up`
/// with an inflight limit of `inflight`.
fn h2c_config(up: SocketAddr, h2c: u16, server: &str, inflight: u32) -> String {
    format!(
        "server:\n  listen: [\"{{listen}}\", {{ addr: \"127.0.0.1:{h2c}\", h2c: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n{server}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n    limits:\n      inflight: {{ kind: inflight, key: [host], max: {inflight} }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_stream_and_a_dead_connection_give_their_units_back() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let h2c = free_port();
    let t = Tollgate::start(&h2c_config(up.addr, h2c, "", 10)).await;
    let addr: SocketAddr = format!("127.0.0.1:{h2c}").parse().unwrap();
    let gauge = "tollgate_inflight_requests{origin=\"app\"}";

    // RST_STREAM on one stream: its unit comes back, the connection and its other stream
    // carry on.
    let mut client = h2_client(addr).await;
    let (_kept, _) = client.send_request(get("/hold/kept"), true).unwrap();
    let mut client = client.ready().await.unwrap();
    let (_reset, mut reset_stream) = client.send_request(get("/hold/reset"), false).unwrap();
    eventually("both streams held at the upstream", 500, || async {
        up.held() == 2
    })
    .await;
    t.wait_metric(gauge, 2.0).await;
    reset_stream.send_reset(h2::Reason::CANCEL);
    t.wait_metric(gauge, 1.0).await;
    let mut client = client.ready().await.unwrap();
    let (ok, _) = client.send_request(get("/"), true).unwrap();
    assert_eq!(
        ok.await.unwrap().status(),
        200,
        "the connection still serves"
    );

    // The connection dies with a stream held: its unit comes back.
    drop(client);
    drop(_kept);
    t.wait_metric(gauge, 0.0).await;
    up.release();
}

/// What one attacker saw over its run.
#[derive(Debug, Default, Clone, Copy)]
struct Attack {
    /// Connections it opened.
    connections: u32,
    /// Of those, closed by the server.
    cut: u32,
    /// Streams it opened and reset.
    resets: u32,
}

/// One attacking connection: opens a stream on `/hold/attack` (a complete GET) and resets
/// it, in a loop, until the server closes the connection or `until`; `pace` waits between
/// the open and the reset, so that the server has accepted the stream (and started its
/// request) before the reset comes. Returns the streams it reset and whether the server
/// closed the connection.
async fn reset_in_a_loop(
    addr: SocketAddr,
    until: tokio::time::Instant,
    pace: Option<Duration>,
) -> (u32, bool) {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return (0, false);
    };
    let Ok((mut client, conn)) = h2::client::handshake(tcp).await else {
        return (0, true);
    };
    let conn = tokio::spawn(conn);
    let mut sent = 0u32;
    let closed = loop {
        if tokio::time::Instant::now() >= until {
            break false;
        }
        client = match tokio::time::timeout_at(until, client.clone().ready()).await {
            Ok(Ok(c)) => c,
            Ok(Err(_)) => break true,
            Err(_) => break false,
        };
        let Ok((_, mut stream)) = client.send_request(get("/hold/attack"), true) else {
            break true;
        };
        match pace {
            Some(pace) => tokio::time::sleep(pace).await,
            None => tokio::task::yield_now().await,
        }
        stream.send_reset(h2::Reason::CANCEL);
        sent += 1;
    };
    drop(client);
    conn.abort();
    (sent, closed)
}

/// Attacks `addr` with [`reset_in_a_loop`] until `until`, reconnecting whenever cut.
async fn attack(addr: SocketAddr, until: tokio::time::Instant, pace: Option<Duration>) -> Attack {
    let mut seen = Attack::default();
    while tokio::time::Instant::now() < until {
        let (resets, cut) = reset_in_a_loop(addr, until, pace).await;
        seen.connections += 1;
        seen.resets += resets;
        seen.cut += u32::from(cut);
    }
    seen
}

/// Rapid reset (CVE-2023-44487) for a bounded time (5 s): two attackers open and reset
/// streams in a loop, reconnecting whenever they are cut; one as fast as it can, one waiting
/// a moment before each reset so that the stream's request has started (the h2 crate's own
/// guard, against streams reset before they are accepted, does not see that one). Every
/// attacking connection is closed, the paced one by tollgate's reset budget; the origin sees
/// at most a budget and a stream cap's worth of requests per attacking connection and never
/// holds more than the stream cap at once, nor anything once the attack ends; and a normal
/// client on its own connection is served throughout: every one of its requests completes,
/// each within a generous deadline (nothing is timed here; `docs/performance.md` has the
/// latencies measured with and without the attack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_closes_attacking_connections_and_spares_the_origin_and_others() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    const BUDGET: u32 = 50;
    const STREAMS: u32 = 100;
    let up = Arc::new(Upstream::start("127.0.0.1", "up").await);
    let h2c = free_port();
    let t = Tollgate::start(&h2c_config(
        up.addr,
        h2c,
        &format!("  h2_max_resets: {BUDGET}\n  h2_max_streams: {STREAMS}\n"),
        // Out of the attack's reach: nothing refuses the normal client.
        100_000,
    ))
    .await;
    let addr: SocketAddr = format!("127.0.0.1:{h2c}").parse().unwrap();
    let attacking = Arc::new(AtomicBool::new(true));

    // The normal client: one request after another on its own connection.
    let mut normal = h2_client(addr).await;
    let served = {
        let attacking = attacking.clone();
        tokio::spawn(async move {
            let mut served = 0usize;
            while attacking.load(Ordering::SeqCst) || served < 10 {
                let request = async {
                    normal = normal.clone().ready().await.map_err(|e| e.to_string())?;
                    let (resp, _) = normal
                        .send_request(get("/"), true)
                        .map_err(|e| e.to_string())?;
                    let resp = resp.await.map_err(|e| e.to_string())?;
                    Ok::<_, String>(resp.status())
                };
                match tokio::time::timeout(Duration::from_secs(2), request).await {
                    Ok(Ok(status)) if status == 200 => served += 1,
                    other => panic!("normal request {served} failed: {other:?}"),
                }
            }
            served
        })
    };
    // The origin's concurrency, sampled while the attack runs.
    let most_held = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (attacking, most_held, up) = (attacking.clone(), most_held.clone(), up.clone());
        tokio::spawn(async move {
            while attacking.load(Ordering::SeqCst) {
                most_held.fetch_max(up.held(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // Two phases of 3 s: the fast attacker, then the paced one; the attack's requests that
    // reached the origin counted in each.
    let mut phases = Vec::new();
    for pace in [None, Some(Duration::from_millis(1))] {
        let before = up.holds();
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        let seen = attack(addr, until, pace).await;
        phases.push((seen, up.holds() - before));
    }
    attacking.store(false, Ordering::SeqCst);
    sampler.await.unwrap();
    let served = served.await.unwrap();
    let most_held = most_held.load(Ordering::SeqCst);
    let seen = format!(
        "(attack, its requests at the origin): {phases:?}; the origin held at most {most_held}; the normal client was served {served}"
    );
    eprintln!("{seen}");

    for (a, origin) in &phases {
        // Every attacking connection but the one the deadline interrupted was cut...
        assert!(a.cut >= 1 && a.cut + 1 >= a.connections, "{seen}");
        // ... before the origin saw more than a reset budget and a stream cap's worth of it.
        assert!(
            *origin <= (a.connections * (BUDGET + STREAMS)) as usize,
            "{seen}"
        );
    }
    // The paced attacker's connections by the reset budget (the fast one's may be cut by
    // the h2 crate's guard first).
    let closes = t.metric("tollgate_h2_reset_closes_total").await;
    assert!(
        closes >= f64::from(phases[1].0.cut),
        "{closes} closes: {seen}"
    );
    // At most the stream caps of an attacking connection and of the one before it, whose
    // streams may still be ending.
    assert!(most_held <= 2 * STREAMS as usize, "{seen}");
    // The reset streams leave nothing behind at the origin or in the limits.
    eventually("the origin holds no attack request", 500, || async {
        up.held() == 0
    })
    .await;
    t.wait_metric("tollgate_inflight_requests{origin=\"app\"}", 0.0)
        .await;
}
