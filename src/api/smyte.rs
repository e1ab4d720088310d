//! Smyte's commands on ad-hoc token buckets: `RL.REDUCE` and `RL.GET`, and their
//! millisecond forms `RL.PREDUCE` and `RL.PGET`.
//!
//! ```text
//! RL.REDUCE  key max refill_seconds [REFILL amount] [TAKE n] [AT unix_seconds] [STRICT]
//! RL.GET     key max refill_seconds [REFILL amount] [AT unix_seconds]
//! RL.PREDUCE key max refill_ms [REFILL amount] [TAKE n] [AT unix_ms] [STRICT]
//! RL.PGET    key max refill_ms [REFILL amount] [AT unix_ms]
//! ```
//!
//! The millisecond forms are the same commands on the same buckets (a bucket's period is
//! kept in nanoseconds, so `RL.PREDUCE k 2 60000` is `RL.REDUCE k 2 60`'s bucket), their
//! `AT` with up to 6 decimals. Smyte's `RL.SESSIONIZE` and `RL.PSESSIONIZE` are not served:
//! they reply the start of the caller's session of limited requests besides the tokens,
//! which needs a session mark per bucket (in the table and in the Redis scripts).
//!
//! `RL.REDUCE` replies the integer count of tokens the bucket held (after due refills)
//! before this take; the take happened iff the reply is at least `n`. `REFILL` defaults to
//! `max` (the whole bucket refills every `refill_seconds`: `2 60` reads "two per
//! minute"), `TAKE` to 1. `STRICT`: a rejected take also resets the refill clock. `RL.GET`
//! reads without taking. The bucket is [`AdhocBuckets`]'s,
//! identified by `(key, max, refill_seconds, amount)`.
//!
//! **Time.** `AT` is the caller's clock in Unix seconds (a fraction of up to 9 digits is
//! allowed), so a history can be replayed; without it the server's wall clock is used
//! (`TIME` shows it). Within a bucket time never goes backwards: an `AT` older than the
//! bucket's last refill is taken as that instant.
//!
//! **Numbers.** Decimal digits only: no sign, no spaces, no exponent. `max` and `amount`
//! are 1 to 2⁶³-1 (replies are RESP integers), `n` 0 to 2⁶³-1, `refill_seconds` 1 to
//! 18 446 744 073 and `AT` 0 to 18 446 744 073 (so that nanoseconds fit 64 bits: 584
//! years, past 2554); in milliseconds, `refill_ms` 1 to 18 446 744 073 709 and `AT` 0 to
//! that. Anything else is an `-ERR` naming the argument.
//!
//! **Where buckets live.** In the in-process table of `api.max_keys` buckets by default;
//! with `api.store` naming a Redis store, in Redis, so that a fleet shares them: one
//! `token_bucket.lua` call per command (`token_bucket_get.lua` for `RL.GET`) at Redis's
//! clock, or at `AT` (in microseconds). A bucket's parameters stay part of its identity:
//! they are in its key name, `PREFIX _rl:MAX:AMOUNT:SECONDS:{HASH}:tb` (`MSms` for a period
//! that is not whole seconds), `HASH` the stable
//! hash of the key's bytes (`crate::store::key`). The scripts compute in doubles, so on a
//! Redis store `max`, `REFILL` and `TAKE` are at most 2⁵⁰ and `refill_seconds` at most
//! 1 125 899 906 (2⁵⁰ µs). When the store cannot answer within its budget (or its breaker
//! is open), its `fallback` decides: `local` with the in-process table at this instance's
//! share of the bucket (capacity and refill divided by `instances`), `allow` as if the
//! bucket were full, `deny` as if it were empty.
//!
//! **Not switched.** The kill switch does not apply here (it does to `CH.*`): an ad-hoc
//! bucket is not a configured limit, and the reply is a token count, not a decision the
//! switch could turn into a grant without misreporting the bucket.
//!
//! **Differences from Smyte's implementation.** The commands, arguments and reply are
//! Smyte's, but what a take does follows this project's contract (the reply is the tokens
//! before the take; the take happened iff the reply is at least `n`; a refused take changes
//! nothing, except that `STRICT` resets the refill clock), which Smyte's own
//! `getAndReduceTokens` (smyte/ratelimit, `RateLimitHandler.cpp`) does not keep:
//! - **A refused take.** Smyte writes `max(tokens - take, 0)` whether the take fits or not,
//!   so a refused `TAKE 5` on a bucket of 3 empties it. Here it takes nothing: otherwise a
//!   caller told "no" would still have spent the tokens (breaking "the take happened iff
//!   reply >= n"), and a client retrying a large take would keep the bucket empty, starving
//!   the smaller takes that fit, its own retries included.
//! - **`STRICT`.** Smyte resets the refill clock whenever the bucket ends at 0: after any
//!   refusal (which always empties it there) and after a successful take of the last
//!   tokens, pushing the next refill a whole `refill_seconds` past that take. Here only a
//!   refusal resets it; a take that succeeds never moves the clock, so strictness punishes
//!   asking when there is not enough, not using what there was.
//! - **A full bucket** restarts its clock when it refills to full (a full bucket is an absent
//!   one, as a new key is in both). Smyte keeps the last refill mark, so a bucket drained
//!   after being full for a while may get its first refill sooner than `refill_seconds`.
//! - **An old `AT`.** Both ignore it for refills, but Smyte's `STRICT` refusal at an old `AT`
//!   rewinds the clock to it; here time never goes backwards within a bucket.
//! - **`AT`** may carry a fraction of a second here; Smyte's is whole seconds.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use super::command::{Ctx, Finish, Outcome};
use super::reply::Quoted;
use super::resp::Args;
use crate::limits::clock::{Nanos, NANOS_PER_SEC};
use crate::limits::{AdhocBuckets, AdhocParams, TokenBucketParams};
use crate::store::key::STABLE_SEED;
use crate::store::local_share::local_bucket_share;
use crate::store::redis::SCRIPT_MAX;
use crate::store::{Fallback, KeyNames, RedisStore};

