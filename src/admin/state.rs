//! `GET /limits/{origin}/{limit}/state?PART=VALUE...`: one key's live state, read without
//! changing it (for a `max: auto` inflight limit, also what each server learned).
//!
//! The key is built from the query as the proxy builds it from a request: each part of the
//! limit's `key:` named by its config spelling (`customer`, `client_ip`,
//! `header:x-api-key`), `origin` and `const:` parts filled in from the config. The variant
//! (base or override) is the one a request with these parts would get. In-process state is
//! read under its set's lock with every refill or window computed for now, and written
//! back never; state in a Redis store is read with one read-only script call within the
//! store's budget, for every kind (token bucket, inflight, sliding log, rate, concurrency,
//! tiered: each script reads Redis `TIME` and writes nothing), and a store that does not
//! answer within it is a 503.

use std::net::{IpAddr, SocketAddr};

use serde_json::{json, Value};

use crate::limits::tiered::{TieredKeyState, TieredParams};
use crate::limits::{path, AdaptiveState, Fact, Facts, KeyPart, Nanos};
use crate::runtime::learned::{self, Learned};
use crate::runtime::limit::LimitRt;
use crate::runtime::limiter::{Limiter, Place};
use crate::runtime::OriginRt;
use crate::store::stable_key_hash;

use super::Answer;

/// A value given in the query, typed as the proxy's facts are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Given {
    Bytes(Vec<u8>),
    Ip(IpAddr),
    Addr(SocketAddr),
}

/// A request made of query parameters, for the key and override conditions.
#[derive(Debug, Default)]
pub struct QueryFacts {
    origin: String,
    parts: Vec<(KeyPart, Given)>,
}

impl Facts for QueryFacts {
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
        match part {
            KeyPart::Origin => return Some(Fact::Bytes(self.origin.as_bytes())),
            KeyPart::Const(text) => return Some(Fact::Bytes(text.as_bytes())),
            _ => {}
        }
        self.parts
            .iter()
            .find(|(p, _)| p == part)
            .map(|(_, v)| match v {
                Given::Bytes(b) => Fact::Bytes(b),
                Given::Ip(ip) => Fact::Ip(*ip),
                Given::Addr(a) => Fact::Addr(*a),
            })
    }
}

impl QueryFacts {
    /// The facts the query gives for `origin`'s `limit`; a message for 400 when a name is
    /// not a key part, a value does not parse, or a part of the limit's key is missing.
    pub fn of(
        origin: &OriginRt,
        limit: &LimitRt,
        params: Vec<(String, Vec<u8>)>,
    ) -> Result<QueryFacts, String> {
        let mut facts = QueryFacts {
            origin: origin.name.clone(),
            parts: Vec::with_capacity(params.len()),
        };
        for (name, value) in params {
            let part = KeyPart::parse(&name).map_err(|e| format!("query parameter: {e}"))?;
            let text = || String::from_utf8_lossy(&value).into_owned();
            let typed = match part {
                KeyPart::ClientIp | KeyPart::ServerIp => {
                    Given::Ip(text().parse().map_err(|_| {
                        format!("`{name}` must be an IP address, found `{}`", text())
                    })?)
                }
                KeyPart::ServerAddr => Given::Addr(text().parse().map_err(|_| {
                    format!(
                        "`{name}` must be an IP address and port, found `{}`",
                        text()
                    )
                })?),
                // The proxy lower-cases the host before any limit sees it.
                KeyPart::Host => Given::Bytes(value.to_ascii_lowercase()),
                // And reads the path in its normal form (`crate::limits::path`).
                KeyPart::Path => Given::Bytes(path::normalize(&value).into_owned()),
                _ => Given::Bytes(value),
            };
            facts.parts.push((part, typed));
        }
        let missing: Vec<String> = limit
            .key
            .parts()
            .iter()
            .filter(|p| facts.fact(p).is_none())
            .map(ToString::to_string)
            .collect();
        if !missing.is_empty() {
            let all: Vec<String> = limit.key.parts().iter().map(ToString::to_string).collect();
            return Err(format!(
                "missing key part{} {} (limit `{}` is keyed on [{}]): add `?{}=VALUE`",
                if missing.len() > 1 { "s" } else { "" },
                missing
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                limit.name,
                all.join(", "),
                missing[0],
            ));
        }
        Ok(facts)
    }
}

