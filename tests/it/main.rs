//! The integration tests, as one binary: each module starts the real `tollgate` binary (or
//! a real in-process service) with a real upstream and a real client. One binary links
//! Pingora once instead of once per file. `tests/api_hostile.rs` stays a binary of its
//! own: it measures its own process's resident memory and raises its open-file limit,
//! which other tests running beside it in one process would disturb.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod access_log;
mod acme;
mod adaptive;
mod admin;
mod api_auth;
mod api_binary;
mod api_charon;
mod api_commands;
mod api_smyte;
mod api_store;
mod api_store_charon;
mod api_transactions;
mod architecture;
mod check_hostile;
mod cli;
mod client_errors;
mod concurrency_ends;
mod concurrency_groups;
mod connections;
mod dashboard;
mod edge_grpc;
mod edge_h2;
mod edge_proxy;
mod edge_tls;
mod fleet;
mod fleet_cluster;
mod fleet_faults;
mod fleet_kinds;
mod frequency_caps;
mod hosts;
mod http_correctness;
mod inflight;
mod key_floods;
mod kinds;
mod lease_ends;
mod leases;
mod lifecycle;
mod malformed;
mod paths;
mod promtool;
mod redis_store;
mod reload;
mod reload_files;
mod reload_hardening;
mod request_limits;
mod rls;
mod round_trips;
mod schema;
mod simulate;
mod slot_leases;
mod snapshot;
mod store_budget;
mod store_key_errors;
mod store_secrets;
mod systemd;
mod tls;
mod upgrade_keepalive;