/// The largest number of seconds whose nanoseconds fit a `u64`.
pub const MAX_SECONDS: u64 = u64::MAX / NANOS_PER_SEC;

/// The largest count a RESP integer reply can carry.
pub(crate) const MAX_COUNT: u64 = i64::MAX as u64;

/// The server's wall clock in nanoseconds since the Unix epoch (0 before it).
pub fn unix_nanos() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, crate::limits::clock::nanos)
}

/// A parsed `RL.REDUCE` or `RL.GET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCall<'a> {
    /// The bucket's key, as sent.
    pub key: &'a [u8],
    /// Its parameters (`every` in nanoseconds).
    pub params: AdhocParams,
    /// Tokens to take (`TAKE`, default 1; 0 for `RL.GET`).
    pub take: u64,
    /// `STRICT` was given.
    pub strict: bool,
    /// `AT` in nanoseconds since the Unix epoch, if given.
    pub at: Option<Nanos>,
    /// The unit the command's times were given in.
    pub unit: Unit,
}

/// Why a call's arguments are refused; displayed as the `-ERR` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgError<'a> {
    /// A number that is not one, or out of its range.
    Number {
        /// The argument's name.
        name: &'static str,
        /// The smallest value allowed.
        min: u64,
        /// The largest value allowed.
        max: u64,
        /// What was sent.
        got: &'a [u8],
    },
    /// A time (digits, then optionally `.` and decimals down to the nanosecond) that is
    /// not one, or out of its range: `AT` and `CH.TRANSFER`'s `ttl_seconds`.
    Time {
        /// The argument's name.
        name: &'static str,
        /// Its unit.
        unit: Unit,
        /// Whether 0 is refused (the smallest value is then just above it).
        positive: bool,
        /// The largest value allowed, in whole seconds.
        max: u64,
        /// What was sent.
        got: &'a [u8],
    },
    /// An option this command does not know.
    UnknownOption(&'static str, &'a [u8]),
    /// An option given without its value.
    MissingValue(&'static str),
    /// An option given twice.
    Duplicate(&'static str),
}

impl fmt::Display for ArgError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number {
                name,
                min,
                max,
                got,
            } => write!(
                f,
                "ERR invalid '{name}': expected an integer from {min} to {max}, got '{}'",
                Quoted(got)
            ),
            Self::Time {
                name,
                unit,
                positive,
                max,
                got,
            } => write!(
                f,
                "ERR invalid '{name}': expected {} {} to {max}, with up to {} decimal places, got '{}'",
                match unit {
                    Unit::Seconds => "seconds",
                    Unit::Millis => "milliseconds",
                },
                if *positive { "above 0 and up" } else { "from 0" },
                unit.decimals(),
                Quoted(got)
            ),
            Self::UnknownOption(command, option) => write!(
                f,
                "ERR syntax error: unknown option '{}' for '{command}'",
                Quoted(option)
            ),
            Self::MissingValue(option) => {
                write!(f, "ERR syntax error: option '{option}' needs a value")
            }
            Self::Duplicate(option) => write!(f, "ERR syntax error: option '{option}' given twice"),
        }
    }
}

