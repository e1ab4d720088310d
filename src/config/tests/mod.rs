//! Tests of the config parser: the design example, broken configs, warnings, and fuzzing.

mod errors;
mod example;
mod fuzz;
mod origin_options;
mod warnings;
