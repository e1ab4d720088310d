//! The command table, per-connection state and dispatch.
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
use super::charon;
use super::holds::Ledger;
use super::multi::{self, Exec, Transaction};
use super::reply::{Quoted, Reply};
use super::resp::Args;
use super::service::ApiService;
use super::smyte;
use crate::runtime::Runtime;

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

/// A command's handler: runs on a command whose arity has been checked.
pub type Handler = fn(&mut Ctx<'_>, &Args<'_>) -> Outcome;

/// One documented argument of a command, for `COMMAND DOCS` (which `redis-cli` turns
/// into typing hints).
#[derive(Debug, Clone, Copy)]
pub struct ArgDoc {
    /// The argument's name.
    pub name: &'static str,
    /// Its Redis type: `key`, `integer`, `string`, `unix-time` or `pure-token`.
    pub kind: &'static str,
    /// The keyword before it (`TAKE n`), if any.
    pub token: Option<&'static str>,
    /// Whether it may be left out.
    pub optional: bool,
    /// Whether it may repeat.
    pub multiple: bool,
}

const fn arg(name: &'static str, kind: &'static str) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
    }
}

const fn opt(name: &'static str, kind: &'static str) -> ArgDoc {
    ArgDoc {
        optional: true,
        ..arg(name, kind)
    }
}

const fn opt_token(token: &'static str, name: &'static str, kind: &'static str) -> ArgDoc {
    ArgDoc {
        token: Some(token),
        ..opt(name, kind)
    }
}

/// One command: its identity, documentation and handler.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The name clients send, upper case (matching is case-insensitive).
    pub name: &'static str,
    /// The name in metrics and `COMMAND` replies, lower case.
    pub label: &'static str,
    /// Redis arity: `n > 0` exactly n arguments (name included), `n < 0` at least `-n`.
    pub arity: i64,
    /// Redis command flags (`write`, `readonly`, `fast`, ...).
    pub flags: &'static [&'static str],
    /// Position of the first key argument (0: none), for cluster-aware clients.
    pub first_key: i64,
    /// Position of the last key argument.
    pub last_key: i64,
    /// Step between key arguments.
    pub key_step: i64,
    /// ACL categories (`@fast`, ...), informational.
    pub acl: &'static [&'static str],
    /// The group `COMMAND DOCS` files it under.
    pub group: &'static str,
    /// One line saying what it does.
    pub summary: &'static str,
    /// Time complexity.
    pub complexity: &'static str,
    /// Its arguments, in order.
    pub args: &'static [ArgDoc],
    /// What runs it.
    pub run: Handler,
}

impl Spec {
    /// Whether `argc` arguments (the name included) fit the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = argc as i64;
        if self.arity > 0 {
            argc == self.arity
        } else {
            argc >= -self.arity
        }
    }
}

/// A connection command (`MULTI`, `AUTH`, ...): no key, O(1).
const fn conn(
    name: &'static str,
    label: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    run: Handler,
) -> Spec {
    Spec {
        name,
        label,
        arity,
        flags,
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "",
        complexity: "O(1)",
        args: &[],
        run,
    }
}

