//! JSON lines: one JSON object per line, as nginx writes with `log_format ...
//! escape=json` or any structured logger. Fields (all optional but a time; unknown fields
//! are ignored, a later duplicate wins):
//!
//! | field | meaning |
//! |---|---|
//! | `time`, `timestamp`, `ts`, `msec`, `time_iso8601`, `time_local` | when: RFC 3339, the common log format's time, or Unix seconds (number or text) |
//! | `client_ip`, `remote_addr` | the client IP (`client_ip` wins) |
//! | `host` | the host (nginx `$host`) |
//! | `method` | the method |
//! | `path`, `uri`, `request_uri` | the path; a query is dropped |
//! | `request` | `METHOD TARGET PROTOCOL`, when method or path are not given |
//! | `customer` | the customer, over the customer header |
//! | `headers` | an object of request headers, name → text |
//! | `http_NAME` | one request header, nginx's spelling (`http_x_customer_id`) |
//! | `upstream`, `upstream_addr` | the upstream server `IP:port` (the last of a list) |
//! | `request_time`, `duration` | seconds the request took (number or text) |
//!
//! Strings are borrowed from the line unless they hold escapes: no allocation for a
//! typical line.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use smallvec::SmallVec;

use crate::limits::Nanos;
use crate::simulate::combined;
use crate::simulate::line::{path_of, Line};
use crate::simulate::time;

/// A JSON string, borrowed from the line when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A number or a numeric string, as text or as a float; loggers write both.
enum Num<'a> {
    Float(f64),
    Text(Text<'a>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Num<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Num::Float(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Num::Float(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Num::Float(v))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Num::Text(Text(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Num::Text(Text(Cow::Owned(v.to_string()))))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `headers` object: name → value pairs, four inline (the struct is moved per line).
struct HeaderList<'a>(SmallVec<[(Text<'a>, Text<'a>); 4]>);

impl<'de> Deserialize<'de> for HeaderList<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HeaderList<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of header names to strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut list = SmallVec::new();
                while let Some((k, v)) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    list.push((k, v));
                }
                Ok(HeaderList(list))
            }
        }
        d.deserialize_map(V)
    }
}

/// One line's fields, before they become a [`Line`].
#[derive(Default)]
struct Raw<'a> {
    time: Option<Nanos>,
    client_ip: Option<IpAddr>,
    remote_addr: Option<IpAddr>,
    host: Option<Text<'a>>,
    method: Option<Text<'a>>,
    path: Option<Text<'a>>,
    request: Option<Text<'a>>,
    customer: Option<Text<'a>>,
    headers: SmallVec<[(Text<'a>, Text<'a>); 4]>,
    upstream: Option<SocketAddr>,
    duration: Option<Nanos>,
}

fn stamp(n: &Num<'_>) -> Option<Nanos> {
    match n {
        Num::Float(f) => time::from_f64(*f),
        Num::Text(t) => time::parse_any(t.0.as_bytes()),
    }
}

fn seconds(n: &Num<'_>) -> Option<Nanos> {
    let secs = match n {
        Num::Float(f) => *f,
        Num::Text(t) => t.0.trim().parse().ok()?,
    };
    (secs.is_finite() && (0.0..1e9).contains(&secs)).then_some((secs * 1e9) as Nanos)
}

/// The last server of nginx's `10.0.0.1:80, 10.0.0.2:80` (the one that answered).
fn last_addr(text: &str) -> Option<SocketAddr> {
    text.rsplit([',', ' '])
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

impl<'de> Deserialize<'de> for Raw<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Raw<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut raw = Raw::default();
                let ip = |t: Text<'_>| {
                    combined::ip(t.0.as_bytes())
                        .ok_or_else(|| de::Error::custom(format!("`{}` is not an IP", t.0)))
                };
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match &*key.0 {
                        "time" | "timestamp" | "ts" | "msec" | "time_iso8601" | "time_local" => {
                            let value = map.next_value::<Num<'de>>()?;
                            raw.time = Some(stamp(&value).ok_or_else(|| {
                                de::Error::custom(format!("bad time in `{}`", key.0))
                            })?);
                        }
                        "client_ip" => {
                            if let Some(t) = map.next_value::<Option<Text<'de>>>()? {
                                raw.client_ip = Some(ip(t)?);
                            }
                        }
                        "remote_addr" => {
                            if let Some(t) = map.next_value::<Option<Text<'de>>>()? {
                                raw.remote_addr = Some(ip(t)?);
                            }
                        }
                        // `null` is an absent field (tollgate's own log writes them).
                        "host" => raw.host = map.next_value()?,
                        "method" => raw.method = map.next_value()?,
                        "path" | "uri" | "request_uri" => raw.path = map.next_value()?,
                        "request" => raw.request = map.next_value()?,
                        "customer" => raw.customer = map.next_value()?,
                        "headers" => raw.headers.extend(map.next_value::<HeaderList<'de>>()?.0),
                        "upstream" | "upstream_addr" => {
                            raw.upstream = map
                                .next_value::<Option<Text<'de>>>()?
                                .and_then(|t| last_addr(&t.0));
                        }
                        "request_time" | "duration" => {
                            raw.duration = map
                                .next_value::<Option<Num<'de>>>()?
                                .and_then(|n| seconds(&n));
                        }
                        name if name.starts_with("http_") => {
                            let value: Text<'de> = map.next_value()?;
                            let name = match key.0 {
                                Cow::Borrowed(k) => Cow::Borrowed(&k[5..]),
                                Cow::Owned(k) => Cow::Owned(k[5..].to_string()),
                            };
                            raw.headers.push((Text(name), value));
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(raw)
            }
        }
        d.deserialize_map(V)
    }
}

