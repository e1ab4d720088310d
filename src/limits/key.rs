//! Limit keys: which parts of a request identify "the same client", and how they are
//! hashed into a `u64` without building strings.
//!
//! A [`KeySpec`] is a list of [`KeyPart`]s. The proxy exposes a request through the
//! [`Facts`] trait; [`KeySpec::hash`] feeds each part's bytes into one hasher, tagged with
//! the part's position and length so that `("ab", "c")` and `("a", "bc")` differ. The hash
//! is 64 bits, so two distinct keys collide with odds `n² / 2^65` for `n` live keys: about
//! 3e-8 for a million keys, far below the count-min sketches' own collision rate.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Fixed seeds, so that a key hashes the same in every process (the shared Redis state of
/// later backends depends on it).
const SEEDS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

/// One part of a limit key, as written in the config (`client_ip`, `header:x-api-key`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The client's IP: the peer, or the right-most untrusted `X-Forwarded-For` hop when the
    /// peer is a trusted proxy.
    ClientIp,
    /// The customer: `server.customer_header` when present, else the origin's `customer`.
    Customer,
    /// The request's host, lower-cased, port stripped.
    Host,
    /// The IP of the selected upstream server (inflight limits only).
    ServerIp,
    /// The IP and port of the selected upstream server (inflight limits only).
    ServerAddr,
    /// The origin's name from the config.
    Origin,
    /// The request method.
    Method,
    /// The request path, without the query.
    Path,
    /// A request header's value; the name is stored lower-case.
    Header(String),
    /// A fixed text: every request shares it, which makes a limit global to the origin.
    Const(String),
}

/// Why a key part did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyPartError {
    /// Not one of the known part names.
    #[error("unknown key part `{0}`; expected one of client_ip, customer, host, server_ip, server_addr, origin, method, path, header:NAME, const:TEXT")]
    Unknown(String),
    /// `header:` with an empty or invalid header name.
    #[error("`{0}` needs a valid header name after `header:`")]
    BadHeader(String),
}

impl KeyPart {
    /// The plain part names, for suggestions and messages.
    pub const NAMES: [&'static str; 10] = [
        "client_ip",
        "customer",
        "host",
        "server_ip",
        "server_addr",
        "origin",
        "method",
        "path",
        "header:NAME",
        "const:TEXT",
    ];

    /// Parses a part as written in the config.
    pub fn parse(text: &str) -> Result<KeyPart, KeyPartError> {
        let part = match text {
            "client_ip" => KeyPart::ClientIp,
            "customer" => KeyPart::Customer,
            "host" => KeyPart::Host,
            "server_ip" => KeyPart::ServerIp,
            "server_addr" => KeyPart::ServerAddr,
            "origin" => KeyPart::Origin,
            "method" => KeyPart::Method,
            "path" => KeyPart::Path,
            _ => {
                if let Some(name) = text.strip_prefix("header:") {
                    let valid = !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !valid {
                        return Err(KeyPartError::BadHeader(text.to_string()));
                    }
                    KeyPart::Header(name.to_ascii_lowercase())
                } else if let Some(value) = text.strip_prefix("const:") {
                    KeyPart::Const(value.to_string())
                } else {
                    return Err(KeyPartError::Unknown(text.to_string()));
                }
            }
        };
        Ok(part)
    }

    /// Whether the part is only known once an upstream server is selected, which limits it
    /// to the inflight kind (decided in `upstream_peer`).
    pub fn needs_server(&self) -> bool {
        matches!(self, KeyPart::ServerIp | KeyPart::ServerAddr)
    }