fn ms(nanos: Nanos) -> f64 {
    nanos as f64 / 1e6
}

/// The state of the key `facts` names in `limit`, at `now` on the proxy's clock.
pub async fn state(origin: &OriginRt, limit: &LimitRt, facts: &QueryFacts, now: Nanos) -> Answer {
    let hash = if limit.shared {
        stable_key_hash(&limit.key, facts)
    } else {
        limit.key.hash(facts)
    };
    let Some(key) = hash else {
        return Answer::problem(400, "Bad Request", "the key cannot be built from the query");
    };
    let v = limit.select(facts);
    let Some(variant) = limit.variants.get(v) else {
        return Answer::problem(500, "Internal Server Error", "no such variant");
    };
    let mut state = match kind_state(&variant.limiter, key, now).await {
        Ok(state) => state,
        Err(answer) => return answer,
    };
    if let (Limiter::Inflight(rt), Some(obj)) = (&variant.limiter, state.as_object_mut()) {
        if let Some(l) = &rt.learned {
            // One read of the servers, so that the max shown is the one their limits give.
            let servers: Vec<_> = l.servers().collect();
            let max = l.max_in(learned::server_of(facts), &servers);
            obj.insert("max".into(), json!(max));
            obj.insert("learned".into(), learned_json(l, &servers));
        }
    }
    Answer::json(&json!({
        "origin": origin.name,
        "limit": limit.name,
        "kind": limit.kind.name(),
        "store": if limit.shared { "shared" } else { "local" },
        "variant": if v == 0 { "base".to_string() } else { format!("override {}", v - 1) },
        "key": limit.key.text(facts).unwrap_or_default(),
        "state": state,
    }))
}

/// `max: auto`'s bounds, share and each server's learned limit, gradient and latencies.
fn learned_json(l: &Learned, servers: &[(IpAddr, AdaptiveState)]) -> Value {
    let auto = l.auto();
    let servers: Vec<Value> = servers
        .iter()
        .map(|(ip, s)| {
            json!({
                "server": ip.to_string(),
                "limit": s.limit,
                "gradient": s.gradient,
                "short_ms": s.short_secs * 1e3,
                "long_ms": s.long_secs * 1e3,
            })
        })
        .collect();
    json!({
        "min": auto.bounds.min,
        "max": auto.bounds.max,
        "initial": auto.bounds.initial,
        "share_percent": auto.share,
        "servers": servers,
    })
}

fn store_failed(e: impl std::fmt::Display) -> Answer {
    Answer::problem(
        503,
        "Service Unavailable",
        format!("the Redis store did not answer the read: {e}"),
    )
}

/// A tiered key's state (in-process or read from a store) against its parameters: the
/// current tier, what is available, each tier's phase and window count, the hard limit's
/// count and the global limit's room (null without one).
fn tiered_json(p: &TieredParams, st: &TieredKeyState) -> Value {
    let tiers: Vec<Value> = p
        .tiers
        .iter()
        .zip(&st.tiers)
        .enumerate()
        .map(|(i, (t, s))| {
            json!({
                "tier": i + 1,
                "phase": s.phase.name(),
                "count": s.count,
                "limit": t.limit,
                "window_ms": ms(t.window),
            })
        })
        .collect();
    json!({
        "current_tier": st.current_tier,
        "available": st.available,
        "tiers": tiers,
        "hard": st.hard_count.map(|c| json!({ "count": c, "limit": p.hard_limit })),
        "global_room": st.global_room,
    })
}

