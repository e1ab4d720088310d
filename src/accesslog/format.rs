//! A [`Record`] as a line of text, on the writer thread: `json` (one object per line, the
//! fields of `docs/access-log.md`, what `tollgate simulate` reads as it is) or `combined`
//! (nginx's `log_format combined`). Neither allocates: each appends to the writer's
//! output buffer.

use std::io::Write;

use crate::accesslog::record::Record;

/// Appends `rec` as one json line (with its `\n`).
pub fn json(rec: &Record<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"time\":\"");
    rfc3339(rec.time, out);
    out.push(b'"');
    text(rec.request_id, field(out, "request_id"));
    display(rec.client_ip, field(out, "client_ip"));
    display(rec.peer, field(out, "peer"));
    text(rec.customer, field(out, "customer"));
    text(rec.method, field(out, "method"));
    text(rec.host, field(out, "host"));
    text(rec.path, field(out, "path"));
    text(rec.protocol.name().as_bytes(), field(out, "protocol"));
    text(rec.tls, field(out, "tls"));
    text(rec.sni, field(out, "sni"));
    number(u64::from(rec.status), field(out, "status"));
    number(rec.bytes_in, field(out, "bytes_in"));
    number(rec.bytes_out, field(out, "bytes_out"));
    seconds(rec.duration, field(out, "duration"));
    display(rec.upstream, field(out, "upstream"));
    field(out, "upstream_status");
    match rec.upstream_status {
        0 => out.extend_from_slice(b"null"),
        s => number(u64::from(s), out),
    }
    field(out, "upstream_ttfb");
    match rec.upstream_ttfb {
        None => out.extend_from_slice(b"null"),
        Some(t) => seconds(t, out),
    }
    text(rec.origin, field(out, "origin"));
    field(out, "rejected_by");
    if rec.rejected_limit.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        out.extend_from_slice(b"{\"limit\":");
        text(rec.rejected_limit, out);
        text(rec.rejected_kind, field(out, "kind"));
        out.push(b'}');
    }
    field(out, "shadow_rejected");
    out.push(b'[');
    for (i, s) in rec.shadow_rejected.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        text(s, out);
    }
    out.push(b']');
    text(rec.source, field(out, "source"));
    field(out, "headers");
    out.push(b'{');
    for (i, (name, value)) in rec.headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        text(name, out);
        out.push(b':');
        text(value, out);
    }
    out.extend_from_slice(b"}}\n");
}

/// Appends `,"name":`, a field after an object's first; hands `out` on for its value.
fn field<'o>(out: &'o mut Vec<u8>, name: &str) -> &'o mut Vec<u8> {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
    out
}

/// Appends `rec` as one line of nginx's `combined` format: `$remote_addr - - [$time_local]
/// "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"` (the two
/// headers only when `headers` lists them; `-` otherwise).
pub fn combined(rec: &Record<'_>, out: &mut Vec<u8>) {
    match rec.client_ip {
        Some(ip) => {
            let _ = write!(out, "{ip}");
        }
        None => out.push(b'-'),
    }
    out.extend_from_slice(b" - - [");
    time_local(rec.time, out);
    out.extend_from_slice(b"] \"");
    escaped(rec.method, out);
    out.push(b' ');
    escaped(rec.path, out);
    out.push(b' ');
    out.extend_from_slice(rec.protocol.request_line().as_bytes());
    out.extend_from_slice(b"\" ");
    number(u64::from(rec.status), out);
    out.push(b' ');
    number(rec.bytes_out, out);
    for name in [b"referer".as_slice(), b"user-agent"] {
        out.extend_from_slice(b" \"");
        match rec.headers.iter().find(|(n, _)| *n == name) {
            Some((_, v)) => escaped(v, out),
            None => out.push(b'-'),
        }
        out.push(b'"');
    }
    out.push(b'\n');
}

