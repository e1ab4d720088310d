//! gRPC through tollgate (issue 20, part C), with Python's grpcio on both ends: an echo
//! service over h2c as the origin (`upstream_protocol: h2c`), a client on an `h2c: true`
//! listener. A unary and a server-streaming call pass with their trailers; a call a rate
//! limit rejects gets `RESOURCE_EXHAUSTED` from a trailers-only reply that still carries
//! `retry-after`; an inflight rejection is `UNAVAILABLE`.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Child, Command, Stdio};

use common::{eventually, free_port, Tollgate};

/// An echo service without generated code: methods take and return raw bytes.
const SERVER: &str = r#"
import sys, time, grpc
from concurrent import futures

def unary(req, ctx):
    ctx.set_trailing_metadata((("x-echo-trailer", "unary"),))
    return req

def stream(req, ctx):
    for i in range(3):
        yield req + b"-" + str(i).encode()
    ctx.set_trailing_metadata((("x-echo-trailer", "stream"),))

def hold(req, ctx):
    time.sleep(3)
    return req

handler = grpc.method_handlers_generic_handler("echo.Echo", {
    "Unary": grpc.unary_unary_rpc_method_handler(unary),
    "Stream": grpc.unary_stream_rpc_method_handler(stream),
    "Hold": grpc.unary_unary_rpc_method_handler(hold),
})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
print("ready", flush=True)
server.wait_for_termination(timeout=60)
"#;

const CLIENT: &str = r#"
import sys, grpc, threading
target = "127.0.0.1:" + sys.argv[1]
ch = grpc.insecure_channel(target, options=[("grpc.default_authority", "grpc.test")])
unary = ch.unary_unary("/echo.Echo/Unary")
stream = ch.unary_stream("/echo.Echo/Stream")
resp, call = unary.with_call(b"hi", timeout=10)
print("unary", resp.decode(), dict(call.trailing_metadata()).get("x-echo-trailer"))
it = stream(b"s", timeout=10)
print("stream", ",".join(m.decode() for m in it), dict(it.trailing_metadata()).get("x-echo-trailer"))
try:
    unary(b"again", timeout=10)
    print("limited no")
except grpc.RpcError as e:
    md = dict(e.initial_metadata() or ()) | dict(e.trailing_metadata() or ())
    print("limited", e.code().name, "retry-after" in md, e.details())
"#;

fn python(script: &str, arg: &str) -> Command {
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg("-c").arg(script).arg(arg);
    cmd
}

struct Origin(Child);

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn echo_origin() -> (Origin, u16) {
    let port = free_port();
    let mut child = python(SERVER, &port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (Origin(child), port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_pass_with_trailers_and_a_limited_call_is_resource_exhausted() {
    let (_origin, port) = echo_origin().await;
    let h2c = free_port();
    let config = format!(
        "server:\n  listen: [\"{{listen}}\", {{ addr: \"127.0.0.1:{h2c}\", h2c: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\norigins:\n  grpc:\n    hosts: [\"grpc.test\"]\n    upstreams: [\"127.0.0.1:{port}\"]\n    upstream_protocol: h2c\n    limits:\n      calls: {{ kind: rate, key: [host], max: 2, per: 1m }}\n"
    );
    let t = Tollgate::start(&config).await;
    eventually("the h2c listener accepts", 250, || async {
        std::net::TcpStream::connect(("127.0.0.1", h2c)).is_ok()
    })
    .await;
    let out = python(CLIENT, &h2c.to_string()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{text}{err}\n{}", t.log_text());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"unary hi unary"), "{text}{err}");
    assert_eq!(
        lines.get(1),
        Some(&"stream s-0,s-1,s-2 stream"),
        "{text}{err}"
    );
    let limited = lines.get(2).copied().unwrap_or_default();
    assert!(
        limited.starts_with("limited RESOURCE_EXHAUSTED True"),
        "{text}{err}"
    );
    t.wait_metric(
        "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"rate\",limit=\"calls\",origin=\"grpc\"}",
        1.0,
    )
    .await;
}
