//! Broken configs: each must be refused with the exact first diagnostic, located.

use crate::config::{parse_str, ConfigError, Upstream};

/// A minimal valid origin; lines 1-4. Cases append limits at line 5.
macro_rules! base {
    () => {
        "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n"
    };
}

/// A base origin with one limit `l` whose body starts on line 7.
macro_rules! limit {
    ($body:expr) => {
        concat!(base!(), "    limits:\n      l:\n", $body)
    };
}

/// Every diagnostic for `text`, rendered; empty when it parsed.
pub(crate) fn errors(text: &str) -> Vec<String> {
    match parse_str(text, "t.yaml") {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(list)) => list.iter().map(|d| d.to_string()).collect(),
        Err(e) => vec![e.to_string()],
    }
}

const CASES: &[(&str, &str, &str)] = &[
    ("unclosed flow list", "origins:\n  a: [1, 2\n", "t.yaml:3:1: (syntax): YAML syntax error: while parsing a flow sequence, expected ',' or ']'"),
    ("tab indentation", "origins:\n\ta: 1\n", "t.yaml:2:2: (syntax): YAML syntax error: tabs disallowed within this context (block indentation)"),
    ("root is a list", "- a\n- b\n", "t.yaml:1:1: (root): the config must be a mapping with `server`, `defaults` and `origins`, found a list"),
    ("empty file", "", "t.yaml:1:1: (root): the file is empty; a config needs at least `origins`"),
    ("only comments", "# nothing\n", "t.yaml:1:1: (root): the file is empty; a config needs at least `origins`"),
    ("duplicate key", concat!(base!(), "    hosts: [b.test]\n"), "t.yaml:5:5: origins.a.hosts: duplicate key `hosts` (first defined at line 3)"),
    ("duplicate top key", concat!(base!(), "origins: {}\n"), "t.yaml:5:1: origins: duplicate key `origins` (first defined at line 1)"),
    ("alias", "server: &s {threads: 2}\norigins: *s\n", "t.yaml:2:10: origins: YAML aliases (`*name`) are not supported; write the value out"),
    ("custom tag", concat!(base!(), "    tls: !yes true\n"), "t.yaml:5:15: origins.a.tls: YAML tag `!yes` is not supported"),
    ("two documents", concat!(base!(), "---\n", base!()), "t.yaml:5:1: (syntax): only one YAML document is allowed"),
    ("unknown top key, close", "origin:\n  a: {}\n", "t.yaml:1:1: origin: unknown key `origin`; did you mean `origins`?"),
    ("unknown top key, far", concat!(base!(), "zzz: 1\n"), "t.yaml:5:1: zzz: unknown key `zzz`; expected one of server, tls, api, stores, segments, defaults, origins, resources, rls"),
    ("missing origins", "server:\n  threads: 2\n", "t.yaml:1:1: origins: missing required field `origins`"),
    ("empty origins", "origins: {}\n", "t.yaml:1:10: origins: at least one origin is needed"),
    ("origins is a list", "origins:\n  - a\n", "t.yaml:2:3: origins: expected a mapping, found a list"),
    ("server unknown key", concat!("server:\n  thread: 4\n", base!()), "t.yaml:2:3: server.thread: unknown key `thread`; did you mean `threads`?"),
    ("threads zero", concat!("server:\n  threads: 0\n", base!()), "t.yaml:2:12: server.threads: must be between 1 and 1024, found 0"),
    ("threads string", concat!("server:\n  threads: \"2\"\n", base!()), "t.yaml:2:12: server.threads: expected an integer, found a string"),
    ("grace bare number", concat!("server:\n  grace_period: 5\n", base!()), "t.yaml:2:17: server.grace_period: durations need a unit, e.g. `1s`"),
    ("grace too long", concat!("server:\n  grace_period: 2h\n", base!()), "t.yaml:2:17: server.grace_period: duration `2h` is out of range: must be between 0s and 1h"),
    ("grace garbage", concat!("server:\n  grace_period: 5x\n", base!()), "t.yaml:2:17: server.grace_period: `5x` is not a duration; write e.g. `250ms`, `1s`, `5m`, `1h` or `1d`"),
    ("listen empty", concat!("server:\n  listen: []\n", base!()), "t.yaml:2:11: server.listen: `listen` needs at least one address"),
    ("listen no ip", concat!("server:\n  listen: [\"8080\"]\n", base!()), "t.yaml:2:12: server.listen[0]: `8080` is not an address of the form ip:port, e.g. `127.0.0.1:8080`"),
    ("listen twice", concat!("server:\n  listen: [\"127.0.0.1:80\", \"127.0.0.1:80\"]\n", base!()), "t.yaml:2:28: server.listen[1]: `127.0.0.1:80` collides with `server.listen[0]` (`127.0.0.1:80`); each listener needs its own address"),
    ("metrics on wildcard listen", concat!("server:\n  listen: [\"0.0.0.0:9100\"]\n  metrics: 127.0.0.1:9100\n", base!()), "t.yaml:3:12: server.metrics: `127.0.0.1:9100` collides with `server.listen[0]` (`0.0.0.0:9100`); each listener needs its own address"),
    ("demo on metrics", concat!("server:\n  metrics: 127.0.0.1:9100\n  demo_upstream: 127.0.0.1:9100\n", base!()), "t.yaml:3:18: server.demo_upstream: `127.0.0.1:9100` collides with `server.metrics` (`127.0.0.1:9100`); each listener needs its own address"),
    ("v6 wildcard listen after metrics", concat!("server:\n  metrics: \"[::1]:8080\"\n  listen: [\"[::]:8080\"]\n", base!()), "t.yaml:3:12: server.listen[0]: `[::]:8080` collides with `server.metrics` (`[::1]:8080`); each listener needs its own address"),
    ("metrics on default listen", concat!("server:\n  metrics: 127.0.0.1:8080\n", base!()), "t.yaml:2:12: server.metrics: `127.0.0.1:8080` collides with `server.listen` (`0.0.0.0:8080`); each listener needs its own address"),
    ("admin on listen", concat!("server:\n  listen: [\"127.0.0.1:8080\"]\n  admin: 127.0.0.1:8080\n", base!()), "t.yaml:3:10: server.admin: `127.0.0.1:8080` collides with `server.listen[0]` (`127.0.0.1:8080`); each listener needs its own address"),
    ("admin on default listen", concat!("server:\n  admin: 127.0.0.1:8080\n", base!()), "t.yaml:2:10: server.admin: `127.0.0.1:8080` collides with `server.listen` (`0.0.0.0:8080`); each listener needs its own address"),
    ("admin on metrics", concat!("server:\n  metrics: 127.0.0.1:9100\n  admin: 127.0.0.1:9100\n", base!()), "t.yaml:3:10: server.admin: `127.0.0.1:9100` collides with `server.metrics` (`127.0.0.1:9100`); each listener needs its own address"),
    ("metrics on admin", concat!("server:\n  admin: 127.0.0.1:9180\n  metrics: 127.0.0.1:9180\n", base!()), "t.yaml:3:12: server.metrics: `127.0.0.1:9180` collides with `server.admin` (`127.0.0.1:9180`); each listener needs its own address"),
    ("trusted proxy", concat!("server:\n  trusted_proxies: [10.0.0.0/33]\n", base!()), "t.yaml:2:21: server.trusted_proxies[0]: `10.0.0.0/33` is not an IP address or network, e.g. `10.0.0.0/8`"),
    ("customer header", concat!("server:\n  customer_header: x customer\n", base!()), "t.yaml:2:20: server.customer_header: `x customer` is not a valid HTTP header name"),
    ("origin name", "origins:\n  shop.eu:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:2:3: origins.shop.eu: origin name `shop.eu` may only contain letters, digits, `_` and `-` (it is a metrics label)"),
    ("origin missing hosts", "origins:\n  a:\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:2:3: origins.a: missing required field `hosts`"),
    ("hosts empty", "origins:\n  a:\n    hosts: []\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:12: origins.a.hosts: `hosts` needs at least one host name"),
    ("hosts not a list", "origins:\n  a:\n    hosts: a.test\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:12: origins.a.hosts: expected a list, found a string"),
    ("host with port", "origins:\n  a:\n    hosts: [a.test, \"b.test:8080\"]\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:21: origins.a.hosts[1]: host `b.test:8080` takes no port; hosts are matched by name only (write IPv6 literals as `[2001:db8::1]`)"),
    ("host with scheme", "origins:\n  a:\n    hosts: [\"https://a.test\"]\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:13: origins.a.hosts[0]: host `https://a.test` takes no scheme; write just the name, e.g. `shop.example.com`"),
    ("host bad chars", "origins:\n  a:\n    hosts: [\"a b.test\"]\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:13: origins.a.hosts[0]: `a b.test` is not a valid host name; expected e.g. `shop.example.com` or `*.shop.example.com`"),
    ("host in two origins", concat!(base!(), "  b:\n    hosts: [x.test, A.test]\n    upstreams: [\"127.0.0.1:2\"]\n"), "t.yaml:6:21: origins.b.hosts[1]: host `a.test` is already used by origin `a`"),
    ("host twice in origin", "origins:\n  a:\n    hosts: [a.test, A.TEST]\n    upstreams: [\"127.0.0.1:1\"]\n", "t.yaml:3:21: origins.a.hosts[1]: host `a.test` is listed twice in origin `a`"),
    ("upstream no port", "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [10.0.0.5]\n", "t.yaml:4:17: origins.a.upstreams[0]: upstream `10.0.0.5` needs a port, e.g. `10.0.0.5:80`"),
    ("upstream scheme", "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"http://10.0.0.5:80\"]\n", "t.yaml:4:17: origins.a.upstreams[0]: upstream `http://10.0.0.5:80` takes no scheme; write host:port, e.g. `10.0.0.5:80`"),
    ("upstreams empty", "origins:\n  a:\n    hosts: [a.test]\n    upstreams: []\n", "t.yaml:4:16: origins.a.upstreams: `upstreams` needs at least one address"),
    ("tls yes", concat!(base!(), "    tls: yes\n"), "t.yaml:5:10: origins.a.tls: expected a boolean (`true` or `false`), found a string"),
    ("tls wildcard only", "origins:\n  a:\n    hosts: [\"*.a.test\"]\n    upstreams: [\"127.0.0.1:1\"]\n    tls: true\n", "t.yaml:5:10: origins.a.tls: every host is a wildcard, so `tls: true` needs an explicit `sni`"),
    ("origin unknown key", concat!(base!(), "    upstream: []\n"), "t.yaml:5:5: origins.a.upstream: unknown key `upstream`; did you mean `upstreams`?"),
    ("limit name", concat!(base!(), "    limits:\n      \"my limit\": {kind: inflight, max: 1}\n"), "t.yaml:6:7: origins.a.limits.my limit: limit name `my limit` may only contain letters, digits, `_` and `-` (it is a metrics label)"),
    ("missing kind", limit!("        max: 10\n"), "t.yaml:6:7: origins.a.limits.l: missing required field `kind` (one of inflight, rate, token_bucket, tiered, concurrency, sliding_log)"),
    ("unknown kind", limit!("        kind: tokenbucket\n"), "t.yaml:7:15: origins.a.limits.l.kind: unknown kind `tokenbucket`; did you mean `token_bucket`?"),
    ("unknown limit key", limit!("        kind: token_bucket\n        capcity: 10\n        refill: {amount: 1, every: 1s}\n"), "t.yaml:8:9: origins.a.limits.l.capcity: unknown key `capcity`; did you mean `capacity`?"),
    ("wrong-kind field", limit!("        kind: rate\n        max: 1\n        per: 1s\n        capacity: 5\n"), "t.yaml:10:9: origins.a.limits.l.capacity: `capacity` is not a field of kind `rate`; fields of `rate` are: kind, key, mode, headers, match, overrides, store, top_keys, max, per, strict, max_keys, lease"),
    ("missing max", limit!("        kind: inflight\n"), "t.yaml:6:7: origins.a.limits.l: missing required field `max` for kind `inflight`"),
    ("missing per", limit!("        kind: rate\n        max: 5\n"), "t.yaml:6:7: origins.a.limits.l: missing required field `per` for kind `rate`"),
    ("missing refill.every", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1}\n"), "t.yaml:9:9: origins.a.limits.l.refill: missing required field `every`"),
    ("max is a string", limit!("        kind: inflight\n        max: \"10\"\n"), "t.yaml:8:14: origins.a.limits.l.max: expected an integer, found a string"),
    ("max auto misspelt", limit!("        kind: inflight\n        max: autoo\n"), "t.yaml:8:14: origins.a.limits.l.max: `max` takes an integer, `auto`, or `{auto: {min, max, initial}}`, found `autoo`"),
    ("max auto on a rate", limit!("        kind: rate\n        max: auto\n        per: 1s\n"), "t.yaml:8:14: origins.a.limits.l.max: `max: auto` is learned only by inflight limits, not kind `rate`"),
    ("auto min above max", limit!("        kind: inflight\n        max: {auto: {min: 40, max: 20}}\n"), "t.yaml:8:27: origins.a.limits.l.max.auto.min: `min` 40 is above `max` 20"),
    ("auto initial outside", limit!("        kind: inflight\n        max: {auto: {min: 4, initial: 2}}\n"), "t.yaml:8:39: origins.a.limits.l.max.auto.initial: `initial` 2 is outside `min` 4 to `max` 10000"),
    ("auto unknown bound", limit!("        kind: inflight\n        max: {auto: {mni: 4}}\n"), "t.yaml:8:22: origins.a.limits.l.max.auto.mni: unknown key `mni`; did you mean `min`?"),
    ("share too big", limit!("        kind: inflight\n        max: auto\n        share: 150%\n"), "t.yaml:9:16: origins.a.limits.l.share: `share` takes a percentage from `1%` to `100%`, e.g. `50%`, found `150%`"),
    ("share without auto", limit!("        kind: inflight\n        max: 10\n        share: 50%\n"), "t.yaml:9:16: origins.a.limits.l.share: `share` divides a learned max: it needs `max: auto`"),
    ("max zero", limit!("        kind: inflight\n        max: 0\n"), "t.yaml:8:14: origins.a.limits.l.max: must be at least 1, found 0"),
    ("max negative", limit!("        kind: inflight\n        max: -1\n"), "t.yaml:8:14: origins.a.limits.l.max: must be at least 1, found -1"),
    ("max float", limit!("        kind: inflight\n        max: 1.5\n"), "t.yaml:8:14: origins.a.limits.l.max: expected an integer, found a float"),
    ("per bare number", limit!("        kind: rate\n        max: 5\n        per: 10\n"), "t.yaml:9:14: origins.a.limits.l.per: durations need a unit, e.g. `1s`"),
    ("per too short", limit!("        kind: rate\n        max: 5\n        per: 50ms\n"), "t.yaml:9:14: origins.a.limits.l.per: duration `50ms` is out of range: must be between 100ms and 1d"),
    ("every too long", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 2d}\n"), "t.yaml:9:36: origins.a.limits.l.refill.every: duration `2d` is out of range: must be between 1ms and 1d"),
    ("refill amount zero", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 0, every: 1s}\n"), "t.yaml:9:26: origins.a.limits.l.refill.amount: must be at least 1, found 0"),
    ("refill unknown key", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amout: 1, every: 1s}\n"), "t.yaml:9:18: origins.a.limits.l.refill.amout: unknown key `amout`; did you mean `amount`?"),
    ("key empty", limit!("        kind: inflight\n        max: 1\n        key: []\n"), "t.yaml:9:14: origins.a.limits.l.key: a key needs at least one part, e.g. `[client_ip]`"),
    ("key part misspelt", limit!("        kind: inflight\n        max: 1\n        key: [host, custmer]\n"), "t.yaml:9:21: origins.a.limits.l.key[1]: unknown key part `custmer`; did you mean `customer`?"),
    ("key header without name", limit!("        kind: inflight\n        max: 1\n        key: [\"header:\"]\n"), "t.yaml:9:15: origins.a.limits.l.key[0]: `header:` needs a valid header name after `header:`"),
    ("key part misspelt header", limit!("        kind: inflight\n        max: 1\n        key: [\"heder:x-api-key\"]\n"), "t.yaml:9:15: origins.a.limits.l.key[0]: unknown key part `heder:x-api-key`; did you mean `header:x-api-key`?"),
    ("server_ip in rate key", limit!("        kind: rate\n        max: 1\n        per: 1s\n        key: [client_ip, server_ip]\n"), "t.yaml:10:26: origins.a.limits.l.key[1]: `server_ip` is only known to inflight limits (it is chosen after request-time limits run)"),
    ("kind change", concat!("defaults:\n  limits:\n    l: {kind: rate, max: 1, per: 1s}\n", base!(), "    limits:\n      l: {kind: token_bucket}\n"), "t.yaml:9:17: origins.a.limits.l.kind: limit `l` overrides a default of kind `rate` and cannot change it to `token_bucket`"),
    ("mode unknown", limit!("        kind: inflight\n        max: 1\n        mode: shadw\n"), "t.yaml:9:15: origins.a.limits.l.mode: unknown mode `shadw`; did you mean `shadow`?"),
    ("headers unknown", limit!("        kind: inflight\n        max: 1\n        headers: never\n"), "t.yaml:9:18: origins.a.limits.l.headers: unknown `headers` value `never`; expected one of on_reject, always"),
    ("cost garbage", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        cost: lots\n"), "t.yaml:10:15: origins.a.limits.l.cost: expected an integer of at least 1 or `header:NAME`, found `lots`"),
    ("cost bad header", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        cost: \"header:a b\"\n"), "t.yaml:10:15: origins.a.limits.l.cost: `header:a b` needs a valid header name after `header:`"),
    ("sketch hashes", limit!("        kind: inflight\n        max: 1\n        sketch: {hashes: 17, slots: 1024}\n"), "t.yaml:9:26: origins.a.limits.l.sketch.hashes: too large: must be at most 16, found 17"),
    ("max_keys zero", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        max_keys: 0\n"), "t.yaml:10:19: origins.a.limits.l.max_keys: must be between 1 and 16777216, found 0"),
    ("override without match", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - max: 5\n"), "t.yaml:10:13: origins.a.limits.l.overrides[0]: missing required field `match`"),
    ("override empty match", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {}\n            max: 5\n"), "t.yaml:10:20: origins.a.limits.l.overrides[0].match: `match` needs at least one condition, e.g. `{customer: bigco}`"),
    ("override unknown part", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {custmer: x}\n"), "t.yaml:10:21: origins.a.limits.l.overrides[0].match.custmer: unknown key part `custmer`; did you mean `customer`?"),
    ("override bad ip", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {client_ip: 10.0.0.300}\n"), "t.yaml:10:32: origins.a.limits.l.overrides[0].match.client_ip: `10.0.0.300` is not an IP address or network, e.g. `10.0.0.0/8`"),
    ("override bad server_addr", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {server_addr: 10.0.0.3}\n"), "t.yaml:10:34: origins.a.limits.l.overrides[0].match.server_addr: `10.0.0.3` is not an address of the form ip:port, e.g. `10.0.0.5:80`"),
    ("override path without a slash", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {path: login}\n"), "t.yaml:10:27: origins.a.limits.l.overrides[0].match.path: `login` is not a path: a path starts with `/`, e.g. `/login`"),
    ("override list value", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {customer: [a, b]}\n"), "t.yaml:10:31: origins.a.limits.l.overrides[0].match.customer: expected a string, found a list"),
    ("override key field", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {customer: a}\n            key: [host]\n"), "t.yaml:11:13: origins.a.limits.l.overrides[0].key: `key` cannot be overridden per match"),
    ("override mode off", limit!("        kind: inflight\n        max: 1\n        overrides:\n          - match: {customer: a}\n            mode: off\n"), "t.yaml:11:19: origins.a.limits.l.overrides[0].mode: mode `off` cannot be used in an override; use `enforce` or `shadow`"),
    ("override wrong-kind field", limit!("        kind: rate\n        max: 1\n        per: 1s\n        overrides:\n          - match: {customer: a}\n            capacity: 5\n"), "t.yaml:12:13: origins.a.limits.l.overrides[0].capacity: `capacity` is not a field of kind `rate`; fields of `rate` are: kind, key, mode, headers, match, overrides, store, top_keys, max, per, strict, max_keys, lease"),
    ("override server_ip match", limit!("        kind: rate\n        max: 1\n        per: 1s\n        overrides:\n          - match: {server_ip: 10.0.0.1}\n"), "t.yaml:11:21: origins.a.limits.l.overrides[0].match.server_ip: `server_ip` is only known to inflight limits (it is chosen after request-time limits run)"),
    ("override unknown field", limit!("        kind: rate\n        max: 1\n        per: 1s\n        overrides:\n          - match: {customer: a}\n            pre: 2s\n"), "t.yaml:12:13: origins.a.limits.l.overrides[0].pre: unknown key `pre`; did you mean `per`?"),
    ("override refill amount zero", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        overrides:\n          - match: {customer: a}\n            refill: {amount: 0}\n"), "t.yaml:12:30: origins.a.limits.l.overrides[0].refill.amount: must be at least 1, found 0"),
    ("cost above capacity", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        cost: 6\n"), "t.yaml:10:15: origins.a.limits.l.cost: cost 6 is above capacity 5: no request could ever pass; lower `cost` or raise `capacity` (use `capacity: 0` for a deliberate block)"),
    ("origin lowers a default's capacity under its cost", concat!("defaults:\n  limits:\n    l: {kind: token_bucket, capacity: 9, refill: {amount: 1, every: 1s}, cost: 4}\n", base!(), "    limits:\n      l: {capacity: 3}\n"), "t.yaml:9:21: origins.a.limits.l.capacity: cost 4 is above capacity 3: no request could ever pass; lower `cost` or raise `capacity` (use `capacity: 0` for a deliberate block)"),
    ("override lowers capacity under cost", limit!("        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n        cost: 4\n        overrides:\n          - match: {customer: a}\n            capacity: 2\n"), "t.yaml:13:23: origins.a.limits.l.overrides[0].capacity: cost 4 is above capacity 2: no request could ever pass; lower `cost` or raise `capacity` (use `capacity: 0` for a deliberate block)"),
    ("tiered without tiers", limit!("        kind: tiered\n"), "t.yaml:6:7: origins.a.limits.l: missing required field `tiers` for kind `tiered`"),
    ("tier without window", limit!("        kind: tiered\n        tiers: [{limit: 5, active: 1m}]\n"), "t.yaml:8:17: origins.a.limits.l.tiers[0]: missing required field `window`"),
    ("tier zero window", limit!("        kind: tiered\n        tiers: [{limit: 5, window: 0s, active: 1m}]\n"), "t.yaml:8:16: origins.a.limits.l.tiers: tier 1: window must be longer than 0"),
    ("window over 366d", limit!("        kind: sliding_log\n        windows: [{max: 3, per: 400d}]\n"), "t.yaml:8:33: origins.a.limits.l.windows[0].per: duration `400d` is out of range: must be between 1s and 366d"),
    ("unknown segment", limit!("        kind: sliding_log\n        windows: [{max: 3, per: 1d}]\n        overrides:\n          - match: {segment: vip}\n"), "t.yaml:10:30: origins.a.limits.l.overrides[0].match.segment: unknown segment `vip`: no `segments:` are configured"),
    ("group without max", limit!("        kind: concurrency\n        max: 5\n        groups: [{name: big, members: {customer: [a]}}]\n"), "t.yaml:9:18: origins.a.limits.l.groups[0]: missing required field `max`"),
    ("hosts on the unmatched origin", concat!("defaults:\n  unmatched:\n    hosts: [x.test]\n    upstreams: [\"127.0.0.1:1\"]\n", base!()), "t.yaml:3:5: defaults.unmatched.hosts: the unmatched origin serves every host that no origin names; it takes no `hosts`"),
    ("store url not redis", concat!("stores:\n  s:\n    url: \"http://127.0.0.1:6379\"\n", base!()), "t.yaml:3:10: stores.s.url: `http://127.0.0.1:6379` is not a Redis URL; write e.g. `redis://127.0.0.1:6379/0`"),
    ("store url bad port", concat!("stores:\n  s:\n    url: \"redis://127.0.0.1:x/0\"\n", base!()), "t.yaml:3:10: stores.s.url: `redis://127.0.0.1:x/0` is not a usable Redis URL: Redis URL did not parse - InvalidClientConfig"),
    ("non-text key", concat!(base!(), "    [a, b]: 1\n"), "t.yaml:5:5: origins.a: mapping keys must be plain text, not lists or mappings"),
    ("rls window", concat!(base!(), "rls:\n  config_dir: .\n  window: weekly\n"), "t.yaml:7:11: rls.window: unknown window `weekly`; expected one of sliding, fixed"),
    ("rls tls without certificates", concat!("server:\n  rls: { addr: \"127.0.0.1:8081\", tls: true }\n", base!()), "t.yaml:2:16: server.rls: a TLS listener needs certificates: add `tls: { certificates: [{ cert: FILE, key: FILE }] }` or `tls.acme`"),
    ("rls h2c", concat!("server:\n  rls: { addr: \"127.0.0.1:8081\", h2c: true }\n", base!()), "t.yaml:2:8: server.rls: `server.rls` takes `addr` and `tls` only (gRPC is HTTP/2 already)"),
];

#[test]
fn broken_configs_report_their_first_problem_exactly() {
    let mut failures = Vec::new();
    for (name, text, expected) in CASES {
        let got = errors(text);
        let first = got.first().map(String::as_str).unwrap_or("<accepted>");
        if first != *expected {
            failures.push(format!(
                "{name}:\n  expected: {expected}\n  got:      {first}"
            ));
        }
    }
    assert!(CASES.len() >= 45);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn independent_errors_are_all_reported_in_file_order() {
    let text = concat!(
        "server:\n  threads: 0\n",
        base!(),
        "    tls: maybe\n",
        "    limits:\n      l: {kind: rate, max: 5, per: 10}\n"
    );
    assert_eq!(
        errors(text),
        [
            "t.yaml:2:12: server.threads: must be between 1 and 1024, found 0",
            "t.yaml:7:10: origins.a.tls: expected a boolean (`true` or `false`), found a string",
            "t.yaml:9:36: origins.a.limits.l.per: durations need a unit, e.g. `1s`",
        ]
    );
}

#[test]
fn a_bad_value_is_not_also_reported_missing() {
    let text = limit!("        kind: rate\n        max: \"10\"\n        per: 1s\n");
    assert_eq!(
        errors(text),
        ["t.yaml:8:14: origins.a.limits.l.max: expected an integer, found a string"]
    );
}

#[test]
fn errors_in_a_default_are_reported_once() {
    let text = concat!(
        "defaults:\n  limits:\n    d: {kind: rate, max: 5, per: 1s, capacity: 3}\n",
        base!(),
        "  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:2\"]\n",
        "    limits:\n      d: {max: 6}\n"
    );
    assert_eq!(
        errors(text),
        ["t.yaml:3:38: defaults.limits.d.capacity: `capacity` is not a field of kind `rate`; fields of `rate` are: kind, key, mode, headers, match, overrides, store, top_keys, max, per, strict, max_keys, lease"]
    );
}

#[test]
fn upstream_names_are_kept_for_the_runtime_to_resolve() {
    // Reading a config does no network I/O: even a name that cannot resolve parses, and
    // the runtime build (start, reload, `check`) reports it.
    let text = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"No-Such-Host.invalid:80\", \"10.0.0.5:80\"]\n";
    let loaded = parse_str(text, "t.yaml").map(|l| l.config.origins[0].upstreams.clone());
    let want = vec![
        Upstream::Name {
            host: "no-such-host.invalid".into(),
            port: 80,
        },
        Upstream::Addr("10.0.0.5:80".parse().unwrap()),
    ];
    assert_eq!(loaded.unwrap(), want);
}

#[test]
fn load_reports_an_unreadable_file() {
    let err = crate::config::load(std::path::Path::new("/nonexistent/tollgate.yaml"));
    assert!(matches!(err, Err(ConfigError::Read { .. })));
    let shown = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        shown.starts_with("/nonexistent/tollgate.yaml: cannot read config: "),
        "{shown}"
    );
}

#[test]
fn an_origin_over_a_broken_default_adds_no_missing_field_errors() {
    let text = concat!(
        "defaults:\n  limits:\n    d: {kind: rate, max: 5}\n",
        base!(),
        "    limits:\n      d: {mode: shadow}\n"
    );
    assert_eq!(
        errors(text),
        ["t.yaml:3:5: defaults.limits.d: missing required field `per` for kind `rate`"]
    );
}
