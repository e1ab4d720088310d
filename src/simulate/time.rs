//! Timestamps of access-log lines, turned into the virtual clock's nanoseconds since the
//! Unix epoch without allocating: the common log format's `10/Oct/2026:13:55:36 -0700`,
//! RFC 3339 (`2026-10-10T13:55:36.250Z`, `+02:00` offsets) and Unix seconds (`1791640536.25`,
//! nginx's `$msec`).

use crate::limits::{Nanos, NANOS_PER_SEC};

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian), by Howard
/// Hinnant's `days_from_civil`: shift the year to start in March so that the leap day is
/// last, then count 365 days a year plus the leap days of 4-, 100- and 400-year cycles.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `digits` as an unsigned number (all ASCII digits, at most 9 of them).
fn num(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    digits.iter().try_fold(0u32, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
    })
}

fn month(name: &[u8]) -> Option<u32> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    MONTHS
        .iter()
        .position(|m| m.as_slice() == name)
        .and_then(|i| u32::try_from(i + 1).ok())
}

/// Seconds since the epoch of a UTC date and time, `None` when out of range.
fn epoch_seconds(y: u32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Option<i64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), mo, d);
    Some(days * 86_400 + i64::from(h * 3600 + mi * 60 + s))
}

/// `+hhmm`, `-hhmm`, `+hh:mm`, `Z`: the offset east of UTC in seconds.
fn offset(text: &[u8]) -> Option<i64> {
    let (sign, rest) = match text.split_first()? {
        (b'Z' | b'z', []) => return Some(0),
        (b'+', rest) => (1, rest),
        (b'-', rest) => (-1, rest),
        _ => return None,
    };
    let (h, m) = match rest {
        [a, b, b':', c, d] | [a, b, c, d] => (num(&[*a, *b])?, num(&[*c, *d])?),
        _ => return None,
    };
    Some(sign * i64::from(h * 3600 + m * 60))
}

fn to_nanos(seconds: i64, fraction: u64) -> Option<Nanos> {
    u64::try_from(seconds)
        .ok()?
        .checked_mul(NANOS_PER_SEC)?
        .checked_add(fraction)
}

/// The common log format's `%t` without brackets: `10/Oct/2026:13:55:36 -0700`.
pub fn parse_clf(t: &[u8]) -> Option<Nanos> {
    if t.len() != 26 || t[2] != b'/' || t[6] != b'/' || t[11] != b':' || t[20] != b' ' {
        return None;
    }
    let secs = epoch_seconds(
        num(&t[7..11])?,
        month(&t[3..6])?,
        num(&t[0..2])?,
        num(&t[12..14])?,
        num(&t[15..17])?,
        num(&t[18..20])?,
    )?;
    to_nanos(secs - offset(&t[21..26])?, 0)
}

/// RFC 3339 / ISO 8601 as loggers write it: `2026-10-10T13:55:36Z`, with an optional
/// fraction of up to 9 digits and a `Z` or `±hh:mm` offset (nginx's `$time_iso8601`).
pub fn parse_rfc3339(t: &[u8]) -> Option<Nanos> {
    if t.len() < 20 || t[4] != b'-' || t[7] != b'-' || !matches!(t[10], b'T' | b't' | b' ') {
        return None;
    }
    if t[13] != b':' || t[16] != b':' {
        return None;
    }
    let secs = epoch_seconds(
        num(&t[0..4])?,
        num(&t[5..7])?,
        num(&t[8..10])?,
        num(&t[11..13])?,
        num(&t[14..16])?,
        num(&t[17..19])?,
    )?;
    let mut rest = &t[19..];
    let mut fraction = 0u64;
    if let Some(after_dot) = rest.strip_prefix(b".") {
        let n = after_dot.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 || n > 9 {
            return None;
        }
        fraction = u64::from(num(&after_dot[..n])?) * 10u64.pow(9 - n as u32);
        rest = &after_dot[n..];
    }
    to_nanos(secs - offset(rest)?, fraction)
}

/// Unix seconds with an optional fraction (`1791640536`, `1791640536.250`).
pub fn parse_unix(t: &[u8]) -> Option<Nanos> {
    let (int, frac) = match memchr::memchr(b'.', t) {
        Some(dot) => (&t[..dot], &t[dot + 1..]),
        None => (t, &[][..]),
    };
    if int.is_empty() || int.len() > 12 || !int.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let secs = int.iter().fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
    let digits = frac.len().min(9);
    let fraction = if frac.is_empty() {
        0
    } else {
        u64::from(num(&frac[..digits])?) * 10u64.pow(9 - digits as u32)
    };
    secs.checked_mul(NANOS_PER_SEC)?.checked_add(fraction)
}

/// Unix seconds as a JSON number (`1791640536.25`), to the nearest microsecond.
pub fn from_f64(secs: f64) -> Option<Nanos> {
    if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
        return None;
    }
    let micros = (secs * 1e6).round() as u64;
    micros.checked_mul(1000)
}

/// Any of the textual forms above: RFC 3339, the common log format, Unix seconds.
pub fn parse_any(t: &[u8]) -> Option<Nanos> {
    parse_rfc3339(t)
        .or_else(|| parse_clf(t))
        .or_else(|| parse_unix(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn formats_agree_on_one_instant() {
        // 2026-10-10T20:55:36Z = 1791665736 (checked with `date -u -d @1791665736`).
        let want = 1_791_665_736 * S;
        assert_eq!(parse_clf(b"10/Oct/2026:13:55:36 -0700"), Some(want));
        assert_eq!(parse_clf(b"10/Oct/2026:20:55:36 +0000"), Some(want));
        assert_eq!(parse_rfc3339(b"2026-10-10T20:55:36Z"), Some(want));
        assert_eq!(parse_rfc3339(b"2026-10-10T22:55:36+02:00"), Some(want));
        assert_eq!(
            parse_rfc3339(b"2026-10-10T20:55:36.25Z"),
            Some(want + S / 4)
        );
        assert_eq!(parse_unix(b"1791665736.25"), Some(want + S / 4));
        assert_eq!(parse_any(b"1791665736"), Some(want));
        assert_eq!(from_f64(1_791_665_736.25), Some(want + S / 4));
    }

    #[test]
    fn epoch_and_leap_days() {
        assert_eq!(parse_rfc3339(b"1970-01-01T00:00:00Z"), Some(0));
        // 2024-02-29 exists; 2000-03-01 is 11017 days after the epoch.
        assert_eq!(
            parse_rfc3339(b"2000-03-01T00:00:00Z"),
            Some(11_017 * 86_400 * S)
        );
        assert!(parse_rfc3339(b"2024-02-29T00:00:00Z").is_some());
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        for bad in [
            &b""[..],
            b"10/Foo/2026:13:55:36 -0700",
            b"10/Oct/2026:25:55:36 -0700",
            b"1969-12-31T23:59:59Z",
            b"2026-13-01T00:00:00Z",
            b"2026-10-10T20:55:36.1234567890Z",
            b"2026-10-10T20:55:36",
            b"12x",
            b".5",
            "10/Oct/2026:13:55:36 -07é".as_bytes(),
        ] {
            assert_eq!(parse_any(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(from_f64(f64::NAN), None);
        assert_eq!(from_f64(-1.0), None);
    }
}