/// A decimal integer in `min..=max`: digits only.
pub(crate) fn number<'a>(
    name: &'static str,
    text: &'a [u8],
    min: u64,
    max: u64,
) -> Result<u64, ArgError<'a>> {
    let bad = ArgError::Number {
        name,
        min,
        max,
        got: text,
    };
    if text.is_empty() || text.len() > 20 {
        return Err(bad);
    }
    let mut value: u64 = 0;
    for &d in text {
        if !d.is_ascii_digit() {
            return Err(bad);
        }
        value = match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')))
        {
            Some(v) => v,
            None => return Err(bad),
        };
    }
    if value < min || value > max {
        return Err(bad);
    }
    Ok(value)
}

/// The unit of a command's times (`refill` and `AT`): seconds for `RL.REDUCE` and `RL.GET`,
/// milliseconds for Smyte's `RL.PREDUCE` and `RL.PGET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds: `AT` may carry up to 9 decimals.
    Seconds,
    /// Milliseconds: `AT` may carry up to 6 decimals.
    Millis,
}

impl Unit {
    /// Nanoseconds in one unit.
    const fn nanos(self) -> u64 {
        match self {
            Unit::Seconds => NANOS_PER_SEC,
            Unit::Millis => 1_000_000,
        }
    }

    /// Decimal places below one unit that still count whole nanoseconds.
    const fn decimals(self) -> usize {
        match self {
            Unit::Seconds => 9,
            Unit::Millis => 6,
        }
    }

    /// The largest count of units whose nanoseconds fit a `u64`.
    pub const fn max(self) -> u64 {
        u64::MAX / self.nanos()
    }

    /// The name of a refill period in this unit, as errors quote it.
    const fn refill_name(self) -> &'static str {
        match self {
            Unit::Seconds => "refill_seconds",
            Unit::Millis => "refill_ms",
        }
    }
}

/// A time in `unit`s (Unix time for `AT`) with an optional fraction down to the
/// nanosecond, in nanoseconds.
fn unix_time(text: &[u8], unit: Unit) -> Result<Nanos, ArgError<'_>> {
    let bad = ArgError::Time {
        name: "AT",
        unit,
        positive: false,
        max: unit.max(),
        got: text,
    };
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    let units = number("AT", whole, 0, unit.max()).map_err(|_| bad.clone())?;
    let places = unit.decimals();
    if fraction.len() > places || !fraction.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    let mut nanos: u64 = 0;
    for i in 0..places {
        nanos = nanos * 10 + fraction.get(i).map_or(0, |&d| u64::from(d - b'0'));
    }
    // max · unit + the largest fraction may pass u64::MAX by under a unit: saturate.
    Ok((units * unit.nanos()).saturating_add(nanos))
}

