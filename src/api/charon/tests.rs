//! Unit tests of `super`: argument parsing and reply fields.

use super::*;
use crate::api::resp::Parser;
use bytes::BytesMut;

fn parsed(line: &str) -> &'static Parser {
    let mut p = Parser::new();
    let mut buf = BytesMut::from(format!("{line}\r\n").as_bytes());
    assert!(p.parse(&mut buf).unwrap());
    Box::leak(Box::new(p))
}

fn ask(line: &str) -> Result<Ask<'static>, String> {
    parse_ask(&parsed(line).args(), "CH.REQUEST").map_err(|e| e.to_string())
}

#[test]
fn asks_parse_and_bad_ones_name_the_argument() {
    let a = ask("CH.REQUEST logins alice 5").unwrap();
    assert_eq!(
        (a.resource, a.domain, a.copies, a.min),
        (&b"logins"[..], &b"alice"[..], 5, 5)
    );
    assert_eq!(ask("CH.REQUEST r d 5 min 2").unwrap().min, 2);
    let long = format!("CH.REQUEST r {} 1", "d".repeat(257));
    for (line, want) in [
        ("CH.REQUEST r d 0", "ERR invalid 'copies': expected an integer from 1 to 9223372036854775807, got '0'"),
        ("CH.REQUEST r d -3", "ERR invalid 'copies': expected an integer from 1 to 9223372036854775807, got '-3'"),
        ("CH.REQUEST r d 1180591620717411303424", "ERR invalid 'copies': expected an integer from 1 to 9223372036854775807, got '1180591620717411303424'"),
        ("CH.REQUEST r d 2 MIN 3", "ERR invalid 'MIN': 3 is above copies 2"),
        ("CH.REQUEST r d 2 MIN 0", "ERR invalid 'MIN': expected an integer from 1 to 9223372036854775807, got '0'"),
        ("CH.REQUEST r d 2 MIN", "ERR syntax error: option 'MIN' needs a value"),
        ("CH.REQUEST r d 2 MIN 1 MIN 1", "ERR syntax error: option 'MIN' given twice"),
        ("CH.REQUEST r d 2 MAX 1", "ERR syntax error: unknown option 'MAX' for 'CH.REQUEST'"),
        (long.as_str(), "ERR invalid 'domain': expected 1 to 256 bytes, got 257"),
    ] {
        assert_eq!(ask(line), Err(want.to_string()), "{line}");
    }
}

#[test]
fn ttls_are_seconds_with_a_fraction_within_a_day() {
    assert_eq!(ttl(b"1").unwrap(), Duration::from_secs(1));
    assert_eq!(ttl(b"0.25").unwrap(), Duration::from_millis(250));
    assert_eq!(ttl(b"86400").unwrap(), Duration::from_secs(86_400));
    for bad in [
        &b"0"[..],
        b"0.0",
        b"86400.000000001",
        b"-1",
        b"1e3",
        b"",
        b".",
        b"x",
    ] {
        let e = ttl(bad).map(|_| ()).unwrap_err().to_string();
        assert!(e.starts_with("ERR invalid 'ttl_seconds'"), "{e}");
    }
}

#[test]
fn fields_are_a_map_in_resp3_and_pairs_in_resp2() {
    let mut f = Fields::default();
    f.int("granted", 2)
        .opt("global", None)
        .list("groups", vec!["big".into()]);
    let mut buf = BytesMut::new();
    f.write(&mut Reply::new(&mut buf, true));
    assert_eq!(
        &buf[..],
        b"%3\r\n$7\r\ngranted\r\n:2\r\n$6\r\nglobal\r\n_\r\n$6\r\ngroups\r\n*1\r\n$3\r\nbig\r\n"
    );
    let mut buf = BytesMut::new();
    f.write(&mut Reply::new(&mut buf, false));
    assert!(buf.starts_with(b"*6\r\n"));
    assert_eq!((millis(NEVER), millis(1), millis(1_000_000)), (-1, 1, 1));
}
