//! Transactions on the limiter API (issue 19, item 10), through the real binary with
//! clients the project did not write: redis-py's default `pipeline()` (a `MULTI ... EXEC`
//! transaction), `redis-cli`, redis-rs' atomic pipeline against a Redis-stored bucket (the
//! commands wait on the store inside `EXEC`), and raw RESP for Redis's edge cases: a
//! mistake in a queued command aborts the whole transaction (`EXECABORT`) before anything
//! in it runs, nested `MULTI`, `WATCH` refused, and the bounds of the queue.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;
use crate::common::redis as harness;

use std::net::TcpStream;
use std::time::Duration;

use api::{exchange_until, redis_cli_stdin};
use common::{python, start_api};
use harness::RedisServer;

/// A raw connection to the API with 10 s timeouts.
fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends `request` and returns what came back once it ends with `suffix`.
fn send(s: &mut TcpStream, request: &str, suffix: &str) -> String {
    let got = exchange_until(s, request.as_bytes(), suffix.as_bytes());
    String::from_utf8(got).unwrap()
}

const PY_PIPELINE: &str = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=10)

# redis-py's default pipeline is a MULTI ... EXEC transaction.
p = r.pipeline()
for _ in range(3):
    p.execute_command("RL.REDUCE", "k", "2", "60")
print("replies", p.execute())

# One mistake anywhere: the transaction is discarded, nothing of it ran.
for bad in (["RL.REDUCE", "j", "two", "60"], ["RL.NOPE", "x"], ["RL.REDUCE", "j"]):
    p = r.pipeline()
    p.execute_command("RL.REDUCE", "j", "2", "60")
    p.execute_command(*bad)
    try:
        p.execute()
        print("no error")
    except redis.ResponseError as e:
        print("refused", str(e).split("caused error: ")[-1][:40])
    print("left", r.execute_command("RL.GET", "j", "2", "60"))

