//! Charon's operations on the resources of the live runtime (`resources:` in the config).
//!
//! ```text
//! CH.REQUEST  resource domain copies [MIN n]                  rate-like resources
//! CH.RESERVE  resource domain copies [MIN n]                  concurrency resources
//! CH.RELEASE  resource domain copies [GROUPS g ...]
//! CH.TRANSFER resource domain copies ttl_seconds [GROUPS g ...]   replies an id
//! CH.SEIZE    transfer_id
//! ```
//!
//! **How each kind answers.** `CH.REQUEST` asks a `token_bucket`, `rate`, `sliding_log` or
//! `tiered` resource for between `MIN` (default: `copies`) and `copies` units at once and
//! gets the largest count that fits, or none ([`Limiter::grant`]); nothing is held
//! afterwards. `CH.RESERVE` asks a `concurrency` resource for between `MIN` and `copies`
//! copies ([`ConcurrencyLimiter::reserve`](crate::limits::ConcurrencyLimiter::reserve)):
//! the domain's limit, the global limit and every group the domain belongs to must have
//! room; the copies are held by the connection until `CH.RELEASE`, `CH.TRANSFER` or the
//! connection's end (see [`super::ledger`]). The domain is the resource's `customer` key
//! part: it picks the key, the override and the groups.
//!
//! **Replies** are maps (RESP3) or flat arrays of field and value (RESP2), so every client
//! reads them as a dictionary. `CH.REQUEST`: `granted`, `remaining`, `limit`,
//! `retry_after_ms` (-1: never), `reset_after_ms`, `kind`, `source` (`local`, `store`,
//! `fallback`, `deny_cache`), `shadow_rejected`, and for a tiered resource `tier`,
//! `tier_limit`, `hard_limit`, `global_limit` and `decided_by` (`tier`, `no_tier`,
//! `hard_limit`, `global_limit`: which limit refused it or cut its grant), in-process or
//! in a store alike, `limit` being the current tier's. A request that can never succeed
//! (`MIN` above a limit, a group of `max: 0`) gets `retry_after_ms` -1. `CH.RESERVE`:
//! `granted`, `groups` (the groups the copies were taken from, which `CH.RELEASE` may
//! name), `held` (this connection's copies of the resource for the domain), `in_use` (the
//! domain's copies over every holder), `limit`, `global`, `retry_after_ms`,
//! `limited_by` (`domain`, `global`, `group:NAME` on a rejection) and `shadow_rejected`.
//!
//! **Shadow and kill switch.** A rejection by a variant in `mode: shadow`, or while the
//! kill switch is on, becomes a grant of `copies` that takes nothing, counted as
//! `shadow_rejected` (`shadow_rejected: 1` in the reply); a reserved copy of it is held and
//! released like any other. **Unconfigured resources** are granted and recorded (under
//! `_unconfigured`) when `api.allow_unconfigured` is on, and refused otherwise.
//!
//! **Counting.** `tollgate_limit_decisions_total{origin="_api", limit=RESOURCE}` counts
//! each `CH.REQUEST` and `CH.RESERVE` once: `allowed`, `rejected` or `shadow_rejected`.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::bounds::{MAX_DOMAIN_LEN, MAX_HOLDS_PER_CONNECTION, MAX_TRANSFER_TTL};
use super::command::{Ctx, Finish, Outcome};
use super::ledger::{Counted, Counter, LedgerError, NewReservation, Reservation, Slots};
use super::reply::{Quoted, Reply};
use super::resp::Args;
use super::smyte::{number, ArgError, MAX_COUNT};
use crate::config::{Kind, Mode, UNCONFIGURED};
use crate::limits::concurrency::{Limit, Rejection as ConcurrencyRejection};
use crate::limits::{DecidedBy, Nanos, NANOS_PER_SEC, NEVER};
use crate::log_budget::suppressed_note;
use crate::runtime::limiter::{ConcurrencyRt, Limiter, Place};
use crate::runtime::resources::{Domain, ResourceRt};
use crate::runtime::Runtime;
use crate::store::Source;

/// One value of a reply's map.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    Int(i64),
    Text(String),
    Null,
    List(Vec<String>),
}

/// A reply's fields, in order (module doc).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Fields(Vec<(&'static str, Val)>);

