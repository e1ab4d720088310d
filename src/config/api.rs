//! The `api:` section: the limiter API's own settings (the listener itself is
//! `server.limiter_api`).

use crate::config::bounds;
use crate::config::model::Api;
use crate::config::report::{child, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `api:` takes.
const API_KEYS: [&str; 2] = ["max_keys", "allow_unconfigured"];

/// Reads the `api:` section, or its defaults when absent.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>) -> Api {
    let mut api = Api::default();
    let entries = node
        .and_then(|n| scalar::map(r, n, "api"))
        .unwrap_or_default();
    for e in entries {
        let path = child("api", &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "max_keys" => {
                let n = scalar::int(r, v, &path, 1, bounds::MAX_KEYS as u64);
                if let Some(n) = n.and_then(|n| usize::try_from(n).ok()) {
                    api.max_keys = n;
                }
            }
            "allow_unconfigured" => {
                if let Some(b) = scalar::boolean(r, v, &path) {
                    api.allow_unconfigured = b;
                }
            }
            other => r.error(e.key_pos, &path, suggest::unknown("key", other, &API_KEYS)),
        }
    }
    api
}
