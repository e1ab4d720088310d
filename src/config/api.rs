//! The `api:` section: the limiter API's own settings (the listener itself is
//! `server.limiter_api`).

use crate::config::model::{Api, StoreSpec};
use crate::config::report::{child, Report};
use crate::config::scalar;
use crate::config::secret;
use crate::config::stores::store_ref;
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
                if let Some(n) = scalar::max_keys(r, v, &path) {
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
                if let Some(name) = store_ref(r, v, &path, stores) {
                    api.store = Some(name);
                }
            }
            other => r.error(e.key_pos, &path, suggest::unknown("key", other, &API_KEYS)),
        }
    }
    api
}
