//! ACME (issue 25) against pebble, Let's Encrypt's test CA, on loopback: certificates
//! ordered for two hosts and served with a chain that verifies against pebble's root
//! (openssl s_client, curl --cacert), an early renewal of a certificate at the end of its
//! life, a restart that orders nothing, a CA that is down (the current certificate keeps
//! serving, a host without one fails its handshake cleanly), a fleet of two sharing one
//! certificate per host through Redis, and retries through rejected nonces.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::path::Path;

use common::pebble::{curl, served, Pebble};
use common::redis::RedisServer;
use common::{eventually, free_port, Tollgate, Upstream, SERVER};

const A: &str = "a.acme.test";
const B: &str = "b.acme.test";

/// A tollgate's ports that pebble must know before it starts.
struct Ports {
    plain: u16,
    tls: u16,
    admin: u16,
}

impl Ports {
    fn new() -> Ports {
        Ports {
            plain: free_port(),
            tls: free_port(),
            admin: free_port(),
        }
    }

    fn tls_addr(&self) -> SocketAddr {
        format!("127.0.0.1:{}", self.tls).parse().unwrap()
    }
}

/// A config managing `hosts` from `pebble` with `storage` (`storage: DIR` or `store:
/// NAME`), `extra` lines under `tls.acme`, and `stores` (a `stores:` section or "").
fn config(
    p: &Ports,
    pebble: &Pebble,
    up: SocketAddr,
    hosts: &[&str],
    storage: &str,
    extra: &str,
    stores: &str,
) -> String {
    let list = hosts.join(", ");
    let directory = pebble.directory();
    format!(
        "{SERVER}  admin: \"127.0.0.1:{admin}\"\n  listen_extra_placeholder: x\n{stores}tls:\n  acme:\n    directory: \"{directory}\"\n    email: ops@example.com\n    hosts: [{list}]\n    {storage}\n    ca_roots: \"{roots}\"\n    retry: {{ min: 200ms, max: 2s }}\n{extra}origins:\n  app:\n    hosts: [{list}]\n    upstreams: [\"{up}\"]\n",
        admin = p.admin,
        roots = pebble.ca_roots().display(),
    )
    .replace(
        "  listen: [\"{listen}\"]\n",
        &format!(
            "  listen: [\"{{listen}}\", \"127.0.0.1:{}\", {{ addr: \"127.0.0.1:{}\", tls: true }}]\n",
            p.plain, p.tls
        ),
    )
    .replace("  listen_extra_placeholder: x\n", "")
}

