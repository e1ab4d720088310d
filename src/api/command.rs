//! Per-connection state and dispatch of the command table (`super::table`).
//!
//! Every command is one [`Spec`] in [`COMMANDS`]: its name, Redis-style arity, the
//! documentation that `COMMAND` and `COMMAND DOCS` serve, and its handler. Dispatch finds
//! the spec (case-insensitive), checks the arity, runs the handler and counts the outcome
//! in `tollgate_api_commands_total{command,result}`, whose `command` label is the spec's
//! name or `other`, so the label stays bounded whatever clients send.
//!
//! A handler gets a [`Ctx`]: the shared [`ApiService`], the live [`Runtime`] (read once per
//! batch of commands), the connection's [`Session`] and a [`Reply`] writer. Charon's `CH.*`
//! handlers record what they reserve in the session's [`Ledger`], which releases it when
//! the connection ends.
//!
//! **Waiting on a store.** A command decided in-process runs to completion at once. One
//! that must ask a shared store (an `RL.*` bucket on a Redis `api.store`, a resource in a
//! Redis store) hands back a [`Deferred`]: a future owning what it needs, which the
//! connection awaits (bounded by the store's budget) before it runs the next command, so
//! replies stay in order; its result then writes the reply.

use std::fmt::{self, Write as _};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use bytes::BytesMut;

use super::auth;
use super::ledger::Ledger;
use super::multi::{self, Exec, Transaction};
use super::reply::{Quoted, Reply};
use super::resp::Args;
use super::service::ApiService;
use crate::runtime::Runtime;

pub use super::table::{Spec, COMMANDS, OTHER};

/// What a command's execution means for its connection and its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done; counted `ok`.
    Ok,
    /// A limiter said no (`RL.REDUCE` took nothing); counted `rejected`.
    Rejected,
    /// An error reply was sent; counted `error`.
    Error,
    /// Done, and the connection closes once the reply is flushed (`QUIT`); counted `ok`.
    Close,
    /// Waiting on a store: the handler left a [`Deferred`] in its context, whose result
    /// writes the reply and says the outcome; counted then.
    Deferred,
}

/// What runs once a deferred command's store call is done: writes the reply, records what
/// was taken, and says the outcome.
pub type Finish = Box<dyn FnOnce(&mut Ctx<'_>) -> Outcome + Send>;

/// A command waiting on a store (module doc).
pub struct Deferred {
    /// The store call (bounded by the store's budget), then what finishes the command.
    pub work: Pin<Box<dyn Future<Output = Finish> + Send>>,
}

impl Deferred {
    /// A command that finishes with what `work` produces.
    pub fn new(work: impl Future<Output = Finish> + Send + 'static) -> Self {
        Self {
            work: Box::pin(work),
        }
    }
}

/// The `result` label values, in counter order.
pub const RESULTS: [&str; 3] = ["ok", "rejected", "error"];

/// What a handler works with.
pub struct Ctx<'a> {
    /// The shared service: limiters, config, statistics.
    pub service: &'a ApiService,
    /// The live runtime (resources, stores, kill switch), if the service follows one.
    pub runtime: Option<&'a Runtime>,
    /// This connection's state.
    pub session: &'a mut Session,
    /// Where the reply goes.
    pub out: Reply<'a>,
    /// Where a handler that must wait on a store leaves its work (then it returns
    /// [`Outcome::Deferred`]).
    pub deferred: &'a mut Option<Deferred>,
}

impl Ctx<'_> {
    /// Replies an error (`message` starts with its code, e.g. `ERR`) and returns
    /// [`Outcome::Error`].
    pub fn error(&mut self, message: fmt::Arguments<'_>) -> Outcome {
        self.out.error(message);
        Outcome::Error
    }

    /// Leaves `work` to be awaited and returns [`Outcome::Deferred`].
    pub fn defer(&mut self, work: impl Future<Output = Finish> + Send + 'static) -> Outcome {
        *self.deferred = Some(Deferred::new(work));
        Outcome::Deferred
    }
}

/// One connection's state.
///
/// Its [`Ledger`] holds the copies the connection reserved: a caller that vanishes must not
/// keep capacity forever, so dropping the session releases each hold exactly once, whether
/// the connection ended with `QUIT`, an error, a timeout, a shutdown or a panic.
pub struct Session {
    /// The client ID (`CLIENT ID`, `HELLO`'s `id`), unique in this process.
    pub id: u64,
    /// Whether replies are RESP3 (`HELLO 3`).
    pub resp3: bool,
    /// The name set by `CLIENT SETNAME` or `HELLO ... SETNAME`.
    pub name: Option<Box<[u8]>>,
    /// Copies of resources this connection holds (`CH.RESERVE`, `CH.SEIZE`).
    pub ledger: Ledger,
    /// The peer's address, for log lines only.
    pub peer: Option<SocketAddr>,
    /// Whether the connection gave the password (`AUTH`, `HELLO ... AUTH`); see
    /// [`auth`].
    pub authenticated: bool,
    /// The transaction `MULTI` opened, until `EXEC` or `DISCARD`.
    pub multi: Option<Transaction>,
    /// The transaction `EXEC` is running: its commands run before the next one read.
    pub exec: Option<Exec>,
    /// Commands counted since the last flush to the metrics: `[slot][result]`.
    counts: [[u32; 3]; OTHER + 1],
    /// Bit `slot` set when `counts[slot]` is not all zero.
    dirty: u64,
}