# A pipeline that is not a transaction is plain pipelining, as before.
p = r.pipeline(transaction=False)
p.execute_command("RL.REDUCE", "n", "5", "60", "TAKE", "2")
p.execute_command("RL.GET", "n", "5", "60")
print("plain", p.execute())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_pipelines_run_once_and_a_mistake_spends_nothing() {
    let (_t, port) = start_api("", "").await;
    let out = python(PY_PIPELINE, &[&port.to_string()]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "replies [2, 1, 0]",
            "refused invalid 'max': expected an integer from ",
            "left 2",
            "refused unknown command 'RL.NOPE', with args beg",
            "left 2",
            "refused wrong number of arguments for 'rl.reduce",
            "left 2",
            "plain [5, 3]",
        ],
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_multi_exec_and_discard() {
    let (_t, port) = start_api("", "").await;
    let input = "MULTI\nRL.REDUCE c 2 60\nRL.REDUCE c 2 60\nPING\nEXEC\nMULTI\nRL.REDUCE d 2 60\nDISCARD\nRL.GET d 2 60\nEXEC\nDISCARD\n";
    let out = redis_cli_stdin(port, &[], input);
    assert_eq!(
        out,
        // (redis-cli prints a blank line after an error read from a pipe.)
        "OK\nQUEUED\nQUEUED\nQUEUED\n2\n1\nPONG\nOK\nQUEUED\nOK\n2\nERR EXEC without MULTI\n\nERR DISCARD without MULTI\n\n",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_edge_cases_answer_as_redis_does() {
    let (t, port) = start_api("", "").await;
    let mut s = raw(port);
    // Nested MULTI and WATCH inside MULTI are errors that leave the transaction open.
    let got = send(
        &mut s,
        "MULTI\r\nMULTI\r\nWATCH k\r\nRL.REDUCE a 2 60\r\nEXEC\r\n",
        ":2\r\n",
    );
    assert_eq!(
        got,
        "+OK\r\n-ERR MULTI calls can not be nested\r\n-ERR WATCH inside MULTI is not allowed\r\n+QUEUED\r\n*1\r\n:2\r\n"
    );
    // WATCH outside a transaction is refused with the reason; UNWATCH is harmless.
    let got = send(&mut s, "WATCH k\r\nUNWATCH\r\n", "+OK\r\n");
    assert!(
        got.starts_with("-ERR WATCH is not supported by the limiter API"),
        "{got}"
    );
    // A bad argument aborts: EXECABORT, and nothing of it ran.
    let got = send(
        &mut s,
        "MULTI\r\nRL.REDUCE b 2 60\r\nRL.REDUCE b 2 60 AT soon\r\nEXEC\r\nRL.GET b 2 60\r\n",
        ":2\r\n",
    );
    assert_eq!(
        got,
        "+OK\r\n+QUEUED\r\n-ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got 'soon'\r\n-EXECABORT Transaction discarded because of previous errors.\r\n:2\r\n"
    );
    // An error only running can tell is in its place in EXEC's array; the rest ran.
    let got = send(
        &mut s,
        "MULTI\r\nRL.REDUCE e 2 60\r\nCH.RELEASE nothing d 1\r\nRL.REDUCE e 2 60\r\nEXEC\r\n",
        ":1\r\n",
    );
    assert!(
        got.starts_with("+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n:2\r\n-ERR "),
        "{got}"
    );
    // RESP3 changes nothing in EXEC's shape.
    let got = send(
        &mut s,
        "HELLO 3\r\nMULTI\r\nRL.GET e 2 60\r\nEXEC\r\n",
        "*1\r\n:0\r\n",
    );
    assert!(got.ends_with("+OK\r\n+QUEUED\r\n*1\r\n:0\r\n"), "{got}");
    // The queue is bounded: the command past 4096 is refused and the transaction aborts.
    let mut many = String::from("MULTI\r\n");
    many.push_str(&"RL.REDUCE q 9 60\r\n".repeat(4097));
    many.push_str("EXEC\r\nRL.GET q 9 60\r\n");
    let got = send(&mut s, &many, ":9\r\n");
    assert_eq!(got.matches("+QUEUED\r\n").count(), 4096);
    assert!(
        got.contains("-ERR transaction too large: a transaction queues at most 4096 commands"),
        "{}",
        &got[got.len() - 300..]
    );
    assert!(got.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n:9\r\n"));
    // And in bytes: 17 arguments of 64000 bytes pass 1 MiB.
    let big = "x".repeat(64_000);
    let mut heavy = String::from("MULTI\r\n");
    for _ in 0..17 {
        heavy.push_str(&format!("*2\r\n$4\r\nECHO\r\n$64000\r\n{big}\r\n"));
    }
    heavy.push_str("EXEC\r\n");
    let got = send(&mut s, &heavy, "previous errors.\r\n");
    assert!(
        got.contains("queues at most 1048576 bytes"),
        "{}",
        &got[..200]
    );
    // Nothing leaked into the metrics' labels, and the counts are by command.
    let text = t.metrics_text().await;
    assert!(
        text.contains("tollgate_api_commands_total{command=\"exec\",result=\"error\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_api_commands_total{command=\"multi\",result=\"ok\"} 6"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_waits_on_a_redis_store_command_by_command() {
    let redis = RedisServer::start();
    let tail = format!(
        "api:\n  store: shared\nstores:\n  shared:\n    url: \"{}\"\n    timeout: 500ms\n",
        redis.url()
    );
    let (t, port) = start_api("", &tail).await;
    t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap();
    let (a, b, c, pong, left): (i64, i64, i64, String, i64) = redis::pipe()
        .atomic()
        .cmd("RL.REDUCE")
        .arg("s")
        .arg(2)
        .arg(60)
        .cmd("RL.REDUCE")
        .arg("s")
        .arg(2)
        .arg(60)
        .cmd("RL.REDUCE")
        .arg("s")
        .arg(2)
        .arg(60)
        .cmd("PING")
        .cmd("RL.GET")
        .arg("s")
        .arg(2)
        .arg(60)
        .query(&mut con)
        .unwrap();
    assert_eq!((a, b, c, pong.as_str(), left), (2, 1, 0, "PONG", 0));
    // The bucket is Redis's, and the commands after EXEC come after its replies.
    let keys = redis.cmd(&["KEYS", "*_rl:2:2:60*"]);
    assert!(
        matches!(keys, redis::Value::Array(ref k) if k.len() == 1),
        "{keys:?}"
    );
    let v: i64 = redis::cmd("RL.GET")
        .arg("s")
        .arg(2)
        .arg(60)
        .query(&mut con)
        .unwrap();
    assert_eq!(v, 0);
    // A period in milliseconds that is not whole seconds is named in milliseconds.
    let v: i64 = redis::cmd("RL.PREDUCE")
        .arg("p")
        .arg(2)
        .arg(1500)
        .query(&mut con)
        .unwrap();
    assert_eq!(v, 2);
    let keys = redis.cmd(&["KEYS", "*_rl:2:2:1500ms*"]);
    assert!(
        matches!(keys, redis::Value::Array(ref k) if k.len() == 1),
        "{keys:?}"
    );
}
