//! The parts of the rollout simulator (`benches/rollout_sim.rs`) that can
//! be wrong on their own, apart from its table: simulated traffic, the two
//! threshold checks sluice is compared with, and the loop that drives a
//! judge with traffic at the cadence it is looked at. Tested by
//! `tests/rollout_sim.rs`.
//!
//! Traffic: the rule's requests arrive as a Poisson process of `rps` per
//! second, each going to the canary with its served share (so each side's
//! requests are a Poisson process of their own) and failing with its
//! side's 5xx rate, independently. Simulated time is integer nanoseconds
//! since the rollout started.
//!
//! The judges ([`Judging`]):
//! - [`Sluice`]: sluice's own state machine ([`sluice::rollout::sim`]),
//!   looked at as the serve loop looks: on every 5xx of either side (at
//!   most one look per 5 ms, later ones wait for the end of the gap), at
//!   the machine's deadlines, and a second after the last look.
//! - [`EveryTick`]: the gate sluice had before the sequential tests: every
//!   250 ms, once the step has `minRequests`, the step's 5xx share is
//!   compared with `maxErrorRate`; the first breach rolls back.
//! - [`PerInterval`]: Flagger-style: at the end of every interval, the
//!   5xx share over that interval is compared with `maxErrorRate` (and,
//!   with `baseline: Stable`, with `1 + maxDegradation` times the stable's
//!   over the same interval, while the stable serves); a failed check
//!   rolls back at once (Flagger's `threshold: 1`), and an interval in
//!   which the canary answered nothing ("no data") is a failed check, as
//!   Flagger counts it. Each step lasts one interval; `minRequests` does
//!   not exist there.

#![allow(dead_code)]

use std::time::Duration;

use sluice::metrics::BackendTotals;
use sluice::resources::{Percent, RolloutPolicy, RolloutSettings};
use sluice::rollout::sim::{Look, Promotion};
use sluice::rollout::{Bound, Phase, Signal};

pub const SECOND: u64 = 1_000_000_000;
pub const MILLISECOND: u64 = 1_000_000;

/// The serve loop's look a second after the last (`ROLLOUT_REFRESH`).
pub const REFRESH: u64 = SECOND;
/// The serve loop's least gap between two looks woken by 5xx
/// (`ROLLOUT_EVENT_GAP`).
pub const EVENT_GAP: u64 = 5 * MILLISECOND;
/// The old gate's tick.
pub const OLD_TICK: u64 = 250 * MILLISECOND;

/// A seeded generator with the draws the simulator needs.
pub struct Random(fastrand::Rng);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(fastrand::Rng::with_seed(seed))
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.f64()
    }

    /// An exponential gap of a Poisson process of `rate` per second, in
    /// nanoseconds (at least 1); `u64::MAX` without events.
    pub fn gap(&mut self, rate: f64) -> u64 {
        if rate <= 0.0 {
            return u64::MAX;
        }
        let seconds = -(1.0 - self.unit()).ln() / rate;
        let nanos = (seconds * SECOND as f64).ceil();
        if nanos >= u64::MAX as f64 {
            u64::MAX
        } else {
            (nanos as u64).max(1)
        }
    }

    /// A Poisson draw of mean `mean`: by multiplication of uniforms below
    /// 10, by Hörmann's transformed rejection (PTRS, 1993) above.
    pub fn poisson(&mut self, mean: f64) -> u64 {
        if mean <= 0.0 {
            return 0;
        }
        if mean < 10.0 {
            let limit = (-mean).exp();
            let mut product = self.unit();
            let mut k = 0;
            while product > limit {
                product *= self.unit();
                k += 1;
            }
            return k;
        }
        let smu = mean.sqrt();
        let b = 0.931 + 2.53 * smu;
        let a = -0.059 + 0.02483 * b;
        let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
        let vr = 0.9277 - 3.6224 / (b - 2.0);
        let log_mean = mean.ln();
        loop {
            let u = self.unit() - 0.5;
            let v = self.unit();
            let us = 0.5 - u.abs();
            let k = ((2.0 * a / us + b) * u + mean + 0.43).floor();
            if us >= 0.07 && v <= vr {
                return k as u64;
            }
            if k < 0.0 || (us < 0.013 && v > us) {
                continue;
            }
            let accept = (v * inv_alpha / (a / (us * us) + b)).ln();
            if accept <= -mean + k * log_mean - ln_factorial(k) {
                return k as u64;
            }
        }
    }
}

