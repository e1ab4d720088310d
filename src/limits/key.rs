//! Limit keys: which parts of a request identify "the same client", and how they are
//! hashed into a `u64` without building strings.
//!
//! A [`KeySpec`] is a list of [`KeyPart`]s. The proxy exposes a request through the
//! [`Facts`] trait; [`KeySpec::hash`] feeds each part's bytes into one hasher, tagged with
//! the part's variant and length so that `("ab", "c")` and `("a", "bc")` differ. The hash
//! is 64 bits, so two distinct keys collide with odds `n² / 2^65` for `n` live keys: about
//! 3e-8 for a million keys, far below the count-min sketches' own collision rate.
//!
//! The hash is ahash with fixed seeds: fast and well mixed, stable within one build on one
//! machine, but *not* promised across CPUs or ahash versions. It is for in-process state
//! only; state shared through Redis keys on a portable hash (see `docs/architecture.md`).

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Fixed seeds, so that a key hashes the same within a process and between runs of one
/// build on one machine. ahash promises no more than that: its output may differ between
/// ahash versions and between CPUs (it uses AES instructions where they exist). That is
/// all in-process limiters need. State shared between processes (the Redis store) must use
/// a hash with a documented, portable definition instead (see `docs/architecture.md`).
const SEEDS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

/// One part of a limit key, as written in the config (`client_ip`, `header:x-api-key`, ...).
///
/// The part names are this enum's variant names in snake case (one table: parsing,
/// display, suggestions and the hash tag all derive from it), so a new plain part is one
/// line here plus its value in each [`Facts`] implementation.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, strum::EnumString, strum::IntoStaticStr, strum::VariantNames,
)]
#[strum(serialize_all = "snake_case")]
pub enum KeyPart {
    /// The client's IP: the peer, or the right-most untrusted `X-Forwarded-For` hop when the
    /// peer is a trusted proxy.
    ClientIp,
    /// The customer: `server.customer_header` when present, else the origin's `customer`.
    Customer,
    /// The request's host, lower-cased, port stripped.
    Host,
    /// The IP of the selected upstream server (limits decided after the upstream is picked).
    ServerIp,
    /// The IP and port of the selected upstream server (as `server_ip`).
    ServerAddr,
    /// The origin's name from the config.
    Origin,
    /// The request method.
    Method,
    /// The request path, without the query.
    Path,
    /// A request header's value (`header:NAME`); the name is stored lower-case.
    #[strum(disabled)]
    Header(String),
    /// A fixed text (`const:TEXT`): every request shares it, which makes a limit global to
    /// the origin.
    #[strum(disabled)]
    Const(String),
}

/// Why a key part did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyPartError {
    /// Not one of the known part names.
    #[error("unknown key part `{0}`; expected one of {names}", names = KeyPart::names().join(", "))]
    Unknown(String),
    /// `header:` with an empty or invalid header name.
    #[error("`{0}` needs a valid header name after `header:`")]
    BadHeader(String),
}

/// Whether `name` is a valid HTTP header name (an RFC 9110 token).
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl KeyPart {
    /// The plain part names (those written without an argument), for suggestions.
    pub fn plain_names() -> &'static [&'static str] {
        <KeyPart as strum::VariantNames>::VARIANTS
    }

    /// Every part as written in a config, `header:NAME` and `const:TEXT` included, for
    /// messages.
    pub fn names() -> Vec<&'static str> {
        let mut names = Self::plain_names().to_vec();
        names.extend(["header:NAME", "const:TEXT"]);
        names
    }

    /// Parses a part as written in the config.
    pub fn parse(text: &str) -> Result<KeyPart, KeyPartError> {
        if let Some(name) = text.strip_prefix("header:") {
            if !is_header_name(name) {
                return Err(KeyPartError::BadHeader(text.to_string()));
            }
            return Ok(KeyPart::Header(name.to_ascii_lowercase()));
        }
        if let Some(value) = text.strip_prefix("const:") {
            return Ok(KeyPart::Const(value.to_string()));
        }
        text.parse()
            .map_err(|_| KeyPartError::Unknown(text.to_string()))
    }

    /// Whether the part is only known once an upstream server is selected, which limits it
    /// to the kinds decided in `upstream_peer` (inflight, concurrency).
    pub fn needs_server(&self) -> bool {
        matches!(self, KeyPart::ServerIp | KeyPart::ServerAddr)
    }

    /// The part's name without its argument (`header` for `header:x-api-key`).
    pub fn name(&self) -> &'static str {
        match self {
            KeyPart::Header(_) => "header",
            KeyPart::Const(_) => "const",
            plain => plain.into(),
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Const(text) => write!(f, "const:{text}"),
            plain => f.write_str(plain.name()),
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

    /// Whether the request carries `part` more than once (a repeated header). Values
    /// whose count matters, such as a token cost, are refused when repeated rather than
    /// guessing which one counts.
    fn repeated(&self, _part: &KeyPart) -> bool {
        false
    }
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
            // The variant, so that equal bytes from different parts differ.
            std::mem::discriminant(part).hash(&mut hasher);
            write_fact(&mut hasher, facts.fact(part)?);
        }
        Some(hasher.finish())
    }
}

