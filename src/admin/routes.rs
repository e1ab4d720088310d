//! The admin API's routes: which path and method does what, and the small handlers
//! (`/config`, `/certificates`, `/kill-switch`, `/top`); `/state` is in [`super::state`].

use http::{Method, Uri};
use serde_json::json;

use super::query;
use super::state::{self, QueryFacts};
use super::Answer;
use crate::limits::{Clock, MonotonicClock, Ranking};
use crate::runtime::limit::LimitRt;
use crate::runtime::{OriginRt, Runtime};

/// `/top`'s `n` when the query gives none (at most the limit's `top_keys`).
pub const DEFAULT_TOP: usize = 20;

/// Answers one request on the current runtime `rt`.
pub async fn route(
    rt: &Runtime,
    clock: MonotonicClock,
    method: &Method,
    uri: &Uri,
    body: &[u8],
) -> Answer {
    let path = uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let allowed: &str = match segments.as_slice() {
        ["config"] | ["certificates"] => "GET",
        ["kill-switch"] => "GET, PUT",
        ["limits", _, _, "state" | "top"] => "GET",
        _ => {
            return Answer::problem(
                404,
                "Not Found",
                format!("no admin resource at `{path}`: try /config, /certificates, /kill-switch, /limits/ORIGIN/LIMIT/state or /limits/ORIGIN/LIMIT/top"),
            )
        }
    };
    if !allowed.split(", ").any(|m| m == method.as_str()) {
        return Answer::problem(
            405,
            "Method Not Allowed",
            format!("`{path}` takes {allowed}"),
        )
        .with("allow", allowed);
    }
    match segments.as_slice() {
        ["config"] => config(rt),
        ["certificates"] => certificates(rt),
        ["kill-switch"] if method == Method::PUT => kill_switch_put(rt, body),
        ["kill-switch"] => kill_switch(rt),
        ["limits", origin, limit, what] => {
            let found = find(rt, origin, limit);
            let (origin, limit) = match found {
                Ok(found) => found,
                Err(answer) => return answer,
            };
            let params = match query::params(uri.query()) {
                Ok(p) => p,
                Err(e) => return Answer::problem(400, "Bad Request", e),
            };
            let now = clock.now();
            if *what == "top" {
                top(origin, limit, params, now)
            } else {
                match QueryFacts::of(origin, limit, params) {
                    Ok(facts) => state::state(origin, limit, &facts, now).await,
                    Err(e) => Answer::problem(400, "Bad Request", e),
                }
            }
        }
        _ => Answer::problem(404, "Not Found", format!("no admin resource at `{path}`")),
    }
}

/// The origin and limit a `/limits/{origin}/{limit}/...` path names (decoded), or 400/404.
fn find<'r>(
    rt: &'r Runtime,
    origin: &str,
    limit: &str,
) -> Result<(&'r OriginRt, &'r LimitRt), Answer> {
    let bad = |e: String| Answer::problem(400, "Bad Request", e);
    let origin_name = query::segment(origin).map_err(bad)?;
    let limit_name = query::segment(limit).map_err(bad)?;
    let Some(o) = rt.origins.iter().find(|o| o.name == origin_name) else {
        return Err(Answer::problem(
            404,
            "Not Found",
            format!("no origin `{origin_name}` in the running config"),
        ));
    };
    let Some(l) = o.all_limits().find(|l| l.name == limit_name) else {
        let names: Vec<&str> = o.all_limits().map(|l| l.name.as_str()).collect();
        return Err(Answer::problem(
            404,
            "Not Found",
            format!(
                "origin `{origin_name}` has no limit `{limit_name}`; its limits: {}",
                names.join(", ")
            ),
        ));
    };
    Ok((o, l))
}

/// `GET /config`: the effective config now running, as `check --print-effective` prints it.
fn config(rt: &Runtime) -> Answer {
    match crate::config::effective::to_yaml(&rt.config) {
        Ok(yaml) => Answer {
            status: 200,
            content_type: "application/yaml; charset=utf-8",
            body: yaml.into(),
            headers: Vec::new(),
        },
        Err(e) => Answer::problem(
            500,
            "Internal Server Error",
            format!("cannot print the config: {e}"),
        ),
    }
}

/// The kill switch and its two inputs.
/// `GET /certificates`: the certificates `tls.acme` manages, each host's state.
fn certificates(rt: &Runtime) -> Answer {
    let acme = rt.config.tls.acme.as_ref();
    Answer::json(&json!({
        "acme": acme.is_some(),
        "directory": acme.map(|a| a.directory.as_str()),
        "certificates": rt.managed.statuses(),
    }))
}

fn kill_switch(rt: &Runtime) -> Answer {
    Answer::json(&json!({
        "kill_switch": rt.kill.on(),
        "admin": rt.kill.admin_on(),
        "config": rt.kill.config_on(),
    }))
}

/// `PUT /kill-switch` with `on` or `off`: the admin input.
fn kill_switch_put(rt: &Runtime, body: &[u8]) -> Answer {
    let on = match body.trim_ascii() {
        b"on" => true,
        b"off" => false,
        _ => return Answer::problem(400, "Bad Request", "the body must be `on` or `off`"),
    };
    rt.kill.set_admin(on);
    log::info!(
        "admin API: kill switch turned {} (config's server.kill_switch: {}; on while either is)",
        if on { "on" } else { "off" },
        rt.kill.config_on()
    );
    kill_switch(rt)
}

/// `GET /limits/{origin}/{limit}/top?n=N`.
fn top(
    origin: &OriginRt,
    limit: &LimitRt,
    params: Vec<(String, Vec<u8>)>,
    now: crate::limits::Nanos,
) -> Answer {
    let Some(hh) = &limit.top else {
        return Answer::problem(
            404,
            "Not Found",
            format!(
                "limit `{}` of origin `{}` keeps no heavy hitters: set `top_keys: 20` on it (1 to 1000) and reload",
                limit.name, origin.name
            ),
        );
    };
    let k = hh.k();
    let mut n = DEFAULT_TOP.min(k);
    for (name, value) in params {
        if name != "n" {
            return Answer::problem(
                400,
                "Bad Request",
                format!("unknown query parameter `{name}`: `/top` takes only `n`"),
            );
        }
        let parsed = std::str::from_utf8(&value)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=k).contains(n));
        match parsed {
            Some(v) => n = v,
            None => {
                return Answer::problem(
                    400,
                    "Bad Request",
                    format!(
                        "`n` must be an integer from 1 to {k} (the limit's top_keys), found `{}`",
                        String::from_utf8_lossy(&value)
                    ),
                )
            }
        }
    }
    let entries = |ranking| {
        hh.top(ranking, n, now)
            .into_iter()
            .map(|t| json!({"key": t.key, "admitted": t.admitted, "rejected": t.rejected}))
            .collect::<Vec<_>>()
    };
    let epoch = hh.epoch() as f64 / 1e9;
    Answer::json(&json!({
        "origin": origin.name,
        "limit": limit.name,
        "top_keys": k,
        "window_seconds": [epoch, 2.0 * epoch],
        "by_admitted": entries(Ranking::Admitted),
        "by_rejected": entries(Ranking::Rejected),
    }))
}
