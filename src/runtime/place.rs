//! Where a limit variant's state lives ([`Place`]): in this process, or in a shared store
//! ([`InStore`]); and which state a reload keeps ([`place`]): the previous variant's when
//! it is in the same place (the very same store, for a shared one) with the same shape,
//! so unchanged limits keep their counts over a reload (`crate::runtime::limiter`).

use std::sync::Arc;

use crate::limits::lease::LeaseParams;
use crate::runtime::limiter::{LimiterError, SharedAt};
use crate::store::{
    KeyNames, RedisStore, SharedConcurrency, SharedInflight, SharedRate, SharedSlidingLog,
    SharedTiered, SharedTokenBucket,
};

/// Where a kind's state lives: in this process, or in a shared store.
pub enum Place<L, R> {
    /// In this process: the in-process limiter.
    Local(Arc<L>),
    /// In a shared store: the store's limiter, with its fallback.
    Store(InStore<R>),
}

impl<L, R: InStoreLimiter> Place<L, R> {
    /// Whether the state is a store's, leased as `lease` says (`None`: not leased): a
    /// reload keeps a shared limiter only with the same lease settings.
    pub(crate) fn leased_as(&self, lease: Option<LeaseParams>) -> bool {
        matches!(self, Place::Store(s) if s.limiter.lease_params() == lease)
    }
}

/// A kind's limiter in a shared store.
pub struct InStore<R> {
    /// The store's name (`store:` of the limit).
    pub store: String,
    /// The store's limiter: its script calls, deny cache, fallback and renewals.
    pub limiter: Arc<R>,
}

impl<R> Clone for InStore<R> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<L, R> Place<L, R> {
    /// The in-process state, if the state lives here.
    pub fn local(&self) -> Option<&Arc<L>> {
        match self {
            Place::Local(l) => Some(l),
            Place::Store(_) => None,
        }
    }

    /// Whether the state lives in a shared store.
    pub fn is_shared(&self) -> bool {
        matches!(self, Place::Store(_))
    }
}

/// A shared limiter, which a reload keeps only while it decides in the very same store.
pub trait InStoreLimiter {
    /// The store it decides in.
    fn store(&self) -> &RedisStore;

    /// How its hot keys lease (`None`: not leased, or a kind that never leases).
    fn lease_params(&self) -> Option<LeaseParams>;
}

macro_rules! in_store {
    ($($t:ty => |$s:ident| $lease:expr),* $(,)?) => {
        $(impl InStoreLimiter for $t {
            fn store(&self) -> &RedisStore {
                <$t>::store(self)
            }

            fn lease_params(&self) -> Option<LeaseParams> {
                let $s = self;
                $lease
            }
        })*
    };
}

in_store!(
    SharedTiered => |_s| None,
    SharedSlidingLog => |_s| None,
    SharedRate => |s| s.lease_params(),
    SharedTokenBucket => |s| s.lease_params(),
    SharedInflight => |s| s.holdings().lease_params(),
    SharedConcurrency => |s| s.holdings().lease_params(),
);

/// The state of a variant: `previous`'s when it is in the same place (in process, or in
/// the very same store under the same name: a store whose settings changed is a new one,
/// and the limiter must not keep deciding in the old) and `same` says its shape (for that
/// place) is unchanged, then `true`; else a new one, built in process by `local` or in the
/// store by `shared`.
pub(crate) fn place<L, R: InStoreLimiter>(
    previous: Option<&Place<L, R>>,
    same: impl FnOnce(bool) -> bool,
    at: Option<SharedAt<'_>>,
    local: impl FnOnce() -> Result<L, String>,
    shared: impl FnOnce(&RedisStore, KeyNames, usize) -> Result<R, String>,
) -> Result<(Place<L, R>, bool), LimiterError> {
    if let Some(previous) = previous {
        if same(previous.is_shared()) {
            match (previous, &at) {
                (Place::Local(state), None) => return Ok((Place::Local(Arc::clone(state)), true)),
                (Place::Store(s), Some(at))
                    if s.store == at.name && s.limiter.store().same_as(at.store) =>
                {
                    return Ok((Place::Store(s.clone()), true));
                }
                (Place::Local(_), Some(_)) | (Place::Store(_), Some(_) | None) => {}
            }
        }
    }
    let fresh = match at {
        None => Place::Local(Arc::new(local().map_err(LimiterError)?)),
        Some(at) => Place::Store(InStore {
            store: at.name.to_string(),
            limiter: Arc::new(shared(at.store, at.names, at.deny_cache).map_err(LimiterError)?),
        }),
    };
    Ok((fresh, false))
}