/// The kind's state of `key` at `now`, as JSON: in process, or read from the store (which
/// adds its name).
async fn kind_state(limiter: &Limiter, key: u64, now: Nanos) -> Result<Value, Answer> {
    Ok(match limiter {
        Limiter::TokenBucket(rt) => match &rt.state {
            Place::Local(s) => {
                let (tokens, last) = s.state(key, now);
                json!({
                    "tokens": tokens,
                    "capacity": rt.params.capacity,
                    // null: the key holds no state (a full bucket).
                    "last_refill_ms_ago": last.map(|l| ms(now.saturating_sub(l))),
                })
            }
            Place::Store(s) => {
                let (tokens, full_in) = s.limiter.peek(key).await.map_err(store_failed)?;
                json!({
                    "tokens": tokens,
                    "capacity": rt.params.capacity,
                    "full_in_ms": ms(full_in),
                    "store": s.store,
                })
            }
        },
        Limiter::Rate(rt) => match &rt.state {
            Place::Local(s) => json!({
                "estimate": s.state(key, now),
                "max": rt.rate.max,
                "per_ms": ms(rt.rate.per),
            }),
            Place::Store(s) => {
                let w = s.limiter.peek(key).await.map_err(store_failed)?;
                json!({
                    // previous · (per − elapsed) / per + current, against max.
                    "estimate": w.estimate(),
                    "previous": w.previous,
                    "current": w.current,
                    "max": rt.rate.max,
                    "per_ms": ms(rt.rate.per),
                    "store": s.store,
                })
            }
        },
        Limiter::Tiered(rt) => match &rt.state {
            Place::Local(s) => tiered_json(s.params(), &s.key_state(key, now)),
            Place::Store(s) => {
                let st = s.limiter.peek(key).await.map_err(store_failed)?;
                let mut v = tiered_json(&rt.params, &st);
                // global_room is also null when the global limit is counted per instance (a
                // Cluster).
                v["store"] = json!(s.store);
                v
            }
        },
        Limiter::Concurrency(rt) => match &rt.state {
            Place::Local(s) => json!({
                "held": s.held(key),
                "max": rt.max,
            }),
            Place::Store(s) => {
                let counted = s.limiter.peek(key).await.map_err(store_failed)?;
                let free = s.limiter.holdings().free(key);
                json!({
                    // The fleet's copies in the key's counter (live leases only), less the
                    // free slots of this instance's block.
                    "held": counted.saturating_sub(free),
                    // This instance's copies, whoever admitted them (store or fallback).
                    "held_here": s.limiter.holdings().in_use(key),
                    "leased_here": free,
                    "max": rt.max,
                    "store": s.store,
                })
            }
        },
        Limiter::SlidingLog(rt) => match &rt.state {
            Place::Local(s) => {
                let windows: Vec<Value> = rt
                    .windows
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        json!({
                            "per_ms": ms(w.per),
                            "max": w.max,
                            "count": s.count(key, i, now),
                        })
                    })
                    .collect();
                json!({ "windows": windows })
            }
            Place::Store(s) => {
                let counts = s.limiter.peek(key).await.map_err(store_failed)?;
                let windows: Vec<Value> = rt
                    .windows
                    .iter()
                    .zip(counts)
                    .map(|(w, count)| json!({ "per_ms": ms(w.per), "max": w.max, "count": count }))
                    .collect();
                json!({ "windows": windows, "store": s.store })
            }
        },
        Limiter::Inflight(rt) => match &rt.state {
            Place::Local(s) => json!({
                // A count-min estimate: never below the key's true count.
                "estimate": s.get(key),
                "max": rt.max,
            }),
            Place::Store(s) => {
                let counted = s.limiter.peek(key).await.map_err(store_failed)?;
                let free = s.limiter.holdings().free(key);
                json!({
                    // Redis counts this instance's free block slots as held: left out.
                    "in_flight": counted.saturating_sub(free),
                    "leased_here": free,
                    "max": rt.max,
                    "store": s.store,
                })
            }
        },
    })
}
