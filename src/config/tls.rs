//! The edge's transport settings as written: a `server.listen` entry (a string, or an
//! object adding `tls`, `h2c` and `proxy_protocol`) and the `tls:` section (certificate
//! and key files, the default certificate, the lowest version, the TLS 1.2 ciphers, the
//! handshake deadline).
//!
//! Reading the config only records where each file is (relative paths against the config
//! file's directory); the runtime loads and checks them when it is built (see
//! `crate::tls`), as it loads segments, so a missing, non-PEM or mismatched file refuses a
//! start or a reload with the file named, and the old certificates keep serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::model::{Acme, CertSpec, Listener, Tls, TlsVersion};
use crate::config::report::{child, item, At, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::{Node, Value};

/// The keys the object form of a `server.listen` entry takes.
pub(crate) const LISTENER_KEYS: [&str; 4] = ["addr", "tls", "h2c", "proxy_protocol"];

/// The keys `tls:` takes.
pub(crate) const TLS_KEYS: [&str; 6] = [
    "certificates",
    "default",
    "min_version",
    "ciphers",
    "handshake_timeout",
    "acme",
];

/// The keys one `tls.certificates` entry takes.
pub(crate) const CERT_KEYS: [&str; 2] = ["cert", "key"];

/// Certificates a config may name: far above what SNI hosting on one proxy needs.
pub(crate) const MAX_CERTIFICATES: usize = 1024;

/// The range `tls.handshake_timeout` accepts.
pub(crate) const HANDSHAKE_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(300));

/// The versions `tls.min_version` accepts.
const VERSIONS: [&str; 2] = ["1.2", "1.3"];

