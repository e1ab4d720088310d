//! Shared integration-test harness: a real upstream that can hold requests open, and the
//! real `tollgate` binary started on loopback ports with a config written for the test.
//!
//! Nothing here asserts on elapsed time. Waiting is by polling a condition with a bounded
//! number of tries; a condition that never becomes true fails the test with a message.

#![allow(dead_code)]

pub mod api;
pub mod capacity;
pub mod certs;
pub mod fleet;
pub mod h2load;
pub mod pebble;
pub mod raw;
pub mod redis;
pub mod relay;
pub mod smyte;
pub mod upstream;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[allow(unused_imports)]
pub use upstream::Upstream;

/// The `server:` section most tests share: the reserved listeners and no grace period.
/// Tests add server keys by appending indented lines right after it.
pub const SERVER: &str =
    "server:\n  listen: [\"{listen}\"]\n  metrics: \"{metrics}\"\n  grace_period: 0s\n";

/// A free loopback port: bind port 0, read the port, release it. The tiny window before
/// tollgate binds it is the usual price of a server that binds its own sockets. A port is
/// handed out once per test process: the kernel may give a just-released port again, and
/// a config's `listen` and `metrics` on one port would refuse to start.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let port = l.local_addr().expect("local addr").port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The fewest polls [`eventually`] makes: 30 s at 20 ms, what a loaded 2-core machine
/// (a full parallel test run with other builds beside it) may need for what takes
/// milliseconds on a quiet one. Only a failing test waits that long.
pub const MIN_TRIES: usize = 1_500;

/// Polls `cond` every 20 ms, up to `tries` times but at least [`MIN_TRIES`]; panics with
/// `what` if it never holds.
pub async fn eventually<F, Fut>(what: &str, tries: usize, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..tries.max(MIN_TRIES) {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition never held: {what}");
}

/// A running tollgate process. Killed on drop.
pub struct Tollgate {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub listen: SocketAddr,
    pub metrics: SocketAddr,
    pub log: Arc<Mutex<String>>,
    /// Set when the log's reader reached the end of tollgate's stderr: after an exit, the
    /// last lines are in `log` only once this is set.
    pub log_closed: Arc<std::sync::atomic::AtomicBool>,
}

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tollgate")
}

/// A GET of `path` on host `app.test` as customer `customer` (header `x-customer-id`),
/// the shape most proxy tests send.
pub async fn get_as(t: &Tollgate, path: &str, customer: &str) -> reqwest::Response {
    client()
        .get(t.url(path))
        .header("host", "app.test")
        .header("x-customer-id", customer)
        .send()
        .await
        .expect("request through tollgate")
}

/// A request to `/hold` on host `app.test` as `customer`, returned once `up` holds it.
pub async fn hold_as(
    t: &Tollgate,
    up: &Upstream,
    customer: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let before = up.held();
    let req = client()
        .get(t.url("/hold"))
        .header("host", "app.test")
        .header("x-customer-id", customer);
    let task = tokio::spawn(req.send());
    eventually("the upstream holds the request", 500, || async {
        up.held() == before + 1
    })
    .await;
    task
}

/// A config with the limiter API on `127.0.0.1:{api}`: the common server section,
/// `server_extra` (indented server keys), one origin `app` (host `app.test`, never sent
/// to), then `tail` (top-level sections: api, resources, stores).
pub fn api_config(api: u16, server_extra: &str, tail: &str) -> String {
    format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{api}\"\n{server_extra}origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:1\"]\n{tail}"
    )
}

