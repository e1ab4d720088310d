//! What a limit advertises: the `RateLimit-Policy` member and the sentence problem bodies
//! use, computed once per limit variant when the runtime is built (never per request).
//!
//! The header fields follow draft-ietf-httpapi-ratelimit-headers-11 as RFC 9651 structured
//! fields: `RateLimit-Policy: "per_client";q=100;w=1` (quota `q` per window `w` seconds)
//! and `RateLimit: "per_client";r=0;t=1` (`r` units remain, restored after `t` seconds).

use std::time::Duration;

use crate::config::LimitParams;
use crate::limits::clock::{Nanos, NANOS_PER_SEC};

/// A limit variant's advertised policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The `RateLimit-Policy` list members this variant may advertise: one, or one per tier
    /// of a tiered limit (a decision says which applies).
    pub items: Vec<String>,
    /// A human sentence for problem bodies, e.g. "100 requests per 1s".
    pub text: String,
}

impl Policy {
    /// The `RateLimit-Policy` member at `index` (the first when out of range).
    pub fn item(&self, index: u8) -> &str {
        self.items
            .get(usize::from(index))
            .or(self.items.first())
            .map_or("", String::as_str)
    }

    /// The policy of the limit `name` with `params`.
    pub fn of(name: &str, params: &LimitParams) -> Policy {
        let one = |item: String, text: String| Policy {
            items: vec![item],
            text,
        };
        match params {
            LimitParams::Inflight { max, .. } => one(
                policy_item(name, *max, None),
                format!("{max} requests in flight"),
            ),
            LimitParams::Rate { rate, .. } => one(
                policy_item(name, rate.max, Some(ceil_secs(rate.per))),
                format!("{} requests per {}", rate.max, human(rate.per)),
            ),
            LimitParams::TokenBucket { bucket, .. } => {
                let refills = bucket.capacity.div_ceil(bucket.amount.max(1));
                let window = refills.saturating_mul(bucket.every);
                one(
                    policy_item(name, bucket.capacity, Some(ceil_secs(window))),
                    format!(
                        "a burst of {} tokens, refilled by {} every {}",
                        bucket.capacity,
                        bucket.amount,
                        human(bucket.every)
                    ),
                )
            }
            LimitParams::Tiered { tiered, .. } => {
                let items = tiered
                    .tiers
                    .iter()
                    .map(|t| policy_item(name, t.limit, Some(ceil_secs(t.window))))
                    .collect();
                let tiers: Vec<String> = tiered
                    .tiers
                    .iter()
                    .map(|t| {
                        format!(
                            "{} per {} for {}",
                            t.limit,
                            human(t.window),
                            human(t.active)
                        )
                    })
                    .collect();
                let mut text = format!("bursts in tiers: {}", tiers.join(", then "));
                if let Some(h) = tiered.hard_limit {
                    text.push_str(&format!("; at most {h} per second"));
                }
                if let Some(g) = tiered.global_limit {
                    text.push_str(&format!("; {g} per second across everyone"));
                }
                Policy { items, text }
            }
            LimitParams::Concurrency { max, global, .. } => {
                let mut text = format!("{max} requests held at once");
                if let Some(g) = global {
                    text.push_str(&format!(" ({g} across everyone)"));
                }
                one(policy_item(name, *max, None), text)
            }
            LimitParams::SlidingLog { windows, .. } => {
                let first = windows.first().map_or((0, 0), |w| (w.max, w.per));
                let text: Vec<String> = windows
                    .iter()
                    .map(|w| format!("{} per {}", w.max, human(w.per)))
                    .collect();
                one(
                    policy_item(name, first.0, Some(ceil_secs(first.1))),
                    text.join(" and "),
                )
            }
        }
    }
}

fn human(nanos: Nanos) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_nanos(nanos))
}

/// Nanoseconds as whole seconds for `Retry-After`: rounded up, at least 1, because a
/// client that retries early is rejected again.
pub fn retry_after_secs(nanos: Nanos) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC).max(1)
}

/// Seconds for the `t` parameter and `w`: rounded up, 0 allowed.
pub fn ceil_secs(nanos: Nanos) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

/// An RFC 9651 sf-string: quoted, with `"` and `\` escaped. Limit names are validated to
/// `[A-Za-z0-9_-]`, so this is defence in depth.
fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// One `RateLimit-Policy` list member: quota `q` per window `w` seconds (no `w` for a
/// concurrency limit, which has no window).
pub fn policy_item(name: &str, quota: u64, window_secs: Option<u64>) -> String {
    let mut s = String::with_capacity(name.len() + 24);
    sf_string(&mut s, name);
    s.push_str(";q=");
    s.push_str(&quota.to_string());
    if let Some(w) = window_secs {
        s.push_str(";w=");
        s.push_str(&w.max(1).to_string());
    }
    s
}

/// One `RateLimit` list member: `r` units remain, restored after `t` seconds.
pub fn limit_item(name: &str, remaining: u64, reset_secs: u64) -> String {
    let mut s = String::with_capacity(name.len() + 24);
    sf_string(&mut s, name);
    s.push_str(";r=");
    s.push_str(&remaining.to_string());
    s.push_str(";t=");
    s.push_str(&reset_secs.to_string());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(NANOS_PER_SEC), 1);
        assert_eq!(retry_after_secs(NANOS_PER_SEC + 1), 2);
        assert_eq!(ceil_secs(0), 0);
    }

    #[test]
    fn structured_fields_are_quoted_and_parameterised() {
        assert_eq!(
            policy_item("per_client", 100, Some(1)),
            "\"per_client\";q=100;w=1"
        );
        assert_eq!(policy_item("conc", 5, None), "\"conc\";q=5");
        assert_eq!(policy_item("sub", 5, Some(0)), "\"sub\";q=5;w=1");
        assert_eq!(limit_item("per_client", 0, 1), "\"per_client\";r=0;t=1");
        assert_eq!(limit_item("a\"b", 1, 2), "\"a\\\"b\";r=1;t=2");
    }
}
