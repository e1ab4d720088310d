//! The shared stores a runtime uses: one [`RedisStore`] per `stores:` entry, each with its
//! own connection, breaker and probe (see [`crate::store`]).
//!
//! A store whose settings did not change is carried over a reload as it is (the same
//! connection, breaker state and inflight leases), so a reload never reconnects to Redis or
//! forgets held units; a changed or new one is started. Starting never fails because
//! Redis is unreachable: the store starts with its breaker open, decisions fall back, and
//! it recovers by itself.

use std::collections::HashMap;

use crate::config::{secret, Config, RedisEndpoint, StoreSpec};
use crate::metrics::Metrics;
use crate::store::{self, Endpoint, RedisStore, RedisStoreConfig, StoreError};

/// The stores of one runtime, by name, with the settings each was started from.
#[derive(Default)]
pub struct Stores {
    by_name: HashMap<String, (StoreSpec, RedisStore)>,
}

impl Stores {
    /// Starts (or carries over from `previous`) every store `config` names.
    pub fn build(
        config: &Config,
        previous: Option<&Stores>,
        metrics: &Metrics,
    ) -> Result<Stores, StoreError> {
        let instance = config
            .server
            .instance
            .clone()
            .unwrap_or_else(store::default_instance);
        let mut by_name = HashMap::with_capacity(config.stores.len());
        for spec in &config.stores {
            let kept = previous
                .and_then(|p| p.by_name.get(&spec.name))
                .filter(|(was, _)| was == spec)
                .map(|(_, store)| store.clone());
            let store = match kept {
                Some(store) => store,
                None => RedisStore::new(store_config(spec, &instance), metrics.store(&spec.name))?,
            };
            by_name.insert(spec.name.clone(), (spec.clone(), store));
        }
        Ok(Stores { by_name })
    }

    /// The store named `name`.
    pub fn get(&self, name: &str) -> Option<&RedisStore> {
        self.by_name.get(name).map(|(_, s)| s)
    }

    /// The deny-cache size limits on the store `name` use.
    pub fn deny_cache(&self, name: &str) -> usize {
        self.by_name
            .get(name)
            .map_or(0, |(spec, _)| spec.redis.deny_cache)
    }

    /// Every store, for health reporting.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RedisStore)> {
        self.by_name.iter().map(|(n, (_, s))| (n.as_str(), s))
    }
}

/// The store library's settings for `spec`: its URLs carry the `password_file`'s
/// password, if it has one (the config refuses a URL with a password of its own beside it).
fn store_config(spec: &StoreSpec, instance: &str) -> RedisStoreConfig {
    let r = &spec.redis;
    let url = |u: &String| match &r.password {
        // A URL the config accepted parses; if not, the store reports it as written.
        Some(p) => secret::with_password(u, &p.value).unwrap_or_else(|| u.clone()),
        None => u.clone(),
    };
    let endpoint = match &r.endpoint {
        RedisEndpoint::Standalone(u) => Endpoint::Standalone(url(u)),
        RedisEndpoint::Cluster(urls) => Endpoint::Cluster(urls.iter().map(url).collect()),
    };
    RedisStoreConfig {
        name: spec.name.clone(),
        endpoint,
        instance: instance.to_string(),
        tuning: r.tuning.clone(),
    }
}
