//! A limiter API client in Rust, with the `redis` crate (redis-rs) and nothing else.
//!
//! Against a tollgate whose config has `server.limiter_api: "127.0.0.1:9049"` and
//!
//! ```yaml
//! resources:
//!   sends: { kind: rate, max: 5, per: 1h }
//!   uploads: { kind: concurrency, max: 3 }
//! ```
//!
//! run `cargo run --example limiter_client -- 9049`. Replies of the `CH.*` commands are
//! maps (RESP3) or field/value pairs (RESP2): `fields` reads either into a `HashMap`.

use std::collections::HashMap;

use redis::Value;

/// A `CH.*` reply as field → value.
fn fields(reply: Value) -> HashMap<String, Value> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut it = items.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter_map(|(k, v)| match k {
            Value::BulkString(k) => Some((String::from_utf8_lossy(&k).into_owned(), v)),
            _ => None,
        })
        .collect()
}

fn int(m: &HashMap<String, Value>, field: &str) -> i64 {
    match m.get(field) {
        Some(Value::Int(n)) => *n,
        _ => 0,
    }
}

fn main() -> redis::RedisResult<()> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "9049".into());
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/?protocol=resp3"))?;
    let mut con = client.get_connection()?;

    // Smyte: two logins a minute per user; the take happened iff the reply is at least 1.
    for _ in 0..3 {
        let before: i64 = redis::cmd("RL.REDUCE")
            .arg(&["logins:alice", "2", "60"])
            .query(&mut con)?;
        println!(
            "login {} ({before} before)",
            if before >= 1 { "allowed" } else { "refused" }
        );
    }

    // Charon: send up to 4 messages now, at least 2 (or none).
    let sent = fields(
        redis::cmd("CH.REQUEST")
            .arg(&["sends", "alice", "4", "MIN", "2"])
            .query(&mut con)?,
    );
    println!("sends granted {}", int(&sent, "granted"));

    // Charon: hold 2 upload slots, then give them back (or let the connection's end do it).
    let held = fields(
        redis::cmd("CH.RESERVE")
            .arg(&["uploads", "acme", "2"])
            .query(&mut con)?,
    );
    let granted = int(&held, "granted");
    println!("uploads held {granted}");
    let freed = fields(
        redis::cmd("CH.RELEASE")
            .arg("uploads")
            .arg("acme")
            .arg(granted)
            .query(&mut con)?,
    );
    println!("uploads released, {} still held", int(&freed, "held"));
    Ok(())
}
