//! `tollgate check`: validate a config as a start or a reload would, without starting
//! anything (upstream names resolved, every certificate and key loaded and checked);
//! optionally print the effective config.
//!
//! Beyond the config's own checks it does what a start does with the world: resolves every
//! upstream name, loads every certificate, key and segment file, so a file a start would
//! refuse is refused here too. The rest of a start's runtime build can only fail on
//! parameters the config reader already checked, or for want of memory; building it here
//! would cost what the running process costs (a `check` run by `systemctl reload` beside it
//! would double that), so it is left out, as are binding the listeners (a running tollgate
//! holds them while `check` validates its next config) and loading the snapshot (a bad one
//! is a warning at start, never a refusal).

use std::path::Path;
use std::process::ExitCode;

use crate::cli::print_out;
use crate::config::{self, effective, ConfigError};
use crate::runtime::upstreams::Upstreams;
use crate::segments::Segment;
use crate::tls::{self, TlsStore};

/// Seconds since the Unix epoch, for certificate expiry warnings.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Validates the file at `path`. Exit code 0: usable; 1: errors; 2: warnings only, with
/// `strict`. With `print_effective`, stdout is the effective config as YAML alone.
pub fn check(path: &Path, strict: bool, print_effective: bool) -> ExitCode {
    match config::load(path) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("{w}");
            }
            // What a start or reload would also do: resolve every upstream name.
            let mut unresolved = 0;
            for origin in &loaded.config.origins {
                if let Err(e) = Upstreams::resolve(&origin.upstreams) {
                    eprintln!("{}: origin `{}`: {e}", path.display(), origin.name);
                    unresolved += 1;
                }
            }
            // And load every segment file, as the runtime build does.
            for spec in &loaded.config.segments {
                if let Err(e) = Segment::load(&spec.file) {
                    eprintln!("{}: segment `{}`: {e}", path.display(), spec.name);
                    unresolved += 1;
                }
            }
            // And load every certificate and key, as the runtime does.
            let mut tls_warnings = Vec::new();
            match TlsStore::build(&loaded.config.tls, None, &tls::Managed::new()) {
                Ok(store) => {
                    let certs = store.as_ref().map(|s| s.certs.as_slice()).unwrap_or(&[]);
                    tls_warnings = tls::warnings(&loaded.config, certs, unix_now());
                }
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    unresolved += 1;
                }
            }
            for w in &tls_warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            if unresolved > 0 {
                eprintln!("{}: {unresolved} error(s)", path.display());
                return ExitCode::from(1);
            }
            let warnings = loaded.warnings.len() + tls_warnings.len();
            if print_effective {
                match effective::to_yaml(&loaded.config) {
                    Ok(yaml) => {
                        if print_out(&yaml) != ExitCode::SUCCESS {
                            return ExitCode::from(1);
                        }
                    }
                    Err(e) => {
                        eprintln!("{}: cannot print the effective config: {e}", path.display());
                        return ExitCode::from(1);
                    }
                }
            }
            let origins = loaded.config.origins.len();
            let limits: usize = loaded.config.origins.iter().map(|o| o.limits.len()).sum();
            if strict && warnings > 0 {
                eprintln!(
                    "{}: {warnings} warning(s), failing because of --strict",
                    path.display(),
                );
                return ExitCode::from(2);
            }
            let resources = match loaded.config.resources.len() {
                0 => String::new(),
                n => format!("{n} resources, "),
            };
            let memory = config::memory_estimate(&loaded.config);
            let ok = format!(
                "{}: ok ({origins} origins, {limits} limits, {resources}{warnings} warnings), about {} of memory",
                path.display(),
                config::human_bytes(memory)
            );
            // With --print-effective stdout is the YAML alone, so it can be piped.
            if print_effective {
                eprintln!("{ok}");
                ExitCode::SUCCESS
            } else {
                print_out(&format!("{ok}\n"))
            }
        }
        Err(ConfigError::Invalid(diags)) => {
            for d in &diags {
                eprintln!("{d}");
            }
            eprintln!("{}: {} error(s)", path.display(), diags.len());
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
