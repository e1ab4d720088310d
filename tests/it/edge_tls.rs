//! TLS termination (issue 20, part A) against the real binary with clients tollgate did not
//! write: curl over TLS with HTTP/1.1 and HTTP/2 by ALPN, `openssl s_client` for the
//! certificate SNI picks (exact, wildcard, default, none), Python's `ssl` for the old
//! versions refused, a silent TCP client cut at the handshake deadline while a normal one
//! is served, certificates rotated on disk (a broken one kept out), and the handshake and
//! expiry metrics. Certificates are made at test time.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::certs::{self, presented_cn, TestCert};
use common::{eventually, Tollgate, Upstream};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A config whose `{listen}` is a TLS listener, with `tls` (the section's body) and one
/// origin `app.test` on `up`.
fn config(up: SocketAddr, tls: &str) -> String {
    format!(
        "server:\n  listen: [{{ addr: \"{{listen}}\", tls: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\ntls:\n{tls}origins:\n  app:\n    hosts: [\"app.test\", \"*.wild.test\"]\n    upstreams: [\"{up}\"]\n"
    )
}

fn cert_entry(c: &TestCert) -> String {
    format!(
        "    - {{ cert: \"{}\", key: \"{}\" }}\n",
        c.cert.display(),
        c.key.display()
    )
}

/// curl over TLS to `https://NAME:PORT/` (resolved to the listener), trusting `ca`;
/// returns (status, HTTP version) as curl reports them.
fn curl(t: &Tollgate, name: &str, ca: &Path, extra: &[&str]) -> (String, String) {
    let port = t.listen.port();
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{http_version}"])
        .arg("--resolve")
        .arg(format!("{name}:{port}:127.0.0.1"))
        .arg("--cacert")
        .arg(ca)
        .args(extra)
        .arg(format!("https://{name}:{port}/"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (code, version) = text.split_once(' ').unwrap_or((&text, ""));
    (code.to_string(), version.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http1_and_h2_by_alpn() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let c = certs::write(dir.path(), "app", "app.test", &["app.test"], 30);
    let t = Tollgate::start(&config(
        up.addr,
        &format!("  certificates:\n{}", cert_entry(&c)),
    ))
    .await;
    assert_eq!(
        curl(&t, "app.test", &c.cert, &["--http1.1"]),
        ("200".into(), "1.1".into())
    );
    assert_eq!(
        curl(&t, "app.test", &c.cert, &["--http2"]),
        ("200".into(), "2".into())
    );
    t.wait_metric("tollgate_requests_total{code=\"200\",origin=\"app\"}", 2.0)
        .await;
    let text = t.metrics_text().await;
    let ok13 = common::sample(
        &text,
        "tollgate_tls_handshakes_total{result=\"success\",version=\"1.3\"}",
    );
    assert!(ok13 >= 2.0, "{text}");
    let expiry = common::sample(
        &text,
        &format!(
            "tollgate_tls_certificate_expiry_timestamp_seconds{{cert=\"{}\"}}",
            c.cert.display()
        ),
    );
    let epoch = openssl::asn1::Asn1Time::from_unix(0).unwrap();
    let d = epoch.diff(c.x509.not_after()).unwrap();
    assert_eq!(
        expiry,
        (i64::from(d.days) * 86_400 + i64::from(d.secs)) as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_exact_then_wildcard_then_default() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let app = certs::write(dir.path(), "app", "app-cert", &["app.test"], 30);
    let wild = certs::write(dir.path(), "wild", "wild-cert", &["*.wild.test"], 30);
    let exact = certs::write(dir.path(), "exact", "exact-cert", &["x.wild.test"], 30);
    let fallback = certs::write(dir.path(), "fallback", "default-cert", &[], 30);
    let tls = format!(
        "  certificates:\n{}{}{}{}  default: \"{}\"\n",
        cert_entry(&app),
        cert_entry(&wild),
        cert_entry(&exact),
        cert_entry(&fallback),
        fallback.cert.display()
    );
    let t = Tollgate::start(&config(up.addr, &tls)).await;
    let cn = |name: Option<&str>| presented_cn(t.listen, name);
    assert_eq!(cn(Some("app.test")).as_deref(), Some("app-cert"));
    assert_eq!(cn(Some("shop.wild.test")).as_deref(), Some("wild-cert"));
    assert_eq!(
        cn(Some("x.wild.test")).as_deref(),
        Some("exact-cert"),
        "an exact name beats the wildcard listed before it"
    );
    assert_eq!(
        cn(Some("a.b.wild.test")).as_deref(),
        Some("default-cert"),
        "a wildcard covers one label"
    );
    assert_eq!(cn(Some("unknown.test")).as_deref(), Some("default-cert"));
    assert_eq!(cn(None).as_deref(), Some("default-cert"));

    // Without a default, an unknown name or no SNI gets no handshake.
    let tls = format!("  certificates:\n{}{}", cert_entry(&app), cert_entry(&wild));
    t.write_config(&config(up.addr, &tls));
    eventually("the reload without a default applies", 500, || async {
        presented_cn(t.listen, None).is_none()
    })
    .await;
    assert_eq!(cn(Some("unknown.test")), None);
    assert_eq!(cn(Some("shop.wild.test")).as_deref(), Some("wild-cert"));
    let text = t.metrics_text().await;
    assert!(
        common::sample(
            &text,
            "tollgate_tls_handshakes_total{result=\"failure\",version=\"none\"}"
        ) >= 2.0,
        "{text}"
    );
}

/// Python's `ssl` as a client capped at TLS 1.0 or 1.1 (lowest security level, so that the
/// client itself would offer them) is refused by the server's protocol_version alert; 1.2
/// and 1.3 connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_0_and_1_1_are_refused() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let c = certs::write(dir.path(), "app", "app.test", &["app.test"], 30);
    let t = Tollgate::start(&config(
        up.addr,
        &format!("  certificates:\n{}", cert_entry(&c)),
    ))
    .await;
    let script = r#"
import socket, ssl, sys
port = int(sys.argv[1])
for name in ["TLSv1", "TLSv1_1", "TLSv1_2", "TLSv1_3"]:
    v = getattr(ssl.TLSVersion, name)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.minimum_version = v
    ctx.maximum_version = v
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname="app.test") as tls:
                print(name, "ok", tls.version())
    except ssl.SSLError as e:
        print(name, "refused", e.reason)
"#;
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(t.listen.port().to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (line, version) in lines[..2].iter().zip(["TLSv1 ", "TLSv1_1 "]) {
        assert!(line.starts_with(version), "{text}");
        assert!(
            line.contains("refused") && line.contains("PROTOCOL_VERSION"),
            "the server's protocol_version alert refuses {version}: {text}"
        );
    }
    assert_eq!(lines[2], "TLSv1_2 ok TLSv1.2", "{text}");
    assert_eq!(lines[3], "TLSv1_3 ok TLSv1.3", "{text}");
}

/// A client that completes TCP and says nothing is cut at `tls.handshake_timeout`; 500
/// of them do not keep a normal client from being served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_cut_at_the_handshake_deadline() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let c = certs::write(dir.path(), "app", "app.test", &["app.test"], 30);
    let t = Tollgate::start(&config(
        up.addr,
        &format!(
            "  certificates:\n{}  handshake_timeout: 1s\n",
            cert_entry(&c)
        ),
    ))
    .await;
    let mut silent = Vec::new();
    for _ in 0..500 {
        silent.push(TcpStream::connect(t.listen).await.unwrap());
    }
    // Served while the 500 wait for their deadline.
    assert_eq!(
        curl(&t, "app.test", &c.cert, &["--http1.1"]),
        ("200".into(), "1.1".into())
    );
    for s in &mut silent {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(20), s.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a silent client is closed by the server, not left open: {read:?}"
        );
    }
    t.wait_metric(
        "tollgate_tls_handshakes_total{result=\"timeout\",version=\"none\"}",
        500.0,
    )
    .await;
    t.wait_metric("tollgate_connections_open", 0.0).await;
}

/// Certificates are data: replacing the files on disk serves the new certificate to new
/// handshakes while an established connection keeps working; a broken replacement keeps the
/// old one serving and is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_from_disk_and_a_broken_one_is_kept_out() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let c = certs::write(dir.path(), "app", "first", &["app.test"], 30);
    let t = Tollgate::start(&config(
        up.addr,
        &format!("  certificates:\n{}", cert_entry(&c)),
    ))
    .await;
    assert_eq!(
        presented_cn(t.listen, Some("app.test")).as_deref(),
        Some("first")
    );
    // A kept-alive HTTP/1.1 connection made before the rotation (Python's ssl + http.client).
    let mut held = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            r#"
import http.client, socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30), server_hostname="app.test")
def get():
    sock.sendall(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
    r = http.client.HTTPResponse(sock)
    r.begin()
    r.read()
    return r.status
print(get(), flush=True)
sys.stdin.readline()
print(get(), sock.getpeercert()["subject"][0][0][1], flush=True)
"#,
        )
        .arg(t.listen.port().to_string())
        .arg(&c.cert)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(held.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "200");

    // A broken replacement: the key file is garbage. The first certificate keeps serving.
    std::fs::write(&c.key, "not a key\n").unwrap();
    eventually("the broken key is refused and logged", 500, || async {
        t.log_text().contains("app.key")
    })
    .await;
    assert_eq!(
        presented_cn(t.listen, Some("app.test")).as_deref(),
        Some("first")
    );

    // The real rotation: a new pair written over both files.
    let next = certs::write(dir.path(), "next", "second", &["app.test"], 60);
    std::fs::copy(&next.key, &c.key).unwrap();
    std::fs::copy(&next.cert, &c.cert).unwrap();
    eventually(
        "new handshakes present the new certificate",
        500,
        || async { presented_cn(t.listen, Some("app.test")).as_deref() == Some("second") },
    )
    .await;
    // The connection made before the rotation still works.
    std::io::Write::write_all(held.stdin.as_mut().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(
        line.trim(),
        "200 first",
        "the old connection, with its old certificate"
    );
    assert!(held.wait().unwrap().success());
}

