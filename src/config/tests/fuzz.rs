//! `parse_str` never panics: random YAML-ish text, and random edits of a valid config.

use proptest::prelude::*;

use super::example::EXAMPLE;
use crate::config::parse_str;

/// Pieces random inputs are made of: YAML punctuation, schema words, values.
const PIECES: &[&str] = &[
    "\n",
    "\n  ",
    "\n    ",
    "\n      ",
    " ",
    "  ",
    "\t",
    ":",
    ": ",
    "- ",
    "-",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\"",
    "'",
    "&a ",
    "*a",
    "!!str ",
    "!x ",
    "#",
    "|",
    ">",
    "?",
    "~",
    "---",
    "...",
    "%YAML",
    "server",
    "defaults",
    "origins",
    "limits",
    "listen",
    "metrics",
    "threads",
    "grace_period",
    "hosts",
    "upstreams",
    "tls",
    "sni",
    "kind",
    "key",
    "mode",
    "max",
    "per",
    "capacity",
    "refill",
    "amount",
    "every",
    "cost",
    "overrides",
    "match",
    "sketch",
    "inflight",
    "rate",
    "token_bucket",
    "off",
    "shadow",
    "client_ip",
    "server_ip",
    "header:x",
    "a",
    "shop",
    "a.test",
    "*.a.test",
    "127.0.0.1:1",
    "0.0.0.0:8080",
    "10.0.0.0/8",
    "0",
    "1",
    "-1",
    "99999999999999999999999999999999999999999",
    "1.5",
    "0x1F",
    "1s",
    "100ms",
    "2d",
    "true",
    "null",
    "é",
    "\u{feff}",
    "\r",
];

fn yamlish() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(PIECES), 0..120).prop_map(|p| p.concat())
}

/// An edit of a list of lines.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Duplicate(usize, usize),
    Swap(usize, usize),
    /// Drop one character of a line (never an upstream line: no DNS from tests).
    Chop(usize, usize),
    /// Insert a piece into a line.
    Insert(usize, usize, &'static str),
}

fn edit() -> impl Strategy<Value = Edit> {
    let n = 0..200usize;
    prop_oneof![
        n.clone().prop_map(Edit::Delete),
        (n.clone(), n.clone()).prop_map(|(a, b)| Edit::Duplicate(a, b)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Edit::Swap(a, b)),
        (n.clone(), 0..80usize).prop_map(|(a, b)| Edit::Chop(a, b)),
        (n, 0..80usize, proptest::sample::select(PIECES))
            .prop_map(|(a, b, p)| Edit::Insert(a, b, p)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        let len = lines.len().max(1);
        match *e {
            Edit::Delete(i) if !lines.is_empty() => {
                lines.remove(i % len);
            }
            Edit::Duplicate(i, j) if !lines.is_empty() => {
                let line = lines[i % len].clone();
                lines.insert(j % len, line);
            }
            Edit::Swap(i, j) if !lines.is_empty() => lines.swap(i % len, j % len),
            Edit::Chop(i, c) if !lines.is_empty() => {
                let line = &mut lines[i % len];
                if !line.contains("upstreams") && !line.is_empty() {
                    let at = line
                        .char_indices()
                        .nth(c % line.chars().count())
                        .map(|(b, _)| b);
                    if let Some(at) = at {
                        line.remove(at);
                    }
                }
            }
            Edit::Insert(i, c, piece) if !lines.is_empty() => {
                let line = &mut lines[i % len];
                if !line.contains("upstreams") {
                    let at = line.char_indices().nth(c).map_or(line.len(), |(b, _)| b);
                    line.insert_str(at, piece);
                }
            }
            _ => {}
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn random_yamlish_text_never_panics(text in yamlish()) {
        let _ = parse_str(&text, "fuzz.yaml");
    }

    #[test]
    fn edited_example_never_panics(edits in proptest::collection::vec(edit(), 1..6)) {
        let text = apply(EXAMPLE, &edits);
        if let Err(crate::config::ConfigError::Invalid(list)) = parse_str(&text, "fuzz.yaml") {
            prop_assert!(!list.is_empty());
            prop_assert!(list.windows(2).all(|w| (w[0].line, w[0].column) <= (w[1].line, w[1].column)));
            prop_assert!(list.iter().all(|d| d.line >= 1 && d.column >= 1 && !d.path.is_empty()));
        }
    }
}

#[test]
fn deep_or_huge_inputs_are_refused_without_overflow() {
    for text in [
        "[".repeat(100_000),
        "- ".repeat(100_000),
        "{a: ".repeat(50_000),
        format!("origins:\n{}", "  ".repeat(10_000) + "a: 1"),
        "a:\n".repeat(2) + &"b".repeat(1_000_000),
    ] {
        assert!(parse_str(&text, "deep.yaml").is_err());
    }
}
