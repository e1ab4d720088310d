//! `tls.acme` as written: the CA's directory, the account's contact, the hosts to manage
//! (listed, or every exact host of the origins), where the account and certificates are
//! kept (a directory, or a Redis store shared by a fleet), the CA roots for the directory's
//! HTTPS, the challenge and the retry backoff.
//!
//! Reading records names and paths only; the ACME client (`crate::acme`) creates the
//! directory, reads the files and talks to the CA.

use std::path::Path;
use std::time::Duration;

use crate::config::model::{Acme, AcmeChallenge, AcmeStorage, Origin, RedisEndpoint, StoreSpec};
use crate::config::origin::is_hostname;
use crate::config::report::{child, item, At, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `tls.acme` takes.
pub(crate) const ACME_KEYS: [&str; 9] = [
    "directory",
    "email",
    "hosts",
    "from_origins",
    "storage",
    "store",
    "ca_roots",
    "challenge",
    "retry",
];

/// The keys `tls.acme.retry` takes.
pub(crate) const RETRY_KEYS: [&str; 2] = ["min", "max"];

/// The values `tls.acme.challenge` takes.
pub(crate) const CHALLENGES: [&str; 3] = ["auto", "tls-alpn-01", "http-01"];

/// Hosts `tls.acme` may manage: one order each, so far below a CA's rate limits' concern
/// for one operator, and bounded.
pub(crate) const MAX_ACME_HOSTS: usize = 1000;

/// The range of `retry.min` and `retry.max`.
pub(crate) const RETRY_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(7 * 86_400));

/// Reads `tls.acme`. `base`: the config file's directory.
pub(crate) fn parse(r: &mut Report, node: &Node, path: &str, base: &Path) -> Option<At<Acme>> {
    let entries = scalar::map(r, node, path)?;
    let mut acme = Acme {
        directory: String::new(),
        email: None,
        hosts: Vec::new(),
        from_origins: false,
        storage: AcmeStorage::Dir(Default::default()),
        ca_roots: None,
        challenge: AcmeChallenge::Auto,
        retry_min: Duration::from_secs(60),
        retry_max: Duration::from_secs(6 * 3600),
    };
    let (mut storage, mut store) = (None, None);
    let mut ok = true;
    for e in entries {
        let sub = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "directory" => match scalar::text(r, v, &sub) {
                Some(t) if directory_ok(t) => acme.directory = t.to_string(),
                Some(t) => {
                    r.error(v.pos, &sub, format!("`{t}` is not an https:// URL; Let's Encrypt's is `https://acme-v02.api.letsencrypt.org/directory` (staging: `https://acme-staging-v02.api.letsencrypt.org/directory`)"));
                    ok = false;
                }
                None => ok = false,
            },
            "email" => match scalar::text(r, v, &sub) {
                Some(t) if email_ok(t) => acme.email = Some(t.to_string()),
                Some(t) => r.error(
                    v.pos,
                    &sub,
                    format!("`{t}` is not an email address (name@domain, no spaces)"),
                ),
                None => {}
            },
            "hosts" => acme.hosts = hosts(r, v, &sub),
            "from_origins" => acme.from_origins = scalar::boolean(r, v, &sub).unwrap_or(false),
            "storage" => {
                storage = scalar::text(r, v, &sub).map(|t| At::new(base.join(t), v.pos, &sub));
            }
            "store" => {
                store = scalar::text(r, v, &sub).map(|t| At::new(t.to_string(), v.pos, &sub))
            }
            "ca_roots" => acme.ca_roots = scalar::text(r, v, &sub).map(|t| base.join(t)),
            "challenge" => match scalar::choice(r, v, &sub, "challenge", &CHALLENGES) {
                Some(0) => acme.challenge = AcmeChallenge::Auto,
                Some(1) => acme.challenge = AcmeChallenge::TlsAlpn01,
                Some(_) => acme.challenge = AcmeChallenge::Http01,
                None => {}
            },
            "retry" => retry(r, v, &sub, &mut acme),
            other => r.error(e.key_pos, &sub, suggest::unknown("key", other, &ACME_KEYS)),
        }
    }
    if entries.iter().all(|e| e.key != "directory") {
        r.error(node.pos, path, "missing required field `directory` (the CA's directory URL, e.g. Let's Encrypt staging's `https://acme-staging-v02.api.letsencrypt.org/directory`)");
        ok = false;
    }
    if acme.retry_min > acme.retry_max {
        r.error(
            node.pos,
            &child(path, "retry"),
            "`retry.min` is longer than `retry.max`",
        );
    }
    match (storage, store) {
        (Some(d), None) => acme.storage = AcmeStorage::Dir(d.v),
        (None, Some(s)) => acme.storage = AcmeStorage::Store(s.v),
        (Some(d), Some(_)) => {
            r.error(d.pos, &d.path, "give `storage: DIR` (files) or `store: NAME` (a Redis store shared by a fleet), not both");
            ok = false;
        }
        (None, None) => {
            r.error(node.pos, path, "missing `storage: DIR` (a directory for the account key and certificates) or `store: NAME` (a Redis store of `stores:`)");
            ok = false;
        }
    }
    if acme.hosts.is_empty() && !acme.from_origins {
        r.error(
            node.pos,
            path,
            "no host to manage: list them in `hosts`, or write `from_origins: true`",
        );
    }
    ok.then(|| At::new(acme, node.pos, path))
}

