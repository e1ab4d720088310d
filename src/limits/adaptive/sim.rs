//! A deterministic discrete-event simulation of `max: auto` in front of a server of known
//! capacity (issue 23's targets, checked in simulated time): `C` workers serving FIFO, the
//! rest queued inside the server, closed-loop clients through a limit that is either static
//! or the [`Adaptive`] estimator. Time is simulated (nanoseconds), randomness seeded, so a
//! run is exact and repeatable; nothing sleeps.
//!
//! What a request does: a client tries; over the limit it is rejected and retries after
//! [`RETRY`] (jittered); admitted, it travels [`HOP`] to the server, waits for a worker,
//! is served, travels [`HOP`] back and frees its slot; the estimator records the whole
//! upstream time (as the proxy does: to the response's headers), the statistics keep the
//! time inside the server (queue and service, what the benches call the origin's p99).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::{Adaptive, AdaptiveBounds, Sample};
use crate::limits::clock::{Nanos, NANOS_PER_SEC};

const MS: Nanos = NANOS_PER_SEC / 1000;
/// One way between the proxy and the server.
const HOP: Nanos = MS;
/// A rejected client tries again after this (plus up to as much again, seeded).
const RETRY: Nanos = 10 * MS;

/// How long the server works on one request.
#[derive(Clone, Copy)]
pub(super) enum Service {
    /// Every request exactly this long (the bench's origin).
    Fixed(Nanos),
    /// Exponentially distributed with this mean (a server whose requests differ).
    Exponential(Nanos),
}

pub(super) enum Limit {
    Static(u64),
    Auto(Adaptive),
}