impl Fields {
    fn int(&mut self, name: &'static str, v: u64) -> &mut Self {
        self.0
            .push((name, Val::Int(i64::try_from(v).unwrap_or(i64::MAX))));
        self
    }

    /// Sets an integer field already written (in its place), or adds it.
    fn set_int(&mut self, name: &'static str, v: u64) {
        let v = Val::Int(i64::try_from(v).unwrap_or(i64::MAX));
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(field) => field.1 = v,
            None => self.0.push((name, v)),
        }
    }

    fn signed(&mut self, name: &'static str, v: i64) -> &mut Self {
        self.0.push((name, Val::Int(v)));
        self
    }

    fn text(&mut self, name: &'static str, v: impl Into<String>) -> &mut Self {
        self.0.push((name, Val::Text(v.into())));
        self
    }

    fn opt(&mut self, name: &'static str, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.int(name, v),
            None => {
                self.0.push((name, Val::Null));
                self
            }
        }
    }

    fn list(&mut self, name: &'static str, v: Vec<String>) -> &mut Self {
        self.0.push((name, Val::List(v)));
        self
    }

    fn write(&self, out: &mut Reply<'_>) {
        out.map(self.0.len());
        for (name, v) in &self.0 {
            out.text(name);
            match v {
                Val::Int(n) => out.int(*n),
                Val::Text(t) => out.text(t),
                Val::Null => out.null(),
                Val::List(items) => {
                    out.array(items.len());
                    items.iter().for_each(|i| out.text(i));
                }
            }
        }
    }
}

/// Milliseconds, rounded up; -1 for [`NEVER`].
fn millis(ns: Nanos) -> i64 {
    if ns == NEVER {
        return -1;
    }
    i64::try_from(ns.div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// The resource, domain, copies and `MIN` of `CH.REQUEST` and `CH.RESERVE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The resource's name, as sent.
    pub resource: &'a [u8],
    /// The domain.
    pub domain: &'a [u8],
    /// Copies wanted, at most.
    pub copies: u64,
    /// Copies wanted, at least (`MIN`, default `copies`).
    pub min: u64,
}

/// Why arguments are refused; displayed as the `-ERR` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskError<'a> {
    /// A number, option or repeat, as `RL.*` reports them.
    Arg(ArgError<'a>),
    /// A domain that is empty or longer than [`MAX_DOMAIN_LEN`].
    Domain(usize),
    /// `MIN` above `copies`.
    MinAboveCopies(u64, u64),
    /// More `GROUPS` names than a limiter has groups.
    TooManyGroups(usize),
}

impl<'a> From<ArgError<'a>> for AskError<'a> {
    fn from(e: ArgError<'a>) -> Self {
        AskError::Arg(e)
    }
}

impl fmt::Display for AskError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AskError::Arg(e) => e.fmt(f),
            AskError::Domain(len) => write!(
                f,
                "ERR invalid 'domain': expected 1 to {MAX_DOMAIN_LEN} bytes, got {len}"
            ),
            AskError::MinAboveCopies(min, copies) => {
                write!(f, "ERR invalid 'MIN': {min} is above copies {copies}")
            }
            AskError::TooManyGroups(n) => write!(
                f,
                "ERR syntax error: {n} group names; at most {}",
                crate::limits::concurrency::MAX_GROUPS
            ),
        }
    }
}

fn domain<'a>(text: &'a [u8]) -> Result<&'a [u8], AskError<'a>> {
    if text.is_empty() || text.len() > MAX_DOMAIN_LEN {
        return Err(AskError::Domain(text.len()));
    }
    Ok(text)
}

/// Parses `CH.REQUEST` or `CH.RESERVE` arguments (`args[0]` is the name).
pub fn parse_ask<'a>(args: &Args<'a>, command: &'static str) -> Result<Ask<'a>, AskError<'a>> {
    let domain = domain(args.at(2))?;
    let copies = number("copies", args.at(3), 1, MAX_COUNT)?;
    let mut min = None;
    let mut i = 4;
    while let Some(option) = args.get(i) {
        if !option.eq_ignore_ascii_case(b"MIN") {
            return Err(ArgError::UnknownOption(command, option).into());
        }
        let value = args.get(i + 1).ok_or(ArgError::MissingValue("MIN"))?;
        if min.replace(number("MIN", value, 1, MAX_COUNT)?).is_some() {
            return Err(ArgError::Duplicate("MIN").into());
        }
        i += 2;
    }
    let min = min.unwrap_or(copies);
    if min > copies {
        return Err(AskError::MinAboveCopies(min, copies));
    }
    Ok(Ask {
        resource: args.at(1),
        domain,
        copies,
        min,
    })
}

