//! `tls` and `sni` reach an HTTPS upstream: a real TLS server (OpenSSL, self-signed
//! certificate made for the test) records the SNI it was asked for.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::{client, Tollgate, SERVER};
use openssl::asn1::Asn1Time;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};

fn self_signed(name: &str) -> (X509, PKey<Private>) {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut subject = X509NameBuilder::new().unwrap();
    subject.append_entry_by_text("CN", name).unwrap();
    let subject = subject.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&subject).unwrap();
    b.set_issuer_name(&subject).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    let san = SubjectAlternativeName::new()
        .dns(name)
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(san).unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

/// A one-request-per-connection HTTPS server on a thread; returns its address and the
/// SNI names it saw. Bounded: it serves at most `n` connections, then its thread ends.
fn tls_upstream(n: usize) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let (cert, key) = self_signed("secure.internal");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    acceptor.set_private_key(&key).unwrap();
    let record = seen.clone();
    acceptor.set_servername_callback(move |ssl, _alert| {
        if let Some(name) = ssl.servername(openssl::ssl::NameType::HOST_NAME) {
            record.lock().unwrap().push(name.to_string());
        }
        Ok(())
    });
    let acceptor = acceptor.build();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(n) {
            let Ok(stream) = stream else { continue };
            let Ok(mut tls) = acceptor.accept(stream) else {
                continue;
            };
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            let body = "hello over tls\n";
            let _ = write!(
                tls,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.shutdown();
        }
    });
    (addr, seen)
}

/// One origin `secure.test` reaching `addr` over TLS with SNI `secure.internal`, plus
/// `extra` origin keys.
fn config(addr: std::net::SocketAddr, extra: &str) -> String {
    format!(
        r#"
{SERVER}origins:
  secure:
    hosts: ["secure.test"]
    upstreams: ["{addr}"]
    tls: true
    sni: secure.internal
{extra}"#
    )
}

async fn get_secure(t: &Tollgate) -> reqwest::Response {
    client()
        .get(t.url("/"))
        .header("host", "secure.test")
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_upstream_is_reached_with_the_configured_sni() {
    let (addr, seen) = tls_upstream(4);
    let t = Tollgate::start(&config(addr, "    tls_verify: false\n")).await;
    let resp = get_secure(&t).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "hello over tls\n");
    assert_eq!(
        seen.lock().unwrap().first().map(String::as_str),
        Some("secure.internal")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverifiable_certificate_is_refused_by_default() {
    let (addr, _seen) = tls_upstream(4);
    let t = Tollgate::start(&config(addr, "")).await;
    let resp = get_secure(&t).await;
    assert_eq!(
        resp.status(),
        502,
        "a self-signed upstream must not be trusted silently"
    );
}
