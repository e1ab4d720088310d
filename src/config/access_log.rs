//! `server.access_log`: the access log's file, format, which requests it records, whether
//! paths keep their query, and the request headers added to each line (never a
//! credential).

use std::path::Path;

use crate::config::model::{AccessLog, AccessLogFormat, AccessLogOnly, AccessLogPath};
use crate::config::report::{child, item, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `server.access_log` takes.
pub(crate) const ACCESS_LOG_KEYS: [&str; 5] = ["path", "format", "only", "query", "headers"];

/// `format`'s values.
pub(crate) const FORMATS: [&str; 2] = ["json", "combined"];
/// `only`'s values.
pub(crate) const ONLY: [&str; 3] = ["all", "rejected", "errors"];
/// `query`'s values.
pub(crate) const QUERY: [&str; 2] = ["drop", "keep"];

/// The most headers a line may carry: each is copied per request.
pub(crate) const MAX_HEADERS: usize = 16;

/// Headers that carry credentials: never logged, whatever the config says.
pub(crate) const SECRET_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
];

/// Reads `server.access_log` (`v`, at `path`); `file` is the config file, whose directory
/// a relative `path` starts in.
pub(crate) fn parse(r: &mut Report, v: &Node, path: &str, file: &str) -> Option<AccessLog> {
    let entries = scalar::map(r, v, path)?;
    let mut log = AccessLog {
        path: AccessLogPath::Stdout,
        format: AccessLogFormat::Json,
        only: AccessLogOnly::All,
        query: false,
        headers: Vec::new(),
    };
    let mut has_path = false;
    let errors = r.error_count();
    for e in entries {
        let p = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "path" => {
                has_path = true;
                let Some(text) = scalar::text(r, v, &p) else {
                    continue;
                };
                if text.is_empty() || text.len() > 4096 || text.contains('\0') {
                    r.error(v.pos, &p, "`path` must be a file name or `stdout`");
                } else if text == "stdout" {
                    log.path = AccessLogPath::Stdout;
                } else {
                    let base = Path::new(file).parent().unwrap_or(Path::new(""));
                    log.path = AccessLogPath::File(base.join(text));
                }
            }
            "format" => {
                if let Some(i) = scalar::choice(r, v, &p, "format", &FORMATS) {
                    log.format = [AccessLogFormat::Json, AccessLogFormat::Combined][i];
                }
            }
            "only" => {
                if let Some(i) = scalar::choice(r, v, &p, "value", &ONLY) {
                    log.only = [
                        AccessLogOnly::All,
                        AccessLogOnly::Rejected,
                        AccessLogOnly::Errors,
                    ][i];
                }
            }
            "query" => {
                if let Some(i) = scalar::choice(r, v, &p, "value", &QUERY) {
                    log.query = i == 1;
                }
            }
            "headers" => {
                let Some(items) = scalar::seq(r, v, &p) else {
                    continue;
                };
                if items.len() > MAX_HEADERS {
                    r.error(
                        v.pos,
                        &p,
                        format!("at most {MAX_HEADERS} headers, found {}", items.len()),
                    );
                    continue;
                }
                for (i, n) in items.iter().enumerate() {
                    let ip = item(&p, i);
                    let Some(name) = scalar::text(r, n, &ip) else {
                        continue;
                    };
                    let lower = name.to_ascii_lowercase();
                    if !crate::limits::key::is_header_name(name) {
                        r.error(
                            n.pos,
                            &ip,
                            format!("`{name}` is not a valid HTTP header name"),
                        );
                    } else if SECRET_HEADERS.contains(&lower.as_str()) {
                        r.error(
                            n.pos,
                            &ip,
                            format!("`{name}` carries credentials and is never logged"),
                        );
                    } else if !log.headers.contains(&lower) {
                        log.headers.push(lower);
                    }
                }
            }
            other => r.error(
                e.key_pos,
                &p,
                suggest::unknown("key", other, &ACCESS_LOG_KEYS),
            ),
        }
    }
    if !has_path {
        r.error(
            v.pos,
            path,
            "`access_log` needs a `path` (a file, or `stdout`)",
        );
    }
    (r.error_count() == errors).then_some(log)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::model::{AccessLog, AccessLogFormat, AccessLogOnly, AccessLogPath};
    use crate::config::{parse_str, ConfigError};

    const ORIGIN: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

    fn access_log(yaml: &str) -> Result<Option<AccessLog>, Vec<String>> {
        match parse_str(
            &format!("server:\n  access_log: {yaml}\n{ORIGIN}"),
            "/etc/t/t.yaml",
        ) {
            Ok(l) => Ok(l.config.server.access_log),
            Err(ConfigError::Invalid(d)) => Err(d.iter().map(ToString::to_string).collect()),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    #[test]
    fn defaults_and_every_key() {
        let log = access_log("{path: stdout}").unwrap().unwrap();
        assert_eq!(
            log,
            AccessLog {
                path: AccessLogPath::Stdout,
                format: AccessLogFormat::Json,
                only: AccessLogOnly::All,
                query: false,
                headers: vec![],
            }
        );
        let log = access_log(
            "{path: logs/access.log, format: combined, only: rejected, query: keep, headers: [User-Agent, referer]}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            log.path,
            AccessLogPath::File(PathBuf::from("/etc/t/logs/access.log"))
        );
        assert_eq!(log.format, AccessLogFormat::Combined);
        assert_eq!(log.only, AccessLogOnly::Rejected);
        assert!(log.query);
        assert_eq!(log.headers, ["user-agent", "referer"]);
    }

    #[test]
    fn errors_name_the_field() {
        let e = access_log("{path: stdout, format: jsonl}").unwrap_err();
        assert!(e[0].starts_with("/etc/t/t.yaml:2:"), "{e:?}");
        for (yaml, says) in [
            (
                "{format: json}",
                "server.access_log: `access_log` needs a `path`",
            ),
            ("{path: stdout, format: jsonl}", "server.access_log.format"),
            (
                "{path: stdout, headers: [Authorization]}",
                "server.access_log.headers[0]: `Authorization` carries credentials",
            ),
            ("{path: stdout, only: some}", "server.access_log.only"),
            ("{path: stdout, qery: keep}", "did you mean `query`"),
        ] {
            let e = access_log(yaml).unwrap_err();
            assert!(e[0].contains(says), "{yaml}: {e:?}");
        }
    }
}
