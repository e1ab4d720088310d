//! The design example config, parsed into the exact model it stands for.

use std::time::Duration;

use crate::config::model::*;
use crate::config::parse_str;
use crate::limits::TokenBucketParams;
use crate::limits::{KeyPart, KeySpec, MatchValue, Matcher, RateParams, SketchSize};

/// The design example, with literal upstream addresses and a second origin.
pub(crate) const EXAMPLE: &str = r#"
server:
  listen: ["0.0.0.0:8080"]          # HTTP listeners
  metrics: "127.0.0.1:9100"         # GET /metrics, Prometheus text format
  threads: 2                        # proxy worker threads
  grace_period: 5s                  # graceful shutdown window
  trusted_proxies: ["127.0.0.1/32"] # only these peers' X-Forwarded-For is believed
  customer_header: X-Customer-ID    # optional: a request header that carries the customer ID

defaults:
  limits:                           # named limits that every origin gets, unless it overrides them by name
    origin_inflight:
      kind: inflight
      key: [customer, server_ip, host]
      max: 1000

origins:
  shop:                             # origin name: a metrics label, so keep it short
    hosts: ["shop.example.com", "*.Shop.Example.com"]
    upstreams: ["10.0.0.5:80", "10.0.0.6:80"]
    tls: false                      # optional: tls + sni to reach the upstream over TLS
    customer: acme                  # used when the request carries no customer header
    limits:
      origin_inflight: { max: 200 } # same name as a default: override only the given fields
      per_client:
        kind: rate
        key: [client_ip]
        max: 100
        per: 1s
      api_tokens:
        kind: token_bucket
        key: [header:x-api-key]
        capacity: 60
        refill: { amount: 1, every: 1s }
        cost: 1
        strict: false
        mode: shadow                # enforce (default) | shadow: count and report, never reject
        overrides:                  # per-customer (or any key part) special cases
          - match: { customer: bigco }
            capacity: 600
  blog:
    hosts: [blog.example.com]
    upstreams: ["[::1]:8081"]
    tls: true
    limits:
      burst:
        kind: token_bucket
        capacity: 10
        refill: { amount: 2, every: 250ms }
        cost: header:X-Cost
        max_keys: 500
        headers: always
        overrides:
          - match: { client_ip: 10.0.0.0/8, host: Blog.Example.com }
            refill: { every: 100ms }
            mode: shadow
          - match: { customer: 42 }
            capacity: 0
"#;

fn ms(n: u64) -> u64 {
    n * 1_000_000
}

#[test]
fn parses_the_design_example() {
    let loaded = match parse_str(EXAMPLE, "tollgate.yaml") {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    let c = loaded.config;
    assert_eq!(
        c.server,
        Server {
            listen: vec![Listener::plain("0.0.0.0:8080".parse().unwrap())],
            metrics: Some("127.0.0.1:9100".parse().unwrap()),
            threads: 2,
            grace_period: Duration::from_secs(5),
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            customer_header: Some("x-customer-id".into()),
            ..Server::default()
        }
    );
    assert_eq!(c.origins.len(), 2);
    let shop = &c.origins[0];
    assert_eq!(shop.name, "shop");
    assert_eq!(shop.hosts, ["shop.example.com", "*.shop.example.com"]);
    assert_eq!(
        shop.upstreams,
        vec![
            Upstream::Addr("10.0.0.5:80".parse().unwrap()),
            Upstream::Addr("10.0.0.6:80".parse().unwrap())
        ]
    );
    assert!(!shop.tls);
    assert_eq!(shop.sni, None);
    assert_eq!(shop.customer.as_deref(), Some("acme"));
    let names: Vec<&str> = shop.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["origin_inflight", "per_client", "api_tokens"]);

    assert_eq!(
        shop.limits[0],
        Limit {
            name: "origin_inflight".into(),
            key: KeySpec::new(vec![KeyPart::Customer, KeyPart::ServerIp, KeyPart::Host]),
            mode: Mode::Enforce,
            headers: HeadersMode::OnReject,
            params: LimitParams::Inflight {
                max: 200,
                sketch: SketchSize::DEFAULT,
                auto: None,
            },
            store: None,
            lease: None,
            overrides: vec![],
            scope: vec![],
            top_keys: None,
        }
    );
    assert_eq!(
        shop.limits[1].params,
        LimitParams::Rate {
            rate: RateParams {
                max: 100,
                per: ms(1000),
                strict: false,
                window: Default::default(),
            },
            max_keys: 100_000
        }
    );
    assert_eq!(shop.limits[1].key.parts(), [KeyPart::ClientIp]);
    let tokens = &shop.limits[2];
    assert_eq!(tokens.mode, Mode::Shadow);
    assert_eq!(tokens.key.parts(), [KeyPart::Header("x-api-key".into())]);
    let bucket = TokenBucketParams {
        capacity: 60,
        amount: 1,
        every: ms(1000),
        strict: false,
    };
    assert_eq!(
        tokens.params,
        LimitParams::TokenBucket {
            bucket,
            cost: Cost::Fixed(1),
            max_keys: 100_000
        }
    );
    assert_eq!(
        tokens.overrides,
        vec![Override {
            matchers: vec![Matcher {
                part: KeyPart::Customer,
                value: MatchValue::Exact(b"bigco".to_vec().into()),
            }],
            params: LimitParams::TokenBucket {
                bucket: TokenBucketParams {
                    capacity: 600,
                    ..bucket
                },
                cost: Cost::Fixed(1),
                max_keys: 100_000
            },
            mode: Mode::Shadow,
        }]
    );

    let blog = &c.origins[1];
    assert!(blog.tls);
    assert_eq!(
        blog.sni.as_deref(),
        Some("blog.example.com"),
        "first exact host"
    );
    assert_eq!(
        blog.upstreams,
        vec![Upstream::Addr("[::1]:8081".parse().unwrap())]
    );
    let names: Vec<&str> = blog.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["origin_inflight", "burst"]);
    assert_eq!(
        blog.limits[0].params,
        LimitParams::Inflight {
            max: 1000,
            sketch: SketchSize::DEFAULT,
            auto: None,
        },
        "the default, unmerged"
    );
    let burst = &blog.limits[1];
    assert_eq!(
        burst.key.parts(),
        [KeyPart::ClientIp],
        "default key of a bucket"
    );
    assert_eq!(burst.headers, HeadersMode::Always);
    let bucket = TokenBucketParams {
        capacity: 10,
        amount: 2,
        every: ms(250),
        strict: false,
    };
    let cost = Cost::Header("x-cost".into());
    assert_eq!(
        burst.params,
        LimitParams::TokenBucket {
            bucket,
            cost: cost.clone(),
            max_keys: 500
        }
    );
    let o = &burst.overrides;
    assert_eq!(o.len(), 2);
    assert_eq!(
        o[0].matchers,
        vec![
            Matcher {
                part: KeyPart::ClientIp,
                value: MatchValue::Net("10.0.0.0/8".parse().unwrap()),
            },
            Matcher {
                part: KeyPart::Host,
                value: MatchValue::Exact(b"blog.example.com".to_vec().into()),
            },
        ]
    );
    assert_eq!(o[0].mode, Mode::Shadow);
    assert_eq!(
        o[0].params,
        LimitParams::TokenBucket {
            bucket: TokenBucketParams {
                every: ms(100),
                ..bucket
            },
            cost: cost.clone(),
            max_keys: 500
        },
        "refill sub-fields merge one by one"
    );
    assert_eq!(
        o[1].matchers[0].value,
        MatchValue::Exact(b"42".to_vec().into()),
        "numbers match as written"
    );
    assert_eq!(o[1].mode, Mode::Enforce);
    assert_eq!(
        o[1].params,
        LimitParams::TokenBucket {
            bucket: TokenBucketParams {
                capacity: 0,
                ..bucket
            },
            cost,
            max_keys: 500
        },
        "capacity 0 blocks"
    );

    let warnings: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warnings,
        ["tollgate.yaml:40:23: origins.shop.limits.api_tokens.overrides[0].capacity: warning: override capacity 600 is above the limit's capacity 60; it raises the limit for matching requests"]
    );
}

