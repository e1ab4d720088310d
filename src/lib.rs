//! tollgate: an edge reverse proxy on Pingora that keeps origins and customers from being
//! overwhelmed.
//!
//! Dependency direction: `main → proxy → limits`, with `config` feeding both. The
//! [`limits`] module knows nothing of Pingora; [`proxy`] is the only glue. [`api`] is the
//! second front end: the same limits over the Redis protocol, for non-HTTP callers.

pub mod api;
pub mod config;
pub mod limits;
pub mod metrics;
pub mod proxy;
pub mod reload;