/// `ln(k!)`: exact below 10, Stirling's series above.
pub fn ln_factorial(k: f64) -> f64 {
    if k < 10.0 {
        let mut f = 1.0_f64;
        for i in 2..=(k as u64) {
            f *= i as f64;
        }
        return f.ln();
    }
    let k2 = k * k;
    k * k.ln() - k + 0.5 * (2.0 * std::f64::consts::PI * k).ln() + 1.0 / (12.0 * k)
        - 1.0 / (360.0 * k * k2)
        + 1.0 / (1260.0 * k2 * k2 * k)
}

/// One side's cumulative counts since the rollout started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Side {
    pub requests: u64,
    pub errors: u64,
}

impl Side {
    pub fn since(&self, earlier: &Side) -> Side {
        Side {
            requests: self.requests - earlier.requests,
            errors: self.errors - earlier.errors,
        }
    }

    fn totals(&self) -> BackendTotals {
        BackendTotals {
            requests: self.requests,
            errors: self.errors,
            ..BackendTotals::default()
        }
    }
}

/// The rule's traffic: `rps` requests per second, each side failing at its
/// own rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    pub rps: f64,
    pub stable_errors: f64,
    pub canary_errors: f64,
}

/// What the simulated backends answered so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    pub canary: Side,
    pub stable: Side,
}

impl Served {
    /// `nanos` of traffic at the canary share `share`, counted in bulk
    /// (each count a Poisson draw: exact for a process nobody looks at in
    /// between).
    pub fn pass(&mut self, t: &Traffic, share: f64, nanos: u64, rng: &mut Random) {
        let seconds = nanos as f64 / SECOND as f64;
        let (c, s) = (t.rps * share * seconds, t.rps * (1.0 - share) * seconds);
        let (ce, se) = (
            rng.poisson(c * t.canary_errors),
            rng.poisson(s * t.stable_errors),
        );
        let (co, so) = (
            rng.poisson(c * (1.0 - t.canary_errors)),
            rng.poisson(s * (1.0 - t.stable_errors)),
        );
        self.canary.requests += ce + co;
        self.canary.errors += ce;
        self.stable.requests += se + so;
        self.stable.errors += se;
    }

    /// `nanos` of successful answers only (the time before a 5xx).
    fn pass_ok(&mut self, t: &Traffic, share: f64, nanos: u64, rng: &mut Random) {
        let seconds = nanos as f64 / SECOND as f64;
        let (c, s) = (t.rps * share * seconds, t.rps * (1.0 - share) * seconds);
        self.canary.requests += rng.poisson(c * (1.0 - t.canary_errors));
        self.stable.requests += rng.poisson(s * (1.0 - t.stable_errors));
    }
}

/// Where a judged rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// At this step (an index of the steps).
    Step(usize),
    Promoted,
    /// Rolled back at this step.
    RolledBack(usize),
}

/// A judge of one rollout, as the simulation drives it.
pub trait Judging {
    fn state(&self) -> State;
    /// The canary's share of the requests now.
    fn canary_share(&self) -> f64;
    /// The next look on the clock.
    fn next_look(&self) -> u64;
    /// Whether a 5xx of either side makes it look (sluice's wake).
    fn woken_by_errors(&self) -> bool;
    fn look(&mut self, now: u64, served: &Served);
}

/// How one simulated rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub state: State,
    /// When it ended (rolled back or promoted), or the time limit.
    pub at: u64,
    /// The canary's 5xx served until then.
    pub canary_errors: u64,
}

