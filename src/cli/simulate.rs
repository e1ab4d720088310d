//! `tollgate simulate`: replay an access log through one config's limits (or two, with
//! `--compare`) and print what they would have done, as a table or JSON. Exit code 0 when
//! the replay ran (bad lines are reported, not fatal); 1 when a config or the log cannot be
//! used.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::print_out;
use crate::config::{self, ConfigError};
use crate::simulate::replay::Engine;
use crate::simulate::report::{self, Report, Run};
use crate::simulate::{self, Format, HostFrom, Options};

/// What `tollgate simulate` was asked.
#[derive(Debug, Clone)]
pub struct Args {
    /// The config (or the two of `--compare`).
    pub configs: Vec<PathBuf>,
    /// Log, format, host source, line bound.
    pub options: Options,
    /// The origin of lines without a host.
    pub origin: Option<String>,
    /// JSON on stdout instead of the table.
    pub json: bool,
    /// A progress line on stderr even when it is not a terminal.
    pub progress: bool,
    /// Top rejected keys listed per limit.
    pub top: usize,
}

/// Progress on stderr: a bar on a terminal, a plain line every two seconds and one at the
/// end with `--progress` elsewhere, nothing otherwise.
enum Progress {
    Off,
    Bar(ProgressBar),
    Plain {
        total: u64,
        last: Instant,
        lines: u64,
    },
}

impl Progress {
    fn new(asked: bool, total: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "simulate {bar:30} {percent:>3}% {msg} ({elapsed}, eta {eta})",
            ) {
                bar.set_style(style);
            }
            Progress::Bar(bar)
        } else if asked {
            Progress::Plain {
                total,
                last: Instant::now(),
                lines: 0,
            }
        } else {
            Progress::Off
        }
    }

    fn update(&mut self, bytes: u64, lines: u64) {
        match self {
            Progress::Off => {}
            Progress::Bar(bar) => {
                bar.set_position(bytes);
                bar.set_message(format!("{lines} lines"));
            }
            Progress::Plain {
                total,
                last,
                lines: seen,
            } => {
                *seen = lines;
                if last.elapsed() >= Duration::from_secs(2) {
                    *last = Instant::now();
                    let pct = (bytes * 100).checked_div(*total).unwrap_or(100);
                    eprintln!("simulate: {lines} lines, {pct}%");
                }
            }
        }
    }

    fn finish(self) {
        match self {
            Progress::Bar(bar) => bar.finish_and_clear(),
            Progress::Plain { lines, .. } => eprintln!("simulate: {lines} lines, done"),
            Progress::Off => {}
        }
    }
}

fn load(path: &Path) -> Result<config::Config, ()> {
    match config::load(path) {
        Ok(loaded) => Ok(loaded.config),
        Err(ConfigError::Invalid(diags)) => {
            for d in &diags {
                eprintln!("{d}");
            }
            eprintln!("{}: {} error(s)", path.display(), diags.len());
            Err(())
        }
        Err(e) => {
            eprintln!("{e}");
            Err(())
        }
    }
}

/// Runs the subcommand.
pub fn simulate(args: &Args) -> ExitCode {
    let mut engines = Vec::with_capacity(args.configs.len());
    for path in &args.configs {
        let Ok(config) = load(path) else {
            return ExitCode::from(1);
        };
        match Engine::new(config, args.origin.as_deref()) {
            Ok(engine) => engines.push(engine),
            Err(e) => {
                eprintln!("tollgate simulate: {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    let total = match std::fs::metadata(&args.options.log) {
        Ok(meta) => meta.len(),
        Err(e) => {
            eprintln!("tollgate simulate: {}: {e}", args.options.log.display());
            return ExitCode::from(1);
        }
    };
    let mut progress = Progress::new(args.progress, total);
    let started = Instant::now();
    let input = simulate::replay(&args.options, &mut engines, &mut |b, l| {
        progress.update(b, l)
    });
    let elapsed = started.elapsed();
    progress.finish();
    let input = match input {
        Ok(input) => input,
        Err(e) => {
            eprintln!("tollgate simulate: {e}");
            return ExitCode::from(1);
        }
    };
    let log = args.options.log.display().to_string();
    let reports: Vec<Report> = engines
        .iter()
        .zip(&args.configs)
        .map(|(engine, path)| {
            let run = Run {
                config: &path.display().to_string(),
                log: &log,
                format: input.format,
                host_from: args.options.host_from,
                top: args.top,
                elapsed,
            };
            report::build(&run, &input, engine)
        })
        .collect();
    let out = match (args.json, reports.as_slice()) {
        (true, [one]) => serde_json::to_string_pretty(one),
        (true, [old, new]) => {
            serde_json::to_string_pretty(&serde_json::json!({ "old": old, "new": new }))
        }
        (false, [one]) => Ok(report::human(one)),
        (false, [old, new]) => Ok(report::human_compare(old, new)),
        _ => Ok(String::new()),
    };
    match out {
        Ok(text) if args.json => print_out(&format!("{text}\n")),
        Ok(text) => print_out(&text),
        Err(e) => {
            eprintln!("tollgate simulate: cannot write the report: {e}");
            ExitCode::from(1)
        }
    }
}

/// The defaults the command line starts from.
pub fn options(log: PathBuf, format: Format, host_from: HostFrom, max_line: usize) -> Options {
    Options {
        log,
        format,
        host_from,
        max_line,
    }
}
