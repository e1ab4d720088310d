//! Configuration: the YAML schema, its validation, and the normalized model.
//!
//! [`load`] reads a file; [`parse_str`] parses text. Both return a [`Loaded`] (the
//! [`Config`] and any warnings) or a [`ConfigError`] listing every problem found, each with
//! file, line, column and field path.

pub mod effective;
pub mod model;
pub mod parse;
pub mod schema;
pub mod secret;

mod access_log;
mod acme;
mod api;
mod bounds;
mod lease;
mod limit;
mod merge;
mod names;
mod origin;
mod overrides;
mod params;
mod report;
mod resolve;
mod resources;
pub mod rls;
mod scalar;
mod segments;
mod server;
mod spec;
mod stores;
mod suggest;
mod text;
mod tls;
mod validate;
mod yaml;

#[cfg(test)]
pub(crate) mod tests;

pub use bounds::{human as human_bytes, memory_estimate};
pub use model::*;
pub use parse::{load, parse_bytes, parse_str, ConfigError, Loaded};
pub use resources::{API_ORIGIN, UNCONFIGURED};
pub use text::MAX_FILE_BYTES;
