//! `tollgate schema`: print the config's JSON Schema (see [`crate::config::schema`]).

use std::process::ExitCode;

use crate::cli::print_out;
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
    print_out(&text)
}
