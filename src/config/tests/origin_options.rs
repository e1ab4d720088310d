//! The origin's connection options: timeouts and TLS verification, with their defaults
//! and errors.

use std::time::Duration;

use super::errors::errors;
use crate::config::parse_str;

const BASE: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

#[test]
fn defaults_are_five_and_sixty_seconds_and_verification_on() {
    let loaded = parse_str(BASE, "t.yaml").unwrap();
    let o = &loaded.config.origins[0];
    assert_eq!(o.connect_timeout, Duration::from_secs(5));
    assert_eq!(o.read_timeout, Duration::from_secs(60));
    assert!(o.tls_verify);
}

#[test]
fn options_are_read() {
    let text = format!(
        "{BASE}    connect_timeout: 250ms\n    read_timeout: 2m\n    tls: true\n    tls_verify: false\n"
    );
    let loaded = parse_str(&text, "t.yaml").unwrap();
    let o = &loaded.config.origins[0];
    assert_eq!(o.connect_timeout, Duration::from_millis(250));
    assert_eq!(o.read_timeout, Duration::from_secs(120));
    assert!(o.tls && !o.tls_verify);
    assert_eq!(o.sni.as_deref(), Some("a.test"));
}

#[test]
fn bad_options_are_located() {
    let cases = [
        (
            "    read_timeout: 0s\n",
            "t.yaml:5:19: origins.a.read_timeout: duration `0s` is out of range: must be between 1ms and 1h",
        ),
        (
            "    connect_timeout: 5\n",
            "t.yaml:5:22: origins.a.connect_timeout: durations need a unit, e.g. `1s`",
        ),
        (
            "    tls_verify: maybe\n",
            "t.yaml:5:17: origins.a.tls_verify: expected a boolean (`true` or `false`), found a string",
        ),
        (
            "    read_timout: 1s\n",
            "t.yaml:5:5: origins.a.read_timout: unknown key `read_timout`; did you mean `read_timeout`?",
        ),
    ];
    for (line, want) in cases {
        let got = errors(&format!("{BASE}{line}"));
        assert_eq!(got.first().map(String::as_str), Some(want), "{line}");
    }
}
