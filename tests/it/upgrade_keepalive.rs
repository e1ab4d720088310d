//! Hardening item 7: a graceful upgrade loses no request on busy keep-alive connections.
//! Once the old process has handed its listeners over, it answers every request with
//! `Connection: close`, so each client moves to the new process after a complete
//! response; it never closes a connection under a request on its way.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::raw::{get, read_response};
use common::{eventually, spawn, Tollgate, Upstream};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn config(up: SocketAddr) -> String {
    format!(
        r#"
server:
  listen: ["{{listen}}"]
  metrics: "{{metrics}}"
  grace_period: 2s
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
"#
    )
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    errors: AtomicUsize,
    /// Responses that said `Connection: close`.
    closes: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        self.first_error.lock().unwrap().get_or_insert(what);
    }
}

/// A keep-alive client: one connection, one request after another (`pause` apart),
/// reconnecting only when a response says `Connection: close` (or after an error, which
/// is counted).
async fn client(addr: SocketAddr, pause: Duration, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let request = get("app.test", "/");
    let mut conn: Option<BufReader<TcpStream>> = None;
    for _ in 0..20_000 {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let s = match conn.as_mut() {
            Some(s) => s,
            None => match TcpStream::connect(addr).await {
                Ok(s) => conn.insert(BufReader::new(s)),
                Err(e) => {
                    tally.error(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let exchanged = async {
            s.get_mut().write_all(&request).await?;
            read_response(s).await
        };
        match exchanged.await {
            Ok(resp) if resp.status == 200 => {
                tally.ok.fetch_add(1, Ordering::SeqCst);
                if resp.closes() {
                    tally.closes.fetch_add(1, Ordering::SeqCst);
                    conn = None;
                }
                tokio::time::sleep(pause).await;
            }
            Ok(resp) => {
                tally.error(format!("status {}", resp.status));
                conn = None;
            }
            Err(e) => {
                tally.error(format!("request on a kept-alive connection: {e}"));
                conn = None;
            }
        }
    }
}

/// Kills the new process however the test ends.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_under_keepalive_load_loses_no_request() {
    // Busy clients (wrk-like) and paced ones (a script with think time between requests).
    const BUSY: usize = 16;
    const PACED: usize = 8;
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut old = Tollgate::start(&config(up.addr)).await;
    let sock = old.dir.path().join("upgrade.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..BUSY + PACED)
        .map(|i| {
            let pause = Duration::from_millis(if i < BUSY { 0 } else { 150 });
            tokio::spawn(client(old.listen, pause, stop.clone(), tally.clone()))
        })
        .collect();
    eventually("clients are busy", 500, || async {
        tally.ok.load(Ordering::SeqCst) > 500
    })
    .await;

    let _new = Reaper(spawn(&old.config_path, &sock, true));
    eventually("the new process waits for the listeners", 500, || async {
        sock.exists()
    })
    .await;
    old.signal(libc::SIGQUIT);
    let mut exited = false;
    for _ in 0..1500 {
        if let Ok(Some(_)) = old.child.try_wait() {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(exited, "the old process did not exit");
    let at_exit = tally.ok.load(Ordering::SeqCst);
    eventually("the new process serves the clients", 500, || async {
        tally.ok.load(Ordering::SeqCst) > at_exit + 500
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }

    let (ok, errors, closes) = (
        tally.ok.load(Ordering::SeqCst),
        tally.errors.load(Ordering::SeqCst),
        tally.closes.load(Ordering::SeqCst),
    );
    eprintln!(
        "{BUSY} busy and {PACED} paced keep-alive clients: {ok} requests served, {errors} errors, {closes} responses said Connection: close"
    );
    assert_eq!(
        errors,
        0,
        "requests lost during the upgrade; first: {:?}",
        tally.first_error.lock().unwrap()
    );
    assert!(
        closes >= BUSY + PACED,
        "the old process never sent clients away"
    );
    assert!(old
        .log_text()
        .contains("draining (handing the listeners over)"));
}
