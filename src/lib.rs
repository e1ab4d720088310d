//! tollgate: an edge reverse proxy on Pingora that keeps origins and customers from being
//! overwhelmed.
//!
//! Dependencies run one way, down this list: a module uses only those below it (see
//! `docs/architecture.md`, "Module map"; [`simulate`] borrows one pure type from
//! [`proxy`]).
//!
//! - [`cli`]: the subcommands of the binary other than `run`.
//! - [`server`]: the composition root, which assembles the process from the parts below.
//! - [`proxy`]: the HTTP front end (Pingora's `ProxyHttp`, routing by `Host`, connections).
//! - [`api`]: the limiter API, the same limits over the Redis protocol (`RL.*`, `CH.*`).
//! - [`rls`]: Envoy's rate limit service (gRPC `ShouldRateLimit`) on envoyproxy/ratelimit's
//!   own config files.
//! - [`admin`]: the operators' HTTP API on its own listener (config, state, kill switch).
//! - [`reload`]: watching the config file and SIGHUP, building and swapping the runtime.
//! - [`snapshot`]: local limit state written to a file and loaded at start.
//! - [`acme`]: certificates ordered and renewed from an ACME CA (`tls.acme`).
//! - [`simulate`]: replaying an access log through a runtime, offline.
//! - [`problem`]: the RFC 9457 answers the HTTP front ends share.
//! - [`accesslog`]: the access log: per-request records, buffered, written by a thread.
//! - [`runtime`]: a config made live: routing, upstreams, per-limit state, decisions.
//! - [`store`]: shared state in Redis and the shared limiters with their fallbacks.
//! - [`tls`]: the certificate store (PEM files, SNI by SAN) and the TLS acceptor.
//! - [`config`]: YAML → validated model (no network; reads the secret files and the
//!   ratelimit files of `rls.config_dir`).
//! - [`segments`]: roaring-bitmap ID sets and their files.
//! - [`files`]: opening the files an operator names: regular files only, never blocking.
//! - [`log_budget`]: per-second budgets for the log lines clients can cause.
//! - [`metrics`]: the Prometheus registry and its families.
//! - [`limits`]: the kinds' pure algorithms and the clock, no Pingora server types.

pub mod accesslog;
pub mod acme;
pub mod admin;
pub mod api;
pub mod cli;
pub mod config;
pub mod files;
pub mod limits;
pub mod log_budget;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod reload;
pub mod rls;
pub mod runtime;
pub mod segments;
pub mod server;
pub mod simulate;
pub mod snapshot;
pub mod store;
pub mod tls;