/// `[GROUPS g ...]` from argument `from` on: `None` when absent.
fn parse_groups<'a>(
    args: &Args<'a>,
    from: usize,
    command: &'static str,
) -> Result<Option<Vec<&'a [u8]>>, AskError<'a>> {
    let Some(option) = args.get(from) else {
        return Ok(None);
    };
    if !option.eq_ignore_ascii_case(b"GROUPS") {
        return Err(ArgError::UnknownOption(command, option).into());
    }
    let names: Vec<&[u8]> = args.iter_from(from + 1).collect();
    if names.len() > crate::limits::concurrency::MAX_GROUPS {
        return Err(AskError::TooManyGroups(names.len()));
    }
    Ok(Some(names))
}

/// Polls a future that is known to complete without waiting (an in-process decision)
/// once; `None` if it did not.
fn ready<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Whether rejections become grants for `variant` of `r` now: the kill switch, or
/// `mode: shadow`.
fn lenient(rt: &Runtime, r: &ResourceRt, variant: usize) -> bool {
    rt.kill.on() || r.limit.variants[variant].mode == Mode::Shadow
}

/// Logs a rejection turned into a grant, within the resource's log budget.
fn log_shadow(r: &ResourceRt, now: Nanos) {
    if let Some(suppressed) = r.limit.log.admit(now) {
        log::info!(
            "shadow: resource `{}` of the limiter API would reject{}",
            r.name(),
            suppressed_note(suppressed)
        );
    }
}

/// A reservation's outcome counted in `r`'s counters: what was taken (`None` on a
/// rejection), the copies forced through a rejection that shadow mode or the kill switch
/// turned into a grant (`copies`, else 0), and the rejection, if any.
fn counted<T, R>(
    rt: &Runtime,
    r: &ResourceRt,
    variant: usize,
    now: Nanos,
    outcome: Result<T, R>,
    copies: u64,
) -> (Option<T>, u64, Option<R>) {
    let counters = &r.limit.counters;
    match outcome {
        Ok(taken) => {
            counters.allowed.inc();
            (Some(taken), 0, None)
        }
        Err(rejection) if lenient(rt, r, variant) => {
            counters.shadow_rejected.inc();
            log_shadow(r, now);
            (None, copies, Some(rejection))
        }
        Err(rejection) => {
            counters.rejected.inc();
            (None, 0, Some(rejection))
        }
    }
}

/// The error reply for a resource nobody configured (with `allow_unconfigured` off).
fn unknown_resource(cx: &mut Ctx<'_>, name: &[u8]) -> Outcome {
    cx.error(format_args!(
        "ERR unknown resource '{}' (configure it under `resources:`, or set api.allow_unconfigured to grant and count unknown ones)",
        Quoted(name)
    ))
}

/// The live runtime and its resource `name`. `Ok(None)`: there is no such resource and
/// `api.allow_unconfigured` grants it (counted as allowed under `_unconfigured`); `Err`:
/// the reply refusing it.
fn resource<'a>(
    cx: &mut Ctx<'a>,
    name: &[u8],
) -> Result<Option<(&'a Runtime, &'a ResourceRt)>, Outcome> {
    let found = cx
        .runtime
        .and_then(|rt| Some((rt, rt.resources.get(name)?)));
    if found.is_none() {
        if !cx.service.allow_unconfigured(cx.runtime) {
            return Err(unknown_resource(cx, name));
        }
        cx.service.unconfigured().counters.allowed.inc();
    }
    Ok(found)
}

