//! `tollgate check` on hostile files: sizes beyond their bounds, a NUL byte, a BOM, bytes
//! that are not UTF-8, numbers that overflow. Each is located; none is silently accepted.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

/// Runs `check` on `bytes`; the exit code and stderr with the path replaced by `FILE`.
fn check(bytes: &[u8]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let file = path.display().to_string();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).replace(&file, "FILE"),
        String::from_utf8_lossy(&out.stderr).replace(&file, "FILE"),
    )
}

const BASE: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:9\"]\n";

#[test]
fn huge_sizes_and_overflowing_numbers_are_refused() {
    let text = format!(
        "{BASE}    limits:\n      t: {{kind: token_bucket, capacity: 1, refill: {{amount: 1, every: 1s}}, max_keys: 18446744073709551615}}\n      r: {{kind: rate, max: 99999999999999999999999, per: 1s}}\n"
    );
    let (code, _, err) = check(text.as_bytes());
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "FILE:6:86: origins.a.limits.t.max_keys: too large: must be at most 16777216, found 18446744073709551615",
            "FILE:7:28: origins.a.limits.r.max: too large: must be at most 18446744073709551615, found 99999999999999999999999",
            "FILE: 2 error(s)",
        ]
    );
}

#[test]
fn a_nul_byte_does_not_hide_the_rest_of_the_file() {
    let text = format!("{BASE}\0  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:9\"]\n");
    let (code, out, err) = check(text.as_bytes());
    assert_eq!(code, 1, "{out}");
    assert!(
        err.starts_with("FILE:5:1: (text): control character U+0000 (NUL) is not allowed"),
        "{err}"
    );
}

#[test]
fn a_bom_is_accepted_and_invalid_utf8_is_located() {
    let (code, out, err) = check(&[b"\xEF\xBB\xBF".as_slice(), BASE.as_bytes()].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (1 origins"), "{out}");

    // A 0xFF byte right after `a.test`, on line 3.
    let bad = BASE.replacen("a.test]", "a.test\u{FFFD}]", 1).into_bytes();
    let at = bad
        .windows(3)
        .position(|w| w == "\u{FFFD}".as_bytes())
        .unwrap();
    let bad = [&bad[..at], &[0xFF], &bad[at + 3..]].concat();
    let (code, _, err) = check(&bad);
    assert_eq!(code, 1);
    assert_eq!(
        err.lines().next().unwrap(),
        "FILE:3:19: (text): invalid UTF-8 (byte 0xFF); a config must be UTF-8 text"
    );
}
