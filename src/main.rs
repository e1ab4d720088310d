//! The `tollgate` command line: `run` the proxy or `check` a config.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use tollgate::config::{self, effective, ConfigError};
use tollgate::runtime::upstreams::Upstreams;
use tollgate::server::{self, RunOptions};

/// mimalloc: fewer instructions per allocation than glibc's malloc on Pingora's
/// per-request buffers (see the README's Performance section).
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
}

fn check(path: &std::path::Path, strict: bool, print_effective: bool) -> ExitCode {
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
            if unresolved > 0 {
                eprintln!("{}: {unresolved} error(s)", path.display());
                return ExitCode::from(1);
            }
            if print_effective {
                match effective::to_yaml(&loaded.config) {
                    Ok(yaml) => print!("{yaml}"),
                    Err(e) => {
                        eprintln!("{}: cannot print the effective config: {e}", path.display());
                        return ExitCode::from(1);
                    }
                }
            }
            let origins = loaded.config.origins.len();
            let limits: usize = loaded.config.origins.iter().map(|o| o.limits.len()).sum();
            if strict && !loaded.warnings.is_empty() {
                eprintln!(
                    "{}: {} warning(s), failing because of --strict",
                    path.display(),
                    loaded.warnings.len()
                );
                return ExitCode::from(2);
            }
            let ok = format!(
                "{}: ok ({origins} origins, {limits} limits, {} warnings)",
                path.display(),
                loaded.warnings.len()
            );
            // With --print-effective stdout is the YAML alone, so it can be piped.
            if print_effective {
                eprintln!("{ok}");
            } else {
                println!("{ok}");
            }
            ExitCode::SUCCESS
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            config,
            strict,
            print_effective,
        } => check(&config, strict, print_effective),
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
                Ok(server) => server.run_forever(),
                Err(e) => {
                    eprintln!("tollgate: cannot start: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
