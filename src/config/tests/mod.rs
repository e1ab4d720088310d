//! Tests of the config parser: the design example, broken configs, warnings, and fuzzing.

pub(crate) mod errors;
pub(crate) mod example;
mod fuzz;
mod hostile;
mod lease;
mod origin_options;
mod resources;
mod scope;
mod stores;
mod warnings;
