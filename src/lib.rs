//! tollgate: an edge reverse proxy on Pingora that keeps origins and customers from being
//! overwhelmed.
//!
//! Dependencies run one way, down this list (see `docs/architecture.md`):
//!
//! - [`cli`]: the subcommands of the binary; [`server`]: the composition root, which
//!   assembles the process from every part below.
//! - [`proxy`] (the HTTP front end), [`api`] (the second front end: the same limits over
//!   the Redis protocol, for non-HTTP callers) and [`reload`] (watching and swapping the
//!   config), and [`admin`] (the operators' HTTP API on its own listener): they read and
//!   build [`runtime`] state, none knows another; [`problem`] holds the RFC 9457 answers
//!   the HTTP front ends share; [`snapshot`]
//!   (local limit state written to a file and loaded at start) reads and fills it too.
//! - [`runtime`]: a config made live: routing, upstreams, per-limit state, decisions.
//! - [`config`] (YAML → validated model), [`limits`] (the kinds' pure algorithms, no
//!   Pingora types), [`segments`] (roaring-bitmap ID sets), [`metrics`] and [`ratelog`].

pub mod admin;
pub mod api;
pub mod cli;
pub mod config;
pub mod limits;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod ratelog;
pub mod reload;
pub mod runtime;
pub mod segments;
pub mod server;
pub mod simulate;
pub mod snapshot;
pub mod store;
