//! Pingora's own log lines that any client can cause, put at their right level and
//! budgeted like tollgate's ([`crate::log_budget`]), and without the request bytes Pingora
//! quotes in them.
//!
//! Pingora writes an `error` line when a client aborts while its request header is being
//! read ("Fail to proxy: ... Downstream ...", before any hook runs), when the error
//! response for a broken request cannot be sent, and when the end of a response cannot be
//! written to a client that left. Its plain HTTP services (the demo upstream, `/metrics`)
//! write one for each request they cannot read (a header of too many fields, say) or
//! answer. None of these is tollgate's error, and each is one line per client action, so a
//! flood of aborts became a flood of `ERROR` lines. One more is no error at all: under
//! load, Pingora's upstream pool sometimes finds a kept-alive connection still referenced
//! by its idle watcher ("failed to acquire reusable stream"); it opens a new connection
//! instead and no request fails. Pingora has no hook for them
//! ([`super::service`] already suppresses, through `suppress_error_log`, the ones that do
//! have one, and logs them itself); so this logger wraps `env_logger` and rewrites exactly
//! these lines: `info`, at most [`LogBudget::PER_SECOND`] a second per kind, the next one
//! let through saying how many were left out.
//!
//! **No request bytes.** A header Pingora cannot parse is quoted in its error (`buf: ` and
//! up to 2 KiB of the raw request, `Authorization` and cookies included; the same for an
//! upstream's response), and its plain HTTP services end some lines with the request's
//! path, query and `Host`. Every Pingora line this logger prints (any level but `trace`,
//! where Pingora prints whole request headers by design) has the quote left out
//! ([`redact`]), and the request summary of those services' lines cut off.
//!
//! Lines are recognised by target and message prefix. Pingora is pinned by `Cargo.lock`;
//! a test (`tests/it/client_errors.rs`) fails if an upgrade renames one. Only lines from
//! Pingora's crates that would be printed are even looked at (formatting one costs an
//! allocation, on a path that is already writing a log line).

use std::borrow::Cow;

use log::{Level, Log, Metadata, Record};

use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::{suppressed_note, LogBudget};

/// One kind of client-caused Pingora line.
struct Rule {
    /// The record's target (Pingora's module path).
    target: &'static str,
    /// The level Pingora writes it at.
    level: Level,
    /// How the message starts.
    prefix: &'static str,
    /// Whether the line ends with `, ` and a request summary (method, path with query,
    /// `Host`), which is cut off.
    summary: bool,
    /// Its budget.
    budget: LogBudget,
}

impl Rule {
    fn new(target: &'static str, level: Level, prefix: &'static str) -> Self {
        Self {
            target,
            level,
            prefix,
            summary: false,
            budget: LogBudget::new(),
        }
    }

    fn with_summary(mut self) -> Self {
        self.summary = true;
        self
    }

    /// `text` without what came from the request.
    fn clean<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let text = if self.summary {
            // The summary follows the error, after the first `, ` past the prefix (an
            // earlier `, ` inside the error only cuts more).
            let from = self.prefix.len().min(text.len());
            match text.get(from..).and_then(|rest| rest.find(", ")) {
                Some(i) => &text[..from + i],
                None => text,
            }
        } else {
            text
        };
        redact(text)
    }
}

/// `text` with the raw bytes Pingora quotes in a parse error (`buf: ` then up to 2 KiB of
/// a request or response header) left out. The quote runs to the error's
/// last ` cause: ` (the parser's reason, which is kept), or to the end of the line.
pub fn redact(text: &str) -> Cow<'_, str> {
    const QUOTE: &str = "buf: ";
    let Some(start) = text.find(QUOTE) else {
        return Cow::Borrowed(text);
    };
    let quoted = &text[start + QUOTE.len()..];
    let tail = quoted.rfind(" cause: ").map_or("", |i| &quoted[i..]);
    Cow::Owned(format!("{}[quoted message left out]{tail}", &text[..start]))
}

/// The process logger: `env_logger`, with the client-caused Pingora lines rewritten.
pub struct Logger {
    inner: env_logger::Logger,
    rules: [Rule; 7],
    clock: MonotonicClock,
}

impl Logger {
    /// Wraps `inner`.
    pub fn new(inner: env_logger::Logger) -> Self {
        Self {
            inner,
            rules: [
                // A client closed or broke its connection while sending its header.
                Rule::new("pingora_proxy", Level::Error, "Fail to proxy: "),
                // The 400 for a broken header could not be sent: the client is gone.
                Rule::new(
                    "pingora_proxy",
                    Level::Error,
                    "failed to send error response to downstream",
                ),
                // The end of a response could not be written: the client is gone.
                Rule::new(
                    "pingora_proxy::proxy_h1",
                    Level::Error,
                    "Error finish sending body to downstream",
                ),
                // A plain HTTP service (demo upstream, /metrics) cannot read a request:
                // a client's broken header, or one of too many fields.
                Rule::new(
                    "pingora_core::apps::http_app",
                    Level::Error,
                    "HTTP server fails to read from downstream",
                ),
                // ... cannot answer it: the client is gone.
                Rule::new(
                    "pingora_core::apps::http_app",
                    Level::Error,
                    "HTTP server fails to write to downstream",
                )
                .with_summary(),
                // ... cannot finish it (e.g. drain its body): the client is gone.
                Rule::new(
                    "pingora_core::apps::http_app",
                    Level::Error,
                    "HTTP server fails to finish the request",
                ),
                // The upstream pool lost a race for an idle connection: a new one is made.
                Rule::new(
                    "pingora_core::connectors",
                    Level::Error,
                    "failed to acquire reusable stream",
                ),
            ],
            clock: MonotonicClock::new(),
        }
    }