/// Why a line is not a usable JSON line.
#[derive(Debug)]
pub enum Refusal {
    /// Not a JSON object of the expected field types: serde_json's message.
    Json(serde_json::Error),
    /// A fixed reason.
    Other(&'static str),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Json(e) => write!(f, "{e}"),
            Refusal::Other(why) => f.write_str(why),
        }
    }
}

/// Parses one line and hands the [`Line`] (borrowing from it) to `then`.
pub fn with_line<R>(text: &[u8], then: impl FnOnce(&Line<'_>) -> R) -> Result<R, Refusal> {
    // One UTF-8 check of the whole line (word at a time over ASCII) is cheaper than
    // serde_json's check of each string; a line that is not UTF-8 is not JSON anyway.
    let text = std::str::from_utf8(text).map_err(|_| Refusal::Other("not UTF-8"))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let raw = Raw::deserialize(&mut de).map_err(Refusal::Json)?;
    de.end().map_err(Refusal::Json)?;
    let time = raw.time.ok_or(Refusal::Other("no time field"))?;
    let request = raw.request.as_ref().map(|r| r.0.as_bytes());
    let mut from_request = request
        .map(|r| r.split(|&b| b == b' '))
        .into_iter()
        .flatten();
    let (req_method, req_target) = (from_request.next(), from_request.next());
    let mut line = Line {
        time,
        client_ip: raw.client_ip.or(raw.remote_addr),
        host: raw.host.as_ref().map(|t| t.0.as_bytes()),
        method: raw.method.as_ref().map(|t| t.0.as_bytes()).or(req_method),
        path: raw
            .path
            .as_ref()
            .map(|t| t.0.as_bytes())
            .or(req_target)
            .map(path_of),
        customer: raw.customer.as_ref().map(|t| t.0.as_bytes()),
        upstream: raw.upstream,
        duration: raw.duration,
        ..Line::default()
    };
    line.headers.extend(
        raw.headers
            .iter()
            .map(|(k, v)| (k.0.as_bytes(), v.0.as_bytes())),
    );
    Ok(then(&line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<String, Refusal> {
        with_line(text.as_bytes(), |l| format!("{l:?}"))
    }

    #[test]
    fn fields_and_aliases() {
        let text = r#"{"time":"2026-10-10T20:55:36.5Z","remote_addr":"10.0.0.1","host":"Shop.test","request":"GET /a?b HTTP/1.1","status":200,"headers":{"X-Customer":"acme"},"http_user_agent":"curl","upstream_addr":"10.1.0.1:80, 10.1.0.2:80","request_time":"0.250"}"#;
        with_line(text.as_bytes(), |l| {
            assert_eq!(l.time, 1_791_665_736_500_000_000);
            assert_eq!(l.client_ip, Some("10.0.0.1".parse().unwrap()));
            assert_eq!(l.host, Some(&b"Shop.test"[..]));
            assert_eq!(l.method, Some(&b"GET"[..]));
            assert_eq!(l.path, Some(&b"/a"[..]));
            assert_eq!(l.header(b"x-customer"), Some(&b"acme"[..]));
            assert_eq!(l.header(b"user-agent"), Some(&b"curl"[..]));
            assert_eq!(l.upstream, Some("10.1.0.2:80".parse().unwrap()));
            assert_eq!(l.duration, Some(250_000_000));
        })
        .unwrap();
        let text = r#"{"msec":1791665736.25,"client_ip":"::1","remote_addr":"10.0.0.1","method":"POST","path":"/x\u0041","customer":"c"}"#;
        with_line(text.as_bytes(), |l| {
            assert_eq!(l.time, 1_791_665_736_250_000_000);
            assert_eq!(l.client_ip, Some("::1".parse().unwrap()), "client_ip wins");
            assert_eq!(l.path, Some(&b"/xA"[..]), "escapes are decoded");
            assert_eq!(l.customer, Some(&b"c"[..]));
        })
        .unwrap();
    }

    proptest::proptest! {
        /// A valid line with bytes overwritten never panics.
        #[test]
        fn never_panics(
            edits in proptest::collection::vec((0usize..300, proptest::prelude::any::<u8>()), 1..6),
        ) {
            let mut line = br#"{"time":"2026-10-10T20:55:36.5Z","remote_addr":"10.0.0.1","host":"a","request":"GET /a?b HTTP/1.1","headers":{"x":"y"},"http_z":"w","upstream_addr":"10.1.0.1:80","request_time":"0.25"}"#.to_vec();
            for (at, b) in edits {
                let at = at % line.len();
                line[at] = b;
            }
            let _ = with_line(&line, |l| l.time);
        }
    }

    #[test]
    fn bad_lines_are_refused() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"host":"a"}"#,
            r#"{"time":"yesterday"}"#,
            r#"{"time":1,"remote_addr":"nope"}"#,
            r#"{"time":1,"headers":{"a":1}}"#,
            r#"{"time":1} trailing"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