/// `CH.REQUEST resource domain copies [MIN n]`.
pub fn request(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let ask = match parse_ask(args, "CH.REQUEST") {
        Ok(ask) => ask,
        Err(e) => return cx.error(format_args!("{e}")),
    };
    let found = match resource(cx, ask.resource) {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let Some((rt, r)) = found else {
        let mut f = Fields::default();
        f.int("granted", ask.copies)
            .opt("remaining", None)
            .opt("limit", None)
            .signed("retry_after_ms", 0)
            .signed("reset_after_ms", 0)
            .text("kind", UNCONFIGURED)
            .text("source", "local")
            .int("shadow_rejected", 0);
        f.write(&mut cx.out);
        return Outcome::Ok;
    };
    let dom = Domain(ask.domain);
    let (variant, limiter) = r.select(&dom);
    if !limiter.requestable() {
        return cx.error(format_args!(
            "ERR resource '{}' is a `{}` resource: use CH.RESERVE and CH.RELEASE",
            r.name(),
            limiter.kind()
        ));
    }
    let now = cx.service.now();
    if !limiter.is_shared() {
        return match ready(decide_request(rt, r, variant, ask, now)) {
            Some(answer) => replied(cx, answer),
            None => cx.error(format_args!("ERR internal error: a local decision waited")),
        };
    }
    // A store call: the work owns the runtime it decides in (the latest one, which a
    // reload may have replaced since this batch began) and looks the resource up again.
    let Some(live) = cx.service.runtime().map(arc_swap::Guard::into_inner) else {
        return cx.error(format_args!("ERR internal error: no runtime"));
    };
    let (name, domain) = (ask.resource.to_vec(), ask.domain.to_vec());
    let (copies, min) = (ask.copies, ask.min);
    cx.defer(async move {
        let ask = Ask {
            resource: &name,
            domain: &domain,
            copies,
            min,
        };
        let answer = match live.resources.get(&name) {
            Some(r) => {
                let (variant, _) = r.select(&Domain(&domain));
                decide_request(&live, r, variant, ask, now).await
            }
            None => Err(format!(
                "ERR resource '{}' was removed by a reload while deciding",
                String::from_utf8_lossy(&name)
            )),
        };
        let finish: Finish = Box::new(move |cx: &mut Ctx<'_>| replied(cx, answer));
        finish
    })
}

/// Writes a decided command's reply (its fields, or the error) and says its outcome.
fn replied(cx: &mut Ctx<'_>, answer: Result<(Fields, Outcome), String>) -> Outcome {
    match answer {
        Ok((fields, outcome)) => {
            fields.write(&mut cx.out);
            outcome
        }
        Err(e) => cx.error(format_args!("{e}")),
    }
}

/// Decides a request on variant `variant` of `r`, counts it, and says what to reply (or
/// the error to reply).
async fn decide_request(
    rt: &Runtime,
    r: &ResourceRt,
    variant: usize,
    ask: Ask<'_>,
    now: Nanos,
) -> Result<(Fields, Outcome), String> {
    let limiter = &r.limit.variants[variant].limiter;
    let mut f = Fields::default();
    let Some(key) = r.key(&Domain(ask.domain)) else {
        return Err("ERR internal error: no key for the domain".to_string());
    };
    // A resource looked up again after a reload may have become another kind.
    let g = match limiter.grant(key, ask.min, ask.copies, now, None).await {
        Ok(g) => g,
        Err(e) => return Err(format!("ERR resource '{}': {e}", r.name())),
    };
    let v = g.grant.verdict;
    let counters = &r.limit.counters;
    let (granted, shadow, outcome) = if v.allowed {
        counters.allowed.inc();
        (g.grant.granted, false, Outcome::Ok)
    } else if lenient(rt, r, variant) {
        counters.shadow_rejected.inc();
        log_shadow(r, now);
        (ask.copies, true, Outcome::Ok)
    } else {
        counters.rejected.inc();
        (0, false, Outcome::Rejected)
    };
    let tier_limit = g
        .tiered
        .and_then(|d| tier_limit(limiter, d.tier))
        .or(limiter.request_limit());
    f.int("granted", granted)
        .int("remaining", v.remaining)
        .opt("limit", tier_limit)
        .signed(
            "retry_after_ms",
            if v.allowed { 0 } else { millis(v.retry_after) },
        )
        .signed("reset_after_ms", millis(v.reset_after))
        .text("kind", limiter.kind().name())
        .text("source", source_name(g.source))
        .int("shadow_rejected", u64::from(shadow));
    if let (Some(d), Some(t)) = (g.tiered, limiter.tiered_params()) {
        f.int("tier", d.tier as u64)
            .opt("tier_limit", tier_limit)
            .opt("hard_limit", t.hard_limit)
            .opt("global_limit", t.global_limit)
            .text(
                "decided_by",
                match d.decided_by {
                    DecidedBy::TierWindow => "tier",
                    DecidedBy::NoTierEnterable => "no_tier",
                    DecidedBy::HardLimit => "hard_limit",
                    DecidedBy::GlobalLimit => "global_limit",
                },
            );
    }
    Ok((f, outcome))
}

/// The limit of tier `tier` (1-based; 0 is the fake tier, limit 0) of a tiered limiter,
/// in-process or in a store.
fn tier_limit(limiter: &Limiter, tier: usize) -> Option<u64> {
    let t = limiter.tiered_params()?;
    match tier.checked_sub(1) {
        None => Some(0),
        Some(i) => t.tiers.get(i).map(|t| t.limit),
    }
}

/// `CH.RESERVE resource domain copies [MIN n]`.
pub fn reserve(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let ask = match parse_ask(args, "CH.RESERVE") {
        Ok(ask) => ask,
        Err(e) => return cx.error(format_args!("{e}")),
    };
    let slot = match cx.session.ledger.slot(cx.service.hold_budget()) {
        Ok(slot) => slot,
        Err(e) => return ledger_error(cx, &e, &ask, None),
    };
    let found = match resource(cx, ask.resource) {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let Some((rt, r)) = found else {
        let u = cx.service.unconfigured();
        let name: Arc<str> = Arc::from(String::from_utf8_lossy(ask.resource).as_ref());
        let held = Reservation::new(
            NewReservation {
                resource: &name,
                domain: ask.domain,
                groups: 0,
                counted: None,
                key: 0,
                taken: 0,
                forced: ask.copies,
                gauge: &u.holds,
            },
            slot,
        );
        cx.session.ledger.add(held);
        let mut f = Fields::default();
        f.int("granted", ask.copies)
            .list("groups", Vec::new())
            .int(
                "held",
                cx.session.ledger.holding(ask.resource, ask.domain, None),
            )
            .opt("in_use", None)
            .opt("limit", None)
            .opt("global", None)
            .signed("retry_after_ms", 0)
            .text("kind", UNCONFIGURED)
            .int("shadow_rejected", 0);
        f.write(&mut cx.out);
        return Outcome::Ok;
    };
    let dom = Domain(ask.domain);
    let (variant, limiter) = r.select(&dom);
    let Limiter::Concurrency(c) = limiter else {
        let kind = limiter.kind();
        return cx.error(format_args!(
            "ERR resource '{}' is a `{kind}` resource: use CH.REQUEST",
            r.name()
        ));
    };
    let state = match &c.state {
        Place::Local(state) => state,
        Place::Store(_) => return reserve_shared(cx, ask, slot),
    };
    let Some(key) = r.key(&dom) else {
        return cx.error(format_args!("ERR internal error: no key for the domain"));
    };
    let now = cx.service.now();
    let mask = c.groups_of(&dom);
    let names: Arc<[String]> = c.groups.iter().map(|g| g.name.clone()).collect();
    let reserved = state.reserve(key, mask, ask.copies, ask.min);
    let (taken, forced, rejection) = counted(rt, r, variant, now, reserved, ask.copies);
    let decided = Reserved {
        taken: taken.unwrap_or(0),
        forced,
        rejection: rejection.as_ref(),
        mask,
        names: &names,
    };
    let counter = Counter::Local(Arc::clone(state));
    if let Some(held) = decided.hold(r, ask.domain, Some(counter), key, slot) {
        cx.session.ledger.add(held);
    }
    let groups = group_names(&names, mask);
    let holding = cx.session.ledger.holding(ask.resource, ask.domain, None);
    let (f, outcome) = decided.reply(c, groups, holding, state.held(key), None);
    f.write(&mut cx.out);
    outcome
}

/// `CH.RESERVE` on a concurrency resource kept in a shared store: one store call, deferred
/// (the connection answers its commands in order meanwhile). The work owns the latest
/// runtime and looks the resource up again, as `CH.REQUEST` does; the copies are held by
/// the store's guard (under this instance's lease, repaired from the local truth), which
/// the ledger entry owns, so they go back exactly once however the connection ends. The
/// reply's `in_use` is the copies *this instance* holds for the domain: the fleet's count
/// lives in the store, and reading it would cost a second round trip.
fn reserve_shared(cx: &mut Ctx<'_>, ask: Ask<'_>, slot: Slots) -> Outcome {
    let Some(live) = cx.service.runtime().map(arc_swap::Guard::into_inner) else {
        return cx.error(format_args!("ERR internal error: no runtime"));
    };
    let now = cx.service.now();
    let (name, domain) = (ask.resource.to_vec(), ask.domain.to_vec());
    let (copies, min) = (ask.copies, ask.min);
    cx.defer(async move {
        let answer = reserve_in_store(&live, &name, &domain, copies, min, now, slot).await;
        let finish: Finish = Box::new(move |cx: &mut Ctx<'_>| {
            let answer = answer.map(|(mut fields, held, outcome)| {
                if let Some(held) = held {
                    cx.session.ledger.add(held);
                }
                fields.set_int("held", cx.session.ledger.holding(&name, &domain, None));
                (fields, outcome)
            });
            replied(cx, answer)
        });
        finish
    })
}

/// The store side of [`reserve_shared`]: decides, counts, and builds the hold and the
/// reply (whose `held` the connection fills in).
async fn reserve_in_store(
    rt: &Runtime,
    name: &[u8],
    domain: &[u8],
    copies: u64,
    min: u64,
    now: Nanos,
    slot: Slots,
) -> Result<(Fields, Option<Reservation>, Outcome), String> {
    let Some(r) = rt.resources.get(name) else {
        return Err(format!(
            "ERR resource '{}' was removed by a reload while deciding",
            String::from_utf8_lossy(name)
        ));
    };
    let dom = Domain(domain);
    let (variant, limiter) = r.select(&dom);
    let Limiter::Concurrency(
        c @ ConcurrencyRt {
            state: Place::Store(shared),
            ..
        },
    ) = limiter
    else {
        return Err(format!(
            "ERR resource '{}' changed kind or store in a reload while deciding; ask again",
            r.name()
        ));
    };
    let Some(key) = r.key(&dom) else {
        return Err("ERR internal error: no key for the domain".to_string());
    };
    let mask = c.groups_of(&dom);
    let names: Arc<[String]> = c.groups.iter().map(|g| g.name.clone()).collect();
    let outcome = shared.limiter.acquire_range(key, mask, min, copies).await;
    let (guard, forced, rejection) = counted(rt, r, variant, now, outcome.value, copies);
    let decided = Reserved {
        taken: guard.as_ref().map_or(0, |g| g.copies()),
        forced,
        rejection: rejection.as_ref(),
        mask,
        names: &names,
    };
    let held = decided.hold(r, domain, guard.map(Counter::Shared), key, slot);
    // Forced copies took nothing from any group.
    let groups = if forced == 0 {
        group_names(&names, mask)
    } else {
        Vec::new()
    };
    let in_use = shared.limiter.holdings().in_use(key);
    let (f, outcome) = decided.reply(c, groups, 0, in_use, Some(outcome.source));
    Ok((f, held, outcome))
}

/// The names of the groups in `mask` (bit `i`: group `i`).
fn group_names(names: &[String], mask: u64) -> Vec<String> {
    names
        .iter()
        .enumerate()
        .filter(|(i, _)| mask >> i & 1 == 1)
        .map(|(_, n)| n.clone())
        .collect()
}

/// A `CH.RESERVE` decision, in process or in a store, ready to be replied.
struct Reserved<'a> {
    /// Copies the limiter took.
    taken: u64,
    /// Copies granted without taking anything, by shadow or the kill switch.
    forced: u64,
    /// Why the limiter refused, if it did.
    rejection: Option<&'a ConcurrencyRejection>,
    /// The request's groups.
    mask: u64,
    /// Every group's name, in bit order.
    names: &'a Arc<[String]>,
}

impl Reserved<'_> {
    /// Copies granted: taken or forced.
    fn granted(&self) -> u64 {
        self.taken + self.forced
    }

    /// The connection's hold of the granted copies of resource `r` for `domain`, if any
    /// were granted; `counter` counts the taken ones (`None`: nothing was taken, and the
    /// forced copies took nothing from any group).
    fn hold(
        &self,
        r: &ResourceRt,
        domain: &[u8],
        counter: Option<Counter>,
        key: u64,
        slot: Slots,
    ) -> Option<Reservation> {
        if self.granted() == 0 {
            return None;
        }
        let resource: Arc<str> = Arc::from(r.name());
        let new = NewReservation {
            resource: &resource,
            domain,
            groups: if counter.is_some() { self.mask } else { 0 },
            counted: counter.map(|counter| Counted {
                counter,
                names: Arc::clone(self.names),
            }),
            key,
            taken: self.taken,
            forced: self.forced,
            gauge: &r.holds,
        };
        Some(Reservation::new(new, slot))
    }

    /// The reply's fields (`groups`: the groups the copies came from; `held`: this
    /// connection's copies; `in_use`: the domain's; `source`: who decided, in a store)
    /// and the command's outcome.
    fn reply(
        &self,
        c: &ConcurrencyRt,
        groups: Vec<String>,
        held: u64,
        in_use: u64,
        source: Option<Source>,
    ) -> (Fields, Outcome) {
        let granted = self.granted();
        let retry = match (self.rejection, self.forced) {
            (Some(rej), 0) => millis(c.params.refusal(rej, self.mask).retry_after),
            (Some(_), _) | (None, _) => 0,
        };
        let mut f = Fields::default();
        f.int("granted", granted)
            .list("groups", if granted > 0 { groups } else { Vec::new() })
            .int("held", held)
            .int("in_use", in_use)
            .int("limit", c.max)
            .opt("global", c.params.global)
            .signed("retry_after_ms", retry)
            .text("kind", Kind::Concurrency.name());
        if let Some(source) = source {
            f.text("source", source_name(Some(source)));
        }
        if let Some(rej) = self.rejection {
            f.text("limited_by", limited_by(rej, self.names));
        }
        f.int("shadow_rejected", u64::from(self.forced > 0));
        let outcome = if granted > 0 {
            Outcome::Ok
        } else {
            Outcome::Rejected
        };
        (f, outcome)
    }
}