/// Parses `RL.REDUCE` (`reduce`) or `RL.GET` arguments (`args[0]` is the name), or with
/// [`Unit::Millis`] those of `RL.PREDUCE` and `RL.PGET`.
pub fn parse<'a>(
    args: &Args<'a>,
    reduce: bool,
    unit: Unit,
) -> Result<BucketCall<'a>, ArgError<'a>> {
    let command = match (reduce, unit) {
        (true, Unit::Seconds) => "RL.REDUCE",
        (false, Unit::Seconds) => "RL.GET",
        (true, Unit::Millis) => "RL.PREDUCE",
        (false, Unit::Millis) => "RL.PGET",
    };
    let capacity = number("max", args.at(2), 1, MAX_COUNT)?;
    let period = number(unit.refill_name(), args.at(3), 1, unit.max())?;
    let (mut amount, mut take, mut at, mut strict) = (None, None, None, false);
    let mut i = 4;
    while let Some(option) = args.get(i) {
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        let name = if is("REFILL") {
            "REFILL"
        } else if is("TAKE") && reduce {
            "TAKE"
        } else if is("AT") {
            "AT"
        } else if is("STRICT") && reduce {
            if strict {
                return Err(ArgError::Duplicate("STRICT"));
            }
            strict = true;
            i += 1;
            continue;
        } else {
            return Err(ArgError::UnknownOption(command, option));
        };
        let value = args.get(i + 1).ok_or(ArgError::MissingValue(name))?;
        let (slot, parsed) = match name {
            "REFILL" => (&mut amount, number("REFILL", value, 1, MAX_COUNT)?),
            "TAKE" => (&mut take, number("TAKE", value, 0, MAX_COUNT)?),
            _ => (&mut at, unix_time(value, unit)?),
        };
        if slot.replace(parsed).is_some() {
            return Err(ArgError::Duplicate(name));
        }
        i += 2;
    }
    Ok(BucketCall {
        key: args.at(1),
        params: AdhocParams {
            capacity,
            amount: amount.unwrap_or(capacity),
            every: period * unit.nanos(),
        },
        take: if reduce { take.unwrap_or(1) } else { 0 },
        strict,
        at,
        unit,
    })
}

/// The Redis store `api.store` names, if the service follows a runtime that has one.
fn api_store(cx: &Ctx<'_>) -> Option<RedisStore> {
    let rt = cx.runtime?;
    rt.stores.get(rt.config.api.store.as_deref()?).cloned()
}

/// Refuses what the Redis scripts cannot compute exactly (module doc): the refill period
/// at most 2⁵⁰ µs (1 125 899 906 s, 1 125 899 906 842 ms).
fn store_bounds(call: &BucketCall<'_>) -> Result<(), String> {
    let unit = call.unit.nanos();
    let period = call.params.every / unit;
    let max_period = SCRIPT_MAX / (unit / 1_000);
    let too_big = [
        ("max", call.params.capacity, SCRIPT_MAX),
        ("REFILL", call.params.amount, SCRIPT_MAX),
        ("TAKE", call.take, SCRIPT_MAX),
        (call.unit.refill_name(), period, max_period),
    ];
    match too_big.iter().find(|(_, v, max)| v > max) {
        Some((name, v, max)) => Err(format!(
            "ERR invalid '{name}': at most {max} with api.store on Redis, got {v}"
        )),
        None => Ok(()),
    }
}

/// One `RL.*` call against a Redis store, with its fallback (module doc): `take` of `None`
/// reads (`RL.GET`).
struct StoreCall {
    store: RedisStore,
    names: KeyNames,
    hash: u64,
    params: TokenBucketParams,
    take: Option<u64>,
    at: Option<u64>,
    /// The in-process table, the fallback bucket's key and parameters, and the local time.
    local: (Arc<AdhocBuckets>, u64, AdhocParams, Nanos),
}