    /// A small tag mixed into the hash so that equal bytes from different parts differ.
    fn tag(&self) -> u8 {
        match self {
            KeyPart::ClientIp => 1,
            KeyPart::Customer => 2,
            KeyPart::Host => 3,
            KeyPart::ServerIp => 4,
            KeyPart::ServerAddr => 5,
            KeyPart::Origin => 6,
            KeyPart::Method => 7,
            KeyPart::Path => 8,
            KeyPart::Header(_) => 9,
            KeyPart::Const(_) => 10,
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::ClientIp => f.write_str("client_ip"),
            KeyPart::Customer => f.write_str("customer"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::ServerIp => f.write_str("server_ip"),
            KeyPart::ServerAddr => f.write_str("server_addr"),
            KeyPart::Origin => f.write_str("origin"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Const(text) => write!(f, "const:{text}"),
        }
    }
}

/// One request's value for one key part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact<'a> {
    /// Text or raw header bytes.
    Bytes(&'a [u8]),
    /// An address (client or server IP).
    Ip(IpAddr),
    /// An address with port (server address).
    Addr(SocketAddr),
}

/// A request as the limiters see it: a value per key part, or `None` when the request
/// lacks it (then the limit does not apply and is counted as `skipped`).
pub trait Facts {
    /// The request's value for `part` (borrowed from the request or from the part itself,
    /// as for `const:`).
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>>;
}

/// The ordered list of parts that make up a limit's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeySpec {
    parts: Box<[KeyPart]>,
}

impl KeySpec {
    /// A key made of `parts`, in this order.
    pub fn new(parts: Vec<KeyPart>) -> Self {
        Self {
            parts: parts.into_boxed_slice(),
        }
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }

    /// Whether any part needs the selected upstream server.
    pub fn needs_server(&self) -> bool {
        self.parts.iter().any(KeyPart::needs_server)
    }

    /// Hashes the request's key, or `None` when a part is missing. No allocation: every
    /// part is written straight into one `ahash` hasher with fixed seeds.
    pub fn hash<F: Facts + ?Sized>(&self, facts: &F) -> Option<u64> {
        let mut hasher =
            ahash::RandomState::with_seeds(SEEDS[0], SEEDS[1], SEEDS[2], SEEDS[3]).build_hasher();
        for part in self.parts.iter() {
            hasher.write_u8(part.tag());
            write_fact(&mut hasher, facts.fact(part)?);
        }
        Some(hasher.finish())
    }
}

fn write_fact<H: Hasher>(hasher: &mut H, fact: Fact<'_>) {
    match fact {
        Fact::Bytes(bytes) => {
            hasher.write_usize(bytes.len());
            hasher.write(bytes);
        }
        Fact::Ip(ip) => write_ip(hasher, ip),
        Fact::Addr(addr) => {
            write_ip(hasher, addr.ip());
            hasher.write_u16(addr.port());
        }
    }
}

fn write_ip<H: Hasher>(hasher: &mut H, ip: IpAddr) {
    // An IPv4-mapped IPv6 address is the same client as its IPv4 form.
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            hasher.write_u8(4);
            hasher.write(&v4.octets());
        }
        IpAddr::V6(v6) => {
            hasher.write_u8(6);
            hasher.write(&v6.octets());
        }
    }
}

/// The value an override's `match:` compares a key part with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MatchValue {
    /// Exact bytes (customer, host, header, method, path, ...).
    Exact(Box<[u8]>),
    /// An IP network, for `client_ip` / `server_ip`: `10.0.0.0/8` or a single address.
    Net(IpNet),
}

/// One `PART: VALUE` condition of an override's `match:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Matcher {
    /// The part compared.
    pub part: KeyPart,
    /// The value it must have.
    pub value: MatchValue,
}

