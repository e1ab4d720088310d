//! Pingora's own log lines that any client can cause, put at their right level and
//! budgeted like tollgate's ([`crate::ratelog`]).
//!
//! Pingora writes an `error` line when a client aborts while its request header is being
//! read ("Fail to proxy: ... Downstream ...", before any hook runs), when the error
//! response for a broken request cannot be sent, and when the end of a response cannot be
//! written to a client that left. None of these is tollgate's error, and each is one line
//! per client action, so a flood of aborts became a flood of `ERROR` lines. Pingora has no
//! hook for them ([`super::service`] already suppresses, through `suppress_error_log`, the
//! ones that do have one, and logs them itself); so this logger wraps `env_logger` and
//! rewrites exactly these lines: `info`, at most [`LogBudget::PER_SECOND`] a second per
//! kind, the next one let through saying how many were left out.
//!
//! Lines are recognised by target and message prefix. Pingora is pinned by `Cargo.lock`;
//! a test (`tests/it/client_errors.rs`) fails if an upgrade renames one. Only `warn` and
//! `error` lines from Pingora's crates are even looked at (formatting them costs an
//! allocation, on a path that is already writing a log line).

use log::{Level, Log, Metadata, Record};

use crate::limits::{Clock, MonotonicClock};
use crate::ratelog::{suppressed_note, LogBudget};

/// One kind of client-caused Pingora line.
struct Rule {
    /// The record's target (Pingora's module path).
    target: &'static str,
    /// The level Pingora writes it at.
    level: Level,
    /// How the message starts.
    prefix: &'static str,
    /// Its budget.
    budget: LogBudget,
}

impl Rule {
    fn new(target: &'static str, level: Level, prefix: &'static str) -> Self {
        Self {
            target,
            level,
            prefix,
            budget: LogBudget::new(),
        }
    }
}

/// The process logger: `env_logger`, with the client-caused Pingora lines rewritten.
pub struct Logger {
    inner: env_logger::Logger,
    rules: [Rule; 3],
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
        if record.level() <= Level::Warn && record.target().starts_with("pingora") {
            let text = record.args().to_string();
            if let Some(rule) = self.client_caused(record, &text) {
                if let Some(suppressed) = rule.budget.admit(self.clock.now()) {
                    self.inner.log(
                        &Record::builder()
                            .level(Level::Info)
                            .target(record.target())
                            .module_path(record.module_path())
                            .file(record.file())
                            .line(record.line())
                            .args(format_args!("{text}{}", suppressed_note(suppressed)))
                            .build(),
                    );
                }
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
        let other = "Crit: socket is being double closed";
        let target = "pingora_core::protocols::l4::stream";
        assert!(!caught(&logger, target, Level::Error, other));
    }
}