#[test]
fn hosts_take_ipv6_literals_and_drop_a_trailing_dot() {
    let text = "origins:\n  a:\n    hosts: [\"[2001:DB8:0::1]\", \"::1\", Shop.Example.com.]\n    upstreams: [\"127.0.0.1:1\"]\n";
    let config = parse_str(text, "t.yaml").unwrap().config;
    assert_eq!(
        config.origins[0].hosts,
        ["[2001:db8::1]", "[::1]", "shop.example.com"]
    );
}

#[test]
fn defaults_apply_when_sections_are_minimal() {
    let text = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";
    let c = parse_str(text, "f").map(|l| l.config);
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        c.server.listen,
        vec![Listener::plain("0.0.0.0:8080".parse().unwrap())]
    );
    assert_eq!(c.server.threads, 2);
    assert_eq!(c.server.grace_period, Duration::from_secs(5));
    assert_eq!(c.server.metrics, None);
    assert!(c.server.trusted_proxies.is_empty());
    assert!(c.origins[0].limits.is_empty());
}

#[test]
fn origin_can_turn_a_default_off_and_merge_fields() {
    let text = r#"
defaults:
  limits:
    global: { kind: rate, key: [const:all], max: 10, per: 1m, strict: true, max_keys: 2048 }
    other: { kind: inflight, max: 5, mode: off }
origins:
  a:
    hosts: [a.test]
    upstreams: ["127.0.0.1:1"]
    limits:
      global: { mode: off }
  b:
    hosts: [b.test]
    upstreams: ["127.0.0.1:2"]
    limits:
      mine: { kind: inflight, max: 3, key: [server_addr] }
      global: { per: 2s, kind: rate }
      other: { mode: shadow }
"#;
    let c = match parse_str(text, "f") {
        Ok(l) => l.config,
        Err(e) => panic!("{e}"),
    };
    assert!(c.origins[0].limits.is_empty(), "both defaults off for a");
    let b: Vec<&str> = c.origins[1]
        .limits
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(b, ["global", "other", "mine"], "defaults first, then own");
    let global = &c.origins[1].limits[0];
    assert_eq!(global.key.parts(), [KeyPart::Const("all".into())]);
    assert_eq!(
        global.params,
        LimitParams::Rate {
            rate: RateParams {
                max: 10,
                per: ms(2000),
                strict: true,
                window: Default::default(),
            },
            max_keys: 2048
        }
    );
    assert_eq!(c.origins[1].limits[1].mode, Mode::Shadow, "re-enabled");
    assert_eq!(c.origins[1].limits[2].key.parts(), [KeyPart::ServerAddr]);
}
