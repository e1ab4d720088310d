//! Transactions: `MULTI`, `EXEC`, `DISCARD`, `WATCH` and `UNWATCH`, as Redis runs them.
//!
//! After `MULTI`, every command but `EXEC`, `DISCARD`, `MULTI`, `WATCH` and `QUIT` is
//! checked and queued (`+QUEUED`), and runs only at `EXEC`, which replies an array of
//! their replies, in order; `DISCARD` drops the queue. A command refused while queueing
//! (unknown, wrong arity, bad arguments, `NOAUTH`, or one past the queue's bounds) gets its
//! error at once and marks the transaction: `EXEC` then runs nothing and replies
//! `-EXECABORT`, so a client whose transaction had a mistake in it has spent nothing, and
//! may fix it and retry. Client libraries send transactions this way: redis-py's
//! `pipeline()` (`transaction=True` by default), ioredis' `multi()`, redis-rs'
//! `pipe().atomic()`.
//!
//! **What is checked when queued.** Redis checks only the name and the arity then, and
//! reports bad arguments in `EXEC`'s array after the commands before them ran. Here the
//! arguments of the limiter commands (`RL.*`, and `CH.REQUEST` and `CH.RESERVE`, the ones
//! that take) are parsed when queued too, so a typo in one aborts the whole transaction
//! instead of leaving the others' tokens taken. What only running can tell (an unknown
//! resource, a store's bounds, a release of more than is held) is still an error in
//! `EXEC`'s array, in its command's place, as in Redis: the other commands ran.
//!
//! **Atomicity.** `EXEC` runs the queued commands one after another, before anything else
//! on this connection. A command decided in-process runs without yielding, so a
//! transaction of such commands runs as one step of the API's thread: no other
//! connection's command comes between them. A command that waits on a Redis store yields
//! while it waits, as any store call does, so another connection's commands may run then.
//!
//! **`WATCH`** is refused: the API's state is not keys a client reads and writes back, so
//! there is nothing to watch, and a transaction always runs. `UNWATCH` is accepted (there
//! is nothing to forget), as client libraries send it when they reset a connection.
//!
//! **Bounds.** A queue holds at most [`MAX_QUEUED_COMMANDS`] commands and
//! [`MAX_QUEUED_BYTES`] bytes; the command past either is refused and marks the
//! transaction. A marked transaction keeps nothing more (commands are still answered
//! `+QUEUED`, as Redis does, but not stored), so its memory stays bounded whatever follows.

use super::bounds::{MAX_QUEUED_BYTES, MAX_QUEUED_COMMANDS};
use super::charon;
use super::command::{Ctx, Outcome, Spec};
use super::resp::Args;
use super::smyte::{self, Unit};

/// Bytes a queued argument costs besides its own: its `(start, end)` in the queue.
const PER_ARG: usize = 16;

/// The commands of a transaction, copied out of the parser.
#[derive(Debug, Default)]
pub struct Queue {
    /// Every queued argument, concatenated.
    data: Vec<u8>,
    /// Each argument's `(start, end)` in `data`.
    args: Vec<(usize, usize)>,
    /// Each command's `(first, end)` in `args`.
    commands: Vec<(usize, usize)>,
}

impl Queue {
    /// Queued commands.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// The queue's size as its bound counts it.
    fn bytes(&self) -> usize {
        self.data.len() + self.args.len() * PER_ARG
    }

    /// Copies `args` to the end of the queue, or says which bound it would pass.
    fn push(&mut self, args: &Args<'_>) -> Result<(), &'static str> {
        if self.commands.len() >= MAX_QUEUED_COMMANDS {
            return Err("commands");
        }
        let size: usize = args.iter_from(0).map(|a| a.len() + PER_ARG).sum();
        if self.bytes() + size > MAX_QUEUED_BYTES {
            return Err("bytes");
        }
        let first = self.args.len();
        for a in args.iter_from(0) {
            let start = self.data.len();
            self.data.extend_from_slice(a);
            self.args.push((start, self.data.len()));
        }
        self.commands.push((first, self.args.len()));
        Ok(())
    }

    /// Command `i`'s arguments.
    pub fn get(&self, i: usize) -> Option<Args<'_>> {
        let &(first, end) = self.commands.get(i)?;
        Some(Args::from_parts(&self.data, self.args.get(first..end)?))
    }
}

/// An open transaction: what `MULTI` started and `EXEC` or `DISCARD` ends.
#[derive(Debug, Default)]
pub struct Transaction {
    queue: Queue,
    /// A command was refused while queueing: `EXEC` runs nothing.
    aborted: bool,
}

/// A transaction `EXEC` is running: its queue and the next command to run.
#[derive(Debug)]
pub struct Exec {
    /// The commands.
    pub queue: Queue,
    /// The index of the next one to run.
    pub next: usize,
}

