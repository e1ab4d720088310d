//! Diagnostics collection: positions, field paths, and the list of errors and warnings a
//! parse accumulates.
//!
//! Every check reports here instead of returning early, so that one run of
//! `tollgate check` shows every problem in a file. [`Report::finish`] sorts by position and
//! drops exact repeats (a default limit's error is found again for each origin that uses
//! it, but is shown once).

use crate::config::model::{Diagnostic, Severity};

/// A 1-based line and column in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
}

/// A value together with where it was written, so that checks made long after parsing
/// (merging, overrides) can still point at the right line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct At<T> {
    /// The parsed value.
    pub v: T,
    /// Where it was written (the value, or the key for presence-only markers).
    pub pos: Pos,
    /// Its dotted field path.
    pub path: String,
}

impl<T> At<T> {
    /// Wraps `v` with its location.
    pub fn new(v: T, pos: Pos, path: &str) -> Self {
        Self {
            v,
            pos,
            path: path.to_string(),
        }
    }
}

/// A function wrapping a value with `pos` and `path`, for `Option::map`.
pub(crate) fn located<T>(pos: Pos, path: &str) -> impl FnOnce(T) -> At<T> + '_ {
    move |v| At::new(v, pos, path)
}

/// The path of `key` inside the mapping at `path`.
pub(crate) fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The path of item `index` of the list at `path`.
pub(crate) fn item(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// Errors and warnings found so far, for one file.
#[derive(Debug)]
pub(crate) struct Report {
    file: String,
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Report {
    /// An empty report for `file`.
    pub fn new(file: &str) -> Self {
        Self {
            file: file.to_string(),
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn diagnostic(&self, severity: Severity, pos: Pos, path: &str, message: String) -> Diagnostic {
        Diagnostic {
            severity,
            file: self.file.clone(),
            line: pos.line.max(1),
            column: pos.col.max(1),
            path: if path.is_empty() {
                "(root)".to_string()
            } else {
                path.to_string()
            },
            message,
        }
    }

    /// Records a problem that makes the config unusable.
    pub fn error(&mut self, pos: Pos, path: &str, message: impl Into<String>) {
        let d = self.diagnostic(Severity::Error, pos, path, message.into());
        self.errors.push(d);
    }

    /// Records something suspicious that still leaves the config valid.
    pub fn warn(&mut self, pos: Pos, path: &str, message: impl Into<String>) {
        let d = self.diagnostic(Severity::Warning, pos, path, message.into());
        self.warnings.push(d);
    }

    /// Takes over another file's report (a ratelimit file read for `rls.config_dir`): its
    /// diagnostics keep naming their own file.
    pub fn absorb(&mut self, other: Report) {
        self.errors.extend(other.errors);
        self.warnings.extend(other.warnings);
    }

    /// How many errors were recorded, to tell whether a step found new ones.
    pub fn error_count(&self) -> usize {
        self.errors.len()
    }

    /// The errors and warnings, each sorted by position with exact repeats removed.
    pub fn finish(self) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
        (tidy(self.errors), tidy(self.warnings))
    }
}

fn tidy(mut list: Vec<Diagnostic>) -> Vec<Diagnostic> {
    list.sort_by(|a, b| {
        (a.line, a.column, &a.path, &a.message).cmp(&(b.line, b.column, &b.path, &b.message))
    });
    list.dedup();
    list
}
