//! The limiter API with real clients: the `redis` crate (RESP2 and RESP3) and `redis-cli`
//! against the service on an ephemeral port. `RL.REDUCE` is checked against the
//! contract's model (`common/smyte.rs`), which differs from Smyte's own code on refusals.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::api;
use crate::common::smyte;

use api::{exchange, exchange_until, redis_cli, redis_cli_stdin, ApiServer};
use redis::Value;

fn reduce(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<i64> {
    redis::cmd("RL.REDUCE").arg(args).query(con)
}

fn get(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<i64> {
    redis::cmd("RL.GET").arg(args).query(con)
}

#[test]
fn redis_cli_two_per_minute_replies_two_one_zero() {
    let server = ApiServer::start();
    let got: Vec<String> = (0..3)
        .map(|_| redis_cli(server.port(), &["RL.REDUCE", "TwoPerMin", "2", "60"]))
        .collect();
    assert_eq!(got, ["2\n", "1\n", "0\n"]);
    assert_eq!(
        redis_cli(server.port(), &["RL.GET", "TwoPerMin", "2", "60"]),
        "0\n"
    );
    // Inline commands typed into redis-cli's stdin, quotes and all.
    let out = redis_cli_stdin(
        server.port(),
        &[],
        "PING\nECHO \"a b\"\nRL.REDUCE 'my key' 3 60 TAKE 2\nRL.REDUCE 'my key' 3 60 TAKE 2\n",
    );
    assert_eq!(out, "PONG\na b\n3\n1\n");
}

#[test]
fn ping_echo_select_client_quit_in_resp2() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    let msg: String = redis::cmd("PING").arg("hi").query(&mut con).unwrap();
    assert_eq!(msg, "hi");
    let echo: Vec<u8> = redis::cmd("ECHO")
        .arg(&b"\x00\r\n\xff"[..])
        .query(&mut con)
        .unwrap();
    assert_eq!(echo, b"\x00\r\n\xff");
    let ok: String = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    assert_eq!(ok, "OK");
    let err = redis::cmd("SELECT")
        .arg(1)
        .query::<String>(&mut con)
        .unwrap_err();
    assert_eq!(err.detail(), Some("DB index is out of range"));
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("worker-1")
        .query(&mut con)
        .unwrap();
    let name: String = redis::cmd("CLIENT").arg("GETNAME").query(&mut con).unwrap();
    assert_eq!(name, "worker-1");
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).unwrap();
    assert!(id > 0);
    let err = redis::cmd("CLIENT")
        .arg("KILL")
        .query::<String>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown subcommand 'KILL'"),
        "{err}"
    );
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut con)
        .unwrap();
    assert!(config.is_empty(), "{config:?}");
    let err = redis::cmd("CONFIG")
        .arg("SET")
        .arg("x")
        .arg("y")
        .query::<String>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string().contains("configured in tollgate's YAML"),
        "{err}"
    );
    let time: Vec<String> = redis::cmd("TIME").query(&mut con).unwrap();
    assert!(time[0].parse::<u64>().unwrap() > 1_600_000_000, "{time:?}");

    // QUIT answers OK, then the server closes.
    let mut raw = server.raw();
    let got = exchange(&mut raw, b"QUIT\r\nPING\r\n", 1 << 20);
    assert_eq!(got, b"+OK\r\n", "nothing after QUIT");
}

