//! The `RL.REDUCE` contract's token bucket written out plainly, and a recorded history to
//! replay with `AT`: the oracle of the replay tests (in-process table and Redis store
//! alike). This is not Smyte's code: a refused take changes nothing (Smyte's empties the
//! bucket) and `STRICT` resets the clock on a refusal only (Smyte's whenever the bucket ends
//! at 0); `src/api/smyte.rs` lists the differences.

#![allow(dead_code)]

/// The contract's bucket in whole seconds: reply the tokens before the take, take iff they
/// suffice, and on a refusal change nothing but (`strict`) the refill clock.
pub struct Model {
    pub max: u64,
    pub amount: u64,
    pub every: u64,
    pub tokens: u64,
    /// `None`: absent (full).
    pub last: Option<u64>,
}

impl Model {
    pub fn reduce(&mut self, at: u64, take: u64, strict: bool) -> u64 {
        let (mut tokens, mut last) = match self.last {
            None => (self.max, at),
            Some(last) => (self.tokens, last),
        };
        let now = at.max(last);
        let n = (now - last) / self.every;
        tokens = (tokens + n * self.amount).min(self.max);
        last += n * self.every;
        if tokens == self.max {
            last = now;
        }
        let before = tokens;
        if tokens >= take {
            tokens -= take;
        } else if strict {
            last = now;
        }
        self.tokens = tokens;
        self.last = (tokens < self.max).then_some(last);
        before
    }
}

/// A recorded history of one caller's `RL.REDUCE`s on a bucket of 7, 2 back every 15 s:
/// its clock sometimes behind, some takes `STRICT`, and what each must reply.
pub struct History {
    /// `(at, take, strict)` per call.
    pub calls: Vec<(u64, u64, bool)>,
    /// The model's replies.
    pub want: Vec<i64>,
}

impl History {
    /// `n` calls from a fixed seed.
    pub fn recorded(n: usize) -> History {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        let mut model = Model {
            max: 7,
            amount: 2,
            every: 15,
            tokens: 0,
            last: None,
        };
        let mut now = 1_700_000_000u64;
        let (mut calls, mut want) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let at = if next(8) == 0 {
                now - next(40)
            } else {
                now += next(12);
                now
            };
            let take = next(4);
            let strict = next(3) == 0;
            want.push(model.reduce(at, take, strict) as i64);
            calls.push((at, take, strict));
        }
        History { calls, want }
    }

    /// The calls as one pipeline on bucket `key`.
    pub fn pipeline(&self, key: &str) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        for &(at, take, strict) in &self.calls {
            let cmd = pipe
                .cmd("RL.REDUCE")
                .arg(key)
                .arg(7)
                .arg(15)
                .arg("REFILL")
                .arg(2)
                .arg("TAKE")
                .arg(take)
                .arg("AT")
                .arg(at);
            if strict {
                cmd.arg("STRICT");
            }
        }
        pipe
    }
}
