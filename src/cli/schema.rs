//! `tollgate schema`: print the config's JSON Schema (see [`crate::config::schema`]).

use std::io::Write;
use std::process::ExitCode;

use crate::config::schema;

/// Prints the schema on stdout. Exit code 1 when the generator lacks a key the reader
/// takes (a bug caught by the tests) or stdout cannot be written.
pub fn schema() -> ExitCode {
    let text = match schema::schema_text() {
        Ok(text) => text,
        Err(e) => {
            eprintln!("tollgate schema: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate schema: cannot write: {e}");
            ExitCode::from(1)
        }
    }
}