impl StoreCall {
    fn new(cx: &Ctx<'_>, store: RedisStore, call: &BucketCall<'_>, now: Nanos, read: bool) -> Self {
        let p = call.params;
        let params = TokenBucketParams {
            capacity: p.capacity,
            amount: p.amount,
            every: p.every,
            strict: call.strict,
        };
        // Whole seconds as `RL.REDUCE` has always named them (so `RL.PREDUCE k 2 60000`
        // and `RL.REDUCE k 2 60` share a bucket, as they do in-process), else milliseconds.
        let scope = if p.every.is_multiple_of(NANOS_PER_SEC) {
            format!(
                "_rl:{}:{}:{}",
                p.capacity,
                p.amount,
                p.every / NANOS_PER_SEC
            )
        } else {
            format!("_rl:{}:{}:{}ms", p.capacity, p.amount, p.every / 1_000_000)
        };
        let names = KeyNames::scoped(&store.config().tuning.prefix, &scope);
        let share = local_bucket_share(params, store.config().tuning.instances);
        let local = AdhocParams {
            capacity: share.capacity,
            amount: share.amount,
            every: share.every,
        };
        Self {
            names,
            hash: xxhash_rust::xxh3::xxh3_64_with_seed(call.key, STABLE_SEED),
            params,
            take: (!read).then_some(call.take),
            at: call.at.map(|at| at / 1_000),
            local: (
                Arc::clone(cx.service.buckets_arc()),
                cx.service.bucket_key(call.key, &local),
                local,
                now,
            ),
            store,
        }
    }

    /// The reply (tokens before the take, or held for a read) and whether a take happened.
    async fn run(self) -> (u64, bool) {
        let s = &self.store;
        let result = match self.take {
            Some(take) => s
                .token_bucket_many(&self.names, self.hash, &self.params, take, take, self.at)
                .await
                .map(|g| {
                    let v = g.verdict;
                    (
                        if v.allowed {
                            v.remaining + take
                        } else {
                            v.remaining
                        },
                        v.allowed,
                    )
                }),
            None => s
                .token_bucket_get(&self.names, self.hash, &self.params, self.at)
                .await
                .map(|(tokens, _)| (tokens, true)),
        };
        if let Ok(answer) = result {
            return answer;
        }
        s.metrics().fallback.inc();
        let take = self.take.unwrap_or(0);
        let capacity = self.params.capacity;
        match s.config().tuning.fallback {
            Fallback::Local => {
                let (buckets, key, params, now) = &self.local;
                match self.take {
                    Some(take) => {
                        let v = buckets.acquire(*key, *params, take, self.params.strict, *now);
                        (
                            if v.allowed {
                                v.remaining + take
                            } else {
                                v.remaining
                            },
                            v.allowed,
                        )
                    }
                    None => (buckets.state(*key, *params, *now), true),
                }
            }
            Fallback::Allow => (capacity.max(take), true),
            Fallback::Deny => (0, take == 0),
        }
    }
}

/// Defers `call` (a read with `read`) to the store, replying its answer as an integer.
fn on_store(
    cx: &mut Ctx<'_>,
    store: RedisStore,
    call: &BucketCall<'_>,
    now: Nanos,
    read: bool,
) -> Outcome {
    if let Err(e) = store_bounds(call) {
        return cx.error(format_args!("{e}"));
    }
    let work = StoreCall::new(cx, store, call, now, read);
    cx.defer(async move {
        let (reply, taken) = work.run().await;
        let finish: Finish = Box::new(move |cx: &mut Ctx<'_>| {
            cx.out.int(i64::try_from(reply).unwrap_or(i64::MAX));
            if taken {
                Outcome::Ok
            } else {
                Outcome::Rejected
            }
        });
        finish
    })
}

/// `RL.REDUCE`: replies the tokens held before the take.
pub fn reduce(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    take(cx, args, Unit::Seconds)
}

/// `RL.PREDUCE`: `RL.REDUCE` with its times in milliseconds.
pub fn preduce(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    take(cx, args, Unit::Millis)
}

/// `RL.GET`: replies the tokens the bucket holds.
pub fn get(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    read(cx, args, Unit::Seconds)
}

/// `RL.PGET`: `RL.GET` with its times in milliseconds.
pub fn pget(cx: &mut Ctx<'_>, args: &Args<'_>) -> Outcome {
    read(cx, args, Unit::Millis)
}

