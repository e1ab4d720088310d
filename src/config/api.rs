//! The `api:` section: the limiter API's own settings (the listener itself is
//! `server.limiter_api`).

use crate::config::bounds;
use crate::config::model::{Api, StoreSpec};
use crate::config::report::{child, Report};
use crate::config::scalar;
use crate::config::secret;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `api:` takes.
pub(crate) const API_KEYS: [&str; 4] = ["max_keys", "allow_unconfigured", "store", "password_file"];

/// Reads the `api:` section, or its defaults when absent. `stores` are the configured
/// shared stores `api.store` may name (besides `local`); `file` is the config file, whose
/// directory a relative `password_file` starts in.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, stores: &[StoreSpec], file: &str) -> Api {
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
            "password_file" => {
                if let Some(name) = scalar::text(r, v, &path) {
                    let what = ("the limiter API password", "`AUTH PASSWORD`");
                    api.password = secret::read(r, v, &path, file, name, what);
                }
            }
            "allow_unconfigured" => {
                if let Some(b) = scalar::boolean(r, v, &path) {
                    api.allow_unconfigured = b;
                }
            }
            "store" => {
                let Some(name) = scalar::text(r, v, &path) else {
                    continue;
                };
                if name == "local" {
                    continue;
                }
                if stores.iter().any(|s| s.name == name) {
                    api.store = Some(name.to_string());
                    continue;
                }
                let message = if stores.is_empty() {
                    format!("unknown store `{name}`: no Redis store is configured under `stores:`")
                } else {
                    let mut all: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
                    all.push("local");
                    suggest::unknown("store", name, &all)
                };
                r.error(v.pos, &path, message);
            }
            other => r.error(e.key_pos, &path, suggest::unknown("key", other, &API_KEYS)),
        }
    }
    api
}