/// Who decided, as the replies' `source` says it: `local` (in process), `store`,
/// `fallback` or `deny_cache`.
fn source_name(source: Option<Source>) -> &'static str {
    match source {
        None => "local",
        Some(Source::Store) => "store",
        Some(Source::Fallback) => "fallback",
        Some(Source::DenyCache) => "deny_cache",
    }
}

/// Which limit turned a reservation down: `domain`, `global` or `group:NAME`.
fn limited_by(rej: &ConcurrencyRejection, names: &[String]) -> String {
    match rej.limit {
        Limit::Key => "domain".to_string(),
        Limit::Global => "global".to_string(),
        Limit::Group(i) => format!(
            "group:{}",
            names.get(usize::from(i)).map_or("?", String::as_str)
        ),
    }
}

/// The error reply of a ledger refusal.
fn ledger_error(
    cx: &mut Ctx<'_>,
    e: &LedgerError,
    ask: &Ask<'_>,
    groups: Option<&[&[u8]]>,
) -> Outcome {
    let within = match groups {
        None => String::new(),
        Some(g) => format!(
            " in groups [{}]",
            g.iter()
                .map(|n| Quoted(n).to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ),
    };
    match e {
        LedgerError::OverRelease { held, asked } => cx.error(format_args!(
            "ERR over-release: this connection holds {held} copies of '{}' for domain '{}'{within}, {asked} asked; nothing changed",
            Quoted(ask.resource),
            Quoted(ask.domain)
        )),
        LedgerError::Full(which) => cx.error(format_args!(
            "ERR too many holds ({which}: {MAX_HOLDS_PER_CONNECTION} per connection); release some first"
        )),
    }
}

/// `CH.RELEASE resource domain copies [GROUPS g ...]`.
pub fn release(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let parsed = held_ask(args).and_then(|ask| Ok((ask, parse_groups(args, 4, "CH.RELEASE")?)));
    let (ask, groups) = match parsed {
        Ok(p) => p,
        Err(e) => return cx.error(format_args!("{e}")),
    };
    let copies = ask.copies;
    let groups = groups.as_deref();
    match cx
        .session
        .ledger
        .release(ask.resource, ask.domain, copies, groups)
    {
        Ok(left) => {
            let mut f = Fields::default();
            f.int("released", copies).int("held", left);
            f.write(&mut cx.out);
            Outcome::Ok
        }
        Err(e) => ledger_error(cx, &e, &ask, groups),
    }
}

/// `resource domain copies`, with which `CH.RELEASE` and `CH.TRANSFER` start: an ask for
/// exactly `copies`.
fn held_ask<'a>(args: &Args<'a>) -> Result<Ask<'a>, AskError<'a>> {
    let domain = domain(args.at(2))?;
    let copies = number("copies", args.at(3), 1, MAX_COUNT)?;
    Ok(Ask {
        resource: args.at(1),
        domain,
        copies,
        min: copies,
    })
}

