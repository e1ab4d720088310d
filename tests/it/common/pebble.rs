//! Pebble, Let's Encrypt's test ACME server, on loopback ports, with its mock DNS
//! (`pebble-challtestsrv`, answering 127.0.0.1 for every name) so that the CA's
//! validations of `*.acme.test` reach the tollgate under test: pebble's `httpPort` and
//! `tlsPort` are that tollgate's plaintext and TLS listener ports.
//!
//! Pebble's own HTTPS certificate is made here with the `openssl` command (the Debian
//! package ships none): `ca_roots()` is the file tollgate trusts for the directory. The
//! issuing root changes at each pebble start; `root()` fetches it from the management
//! interface.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, MIN_TRIES};

/// A running pebble and its mock DNS. Both killed on drop.
pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    dir: tempfile::TempDir,
    /// The ACME port.
    pub port: u16,
    /// The management port.
    pub mgmt: u16,
    dns_port: u16,
    http_port: u16,
    tls_port: u16,
}

impl Pebble {
    /// Starts pebble validating on `http_port` (HTTP-01) and `tls_port` (TLS-ALPN-01) of
    /// 127.0.0.1, with `env` (`PEBBLE_*` fault and speed switches; `PEBBLE_VA_NOSLEEP=1`
    /// is always set), and waits until its directory answers.
    pub async fn start(http_port: u16, tls_port: u16, env: &[(&str, &str)]) -> Pebble {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "3", "-subj", "/CN=pebble"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(dir.path().join("pebble.key"))
            .arg("-out")
            .arg(dir.path().join("pebble.pem"))
            .stderr(Stdio::null())
            .status()
            .expect("run openssl");
        assert!(made.success(), "openssl req failed");
        let dns_port = free_port();
        let dns_mgmt = free_port();
        let dns = Command::new("pebble-challtestsrv")
            .arg("-dns01")
            .arg(format!("127.0.0.1:{dns_port}"))
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .arg("-management")
            .arg(format!("127.0.0.1:{dns_mgmt}"))
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pebble-challtestsrv");
        let mut p = Pebble {
            pebble: None,
            dns,
            dir,
            port: free_port(),
            mgmt: free_port(),
            dns_port,
            http_port,
            tls_port,
        };
        wait_tcp(dns_mgmt, "pebble-challtestsrv").await;
        p.spawn(env).await;
        p
    }

    /// Starts pebble (again, after [`Pebble::stop`]: a new CA on the same ports).
    pub async fn spawn(&mut self, env: &[(&str, &str)]) {
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{}", self.port),
            "managementListenAddress": format!("127.0.0.1:{}", self.mgmt),
            "certificate": self.dir.path().join("pebble.pem"),
            "privateKey": self.dir.path().join("pebble.key"),
            "httpPort": self.http_port,
            "tlsPort": self.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        let path = self.dir.path().join("pebble.json");
        std::fs::write(&path, config.to_string()).expect("write pebble config");
        let log = std::fs::File::create(self.dir.path().join("pebble.log")).expect("log");
        let mut cmd = Command::new("pebble");
        cmd.arg("-config")
            .arg(&path)
            .arg("-dnsserver")
            .arg(format!("127.0.0.1:{}", self.dns_port))
            .args(["-strict", "false"])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log));
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.pebble = Some(cmd.spawn().expect("spawn pebble"));
        let url = self.directory();
        let ca = self.ca_roots();
        for _ in 0..MIN_TRIES {
            if curl(&["--cacert", ca.to_str().unwrap_or_default(), &url]).is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("pebble never answered:\n{}", self.log());
    }

    /// Stops pebble (the mock DNS keeps running).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.pebble.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The directory URL.
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.port)
    }

    /// The file that makes pebble's HTTPS trusted.
    pub fn ca_roots(&self) -> PathBuf {
        self.dir.path().join("pebble.pem")
    }

    /// The root that issues this pebble's certificates, written to `dir/pebble-root.pem`.
    pub fn root(&self, dir: &Path) -> PathBuf {
        let ca = self.ca_roots();
        let url = format!("https://127.0.0.1:{}/roots/0", self.mgmt);
        let pem = curl(&["--cacert", ca.to_str().unwrap_or_default(), &url])
            .unwrap_or_else(|| panic!("no root from pebble's management interface"));
        let path = dir.join("pebble-root.pem");
        std::fs::write(&path, pem).expect("write root");
        path
    }

    /// Pebble's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pebble.log")).unwrap_or_default()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}

/// `curl -sf ARGS`'s body, `None` when it fails.
pub fn curl(args: &[&str]) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sS", "-f", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn wait_tcp(port: u16, what: &str) {
    for _ in 0..MIN_TRIES {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} never listened on {port}");
}

/// What `openssl s_client` saw on `addr` for `name`: the leaf's serial and issuer, and
/// whether the chain verified against `root`. `None`: the handshake failed.
pub fn served(
    addr: std::net::SocketAddr,
    name: &str,
    root: &Path,
) -> Option<(String, String, bool)> {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            name,
        ])
        .arg("-CAfile")
        .arg(root)
        .arg("-verify_hostname")
        .arg(name)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text.find("-----END CERTIFICATE-----")? + "-----END CERTIFICATE-----".len();
    let leaf = openssl::x509::X509::from_pem(&text.as_bytes()[begin..end]).ok()?;
    let serial = leaf
        .serial_number()
        .to_bn()
        .ok()?
        .to_hex_str()
        .ok()?
        .to_string();
    let issuer: Vec<String> = leaf
        .issuer_name()
        .entries()
        .filter_map(|e| e.data().to_string().ok())
        .collect();
    let verified = text.contains("Verify return code: 0 (ok)");
    Some((serial, issuer.join(","), verified))
}