impl Limit {
    fn max(&self) -> u64 {
        match self {
            Limit::Static(n) => *n,
            Limit::Auto(a) => a.limit(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Try(u32),
    Arrive {
        client: u32,
        sent: Nanos,
    },
    Done {
        client: u32,
        sent: Nanos,
        arrived: Nanos,
    },
    Back {
        client: u32,
        sent: Nanos,
    },
}

/// The simulated proxy, server and clients.
pub(super) struct Sim {
    pub now: Nanos,
    pub limit: Limit,
    /// The server's workers (may change mid-run).
    pub workers: usize,
    service: Service,
    busy: usize,
    queue: VecDeque<(u32, Nanos, Nanos)>,
    inflight: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    seq: u64,
    seed: u64,
    /// Since the last [`Sim::reset`]: responses, rejections, times inside the server.
    pub ok: u64,
    pub rejected: u64,
    in_server: Vec<Nanos>,
    since: Nanos,
}

impl Sim {
    pub fn new(limit: Limit, workers: usize, service: Service, clients: u32, seed: u64) -> Sim {
        let mut sim = Sim {
            now: 0,
            limit,
            workers,
            service,
            busy: 0,
            queue: VecDeque::new(),
            inflight: 0,
            events: BinaryHeap::new(),
            seq: 0,
            seed,
            ok: 0,
            rejected: 0,
            in_server: Vec::new(),
            since: 0,
        };
        for c in 0..clients {
            // Clients start spread over the first millisecond.
            let at = sim.uniform(MS);
            sim.at(at, Ev::Try(c));
        }
        sim
    }

    /// An estimator with room to move: from 1 to 1 000, starting at `initial`.
    pub fn auto(initial: u64) -> Limit {
        Limit::Auto(Adaptive::new(
            AdaptiveBounds {
                min: 1,
                max: 1000,
                initial,
            },
            1,
        ))
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// A 64-bit LCG (Knuth's MMIX constants): uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        super::real(self.seed >> 11) / super::real(1 << 53)
    }

    fn uniform(&mut self, below: Nanos) -> Nanos {
        super::count(self.unit() * super::real(below))
    }

    fn service_time(&mut self) -> Nanos {
        match self.service {
            Service::Fixed(s) => s,
            Service::Exponential(mean) => {
                let u = self.unit();
                super::count(-(1.0 - u).ln() * super::real(mean)).max(1)
            }
        }
    }

    fn start(&mut self, client: u32, sent: Nanos, arrived: Nanos) {
        self.busy += 1;
        let done = self.now + self.service_time();
        self.at(
            done,
            Ev::Done {
                client,
                sent,
                arrived,
            },
        );
    }

    /// Starts queued requests while workers are free (after a capacity rise, too).
    fn drain(&mut self) {
        while self.busy < self.workers {
            let Some((client, sent, arrived)) = self.queue.pop_front() else {
                break;
            };
            self.start(client, sent, arrived);
        }
    }

    /// Runs until simulated time `until` (seconds).
    pub fn run_until(&mut self, until: f64) {
        let until = super::count(until * super::real(NANOS_PER_SEC));
        self.drain();
        while let Some(&Reverse((t, _, ev))) = self.events.peek() {
            if t > until {
                break;
            }
            self.events.pop();
            self.now = t;
            match ev {
                Ev::Try(client) => {
                    if self.inflight < self.limit.max() {
                        self.inflight += 1;
                        self.at(t + HOP, Ev::Arrive { client, sent: t });
                    } else {
                        if t >= self.since {
                            self.rejected += 1;
                        }
                        let wait = RETRY + self.uniform(RETRY);
                        self.at(t + wait, Ev::Try(client));
                    }
                }
                Ev::Arrive { client, sent } => {
                    self.queue.push_back((client, sent, t));
                    self.drain();
                }
                Ev::Done {
                    client,
                    sent,
                    arrived,
                } => {
                    self.busy -= 1;
                    self.in_server.push(t - arrived);
                    self.at(t + HOP, Ev::Back { client, sent });
                    self.drain();
                }
                Ev::Back { client, sent } => {
                    self.inflight -= 1;
                    self.ok += 1;
                    if let Limit::Auto(a) = &self.limit {
                        a.record(Sample::Latency(t - sent), t);
                    }
                    self.at(t, Ev::Try(client));
                }
            }
        }
        self.now = until;
    }

    /// Starts the statistics afresh from now.
    pub fn reset(&mut self) {
        self.ok = 0;
        self.rejected = 0;
        self.in_server.clear();
        self.since = self.now;
    }

    /// Responses a second since the last reset.
    pub fn goodput(&self) -> f64 {
        super::real(self.ok) / (super::real(self.now - self.since) / super::real(NANOS_PER_SEC))
    }

    /// The 99th percentile of the time inside the server since the last reset, seconds.
    pub fn p99(&mut self) -> f64 {
        self.in_server.sort_unstable();
        let n = self.in_server.len();
        if n == 0 {
            return 0.0;
        }
        let i = (n * 99).div_ceil(100).saturating_sub(1);
        super::real(self.in_server[i]) / super::real(NANOS_PER_SEC)
    }

    pub fn learned(&self) -> u64 {
        self.limit.max()
    }
}

/// The origin's p99 with `C / 2` clients and no effective limit.
pub(super) fn unloaded_p99(workers: usize, service: Service) -> f64 {
    let clients = u32::try_from(workers / 2).unwrap_or(1).max(1);
    let mut sim = Sim::new(Limit::Static(1000), workers, service, clients, 7);
    sim.run_until(2.0);
    sim.reset();
    sim.run_until(22.0);
    sim.p99()
}

/// Goodput of each static max in `maxes` at `clients` clients, `secs` measured after 2 s.
pub(super) fn sweep(
    workers: usize,
    service: Service,
    clients: u32,
    maxes: &[u64],
    secs: f64,
) -> Vec<(u64, f64, f64)> {
    maxes
        .iter()
        .map(|&m| {
            let mut sim = Sim::new(Limit::Static(m), workers, service, clients, 11);
            sim.run_until(2.0);
            sim.reset();
            sim.run_until(2.0 + secs);
            (m, sim.goodput(), sim.p99())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: usize = 16;
    const S: Nanos = 50 * MS;

    fn maxes(c: u64) -> Vec<u64> {
        let mut m: Vec<u64> = (c / 2..=2 * c).collect();
        m.extend([3 * c, 4 * c]);
        m
    }

    /// The best static goodput, and the smallest static max within 1% of it (the knee).
    fn best_static(workers: usize, service: Service) -> (f64, u64) {
        let c = workers as u64;
        let runs = sweep(
            workers,
            service,
            u32::try_from(4 * c).unwrap(),
            &maxes(c),
            10.0,
        );
        let best = runs.iter().map(|r| r.1).fold(0.0, f64::max);
        let knee = runs.iter().find(|r| r.1 >= 0.99 * best).unwrap().0;
        (best, knee)
    }

    fn steady(service: Service) {
        let unloaded = unloaded_p99(C, service);
        let (best, knee) = best_static(C, service);
        let mut sim = Sim::new(Sim::auto(8), C, service, 4 * C as u32, 3);
        sim.run_until(10.0);
        sim.reset();
        sim.run_until(40.0);
        let (goodput, p99) = (sim.goodput(), sim.p99());
        let report = format!(
            "learned {} (knee {knee}), goodput {goodput:.1}/{best:.1} = {:.3}, p99 {:.1} ms / \
             unloaded {:.1} = {:.2}, rejected {}",
            sim.learned(),
            goodput / best,
            p99 * 1e3,
            unloaded * 1e3,
            p99 / unloaded,
            sim.rejected
        );
        eprintln!("{report}");
        assert!(goodput >= 0.9 * best, "{report}");
        assert!(p99 <= 1.5 * unloaded, "{report}");
    }

    #[test]
    fn steady_overload_at_fixed_service_times_meets_the_targets() {
        steady(Service::Fixed(S));
    }

    #[test]
    fn steady_overload_at_exponential_service_times_meets_the_targets() {
        steady(Service::Exponential(S));
    }

    fn halving(service: Service, check_p99: bool) {
        let unloaded = unloaded_p99(C / 2, service);
        let (best_after, knee) = best_static(C / 2, service);
        let mut sim = Sim::new(Sim::auto(8), C, service, 4 * C as u32, 5);
        sim.run_until(20.0);
        let before = sim.learned();
        sim.workers = C / 2;
        let mut trace = Vec::new();
        for tick in 1..=50 {
            sim.run_until(20.0 + f64::from(tick) / 10.0);
            trace.push(sim.learned());
            if tick == 30 {
                // The p99 of seconds 3 to 5 after the drop (320 requests at C / 2).
                sim.reset();
            }
        }
        let at_5s = sim.learned();
        let (goodput, p99) = (sim.goodput(), sim.p99());
        let report = format!(
            "learned {before} -> {at_5s} (knee {knee}) {trace:?}, goodput {goodput:.1}/{best_after:.1}, \
             p99 {:.1} ms / unloaded {:.1}",
            p99 * 1e3,
            unloaded * 1e3
        );
        eprintln!("{report}");
        if let Service::Fixed(_) = service {
            // The knee is where a queue-free server's goodput stops growing. At exponential
            // service times a queue keeps adding goodput up to about 2C (no knee to aim at):
            // there the goodput itself is checked.
            assert!(
                (super::super::real(at_5s) - super::super::real(knee)).abs()
                    <= 0.2 * super::super::real(knee),
                "{report}"
            );
        }
        assert!(goodput >= 0.9 * best_after, "{report}");
        if check_p99 {
            assert!(p99 <= 1.5 * unloaded, "{report}");
        }
        // And back: the capacity returns and the limit grows into it.
        sim.workers = C;
        sim.run_until(35.0);
        sim.reset();
        sim.run_until(40.0);
        let back = sim.learned();
        let (best, _) = best_static(C, service);
        let report = format!(
            "{report}; back to {back}, goodput {:.1}/{best:.1}",
            sim.goodput()
        );
        eprintln!("{report}");
        assert!(sim.goodput() >= 0.9 * best, "{report}");
    }

    #[test]
    fn a_capacity_halving_reconverges_within_five_seconds_at_fixed_service_times() {
        halving(Service::Fixed(S), false);
    }

    /// At C / 2 = 8 workers of exactly 50 ms a probe to 9 that lingers puts requests a
    /// whole service time in the queue: the p99 of seconds 3 to 5 after the halving stays
    /// under 1.5 × only if the baseline did not take the queue (it once did, at 1.6 × to
    /// 1.8 ×, while the anchor sat at a queue still building; now 1.28 ×).
    #[test]
    fn the_p99_is_back_within_five_seconds_of_a_capacity_halving_at_fixed_service_times() {
        halving(Service::Fixed(S), true);
    }

    #[test]
    fn a_capacity_halving_reconverges_within_five_seconds_at_exponential_service_times() {
        halving(Service::Exponential(S), true);
    }
}