/// `ttl_seconds`: seconds with up to 9 decimals, above 0 and at most a day.
fn ttl(text: &[u8]) -> Result<Duration, AskError<'_>> {
    let max = MAX_TRANSFER_TTL.as_secs();
    let bad = AskError::Arg(ArgError::Time {
        name: "ttl_seconds",
        unit: super::smyte::Unit::Seconds,
        positive: true,
        max,
        got: text,
    });
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    let seconds = number("ttl_seconds", whole, 0, max).map_err(|_| bad.clone())?;
    if fraction.len() > 9 || !fraction.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    let nanos = (0..9).fold(0u64, |n, i| {
        n * 10 + fraction.get(i).map_or(0, |&d| u64::from(d - b'0'))
    });
    let ttl = seconds * NANOS_PER_SEC + nanos;
    if ttl == 0 || ttl > max * NANOS_PER_SEC {
        return Err(bad);
    }
    Ok(Duration::from_nanos(ttl))
}

/// `CH.TRANSFER resource domain copies ttl_seconds [GROUPS g ...]`.
pub fn transfer(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let parsed = held_ask(args).and_then(|ask| {
        let ttl = ttl(args.at(4))?;
        Ok((ask, ttl, parse_groups(args, 5, "CH.TRANSFER")?))
    });
    let (ask, ttl, groups) = match parsed {
        Ok(p) => p,
        Err(e) => return cx.error(format_args!("{e}")),
    };
    let copies = ask.copies;
    let groups = groups.as_deref();
    let budget = Arc::clone(cx.service.hold_budget());
    let holds = match cx
        .session
        .ledger
        .take_out(ask.resource, ask.domain, copies, groups, &budget)
    {
        Ok(holds) => holds,
        Err(e) => return ledger_error(cx, &e, &ask, groups),
    };
    match cx.service.transfers().park(holds, ttl) {
        Ok(id) => {
            cx.out.bulk(id.as_bytes());
            Outcome::Ok
        }
        Err((e, holds)) => {
            for h in holds {
                cx.session.ledger.add(h);
            }
            cx.error(format_args!("ERR {e}"))
        }
    }
}

