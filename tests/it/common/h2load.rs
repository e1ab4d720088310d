//! h2load (Debian's `nghttp2-client`) as a client, and its summary read back.

use std::process::Command;

/// What one h2load run reports.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Responses by status class.
    pub ok: u64,
    pub too_many: u64,
    pub unavailable: u64,
    /// Requests that never got a response (a stream or connection error).
    pub errored: u64,
    /// Requests that completed (succeeded or failed).
    pub done: u64,
    /// h2load's whole output, for assertion messages.
    pub text: String,
}

/// Runs h2load with `args` (bounded by its `-n`) and reads its summary; a count missing
/// from the output reads as `u64::MAX`, which no assertion accepts.
pub fn run(args: &[&str]) -> Summary {
    let out = Command::new("h2load")
        .args(args)
        .output()
        .expect("h2load (scripts/deps.sh installs nghttp2-client)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |line: &str, name: &str| -> u64 {
        line.split(',')
            .find_map(|part| part.trim().strip_suffix(name).map(str::trim))
            .and_then(|n| n.split_whitespace().last()?.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_default()
            .to_string()
    };
    let (codes, reqs) = (line("status codes:"), line("requests:"));
    Summary {
        ok: field(&codes, "2xx"),
        too_many: field(&codes, "4xx"),
        unavailable: field(&codes, "5xx"),
        errored: field(&reqs, "errored"),
        done: field(&reqs, "done"),
        text,
    }
}

/// `n` HTTP/1.1 requests to `url` (Host `app.test`) as customer `acme` (`x-customer-id`),
/// over `c` connections (blocking): the one hot key of the lease tests.
pub fn as_acme(url: &str, n: u64, c: u64) -> Summary {
    run(&[
        "--h1",
        "-n",
        &n.to_string(),
        "-c",
        &c.to_string(),
        "-H",
        ":authority: app.test",
        "-H",
        "x-customer-id: acme",
        url,
    ])
}
