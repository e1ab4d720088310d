//! The limiter API: tollgate's limits for non-HTTP callers, over the Redis protocol.
//!
//! Login services, mailers and job workers ask "may this happen?" with any Redis client,
//! unchanged: `redis-cli RL.REDUCE TwoPerMin 2 60` replies 2, then 1, then 0 (Smyte's
//! limiter served its token buckets the same way). The design account is in
//! `docs/architecture.md`; this module owns:
//!
//! - [`resp`]: the request parser (multibulk and inline commands, incremental, bounded);
//! - [`reply`]: RESP2/RESP3 reply writing;
//! - [`bounds`]: the documented limits on what one client may make the process hold;
//! - [`table`]: the command table, each command's arity, documentation and handler;
//! - [`command`]: per-connection [`Session`] state and dispatch;
//! - [`builtin`]: the Redis built-ins (`PING`, `HELLO`, `CLIENT`, `INFO`, `COMMAND`, ...);
//! - [`smyte`]: `RL.REDUCE` and `RL.GET` (and `RL.PREDUCE`, `RL.PGET` in milliseconds) over
//!   [`AdhocBuckets`](crate::limits::AdhocBuckets),
//!   or over a Redis store (`api.store`);
//! - [`conn`]: one connection's loop, generic over `AsyncRead + AsyncWrite`;
//! - [`service`]: [`ApiService`] (shared state, tokio accept loop) and [`ApiApp`], the
//!   Pingora `ServerApp` that runs it beside the proxy;
//! - [`charon`]: Charon's `CH.*` commands on the configured resources of the live runtime;
//! - [`ledger`]: the copies a connection reserved ([`ledger::Ledger`] of
//!   [`ledger::Reservation`]s) and pending transfers;
//! - [`multi`]: transactions (`MULTI`, `EXEC`, `DISCARD`);
//! - [`auth`]: `AUTH` and `HELLO ... AUTH` against `api.password_file`.
//!
//! **Protocol.** RESP2 by default; `HELLO 3` switches a connection to RESP3 (maps, nulls).
//! Pipelining is natural: every complete command in a read is executed in order and the
//! replies leave in one write. Unknown commands, wrong arity and bad arguments get `-ERR`
//! replies and the connection goes on; only a framing error (after which the stream's
//! boundaries are lost) is answered `-ERR Protocol error: ...` and closed, as Redis does.
//!
//! **Why the framing is hand-written.** The candidate crate, `redis-protocol` 6 (the
//! maintained RESP2/RESP3 codec behind `fred`), was evaluated and not taken, because a
//! server facing hostile clients needs what its decoder does not give:
//! - it recurses on nested arrays: 800 KB of `*1\r\n` overflows the stack and aborts the
//!   process (checked: "thread has overflowed its stack");
//! - it has no bounds: `*N` and `$N` of any size are accepted and simply reported as
//!   "incomplete", so a `$536870912` announcement cannot be told from a slow client and
//!   refused before buffering, and nothing caps argument counts;
//! - it is not incremental: each call decodes from the start of the buffer, so a command
//!   arriving byte by byte is re-parsed once per byte;
//! - it has no inline commands, and builds a `Vec` of frames per command.
//!
//! A server only ever receives arrays of bulk strings (RESP3 did not change requests) or
//! inline lines, so the parser here accepts exactly those, checks every length when
//! announced, never recurses and allocates nothing per command; replies are written
//! straight into the output buffer. Both are unit-tested, and the real `redis` crate and
//! `redis-cli` are the integration tests' clients.
//!
//! **Where it sits.** Beside the proxy, below the composition root (`server`), above the
//! runtime: it reads the live [`Runtime`](crate::runtime::Runtime) the proxy and the
//! reloader share, so resources, stores and switches change with a reload, and asks it for
//! decisions through the same [`Limiter`](crate::runtime::limiter::Limiter)s
//! (`docs/architecture.md`, "The limiter API").

pub mod auth;
pub mod bounds;
pub mod builtin;
pub mod charon;
pub mod command;
pub mod conn;
pub mod ledger;
pub mod multi;
pub mod reply;
pub mod resp;
pub mod service;
pub mod smyte;
pub mod table;

pub use command::Session;
pub use service::{ApiApp, ApiConfig, ApiService};