/// Starts tollgate on [`api_config`] with a free port for the API; returns it and the
/// API's port once the API accepts.
pub async fn start_api(server_extra: &str, tail: &str) -> (Tollgate, u16) {
    let port = free_port();
    let t = Tollgate::start(&api_config(port, server_extra, tail)).await;
    eventually("the limiter API answers", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    (t, port)
}

/// Runs `script` with Debian's `/usr/bin/python3` (redis-py from python3-redis, which
/// scripts/deps.sh installs) and `args`; returns its stdout, asserting it succeeded.
pub fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("/usr/bin/python3 with redis-py (scripts/deps.sh installs python3-redis)");
    assert!(out.status.success(), "python: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Builds a segment of `ids` at `out` with the real CLI.
pub fn build_segment(dir: &std::path::Path, ids: &[u64], out: &std::path::Path) {
    let list = dir.join("ids.txt");
    let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
    std::fs::write(&list, text).unwrap();
    let built = std::process::Command::new(binary())
        .args(["segment", "build", "--from"])
        .arg(&list)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");
}

impl Tollgate {
    /// Writes `config` (with `{listen}` and `{metrics}` placeholders replaced by reserved
    /// ports) and starts tollgate on it, waiting until both listeners answer.
    pub async fn start(config: &str) -> Tollgate {
        Self::start_with(config, |_| {}).await
    }

    /// [`Tollgate::start`], letting `configure` adjust the command first (e.g. limits).
    pub async fn start_with(config: &str, configure: impl FnOnce(&mut Command)) -> Tollgate {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, config, configure).await
    }

    /// [`Tollgate::start_with`] with the config written into `dir`, which may already hold
    /// files the config names by a relative path (segments, a token).
    pub async fn start_in(
        dir: tempfile::TempDir,
        config: &str,
        configure: impl FnOnce(&mut Command),
    ) -> Tollgate {
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let text = config
            .replace("{listen}", &listen.to_string())
            .replace("{metrics}", &metrics.to_string());
        let config_path = dir.path().join("tollgate.yaml");
        std::fs::write(&config_path, text).expect("write config");
        let child = spawn_with(
            &config_path,
            &dir.path().join("upgrade.sock"),
            false,
            configure,
        );
        let mut t = Tollgate {
            child,
            dir,
            config_path,
            listen,
            metrics,
            log: Arc::new(Mutex::new(String::new())),
            log_closed: Default::default(),
        };
        t.capture_log();
        t.wait_ready().await;
        t
    }

    fn capture_log(&mut self) {
        if let Some(stderr) = self.child.stderr.take() {
            let log = self.log.clone();
            let closed = self.log_closed.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Ok(mut l) = log.lock() {
                        l.push_str(&line);
                        l.push('\n');
                    }
                }
                closed.store(true, std::sync::atomic::Ordering::Release);
            });
        }
    }

    /// What tollgate logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Waits until the proxy and metrics listeners accept connections.
    pub async fn wait_ready(&mut self) {
        for _ in 0..MIN_TRIES {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tollgate exited early with {status}:\n{}", self.log_text());
            }
            if TcpStream::connect(self.listen).is_ok() && TcpStream::connect(self.metrics).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("tollgate never became ready:\n{}", self.log_text());
    }

    /// The proxy's base URL.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }

    /// Scrapes `/metrics`.
    /// A scrape is retried a few times: on a loaded machine the metrics listener can reset a
    /// connection (seen once in parallel runs), which says nothing about what is tested.
    pub async fn metrics_text(&self) -> String {
        let url = format!("http://{}/metrics", self.metrics);
        let mut tries = 0;
        loop {
            tries += 1;
            let text = match reqwest::get(&url).await {
                Ok(response) => response.text().await,
                Err(e) => Err(e),
            };
            match text {
                Ok(text) => return text,
                Err(e) if tries >= 5 => panic!("scrape of {url} failed {tries} times: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The value of one sample line (exact labels as printed), or 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        sample(&text, series)
    }

    /// Waits until a sample reaches `want`: the `logging` phase that counts a request
    /// runs after its response was sent, so the client can be faster than the counter.
    pub async fn wait_metric(&self, series: &str, want: f64) {
        let mut last = 0.0;
        for _ in 0..MIN_TRIES {
            last = self.metric(series).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{series} stayed at {last}, expected {want}");
    }

    /// Rewrites the config file (same placeholders) in place.
    pub fn write_config(&self, config: &str) {
        let text = config
            .replace("{listen}", &self.listen.to_string())
            .replace("{metrics}", &self.metrics.to_string());
        std::fs::write(&self.config_path, text).expect("rewrite config");
    }

    /// The Unix socket an upgrade hands the listeners over on.
    pub fn upgrade_sock(&self) -> PathBuf {
        self.dir.path().join("upgrade.sock")
    }

    /// Waits (bounded) for the process to exit and returns its status.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..1500 {
            if let Ok(Some(status)) = self.child.try_wait() {
                // The process is gone, but its last lines may still be in the pipe: the
                // caller reads the log next, so wait for the reader to reach its end.
                for _ in 0..1500 {
                    if self.log_closed.load(std::sync::atomic::Ordering::Acquire) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("tollgate did not exit:\n{}", self.log_text());
    }

    /// Makes `child` (a tollgate on this instance's config and ports: a restart, or the
    /// new process of an upgrade) the process this handle drives and logs; the previous
    /// one must have exited.
    pub async fn replace_child(&mut self, child: Child) {
        self.child = child;
        self.log = Arc::new(Mutex::new(String::new()));
        self.log_closed = Default::default();
        self.capture_log();
        self.wait_ready().await;
    }

    /// Starts tollgate again on the same config and ports, once the previous process has
    /// exited.
    pub async fn restart(&mut self) {
        let child = spawn(&self.config_path, &self.upgrade_sock(), false);
        self.replace_child(child).await;
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a PID we own; no memory is touched.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

/// Starts the binary on `config` with its upgrade socket at `sock`.
pub fn spawn(config: &std::path::Path, sock: &std::path::Path, upgrade: bool) -> Child {
    spawn_with(config, sock, upgrade, |_| {})
}

/// [`spawn`], letting `configure` adjust the command first.
pub fn spawn_with(
    config: &std::path::Path,
    sock: &std::path::Path,
    upgrade: bool,
    configure: impl FnOnce(&mut Command),
) -> Child {
    let mut cmd = Command::new(binary());
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .arg("--upgrade-sock")
        .arg(sock)
        .arg("--pid-file")
        .arg(sock.with_extension("pid"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if upgrade {
        cmd.arg("--upgrade");
    }
    configure(&mut cmd);
    cmd.spawn().expect("spawn tollgate")
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of a sample in Prometheus text, or 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// A client with no connection reuse surprises: fresh pool per test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}
