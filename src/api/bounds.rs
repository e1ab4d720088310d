//! The bounds that keep a hostile or broken client from exhausting the process.
//!
//! Each violation ends in an error reply where the protocol still allows one, else a clean
//! close, and a log line (rate-limited where a client can trigger it at will). Memory per
//! connection is bounded by these numbers whatever a client sends: at most one partial
//! argument or inline line waits in the read buffer (≤ 64 KiB plus one read), the command
//! being assembled holds ≤ [`MAX_COMMAND_BYTES`], and unsent replies ≤
//! [`DEFAULT_MAX_OUTPUT_BUFFER`] plus one reply. An idle connection holds a few KiB. The
//! copies a connection holds (`CH.RESERVE`) are entries of at most [`MAX_DOMAIN_LEN`]
//! bytes of domain each, at most [`MAX_HOLDS_PER_CONNECTION`] per connection and
//! [`MAX_HOLDS`] in the process, pending transfers included. A transaction (`MULTI`) queues
//! at most [`MAX_QUEUED_COMMANDS`] commands and [`MAX_QUEUED_BYTES`] bytes.

use std::time::Duration;

/// Longest argument (bulk string) a command may carry: 64 KiB. Longer announcements
/// (`$536870912`) are refused when their header arrives, before any payload is read or
/// memory reserved. Limiter keys and names are short; 64 KiB leaves room for odd keys.
pub const MAX_ARG_LEN: usize = 64 * 1024;

/// Most arguments one command may have (its name included): 1024. A larger `*N` is
/// refused when announced.
pub const MAX_ARGS: usize = 1024;

/// Most bytes the arguments of one command may add up to: 1 MiB. This is the query
/// buffer's bound: the parser copies arguments out as they complete, so at most this much
/// of one command is ever held.
pub const MAX_COMMAND_BYTES: usize = 1024 * 1024;

/// Most commands one transaction may queue between `MULTI` and `EXEC`: 4096. The next one
/// is refused with an error and the transaction is discarded at `EXEC` (`EXECABORT`), so
/// nothing of it runs.
pub const MAX_QUEUED_COMMANDS: usize = 4096;

/// Most bytes one transaction's queue may hold: 1 MiB, counting each argument's bytes plus
/// 16 for its place in the queue (so a queue of empty arguments is bounded too). Past it,
/// as past [`MAX_QUEUED_COMMANDS`], the transaction is discarded at `EXEC`.
pub const MAX_QUEUED_BYTES: usize = 1024 * 1024;

/// Longest inline command line: 64 KiB, as Redis's `PROTO_INLINE_MAX_SIZE`.
pub const MAX_INLINE_LEN: usize = 64 * 1024;

/// Bytes read from a socket at a time: small enough that idle connections cost little,
/// large enough for a pipeline of a hundred limiter commands per read.
pub const READ_CHUNK: usize = 4096;

/// Default bound on replies not yet taken by the client: 1 MiB. A client that pipelines
/// commands but never reads its replies has its connection closed once this much is
/// waiting (after the kernel's socket buffers are full too): Redis's
/// `client-output-buffer-limit`, applied to every client. One `RL.REDUCE` reply is 4 to 20
/// bytes, so a pipeline of 50 000 of them fits whatever the socket buffers.
pub const DEFAULT_MAX_OUTPUT_BUFFER: usize = 1024 * 1024;

/// Default cap on open connections: 10 000, Redis's `maxclients`. Beyond it a new
/// connection gets `-ERR max number of clients reached` and is closed.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Default idle timeout: a connection with no byte moving either way for 5 minutes is
/// closed. Client pools reconnect transparently; a vanished peer whose socket never errs
/// is freed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// TCP keepalive on accepted connections: first probe after 60 s idle, then every 10 s,
/// 6 unanswered probes drop the connection; so a peer that vanished (host down, cable cut)
/// is detected within about 2 minutes even under the idle timeout.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);

/// Interval between TCP keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Unanswered TCP keepalive probes before the kernel drops the connection.
pub const KEEPALIVE_PROBES: u32 = 6;

/// Time a closing connection (shutdown, `QUIT`, a protocol error) gets to flush its last
/// replies before it is dropped anyway.
pub const FLUSH_ON_CLOSE: Duration = Duration::from_secs(2);

/// Longest domain a `CH.*` command may name: 256 bytes (a tenant, user or queue name; it
/// is kept with every hold).
pub const MAX_DOMAIN_LEN: usize = 256;

/// Hold entries (one per resource, domain, groups and state) one connection may have:
/// 1024. A connection holding that many gets an error reply to `CH.RESERVE` (and to a
/// `CH.SEIZE` that would pass it) until it releases some.
pub const MAX_HOLDS_PER_CONNECTION: usize = 1024;

/// Hold entries across every connection and pending transfer: 100 000, about 40 MB at
/// the longest domains. Past it, reservations needing a new entry get an error reply.
pub const MAX_HOLDS: usize = 100_000;

/// Pending transfers (`CH.TRANSFER` not yet seized nor expired): 65 536.
pub const MAX_TRANSFERS: usize = 65_536;

/// The longest a transfer waits to be seized: one day.
pub const MAX_TRANSFER_TTL: Duration = Duration::from_secs(86_400);
