//! The limiter API's resources, live: each `resources.NAME` of the config is a
//! [`LimitRt`] built exactly as an origin's limit is (the same [`Limiter::build`], stores,
//! overrides, segments and reload identity), under the origin name
//! [`API_ORIGIN`](crate::config::API_ORIGIN): its decisions are counted in
//! `tollgate_limit_decisions_total{origin="_api", limit=NAME}`, its state carries over a
//! reload while its identity and shape hold, and its Redis keys are
//! `PREFIX _api:NAME:VARIANT:{HASH}:KIND`.
//!
//! A command's domain is the resource's `customer` key part ([`Domain`]): the key hashes
//! it (with any `const:` parts), overrides and concurrency groups match it.
//!
//! [`Limiter::build`]: crate::runtime::limiter::Limiter::build

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::IntGauge;

use crate::config::{Config, API_ORIGIN};
use crate::limits::{Fact, Facts, KeyPart};
use crate::metrics::Metrics;
use crate::runtime::limit::{Building, LimitRt, StateId};
use crate::runtime::limiter::{Limiter, LimiterError};
use crate::runtime::stores::Stores;
use crate::runtime::Carried;
use crate::segments::Segment;
use crate::store::stable_key_hash;

/// A command's domain, as the facts a resource's limit reads: the `customer` part is the
/// domain, a `const:` part its text, any other part is absent (the config refuses them).
#[derive(Debug, Clone, Copy)]
pub struct Domain<'a>(pub &'a [u8]);

impl Facts for Domain<'_> {
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
        match part {
            KeyPart::Customer => Some(Fact::Bytes(self.0)),
            KeyPart::Const(text) => Some(Fact::Bytes(text.as_bytes())),
            _ => None,
        }
    }
}

/// One resource, live.
pub struct ResourceRt {
    /// The limit: name, key, variants, decision counters.
    pub limit: LimitRt,
    /// `tollgate_api_holds{resource}`: copies held through the API, kept by the holders.
    pub holds: IntGauge,
}

impl ResourceRt {
    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.limit.name
    }

    /// The state key of `domain` (the portable hash for a shared store, the in-process
    /// one otherwise), or `None` if the key has a part the domain cannot give (never, for
    /// a config that parsed).
    pub fn key(&self, domain: &Domain<'_>) -> Option<u64> {
        if self.limit.shared {
            stable_key_hash(&self.limit.key, domain)
        } else {
            self.limit.key.hash(domain)
        }
    }

    /// The variant that applies to `domain`: its index and limiter.
    pub fn select(&self, domain: &Domain<'_>) -> (usize, &Limiter) {
        let v = self.limit.select(domain);
        (v, &self.limit.variants[v].limiter)
    }
}

/// Every resource of a config, by name.
#[derive(Default)]
pub struct Resources {
    list: Vec<ResourceRt>,
    by_name: HashMap<Box<[u8]>, usize>,
}

impl Resources {
    /// The resource called `name` (the bytes a command sent).
    pub fn get(&self, name: &[u8]) -> Option<&ResourceRt> {
        self.by_name.get(name).and_then(|&i| self.list.get(i))
    }

    /// Every resource, config order.
    pub fn iter(&self) -> impl Iterator<Item = &ResourceRt> {
        self.list.iter()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every variant's identity with its limiter, for the next reload to look up.
    pub fn states(&self) -> impl Iterator<Item = (StateId, &Limiter)> {
        self.list.iter().flat_map(|r| r.limit.states(API_ORIGIN))
    }

    /// Builds `config`'s resources, reusing `previous` states of the same identity and
    /// shape (counted in `carried`), as origins' limits are built.
    pub(crate) fn build(
        config: &Config,
        previous: &HashMap<StateId, &Limiter>,
        segments: &HashMap<String, Arc<Segment>>,
        stores: &Stores,
        metrics: &Metrics,
        carried: &mut Carried,
    ) -> Result<Self, (String, LimiterError)> {
        // Resources are decided by the limiter API, which keeps no heavy hitters.
        let tops = HashMap::new();
        let at = Building {
            origin: API_ORIGIN,
            previous,
            segments,
            stores,
            tops: &tops,
            // Resources have no upstream (and no inflight kind).
            servers: &[],
        };
        let mut out = Resources::default();
        for resource in &config.resources {
            let kind = resource.params.kind();
            let counters = metrics.decisions(API_ORIGIN, &resource.name, kind.name());
            let limit = LimitRt::build(&at, resource, 0, counters, carried)
                .map_err(|e| (resource.name.clone(), e))?;
            let holds = metrics
                .api_holds
                .with_label_values(&[resource.name.as_str()]);
            out.by_name
                .insert(resource.name.as_bytes().into(), out.list.len());
            out.list.push(ResourceRt { limit, holds });
        }
        Ok(out)
    }
}
