//! The subcommands behind the `tollgate` binary (`src/main.rs` only parses arguments):
//! each returns the process exit code.

pub mod check;
pub mod schema;
pub mod segment;
pub mod simulate;
