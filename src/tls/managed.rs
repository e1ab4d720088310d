//! Certificates an ACME client manages, and the challenges it is answering: the board the
//! ACME client (`crate::acme`) writes and the handshake, the proxy's HTTP-01 answer, the
//! admin API and the metrics read.
//!
//! **Serving.** Each managed host has at most one certificate (its SAN is that host);
//! the SNI callback ([`super::acceptor`]) looks the handshake's name up here first, by
//! exact name, and falls back to the files of `tls.certificates` (and their default)
//! when the host has no certificate yet. A host whose renewal fails keeps the certificate
//! it has: only a new certificate replaces it.
//!
//! **Challenges.** A TLS-ALPN-01 challenge (RFC 8737) is a self-signed certificate for the
//! host carrying the key authorization's digest; the acceptor serves it only to a client
//! that offers the `acme-tls/1` protocol (the CA's validation), so other clients keep
//! the host's real certificate during a renewal. An HTTP-01 challenge is a token and its
//! key authorization, answered at `/.well-known/acme-challenge/TOKEN` before routing.
//!
//! **Reading.** Every read is one `ArcSwap` load and a hash lookup (the name lower-cased
//! into a stack buffer): no lock and no allocation per handshake. Writes are rare (an
//! order, a reload) and copy the board under a mutex.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use openssl::pkey::{PKey, Private};
use openssl::ssl::SslContext;
use openssl::x509::X509;
use parking_lot::Mutex;
use serde::Serialize;

use crate::config::Tls;
use crate::tls::certs::LoadedCert;
use crate::tls::CertInfo;

/// The ALPN protocol of TLS-ALPN-01 validations (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The path prefix of HTTP-01 challenges (RFC 8555, section 8.3).
pub const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// The longest DNS name: a longer one is never managed.
const MAX_NAME: usize = 253;

/// A TLS-ALPN-01 challenge certificate and its key.
pub struct ChallengeCert {
    /// Self-signed, SAN = the host, with the critical `acmeIdentifier` extension.
    pub cert: X509,
    /// Its key.
    pub key: PKey<Private>,
}

/// Where a managed host stands, for the admin API (`GET /certificates`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostStatus {
    /// The host.
    pub host: String,
    /// `missing` (no certificate, none ordered yet), `ordering`, `valid`, `renewing`,
    /// `failed` (the last order failed: the current certificate, if any, keeps serving),
    /// `waiting` (another instance of the fleet holds the order's lock).
    pub state: String,
    /// The certificate's `notBefore`, Unix seconds.
    pub not_before: Option<i64>,
    /// Its `notAfter`, Unix seconds.
    pub not_after: Option<i64>,
    /// When it is renewed: two thirds into its lifetime, Unix seconds.
    pub renew_at: Option<i64>,
    /// When the next order is tried after a failure, Unix seconds.
    pub next_attempt: Option<i64>,
    /// Failed orders since the last success.
    pub failures: u32,
    /// The last failure: the CA's problem document (type and detail) or the error.
    pub last_error: Option<String>,
    /// Where the certificate is kept: its file, or `redis:STORE`.
    pub stored: Option<String>,
}

/// What the handshake reads.
#[derive(Default)]
struct Live {
    /// Host → its certificate's context.
    contexts: HashMap<Box<str>, SslContext, ahash::RandomState>,
    /// Host → its TLS-ALPN-01 challenge.
    alpn: HashMap<Box<str>, Arc<ChallengeCert>, ahash::RandomState>,
    /// Token → key authorization, for HTTP-01.
    http: HashMap<Box<str>, Box<str>, ahash::RandomState>,
    /// Each certificate, for the expiry gauge.
    certs: Vec<CertInfo>,
}

/// What writers keep to rebuild the live board.
#[derive(Default)]
struct Inner {
    /// The TLS settings contexts are built with (the live config's).
    settings: Option<Tls>,
    /// Host → its certificate.
    certs: BTreeMap<String, LoadedCert>,
    alpn: HashMap<Box<str>, Arc<ChallengeCert>, ahash::RandomState>,
    http: HashMap<Box<str>, Box<str>, ahash::RandomState>,
    status: BTreeMap<String, HostStatus>,
}

/// The managed certificates and challenges of the process (one, carried over reloads).
#[derive(Default)]
pub struct Managed {
    live: ArcSwap<Live>,
    inner: Mutex<Inner>,
    /// Itself, weakly, for the contexts' ALPN callbacks.
    me: Weak<Managed>,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed").finish_non_exhaustive()
    }
}

/// Lower-cases `name` (one trailing dot dropped) into `buf`.
pub(crate) fn lower<'b>(name: &str, buf: &'b mut [u8; MAX_NAME]) -> Option<&'b str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > MAX_NAME {
        return None;
    }
    let out = &mut buf[..name.len()];
    out.copy_from_slice(name.as_bytes());
    out.make_ascii_lowercase();
    std::str::from_utf8(out).ok()
}

impl Managed {
    /// An empty board.
    pub fn new() -> Arc<Managed> {
        Arc::new_cyclic(|me| Managed {
            me: me.clone(),
            ..Managed::default()
        })
    }

    /// The context serving `name` (the handshake's SNI), if a managed certificate does.
    pub fn context(&self, name: &str) -> Option<SslContext> {
        let mut buf = [0u8; MAX_NAME];
        let name = lower(name, &mut buf)?;
        let live = self.live.load();
        live.contexts.get(name).cloned()
    }