impl Session {
    /// A new connection's state: RESP2, no name, no holds.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            resp3: false,
            name: None,
            ledger: Ledger::default(),
            peer: None,
            authenticated: false,
            multi: None,
            exec: None,
            counts: [[0; 3]; OTHER + 1],
            dirty: 0,
        }
    }

    /// Releases every hold, latest first.
    pub fn release_all(&mut self) {
        self.ledger.release_all();
    }

    /// Adds the counts kept since the last flush to `service`'s metrics. Done once per
    /// batch of commands, so a pipeline of 16 costs one atomic add, not 16.
    pub fn flush_counts(&mut self, service: &ApiService) {
        while self.dirty != 0 {
            let slot = self.dirty.trailing_zeros() as usize;
            self.dirty &= self.dirty - 1;
            for (result, n) in self.counts[slot].iter_mut().enumerate() {
                if *n > 0 {
                    service.count(slot, result, u64::from(*n));
                    *n = 0;
                }
            }
        }
    }

    /// Counts one command of metrics slot `slot` with `outcome` (a deferred command is
    /// counted when it finishes).
    pub fn count(&mut self, slot: usize, outcome: Outcome) {
        let result = match outcome {
            Outcome::Ok | Outcome::Close => 0,
            Outcome::Rejected => 1,
            Outcome::Error => 2,
            Outcome::Deferred => return,
        };
        let n = &mut self.counts[slot][result];
        *n = n.saturating_add(1);
        self.dirty |= 1 << slot;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// Runs one command against `runtime`, writing its reply into `out`. Returns its outcome
/// and, for [`Outcome::Deferred`], the metrics slot to count it in when it finishes and
/// the work to await (see [`finish`]).
pub fn execute(
    service: &ApiService,
    runtime: Option<&Runtime>,
    session: &mut Session,
    args: &Args<'_>,
    out: &mut BytesMut,
) -> (Outcome, Option<(usize, Deferred)>) {
    let name = args.at(0);
    let found = COMMANDS
        .iter()
        .position(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name));
    let spec = found.map(|slot| &COMMANDS[slot]);
    let slot = found.unwrap_or(OTHER);
    let resp3 = session.resp3;
    let mut deferred = None;
    let mut cx = Ctx {
        service,
        runtime,
        session,
        out: Reply::new(out, resp3),
        deferred: &mut deferred,
    };
    let outcome = if !auth::allowed(&cx, spec) {
        // As Redis's rejections, this aborts an open transaction.
        multi::abort(&mut cx);
        cx.error(format_args!("{}", auth::NOAUTH))
    } else if cx.session.multi.is_some() && !spec.is_some_and(multi::runs_inside) {
        multi::enqueue(&mut cx, spec, args)
    } else {
        match spec {
            None => {
                let message = unknown_message(args);
                cx.error(format_args!("{message}"))
            }
            Some(spec) if !spec.arity_ok(args.len()) => cx.error(format_args!(
                "ERR wrong number of arguments for '{}' command",
                spec.label
            )),
            Some(spec) => (spec.run)(&mut cx, args),
        }
    };
    cx.session.count(slot, outcome);
    match (outcome, deferred) {
        (Outcome::Deferred, Some(work)) => (outcome, Some((slot, work))),
        // A handler that said Deferred without leaving work: a bug, answered as an error
        // rather than a silence that would shift every later reply.
        (Outcome::Deferred, None) => {
            let mut out = Reply::new(out, resp3);
            out.error(format_args!("ERR internal error: nothing to wait for"));
            session.count(slot, Outcome::Error);
            (Outcome::Error, None)
        }
        (outcome, _) => (outcome, None),
    }
}

/// Runs the next command of the transaction `EXEC` is running, if any (`None`: there is
/// none, read the next command). The connection calls it before reading each command, so
/// a transaction's commands run in order, before anything sent after `EXEC`, and one that
/// waits on a store resumes the rest once finished.
pub fn resume(
    service: &ApiService,
    runtime: Option<&Runtime>,
    session: &mut Session,
    out: &mut BytesMut,
) -> Option<(Outcome, Option<(usize, Deferred)>)> {
    let mut exec = session.exec.take()?;
    let args = exec.queue.get(exec.next)?;
    exec.next += 1;
    let result = execute(service, runtime, session, &args, out);
    if exec.next < exec.queue.len() {
        session.exec = Some(exec);
    }
    Some(result)
}

/// Redis's reply to an unknown command, quoting at most 8 of its arguments.
pub fn unknown_message(args: &Args<'_>) -> String {
    let mut rest = String::new();
    for a in args.iter_from(1).take(8) {
        let _ = write!(rest, "'{}' ", Quoted(a));
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {rest}",
        Quoted(args.at(0))
    )
}

/// Finishes a deferred command of metrics slot `slot` once its work produced `finish`:
/// writes its reply into `out` and counts it.
pub fn finish(
    service: &ApiService,
    session: &mut Session,
    slot: usize,
    finish: Finish,
    out: &mut BytesMut,
) -> Outcome {
    let resp3 = session.resp3;
    let mut deferred = None;
    let mut cx = Ctx {
        service,
        runtime: None,
        session,
        out: Reply::new(out, resp3),
        deferred: &mut deferred,
    };
    let mut outcome = finish(&mut cx);
    if outcome == Outcome::Deferred {
        // A finish never defers again.
        cx.out.error(format_args!(
            "ERR internal error: a finished command deferred"
        ));
        outcome = Outcome::Error;
    }
    session.count(slot, outcome);
    outcome
}
