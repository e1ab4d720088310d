//! Tests of the config parser: the design example, broken configs, warnings, and fuzzing.

mod errors;
pub(crate) mod example;
mod fuzz;
mod hostile;
mod lease;
mod origin_options;
mod resources;
mod stores;
mod warnings;
