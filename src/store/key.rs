//! Names of limit state in a shared store: a stable hash of the key parts, and readable
//! Redis key names that keep every key of one limit key in one Redis Cluster slot.
//!
//! **Why another hash.** [`KeySpec::hash`] uses `ahash`, whose output depends on the CPU
//! (AES instructions or not) and on the crate's version: fine inside one process, wrong
//! for state that several processes, machines and builds must find under the same name.
//! [`stable_key_hash`] is XXH3-64 (a published, frozen algorithm whose output is the same
//! on every CPU: SIMD only changes its speed) with the seed [`STABLE_SEED`], over the
//! canonical bytes below. Test vectors pin it; changing any of it renames every key in
//! Redis, which loses the shared state once (it starts full / empty again).
//!
//! **Canonical bytes (version 1).** For each part of the key, in the spec's order:
//!
//! | what | bytes |
//! |---|---|
//! | part tag | 1 byte: `client_ip` 1, `customer` 2, `host` 3, `server_ip` 4, `server_addr` 5, `origin` 6, `method` 7, `path` 8, `header:NAME` 9, `const:TEXT` 10 |
//! | header name (`header:` only) | length as u32 little-endian, then the lower-case name |
//! | the request's value, bytes | `B` (0x42), length as u64 little-endian, the bytes as received |
//! | the request's value, IPv4 (or IPv4-mapped IPv6) | `4` (0x34), the 4 octets |
//! | the request's value, IPv6 | `6` (0x36), the 16 octets |
//! | the request's value, address | `A` (0x41), the IP as above, the port as u16 little-endian |
//!
//! Every variable-length field is length-prefixed, so the encoding is prefix-free: two
//! different requests never produce the same bytes, whatever bytes a client sends
//! (quotes, braces, newlines, NULs). Hostile bytes only ever reach Redis through this
//! hash, never in a key name.
//!
//! **Key names.** `PREFIX ORIGIN ":" LIMIT ":" VARIANT ":{" HASH "}:" KIND`, for example
//! `tollgate:shop:api_tokens:b:{9f86d081884c7d65}:tb`, where VARIANT is `b` for the limit's
//! base parameters or `oN` for its override number N (0-based, config order), HASH the
//! 16 lower-case hex digits of the stable hash and KIND the state's type (`tb` token
//! bucket, `rate`, `ic`/`il` inflight counts and leases, `sl` sliding log, `ts`/`t1`..
//! `t16`/`th` tier state, tier logs and hard log, `cc`/`cl` concurrency counts and
//! leases). The braces are a Redis Cluster hash tag: the slot depends only on the hash, so
//! the keys of one limit key share a slot and one script can touch them all. `{`, `}` and
//! `%` in the prefix, origin, limit or group names are written `%7B`, `%7D` and `%25`, so a
//! name can never open a hash tag of its own.
//!
//! **Names across keys.** State a limit variant keeps for all its keys (a concurrency
//! limit's global and group counts, a tiered global count) is named
//! `PREFIX ORIGIN ":" LIMIT ":" VARIANT ":{l" HASH "}:" KIND`, HASH being the stable hash of
//! the fixed part before it ([`KeyNames::limit_key`]): one Cluster slot per variant, never
//! a key's (see `docs/architecture.md` for what that means for the scripts).

use std::fmt::Write as _;
use std::net::IpAddr;

use xxhash_rust::xxh3::Xxh3;

use crate::limits::key::{Fact, Facts, KeyPart, KeySpec};

/// The seed of [`stable_key_hash`]: "tollgate" in ASCII, read big-endian. Fixed forever.
pub const STABLE_SEED: u64 = 0x746f_6c6c_6761_7465;

