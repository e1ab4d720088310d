//! The Pingora glue: the `ProxyHttp` implementation, routing, identity and key
//! extraction, rejection responses, and the side services (metrics, demo upstream).
//!
//! This is the only module that knows Pingora. It reads a [`runtime::Runtime`] snapshot
//! per request and asks [`crate::limits`] for decisions.

pub mod ctx;
pub mod decide;
pub mod demo;
pub mod identity;
pub mod metrics_app;
pub mod problem;
pub mod route;
pub mod runtime;
pub mod server;
pub mod service;

pub use runtime::Runtime;
pub use service::Tollgate;