/// Bytes a key's text keeps of one part's value: a header value may be long, and the text
/// is only for reading.
const MAX_TEXT_VALUE: usize = 256;

impl KeySpec {
    /// The request's key as readable text, `part=value&part=value` with each value
    /// percent-encoded (so it can be pasted into the admin API's `/state` query as is), or
    /// `None` when a part is missing. Each value is cut at 256 bytes. Allocates: for the
    /// heavy-hitter lists, which build it only when a key enters one.
    pub fn text<F: Facts + ?Sized>(&self, facts: &F) -> Option<String> {
        let mut out = String::new();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('&');
            }
            let value = match facts.fact(part)? {
                Fact::Bytes(b) => {
                    String::from_utf8_lossy(&b[..b.len().min(MAX_TEXT_VALUE)]).into_owned()
                }
                Fact::Ip(ip) => ip.to_canonical().to_string(),
                Fact::Addr(a) => a.to_string(),
            };
            percent_encode(&mut out, &part.to_string());
            out.push('=');
            percent_encode(&mut out, &value);
        }
        Some(out)
    }
}

/// Appends `text` with every byte but RFC 3986's unreserved ones (and `:`, common in key
/// part names and addresses) percent-encoded.
fn percent_encode(out: &mut String, text: &str) {
    use std::fmt::Write;
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
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

/// The value an override's `match:` compares a key part with, parsed once at load so that
/// matching a request compares values and never parses text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MatchValue {
    /// Exact bytes (customer, host, header, method, path, ...).
    Exact(Box<[u8]>),
    /// The part's value starts with these bytes: a path and everything below it
    /// (`path: /api/*`). Only for `path`, whose value is in normal form
    /// (`crate::limits::path`), so no other spelling of a path escapes it.
    Prefix(Box<[u8]>),
    /// An IP network, for `client_ip` / `server_ip`: `10.0.0.0/8` or a single address.
    Net(IpNet),
    /// An address with port, for `server_addr`.
    Addr(SocketAddr),
    /// Membership of the part's value (an integer ID) in the named segment. The segment's
    /// IDs are loaded by the runtime, which evaluates this condition; [`Matcher::matches`]
    /// alone never holds for it.
    Segment(String),
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
    /// matches, nor does a value of another type. Host comparison is case-insensitive
    /// because hosts are.
    pub fn matches<F: Facts + ?Sized>(&self, facts: &F) -> bool {
        let Some(fact) = facts.fact(&self.part) else {
            return false;
        };
        match (&self.value, fact) {
            (MatchValue::Net(net), Fact::Ip(ip)) => net.contains(&ip.to_canonical()),
            (MatchValue::Net(net), Fact::Addr(addr)) => net.contains(&addr.ip().to_canonical()),
            (MatchValue::Addr(want), Fact::Addr(addr)) => {
                want.port() == addr.port() && want.ip().to_canonical() == addr.ip().to_canonical()
            }
            (MatchValue::Prefix(want), Fact::Bytes(got)) => got.starts_with(want),
            (MatchValue::Exact(want), Fact::Bytes(got)) => {
                if self.part == KeyPart::Host {
                    want.eq_ignore_ascii_case(got)
                } else {
                    **want == *got
                }
            }
            _ => false,
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
    fn server_addr_matches_a_parsed_address() {
        struct Server(SocketAddr);
        impl Facts for Server {
            fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
                (*part == KeyPart::ServerAddr).then_some(Fact::Addr(self.0))
            }
        }
        let m = Matcher {
            part: KeyPart::ServerAddr,
            value: MatchValue::Addr("10.0.0.5:80".parse().unwrap()),
        };
        assert!(m.matches(&Server("10.0.0.5:80".parse().unwrap())));
        assert!(m.matches(&Server("[::ffff:10.0.0.5]:80".parse().unwrap())));
        assert!(!m.matches(&Server("10.0.0.5:81".parse().unwrap())));
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
        assert!(
            !m(
                KeyPart::ClientIp,
                MatchValue::Exact(b"10.1.2.3".to_vec().into())
            ),
            "an address is matched as a network, parsed at load, never as text"
        );
        assert!(!m(
            KeyPart::Method,
            MatchValue::Exact(b"GET".to_vec().into())
        ));
    }
}
