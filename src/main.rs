//! The `tollgate` command line: `run` the proxy, `check` a config, print its `schema`,
//! `simulate` a config on an access log, build a `segment`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use tollgate::cli;
use tollgate::server::{self, RunOptions};

/// mimalloc: fewer instructions per allocation than glibc's malloc on Pingora's
/// per-request buffers (see docs/performance.md).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An edge reverse proxy that keeps origins and customers from being overwhelmed.
#[derive(Parser, Debug)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the proxy.
    Run {
        /// The config file.
        #[arg(short, long, default_value = "conf/tollgate.yaml")]
        config: PathBuf,
        /// Run in the background (Pingora's daemon mode).
        #[arg(short, long)]
        daemon: bool,
        /// Take over the listeners of a running tollgate: start the new binary with
        /// --upgrade, then send SIGQUIT to the old process.
        #[arg(short, long)]
        upgrade: bool,
        /// The Unix socket on which listeners are handed over during an upgrade.
        #[arg(long, default_value = "/tmp/tollgate_upgrade.sock")]
        upgrade_sock: String,
        /// Where daemon mode writes the PID.
        #[arg(long, default_value = "/tmp/tollgate.pid")]
        pid_file: String,
    },
    /// Validate a config file without starting anything. Exit code 0: clean; 1: errors;
    /// 2: warnings only, with --strict.
    Check {
        /// The config file.
        #[arg(short, long, default_value = "conf/tollgate.yaml")]
        config: PathBuf,
        /// Treat warnings as failures (exit 2).
        #[arg(long)]
        strict: bool,
        /// Print the effective config (defaults merged into every origin) as YAML on
        /// stdout.
        #[arg(long)]
        print_effective: bool,
    },
    /// Print the config file's JSON Schema (draft 2020-12), for editors and other tools;
    /// conf/tollgate.schema.json is its output.
    Schema,
    /// Replay an access log through a config's limits in virtual time (no network) and
    /// report what they would have done: per origin and limit, allowed / rejected /
    /// shadow counts, peak rates, top rejected keys, `Retry-After` distribution.
    Simulate {
        /// The config file.
        #[arg(short, long, conflicts_with = "compare")]
        config: Option<PathBuf>,
        /// The access log.
        #[arg(long)]
        log: PathBuf,
        /// The log's format: combined (nginx/Apache, also common and vhost_combined) or
        /// jsonl (one JSON object per line; fields in docs/replay.md).
        #[arg(long, value_enum, default_value = "combined")]
        format: tollgate::simulate::Format,
        /// Where a line's host comes from: the log's host field, or its Host header.
        #[arg(long, value_enum, default_value = "log")]
        host_from: tollgate::simulate::HostFrom,
        /// The origin of lines without a host (default: the only origin, if one).
        #[arg(long)]
        origin: Option<String>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Replay the log through two configs and print both side by side.
        #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
        compare: Option<Vec<PathBuf>>,
        /// Print progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
        /// How many top rejected keys to list per limit.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// Lines longer than this (bytes) are skipped as unparseable.
        #[arg(long, default_value_t = 16384)]
        max_line: usize,
    },
    /// Build or inspect a segment: a set of integer IDs in a portable roaring-bitmap file.
    Segment {
        #[command(subcommand)]
        command: SegmentCommand,
    },
}

#[derive(Subcommand, Debug)]
enum SegmentCommand {
    /// Build a segment file from a text file of IDs, one per line (blank lines and `#`
    /// comments skipped). Any bad line fails the build, reported with its line number.
    Build {
        /// The text file of IDs (`-` for standard input).
        #[arg(long)]
        from: PathBuf,
        /// The segment file to write (atomically).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a segment file's cardinality, size, smallest and largest ID, and format.
    Info {
        /// The segment file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            config,
            strict,
            print_effective,
        } => cli::check::check(&config, strict, print_effective),
        Command::Schema => cli::schema::schema(),
        Command::Simulate {
            config,
            log,
            format,
            host_from,
            origin,
            json,
            compare,
            progress,
            top,
            max_line,
        } => {
            let configs = compare.unwrap_or_else(|| {
                vec![config.unwrap_or_else(|| PathBuf::from("conf/tollgate.yaml"))]
            });
            cli::simulate::simulate(&cli::simulate::Args {
                configs,
                options: cli::simulate::options(log, format, host_from, max_line),
                origin,
                json,
                progress,
                top,
            })
        }
        Command::Segment { command } => match command {
            SegmentCommand::Build { from, out } => cli::segment::build(&from, &out),
            SegmentCommand::Info { file } => cli::segment::info(&file),
        },
        Command::Run {
            config,
            daemon,
            upgrade,
            upgrade_sock,
            pid_file,
        } => {
            // env_logger, with Pingora's client-caused lines levelled and budgeted.
            if let Err(e) = tollgate::proxy::pingora_log::Logger::init() {
                eprintln!("tollgate: cannot set up logging: {e}");
            }
            let opts = RunOptions {
                config,
                daemon,
                upgrade,
                upgrade_sock,
                pid_file,
            };
            match server::build(&opts) {
                Ok(started) => started.run(),
                Err(e) => {
                    eprintln!("tollgate: cannot start: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