/// Reads one `server.listen` item: `"ip:port"` or `{addr, tls, h2c, proxy_protocol}`.
pub(crate) fn listener(r: &mut Report, node: &Node, path: &str) -> Option<At<Listener>> {
    if !matches!(node.value, Value::Map(_)) {
        let addr = scalar::socket_addr(r, node, path)?;
        return Some(At::new(Listener::plain(addr), node.pos, path));
    }
    let fields = scalar::map(r, node, path)?;
    let mut addr = None;
    let mut l = Listener::plain(std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut addr_pos = node.pos;
    for f in fields {
        let sub = child(path, &f.key);
        let v = &f.value;
        match f.key.as_str() {
            "addr" => {
                addr = scalar::socket_addr(r, v, &sub);
                addr_pos = v.pos;
            }
            "tls" => l.tls = scalar::boolean(r, v, &sub).unwrap_or(false),
            "h2c" => l.h2c = scalar::boolean(r, v, &sub).unwrap_or(false),
            "proxy_protocol" => l.proxy_protocol = scalar::boolean(r, v, &sub).unwrap_or(false),
            other => r.error(
                f.key_pos,
                &sub,
                suggest::unknown("key", other, &LISTENER_KEYS),
            ),
        }
    }
    if l.tls && l.h2c {
        r.error(
            node.pos,
            path,
            "`h2c` is for plaintext listeners; a TLS listener offers HTTP/2 by ALPN already",
        );
    }
    if fields.iter().all(|f| f.key != "addr") {
        r.error(node.pos, path, "missing required field `addr`");
    }
    l.addr = addr?;
    Some(At::new(l, addr_pos, path))
}

/// Reads `tls:`, or its defaults when absent, and `tls.acme` apart (its hosts and store
/// are resolved once the origins and stores are read: [`crate::config::acme::resolve`]).
/// `file` is the config file, whose directory relative paths start in.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, file: &str) -> (Tls, Option<At<Acme>>) {
    let mut tls = Tls::default();
    let mut acme = None;
    let Some(entries) = node.and_then(|n| scalar::map(r, n, "tls")) else {
        return (tls, acme);
    };
    let base = Path::new(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut default = None;
    for e in entries {
        let path = child("tls", &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "certificates" => tls.certificates = certificates(r, v, &path, &base),
            "default" => {
                default = scalar::text(r, v, &path).map(|t| At::new(base.join(t), v.pos, &path));
            }
            "min_version" => {
                let version = version_text(v)
                    .and_then(|t| VERSIONS.iter().position(|o| *o == t))
                    .or_else(|| scalar::choice(r, v, &path, "TLS version", &VERSIONS));
                match version {
                    Some(0) => tls.min_version = TlsVersion::V1_2,
                    Some(_) => tls.min_version = TlsVersion::V1_3,
                    None => {}
                }
            }
            "ciphers" => {
                if let Some(t) = scalar::text(r, v, &path) {
                    let ok = !t.is_empty()
                        && t.len() <= 4096
                        && t.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
                    if ok {
                        tls.ciphers = Some(t.to_string());
                    } else {
                        r.error(
                            v.pos,
                            &path,
                            "`ciphers` is an OpenSSL cipher list of printable characters, e.g. `ECDHE+AESGCM:ECDHE+CHACHA20`",
                        );
                    }
                }
            }
            "handshake_timeout" => {
                if let Some(d) = scalar::duration(r, v, &path, HANDSHAKE_RANGE, ("100ms", "5m")) {
                    tls.handshake_timeout = d;
                }
            }
            "acme" => acme = crate::config::acme::parse(r, v, &path, &base),
            other => r.error(e.key_pos, &path, suggest::unknown("key", other, &TLS_KEYS)),
        }
    }
    if let Some(d) = default {
        match tls.certificates.iter().position(|c| c.cert == d.v) {
            Some(i) => tls.default = Some(i),
            None => r.error(
                d.pos,
                &d.path,
                format!(
                    "`{}` is not the `cert` of any entry of `tls.certificates`",
                    d.v.display()
                ),
            ),
        }
    }
    (tls, acme)
}

/// `min_version: 1.2` written as a plain number: read as the text it is.
fn version_text(node: &Node) -> Option<&str> {
    match &node.value {
        Value::Scalar(s) => Some(s.text.trim()),
        _ => None,
    }
}

/// The `tls.certificates` list: `{cert, key}` entries, both required.
fn certificates(r: &mut Report, node: &Node, path: &str, base: &Path) -> Vec<CertSpec> {
    let Some(items) = scalar::seq(r, node, path) else {
        return Vec::new();
    };
    if items.len() > MAX_CERTIFICATES {
        let message =
            crate::config::bounds::too_many("certificates", items.len(), MAX_CERTIFICATES);
        r.error(node.pos, path, message);
        return Vec::new();
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        let Some(fields) = scalar::map(r, n, &p) else {
            continue;
        };
        let (mut cert, mut key): (Option<PathBuf>, Option<PathBuf>) = (None, None);
        for f in fields {
            let sub = child(&p, &f.key);
            match f.key.as_str() {
                "cert" => cert = scalar::text(r, &f.value, &sub).map(|t| base.join(t)),
                "key" => key = scalar::text(r, &f.value, &sub).map(|t| base.join(t)),
                other => r.error(f.key_pos, &sub, suggest::unknown("key", other, &CERT_KEYS)),
            }
        }
        for (name, present) in [("cert", cert.is_some()), ("key", key.is_some())] {
            if !present && fields.iter().all(|f| f.key != name) {
                r.error(n.pos, &p, format!("missing required field `{name}`"));
            }
        }
        if let (Some(cert), Some(key)) = (cert, key) {
            if out.iter().any(|c: &CertSpec| c.cert == cert) {
                r.error(n.pos, &p, format!("`{}` is listed twice", cert.display()));
            }
            out.push(CertSpec { cert, key });
        }
    }
    out
}

/// A TLS listener needs certificates (files, or `tls.acme`): each `tls: true` listener
/// without any is an error at the listener.
pub(crate) fn check_listeners(r: &mut Report, listeners: &[At<Listener>], tls: &Tls, acme: bool) {
    if !tls.certificates.is_empty() || acme {
        return;
    }
    for l in listeners.iter().filter(|l| l.v.tls) {
        r.error(
            l.pos,
            &l.path,
            "a TLS listener needs certificates: add `tls: { certificates: [{ cert: FILE, key: FILE }] }` or `tls.acme`",
        );
    }
}
