//! TLS termination's data: the certificate store and the acceptor built from it.
//!
//! A [`TlsStore`] is built with the runtime (at start and at each reload), from the files
//! `tls.certificates` names: each chain and key is read, checked ([`certs`]) and indexed
//! by the DNS names of its SAN ([`sni`]); the acceptor ([`acceptor`]) picks a certificate
//! per handshake by SNI. A file that cannot be used refuses the build with the file named,
//! so a broken replacement on disk leaves the running store (and its certificates)
//! serving. A rebuild whose settings and file bytes are unchanged keeps the previous store,
//! so its TLS session cache and ticket keys survive reloads that do not touch TLS.
//!
//! **Managed certificates.** Certificates an ACME client orders (`tls.acme`) live on the
//! [`managed::Managed`] board, one per process, carried over reloads: the acceptor's SNI
//! callback looks there first, so a new or renewed certificate serves the next handshake
//! without a rebuild of the store, and a host without one yet falls back to the files (and
//! their default).
//!
//! It uses `config` and OpenSSL, never Pingora: the proxy drives the handshake.

pub mod acceptor;
pub mod certs;
pub mod managed;
pub mod sni;

use std::path::PathBuf;
use std::sync::Arc;

use openssl::ssl::SslAcceptor;

use crate::config::{Config, Tls};
use crate::files::Stamp;
pub use certs::{CertError, LoadedCert};
pub use managed::Managed;

/// A certificate expiring sooner than this gets a warning from `check` and at load.
pub const EXPIRY_WARNING_SECS: i64 = 14 * 86_400;

/// Why a store cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file cannot be used.
    #[error("{0}")]
    Cert(#[from] CertError),
    /// OpenSSL refused the settings (`tls.ciphers` most likely) or a certificate.
    #[error("tls: OpenSSL refused the settings{}: {source}", .what)]
    Settings {
        /// What was being set up, e.g. ` (tls.ciphers)`.
        what: String,
        /// OpenSSL's errors.
        source: openssl::error::ErrorStack,
    },
}

/// What the metrics and `check` say about one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The certificate file (the `cert` label of the expiry gauge).
    pub file: PathBuf,
    /// Its SAN DNS names.
    pub names: Vec<String>,
    /// Its expiry, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// The live certificates and the acceptor that serves them.
pub struct TlsStore {
    /// The acceptor every TLS listener's handshake uses.
    pub acceptor: SslAcceptor,
    /// Each certificate, in config order.
    pub certs: Vec<CertInfo>,
    /// The settings it was built with.
    settings: Tls,
    /// Each certificate's and key's bytes as read, in config order.
    bytes: Vec<(Vec<u8>, Vec<u8>)>,
    /// The version of each file ([`files`] order) taken before it was read: the reloader
    /// compares the files on disk with it to see a rotated certificate.
    stamps: Vec<Option<Stamp>>,
}

impl std::fmt::Debug for TlsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStore")
            .field("certs", &self.certs)
            .finish_non_exhaustive()
    }
}

impl TlsStore {
    /// Loads every certificate `tls` names (none, and no `tls.acme`: no store) and builds
    /// the acceptor, which serves `managed`'s certificates first, unless `previous` was
    /// built from the same settings and the same file bytes, which is then returned as it
    /// is.
    pub fn build(
        tls: &Tls,
        previous: Option<&Arc<TlsStore>>,
        managed: &Arc<Managed>,
    ) -> Result<Option<Arc<TlsStore>>, TlsError> {
        if tls.certificates.is_empty() && tls.acme.is_none() {
            return Ok(None);
        }
        managed.set_settings(tls);
        let stamps: Vec<Option<Stamp>> = files(tls).map(Stamp::read).collect();
        let mut loaded = Vec::with_capacity(tls.certificates.len());
        for spec in &tls.certificates {
            loaded.push(certs::load(&spec.cert, &spec.key)?);
        }
        if let Some(prev) = previous {
            let same_bytes = prev.bytes.len() == loaded.len()
                && prev.bytes.iter().zip(&loaded).all(|(b, c)| *b == c.bytes);
            if prev.settings == *tls && same_bytes {
                return Ok(Some(prev.clone()));
            }
        }
        let mut store = Self::from_certs(tls, loaded, tls.default, managed)?;
        store.stamps = stamps;
        Ok(Some(Arc::new(store)))
    }

    /// The version of each file ([`files`] order) this store was loaded from, stamped
    /// before reading it (empty for a store built from certificates in memory).
    pub fn stamps(&self) -> &[Option<Stamp>] {
        &self.stamps
    }

    /// A store serving `managed`'s certificates, then `certs` (`default`: the index of the
    /// one for no or an unknown name) with `tls`'s settings.
    pub fn from_certs(
        tls: &Tls,
        certs: Vec<LoadedCert>,
        default: Option<usize>,
        managed: &Arc<Managed>,
    ) -> Result<TlsStore, TlsError> {
        let acceptor = acceptor::build(tls, &certs, default, managed).map_err(|source| {
            TlsError::Settings {
                what: if tls.ciphers.is_some() {
                    " (tls.ciphers)".to_string()
                } else {
                    String::new()
                },
                source,
            }
        })?;
        let infos = certs
            .iter()
            .map(|c| CertInfo {
                file: c.cert_file.clone(),
                names: c.names.clone(),
                not_after: c.not_after,
            })
            .collect();
        Ok(TlsStore {
            acceptor,
            certs: infos,
            settings: tls.clone(),
            bytes: certs.into_iter().map(|c| c.bytes).collect(),
            stamps: Vec::new(),
        })
    }
}

/// What is suspicious about the certificates of a valid `config`, one line each: a
/// certificate that expires within [`EXPIRY_WARNING_SECS`] of `now` (Unix seconds), or
/// that names no host the config routes.
pub fn warnings(config: &Config, certs: &[CertInfo], now: i64) -> Vec<String> {
    let mut out = Vec::new();
    let catch_all = config.unmatched.is_some();
    for c in certs {
        let file = c.file.display();
        let left = c.not_after - now;
        if left <= 0 {
            out.push(format!("tls: certificate {file} has expired"));
        } else if left < EXPIRY_WARNING_SECS {
            out.push(format!(
                "tls: certificate {file} expires in {} (within 14 days)",
                humantime::format_duration(std::time::Duration::from_secs(left.unsigned_abs()))
            ));
        }
        let routed = catch_all
            || c.names.iter().any(|n| {
                config
                    .origins
                    .iter()
                    .flat_map(|o| &o.hosts)
                    .any(|h| sni::serves(n, h))
            });
        if !routed {
            let names = if c.names.is_empty() {
                "no DNS name in its SAN".to_string()
            } else {
                c.names.join(", ")
            };
            out.push(format!(
                "tls: certificate {file} names no host an origin serves ({names})"
            ));
        }
    }
    out
}

/// Every file the store reads, for the reloader to watch.
pub fn files(tls: &Tls) -> impl Iterator<Item = &std::path::Path> {
    tls.certificates
        .iter()
        .flat_map(|c| [c.cert.as_path(), c.key.as_path()])
}