/// Hashes the request's key for `spec` with the stable, documented hash (module doc), or
/// `None` when the request lacks a part (the limit then does not apply).
///
/// No allocation: the XXH3 streaming state lives on the stack.
pub fn stable_key_hash<F: Facts + ?Sized>(spec: &KeySpec, facts: &F) -> Option<u64> {
    let mut hasher = Xxh3::with_seed(STABLE_SEED);
    for part in spec.parts() {
        hasher.update(&[part_tag(part)]);
        if let KeyPart::Header(name) = part {
            hasher.update(&(name.len() as u32).to_le_bytes());
            hasher.update(name.as_bytes());
        }
        match facts.fact(part)? {
            Fact::Bytes(bytes) => {
                hasher.update(b"B");
                hasher.update(&(bytes.len() as u64).to_le_bytes());
                hasher.update(bytes);
            }
            Fact::Ip(ip) => write_ip(&mut hasher, ip),
            Fact::Addr(addr) => {
                hasher.update(b"A");
                write_ip(&mut hasher, addr.ip());
                hasher.update(&addr.port().to_le_bytes());
            }
        }
    }
    Some(hasher.digest())
}

/// The documented tag of a part (module doc). Not [`KeyPart`]'s own private tag: this one
/// is interface, frozen with the hash.
fn part_tag(part: &KeyPart) -> u8 {
    match part {
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

fn write_ip(hasher: &mut Xxh3, ip: IpAddr) {
    // An IPv4-mapped IPv6 address is the same client as its IPv4 form.
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            hasher.update(b"4");
            hasher.update(&v4.octets());
        }
        IpAddr::V6(v6) => {
            hasher.update(b"6");
            hasher.update(&v6.octets());
        }
    }
}

/// Which parameters of a limit a key's state belongs to: an override that matches gets its
/// own state, never shared with the traffic that did not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The limit's own parameters.
    Base,
    /// Override number N of the limit (0-based, config order).
    Override(usize),
}

/// The kind of state a key holds, the last segment of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// A token bucket: hash `{t: tokens, l: last refill µs}`.
    TokenBucket,
    /// A sliding-window rate: hash `{p: period, c: current count, q: previous count}`.
    Rate,
    /// Inflight counts per instance: hash `{instance: count}`.
    InflightCounts,
    /// Inflight leases per instance: sorted set `{instance: lease end µs}`.
    InflightLeases,
    /// A sliding log: sorted set `{entry: instant µs}`.
    SlidingLog,
    /// A tiered key's tier state: hash `{e<i>: instant tier i was entered, µs}`.
    TieredState,
    /// Tier `i`'s access log (1-based): sorted set `{hit: instant µs}`.
    TierLog(u8),
    /// A tiered key's hard-limit log: sorted set `{hit: instant µs}`.
    TieredHard,
    /// A key's concurrency copies per holder: hash `{holder: copies}`.
    ConcurrencyCounts,
    /// A key's concurrency leases per holder: sorted set `{holder: lease end µs}`.
    ConcurrencyLeases,
}

impl StateKind {
    /// The name suffix.
    pub fn suffix(&self) -> &'static str {
        match self {
            StateKind::TokenBucket => "tb",
            StateKind::Rate => "rate",
            StateKind::InflightCounts => "ic",
            StateKind::InflightLeases => "il",
            StateKind::SlidingLog => "sl",
            StateKind::TieredState => "ts",
            StateKind::TierLog(i) => TIER_LOGS.get(usize::from(*i)).copied().unwrap_or("t"),
            StateKind::TieredHard => "th",
            StateKind::ConcurrencyCounts => "cc",
            StateKind::ConcurrencyLeases => "cl",
        }
    }
}

/// The suffixes of tier logs `t1` .. `t16`, as static strings (index = tier).
const TIER_LOGS: [&str; 17] = [
    "t", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10", "t11", "t12", "t13", "t14",
    "t15", "t16",
];

/// State one limit variant keeps across all its keys (a global limit, a group's count):
/// named under the variant's own hash tag (see [`KeyNames::limit_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitState<'a> {
    /// A tiered limit's global count: hash `{s: aligned second, c: count}`.
    TieredGlobal,
    /// A concurrency limit's global copies per holder: hash `{holder: copies}`.
    ConcurrencyGlobal,
    /// Their leases: sorted set `{holder: lease end µs}`.
    ConcurrencyGlobalLeases,
    /// A concurrency group's copies per holder, by group name.
    GroupCounts(&'a str),
    /// Their leases.
    GroupLeases(&'a str),
}

/// The fixed part of the key names of one limit variant: `PREFIX ORIGIN:LIMIT:VARIANT:`,
/// escaped once at construction, so a decision only appends the hash and kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyNames {
    base: Box<str>,
}