/// Drive `judge` with `traffic` from its first look until it promotes or
/// rolls back, or `limit` nanoseconds pass.
pub fn run<J: Judging>(judge: &mut J, traffic: &Traffic, rng: &mut Random, limit: u64) -> Outcome {
    let mut served = Served::default();
    let mut now = 0u64;
    // sluice's wake: the end of the gap after the last look woken by a
    // 5xx, and whether a 5xx came within it.
    let mut gap_end = 0u64;
    let mut pending = false;
    loop {
        if !matches!(judge.state(), State::Step(_)) || now >= limit {
            return Outcome {
                state: judge.state(),
                at: now,
                canary_errors: served.canary.errors,
            };
        }
        let share = judge.canary_share();
        let mut wake = judge.next_look().min(limit);
        if pending {
            wake = wake.min(gap_end);
        }
        if judge.woken_by_errors() {
            let canary = traffic.rps * share * traffic.canary_errors;
            let stable = traffic.rps * (1.0 - share) * traffic.stable_errors;
            let gap = rng.gap(canary + stable);
            if gap < wake.saturating_sub(now) {
                served.pass_ok(traffic, share, gap, rng);
                now += gap;
                if rng.unit() * (canary + stable) < canary {
                    served.canary.requests += 1;
                    served.canary.errors += 1;
                } else {
                    served.stable.requests += 1;
                    served.stable.errors += 1;
                }
                if now >= gap_end {
                    judge.look(now, &served);
                    gap_end = now + EVENT_GAP;
                } else {
                    pending = true;
                }
                continue;
            }
            // No 5xx before the wake (the gap is memoryless: drawn anew
            // after it).
            served.pass_ok(traffic, share, wake - now, rng);
        } else {
            served.pass(traffic, share, wake - now, rng);
        }
        now = wake;
        judge.look(now, &served);
        if pending {
            pending = false;
            gap_end = now + EVENT_GAP;
        }
    }
}

/// The policy, as the comparison checks read it.
#[derive(Debug, Clone)]
pub struct Thresholds {
    /// The canary's served share at each step.
    pub steps: Vec<f64>,
    pub interval: u64,
    pub min_requests: u64,
    /// `maxErrorRate`, in thousandths of a percent.
    pub limit: Option<u32>,
    /// `1 + maxDegradation` with `baseline: Stable`.
    pub tolerance: Option<f64>,
}

impl Thresholds {
    pub fn of(settings: &RolloutSettings) -> Thresholds {
        let mut limit = None;
        let mut tolerance = None;
        for gate in &settings.gates {
            match (gate.signal, gate.bound) {
                (Signal::Errors, Bound::Limit(p)) => limit = Some(p.thousandths()),
                (Signal::Errors, Bound::Stable { degradation }) => {
                    tolerance = Some(1.0 + f64::from(degradation) / f64::from(Percent::SCALE));
                }
                _ => {}
            }
        }
        Thresholds {
            steps: settings
                .steps
                .iter()
                .map(|p| f64::from(p.thousandths()) / f64::from(Percent::SCALE))
                .collect(),
            interval: u64::try_from(settings.interval.as_nanos()).unwrap_or(u64::MAX),
            min_requests: settings.min_requests,
            limit,
            tolerance,
        }
    }

    /// `errors` of `requests` above `maxErrorRate` (integer arithmetic, as
    /// the old gate compared).
    pub fn above_limit(&self, s: &Side) -> bool {
        self.limit.is_some_and(|max| {
            u128::from(s.errors) * u128::from(Percent::SCALE)
                > u128::from(max) * u128::from(s.requests)
        })
    }
}

/// A RolloutPolicy's settings through sluice's own parsing: steps `[first,
/// 50%, 100%]`, interval 1m, minRequests 100, `maxErrorRate`, and with
/// `baseline` `baseline: Stable, maxDegradation: 25%`; confidence the
/// default (99%).
pub fn settings(first: &str, max_error_rate: &str, baseline: bool) -> RolloutSettings {
    let mut analysis = serde_json::json!({"minRequests": 100, "maxErrorRate": max_error_rate});
    if baseline {
        analysis["baseline"] = "Stable".into();
        analysis["maxDegradation"] = "25%".into();
    }
    let policy: RolloutPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "sim", "name": "policy"},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "route"}],
            "steps": [first, "50%", "100%"],
            "interval": "1m",
            "analysis": analysis,
        },
    }))
    .expect("a RolloutPolicy");
    policy.settings().expect("valid settings")
}

/// sluice's state machine, looked at as the serve loop looks.
pub struct Sluice {
    promotion: Promotion,
    last: Look,
    looked: u64,
}

impl Sluice {
    pub fn start(settings: RolloutSettings) -> Sluice {
        let (promotion, last) = Promotion::start(settings);
        Sluice {
            promotion,
            last,
            looked: 0,
        }
    }

    pub fn message(&self) -> String {
        self.promotion.message()
    }
}

impl Judging for Sluice {
    fn state(&self) -> State {
        let step = self.last.step.unwrap_or(0);
        match self.last.phase {
            Phase::Complete => State::Promoted,
            Phase::RolledBack => State::RolledBack(step),
            Phase::Waiting | Phase::Progressing | Phase::Paused => State::Step(step),
        }
    }

