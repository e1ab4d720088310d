//! The model of the proptests: the semantics written literally, with no table, no
//! eviction and no compact log; every decision of the limiter is checked against it.

use super::*;

#[derive(Debug, Clone)]
struct Model {
    tiers: Vec<Tier>,
    hard: Option<u64>,
    entered: Vec<Option<Nanos>>,
    logs: Vec<Vec<Nanos>>,
    hard_log: Vec<Nanos>,
}

#[derive(Debug, Clone)]
struct GlobalModel {
    limit: Option<u64>,
    second: u64,
    count: u64,
}

impl GlobalModel {
    fn room(&self, now: Nanos) -> u64 {
        match self.limit {
            None => u64::MAX,
            Some(g) if now / SEC > self.second => g,
            Some(g) => g - self.count,
        }
    }

    fn take(&mut self, n: u64, now: Nanos) {
        if now / SEC > self.second {
            (self.second, self.count) = (now / SEC, 0);
        }
        self.count += n;
    }

    fn refund(&mut self, n: u64, at: Nanos, now: Nanos) {
        if self.limit.is_some() && now / SEC == at / SEC && self.second == at / SEC {
            self.count -= n.min(self.count);
        }
    }
}

impl Model {
    fn new(p: &TieredParams) -> Self {
        Self {
            tiers: p.tiers.clone(),
            hard: p.hard_limit,
            entered: vec![None; p.tiers.len()],
            logs: vec![Vec::new(); p.tiers.len()],
            hard_log: Vec::new(),
        }
    }

    /// Phase of tier `i` (0-based) at `t`.
    fn phase(&self, i: usize, t: Nanos) -> Phase {
        let Some(e) = self.entered[i] else {
            return Phase::Inactive;
        };
        let tier = &self.tiers[i];
        if t < e + tier.active {
            Phase::Active
        } else if t < e + tier.active + tier.cooldown {
            Phase::Cooling
        } else {
            Phase::Inactive
        }
    }

    fn current(&self, t: Nanos) -> usize {
        (1..=self.tiers.len())
            .rev()
            .find(|&j| self.phase(j - 1, t) == Phase::Active)
            .unwrap_or(0)
    }

    fn count(&self, i: usize, t: Nanos) -> u64 {
        let w = self.tiers[i].window;
        self.logs[i].iter().filter(|&&h| h + w > t).count() as u64
    }

    fn hard_room(&self, t: Nanos) -> u64 {
        self.hard.map_or(u64::MAX, |h| {
            h - self.hard_log.iter().filter(|&&x| x + SEC > t).count() as u64
        })
    }

    /// One request through the tiers, exactly as the paper puts it.
    fn unit(&mut self, now: Nanos) -> Result<usize, DecidedBy> {
        let c = self.current(now);
        if c > 0 && self.count(c - 1, now) < self.tiers[c - 1].limit {
            self.logs[c - 1].push(now);
            return Ok(c);
        }
        let mut end = DecidedBy::TierWindow;
        for j in c + 1..=self.tiers.len() {
            if self.phase(j - 1, now) == Phase::Cooling {
                if self.tiers[j - 1].skippable {
                    end = DecidedBy::NoTierEnterable;
                    continue;
                }
                return Err(DecidedBy::NoTierEnterable);
            }
            self.entered[j - 1] = Some(now);
            if self.count(j - 1, now) < self.tiers[j - 1].limit {
                self.logs[j - 1].push(now);
                return Ok(j);
            }
            end = DecidedBy::TierWindow;
        }
        Err(end)
    }

    /// `min..=max` copies: hard limit, then the copies one at a time through the tiers,
    /// then the global limit.
    fn acquire(&mut self, g: &mut GlobalModel, min: u64, max: u64, now: Nanos) -> (u64, DecidedBy) {
        let hard_room = self.hard_room(now);
        if hard_room < min {
            return (0, DecidedBy::HardLimit);
        }
        let want = max.min(hard_room);
        let mut trial = self.clone();
        let mut placed = Vec::new();
        let mut failed = DecidedBy::TierWindow;
        while (placed.len() as u64) < want {
            match trial.unit(now) {
                Ok(tier) => placed.push(tier),
                Err(by) => {
                    failed = by;
                    break;
                }
            }
        }
        let fit = placed.len() as u64;
        if fit < min {
            // A refusal changes nothing: the trial, tiers entered and all, is dropped.
            return (0, failed);
        }
        let room = g.room(now);
        if room < min {
            return (0, DecidedBy::GlobalLimit);
        }
        let take = fit.min(room);
        for _ in 0..take {
            self.unit(now).unwrap();
        }
        self.hard_log.extend((0..take).map(|_| now));
        g.take(take, now);
        // Which limit cut the grant below `max`: the global limit, else the hard one.
        let by = if take < fit {
            DecidedBy::GlobalLimit
        } else if fit < max && fit == hard_room {
            DecidedBy::HardLimit
        } else {
            DecidedBy::TierWindow
        };
        (take, by)
    }

    fn available(&self, g: &GlobalModel, now: Nanos) -> u64 {
        let mut trial = self.clone();
        let mut fit = 0;
        while trial.unit(now).is_ok() {
            fit += 1;
        }
        fit.min(self.hard_room(now)).min(g.room(now))
    }

    fn headline(&self, now: Nanos) -> (usize, u64, Nanos) {
        let c = self.current(now);
        if c == 0 {
            return (0, 0, 0);
        }
        let w = self.tiers[c - 1].window;
        let reset = self.logs[c - 1].iter().map(|&h| h + w).max().unwrap_or(0);
        (
            c,
            self.tiers[c - 1].limit - self.count(c - 1, now),
            reset.saturating_sub(now),
        )
    }

