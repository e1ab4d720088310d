//! tollgate: an edge reverse proxy on Pingora that keeps origins and customers from being
//! overwhelmed.
//!
//! Dependency direction: `main → proxy → limits`, with `config` feeding both. The
//! [`limits`] module knows nothing of Pingora; [`proxy`] is the only glue.

pub mod config;
pub mod limits;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod store;