    fn canary_share(&self) -> f64 {
        self.last.canary_share
    }

    fn next_look(&self) -> u64 {
        let refresh = self.looked + REFRESH;
        match self.last.next {
            Some(at) => refresh.min(u64::try_from(at.as_nanos()).unwrap_or(u64::MAX)),
            None => refresh,
        }
    }

    fn woken_by_errors(&self) -> bool {
        true
    }

    fn look(&mut self, now: u64, served: &Served) {
        self.last = self.promotion.look(
            Duration::from_nanos(now),
            &served.canary.totals(),
            &served.stable.totals(),
        );
        self.looked = now;
    }
}

/// The gate sluice had before the sequential tests, every 250 ms.
pub struct EveryTick {
    policy: Thresholds,
    state: State,
    step_started: u64,
    at_step_start: Side,
    next: u64,
}

impl EveryTick {
    pub fn start(policy: Thresholds) -> EveryTick {
        EveryTick {
            policy,
            state: State::Step(0),
            step_started: 0,
            at_step_start: Side::default(),
            next: OLD_TICK,
        }
    }
}

impl Judging for EveryTick {
    fn state(&self) -> State {
        self.state
    }

    fn canary_share(&self) -> f64 {
        match self.state {
            State::Step(i) => self.policy.steps[i],
            State::Promoted => 1.0,
            State::RolledBack(_) => 0.0,
        }
    }

    fn next_look(&self) -> u64 {
        self.next
    }

    fn woken_by_errors(&self) -> bool {
        false
    }

    fn look(&mut self, now: u64, served: &Served) {
        self.next = now + OLD_TICK;
        let State::Step(i) = self.state else { return };
        let counted = served.canary.since(&self.at_step_start);
        let enough = counted.requests > 0 && counted.requests >= self.policy.min_requests;
        if enough && self.policy.above_limit(&counted) {
            self.state = State::RolledBack(i);
        } else if enough && now - self.step_started >= self.policy.interval {
            self.state = if i + 1 < self.policy.steps.len() {
                State::Step(i + 1)
            } else {
                State::Promoted
            };
            self.step_started = now;
            self.at_step_start = served.canary;
        }
    }
}

/// What a Flagger-style check decided about one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Passed,
    /// The canary answered nothing in the interval.
    NoData,
    AboveLimit,
    WorseThanStable,
}

impl Thresholds {
    /// One Flagger-style check of an interval's counts.
    pub fn check(&self, canary: &Side, stable: &Side) -> Check {
        if canary.requests == 0 {
            return Check::NoData;
        }
        if self.above_limit(canary) {
            return Check::AboveLimit;
        }
        if let Some(r0) = self.tolerance
            && stable.requests > 0
            && canary.errors as f64 * stable.requests as f64
                > r0 * stable.errors as f64 * canary.requests as f64
        {
            return Check::WorseThanStable;
        }
        Check::Passed
    }
}

/// Flagger-style: one check at the end of every interval.
pub struct PerInterval {
    policy: Thresholds,
    state: State,
    at_last_check: Served,
    next: u64,
}

impl PerInterval {
    pub fn start(policy: Thresholds) -> PerInterval {
        let next = policy.interval;
        PerInterval {
            policy,
            state: State::Step(0),
            at_last_check: Served::default(),
            next,
        }
    }
}

impl Judging for PerInterval {
    fn state(&self) -> State {
        self.state
    }

    fn canary_share(&self) -> f64 {
        match self.state {
            State::Step(i) => self.policy.steps[i],
            State::Promoted => 1.0,
            State::RolledBack(_) => 0.0,
        }
    }

    fn next_look(&self) -> u64 {
        self.next
    }

    fn woken_by_errors(&self) -> bool {
        false
    }

    fn look(&mut self, now: u64, served: &Served) {
        self.next = now + self.policy.interval;
        let State::Step(i) = self.state else { return };
        let canary = served.canary.since(&self.at_last_check.canary);
        let stable = served.stable.since(&self.at_last_check.stable);
        self.at_last_check = *served;
        self.state = match self.policy.check(&canary, &stable) {
            Check::Passed if i + 1 < self.policy.steps.len() => State::Step(i + 1),
            Check::Passed => State::Promoted,
            _ => State::RolledBack(i),
        };
    }
}
