//! `lease:` on a limit kept in a Redis store: `auto` (the default there), `off`, or
//! `{hot_above, max_share, renew_every, idle}` (each optional, defaulting as `auto`).
//!
//! What the settings mean is `crate::limits::lease`'s ([`LeaseParams`]). Only token
//! buckets, rates, concurrency and inflight limits lease; sliding logs and tiers stay
//! exact, and a local limit has nothing to lease (both refused in `super::resolve`).

use std::time::Duration;

use crate::config::report::{child, At, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::{Node, Value};
use crate::limits::clock::nanos;
use crate::limits::lease::{LeaseParams, PPM};

/// The keys of the mapping form.
pub(crate) const LEASE_KEYS: [&str; 4] = ["hot_above", "max_share", "renew_every", "idle"];

/// The most decisions per second `hot_above` may name.
const MAX_HOT_ABOVE: u64 = 1 << 32;

/// `lease:` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseSetting {
    /// Leases for hot keys with these settings (`auto` is the defaults).
    On(LeaseParams),
    /// One call per decision.
    Off,
}

/// Reads `lease:` at `path`.
pub(crate) fn parse(r: &mut Report, node: &Node, path: &str) -> Option<At<LeaseSetting>> {
    if let Value::Scalar(_) = &node.value {
        let i = scalar::choice(r, node, path, "`lease` value", &["auto", "off"])?;
        let setting = if i == 0 {
            LeaseSetting::On(LeaseParams::default())
        } else {
            LeaseSetting::Off
        };
        return Some(At::new(setting, node.pos, path));
    }
    let entries = scalar::map(r, node, path)?;
    let mut p = LeaseParams::default();
    let before = r.error_count();
    for e in entries {
        let sub = child(path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "hot_above" => {
                if let Some(n) = per_second(r, v, &sub) {
                    p.hot_above = n;
                }
            }
            "max_share" => {
                if let Some(ppm) = share(r, v, &sub) {
                    p.max_share = ppm;
                }
            }
            "renew_every" => {
                let range = (Duration::from_millis(1), Duration::from_secs(60));
                if let Some(d) = scalar::duration(r, v, &sub, range, ("1ms", "1m")) {
                    p.renew_every = nanos(d);
                }
            }
            "idle" => {
                let range = (Duration::from_millis(10), Duration::from_secs(3600));
                if let Some(d) = scalar::duration(r, v, &sub, range, ("10ms", "1h")) {
                    p.idle = nanos(d);
                }
            }
            other => r.error(e.key_pos, &sub, suggest::unknown("key", other, &LEASE_KEYS)),
        }
    }
    (r.error_count() == before).then(|| At::new(LeaseSetting::On(p), node.pos, path))
}

/// `20/s` (or a bare integer): decisions per second, 1 to 2^32.
fn per_second(r: &mut Report, node: &Node, path: &str) -> Option<u64> {
    let t = scalar::text(r, node, path)?.trim();
    let digits = t.strip_suffix("/s").unwrap_or(t).trim();
    match digits.parse::<u64>() {
        Ok(n) if (1..=MAX_HOT_ABOVE).contains(&n) => Some(n),
        Ok(_) => {
            let message = format!("must be between 1/s and {MAX_HOT_ABOVE}/s, found `{t}`");
            r.error(node.pos, path, message);
            None
        }
        Err(_) => {
            let message = format!("`{t}` is not a rate; write decisions per second, e.g. `20/s`");
            r.error(node.pos, path, message);
            None
        }
    }
}

/// `1%` or `0.5%`: a share of the limit in (0%, 100%], as parts per million (at least 1).
fn share(r: &mut Report, node: &Node, path: &str) -> Option<u64> {
    let t = scalar::text(r, node, path)?.trim();
    let Some(number) = t.strip_suffix('%') else {
        let message = format!("`{t}` is not a share; write a percentage, e.g. `1%`");
        r.error(node.pos, path, message);
        return None;
    };
    match number.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 100.0 => {
            // At most 100 · 10^4 = 10^6: exact enough in f64, and at least 1 ppm.
            Some(((x * (PPM as f64) / 100.0).round() as u64).clamp(1, PPM))
        }
        _ => {
            let message = format!("must be a percentage above 0% and at most 100%, found `{t}`");
            r.error(node.pos, path, message);
            None
        }
    }
}

/// `max_share` as written back by `check --print-effective`: `1%`, `0.5%`.
pub(crate) fn share_text(ppm: u64) -> String {
    let whole = ppm / (PPM / 100);
    let frac = ppm % (PPM / 100);
    if frac == 0 {
        format!("{whole}%")
    } else {
        let digits = format!("{frac:04}");
        format!("{whole}.{}%", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_print_as_written() {
        assert_eq!(share_text(10_000), "1%");
        assert_eq!(share_text(5_000), "0.5%");
        assert_eq!(share_text(PPM), "100%");
        assert_eq!(share_text(1), "0.0001%");
        assert_eq!(share_text(123_400), "12.34%");
    }
}