impl KeyNames {
    /// The names of `origin`'s `limit`, `variant`, under `prefix` (default `tollgate:`).
    pub fn new(prefix: &str, origin: &str, limit: &str, variant: Variant) -> Self {
        let mut base = String::with_capacity(prefix.len() + origin.len() + limit.len() + 8);
        escape_into(&mut base, prefix);
        escape_into(&mut base, origin);
        base.push(':');
        escape_into(&mut base, limit);
        base.push(':');
        match variant {
            Variant::Base => base.push('b'),
            Variant::Override(n) => {
                let _ = write!(base, "o{n}");
            }
        }
        base.push(':');
        Self { base: base.into() }
    }

    /// Names outside the origin/limit scheme (the limiter API's ad-hoc buckets, tests):
    /// `PREFIX SCOPE:`, escaped like the others.
    pub fn scoped(prefix: &str, scope: &str) -> Self {
        let mut base = String::with_capacity(prefix.len() + scope.len() + 1);
        escape_into(&mut base, prefix);
        escape_into(&mut base, scope);
        base.push(':');
        Self { base: base.into() }
    }

    /// The full name of `kind` state for the key hashed to `hash`.
    pub fn key(&self, hash: u64, kind: StateKind) -> String {
        let mut name = String::with_capacity(self.base.len() + 24);
        name.push_str(&self.base);
        let _ = write!(name, "{{{hash:016x}}}:{}", kind.suffix());
        name
    }

    /// The name of state the variant keeps across all its keys:
    /// `BASE "{l" HASH "}:" KIND`, HASH being the stable hash of BASE's bytes (the stable
    /// seed, XXH3-64, 16 hex digits). Every such name of one variant shares that hash tag,
    /// hence one Cluster slot; a per-key name never does (its tag is the key's hash).
    /// Group names are escaped like origin names.
    pub fn limit_key(&self, state: LimitState<'_>) -> String {
        let tag = xxhash_rust::xxh3::xxh3_64_with_seed(self.base.as_bytes(), STABLE_SEED);
        let mut name = String::with_capacity(self.base.len() + 40);
        name.push_str(&self.base);
        let _ = write!(name, "{{l{tag:016x}}}:");
        match state {
            LimitState::TieredGlobal => name.push_str("tg"),
            LimitState::ConcurrencyGlobal => name.push_str("cg"),
            LimitState::ConcurrencyGlobalLeases => name.push_str("cgl"),
            LimitState::GroupCounts(group) => {
                name.push_str("cp:");
                escape_into(&mut name, group);
            }
            LimitState::GroupLeases(group) => {
                name.push_str("cpl:");
                escape_into(&mut name, group);
            }
        }
        name
    }

    /// The fixed part, for logs and tests.
    pub fn base(&self) -> &str {
        &self.base
    }
}

/// The Redis type a state key holds, as `TYPE` names it: what a repair checks a key
/// against (see `crate::store::redis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisType {
    /// `hash`: token buckets, rate windows, per-holder counts, tier entry times, the
    /// tiered global count. Every field's value is a number.
    Hash,
    /// `zset`: leases, sliding logs, tier and hard-limit logs.
    Zset,
}

impl RedisType {
    /// The name `TYPE` answers.
    pub fn name(self) -> &'static str {
        match self {
            RedisType::Hash => "hash",
            RedisType::Zset => "zset",
        }
    }

    /// The type of the state named `name` (a [`KeyNames::key`] or
    /// [`KeyNames::limit_key`]), read from its kind, the part after the hash tag; `None`
    /// for a name of neither form.
    pub fn of(name: &str) -> Option<RedisType> {
        // Names never hold a `}` of their own (escaped), so the last one ends the tag.
        let kind = &name[name.rfind("}:")? + 2..];
        Some(match kind {
            "tb" | "rate" | "ic" | "cc" | "ts" | "tg" | "cg" => RedisType::Hash,
            "il" | "cl" | "sl" | "th" | "cgl" => RedisType::Zset,
            k if k.starts_with("cp:") => RedisType::Hash,
            k if k.starts_with("cpl:") => RedisType::Zset,
            k if k.strip_prefix('t').is_some_and(|i| {
                i.parse::<usize>()
                    .is_ok_and(|i| (1..TIER_LOGS.len()).contains(&i))
            }) =>
            {
                RedisType::Zset
            }
            _ => return None,
        })
    }
}

