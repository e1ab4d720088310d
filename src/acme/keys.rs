//! The certificate keys, the CSRs and the TLS-ALPN-01 challenge certificates, made with
//! OpenSSL (already tollgate's TLS; rcgen would add a second X.509 stack for three small
//! functions).
//!
//! Keys are ECDSA P-256: every ACME CA issues for them, and their handshakes are cheap.

use openssl::asn1::{Asn1Object, Asn1OctetString, Asn1Time};
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509Extension, X509NameBuilder, X509ReqBuilder, X509};

use crate::tls::managed::ChallengeCert;

/// The `id-pe-acmeIdentifier` extension of a TLS-ALPN-01 certificate (RFC 8737).
const ACME_IDENTIFIER_OID: &str = "1.3.6.1.5.5.7.1.31";

/// A new P-256 private key.
pub fn new_key() -> Result<PKey<Private>, ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    PKey::from_ec_key(EcKey::generate(&group)?)
}

/// A CSR (DER) for `host` signed by `key`: SAN = `host`, and CN = `host` when it fits.
pub fn csr(host: &str, key: &PKey<Private>) -> Result<Vec<u8>, ErrorStack> {
    let mut b = X509ReqBuilder::new()?;
    if host.len() <= 64 {
        let mut name = X509NameBuilder::new()?;
        name.append_entry_by_nid(Nid::COMMONNAME, host)?;
        b.set_subject_name(&name.build())?;
    }
    b.set_pubkey(key)?;
    let san = SubjectAlternativeName::new()
        .dns(host)
        .build(&b.x509v3_context(None))?;
    let mut exts = Stack::new()?;
    exts.push(san)?;
    b.add_extensions(&exts)?;
    b.sign(key, MessageDigest::sha256())?;
    b.build().to_der()
}

/// The TLS-ALPN-01 certificate of `host` for the key authorization whose SHA-256 is
/// `digest`: self-signed, SAN = `host`, and the critical `acmeIdentifier` extension
/// holding the digest as a DER OCTET STRING.
pub fn challenge_cert(host: &str, digest: &[u8]) -> Result<ChallengeCert, ErrorStack> {
    let key = new_key()?;
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_nid(Nid::COMMONNAME, "tollgate ACME challenge")?;
    let name = name.build();
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(&key)?;
    b.set_not_before(&*Asn1Time::days_from_now(0)?)?;
    b.set_not_after(&*Asn1Time::days_from_now(7)?)?;
    let san = SubjectAlternativeName::new()
        .dns(host)
        .build(&b.x509v3_context(None, None))?;
    b.append_extension(san)?;
    // extnValue: OCTET STRING (SIZE (32)), DER: 0x04 0x20 then the digest.
    let mut value = Vec::with_capacity(digest.len() + 2);
    value.push(0x04);
    value.push(u8::try_from(digest.len()).unwrap_or(32));
    value.extend_from_slice(digest);
    let oid = Asn1Object::from_str(ACME_IDENTIFIER_OID)?;
    let contents = Asn1OctetString::new_from_bytes(&value)?;
    b.append_extension(X509Extension::new_from_der(&oid, true, &contents)?)?;
    b.sign(&key, MessageDigest::sha256())?;
    Ok(ChallengeCert {
        cert: b.build(),
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csr_names_its_host() {
        let key = new_key().unwrap();
        let der = csr("a.example.com", &key).unwrap();
        let req = openssl::x509::X509Req::from_der(&der).unwrap();
        assert!(req.verify(&key).unwrap());
        let text = String::from_utf8_lossy(&req.to_text().unwrap()).to_string();
        assert!(text.contains("DNS:a.example.com"), "{text}");
    }

    #[test]
    fn a_challenge_certificate_carries_the_digest_critically() {
        let c = challenge_cert("a.example.com", &[7u8; 32]).unwrap();
        let text = String::from_utf8_lossy(&c.cert.to_text().unwrap()).to_string();
        assert!(text.contains("DNS:a.example.com"), "{text}");
        assert!(text.contains("1.3.6.1.5.5.7.1.31: critical"), "{text}");
        let der = c.cert.to_der().unwrap();
        let mut want = vec![0x04, 0x20];
        want.extend_from_slice(&[7u8; 32]);
        assert!(der.windows(34).any(|w| w == want.as_slice()));
    }
}
