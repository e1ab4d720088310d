//! The Redis built-in commands the limiter API answers so that unchanged Redis clients
//! and tools work: `PING`, `ECHO`, `QUIT`, `SELECT`, `CONFIG`, `TIME`, `HELLO`, `CLIENT`,
//! `INFO` and `COMMAND` (the last from the table, `super::table`).

use super::auth;
use super::command::{Ctx, Outcome};
use super::reply::{Quoted, Reply};
use super::resp::Args;
use super::smyte;
use super::table::{Spec, COMMANDS};

pub(super) fn ping(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
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

pub(super) fn echo(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    cx.out.bulk(args.at(1));
    Outcome::Ok
}

pub(super) fn quit(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
    cx.out.ok();
    Outcome::Close
}

pub(super) fn select(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    match std::str::from_utf8(args.at(1)).ok().map(str::parse::<i64>) {
        Some(Ok(0)) => {
            cx.out.ok();
            Outcome::Ok
        }
        Some(Ok(_)) => cx.error(format_args!("ERR DB index is out of range")),
        _ => cx.error(format_args!("ERR value is not an integer or out of range")),
    }
}

pub(super) fn config(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    if args.at(1).eq_ignore_ascii_case(b"GET") && args.len() >= 3 {
        cx.out.map(0);
        return Outcome::Ok;
    }
    cx.error(format_args!(
        "ERR unknown subcommand '{}'. The limiter API is configured in tollgate's YAML; only CONFIG GET is answered (with nothing).",
        Quoted(args.at(1))
    ))
}

pub(super) fn time(cx: &mut Ctx<'_>, _: &Args<'_>) -> Outcome {
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

pub(super) fn hello(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
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

pub(super) fn client(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
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

pub(super) fn info(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
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

pub(super) fn command(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
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