/// Appends `text` with `%`, `{` and `}` percent-encoded.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// The Redis Cluster slot of a key name (CRC16/XMODEM of its hash tag, mod 16384), for
/// tests and for checking that a limit key's names share one slot.
pub fn cluster_slot(name: &[u8]) -> u16 {
    let tagged = name
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(name);
    crc16_xmodem(tagged) % 16384
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// Facts from a list: every part maps to a fixed fact.
    struct List(Vec<(KeyPart, Owned)>);

    enum Owned {
        Bytes(Vec<u8>),
        Ip(IpAddr),
        Addr(SocketAddr),
    }

    impl Facts for List {
        fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
            let (_, v) = self.0.iter().find(|(p, _)| p == part)?;
            Some(match v {
                Owned::Bytes(b) => Fact::Bytes(b),
                Owned::Ip(ip) => Fact::Ip(*ip),
                Owned::Addr(a) => Fact::Addr(*a),
            })
        }
    }

    fn bytes(part: KeyPart, v: &[u8]) -> (KeyPart, Owned) {
        (part, Owned::Bytes(v.to_vec()))
    }

    /// The third vector's key: a header's value with bytes that need escaping elsewhere,
    /// then an IPv6 server address.
    fn header_and_address() -> (KeySpec, List) {
        let spec = KeySpec::new(vec![
            KeyPart::Header("x-api-key".into()),
            KeyPart::ServerAddr,
        ]);
        let fields = List(vec![
            bytes(KeyPart::Header("x-api-key".into()), b"k\0{}\n"),
            (
                KeyPart::ServerAddr,
                Owned::Addr("[2001:db8::1]:8080".parse().unwrap()),
            ),
        ]);
        (spec, fields)
    }

    /// Test vectors: the hash is interface (state in Redis is found by it), so these never
    /// change. They were cross-checked with an independent XXH3 implementation (Python's
    /// `xxhash` package) over the canonical bytes written out by hand in `canonical_bytes`.
    #[test]
    fn test_vectors_pin_the_stable_hash() {
        let customer = KeySpec::new(vec![KeyPart::Customer]);
        let f = List(vec![bytes(KeyPart::Customer, b"acme")]);
        assert_eq!(stable_key_hash(&customer, &f), Some(0x5589_901a_6036_e910));

        let ip = KeySpec::new(vec![KeyPart::ClientIp]);
        let v4 = List(vec![(
            KeyPart::ClientIp,
            Owned::Ip("10.1.2.3".parse().unwrap()),
        )]);
        assert_eq!(stable_key_hash(&ip, &v4), Some(0x5c26_acd1_f3e1_aa6d));

        let (header, f) = header_and_address();
        assert_eq!(stable_key_hash(&header, &f), Some(0x209f_2174_513f_c46a));

        // The empty key (no parts): XXH3-64 of no bytes with the seed.
        assert_eq!(
            stable_key_hash(&KeySpec::new(vec![]), &List(vec![])),
            Some(0x5502_398c_d68b_329b)
        );
    }

    /// The canonical bytes of the vectors above, written out literally: the documentation of
    /// the encoding, checked against the streaming implementation.
    #[test]
    fn canonical_bytes() {
        let h = |b: &[u8]| xxhash_rust::xxh3::xxh3_64_with_seed(b, STABLE_SEED);
        let customer = KeySpec::new(vec![KeyPart::Customer]);
        let f = List(vec![bytes(KeyPart::Customer, b"acme")]);
        let mut want = vec![2u8, b'B'];
        want.extend_from_slice(&4u64.to_le_bytes());
        want.extend_from_slice(b"acme");
        assert_eq!(stable_key_hash(&customer, &f), Some(h(&want)));

        let ip = KeySpec::new(vec![KeyPart::ClientIp]);
        let mapped = List(vec![(
            KeyPart::ClientIp,
            Owned::Ip("::ffff:10.1.2.3".parse().unwrap()),
        )]);
        assert_eq!(
            stable_key_hash(&ip, &mapped),
            Some(h(&[1, b'4', 10, 1, 2, 3]))
        );

        let (spec, f) = header_and_address();
        let mut want = vec![9u8];
        want.extend_from_slice(&9u32.to_le_bytes());
        want.extend_from_slice(b"x-api-key");
        want.push(b'B');
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(b"k\0{}\n");
        want.extend_from_slice(&[5, b'A', b'6']);
        want.extend_from_slice(
            &"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        want.extend_from_slice(&8080u16.to_le_bytes());
        assert_eq!(stable_key_hash(&spec, &f), Some(h(&want)));
    }

    #[test]
    fn boundaries_parts_and_missing_parts() {
        let spec = KeySpec::new(vec![KeyPart::Customer, KeyPart::Host]);
        let a = List(vec![
            bytes(KeyPart::Customer, b"ab"),
            bytes(KeyPart::Host, b"c"),
        ]);
        let b = List(vec![
            bytes(KeyPart::Customer, b"a"),
            bytes(KeyPart::Host, b"bc"),
        ]);
        assert_ne!(stable_key_hash(&spec, &a), stable_key_hash(&spec, &b));
        let swapped = KeySpec::new(vec![KeyPart::Host, KeyPart::Customer]);
        let c = List(vec![
            bytes(KeyPart::Customer, b"c"),
            bytes(KeyPart::Host, b"ab"),
        ]);
        assert_ne!(stable_key_hash(&spec, &a), stable_key_hash(&swapped, &c));
        // Two headers with the same value differ by name.
        let h1 = KeySpec::new(vec![KeyPart::Header("a".into())]);
        let h2 = KeySpec::new(vec![KeyPart::Header("b".into())]);
        let f = List(vec![
            bytes(KeyPart::Header("a".into()), b"v"),
            bytes(KeyPart::Header("b".into()), b"v"),
        ]);
        assert_ne!(stable_key_hash(&h1, &f), stable_key_hash(&h2, &f));
        let missing = KeySpec::new(vec![KeyPart::Customer, KeyPart::Path]);
        assert_eq!(stable_key_hash(&missing, &a), None);
    }

    #[test]
    fn names_are_readable_escaped_and_share_one_slot() {
        let names = KeyNames::new("tollgate:", "shop", "api_tokens", Variant::Base);
        assert_eq!(
            names.key(0x9f86_d081_884c_7d65, StateKind::TokenBucket),
            "tollgate:shop:api_tokens:b:{9f86d081884c7d65}:tb"
        );
        let o = KeyNames::new("tg:", "shop", "conc", Variant::Override(2));
        let counts = o.key(7, StateKind::InflightCounts);
        let leases = o.key(7, StateKind::InflightLeases);
        assert_eq!(counts, "tg:shop:conc:o2:{0000000000000007}:ic");
        assert_eq!(
            cluster_slot(counts.as_bytes()),
            cluster_slot(leases.as_bytes())
        );
        assert_eq!(
            cluster_slot(counts.as_bytes()),
            cluster_slot(b"0000000000000007")
        );
        // Hostile names cannot open a hash tag of their own.
        let evil = KeyNames::new("p{x}:", "o}{", "l%", Variant::Base);
        let name = evil.key(1, StateKind::Rate);
        assert_eq!(name, "p%7Bx%7D:o%7D%7B:l%25:b:{0000000000000001}:rate");
        assert_eq!(
            cluster_slot(name.as_bytes()),
            cluster_slot(b"0000000000000001")
        );
        assert_eq!(
            KeyNames::scoped("tollgate:", "rl").key(1, StateKind::TokenBucket),
            "tollgate:rl:{0000000000000001}:tb"
        );
    }

    #[test]
    fn names_across_keys_share_one_slot_per_variant() {
        let names = KeyNames::new("tg:", "shop", "up", Variant::Base);
        let tag = xxhash_rust::xxh3::xxh3_64_with_seed(b"tg:shop:up:b:", STABLE_SEED);
        assert_eq!(
            names.limit_key(LimitState::ConcurrencyGlobal),
            format!("tg:shop:up:b:{{l{tag:016x}}}:cg")
        );
        let all = [
            names.limit_key(LimitState::TieredGlobal),
            names.limit_key(LimitState::ConcurrencyGlobalLeases),
            names.limit_key(LimitState::GroupCounts("big")),
            names.limit_key(LimitState::GroupLeases("big")),
        ];
        assert!(all[2].ends_with(":cp:big") && all[3].ends_with(":cpl:big"));
        let slot = cluster_slot(all[0].as_bytes());
        assert!(all.iter().all(|n| cluster_slot(n.as_bytes()) == slot));
        // Another variant of the same limit has its own slot (almost surely).
        let other = KeyNames::new("tg:", "shop", "up", Variant::Override(0));
        assert_ne!(other.limit_key(LimitState::TieredGlobal), all[0]);
        // Hostile group names stay out of the tag.
        let evil = names.limit_key(LimitState::GroupCounts("}{x"));
        assert!(evil.ends_with(":cp:%7D%7Bx"), "{evil}");
        assert_eq!(cluster_slot(evil.as_bytes()), slot);
        assert_eq!(StateKind::TierLog(16).suffix(), "t16");
        assert_eq!(
            names.key(1, StateKind::TierLog(3)),
            "tg:shop:up:b:{0000000000000001}:t3"
        );
    }

    #[test]
    fn cluster_slot_matches_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(cluster_slot(b"123456789"), 12739);
        assert_eq!(cluster_slot(b"somekey"), 11058);
        assert_eq!(cluster_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        // An empty tag does not count: the whole name is hashed.
        assert_eq!(
            cluster_slot(b"foo{}{bar}"),
            crc16_xmodem(b"foo{}{bar}") % 16384
        );
    }

    #[test]
    fn every_state_name_reads_back_as_its_redis_type() {
        use RedisType::{Hash, Zset};
        let names = KeyNames::new("tollgate:", "shop", "api", Variant::Override(2));
        let mut kinds = vec![
            (StateKind::TokenBucket, Hash),
            (StateKind::Rate, Hash),
            (StateKind::InflightCounts, Hash),
            (StateKind::InflightLeases, Zset),
            (StateKind::SlidingLog, Zset),
            (StateKind::TieredState, Hash),
            (StateKind::TieredHard, Zset),
            (StateKind::ConcurrencyCounts, Hash),
            (StateKind::ConcurrencyLeases, Zset),
        ];
        kinds.extend((1..=16).map(|i| (StateKind::TierLog(i), Zset)));
        for (kind, want) in kinds {
            let name = names.key(7, kind);
            assert_eq!(RedisType::of(&name), Some(want), "{name}");
        }
        for (state, want) in [
            (LimitState::TieredGlobal, Hash),
            (LimitState::ConcurrencyGlobal, Hash),
            (LimitState::ConcurrencyGlobalLeases, Zset),
            (LimitState::GroupCounts("a:b}{"), Hash),
            (LimitState::GroupLeases("cpl:x"), Zset),
        ] {
            let name = names.limit_key(state);
            assert_eq!(RedisType::of(&name), Some(want), "{name}");
        }
        let scoped = KeyNames::scoped("p{x}:", "rl").key(1, StateKind::TokenBucket);
        assert_eq!(RedisType::of(&scoped), Some(Hash), "{scoped}");
        for odd in ["", "plain", "x:{1}:", "x:{1}:t0", "x:{1}:t17", "x:{1}:zz"] {
            assert_eq!(RedisType::of(odd), None, "{odd}");
        }
        assert_eq!((Hash.name(), Zset.name()), ("hash", "zset"));
    }
}