/// `GET /certificates` from the admin API, as JSON.
fn certificates(p: &Ports) -> serde_json::Value {
    let text = curl(&[&format!("http://127.0.0.1:{}/certificates", p.admin)]).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// The admin API's entry for `host`.
fn status(p: &Ports, host: &str) -> serde_json::Value {
    certificates(p)["certificates"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["host"] == host).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until `addr` serves `host` a certificate that verifies against `root`; its
/// serial.
async fn wait_verified(addr: SocketAddr, host: &str, root: &Path, t: &Tollgate) -> String {
    for _ in 0..3000 {
        if let Some((serial, _, true)) = served(addr, host, root) {
            return serial;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!(
        "{host} was never served a certificate that verifies against pebble's root:\n{}",
        t.log_text()
    );
}

/// curl through the TLS listener with pebble's root as the only trust: the chain and the
/// name verify, and the request reaches the upstream.
fn curl_through(p: &Ports, host: &str, root: &Path) -> Option<String> {
    curl(&[
        "--cacert",
        root.to_str().unwrap(),
        "--resolve",
        &format!("{host}:{}:127.0.0.1", p.tls),
        &format!("https://{host}:{}/hello", p.tls),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issues_for_two_hosts_by_tls_alpn_and_serves_a_verified_chain() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let p = Ports::new();
    let pebble = Pebble::start(p.plain, p.tls, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme");
    let text = config(
        &p,
        &pebble,
        up.addr,
        &[A, B],
        &format!("storage: \"{}\"", store.display()),
        "    challenge: tls-alpn-01\n",
        "",
    );
    let t = Tollgate::start_in(dir, &text, |_| {}).await;
    let root = pebble.root(t.dir.path());
    for host in [A, B] {
        wait_verified(p.tls_addr(), host, &root, &t).await;
        let body = curl_through(&p, host, &root);
        assert!(
            body.is_some(),
            "curl --cacert pebble's root through {host} failed"
        );
        t.wait_metric(
            &format!("tollgate_acme_orders_total{{host=\"{host}\",result=\"success\"}}"),
            1.0,
        )
        .await;
        let s = status(&p, host);
        assert_eq!(s["state"], "valid", "{s}");
        assert!(s["not_after"].as_i64().unwrap() > s["renew_at"].as_i64().unwrap());
    }
    // The CA validated on the TLS listener itself.
    let metrics = t.metrics_text().await;
    assert!(
        common::sample(
            &metrics,
            "tollgate_tls_handshakes_total{result=\"acme_validation\",version=\"none\"}"
        ) >= 2.0,
        "{metrics}"
    );
    // Stored privately, and exported with their expiry.
    use std::os::unix::fs::PermissionsExt;
    let ca_dir = store.join(format!("127.0.0.1_{}", pebble.port));
    for file in [
        format!("{A}.crt"),
        format!("{A}.key"),
        format!("{B}.key"),
        "account.json".into(),
    ] {
        let mode = std::fs::metadata(ca_dir.join(&file))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }
    let series = format!(
        "tollgate_tls_certificate_expiry_timestamp_seconds{{cert=\"{}\"}}",
        ca_dir.join(format!("{A}.crt")).display()
    );
    assert!(
        common::sample(&metrics, &series) > 0.0,
        "{series} in {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issues_by_http01_and_a_restart_orders_nothing() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let p = Ports::new();
    let pebble = Pebble::start(p.plain, p.tls, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme");
    let text = config(
        &p,
        &pebble,
        up.addr,
        &[A],
        &format!("storage: \"{}\"", store.display()),
        "    challenge: http-01\n",
        "",
    );
    let mut t = Tollgate::start_in(dir, &text, |_| {}).await;
    let root = pebble.root(t.dir.path());
    let first = wait_verified(p.tls_addr(), A, &root, &t).await;
    t.wait_metric(
        &format!("tollgate_acme_orders_total{{host=\"{A}\",result=\"success\"}}"),
        1.0,
    )
    .await;
    let metrics = t.metrics_text().await;
    let alpn = "tollgate_tls_handshakes_total{result=\"acme_validation\",version=\"none\"}";
    assert_eq!(
        common::sample(&metrics, alpn),
        0.0,
        "validated by HTTP-01, not on the TLS listener"
    );

    let _ = t.child.kill();
    t.wait_exit().await;
    t.restart().await;
    let again = wait_verified(p.tls_addr(), A, &root, &t).await;
    assert_eq!(
        again, first,
        "the stored certificate serves after the restart"
    );
    eventually(
        "the restarted tollgate reports its stored certificate",
        500,
        || async { status(&p, A)["state"] == "valid" },
    )
    .await;
    let metrics = t.metrics_text().await;
    assert_eq!(
        common::sample(
            &metrics,
            &format!("tollgate_acme_orders_total{{host=\"{A}\",result=\"success\"}}")
        ),
        0.0,
        "no new order: {metrics}"
    );
    assert!(
        t.log_text().contains("serving the stored certificate"),
        "{}",
        t.log_text()
    );
}

/// A certificate for `host` that began `age_days` ago and ends in `left_days`, written as
/// the stored certificate of `host` in `ca_dir`; its serial.
fn seed(ca_dir: &Path, host: &str, age_days: u32, left_days: u32) -> String {
    use openssl::asn1::Asn1Time;
    let (_, key) = common::certs::make("seeded", &[host], 1, 4242);
    let mut b = openssl::x509::X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = openssl::bn::BigNum::from_u32(4242).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    let mut name = openssl::x509::X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "seeded").unwrap();
    let name = name.build();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(&key).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    b.set_not_before(&Asn1Time::from_unix(now - i64::from(age_days) * 86_400).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now + i64::from(left_days) * 86_400).unwrap())
        .unwrap();
    let san = openssl::x509::extension::SubjectAlternativeName::new()
        .dns(host)
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(san).unwrap();
    b.sign(&key, openssl::hash::MessageDigest::sha256())
        .unwrap();
    let cert = b.build();
    std::fs::create_dir_all(ca_dir).unwrap();
    std::fs::write(ca_dir.join(format!("{host}.crt")), cert.to_pem().unwrap()).unwrap();
    std::fs::write(
        ca_dir.join(format!("{host}.key")),
        key.private_key_to_pem_pkcs8().unwrap(),
    )
    .unwrap();
    cert.serial_number()
        .to_bn()
        .unwrap()
        .to_hex_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_early_a_certificate_past_two_thirds_of_its_life() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let p = Ports::new();
    let pebble = Pebble::start(p.plain, p.tls, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme");
    let ca_dir = store.join(format!("127.0.0.1_{}", pebble.port));
    // 7 days old, 2 left: two thirds of its 9 days were over 1 day ago.
    let seeded = seed(&ca_dir, A, 7, 2);
    let text = config(
        &p,
        &pebble,
        up.addr,
        &[A],
        &format!("storage: \"{}\"", store.display()),
        "",
        "",
    );
    let t = Tollgate::start_in(dir, &text, |_| {}).await;
    let root = pebble.root(t.dir.path());
    let renewed = wait_verified(p.tls_addr(), A, &root, &t).await;
    assert_ne!(renewed, seeded);
    t.wait_metric(
        &format!("tollgate_acme_orders_total{{host=\"{A}\",result=\"success\"}}"),
        1.0,
    )
    .await;
    let on_disk = std::fs::read(ca_dir.join(format!("{A}.crt"))).unwrap();
    let leaf = openssl::x509::X509::from_pem(&on_disk).unwrap();
    assert_eq!(
        leaf.serial_number()
            .to_bn()
            .unwrap()
            .to_hex_str()
            .unwrap()
            .to_string(),
        renewed,
        "the renewal replaced the stored file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_serving_while_the_ca_is_down() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let p = Ports::new();
    let mut pebble = Pebble::start(p.plain, p.tls, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme");
    let ca_dir = store.join(format!("127.0.0.1_{}", pebble.port));
    let storage = format!("storage: \"{}\"", store.display());
    let text = config(&p, &pebble, up.addr, &[A], &storage, "", "");
    let mut t = Tollgate::start_in(dir, &text, |_| {}).await;
    let root = pebble.root(t.dir.path());
    let issued = wait_verified(p.tls_addr(), A, &root, &t).await;

    // The CA goes away; the next start adds B (never issued) and a third host whose
    // stored certificate is due for renewal.
    pebble.stop();
    const C: &str = "c.acme.test";
    let seeded = seed(&ca_dir, C, 7, 2);
    let text = config(&p, &pebble, up.addr, &[A, B, C], &storage, "", "");
    let _ = t.child.kill();
    t.wait_exit().await;
    t.write_config(&text);
    t.restart().await;
    eventually(
        "renewals fail and are retried with backoff",
        3000,
        || async {
            status(&p, C)["failures"].as_u64().unwrap_or(0) >= 2
                && status(&p, B)["failures"].as_u64().unwrap_or(0) >= 2
        },
    )
    .await;
    // A serves from storage, C keeps its old certificate, B fails its handshake cleanly.
    let again = served(p.tls_addr(), A, &root).unwrap();
    assert_eq!((again.0.as_str(), again.2), (issued.as_str(), true));
    let old = served(p.tls_addr(), C, &root).expect("C keeps serving");
    assert_eq!(old.0, seeded);
    assert!(
        served(p.tls_addr(), B, &root).is_none(),
        "no certificate and no default: the handshake is refused"
    );
    let c = status(&p, C);
    assert_eq!(c["state"], "failed", "{c}");
    assert!(
        c["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("ACME"),
        "{c}"
    );
    let metrics = t.metrics_text().await;
    assert!(
        common::sample(
            &metrics,
            &format!("tollgate_acme_orders_total{{host=\"{C}\",result=\"failure\"}}")
        ) >= 2.0
    );
    // The process is still serving plain requests.
    assert!(t.child.try_wait().unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_orders_one_certificate_per_host_through_redis() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let redis = RedisServer::start();
    let (p1, p2) = (Ports::new(), Ports::new());
    // The CA validates on the first instance's ports; the second may hold the lock.
    let pebble = Pebble::start(p1.plain, p1.tls, &[]).await;
    let stores = format!("stores:\n  fleet:\n    url: \"{}\"\n", redis.url());
    let mut fleet = Vec::new();
    for p in [&p1, &p2] {
        let text = config(p, &pebble, up.addr, &[A, B], "store: fleet", "", &stores);
        fleet.push(Tollgate::start(&text).await);
    }
    let root = pebble.root(fleet[0].dir.path());
    let mut serials = Vec::new();
    for (t, p) in fleet.iter().zip([&p1, &p2]) {
        let a = wait_verified(p.tls_addr(), A, &root, t).await;
        let b = wait_verified(p.tls_addr(), B, &root, t).await;
        serials.push((a, b));
    }
    assert_eq!(
        serials[0], serials[1],
        "both instances serve the same certificates"
    );
    for host in [A, B] {
        let mut ordered = 0.0;
        let mut shared = 0.0;
        for t in &fleet {
            let m = t.metrics_text().await;
            ordered += common::sample(
                &m,
                &format!("tollgate_acme_orders_total{{host=\"{host}\",result=\"success\"}}"),
            );
            shared += common::sample(
                &m,
                &format!("tollgate_acme_orders_total{{host=\"{host}\",result=\"shared\"}}"),
            );
        }
        assert_eq!(
            (ordered, shared),
            (1.0, 1.0),
            "{host}: one order in the fleet, one instance took it from Redis"
        );
    }
    let keys = common::api::redis_cli(redis.port(), &["--scan", "--pattern", "tollgate:acme:*"]);
    assert!(keys.contains(&format!("cert:{A}")), "{keys}");
    assert!(!keys.contains("lock:"), "locks released: {keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_through_rejected_nonces() {
    let up = Upstream::start("127.0.0.1", "app").await;
    let p = Ports::new();
    // Every nonce rejected: every order fails on badNonce, and is retried.
    let mut pebble = Pebble::start(p.plain, p.tls, &[("PEBBLE_WFE_NONCEREJECT", "100")]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("acme");
    let text = config(
        &p,
        &pebble,
        up.addr,
        &[A],
        &format!("storage: \"{}\"", store.display()),
        "",
        "",
    );
    let t = Tollgate::start_in(dir, &text, |_| {}).await;
    eventually("orders fail on badNonce and are retried", 3000, || async {
        let s = status(&p, A);
        s["failures"].as_u64().unwrap_or(0) >= 3
            && s["last_error"]
                .as_str()
                .unwrap_or_default()
                .contains("badNonce")
    })
    .await;
    assert!(
        t.log_text().contains("badNonce"),
        "the CA's problem is logged:\n{}",
        t.log_text()
    );
    // Half the nonces rejected: instant-acme retries each request, tollgate each order.
    pebble.stop();
    pebble.spawn(&[("PEBBLE_WFE_NONCEREJECT", "50")]).await;
    let root = pebble.root(t.dir.path());
    wait_verified(p.tls_addr(), A, &root, &t).await;
    t.wait_metric(
        &format!("tollgate_acme_orders_total{{host=\"{A}\",result=\"success\"}}"),
        1.0,
    )
    .await;
    assert_eq!(status(&p, A)["state"], "valid");
}