    fn refund(&mut self, g: &mut GlobalModel, d: &TieredDecision, now: Nanos) {
        g.refund(d.granted, d.at, now);
        let mut left = d.granted;
        for tier in (d.first_tier..=d.tier).rev() {
            let w = self.tiers[tier - 1].window;
            let log = &mut self.logs[tier - 1];
            log.retain(|&h| h + w > now);
            while left > 0 && log.last().is_some_and(|&h| h >= d.at) {
                log.pop();
                left -= 1;
            }
        }
        self.hard_log.retain(|&h| h + SEC > now);
        for _ in 0..d.granted {
            if self.hard_log.last().is_some_and(|&h| h >= d.at) {
                self.hard_log.pop();
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Acquire { min: u64, max: u64 },
    Refund,
    Peek,
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Acquire { min: 1, max: 1 }),
        2 => (1u64..4, 0u64..5).prop_map(|(min, more)| Step::Acquire { min, max: min + more }),
        1 => Just(Step::Refund),
        1 => Just(Step::Peek),
    ]
}

/// Parameters whose durations are multiples of `unit` ns.
fn arb_params(unit: Nanos, spans: u64) -> impl Strategy<Value = TieredParams> {
    let tier = (0u64..5, 1..spans, 1..4 * spans, 0..4 * spans, any::<bool>()).prop_map(
        move |(limit, window, active, cooldown, skippable)| Tier {
            limit,
            window: window * unit,
            active: active * unit,
            cooldown: cooldown * unit,
            skippable,
        },
    );
    (
        prop::collection::vec(tier, 1..4),
        prop::option::of(1u64..7),
        prop::option::of(1u64..13),
    )
        .prop_map(|(tiers, hard_limit, global_limit)| TieredParams {
            tiers,
            hard_limit,
            global_limit,
        })
}

/// Steps of (key, advance in grid steps, step).
fn arb_steps(keys: u64) -> impl Strategy<Value = Vec<(u64, u64, Step)>> {
    prop::collection::vec((0..keys, 0u64..30, arb_step()), 1..150)
}

fn check_against_model(
    given: &TieredParams,
    steps: &[(u64, u64, Step)],
    grid: Nanos,
) -> Result<(), TestCaseError> {
    let l = TieredLimiter::new(given, 1 << 12).unwrap();
    let p = l.params().clone();
    // Times on the grid are whole time units: the stored hits are exact.
    let grid = grid.next_multiple_of(1 << l.shape.shift);
    let cap = p.tiers.iter().map(|t| t.limit).sum::<u64>();
    let cap = cap.min(p.hard_limit.unwrap_or(u64::MAX));
    let cap = cap.min(p.global_limit.unwrap_or(u64::MAX));
    let mut models: HashMap<u64, Model> = HashMap::new();
    let mut last: HashMap<u64, TieredDecision> = HashMap::new();
    let mut g = GlobalModel {
        limit: p.global_limit,
        second: 0,
        count: 0,
    };
    let mut now = 0;
    for &(key, advance, step) in steps {
        now += advance * grid;
        let model = models.entry(key).or_insert_with(|| Model::new(&p));
        let k = spread(key);
        match step {
            Step::Peek => {
                prop_assert_eq!(l.available(k, now), model.available(&g, now));
                prop_assert_eq!(l.current_tier(k, now), model.current(now));
            }
            Step::Refund => {
                if let Some(d) = last.remove(&key) {
                    l.refund(k, &d, now);
                    model.refund(&mut g, &d, now);
                    prop_assert_eq!(l.available(k, now), model.available(&g, now));
                }
            }
            Step::Acquire { min, max } => {
                let (before, g_before) = (model.clone(), g.clone());
                let d = l.acquire_many(k, min, max, now);
                let (granted, by) = model.acquire(&mut g, min, max, now);
                prop_assert_eq!((d.granted, d.decided_by), (granted, by), "{:?}", d);
                prop_assert_eq!(d.verdict.allowed, granted > 0);
                let (tier, remaining, reset) = model.headline(now);
                prop_assert_eq!(
                    (d.tier, d.verdict.remaining, d.verdict.reset_after),
                    (tier, remaining, reset)
                );
                if granted > 0 {
                    last.insert(key, d);
                } else if min > cap {
                    prop_assert_eq!(d.verdict.retry_after, NEVER, "never fits");
                } else {
                    // Retry-After against the oracle: 1 ns early fails, on time passes.
                    let (mut m, mut gm) = (before.clone(), g_before.clone());
                    m.acquire(&mut gm, min, max, now);
                    let at = now + d.verdict.retry_after;
                    let (mut early, mut ge) = (m.clone(), gm.clone());
                    prop_assert_eq!(early.acquire(&mut ge, min, min, at - 1).0, 0);
                    prop_assert!(m.acquire(&mut gm, min, min, at).0 >= min);
                }
            }
        }
    }
    prop_assert_eq!(l.evictions(), 0);
    Ok(())
}

proptest! {
    #[test]
    fn matches_the_model_for_one_key(p in arb_params(10 * MS, 60), steps in arb_steps(1)) {
        check_against_model(&p, &steps, 10 * MS)?;
    }

    #[test]
    fn matches_the_model_for_several_keys(
        p in arb_params(10 * MS, 60),
        steps in arb_steps(4),
    ) {
        check_against_model(&p, &steps, 10 * MS)?;
    }

    #[test]
    fn matches_the_model_with_coarse_units(p in arb_params(SEC, 600), steps in arb_steps(2)) {
        check_against_model(&p, &steps, 7 * SEC)?;
    }
}