/// `CH.SEIZE transfer_id`.
pub fn seize(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    let room = MAX_HOLDS_PER_CONNECTION.saturating_sub(cx.session.ledger.len());
    let holds = match cx.service.transfers().seize(args.at(1), room) {
        Ok(holds) => holds,
        Err(super::ledger::SeizeError::Unknown) => {
            return cx.error(format_args!(
                "ERR unknown transfer '{}': never made, already seized, or expired",
                Quoted(args.at(1))
            ))
        }
        Err(super::ledger::SeizeError::NoRoom(n)) => {
            return cx.error(format_args!(
                "ERR too many holds: the transfer has {n} entries and this connection room for {room}; release some first"
            ))
        }
    };
    let mut f = Fields::default();
    if let Some(first) = holds.first() {
        f.text("resource", first.resource()).text(
            "domain",
            String::from_utf8_lossy(first.domain()).into_owned(),
        );
    }
    let copies: u64 = holds.iter().map(Reservation::copies).sum();
    let mut groups: Vec<String> = Vec::new();
    for h in &holds {
        for g in h.group_names() {
            if !groups.iter().any(|x| x == g) {
                groups.push(g.to_string());
            }
        }
    }
    f.int("copies", copies).list("groups", groups);
    for h in holds {
        cx.session.ledger.add(h);
    }
    f.write(&mut cx.out);
    Outcome::Ok
}

#[cfg(test)]
mod tests;