impl Matcher {
    /// Whether the request's fact for the part equals the value. A missing part never
    /// matches. Host comparison is case-insensitive because hosts are.
    pub fn matches<F: Facts + ?Sized>(&self, facts: &F) -> bool {
        let Some(fact) = facts.fact(&self.part) else {
            return false;
        };
        match (&self.value, fact) {
            (MatchValue::Net(net), Fact::Ip(ip)) => net.contains(&ip.to_canonical()),
            (MatchValue::Net(net), Fact::Addr(addr)) => net.contains(&addr.ip().to_canonical()),
            (MatchValue::Exact(want), Fact::Bytes(got)) => {
                if self.part == KeyPart::Host {
                    want.eq_ignore_ascii_case(got)
                } else {
                    **want == *got
                }
            }
            (MatchValue::Exact(want), Fact::Ip(ip)) => {
                std::str::from_utf8(want)
                    .ok()
                    .and_then(|s| s.parse::<IpAddr>().ok())
                    == Some(ip.to_canonical())
            }
            (MatchValue::Exact(want), Fact::Addr(addr)) => {
                std::str::from_utf8(want)
                    .ok()
                    .and_then(|s| s.parse::<SocketAddr>().ok())
                    == Some(addr)
            }
            (MatchValue::Net(_), Fact::Bytes(_)) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Map(HashMap<KeyPart, Vec<u8>>, Option<IpAddr>);

    impl Facts for Map {
        fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
            if *part == KeyPart::ClientIp {
                return self.1.map(Fact::Ip);
            }
            self.0.get(part).map(|v| Fact::Bytes(v))
        }
    }

    fn facts(pairs: &[(KeyPart, &str)]) -> Map {
        Map(
            pairs
                .iter()
                .map(|(p, v)| (p.clone(), v.as_bytes().to_vec()))
                .collect(),
            Some("10.1.2.3".parse().unwrap()),
        )
    }

    #[test]
    fn parses_every_part_and_round_trips() {
        for text in [
            "client_ip",
            "customer",
            "host",
            "server_ip",
            "server_addr",
            "origin",
            "method",
            "path",
            "header:x-api-key",
            "const:global",
        ] {
            assert_eq!(KeyPart::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            KeyPart::parse("header:X-Api-Key").unwrap(),
            KeyPart::Header("x-api-key".into())
        );
        assert!(matches!(
            KeyPart::parse("client"),
            Err(KeyPartError::Unknown(_))
        ));
        assert!(matches!(
            KeyPart::parse("header:"),
            Err(KeyPartError::BadHeader(_))
        ));
        assert!(matches!(
            KeyPart::parse("header:a b"),
            Err(KeyPartError::BadHeader(_))
        ));
    }

    #[test]
    fn hash_separates_part_boundaries_and_kinds() {
        let spec = KeySpec::new(vec![KeyPart::Customer, KeyPart::Host]);
        let a = spec.hash(&facts(&[(KeyPart::Customer, "ab"), (KeyPart::Host, "c")]));
        let b = spec.hash(&facts(&[(KeyPart::Customer, "a"), (KeyPart::Host, "bc")]));
        assert!(a.is_some() && b.is_some());
        assert_ne!(a, b);
        let swapped = KeySpec::new(vec![KeyPart::Host, KeyPart::Customer]);
        let c = swapped.hash(&facts(&[(KeyPart::Customer, "c"), (KeyPart::Host, "ab")]));
        assert_ne!(a, c, "same bytes under other parts must differ");
    }

    #[test]
    fn hash_is_stable_and_missing_part_skips() {
        let spec = KeySpec::new(vec![KeyPart::Customer, KeyPart::ClientIp]);
        let f = facts(&[(KeyPart::Customer, "acme")]);
        assert_eq!(spec.hash(&f), spec.hash(&f));
        let spec = KeySpec::new(vec![KeyPart::Header("x-api-key".into())]);
        assert_eq!(spec.hash(&f), None);
    }

    #[test]
    fn mapped_ipv6_hashes_as_ipv4() {
        let spec = KeySpec::new(vec![KeyPart::ClientIp]);
        let v4 = Map(HashMap::new(), Some("10.0.0.1".parse().unwrap()));
        let mapped = Map(HashMap::new(), Some("::ffff:10.0.0.1".parse().unwrap()));
        assert_eq!(spec.hash(&v4), spec.hash(&mapped));
    }

    #[test]
    fn matchers_compare_bytes_hosts_and_networks() {
        let f = facts(&[
            (KeyPart::Customer, "bigco"),
            (KeyPart::Host, "Shop.Example.com"),
        ]);
        let m = |part: KeyPart, value: MatchValue| Matcher { part, value }.matches(&f);
        assert!(m(
            KeyPart::Customer,
            MatchValue::Exact(b"bigco".to_vec().into())
        ));
        assert!(!m(
            KeyPart::Customer,
            MatchValue::Exact(b"BIGCO".to_vec().into())
        ));
        assert!(m(
            KeyPart::Host,
            MatchValue::Exact(b"shop.example.com".to_vec().into())
        ));
        assert!(m(
            KeyPart::ClientIp,
            MatchValue::Net("10.0.0.0/8".parse().unwrap())
        ));
        assert!(!m(
            KeyPart::ClientIp,
            MatchValue::Net("192.168.0.0/16".parse().unwrap())
        ));
        assert!(m(
            KeyPart::ClientIp,
            MatchValue::Exact(b"10.1.2.3".to_vec().into())
        ));
        assert!(!m(
            KeyPart::Method,
            MatchValue::Exact(b"GET".to_vec().into())
        ));
    }
}