/// Whether `spec` runs at once inside a transaction rather than being queued.
pub fn runs_inside(spec: &Spec) -> bool {
    matches!(spec.name, "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "QUIT")
}

/// Marks the open transaction, if any, so that `EXEC` aborts it: a command was refused
/// before it could be queued (`NOAUTH`).
pub fn abort(cx: &mut Ctx<'_>) {
    if let Some(tx) = cx.session.multi.as_mut() {
        tx.aborted = true;
        tx.queue = Queue::default();
    }
}

/// Queues a command inside a transaction (`spec`: its table entry, `None` if unknown):
/// `+QUEUED`, or its error, which aborts the transaction.
pub fn enqueue(cx: &mut Ctx<'_>, spec: Option<&Spec>, args: &Args<'_>) -> Outcome {
    let refused = match spec {
        None => Some(super::command::unknown_message(args)),
        Some(spec) if !spec.arity_ok(args.len()) => Some(format!(
            "ERR wrong number of arguments for '{}' command",
            spec.label
        )),
        Some(spec) => check(spec, args).err(),
    };
    if let Some(message) = refused {
        abort(cx);
        return cx.error(format_args!("{message}"));
    }
    let Some(tx) = cx.session.multi.as_mut() else {
        return cx.error(format_args!(
            "ERR internal error: no transaction to queue in"
        ));
    };
    if !tx.aborted {
        if let Err(bound) = tx.queue.push(args) {
            abort(cx);
            let limit = match bound {
                "commands" => format!("{MAX_QUEUED_COMMANDS} commands"),
                _ => format!("{MAX_QUEUED_BYTES} bytes"),
            };
            return cx.error(format_args!(
                "ERR transaction too large: a transaction queues at most {limit}; it is discarded"
            ));
        }
    }
    cx.out.simple("QUEUED");
    Outcome::Ok
}

/// The arguments' check of the commands that take (module doc): the error a command would
/// reply for them when run.
fn check(spec: &Spec, args: &Args<'_>) -> Result<(), String> {
    let bucket = |reduce, unit| smyte::parse(args, reduce, unit).map(drop);
    let result = match spec.name {
        "RL.REDUCE" => bucket(true, Unit::Seconds),
        "RL.GET" => bucket(false, Unit::Seconds),
        "RL.PREDUCE" => bucket(true, Unit::Millis),
        "RL.PGET" => bucket(false, Unit::Millis),
        "CH.REQUEST" | "CH.RESERVE" => {
            return charon::parse_ask(args, spec.name)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        _ => Ok(()),
    };
    result.map_err(|e| e.to_string())
}

/// `MULTI`: opens a transaction.
pub fn multi(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    if cx.session.multi.is_some() {
        // As in Redis: an error, and the open transaction goes on unharmed.
        return cx.error(format_args!("ERR MULTI calls can not be nested"));
    }
    cx.session.multi = Some(Transaction::default());
    cx.out.ok();
    Outcome::Ok
}

/// `EXEC`: runs the queued commands (the connection runs them, see `conn`) and replies
/// their replies as one array; or `-EXECABORT` if one was refused while queueing.
pub fn exec(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    let Some(tx) = cx.session.multi.take() else {
        return cx.error(format_args!("ERR EXEC without MULTI"));
    };
    if tx.aborted {
        return cx.error(format_args!(
            "EXECABORT Transaction discarded because of previous errors."
        ));
    }
    cx.out.array(tx.queue.len());
    if !tx.queue.is_empty() {
        cx.session.exec = Some(Exec {
            queue: tx.queue,
            next: 0,
        });
    }
    Outcome::Ok
}

/// `DISCARD`: drops the open transaction.
pub fn discard(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    if cx.session.multi.take().is_none() {
        return cx.error(format_args!("ERR DISCARD without MULTI"));
    }
    cx.out.ok();
    Outcome::Ok
}

/// `WATCH`: refused (module doc).
pub fn watch(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    if cx.session.multi.is_some() {
        return cx.error(format_args!("ERR WATCH inside MULTI is not allowed"));
    }
    cx.error(format_args!(
        "ERR WATCH is not supported by the limiter API: it has no keys to watch, and MULTI ... EXEC always runs"
    ))
}

/// `UNWATCH`: nothing is watched, so nothing to forget.
pub fn unwatch(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    cx.out.ok();
    Outcome::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resp::Parser;
    use bytes::BytesMut;

    fn push(q: &mut Queue, line: &str) -> Result<(), &'static str> {
        let mut p = Parser::new();
        let mut buf = BytesMut::from(format!("{line}\r\n").as_bytes());
        assert!(p.parse(&mut buf).unwrap());
        q.push(&p.args())
    }

    fn words(args: Args<'_>) -> Vec<String> {
        args.iter_from(0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    #[test]
    fn a_queue_gives_back_its_commands_in_order() {
        let mut q = Queue::default();
        push(&mut q, "RL.REDUCE k 2 60").unwrap();
        push(&mut q, "PING").unwrap();
        push(&mut q, "ECHO ''").unwrap();
        assert_eq!(q.len(), 3);
        assert_eq!(words(q.get(0).unwrap()), ["RL.REDUCE", "k", "2", "60"]);
        assert_eq!(words(q.get(1).unwrap()), ["PING"]);
        assert_eq!(words(q.get(2).unwrap()), ["ECHO", ""]);
        assert!(q.get(3).is_none());
    }

    #[test]
    fn a_queue_is_bounded_in_commands_and_bytes() {
        let mut q = Queue::default();
        for _ in 0..MAX_QUEUED_COMMANDS {
            push(&mut q, "PING").unwrap();
        }
        assert_eq!(push(&mut q, "PING"), Err("commands"));
        let mut q = Queue::default();
        let big = "x".repeat(60_000);
        let mut pushed = 0;
        while push(&mut q, &format!("ECHO {big}")).is_ok() {
            pushed += 1;
        }
        assert_eq!(pushed, MAX_QUEUED_BYTES / (60_000 + 4 + 2 * PER_ARG));
        assert!(q.bytes() <= MAX_QUEUED_BYTES);
        assert_eq!(push(&mut q, &format!("ECHO {big}")), Err("bytes"));
        // Empty arguments cost their place.
        let mut q = Queue::default();
        let empties = vec!["''"; 1000].join(" ");
        let mut n = 0;
        while push(&mut q, &format!("ECHO {empties}")).is_ok() {
            n += 1;
        }
        assert!(
            n < MAX_QUEUED_COMMANDS && q.bytes() <= MAX_QUEUED_BYTES,
            "{n}"
        );
    }
}