/// Checks what needs the rest of the config: `store` names a standalone Redis store, and
/// `from_origins` adds the origins' exact hosts (warning about wildcards).
pub(crate) fn resolve(
    r: &mut Report,
    acme: &mut At<Acme>,
    stores: &[StoreSpec],
    origins: &[Origin],
) {
    if let AcmeStorage::Store(name) = &acme.v.storage {
        match stores.iter().find(|s| &s.name == name) {
            None => {
                let names: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
                r.error(
                    acme.pos,
                    &child(&acme.path, "store"),
                    suggest::unknown("store", name, &names),
                );
            }
            Some(s) if matches!(s.redis.endpoint, RedisEndpoint::Cluster(_)) => r.error(
                acme.pos,
                &child(&acme.path, "store"),
                format!("store `{name}` is a Redis Cluster; ACME storage takes a standalone Redis (`url:`)"),
            ),
            Some(_) => {}
        }
    }
    if acme.v.from_origins {
        for host in origins.iter().flat_map(|o| &o.hosts) {
            if host.starts_with("*.") {
                r.warn(acme.pos, &child(&acme.path, "from_origins"), format!("`{host}` is a wildcard: ACME certificates for wildcards need the DNS-01 challenge, which tollgate does not answer; give it a certificate in `tls.certificates`"));
            } else if host.starts_with('[') {
                continue;
            } else if !acme.v.hosts.contains(host) {
                acme.v.hosts.push(host.clone());
            }
        }
    }
    if acme.v.hosts.len() > MAX_ACME_HOSTS {
        let message =
            crate::config::bounds::too_many("ACME hosts", acme.v.hosts.len(), MAX_ACME_HOSTS);
        r.error(acme.pos, &acme.path, message);
    }
}

/// `https://` and something after it.
fn directory_ok(t: &str) -> bool {
    t.len() <= 2048
        && t.strip_prefix("https://")
            .is_some_and(|rest| !rest.is_empty())
        && t.bytes().all(|b| b.is_ascii_graphic())
}

fn email_ok(t: &str) -> bool {
    t.len() <= 254
        && t.split_once('@').is_some_and(|(user, domain)| {
            !user.is_empty() && domain.contains('.') && is_hostname(domain)
        })
        && t.bytes()
            .all(|b| b.is_ascii_graphic() && b != b',' && b != b'<' && b != b'>')
}

/// `hosts: [...]`: exact DNS names, lower-cased, no repeats.
fn hosts(r: &mut Report, node: &Node, path: &str) -> Vec<String> {
    let Some(items) = scalar::seq(r, node, path) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::with_capacity(items.len().min(MAX_ACME_HOSTS));
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        let Some(t) = scalar::text(r, n, &p) else {
            continue;
        };
        let lower = t.trim_end_matches('.').to_ascii_lowercase();
        if lower.starts_with("*.") {
            r.error(n.pos, &p, format!("`{t}` is a wildcard: ACME certificates for wildcards need the DNS-01 challenge, which tollgate does not answer"));
        } else if !is_hostname(&lower) || !lower.contains('.') && lower != "localhost" {
            r.error(
                n.pos,
                &p,
                format!("`{t}` is not a DNS name, e.g. `shop.example.com`"),
            );
        } else if out.contains(&lower) {
            r.error(n.pos, &p, format!("`{t}` is listed twice"));
        } else {
            out.push(lower);
        }
    }
    out
}

/// `retry: {min, max}`.
fn retry(r: &mut Report, node: &Node, path: &str, acme: &mut Acme) {
    let Some(entries) = scalar::map(r, node, path) else {
        return;
    };
    for e in entries {
        let sub = child(path, &e.key);
        match e.key.as_str() {
            "min" | "max" => {
                if let Some(d) = scalar::duration(r, &e.value, &sub, RETRY_RANGE, ("100ms", "7d")) {
                    if e.key == "min" {
                        acme.retry_min = d;
                    } else {
                        acme.retry_max = d;
                    }
                }
            }
            other => r.error(e.key_pos, &sub, suggest::unknown("key", other, &RETRY_KEYS)),
        }
    }
}
