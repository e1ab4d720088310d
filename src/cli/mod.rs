//! The subcommands behind the `tollgate` binary (`src/main.rs` only parses arguments):
//! each returns the process exit code.
//!
//! What they print on stdout goes through [`print_out`]: a reader that stops early
//! (`tollgate segment info F | head -1`) closes the pipe, which Rust's `println!` turns into
//! a panic, since the runtime ignores SIGPIPE.

pub mod check;
pub mod schema;
pub mod segment;
pub mod simulate;

use std::io::Write;
use std::process::ExitCode;

/// Writes `text` to stdout and flushes it. A closed pipe (the reader has all it wanted) is
/// a success, as for any Unix filter; any other write error is reported, exit code 1.
pub fn print_out(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: cannot write to standard output: {e}");
            ExitCode::from(1)
        }
    }
}