/// An `RL.*` bucket command (`reduce`: `RL.REDUCE` or `RL.PREDUCE`; otherwise `RL.GET` or
/// `RL.PGET`) parsed, with its time and its key in the in-process table; or its outcome
/// already: a refusal of its arguments, or the API's store answered it.
fn in_process<'a>(
    cx: &mut Ctx<'_>,
    args: &Args<'a>,
    reduce: bool,
    unit: Unit,
) -> Result<(BucketCall<'a>, Nanos, u64), Outcome> {
    let call = parse(args, reduce, unit).map_err(|e| cx.error(format_args!("{e}")))?;
    let now = call.at.unwrap_or_else(unix_nanos);
    if let Some(store) = api_store(cx) {
        return Err(on_store(cx, store, &call, now, !reduce));
    }
    let key = cx.service.bucket_key(call.key, &call.params);
    Ok((call, now, key))
}

/// `RL.REDUCE` or `RL.PREDUCE`.
fn take(cx: &mut Ctx<'_>, args: &Args<'_>, unit: Unit) -> Outcome {
    let (call, now, key) = match in_process(cx, args, true, unit) {
        Ok(local) => local,
        Err(outcome) => return outcome,
    };
    let v = cx
        .service
        .buckets()
        .acquire(key, call.params, call.take, call.strict, now);
    let before = if v.allowed {
        v.remaining + call.take
    } else {
        v.remaining
    };
    // before ≤ max ≤ i64::MAX.
    cx.out.int(before as i64);
    if v.allowed {
        Outcome::Ok
    } else {
        Outcome::Rejected
    }
}

