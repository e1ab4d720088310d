//! Every response tollgate writes itself: rejections (429/503), unknown hosts (404), bad
//! requests (400) and headers that cannot be forwarded (431) of the proxy, and the admin
//! API's errors, as RFC 9457 `application/problem+json`.
//!
//! Rejections carry `Retry-After` (whole seconds, rounded up, at least 1) and the
//! draft-ietf-httpapi-ratelimit-headers-11 fields (see [`crate::runtime::policy`]). A
//! deliberate block (`max: 0`, `capacity: 0`) carries no `Retry-After`: inviting a retry of
//! a block only brings the client back. The problem types are the draft's registered
//! `quota-exceeded` (429) and `temporary-reduced-capacity` (503). Building one allocates,
//! but only on the reject path.

use bytes::Bytes;
use serde::Serialize;

use crate::limits::{Nanos, NEVER};
use crate::runtime::policy::{limit_item, retry_after_secs};

/// The IANA HTTP problem types registry, where the draft registers its types.
const PROBLEM_TYPES: &str = "https://iana.org/assignments/http-problem-types";

/// A response tollgate writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: u16,
    /// Extra headers besides `Content-Type` and `Content-Length`.
    pub headers: Vec<(&'static str, String)>,
    /// The problem+json body.
    pub body: Bytes,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    violated_policies: Option<[&'a str; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<&'a str>,
    /// The request's `X-Request-Id`, to match a complaint with the access log's line.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

fn body(b: &Body<'_>) -> Bytes {
    // Serializing plain strings and numbers cannot fail; fall back to an empty object.
    Bytes::from(serde_json::to_vec(b).unwrap_or_else(|_| b"{}".to_vec()))
}

/// What a rejection needs to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectInfo<'a> {
    /// 429 or 503.
    pub status: u16,
    /// The origin's name.
    pub origin: &'a str,
    /// The violated limit's name.
    pub limit: &'a str,
    /// Human-readable policy, e.g. "100 requests per 1s".
    pub policy_text: &'a str,
    /// The `RateLimit-Policy` member of the limit.
    pub policy_item: &'a str,
    /// Units remaining (usually 0).
    pub remaining: u64,
    /// Nanoseconds until a retry can pass; [`NEVER`] for a block.
    pub retry_after: Nanos,
    /// The request's ID (empty: none).
    pub request_id: &'a str,
}

/// A 429/503 rejection naming the violated limit.
pub fn rejection(info: &RejectInfo<'_>) -> Problem {
    let (kind, title) = if info.status == 503 {
        ("temporary-reduced-capacity", "Service Unavailable")
    } else {
        ("quota-exceeded", "Too Many Requests")
    };
    let block = info.retry_after == NEVER;
    let retry = retry_after_secs(info.retry_after);
    let detail = if block {
        format!(
            "limit `{}` of origin `{}` blocks this request ({}); retrying will not help",
            info.limit, info.origin, info.policy_text
        )
    } else {
        format!(
            "limit `{}` of origin `{}` allows {}; retry after {retry}s",
            info.limit, info.origin, info.policy_text
        )
    };
    let body = body(&Body {
        kind: format!("{PROBLEM_TYPES}#{kind}"),
        title,
        status: info.status,
        detail,
        violated_policies: Some([info.limit]),
        origin: Some(info.origin),
        request_id: Some(info.request_id).filter(|id| !id.is_empty()),
    });
    let mut headers = Vec::with_capacity(4);
    if !block {
        headers.push(("retry-after", retry.to_string()));
    }
    // A block's quota never comes back, so its `t` is 0: nothing is restored by waiting.
    let reset = if block { 0 } else { retry };
    headers.push(("ratelimit-policy", info.policy_item.to_string()));
    headers.push(("ratelimit", limit_item(info.limit, info.remaining, reset)));
    headers.push(("cache-control", "no-store".to_string()));
    Problem {
        status: info.status,
        headers,
        body,
    }
}

/// 404 for a host that no origin serves.
pub fn unknown_host(host: &str) -> Problem {
    plain(404, "Not Found", format!("no origin serves host `{host}`"))
}

/// 400 for a request tollgate cannot attribute (bad Host, bad X-Forwarded-For, bad cost).
pub fn bad_request(detail: String) -> Problem {
    plain(400, "Bad Request", detail)
}

/// 431 for a request whose header would reach the upstream with more than `max` fields
/// (RFC 6585 §5): the upstream would refuse it, and it is the client's to shrink.
pub fn too_many_fields(fields: usize, max: usize) -> Problem {
    plain(
        431,
        "Request Header Fields Too Large",
        format!(
            "the request would reach the upstream with {fields} header fields (with the \
             X-Forwarded-For field tollgate adds); at most {max} can be forwarded"
        ),
    )
}

/// A problem of `status` with a `title` and a `detail`, `type` `about:blank` (RFC 9457
/// §4.2.1): the admin API's errors too.
pub fn plain(status: u16, title: &str, detail: String) -> Problem {
    Problem {
        status,
        headers: vec![("cache-control", "no-store".to_string())],
        body: body(&Body {
            kind: "about:blank".to_string(),
            title,
            status,
            detail,
            violated_policies: None,
            origin: None,
            request_id: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_names_the_limit_everywhere() {
        let p = rejection(&RejectInfo {
            status: 429,
            origin: "shop",
            limit: "per_client",
            policy_text: "100 requests per 1s",
            policy_item: "\"per_client\";q=100;w=1",
            remaining: 0,
            retry_after: 1_500_000_000,
            request_id: "",
        });
        assert_eq!(p.status, 429);
        let h = |n: &str| {
            p.headers
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("retry-after"), Some("2"));
        assert_eq!(h("ratelimit"), Some("\"per_client\";r=0;t=2"));
        assert_eq!(h("ratelimit-policy"), Some("\"per_client\";q=100;w=1"));
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            v["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(v["violated-policies"][0], "per_client");
        assert_eq!(v["status"], 429);
        let p = rejection(&RejectInfo {
            status: 503,
            ..rejection_info()
        });
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert!(v["type"]
            .as_str()
            .unwrap()
            .ends_with("#temporary-reduced-capacity"));
    }

    fn rejection_info() -> RejectInfo<'static> {
        RejectInfo {
            status: 429,
            origin: "o",
            limit: "l",
            policy_text: "1 in flight",
            policy_item: "\"l\";q=1",
            remaining: 0,
            retry_after: 0,
            request_id: "",
        }
    }

    #[test]
    fn a_block_invites_no_retry() {
        let p = rejection(&RejectInfo {
            retry_after: NEVER,
            request_id: "",
            ..rejection_info()
        });
        assert!(p.headers.iter().all(|(k, _)| *k != "retry-after"), "{p:?}");
        let ratelimit = p.headers.iter().find(|(k, _)| *k == "ratelimit");
        assert_eq!(ratelimit.map(|(_, v)| v.as_str()), Some("\"l\";r=0;t=0"));
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert!(v["detail"]
            .as_str()
            .unwrap()
            .contains("retrying will not help"));
    }

    #[test]
    fn unknown_host_is_escaped_json() {
        let p = unknown_host("a\"b");
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["status"], 404);
        assert!(v["detail"].as_str().unwrap().contains("a\"b"));
    }
}