fn number(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Nanoseconds as seconds with microseconds: `0.001234`.
fn seconds(nanos: u64, out: &mut Vec<u8>) {
    let micros = nanos / 1_000;
    number(micros / 1_000_000, out);
    let _ = write!(out, ".{:06}", micros % 1_000_000);
}

fn display<T: std::fmt::Display>(v: Option<T>, out: &mut Vec<u8>) {
    match v {
        None => out.extend_from_slice(b"null"),
        Some(v) => {
            let _ = write!(out, "\"{v}\"");
        }
    }
}

/// A JSON string, or `null` when empty. Bytes that are not UTF-8 are written as the code
/// point of the same number (`\u00ff`), so the line stays valid JSON.
fn text(bytes: &[u8], out: &mut Vec<u8>) {
    if bytes.is_empty() {
        out.extend_from_slice(b"null");
        return;
    }
    out.push(b'"');
    for chunk in bytes.utf8_chunks() {
        for &b in chunk.valid().as_bytes() {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0..=0x1f | 0x7f => {
                    let _ = write!(out, "\\u{b:04x}");
                }
                _ => out.push(b),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(out, "\\u{b:04x}");
        }
    }
    out.push(b'"');
}

/// nginx's escaping in a quoted field: `"`, `\`, and bytes outside printable ASCII as
/// `\xHH`.
fn escaped(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        match b {
            b'"' | b'\\' | 0..=0x1f | 0x7f..=0xff => {
                let _ = write!(out, "\\x{b:02X}");
            }
            _ => out.push(b),
        }
    }
}

/// Days since the epoch → (year, month, day) (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Splits Unix nanoseconds into the date, the time of day and the microseconds.
fn parts(nanos: u64) -> ((i64, u32, u32), (u64, u64, u64), u64) {
    let secs = nanos / 1_000_000_000;
    let micros = (nanos / 1_000) % 1_000_000;
    let day = secs % 86_400;
    (
        civil((secs / 86_400) as i64),
        (day / 3600, day % 3600 / 60, day % 60),
        micros,
    )
}

/// `2026-11-27T13:05:01.123456Z`.
fn rfc3339(nanos: u64, out: &mut Vec<u8>) {
    let ((y, mo, d), (h, mi, s), us) = parts(nanos);
    let _ = write!(out, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z");
}

/// `27/Nov/2026:13:05:01 +0000` (nginx's `$time_local`, in UTC).
fn time_local(nanos: u64, out: &mut Vec<u8>) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let ((y, mo, d), (h, mi, s), _) = parts(nanos);
    let month = MONTHS[(mo as usize).saturating_sub(1) % 12];
    let _ = write!(out, "{d:02}/{month}/{y:04}:{h:02}:{mi:02}:{s:02} +0000");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field_and_is_valid() {
        let mut out = Vec::new();
        json(&Record::sample(), &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["time"], "2026-11-27T13:05:01.123456Z");
        assert_eq!(v["path"], "/a\"b\u{ff}\n");
        assert_eq!(v["duration"], 0.001234);
        assert_eq!(v["rejected_by"]["limit"], "per_ip");
        assert_eq!(v["rejected_by"]["kind"], "rate");
        assert_eq!(v["shadow_rejected"][0], "new");
        assert_eq!(v["headers"]["user-agent"], "curl/8");
        assert_eq!(v["upstream"], serde_json::Value::Null);
        assert_eq!(v["upstream_status"], serde_json::Value::Null);
        assert_eq!(v["source"], serde_json::Value::Null);
        assert_eq!(v["client_ip"], "2001:db8::1");
        assert_eq!(v["peer"], "127.0.0.1:5555");
        assert_eq!(v["protocol"], "h2");
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 23, "{keys:?}");
    }

    #[test]
    fn combined_is_nginx_s() {
        let mut out = Vec::new();
        combined(&Record::sample(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2001:db8::1 - - [27/Nov/2026:13:05:01 +0000] \"GET /a\\x22b\\xFF\\x0A HTTP/2.0\" 429 200 \"-\" \"curl/8\"\n"
        );
    }

    #[test]
    fn dates_cross_leap_years() {
        let mut out = Vec::new();
        rfc3339(951_782_400_000_000_000, &mut out); // 2000-02-29
        assert_eq!(out, b"2000-02-29T00:00:00.000000Z");
        out.clear();
        rfc3339(0, &mut out);
        assert_eq!(out, b"1970-01-01T00:00:00.000000Z");
    }
}
