//! Real `redis-server` processes for the store tests and benchmarks, and the faults they
//! inject: freeze (SIGSTOP/SIGCONT), kill and restart on the same port, `CLIENT PAUSE`, a
//! black-hole listener that accepts and never answers, and a local three-node Redis
//! Cluster.
//!
//! Servers bind loopback ports picked by the kernel (never 6379), keep no data on disk
//! (`--save "" --appendonly no`, in a temp dir), and are killed on drop. Every wait is
//! bounded: a server that does not answer in time fails the test with its log.

#![allow(dead_code)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server may take to answer PING after it was started.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A free loopback port: bind port 0, read it, release it.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// One `redis-server` process on a loopback port.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    extra: Vec<String>,
    frozen: bool,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line options (`["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // A port picked by the kernel can be taken again before redis binds it: retry.
        for _ in 0..5 {
            let mut s = RedisServer {
                child: None,
                port: free_port(),
                dir: dir.clone(),
                _tmp: None,
                extra: extra.clone(),
                frozen: false,
            };
            if s.spawn_and_wait() {
                s._tmp = Some(tmp);
                return s;
            }
        }
        panic!("redis-server did not start: {}", read_log(&dir));
    }

    /// Starts a server on a given port (a store that was told this URL before anything
    /// listened on it), in its own temp dir.
    pub fn start_on(port: u16) -> RedisServer {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = RedisServer {
            child: None,
            port,
            dir: tmp.path().to_path_buf(),
            _tmp: Some(tmp),
            extra: Vec::new(),
            frozen: false,
        };
        assert!(
            s.spawn_and_wait(),
            "redis-server did not start on {port}: {}",
            read_log(&s.dir)
        );
        s
    }

    fn spawn_and_wait(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--dir", path_str(&self.dir)])
            .args(["--logfile", path_str(&self.dir.join("redis.log"))])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .expect("spawn redis-server (install redis-server: scripts/deps.sh)");
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    // Exited: most likely the port was taken.
                    self.child = None;
                    return false;
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop();
        false
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        read_log(&self.dir)
    }

    /// Whether it answers PING within 200 ms.
    pub fn ping(&self) -> bool {
        self.try_cmd(&["PING"], Duration::from_millis(200)).is_ok()
    }

    /// Runs one command on a fresh connection (1 s timeouts) and returns its reply.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        self.try_cmd(args, Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("redis {args:?} on {}: {e}", self.port))
    }

    fn try_cmd(&self, args: &[&str], timeout: Duration) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut con)
    }

    /// Every value of every hash whose key matches `pattern` (`KEYS`), as numbers, sorted:
    /// the per-holder counts of a holding limit's counters (`...:ic`, `...:cc`).
    pub fn hash_counts(&self, pattern: &str) -> Vec<u64> {
        let redis::Value::Array(keys) = self.cmd(&["KEYS", pattern]) else {
            panic!("KEYS {pattern}");
        };
        let mut counts = Vec::new();
        for key in keys {
            let redis::Value::BulkString(key) = key else {
                panic!("a key: {key:?}");
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            let redis::Value::Array(values) = self.cmd(&["HVALS", &key]) else {
                panic!("HVALS {key}");
            };
            for v in values {
                let redis::Value::BulkString(b) = v else {
                    panic!("a count in {key}: {v:?}");
                };
                counts.push(String::from_utf8_lossy(&b).parse::<u64>().unwrap());
            }
        }
        counts.sort_unstable();
        counts
    }

    /// A field of `INFO` (`used_cpu_sys`), as text.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info = match self.cmd(&["INFO", section]) {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).to_string(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("INFO: {other:?}"),
        };
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_string())
    }

    /// Script calls the server ran so far (`EVALSHA` and `EVAL`): a shared limit's store
    /// calls.
    pub fn script_calls(&self) -> u64 {
        ["cmdstat_evalsha", "cmdstat_eval"]
            .iter()
            .filter_map(|f| self.info_field("commandstats", f))
            .filter_map(|v| {
                v.split(',')
                    .find_map(|p| p.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    }

    /// Seconds of CPU the server used so far (user + system).
    pub fn cpu_seconds(&self) -> f64 {
        let f = |name| {
            self.info_field("cpu", name)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        f("used_cpu_user") + f("used_cpu_sys")
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&mut self) {
        self.signal(libc::SIGSTOP);
        self.frozen = true;
    }

    /// Resumes a frozen process (SIGCONT).
    pub fn thaw(&mut self) {
        self.signal(libc::SIGCONT);
        self.frozen = false;
    }

    /// Kills the process (SIGKILL) and reaps it: its connections are reset, its data gone.
    pub fn kill(&mut self) {
        self.stop();
    }

    /// Starts a fresh process on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn_and_wait() {
                return;
            }
            // The port may linger for a moment after the kill.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "redis-server did not restart on {}: {}",
            self.port,
            self.log()
        );
    }

    /// `CLIENT PAUSE ms ALL`: every client's commands wait until the pause ends.
    pub fn client_pause(&self, ms: u64) {
        self.cmd(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
    }

    fn stop(&mut self) {
        if self.frozen {
            self.thaw();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
}

/// A TCP listener that accepts connections and never answers: a Redis that hangs without
/// closing anything.
pub struct BlackHole {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl BlackHole {
    /// Starts listening on a free loopback port.
    pub fn start() -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => held.lock().unwrap().push(stream),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        BlackHole {
            addr,
            stop,
            held,
            thread: Some(thread),
        }
    }

    /// `redis://ADDR/0`.
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Bytes the clients sent so far (read without answering).
    pub fn received(&self) -> usize {
        let mut total = 0;
        for s in self.held.lock().unwrap().iter_mut() {
            let _ = s.set_nonblocking(true);
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n;
            }
        }
        total
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A local Redis Cluster of three primaries (and optionally a replica of each), each node
/// on its own free port with an explicit cluster-bus port.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three `--cluster-enabled` servers, joins them with `redis-cli --cluster
    /// create`, and waits until every node reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        Self::start_nodes(0)
    }

    /// Three primaries and one replica of each (six nodes; which node is which is
    /// `redis-cli`'s choice: see [`RedisCluster::is_primary`], [`RedisCluster::replica_of`]).
    /// Waits until every replica's link to its primary is up.
    pub fn start_replicated() -> RedisCluster {
        let cluster = Self::start_nodes(1);
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..cluster.nodes.len() {
            if cluster.is_primary(i) {
                continue;
            }
            while cluster.nodes[i].info_field("replication", "master_link_status")
                != Some("up".to_string())
            {
                assert!(
                    Instant::now() < deadline,
                    "replica {i} never linked to its primary"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    fn start_nodes(replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new("redis-cli");
        create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = run_bounded(create, Duration::from_secs(30));
        assert!(out.0, "redis-cli --cluster create failed:\n{}", out.1);
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = cluster.nodes.iter().all(|n| {
                n.info_field_cluster()
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return cluster;
            }
            assert!(
                Instant::now() < deadline,
                "cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `CLUSTER KEYSLOT key`, asked of the first node.
    pub fn keyslot(&self, key: &str) -> i64 {
        match self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) {
            redis::Value::Int(n) => n,
            other => panic!("CLUSTER KEYSLOT: {other:?}"),
        }
    }

    /// Whether node `i` is a primary (`INFO replication`, `role:master`).
    pub fn is_primary(&self, i: usize) -> bool {
        self.nodes[i].info_field("replication", "role").as_deref() == Some("master")
    }

    /// The node that replicates node `primary`, if any.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let port = self.nodes[primary].port().to_string();
        (0..self.nodes.len()).find(|&i| {
            i != primary
                && self.nodes[i]
                    .info_field("replication", "master_port")
                    .as_deref()
                    == Some(port.as_str())
        })
    }

    /// Keys stored per node (`DBSIZE`).
    pub fn dbsizes(&self) -> Vec<i64> {
        self.nodes
            .iter()
            .map(|n| match n.cmd(&["DBSIZE"]) {
                redis::Value::Int(n) => n,
                other => panic!("DBSIZE: {other:?}"),
            })
            .collect()
    }
}

impl RedisServer {
    fn info_field_cluster(&self) -> Option<String> {
        match self.try_cmd(&["CLUSTER", "INFO"], Duration::from_millis(500)) {
            Ok(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).to_string()),
            Ok(redis::Value::VerbatimString { text, .. }) => Some(text),
            _ => None,
        }
    }
}

/// Runs `cmd` to completion within `limit` (killed past it); returns success and output.
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd.spawn().expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut s) = child.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                if let Some(mut s) = child.stderr.take() {
                    let _ = s.read_to_string(&mut out);
                }
                return (status.success(), out);
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return (false, "timed out".to_string());
            }
        }
    }
}