const fn ch(name: &'static str, label: &'static str, arity: i64) -> Spec {
    Spec {
        name,
        label,
        arity,
        flags: &["write", "fast"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@write", "@fast"],
        group: "tollgate",
        summary: "",
        complexity: "O(1)",
        args: &[],
        run: charon::request,
    }
}

/// The arguments every `CH.*` command on copies starts with.
const RESOURCE: ArgDoc = arg("resource", "string");
const DOMAIN: ArgDoc = arg("domain", "string");
const COPIES: ArgDoc = arg("copies", "integer");
const GROUPS: ArgDoc = ArgDoc {
    multiple: true,
    ..opt_token("GROUPS", "group", "string")
};

/// `RL.REDUCE`, which `RL.PREDUCE` copies.
const REDUCE: Spec = Spec {
    name: "RL.REDUCE",
    label: "rl.reduce",
    arity: -4,
    flags: &["write", "fast"],
    first_key: 1,
    last_key: 1,
    key_step: 1,
    acl: &["@write", "@fast"],
    group: "tollgate",
    summary: "Takes tokens from an ad-hoc token bucket; replies the tokens it held before the take, which happened iff the reply is at least the take.",
    complexity: "O(1)",
    args: &[
        arg("key", "key"),
        arg("max", "integer"),
        arg("refill_seconds", "integer"),
        opt_token("REFILL", "amount", "integer"),
        opt_token("TAKE", "n", "integer"),
        opt_token("AT", "unix_seconds", "unix-time"),
        opt_token("STRICT", "strict", "pure-token"),
    ],
    run: smyte::reduce,
};

/// `RL.GET`, which `RL.PGET` copies.
const GET: Spec = Spec {
    name: "RL.GET",
    label: "rl.get",
    arity: -4,
    flags: &["readonly", "fast"],
    first_key: 1,
    last_key: 1,
    key_step: 1,
    acl: &["@read", "@fast"],
    group: "tollgate",
    summary: "Replies the tokens an ad-hoc token bucket holds, without taking any.",
    complexity: "O(1)",
    args: &[
        arg("key", "key"),
        arg("max", "integer"),
        arg("refill_seconds", "integer"),
        opt_token("REFILL", "amount", "integer"),
        opt_token("AT", "unix_seconds", "unix-time"),
    ],
    run: smyte::get,
};

/// Every command the API answers; the index is the metrics slot, and [`COMMANDS`]`.len()`
/// is the slot of `other`. The limiter commands come first: dispatch scans in order.
pub static COMMANDS: [Spec; 25] = [
    REDUCE,
    GET,
    Spec {
        name: "RL.PREDUCE",
        label: "rl.preduce",
        summary: "RL.REDUCE with its times in milliseconds: refill_ms and AT in Unix milliseconds (Smyte's RL.PREDUCE).",
        args: &[
            arg("key", "key"),
            arg("max", "integer"),
            arg("refill_ms", "integer"),
            opt_token("REFILL", "amount", "integer"),
            opt_token("TAKE", "n", "integer"),
            opt_token("AT", "unix_ms", "unix-time"),
            opt_token("STRICT", "strict", "pure-token"),
        ],
        run: smyte::preduce,
        ..REDUCE
    },
    Spec {
        name: "RL.PGET",
        label: "rl.pget",
        summary: "RL.GET with its times in milliseconds: refill_ms and AT in Unix milliseconds (Smyte's RL.PGET).",
        args: &[
            arg("key", "key"),
            arg("max", "integer"),
            arg("refill_ms", "integer"),
            opt_token("REFILL", "amount", "integer"),
            opt_token("AT", "unix_ms", "unix-time"),
        ],
        run: smyte::pget,
        ..GET
    },
    Spec {
        summary: "Takes the largest count in [MIN, copies] that a rate-like resource (token_bucket, rate, sliding_log, tiered) has room for, or none; replies the grant with the limits that decided it.",
        args: &[RESOURCE, DOMAIN, COPIES, opt_token("MIN", "n", "integer")],
        run: charon::request,
        ..ch("CH.REQUEST", "ch.request", -4)
    },
    Spec {
        summary: "Holds the largest count in [MIN, copies] of a concurrency resource that the domain, global and group limits have room for, until released or the connection ends; replies the groups they were taken from.",
        args: &[RESOURCE, DOMAIN, COPIES, opt_token("MIN", "n", "integer")],
        run: charon::reserve,
        ..ch("CH.RESERVE", "ch.reserve", -4)
    },
    Spec {
        summary: "Gives back copies this connection holds (in the groups named, if any); releasing more than is held is an error and changes nothing.",
        args: &[RESOURCE, DOMAIN, COPIES, GROUPS],
        run: charon::release,
        ..ch("CH.RELEASE", "ch.release", -4)
    },
    Spec {
        summary: "Moves held copies out of this connection under a transfer id, for CH.SEIZE on another connection within ttl_seconds; unseized, they are released.",
        args: &[RESOURCE, DOMAIN, COPIES, arg("ttl_seconds", "double"), GROUPS],
        run: charon::transfer,
        ..ch("CH.TRANSFER", "ch.transfer", -5)
    },
    Spec {
        summary: "Takes over the copies of a pending transfer: this connection holds them from now on.",
        args: &[arg("transfer_id", "string")],
        run: charon::seize,
        ..ch("CH.SEIZE", "ch.seize", 2)
    },
    Spec {
        summary: "Logs the connection in with the password of api.password_file (user `default`, the only one).",
        args: &[opt("username", "string"), arg("password", "string")],
        ..conn("AUTH", "auth", -2, &["fast", "stale", "no-auth"], auth::auth)
    },
    Spec {
        summary: "Starts a transaction: the commands that follow are queued, and run at EXEC.",
        ..conn("MULTI", "multi", 1, &["fast", "stale"], multi::multi)
    },
    Spec {
        summary: "Runs the queued commands of a transaction and replies their replies; EXECABORT if one was refused when queued.",
        complexity: "O(N) where N is the number of queued commands",
        ..conn("EXEC", "exec", 1, &["stale"], multi::exec)
    },
    Spec {
        summary: "Drops the queued commands of a transaction.",
        ..conn("DISCARD", "discard", 1, &["fast", "stale"], multi::discard)
    },
    Spec {
        summary: "Refused: the limiter API has no keys to watch, and a transaction always runs.",
        args: &[ArgDoc {
            multiple: true,
            ..arg("key", "key")
        }],
        ..conn("WATCH", "watch", -2, &["fast", "stale"], multi::watch)
    },
    Spec {
        summary: "Forgets watched keys: there are none, so it only replies OK.",
        ..conn("UNWATCH", "unwatch", 1, &["fast", "stale"], multi::unwatch)
    },
    Spec {
        name: "PING",
        label: "ping",
        arity: -1,
        flags: &["fast", "stale", "no-auth"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "Returns the server's liveliness response.",
        complexity: "O(1)",
        args: &[opt("message", "string")],
        run: ping,
    },
    Spec {
        name: "ECHO",
        label: "echo",
        arity: 2,
        flags: &["fast", "stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "Returns the given string.",
        complexity: "O(1)",
        args: &[arg("message", "string")],
        run: echo,
    },
    Spec {
        name: "HELLO",
        label: "hello",
        arity: -1,
        flags: &["fast", "stale", "no-auth"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "Handshakes with the server: switches the protocol (2 or 3), replies server information.",
        complexity: "O(1)",
        args: &[
            opt("protover", "integer"),
            opt_token("AUTH", "username password", "string"),
            opt_token("SETNAME", "clientname", "string"),
        ],
        run: hello,
    },
    Spec {
        name: "QUIT",
        label: "quit",
        arity: -1,
        flags: &["fast", "stale", "no-auth"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "Closes the connection.",
        complexity: "O(1)",
        args: &[],
        run: quit,
    },
    Spec {
        name: "SELECT",
        label: "select",
        arity: 2,
        flags: &["fast", "stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast", "@connection"],
        group: "connection",
        summary: "Selects database 0, the only one.",
        complexity: "O(1)",
        args: &[arg("index", "integer")],
        run: select,
    },
    Spec {
        name: "CLIENT",
        label: "client",
        arity: -2,
        flags: &["stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@slow", "@connection"],
        group: "connection",
        summary: "CLIENT SETNAME, GETNAME, ID and SETINFO: what client libraries send.",
        complexity: "O(1)",
        args: &[arg("subcommand", "string"), opt("arg", "string")],
        run: client,
    },
    Spec {
        name: "INFO",
        label: "info",
        arity: -1,
        flags: &["stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@slow"],
        group: "server",
        summary: "Returns information and statistics: server, clients, stats, limiter.",
        complexity: "O(1)",
        args: &[ArgDoc {
            multiple: true,
            ..opt("section", "string")
        }],
        run: info,
    },
    Spec {
        name: "COMMAND",
        label: "command",
        arity: -1,
        flags: &["stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@slow", "@connection"],
        group: "server",
        summary: "Describes the commands: COMMAND, COMMAND COUNT, COMMAND DOCS, COMMAND INFO, COMMAND LIST.",
        complexity: "O(N) where N is the number of commands",
        args: &[opt("subcommand", "string")],
        run: command,
    },
    Spec {
        name: "CONFIG",
        label: "config",
        arity: -2,
        flags: &["stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@slow"],
        group: "server",
        summary: "CONFIG GET replies no parameters (tools such as redis-benchmark ask); the API is configured in tollgate's YAML.",
        complexity: "O(1)",
        args: &[arg("subcommand", "string"), opt("parameter", "string")],
        run: config,
    },
    Spec {
        name: "TIME",
        label: "time",
        arity: 1,
        flags: &["fast", "stale"],
        first_key: 0,
        last_key: 0,
        key_step: 0,
        acl: &["@fast"],
        group: "server",
        summary: "Returns the server's Unix time (seconds, microseconds): the clock RL.REDUCE uses without AT.",
        complexity: "O(1)",
        args: &[],
        run: time,
    },
];

/// The metrics slot of commands not in the table.
pub const OTHER: usize = COMMANDS.len();

// A session's dirty mask holds one bit per metrics slot.
const _: () = assert!(OTHER < 64);

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

fn ping(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    match args.len() {
        1 => cx.out.simple("PONG"),
        2 => cx.out.bulk(args.at(1)),
        _ => {
            return cx.error(format_args!(
                "ERR wrong number of arguments for 'ping' command"
            ))
        }
    }
    Outcome::Ok
}

fn echo(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    cx.out.bulk(args.at(1));
    Outcome::Ok
}

fn quit(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    cx.out.ok();
    Outcome::Close
}

fn select(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    match std::str::from_utf8(args.at(1)).ok().map(str::parse::<i64>) {
        Some(Ok(0)) => {
            cx.out.ok();
            Outcome::Ok
        }
        Some(Ok(_)) => cx.error(format_args!("ERR DB index is out of range")),
        _ => cx.error(format_args!("ERR value is not an integer or out of range")),
    }
}

fn config(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    if args.at(1).eq_ignore_ascii_case(b"GET") && args.len() >= 3 {
        cx.out.map(0);
        return Outcome::Ok;
    }
    cx.error(format_args!(
        "ERR unknown subcommand '{}'. The limiter API is configured in tollgate's YAML; only CONFIG GET is answered (with nothing).",
        Quoted(args.at(1))
    ))
}

fn time(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    let now = smyte::unix_nanos();
    cx.out.array(2);
    cx.out
        .bulk(itoa::Buffer::new().format(now / 1_000_000_000).as_bytes());
    cx.out.bulk(
        itoa::Buffer::new()
            .format(now % 1_000_000_000 / 1_000)
            .as_bytes(),
    );
    Outcome::Ok
}

/// A client name may not hold blanks or control characters (Redis's rule), since
/// `CLIENT LIST`-style output would break on them.
fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

fn hello(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let mut resp3 = cx.session.resp3;
    let mut i = 1;
    if let Some(version) = args.get(1) {
        match version {
            b"2" => resp3 = false,
            b"3" => resp3 = true,
            _ => {
                if std::str::from_utf8(version)
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_none()
                {
                    return cx.error(format_args!(
                        "ERR Protocol version is not an integer or out of range"
                    ));
                }
                return cx.error(format_args!("NOPROTO unsupported protocol version"));
            }
        }
        i = 2;
    }
    let (mut name, mut credentials) = (None, None);
    while let Some(option) = args.get(i) {
        if option.eq_ignore_ascii_case(b"AUTH") && args.len() > i + 2 {
            credentials = Some((args.at(i + 1), args.at(i + 2)));
            i += 3;
        } else if option.eq_ignore_ascii_case(b"SETNAME") && args.len() > i + 1 {
            let value = args.at(i + 1);
            if !valid_name(value) {
                return cx.error(format_args!(
                    "ERR Client names cannot contain spaces, newlines or special characters."
                ));
            }
            name = Some(value);
            i += 2;
        } else {
            return cx.error(format_args!(
                "ERR Syntax error in HELLO option '{}'",
                Quoted(option)
            ));
        }
    }
    // Credentials first: a HELLO that fails to log in changes nothing (see `auth`).
    match credentials {
        Some((user, pass)) => {
            if let Err(outcome) = auth::login(cx, Some(user), pass) {
                return outcome;
            }
        }
        None if !auth::logged_in(cx) => {
            return cx.error(format_args!("{}", auth::NOAUTH_HELLO));
        }
        None => {}
    }
    if let Some(name) = name {
        cx.session.name = Some(name.into());
    }
    cx.session.resp3 = resp3;
    cx.out.set_resp3(resp3);
    let out = &mut cx.out;
    out.map(7);
    out.text("server");
    out.text("tollgate");
    out.text("version");
    out.text(env!("CARGO_PKG_VERSION"));
    out.text("proto");
    out.int(if resp3 { 3 } else { 2 });
    out.text("id");
    out.int(i64::try_from(cx.session.id).unwrap_or(i64::MAX));
    out.text("mode");
    out.text("standalone");
    out.text("role");
    out.text("master");
    out.text("modules");
    out.array(0);
    Outcome::Ok
}

fn client(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let sub = args.at(1);
    let argc = args.len();
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    if is("SETNAME") && argc == 3 {
        let name = args.at(2);
        if !valid_name(name) {
            return cx.error(format_args!(
                "ERR Client names cannot contain spaces, newlines or special characters."
            ));
        }
        cx.session.name = (!name.is_empty()).then(|| name.into());
        cx.out.ok();
    } else if is("GETNAME") && argc == 2 {
        match &cx.session.name {
            Some(name) => cx.out.bulk(name),
            None => cx.out.null(),
        }
    } else if is("ID") && argc == 2 {
        cx.out.int(i64::try_from(cx.session.id).unwrap_or(i64::MAX));
    } else if is("SETINFO") && argc == 4 {
        // Library name and version (redis-py, redis-rs send them on connect): accepted.
        cx.out.ok();
    } else if ["SETNAME", "GETNAME", "ID", "SETINFO"]
        .iter()
        .any(|n| is(n))
    {
        return cx.error(format_args!(
            "ERR wrong number of arguments for 'client|{}' command",
            Quoted(&sub.to_ascii_lowercase())
        ));
    } else {
        return cx.error(format_args!(
            "ERR unknown subcommand '{}'. Try CLIENT SETNAME, GETNAME, ID or SETINFO.",
            Quoted(sub)
        ));
    }
    Outcome::Ok
}

fn info(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let mut wanted = [false; 4];
    const SECTIONS: [&str; 4] = ["server", "clients", "stats", "limiter"];
    let mut any = false;
    for section in args.iter_from(1) {
        any = true;
        if [&b"all"[..], b"default", b"everything"]
            .iter()
            .any(|s| s.eq_ignore_ascii_case(section))
        {
            wanted = [true; 4];
        }
        for (i, name) in SECTIONS.iter().enumerate() {
            wanted[i] |= section.eq_ignore_ascii_case(name.as_bytes());
        }
    }
    if !any {
        wanted = [true; 4];
    }
    let text = cx.service.info(wanted);
    cx.out.bulk(text.as_bytes());
    Outcome::Ok
}

fn command(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let sub = args.at(1);
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    let named = |a: &[u8]| {
        COMMANDS
            .iter()
            .find(|s| s.name.as_bytes().eq_ignore_ascii_case(a))
    };
    if args.len() == 1 {
        cx.out.array(COMMANDS.len());
        for spec in &COMMANDS {
            command_info(&mut cx.out, spec);
        }
    } else if is("COUNT") && args.len() == 2 {
        cx.out.int(COMMANDS.len() as i64);
    } else if is("LIST") && args.len() == 2 {
        cx.out.array(COMMANDS.len());
        for spec in &COMMANDS {
            cx.out.text(spec.label);
        }
    } else if is("INFO") {
        let names: Vec<&[u8]> = args.iter_from(2).collect();
        if names.is_empty() {
            cx.out.array(COMMANDS.len());
            COMMANDS.iter().for_each(|s| command_info(&mut cx.out, s));
        } else {
            cx.out.array(names.len());
            for name in names {
                match named(name) {
                    Some(spec) => command_info(&mut cx.out, spec),
                    None => cx.out.null(),
                }
            }
        }
    } else if is("DOCS") {
        let specs: Vec<&Spec> = if args.len() == 2 {
            COMMANDS.iter().collect()
        } else {
            args.iter_from(2).filter_map(named).collect()
        };
        cx.out.map(specs.len());
        for spec in specs {
            cx.out.text(spec.label);
            command_docs(&mut cx.out, spec);
        }
    } else {
        return cx.error(format_args!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try COMMAND COUNT, DOCS, INFO or LIST.",
            Quoted(sub)
        ));
    }
    Outcome::Ok
}

/// A command's `COMMAND INFO` entry, in Redis 7's ten-field layout.
fn command_info(out: &mut Reply<'_>, spec: &Spec) {
    out.array(10);
    out.text(spec.label);
    out.int(spec.arity);
    out.array(spec.flags.len());
    spec.flags.iter().for_each(|f| out.simple(f));
    out.int(spec.first_key);
    out.int(spec.last_key);
    out.int(spec.key_step);
    out.array(spec.acl.len());
    spec.acl.iter().for_each(|c| out.simple(c));
    out.array(0); // tips
    out.array(0); // key specifications
    out.array(0); // subcommands
}

/// A command's `COMMAND DOCS` entry.
fn command_docs(out: &mut Reply<'_>, spec: &Spec) {
    out.map(5);
    out.text("summary");
    out.text(spec.summary);
    out.text("since");
    out.text("0.1.0");
    out.text("group");
    out.text(spec.group);
    out.text("complexity");
    out.text(spec.complexity);
    out.text("arguments");
    out.array(spec.args.len());
    for a in spec.args {
        let flags = usize::from(a.optional) + usize::from(a.multiple);
        out.map(2 + usize::from(a.token.is_some()) + usize::from(flags > 0));
        out.text("name");
        out.text(a.name);
        out.text("type");
        out.text(a.kind);
        if let Some(token) = a.token {
            out.text("token");
            out.text(token);
        }
        if flags > 0 {
            out.text("flags");
            out.array(flags);
            if a.optional {
                out.simple("optional");
            }
            if a.multiple {
                out.simple("multiple");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_upper_case_and_labels_match() {
        for (i, spec) in COMMANDS.iter().enumerate() {
            assert_eq!(spec.name.to_ascii_lowercase(), spec.label);
            assert_eq!(spec.name.to_ascii_uppercase(), spec.name);
            assert!(COMMANDS[..i].iter().all(|s| s.name != spec.name));
        }
    }
}