    /// Whether `name` has a TLS-ALPN-01 challenge pending.
    pub fn has_alpn_challenge(&self, name: &str) -> bool {
        self.alpn_challenge(name).is_some()
    }

    /// The TLS-ALPN-01 challenge certificate of `name`.
    pub fn alpn_challenge(&self, name: &str) -> Option<Arc<ChallengeCert>> {
        let mut buf = [0u8; MAX_NAME];
        let name = lower(name, &mut buf)?;
        let live = self.live.load();
        live.alpn.get(name).cloned()
    }

    /// The key authorization for HTTP-01 `token`.
    pub fn http_answer(&self, token: &str) -> Option<Box<str>> {
        let live = self.live.load();
        if live.http.is_empty() {
            return None;
        }
        live.http.get(token).cloned()
    }

    /// Every managed certificate, for the expiry gauge.
    pub fn certs(&self) -> Vec<CertInfo> {
        self.live.load().certs.clone()
    }

    /// Every managed host's status, by host.
    pub fn statuses(&self) -> Vec<HostStatus> {
        self.inner.lock().status.values().cloned().collect()
    }

    /// The status of `host`.
    pub fn status(&self, host: &str) -> Option<HostStatus> {
        self.inner.lock().status.get(host).cloned()
    }

    /// Records `status` (its `host` names it).
    pub fn set_status(&self, status: HostStatus) {
        self.inner.lock().status.insert(status.host.clone(), status);
    }

    /// Keeps only the statuses and certificates of `hosts` (after a reload changed them).
    pub fn retain(&self, hosts: &[String]) {
        let mut inner = self.inner.lock();
        inner.status.retain(|h, _| hosts.contains(h));
        inner.certs.retain(|h, _| hosts.contains(h));
        self.publish(&inner);
    }

    /// The TLS settings the live config has: contexts are rebuilt when they change.
    pub fn set_settings(&self, tls: &Tls) {
        let mut inner = self.inner.lock();
        if inner.settings.as_ref() == Some(tls) {
            return;
        }
        inner.settings = Some(tls.clone());
        self.publish(&inner);
    }

    /// Serves `cert` for `host` from now on. An error: OpenSSL refused it (the previous
    /// certificate, if any, keeps serving).
    pub fn install(&self, host: &str, cert: LoadedCert) -> Result<(), openssl::error::ErrorStack> {
        let mut inner = self.inner.lock();
        let settings = inner.settings.clone().unwrap_or_default();
        super::acceptor::cert_context(&settings, &cert, self.me.clone())?;
        inner.certs.insert(host.to_string(), cert);
        self.publish(&inner);
        Ok(())
    }

    /// Whether `host` serves a managed certificate.
    pub fn has_cert(&self, host: &str) -> bool {
        self.inner.lock().certs.contains_key(host)
    }

    /// Answers TLS-ALPN-01 for `host` with `challenge` until [`Managed::clear_challenges`].
    pub fn add_alpn(&self, host: &str, challenge: ChallengeCert) {
        let mut inner = self.inner.lock();
        inner.alpn.insert(host.into(), Arc::new(challenge));
        self.publish(&inner);
    }

    /// Answers HTTP-01 `token` with `key_authorization`.
    pub fn add_http(&self, token: &str, key_authorization: &str) {
        let mut inner = self.inner.lock();
        inner.http.insert(token.into(), key_authorization.into());
        self.publish(&inner);
    }

    /// Stops answering the challenges of `host` (TLS-ALPN-01) and `tokens` (HTTP-01).
    pub fn clear_challenges(&self, host: &str, tokens: &[String]) {
        let mut inner = self.inner.lock();
        inner.alpn.remove(host);
        for t in tokens {
            inner.http.remove(t.as_str());
        }
        self.publish(&inner);
    }

    /// Rebuilds the live board from `inner`. A certificate OpenSSL refuses under new
    /// settings is left out (and logged): the files' default serves its host.
    fn publish(&self, inner: &Inner) {
        let settings = inner.settings.clone().unwrap_or_default();
        let mut live = Live {
            alpn: inner.alpn.clone(),
            http: inner.http.clone(),
            ..Live::default()
        };
        for (host, cert) in &inner.certs {
            match super::acceptor::cert_context(&settings, cert, self.me.clone()) {
                Ok(ctx) => {
                    live.contexts.insert(host.as_str().into(), ctx);
                    live.certs.push(CertInfo {
                        file: cert.cert_file.clone(),
                        names: cert.names.clone(),
                        not_after: cert.not_after,
                    });
                }
                Err(e) => log::error!(
                    "tls.acme: the certificate of {host} cannot be served with the TLS settings: {e}"
                ),
            }
        }
        self.live.store(Arc::new(live));
    }
}

/// The label a managed certificate kept in a Redis store gets in the expiry gauge.
pub fn store_label(store: &str, host: &str) -> PathBuf {
    PathBuf::from(format!("redis:{store}/{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_bounds_and_folds() {
        let mut buf = [0u8; MAX_NAME];
        assert_eq!(lower("A.Example.COM.", &mut buf), Some("a.example.com"));
        assert_eq!(lower("", &mut buf), None);
        assert_eq!(lower(&"a".repeat(300), &mut buf), None);
    }

    #[test]
    fn challenges_come_and_go() {
        let m = Managed::new();
        assert!(m.http_answer("t").is_none());
        m.add_http("t", "t.thumb");
        assert_eq!(m.http_answer("t").as_deref(), Some("t.thumb"));
        m.clear_challenges("a.test", &["t".to_string()]);
        assert!(m.http_answer("t").is_none());
        assert!(m.context("a.test").is_none());
    }
}
