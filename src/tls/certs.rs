//! One certificate and its key, read from PEM files and checked: a chain (leaf first) and
//! a private key that matches the leaf. What a client needs to know is read from the leaf:
//! the DNS names of its SAN (the names it serves) and when it expires.
//!
//! Every problem names its file: unreadable, too large, not PEM, no certificate or key in
//! it, or a key that does not match the certificate.

use std::io::Read;
use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::pkey::{PKey, Private};
use openssl::x509::X509;

/// The largest certificate or key file read: a long chain is a few tens of KB.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why a certificate or key file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", .file.display())]
pub struct CertError {
    /// The file.
    pub file: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

impl CertError {
    fn new(file: &Path, problem: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// A loaded certificate chain with its key, and what its leaf says.
pub struct LoadedCert {
    /// The certificate file.
    pub cert_file: PathBuf,
    /// The leaf, then the intermediates.
    pub chain: Vec<X509>,
    /// The private key of the leaf.
    pub key: PKey<Private>,
    /// The DNS names of the leaf's SAN, as written (`*.example.com` included).
    pub names: Vec<String>,
    /// The leaf's `notAfter`, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The leaf's `notBefore`, in seconds since the Unix epoch (ACME renews at two thirds
    /// of the lifetime).
    pub not_before: i64,
    /// The bytes of both files, to tell whether a later read changed anything.
    pub bytes: (Vec<u8>, Vec<u8>),
}

impl std::fmt::Debug for LoadedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedCert")
            .field("cert_file", &self.cert_file)
            .field("names", &self.names)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Reads `file` whole, at most [`MAX_PEM_BYTES`].
pub fn read_pem_file(file: &Path) -> Result<Vec<u8>, CertError> {
    let mut bytes = Vec::new();
    crate::files::open_regular(file)
        .and_then(|f| f.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| CertError::new(file, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(CertError::new(
            file,
            format!("larger than {MAX_PEM_BYTES} bytes: not a certificate or key file"),
        ));
    }
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(CertError::new(
            file,
            "not a PEM file (no `-----BEGIN` line); convert DER with `openssl x509 -inform der` or `openssl pkey -inform der`",
        ));
    }
    Ok(bytes)
}

/// Loads `cert` and `key` and checks that they belong together.
pub fn load(cert: &Path, key: &Path) -> Result<LoadedCert, CertError> {
    let cert_bytes = read_pem_file(cert)?;
    let key_bytes = read_pem_file(key)?;
    parse(cert, &cert_bytes, key, &key_bytes).map(|mut c| {
        c.bytes = (cert_bytes, key_bytes);
        c
    })
}

/// Parses PEM bytes already read (the files' names for the messages).
pub fn parse(
    cert: &Path,
    cert_bytes: &[u8],
    key: &Path,
    key_bytes: &[u8],
) -> Result<LoadedCert, CertError> {
    let chain = X509::stack_from_pem(cert_bytes)
        .map_err(|e| CertError::new(cert, format!("not a PEM certificate: {e}")))?;
    let Some(leaf) = chain.first() else {
        return Err(CertError::new(cert, "holds no certificate"));
    };
    let pkey = PKey::private_key_from_pem(key_bytes).map_err(|_| {
        CertError::new(
            key,
            "not a PEM private key (or an encrypted one: tollgate reads unencrypted keys)",
        )
    })?;
    let matches = leaf
        .public_key()
        .map(|public| public.public_eq(&pkey))
        .unwrap_or(false);
    if !matches {
        return Err(CertError::new(
            key,
            format!(
                "does not match the certificate in {} (its public key differs)",
                cert.display()
            ),
        ));
    }
    let names = leaf
        .subject_alt_names()
        .map(|sans| {
            sans.iter()
                .filter_map(|n| n.dnsname().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let not_after = unix_time(leaf.not_after())
        .ok_or_else(|| CertError::new(cert, "its expiry time cannot be read"))?;
    let not_before = unix_time(leaf.not_before())
        .ok_or_else(|| CertError::new(cert, "its start time cannot be read"))?;
    Ok(LoadedCert {
        cert_file: cert.to_path_buf(),
        chain,
        key: pkey,
        names,
        not_after,
        not_before,
        bytes: (Vec::new(), Vec::new()),
    })
}

/// `t` in seconds since the Unix epoch.
fn unix_time(t: &openssl::asn1::Asn1TimeRef) -> Option<i64> {
    let epoch = Asn1Time::from_unix(0).ok()?;
    let diff = epoch.diff(t).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}