    /// Installs the logger for the process, configured by `RUST_LOG` (default `info`).
    pub fn init() -> Result<(), log::SetLoggerError> {
        let inner =
            env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
                .build();
        let max = inner.filter();
        log::set_boxed_logger(Box::new(Self::new(inner)))?;
        log::set_max_level(max);
        Ok(())
    }

    /// Writes `record` again at `level` with `args`.
    fn write(&self, record: &Record<'_>, level: Level, args: std::fmt::Arguments<'_>) {
        self.inner.log(
            &Record::builder()
                .level(level)
                .target(record.target())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .args(args)
                .build(),
        );
    }

    fn client_caused(&self, record: &Record<'_>, text: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| {
            r.level == record.level() && r.target == record.target() && text.starts_with(r.prefix)
        })
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if record.level() < Level::Trace
            && record.target().starts_with("pingora")
            && self.inner.enabled(record.metadata())
        {
            let text = record.args().to_string();
            if let Some(rule) = self.client_caused(record, &text) {
                if let Some(suppressed) = rule.budget.admit(self.clock.now()) {
                    let text = rule.clean(&text);
                    let note = suppressed_note(suppressed);
                    self.write(record, Level::Info, format_args!("{text}{note}"));
                }
                return;
            }
            if let Cow::Owned(text) = redact(&text) {
                self.write(record, record.level(), format_args!("{text}"));
                return;
            }
        }
        self.inner.log(record);
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caught(logger: &Logger, target: &str, level: Level, text: &str) -> bool {
        logger
            .client_caused(
                &Record::builder()
                    .target(target)
                    .level(level)
                    .args(format_args!("{text}"))
                    .build(),
                text,
            )
            .is_some()
    }

    #[test]
    fn recognises_only_the_client_caused_lines() {
        let logger = Logger::new(env_logger::Builder::new().build());
        let abort = "Fail to proxy: Downstream ConnectionClosed";
        assert!(caught(&logger, "pingora_proxy", Level::Error, abort));
        // The same words at warn are Pingora's upstream retries: not a client's doing.
        let retry = "Fail to proxy: Upstream ConnectRefused, tries: 1";
        assert!(!caught(&logger, "pingora_proxy", Level::Warn, retry));
        let finish = "Error finish sending body to downstream: broken pipe";
        assert!(caught(
            &logger,
            "pingora_proxy::proxy_h1",
            Level::Error,
            finish
        ));
        let read = "HTTP server fails to read from downstream:  InvalidHTTPHeader";
        let target = "pingora_core::apps::http_app";
        assert!(caught(&logger, target, Level::Error, read));
        let pool = "failed to acquire reusable stream";
        assert!(caught(
            &logger,
            "pingora_core::connectors",
            Level::Error,
            pool
        ));
        let other = "Crit: socket is being double closed";
        let target = "pingora_core::protocols::l4::stream";
        assert!(!caught(&logger, target, Level::Error, other));
    }

    #[test]
    fn quoted_bytes_are_left_out_and_the_cause_kept() {
        let line = "Fail to proxy:  InvalidHTTPHeader context: buf: GET /?token=SECRET HTTP/1.1\\r\\nAuthorization: Bearer SECRET cause: too many headers";
        let clean = redact(line);
        assert!(!clean.contains("SECRET"), "{clean}");
        assert!(clean.starts_with("Fail to proxy:  InvalidHTTPHeader context: ["));
        assert!(clean.ends_with("context: [quoted message left out] cause: too many headers"));
        // A quote without a cause runs to the end; a request's own ` cause: ` is quoted.
        let clean = redact("x buf: a cause: SECRET cause: real");
        assert_eq!(clean, "x [quoted message left out] cause: real");
        assert_eq!(redact("x buf: SECRET"), "x [quoted message left out]");
        assert!(matches!(redact("no quote here"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_request_summary_is_cut_off() {
        let rule = Rule::new(
            "pingora_core::apps::http_app",
            Level::Error,
            "HTTP server fails to write to downstream",
        )
        .with_summary();
        let line = "HTTP server fails to write to downstream:  WriteError context: writing body, timeout: 1s, GET /?token=SECRET, Host: a, b";
        assert_eq!(
            rule.clean(line),
            "HTTP server fails to write to downstream:  WriteError context: writing body"
        );
    }
}