#[test]
fn hello_3_switches_to_resp3_and_reports_the_server() {
    let server = ApiServer::start();
    let mut con = server.client(true);
    let hello: Value = redis::cmd("HELLO").arg(3).query(&mut con).unwrap();
    let Value::Map(pairs) = hello else {
        panic!("HELLO 3 replies a map, got {hello:?}");
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == Value::BulkString(name.as_bytes().to_vec()))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        field("server"),
        Some(Value::BulkString(b"tollgate".to_vec()))
    );
    assert_eq!(field("proto"), Some(Value::Int(3)));
    assert_eq!(
        field("version"),
        Some(Value::BulkString(
            env!("CARGO_PKG_VERSION").as_bytes().to_vec()
        ))
    );
    // Nulls are RESP3 nulls now.
    let name: Value = redis::cmd("CLIENT").arg("GETNAME").query(&mut con).unwrap();
    assert_eq!(name, Value::Nil);
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("rl.reduce")
        .query(&mut con)
        .unwrap();
    assert!(matches!(&docs, Value::Map(m) if m.len() == 1), "{docs:?}");

    // Over raw TCP: the exact bytes, and HELLO 2 switching back.
    let mut raw = server.raw();
    let got = exchange(&mut raw, b"HELLO 3\r\n", 20);
    assert!(
        got.starts_with(b"%7\r\n$6\r\nserver\r\n$8\r\ntollgate\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let mut raw = server.raw();
    let got = exchange(&mut raw, b"HELLO 2\r\n", 20);
    assert!(got.starts_with(b"*14\r\n"), "{got:?}");
    let got = exchange(&mut raw, b"HELLO 4\r\n", 10);
    assert_eq!(got, b"-NOPROTO unsupported protocol version\r\n");
    let got = exchange_until(
        &mut raw,
        b"HELLO 3 SETNAME w2\r\nCLIENT GETNAME\r\n",
        b"w2\r\n",
    );
    assert!(
        got.ends_with(b"*0\r\n$2\r\nw2\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn info_and_command_serve_what_clients_read() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    for i in 0..3 {
        reduce(&mut con, &[&format!("k{i}"), "5", "60"]).unwrap();
    }
    let info: String = redis::cmd("INFO").query(&mut con).unwrap();
    for needle in [
        "# Server\r\n",
        "redis_version:",
        &format!("tollgate_version:{}\r\n", env!("CARGO_PKG_VERSION")),
        "uptime_in_seconds:",
        "connected_clients:1\r\n",
        "total_commands_processed:",
        "adhoc_keys:3\r\n",
        "adhoc_max_keys:100000\r\n",
        "adhoc_evictions:0\r\n",
    ] {
        assert!(info.contains(needle), "missing {needle:?} in {info}");
    }
    let clients: String = redis::cmd("INFO").arg("clients").query(&mut con).unwrap();
    assert!(
        clients.starts_with("# Clients") && !clients.contains("# Server"),
        "{clients}"
    );
    // redis-py's parser and redis-cli read INFO as `key:value` lines.
    let processed: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(processed >= 3, "{processed}");

    let count: i64 = redis::cmd("COMMAND").arg("COUNT").query(&mut con).unwrap();
    let all: Vec<Value> = redis::cmd("COMMAND").query(&mut con).unwrap();
    assert_eq!(all.len() as i64, count);
    let Value::Array(first) = &all[0] else {
        panic!("{:?}", all[0])
    };
    assert_eq!(first.len(), 10);
    assert_eq!(first[0], Value::BulkString(b"rl.reduce".to_vec()));
    assert_eq!(first[1], Value::Int(-4));
    assert_eq!(&first[3..6], &[Value::Int(1), Value::Int(1), Value::Int(1)]);
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("ping")
        .arg("nope")
        .query(&mut con)
        .unwrap();
    assert_eq!(info.len(), 2);
    assert_eq!(info[1], Value::Nil);
    // RESP2 docs: a flat array of name, doc pairs.
    let docs: Vec<Value> = redis::cmd("COMMAND").arg("DOCS").query(&mut con).unwrap();
    assert_eq!(docs.len() as i64, 2 * count);
    let list: Vec<String> = redis::cmd("COMMAND").arg("LIST").query(&mut con).unwrap();
    assert!(list.contains(&"rl.get".to_string()), "{list:?}");
    // redis-cli prints COMMAND DOCS, which it also uses for hints when interactive.
    let out = redis_cli(server.port(), &["COMMAND", "DOCS", "RL.REDUCE"]);
    assert!(
        out.contains("refill_seconds") && out.contains("STRICT"),
        "{out}"
    );
    assert_eq!(
        redis_cli(server.port(), &["COMMAND", "COUNT"]),
        format!("{count}\n")
    );
}

#[test]
fn unknown_commands_and_wrong_arity_are_errors_and_the_connection_goes_on() {
    let server = ApiServer::start();
    let mut raw = server.raw();
    let want = "-ERR unknown command 'FLUSHALL', with args beginning with: 'now' 'please' \r\n\
         -ERR wrong number of arguments for 'rl.reduce' command\r\n\
         -ERR wrong number of arguments for 'echo' command\r\n\
         -ERR wrong number of arguments for 'ping' command\r\n\
         :2\r\n";
    let got = exchange(
        &mut raw,
        b"FLUSHALL now please\r\nRL.REDUCE k 2\r\nECHO\r\nPING a b\r\nrl.reduce k 2 60\r\n",
        want.len(),
    );
    assert_eq!(String::from_utf8(got).unwrap(), want);
    // The errors are counted, under bounded labels.
    let metrics = server.scrape();
    for needle in [
        "tollgate_api_commands_total{command=\"other\",result=\"error\"} 1",
        "tollgate_api_commands_total{command=\"rl.reduce\",result=\"error\"} 1",
        "tollgate_api_commands_total{command=\"rl.reduce\",result=\"ok\"} 1",
        "tollgate_api_commands_total{command=\"echo\",result=\"error\"} 1",
        "tollgate_api_connections 1",
        "tollgate_api_buckets 1",
        "tollgate_limit_evictions_total{kind=\"adhoc_bucket\",limit=\"adhoc\",origin=\"_api\"} 0",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
}

#[test]
fn bad_numbers_get_errors_naming_the_argument() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    let cases: [(&[&str], &str); 8] = [
        (&["k", "two", "60"], "invalid 'max'"),
        (&["k", "-2", "60"], "invalid 'max'"),
        (&["k", "0", "60"], "invalid 'max'"),
        (&["k", "1180591620717411303424", "60"], "invalid 'max'"),
        (&["k", "2", "0"], "invalid 'refill_seconds'"),
        (&["k", "2", "60", "TAKE", "-1"], "invalid 'TAKE'"),
        (&["k", "2", "60", "REFILL", "1e3"], "invalid 'REFILL'"),
        (&["k", "2", "60", "AT", "yesterday"], "invalid 'AT'"),
    ];
    for (args, want) in cases {
        let err = reduce(&mut con, args).unwrap_err();
        assert!(err.to_string().contains(want), "{args:?}: {err}");
    }
    let err = get(&mut con, &["k", "2", "60", "STRICT"]).unwrap_err();
    assert!(err.to_string().contains("unknown option 'STRICT'"), "{err}");
    // The connection is still good, and nothing was taken.
    assert_eq!(get(&mut con, &["k", "2", "60"]).unwrap(), 2);
}

#[test]
fn strict_refill_and_take_follow_the_contract() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    let t = 1_700_000_000u64;
    let at = |s: u64| (t + s).to_string();
    // TAKE > 1: 5 tokens, takes of 3: 5 (taken), 2 (refused), 2 (still there: a refusal
    // takes nothing, where Smyte's code would have emptied the bucket).
    let r = |con: &mut redis::Connection, extra: &[&str], s: u64| {
        let mut args = vec!["tb", "5", "10", "REFILL", "1", "TAKE", "3", "AT"];
        let when = at(s);
        args.push(&when);
        args.extend_from_slice(extra);
        reduce(con, &args).unwrap()
    };
    assert_eq!(r(&mut con, &[], 0), 5);
    assert_eq!(r(&mut con, &[], 1), 2);
    // REFILL 1 every 10 s: one token at 10 s, so 3 then: taken.
    assert_eq!(r(&mut con, &[], 10), 3);
    assert_eq!(r(&mut con, &[], 19), 0);
    // Strict: a rejection at 25 s resets the clock, so 30 s brings nothing (and the 1 token
    // stays: Smyte's code would have emptied it)...
    assert_eq!(r(&mut con, &["STRICT"], 25), 1);
    assert_eq!(r(&mut con, &[], 30), 1);
    // ...and the refills resume from 25 s: 35 s and 45 s bring one each.
    assert_eq!(r(&mut con, &[], 45), 3);
    // REFILL defaults to max: "2 60" is two per minute, refilled whole.
    let mut two = |s: u64| reduce(&mut con, &["pm", "2", "60", "AT", &at(s)]).unwrap();
    assert_eq!(
        [two(0), two(1), two(2), two(59), two(60), two(61), two(62)],
        [2, 1, 0, 0, 2, 1, 0]
    );
}

#[test]
fn parameters_are_identity_and_time_never_goes_backwards() {
    let server = ApiServer::start();
    let mut con = server.client(true);
    let t = "1700000000";
    assert_eq!(reduce(&mut con, &["id", "2", "60", "AT", t]).unwrap(), 2);
    assert_eq!(reduce(&mut con, &["id", "2", "60", "AT", t]).unwrap(), 1);
    // Same key, other parameters: other buckets, each full.
    assert_eq!(reduce(&mut con, &["id", "3", "60", "AT", t]).unwrap(), 3);
    assert_eq!(reduce(&mut con, &["id", "2", "61", "AT", t]).unwrap(), 2);
    assert_eq!(
        reduce(&mut con, &["id", "2", "60", "REFILL", "1", "AT", t]).unwrap(),
        2
    );
    assert_eq!(get(&mut con, &["id", "2", "60", "AT", t]).unwrap(), 0);
    // An older AT is the bucket's last time: no refill, no rewind.
    assert_eq!(
        get(&mut con, &["id", "2", "60", "AT", "1600000000"]).unwrap(),
        0
    );
    assert_eq!(reduce(&mut con, &["id", "2", "60", "AT", "1"]).unwrap(), 0);
    assert_eq!(
        get(&mut con, &["id", "2", "60", "AT", "1700000059"]).unwrap(),
        0
    );
    assert_eq!(
        get(&mut con, &["id", "2", "60", "AT", "1700000060"]).unwrap(),
        2
    );
    // Without AT the server's clock (now, long after 1700000060) applies.
    assert_eq!(reduce(&mut con, &["id", "2", "60"]).unwrap(), 2);
}

#[test]
fn replaying_a_recorded_history_with_at_matches_the_model() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    let history = smyte::History::recorded(400);
    let got: Vec<i64> = history.pipeline("replay").query(&mut con).unwrap();
    assert_eq!(got, history.want);
    assert!(
        history.want.contains(&0) && history.want.contains(&7),
        "the history exercises both ends"
    );
}

#[test]
fn the_api_metrics_pass_promtool() {
    let server = ApiServer::start();
    let mut con = server.client(false);
    reduce(&mut con, &["m", "1", "60"]).unwrap();
    reduce(&mut con, &["m", "1", "60"]).unwrap();
    let text = server.scrape();
    for needle in [
        "tollgate_api_commands_total{command=\"rl.reduce\",result=\"rejected\"} 1",
        "tollgate_api_commands_total{command=\"rl.reduce\",result=\"ok\"} 1",
        "tollgate_api_connections 1",
        "tollgate_api_holds{resource=\"_unconfigured\"} 0",
        "tollgate_api_buckets 1",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (scripts/deps.sh installs it)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool: {out:?}");
}