/// `tollgate check` loads every certificate: a key that does not match, a file that is not
/// PEM and a missing file are errors naming the file; a certificate expiring within 14 days
/// or naming no routed host is a warning.
#[test]
fn check_loads_every_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let good = certs::write(dir.path(), "good", "app.test", &["app.test"], 30);
    let other = certs::write(dir.path(), "other", "app.test", &["app.test"], 30);
    let check = |tls: &str| {
        let text = config("127.0.0.1:9".parse().unwrap(), tls)
            .replace("{listen}", "127.0.0.1:1")
            .replace("{metrics}", "127.0.0.1:2");
        let file = dir.path().join("t.yaml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(common::binary())
            .args(["check", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let entry = |cert: &Path, key: &Path| {
        format!(
            "  certificates:\n    - {{ cert: \"{}\", key: \"{}\" }}\n",
            cert.display(),
            key.display()
        )
    };
    let (code, err) = check(&entry(&good.cert, &good.key));
    assert_eq!(code, Some(0), "{err}");

    let (code, err) = check(&entry(&good.cert, &other.key));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&other.key.display().to_string()) && err.contains("does not match"),
        "{err}"
    );

    let der = dir.path().join("cert.der");
    std::fs::write(&der, good.x509.to_der().unwrap()).unwrap();
    let (code, err) = check(&entry(&der, &good.key));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&der.display().to_string()) && err.contains("not a PEM file"),
        "{err}"
    );

    let missing = dir.path().join("missing.pem");
    let (code, err) = check(&entry(&missing, &good.key));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("cannot read"),
        "{err}"
    );

    let soon = certs::write(dir.path(), "soon", "app.test", &["app.test"], 3);
    let (code, err) = check(&entry(&soon.cert, &soon.key));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("within 14 days"), "{err}");

    let stray = certs::write(dir.path(), "stray", "x", &["nothing.example"], 30);
    let (code, err) = check(&entry(&stray.cert, &stray.key));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("names no host an origin serves (nothing.example)"),
        "{err}"
    );
}