/// `RL.GET` or `RL.PGET`.
fn read(cx: &mut Ctx<'_>, args: &Args<'_>, unit: Unit) -> Outcome {
    let (call, now, key) = match in_process(cx, args, false, unit) {
        Ok(local) => local,
        Err(outcome) => return outcome,
    };
    let tokens = cx.service.buckets().state(key, call.params, now);
    cx.out.int(tokens as i64);
    Outcome::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::resp::Parser;
    use bytes::BytesMut;

    fn call(line: &str, reduce: bool) -> Result<BucketCall<'static>, String> {
        call_in(line, reduce, Unit::Seconds)
    }

    fn call_in(line: &str, reduce: bool, unit: Unit) -> Result<BucketCall<'static>, String> {
        let mut p = Parser::new();
        let mut buf = BytesMut::from(format!("{line}\r\n").as_bytes());
        assert!(p.parse(&mut buf).unwrap());
        // Leak the parser so the call can borrow it for the test's duration.
        let p: &'static Parser = Box::leak(Box::new(p));
        parse(&p.args(), reduce, unit).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_options() {
        let c = call("RL.REDUCE k 2 60", true).unwrap();
        assert_eq!(
            (c.key, c.params, c.take, c.strict, c.at, c.unit),
            (
                &b"k"[..],
                AdhocParams {
                    capacity: 2,
                    amount: 2,
                    every: 60 * NANOS_PER_SEC
                },
                1,
                false,
                None,
                Unit::Seconds
            )
        );
        let c = call(
            "rl.reduce k 10 1 strict refill 3 at 1700000000.25 take 0",
            true,
        )
        .unwrap();
        assert_eq!(c.params.amount, 3);
        assert_eq!((c.take, c.strict), (0, true));
        assert_eq!(c.at, Some(1_700_000_000 * NANOS_PER_SEC + 250_000_000));
        let c = call("RL.GET k 5 1 REFILL 1 AT 7", false).unwrap();
        assert_eq!((c.take, c.at), (0, Some(7 * NANOS_PER_SEC)));
    }

    #[test]
    fn bad_numbers_name_the_argument() {
        let cases = [
            ("RL.REDUCE k abc 60", "ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got 'abc'"),
            ("RL.REDUCE k -1 60", "ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '-1'"),
            ("RL.REDUCE k 0 60", "ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '0'"),
            ("RL.REDUCE k 1180591620717411303424 60", "ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '1180591620717411303424'"),
            ("RL.REDUCE k 9223372036854775808 60", "ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '9223372036854775808'"),
            ("RL.REDUCE k 2 0", "ERR invalid 'refill_seconds': expected an integer from 1 to 18446744073, got '0'"),
            ("RL.REDUCE k 2 18446744074", "ERR invalid 'refill_seconds': expected an integer from 1 to 18446744073, got '18446744074'"),
            ("RL.REDUCE k 2 1.5", "ERR invalid 'refill_seconds': expected an integer from 1 to 18446744073, got '1.5'"),
            ("RL.REDUCE k 2 60 TAKE -1", "ERR invalid 'TAKE': expected an integer from 0 to 9223372036854775807, got '-1'"),
            ("RL.REDUCE k 2 60 REFILL 0", "ERR invalid 'REFILL': expected an integer from 1 to 9223372036854775807, got '0'"),
            ("RL.REDUCE k 2 60 AT -5", "ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got '-5'"),
            ("RL.REDUCE k 2 60 AT 1.1234567891", "ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got '1.1234567891'"),
            ("RL.REDUCE k 2 60 AT 1.x", "ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got '1.x'"),
            ("RL.REDUCE k 2 60 AT 18446744074", "ERR invalid 'AT': expected seconds from 0 to 18446744073, with up to 9 decimal places, got '18446744074'"),
            ("RL.REDUCE k 2 60 TAKE", "ERR syntax error: option 'TAKE' needs a value"),
            ("RL.REDUCE k 2 60 TAKE 1 TAKE 2", "ERR syntax error: option 'TAKE' given twice"),
            ("RL.REDUCE k 2 60 STRICT STRICT", "ERR syntax error: option 'STRICT' given twice"),
            ("RL.REDUCE k 2 60 FAST", "ERR syntax error: unknown option 'FAST' for 'RL.REDUCE'"),
            ("RL.GET k 2 60 TAKE 1", "ERR syntax error: unknown option 'TAKE' for 'RL.GET'"),
            ("RL.GET k 2 60 STRICT", "ERR syntax error: unknown option 'STRICT' for 'RL.GET'"),
        ];
        for (line, want) in cases {
            assert_eq!(
                call(line, line.starts_with("RL.REDUCE")),
                Err(want.to_string()),
                "{line}"
            );
        }
        // The largest values pass.
        let c = call(
            "RL.REDUCE k 9223372036854775807 18446744073 AT 18446744073.999999999",
            true,
        )
        .unwrap();
        assert_eq!(c.params.every, MAX_SECONDS * NANOS_PER_SEC);
        assert_eq!(c.at, Some(u64::MAX));
    }

    #[test]
    fn millisecond_commands_read_their_times_in_milliseconds() {
        let c = call_in("RL.PREDUCE k 2 1500 AT 1700000000123.5", true, Unit::Millis).unwrap();
        assert_eq!(c.params.every, 1_500_000_000);
        assert_eq!(c.at, Some(1_700_000_000_123_500_000));
        // The same bucket as the seconds command with the same period.
        let s = call("RL.REDUCE k 2 60", true).unwrap();
        let m = call_in("RL.PREDUCE k 2 60000", true, Unit::Millis).unwrap();
        assert_eq!(s.params, m.params);
        let g = call_in("RL.PGET k 2 10 AT 5", false, Unit::Millis).unwrap();
        assert_eq!((g.take, g.at), (0, Some(5_000_000)));
        let cases = [
            ("RL.PREDUCE k 2 0", "ERR invalid 'refill_ms': expected an integer from 1 to 18446744073709, got '0'"),
            ("RL.PREDUCE k 2 1 AT 1.1234567", "ERR invalid 'AT': expected milliseconds from 0 to 18446744073709, with up to 6 decimal places, got '1.1234567'"),
            ("RL.PGET k 2 1 TAKE 1", "ERR syntax error: unknown option 'TAKE' for 'RL.PGET'"),
        ];
        for (line, want) in cases {
            let reduce = line.starts_with("RL.PREDUCE");
            assert_eq!(
                call_in(line, reduce, Unit::Millis),
                Err(want.to_string()),
                "{line}"
            );
        }
    }
}
