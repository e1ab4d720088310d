//! Test certificates, made at test time with the openssl crate: self-signed leaves with
//! the SAN names a test asks for, written as PEM files.

use std::path::{Path, PathBuf};

use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};

/// A certificate and key written to `dir`.
pub struct TestCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub x509: X509,
}

/// A self-signed EC P-256 certificate with common name `cn`, SAN DNS `names`, valid for
/// `days` from now, serial `serial`.
pub fn make(cn: &str, names: &[&str], days: u32, serial: u32) -> (X509, PKey<Private>) {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut subject = X509NameBuilder::new().unwrap();
    subject.append_entry_by_text("CN", cn).unwrap();
    let subject = subject.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_serial_number(&Asn1Integer::from_bn(&BigNum::from_u32(serial).unwrap()).unwrap())
        .unwrap();
    b.set_subject_name(&subject).unwrap();
    b.set_issuer_name(&subject).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(days).unwrap())
        .unwrap();
    if !names.is_empty() {
        let mut san = SubjectAlternativeName::new();
        for n in names {
            san.dns(n);
        }
        let san = san.build(&b.x509v3_context(None, None)).unwrap();
        b.append_extension(san).unwrap();
    }
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

/// [`make`], written to `dir/stem.pem` and `dir/stem.key`.
pub fn write(dir: &Path, stem: &str, cn: &str, names: &[&str], days: u32) -> TestCert {
    write_serial(dir, stem, cn, names, days, 1)
}

/// [`write`] with a serial number.
pub fn write_serial(
    dir: &Path,
    stem: &str,
    cn: &str,
    names: &[&str],
    days: u32,
    serial: u32,
) -> TestCert {
    let (x509, key) = make(cn, names, days, serial);
    let cert = dir.join(format!("{stem}.pem"));
    let key_file = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, x509.to_pem().unwrap()).unwrap();
    std::fs::write(&key_file, key.private_key_to_pem_pkcs8().unwrap()).unwrap();
    TestCert {
        cert,
        key: key_file,
        x509,
    }
}

/// The subject CN a server presents to `openssl s_client` for `servername` (`None`: no
/// SNI); `None` when the handshake fails.
pub fn presented_cn(addr: std::net::SocketAddr, servername: Option<&str>) -> Option<String> {
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-connect", &addr.to_string(), "-brief"]);
    match servername {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client runs");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // -brief prints `Peer certificate: CN = name`.
    text.lines()
        .find_map(|l| l.strip_prefix("Peer certificate: "))
        .and_then(|subject| subject.split("CN = ").nth(1))
        .map(|cn| cn.trim().to_string())
}
