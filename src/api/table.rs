//! The command table: every command the limiter API answers, as one [`Spec`] in
//! [`COMMANDS`] (its name, Redis-style arity, the documentation that `COMMAND` and
//! `COMMAND DOCS` serve, and its handler). Dispatch (`super::command`) scans it in order;
//! a command's index in it is its metrics slot, [`OTHER`] the slot of every other name.

use super::builtin;
use super::command::{Ctx, Outcome};
use super::resp::Args;
use super::{auth, charon, multi, smyte};

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

/// A server command (`INFO`, `CONFIG`, ...): `spec`, a connection command, filed under
/// `server` and `@slow`.
const fn server(spec: Spec) -> Spec {
    Spec {
        acl: &["@slow"],
        group: "server",
        ..spec
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

/// The arguments of `RL.REDUCE` (`refill` and `at` name its times' unit).
const fn reduce_args(refill: &'static str, at: &'static str) -> [ArgDoc; 7] {
    [
        arg("key", "key"),
        arg("max", "integer"),
        arg(refill, "integer"),
        opt_token("REFILL", "amount", "integer"),
        opt_token("TAKE", "n", "integer"),
        opt_token("AT", at, "unix-time"),
        opt_token("STRICT", "strict", "pure-token"),
    ]
}

/// The arguments of `RL.GET`: `RL.REDUCE`'s without `TAKE` and `STRICT`.
const fn get_args(refill: &'static str, at: &'static str) -> [ArgDoc; 5] {
    let r = reduce_args(refill, at);
    [r[0], r[1], r[2], r[3], r[5]]
}

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
    args: &reduce_args("refill_seconds", "unix_seconds"),
    run: smyte::reduce,
};

/// `RL.GET`, which `RL.PGET` copies.
const GET: Spec = Spec {
    name: "RL.GET",
    label: "rl.get",
    flags: &["readonly", "fast"],
    acl: &["@read", "@fast"],
    summary: "Replies the tokens an ad-hoc token bucket holds, without taking any.",
    args: &get_args("refill_seconds", "unix_seconds"),
    run: smyte::get,
    ..REDUCE
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
        args: &reduce_args("refill_ms", "unix_ms"),
        run: smyte::preduce,
        ..REDUCE
    },
    Spec {
        name: "RL.PGET",
        label: "rl.pget",
        summary: "RL.GET with its times in milliseconds: refill_ms and AT in Unix milliseconds (Smyte's RL.PGET).",
        args: &get_args("refill_ms", "unix_ms"),
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
        summary: "Returns the server's liveliness response.",
        args: &[opt("message", "string")],
        ..conn("PING", "ping", -1, &["fast", "stale", "no-auth"], builtin::ping)
    },
    Spec {
        summary: "Returns the given string.",
        args: &[arg("message", "string")],
        ..conn("ECHO", "echo", 2, &["fast", "stale"], builtin::echo)
    },
    Spec {
        summary: "Handshakes with the server: switches the protocol (2 or 3), replies server information.",
        args: &[
            opt("protover", "integer"),
            opt_token("AUTH", "username password", "string"),
            opt_token("SETNAME", "clientname", "string"),
        ],
        ..conn("HELLO", "hello", -1, &["fast", "stale", "no-auth"], builtin::hello)
    },
    Spec {
        summary: "Closes the connection.",
        ..conn("QUIT", "quit", -1, &["fast", "stale", "no-auth"], builtin::quit)
    },
    Spec {
        summary: "Selects database 0, the only one.",
        args: &[arg("index", "integer")],
        ..conn("SELECT", "select", 2, &["fast", "stale"], builtin::select)
    },
    Spec {
        acl: &["@slow", "@connection"],
        summary: "CLIENT SETNAME, GETNAME, ID and SETINFO: what client libraries send.",
        args: &[arg("subcommand", "string"), opt("arg", "string")],
        ..conn("CLIENT", "client", -2, &["stale"], builtin::client)
    },
    Spec {
        summary: "Returns information and statistics: server, clients, stats, limiter.",
        args: &[ArgDoc {
            multiple: true,
            ..opt("section", "string")
        }],
        ..server(conn("INFO", "info", -1, &["stale"], builtin::info))
    },
    Spec {
        acl: &["@slow", "@connection"],
        summary: "Describes the commands: COMMAND, COMMAND COUNT, COMMAND DOCS, COMMAND INFO, COMMAND LIST.",
        complexity: "O(N) where N is the number of commands",
        args: &[opt("subcommand", "string")],
        ..server(conn("COMMAND", "command", -1, &["stale"], builtin::command))
    },
    Spec {
        summary: "CONFIG GET replies no parameters (tools such as redis-benchmark ask); the API is configured in tollgate's YAML.",
        args: &[arg("subcommand", "string"), opt("parameter", "string")],
        ..server(conn("CONFIG", "config", -2, &["stale"], builtin::config))
    },
    Spec {
        acl: &["@fast"],
        summary: "Returns the server's Unix time (seconds, microseconds): the clock RL.REDUCE uses without AT.",
        ..server(conn("TIME", "time", 1, &["fast", "stale"], builtin::time))
    },
];

/// The metrics slot of commands not in the table.
pub const OTHER: usize = COMMANDS.len();

// A session's dirty mask holds one bit per metrics slot.
const _: () = assert!(OTHER < 64);

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
