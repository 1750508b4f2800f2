//! A rollout's evidence over time, for the dashboard: at every look the
//! machine takes, the counts its gates judged (the incoming and the
//! outgoing backends' since the first step, or since this process resumed
//! the rollout), each side's rate with its confidence bounds, the gates'
//! limits, and where the steps began and ended.
//!
//! Why apart: the machine decides and the status says where a rollout is
//! now; this keeps how it got there, bounded, without touching either.
//! Pure: the look and the clock are passed in, nothing is read or written.
//!
//! Bounded: a point a [`CADENCE`] at most (a look within it replaces the
//! newest point, so the newest always shows the last look), at most
//! [`CAPACITY`] points (when full, every other point of the older half is
//! dropped: the recent past keeps its detail, the distant past thins out),
//! and at most [`MAX_BOUNDARIES`] step boundaries (the oldest go first).
//! Points are recorded while a step is judged, plus one at the boundary
//! that ends the rollout (rolled back, complete, or paused by a failed
//! gate): the evidence that decided it.
//!
//! The bounds are those of the gates' test ([`super::evidence`]), at the
//! gates' confidence (`1 - confidence` shared among the gates, as the
//! judge does): the lower end of the mixture's confidence sequence on the
//! events and, from the same test on the non-events, the upper end. Both
//! hold at every look at once (anytime-valid), so a band that narrows over
//! time may be watched without the watching making it wrong. A limit's
//! gate fails when the canary's lower bound passes the limit (unless the
//! stable fails alike). The limit of a gate against the stable is `1 +
//! maxDegradation` times the stable's rate so far; in a step with no
//! stable traffic, times the upper bound of that rate the judge uses
//! there. That gate's test is on how the events split between the sides,
//! so the line against the stable is a guide to read the test by, not the
//! test itself (`docs/rollouts.md`).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::ser::{Serialize, SerializeMap, Serializer};

use super::evidence::{lower_bound, upper_bound};
use super::gates::judged_requests;
use super::gates::{Bound, Confidence, Gate, Judge, Signal, StepView};
use super::machine::{Phase, Rollout};
use crate::metrics::BackendTotals;
use crate::resources::{Percent, RolloutSettings};

/// The least time between two points (the newest aside).
pub const CADENCE: Duration = Duration::from_secs(1);

/// How stale the newest point may get between two points a cadence apart.
pub const REFRESH: Duration = Duration::from_millis(200);

/// The most points kept per rollout.
pub const CAPACITY: usize = 600;

/// The most step boundaries kept per rollout.
pub const MAX_BOUNDARIES: usize = 100;

/// What a look at a rollout shows: where it is and what its gates judged.
#[derive(Debug, Clone, Copy)]
pub struct Look<'a> {
    pub phase: Phase,
    pub step: Option<Percent>,
    pub step_index: Option<usize>,
    /// Held after a failed gate (`onFailure: Pause`): nothing is judged.
    pub held: bool,
    /// Whether the step began at this look.
    pub entered: bool,
    /// The incoming backends' counts the gates judged.
    pub canary: BackendTotals,
    /// The outgoing backends' over the same time.
    pub stable: BackendTotals,
    /// Whether the step serves the outgoing backends at all.
    pub concurrent: bool,
    pub gates: &'a [Gate],
    pub confidence: Confidence,
}

impl<'a> Look<'a> {
    /// The look the machine just took at a rollout.
    pub fn of(
        rollout: &Rollout,
        step_index: Option<usize>,
        judge: &Judge,
        step: &StepView,
        settings: &'a RolloutSettings,
        now: Timestamp,
    ) -> Look<'a> {
        let (canary, stable) = judge.totals();
        Look {
            phase: rollout.phase,
            step: rollout.step,
            step_index,
            held: rollout.held_for.is_some(),
            entered: rollout.step_started_at == Some(now),
            canary,
            stable,
            concurrent: step.concurrent,
            gates: &settings.gates,
            confidence: settings.confidence,
        }
    }

    /// Whether the gates judge at this look.
    fn judged(&self) -> bool {
        self.step.is_some()
            && !self.held
            && matches!(self.phase, Phase::Progressing | Phase::Paused)
    }
}

/// A rate's confidence bounds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Band {
    pub low: f64,
    pub high: f64,
}

/// One signal (5xx, or responses slower than `maxLatency`) at a point.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SignalPoint {
    pub canary: Band,
    pub stable: Band,
    /// The absolute limit of the signal's gate (`maxErrorRate`; 1% for
    /// `maxLatency`, a p99).
    pub limit: Option<f64>,
    /// The limit of the signal's gate against the stable.
    pub stable_limit: Option<f64>,
}

/// Requests, 5xx and slow responses of one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub requests: u64,
    pub errors: u64,
    pub slow: u64,
}

impl From<&BackendTotals> for Counts {
    fn from(t: &BackendTotals) -> Counts {
        Counts {
            requests: t.requests,
            errors: t.errors,
            slow: t.slow,
        }
    }
}

/// The figures of one look.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Point {
    /// Seconds since the history began.
    pub at: f64,
    pub canary: Counts,
    pub stable: Counts,
    pub errors: SignalPoint,
    /// Slow responses, when a gate judges them.
    pub slow: Option<SignalPoint>,
}

/// What a step boundary was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The first step began.
    Started,
    /// This process took the rollout over at a step begun before (a
    /// restart, or a new leader), or the policy changed after a failed
    /// gate held the step: the counts start from here.
    Resumed,
    /// The step before passed; this one began.
    Passed,
    /// Paused (`spec.paused`, or a failed gate with `onFailure: Pause`).
    Paused,
    /// Back at the step after a pause.
    Unpaused,
    RolledBack,
    Complete,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Started => "started",
            Outcome::Resumed => "resumed",
            Outcome::Passed => "passed",
            Outcome::Paused => "paused",
            Outcome::Unpaused => "unpaused",
            Outcome::RolledBack => "rolledBack",
            Outcome::Complete => "complete",
        }
    }
}

/// Where a step began or a rollout stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Boundary {
    /// Seconds since the history began.
    pub at: f64,
    /// The step from this boundary on (the step stopped at, for a
    /// rollback or a pause).
    pub step: Option<Percent>,
    pub step_index: Option<usize>,
    pub outcome: Outcome,
}

/// One rollout's evidence over time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The first look at a step.
    since: Option<Timestamp>,
    points: Vec<Point>,
    boundaries: Vec<Boundary>,
    /// Where the rollout was at the last look: (phase, step, held).
    last: Option<(Phase, Option<Percent>, bool)>,
}

impl History {
    /// Take in one look at `now`.
    pub fn record(&mut self, look: &Look<'_>, now: Timestamp) {
        let mark = (look.phase, look.step, look.held);
        let previous = self.last.replace(mark);
        let since = match self.since {
            Some(since) => since,
            // Nothing before the first step: no counts are judged.
            None if look.judged() => {
                self.since = Some(now);
                now
            }
            None => return,
        };
        let at = seconds(since, now);
        let boundary = match previous {
            None => Some(if look.entered {
                Outcome::Started
            } else {
                Outcome::Resumed
            }),
            Some(before) if before == mark => None,
            Some((was, step, held)) => Some(match look.phase {
                Phase::RolledBack => Outcome::RolledBack,
                Phase::Complete => Outcome::Complete,
                Phase::Paused => Outcome::Paused,
                _ if step.is_none() => Outcome::Started,
                // The policy changed after a failed gate: the evidence
                // starts anew.
                _ if held => Outcome::Resumed,
                _ if look.step != step => Outcome::Passed,
                _ if was == Phase::Paused => Outcome::Unpaused,
                _ => Outcome::Resumed,
            }),
        };
        let step = match look.phase {
            Phase::RolledBack | Phase::Complete => previous.and_then(|(_, s, _)| s).or(look.step),
            _ => look.step,
        };
        if let Some(outcome) = boundary {
            if self.boundaries.len() == MAX_BOUNDARIES {
                self.boundaries.remove(0);
            }
            self.boundaries.push(Boundary {
                at,
                step,
                step_index: look.step_index,
                outcome,
            });
        }
        let ending = boundary.is_some() && !look.judged();
        if !look.judged() && !ending {
            return;
        }
        // The newest point is replaced until it is a cadence after the one
        // before it (a boundary's point never is): every point but the
        // newest is at least a cadence after the one before.
        let n = self.points.len();
        let crowded = boundary.is_none()
            && n >= 2
            && self.points[n - 1].at - self.points[n - 2].at < CADENCE.as_secs_f64()
            && !self
                .boundaries
                .last()
                .is_some_and(|b| b.at == self.points[n - 1].at);
        // A point costs a few bisections and a failing canary wakes the
        // judge every few milliseconds: the newest is replaced at most
        // every REFRESH (a boundary's point is always taken).
        if crowded && at - self.points[n - 1].at < REFRESH.as_secs_f64() {
            return;
        }
        let point = point(look, at);
        if crowded {
            self.points[n - 1] = point;
        } else {
            self.points.push(point);
        }
        if self.points.len() > CAPACITY {
            thin(&mut self.points);
        }
    }

    /// When the history began (the first look at a step), if it has.
    pub fn since(&self) -> Option<Timestamp> {
        self.since
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }

    pub fn boundaries(&self) -> &[Boundary] {
        &self.boundaries
    }

    pub fn is_empty(&self) -> bool {
        self.since.is_none()
    }
}

/// Drop every other point of the older half (the first point stays).
fn thin(points: &mut Vec<Point>) {
    let half = points.len() / 2;
    let mut i = 0;
    points.retain(|_| {
        let keep = i >= half || i % 2 == 0;
        i += 1;
        keep
    });
}

fn seconds(since: Timestamp, now: Timestamp) -> f64 {
    let nanos = now.as_nanosecond() - since.as_nanosecond();
    nanos.max(0) as f64 / 1e9
}

/// The figures of `look`, `at` seconds in.
fn point(look: &Look<'_>, at: f64) -> Point {
    let slow = look
        .gates
        .iter()
        .any(|g| matches!(g.signal, Signal::SlowerThan(_)))
        .then(|| {
            signal(
                look,
                |s| matches!(s, Signal::SlowerThan(_)),
                |t| t.slow,
                |t| t.requests,
            )
        });
    Point {
        at,
        canary: Counts::from(&look.canary),
        stable: Counts::from(&look.stable),
        // As the error gates judge them: with consistentBy, a user's
        // repeated 5xx in a step are neither events nor trials.
        errors: signal(
            look,
            |s| *s == Signal::Errors,
            |t| t.errors.saturating_sub(t.repeated_errors),
            judged_requests,
        ),
        slow,
    }
}

/// One signal's bounds and limits: `of` says which gates judge it,
/// `events` counts it among `trials`.
fn signal(
    look: &Look<'_>,
    of: impl Fn(&Signal) -> bool,
    events: impl Fn(&BackendTotals) -> u64,
    trials: impl Fn(&BackendTotals) -> u64,
) -> SignalPoint {
    // The judge's share of the error budget for each gate.
    let alpha = look.confidence.alpha() / look.gates.len().max(1) as f64;
    let band = |t: &BackendTotals| {
        let n = trials(t);
        let x = events(t).min(n);
        Band {
            low: lower_bound(x, n, alpha),
            high: 1.0 - lower_bound(n - x, n, alpha),
        }
    };
    let mut limit = None;
    let mut stable_limit = None;
    for gate in look.gates.iter().filter(|g| of(&g.signal)) {
        match gate.bound {
            Bound::Limit(p) => {
                limit = limit.or(Some(f64::from(p.thousandths()) / f64::from(Percent::SCALE)))
            }
            Bound::Stable { degradation } => {
                let r0 = 1.0 + f64::from(degradation) / f64::from(Percent::SCALE);
                let (x, n) = (events(&look.stable), trials(&look.stable));
                let limit = if look.concurrent {
                    (n > 0).then(|| (r0 * x as f64 / n as f64).min(1.0))
                } else {
                    // As the judge: the stable's rate recorded during the
                    // rollout, at most this (a quarter of the gate's
                    // budget); no limit (nothing judged) at 100% or more.
                    Some(r0 * upper_bound(x, n, alpha / 4.0)).filter(|l| *l < 1.0)
                };
                stable_limit = stable_limit.or(limit);
            }
        }
    }
    SignalPoint {
        canary: band(&look.canary),
        stable: band(&look.stable),
        limit,
        stable_limit,
    }
}

/// A rate to 4 significant digits: what a chart can show, and short in
/// JSON.
fn short(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return x.max(0.0);
    }
    let scale = 10f64.powi(3 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// `/overview`'s form: one array per column, a value per point, so that
/// 600 points stay a few tens of KB.
///
/// ```json
/// {"since": "2026-01-01T00:00:00Z", "t": [0, 1.0, 2.1],
///  "requests": [..], "errors": [..], "slow": [..],
///  "stableRequests": [..], "stableErrors": [..], "stableSlow": [..],
///  "errorRate": {"canaryLow": [..], "canaryHigh": [..],
///                "stableLow": [..], "stableHigh": [..],
///                "limit": [..], "stableLimit": [..]},
///  "slowRate": {..},
///  "steps": [{"t": 0, "step": "5%", "stepIndex": 0, "outcome": "started"}]}
/// ```
impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let column = |f: &dyn Fn(&Point) -> u64| self.points.iter().map(f).collect::<Vec<_>>();
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("since", &self.since.map(|t| t.to_string()))?;
        let t: Vec<f64> = self
            .points
            .iter()
            .map(|p| (p.at * 10.0).round() / 10.0)
            .collect();
        map.serialize_entry("t", &t)?;
        map.serialize_entry("requests", &column(&|p| p.canary.requests))?;
        map.serialize_entry("errors", &column(&|p| p.canary.errors))?;
        map.serialize_entry("slow", &column(&|p| p.canary.slow))?;
        map.serialize_entry("stableRequests", &column(&|p| p.stable.requests))?;
        map.serialize_entry("stableErrors", &column(&|p| p.stable.errors))?;
        map.serialize_entry("stableSlow", &column(&|p| p.stable.slow))?;
        map.serialize_entry(
            "errorRate",
            &Rates(self.points.iter().map(|p| Some(&p.errors))),
        )?;
        if self.points.iter().any(|p| p.slow.is_some()) {
            map.serialize_entry(
                "slowRate",
                &Rates(self.points.iter().map(|p| p.slow.as_ref())),
            )?;
        }
        let steps: Vec<StepJson> = self
            .boundaries
            .iter()
            .map(|b| StepJson {
                t: (b.at * 10.0).round() / 10.0,
                step: b.step.map(|p| p.to_string()),
                step_index: b.step_index,
                outcome: b.outcome.as_str(),
            })
            .collect();
        map.serialize_entry("steps", &steps)?;
        map.end()
    }
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StepJson {
    t: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step_index: Option<usize>,
    outcome: &'static str,
}

/// One signal's columns; a limit column only when some point has it
/// (`null` at the points without).
struct Rates<'a, I: Iterator<Item = Option<&'a SignalPoint>> + Clone>(I);

impl<'a, I: Iterator<Item = Option<&'a SignalPoint>> + Clone> Serialize for Rates<'a, I> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let column = |f: &dyn Fn(&SignalPoint) -> f64| {
            self.0
                .clone()
                .map(|p| short(p.map_or(0.0, f)))
                .collect::<Vec<_>>()
        };
        let optional = |f: &dyn Fn(&SignalPoint) -> Option<f64>| {
            let values: Vec<Option<f64>> =
                self.0.clone().map(|p| p.and_then(f).map(short)).collect();
            values.iter().any(Option::is_some).then_some(values)
        };
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("canaryLow", &column(&|p| p.canary.low))?;
        map.serialize_entry("canaryHigh", &column(&|p| p.canary.high))?;
        map.serialize_entry("stableLow", &column(&|p| p.stable.low))?;
        map.serialize_entry("stableHigh", &column(&|p| p.stable.high))?;
        if let Some(limit) = optional(&|p| p.limit) {
            map.serialize_entry("limit", &limit)?;
        }
        if let Some(limit) = optional(&|p| p.stable_limit) {
            map.serialize_entry("stableLimit", &limit)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(requests: u64, errors: u64, slow: u64) -> BackendTotals {
        BackendTotals {
            requests,
            errors,
            slow,
            ..BackendTotals::default()
        }
    }

    const LIMIT: Gate = Gate {
        signal: Signal::Errors,
        bound: Bound::Limit(Percent::from_thousandths_const(1_000)),
    };
    const STABLE: Gate = Gate {
        signal: Signal::Errors,
        bound: Bound::Stable {
            degradation: 25_000,
        },
    };
    const LATENCY: Gate = Gate {
        signal: Signal::SlowerThan(Duration::from_millis(500)),
        bound: Bound::Limit(Percent::from_thousandths_const(1_000)),
    };

    fn at(seconds: f64) -> Timestamp {
        Timestamp::from_nanosecond(1_800_000_000_000_000_000 + (seconds * 1e9).round() as i128)
            .expect("a time")
    }

    fn step(p: &str) -> Option<Percent> {
        Percent::parse(p).ok()
    }

    fn look<'a>(gates: &'a [Gate], phase: Phase, p: &str, canary: u64, errors: u64) -> Look<'a> {
        Look {
            phase,
            step: step(p),
            step_index: None,
            held: false,
            entered: false,
            canary: totals(canary, errors, 0),
            stable: totals(canary * 9, errors, 0),
            concurrent: true,
            gates,
            confidence: Confidence::DEFAULT,
        }
    }

    #[test]
    fn nothing_is_kept_before_the_first_step() {
        let mut h = History::default();
        h.record(&look(&[LIMIT], Phase::Waiting, "0%", 0, 0), at(0.0));
        let mut waiting = look(&[LIMIT], Phase::Waiting, "0%", 0, 0);
        waiting.step = None;
        h.record(&waiting, at(0.5));
        assert!(h.is_empty());
        assert!(h.points().is_empty() && h.boundaries().is_empty());
    }

    #[test]
    fn a_point_a_second_at_most_the_newest_showing_the_last_look() {
        let gates = [LIMIT];
        let mut h = History::default();
        let mut first = look(&gates, Phase::Progressing, "5%", 0, 0);
        first.entered = true;
        h.record(&first, at(10.0));
        for (i, s) in [0.3, 0.6, 1.2, 1.5, 1.9, 2.4].into_iter().enumerate() {
            let n = (i as u64 + 1) * 100;
            h.record(&look(&gates, Phase::Progressing, "5%", n, 0), at(10.0 + s));
        }
        let ats: Vec<f64> = h.points().iter().map(|p| p.at).collect();
        // 0.3, 0.6 and 1.2 are the newest in turn (each less than a second
        // after the point before it, 0); 1.5 comes after 1.2 had its
        // second, then 1.9 and 2.4 replace it in turn.
        assert_eq!(ats, [0.0, 1.2, 2.4]);
        assert_eq!(h.points().last().map(|p| p.canary.requests), Some(600));
        assert_eq!(
            h.boundaries(),
            &[Boundary {
                at: 0.0,
                step: step("5%"),
                step_index: None,
                outcome: Outcome::Started
            }]
        );
    }

    #[test]
    fn a_full_history_thins_its_older_half_and_keeps_the_first_point() {
        let gates = [LIMIT];
        let mut h = History::default();
        for i in 0..5_000u64 {
            h.record(&look(&gates, Phase::Progressing, "5%", i, 0), at(i as f64));
            assert!(h.points().len() <= CAPACITY);
        }
        let points = h.points();
        assert!(points.len() > CAPACITY / 2, "{}", points.len());
        assert_eq!(points[0].at, 0.0);
        assert_eq!(points.last().map(|p| p.at), Some(4_999.0));
        // In time order, and denser towards now.
        assert!(points.windows(2).all(|w| w[0].at < w[1].at));
        let gap = |i: usize| points[i + 1].at - points[i].at;
        assert!(
            gap(1) > gap(points.len() - 2),
            "{} {}",
            gap(1),
            gap(points.len() - 2)
        );
        assert_eq!(gap(points.len() - 2), 1.0);
    }

    #[test]
    fn bounds_bracket_each_side_s_rate_and_narrow_with_the_counts() {
        let gates = [LIMIT, STABLE];
        let mut h = History::default();
        h.record(&look(&gates, Phase::Progressing, "10%", 200, 2), at(0.0));
        h.record(
            &look(&gates, Phase::Progressing, "10%", 20_000, 200),
            at(60.0),
        );
        let [few, many] = h.points() else {
            panic!("{:?}", h.points())
        };
        for p in [few, many] {
            let rate = p.canary.errors as f64 / p.canary.requests as f64;
            let e = p.errors;
            assert!(e.canary.low <= rate && rate <= e.canary.high, "{e:?}");
            let stable = p.stable.errors as f64 / p.stable.requests as f64;
            assert!(e.stable.low <= stable && stable <= e.stable.high, "{e:?}");
            assert_eq!(e.limit, Some(0.01));
            // 1.25 times the stable's rate so far.
            let want = 1.25 * stable;
            assert!((e.stable_limit.expect("a stable limit") - want).abs() < 1e-12);
            assert_eq!(p.slow, None, "no latency gate");
        }
        assert!(
            many.errors.canary.high - many.errors.canary.low
                < few.errors.canary.high - few.errors.canary.low
        );
        // 1% of 20,000 against a 1% limit: not rejected, the lower bound
        // stays below the limit.
        assert!(many.errors.canary.low < 0.01);
        // Without requests: nothing is known.
        let none = signal(
            &look(&gates, Phase::Progressing, "10%", 0, 0),
            |s| *s == Signal::Errors,
            |t| t.errors,
            |t| t.requests,
        );
        assert_eq!(
            none.canary,
            Band {
                low: 0.0,
                high: 1.0
            }
        );
        assert_eq!(none.stable_limit, None);
    }

    #[test]
    fn the_lower_bound_passes_the_limit_when_the_gate_fails() {
        let gates = [LIMIT];
        for (n, x) in [
            (50u64, 12u64),
            (1_000, 30),
            (10, 10),
            (1_000, 5),
            (100, 2),
            (1, 1),
        ] {
            let rejects = super::super::evidence::absolute(x, n, 0.01).rejects(0.01);
            let p = point(&look(&gates, Phase::Progressing, "5%", n, x), 0.0);
            assert_eq!(p.errors.canary.low > 0.01, rejects, "{x} of {n}: {p:?}");
        }
    }

    #[test]
    fn the_slow_rate_is_kept_when_a_latency_gate_judges_it() {
        let gates = [LIMIT, LATENCY];
        let mut l = look(&gates, Phase::Progressing, "5%", 100, 0);
        l.canary.slow = 30;
        let p = point(&l, 0.0);
        let slow = p.slow.expect("slow responses are judged");
        assert!(
            slow.canary.low > 0.01 && slow.canary.high >= 0.3,
            "{slow:?}"
        );
        assert_eq!(slow.limit, Some(0.01));
        assert_eq!(p.canary.slow, 30);
    }

    #[test]
    fn without_stable_traffic_the_limit_is_the_judge_s_bound_on_the_recorded_rate() {
        let gates = [STABLE];
        let mut l = look(&gates, Phase::Progressing, "100%", 1_000, 10);
        l.concurrent = false;
        let p = point(&l, 0.0);
        let alpha = Confidence::DEFAULT.alpha();
        let want = 1.25 * upper_bound(10, 9_000, alpha / 4.0);
        assert!((p.errors.stable_limit.expect("a limit") - want).abs() < 1e-12);
        assert!(want > 1.25 * 10.0 / 9_000.0);
        // Too little recorded to bound the stable's rate below 80%: the
        // judge judges nothing, and there is no limit to draw.
        let mut l = look(&gates, Phase::Progressing, "100%", 0, 0);
        l.concurrent = false;
        assert_eq!(point(&l, 0.0).errors.stable_limit, None);
    }

    #[test]
    fn boundaries_say_each_step_and_how_the_rollout_ended() {
        let gates = [LIMIT];
        let mut h = History::default();
        let mut l = look(&gates, Phase::Progressing, "5%", 10, 0);
        l.step_index = Some(0);
        h.record(&l, at(0.0));
        h.record(&l, at(30.0));
        l.step = step("25%");
        l.step_index = Some(1);
        l.entered = true;
        h.record(&l, at(60.0));
        l.entered = false;
        l.phase = Phase::Paused;
        h.record(&l, at(70.0));
        l.phase = Phase::Progressing;
        h.record(&l, at(80.0));
        l.canary = totals(100, 40, 0);
        l.phase = Phase::RolledBack;
        h.record(&l, at(81.0));
        h.record(&l, at(90.0));
        let outcomes: Vec<(f64, Option<Percent>, Outcome)> = h
            .boundaries()
            .iter()
            .map(|b| (b.at, b.step, b.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [
                (0.0, step("5%"), Outcome::Resumed),
                (60.0, step("25%"), Outcome::Passed),
                (70.0, step("25%"), Outcome::Paused),
                (80.0, step("25%"), Outcome::Unpaused),
                (81.0, step("25%"), Outcome::RolledBack),
            ]
        );
        // The rollback's point holds the counts that decided it; nothing
        // after.
        let last = h.points().last().expect("points");
        assert_eq!((last.at, last.canary.errors), (81.0, 40));
        assert_eq!(h.points().len(), 6);
    }

    #[test]
    fn a_held_pause_keeps_its_point_and_stops() {
        let gates = [LIMIT];
        let mut h = History::default();
        let mut l = look(&gates, Phase::Progressing, "5%", 10, 10);
        h.record(&l, at(0.0));
        l.phase = Phase::Paused;
        l.held = true;
        h.record(&l, at(1.0));
        h.record(&l, at(5.0));
        assert_eq!(h.points().len(), 2);
        assert_eq!(
            h.boundaries().last().map(|b| b.outcome),
            Some(Outcome::Paused)
        );
        // The policy changed: judged again, counting anew.
        l.phase = Phase::Progressing;
        l.held = false;
        l.canary = totals(0, 0, 0);
        h.record(&l, at(9.0));
        assert_eq!(
            h.boundaries().last().map(|b| b.outcome),
            Some(Outcome::Resumed)
        );
        assert_eq!(h.points().len(), 3);
    }

    #[test]
    fn boundaries_are_bounded() {
        let gates = [LIMIT];
        let mut h = History::default();
        for i in 0..(MAX_BOUNDARIES as u64 + 20) {
            let phase = if i % 2 == 0 {
                Phase::Progressing
            } else {
                Phase::Paused
            };
            h.record(&look(&gates, phase, "5%", i, 0), at(i as f64));
        }
        assert_eq!(h.boundaries().len(), MAX_BOUNDARIES);
        assert_eq!(h.boundaries()[0].at, 20.0);
    }

    #[test]
    fn the_json_is_columns_of_numbers() {
        let gates = [LIMIT, LATENCY];
        let mut h = History::default();
        let mut l = look(&gates, Phase::Progressing, "5%", 100, 1);
        l.step_index = Some(0);
        l.entered = true;
        h.record(&l, at(0.0));
        l.entered = false;
        l.canary = totals(300, 2, 4);
        h.record(&l, at(1.25));
        let json = serde_json::to_value(&h).expect("JSON");
        assert_eq!(json["since"], at(0.0).to_string());
        assert_eq!(json["t"], serde_json::json!([0.0, 1.3]));
        assert_eq!(json["requests"], serde_json::json!([100, 300]));
        assert_eq!(json["errors"], serde_json::json!([1, 2]));
        assert_eq!(json["slow"], serde_json::json!([0, 4]));
        assert_eq!(json["stableRequests"], serde_json::json!([900, 900]));
        assert_eq!(json["errorRate"]["limit"], serde_json::json!([0.01, 0.01]));
        assert!(json["errorRate"].get("stableLimit").is_none());
        let low = json["errorRate"]["canaryLow"][1]
            .as_f64()
            .expect("a number");
        let high = json["errorRate"]["canaryHigh"][1]
            .as_f64()
            .expect("a number");
        assert!(low <= 2.0 / 300.0 && 2.0 / 300.0 <= high, "{json}");
        assert_eq!(json["slowRate"]["limit"], serde_json::json!([0.01, 0.01]));
        assert_eq!(
            json["steps"],
            serde_json::json!([{"t": 0.0, "step": "5%", "stepIndex": 0, "outcome": "started"}])
        );
        assert_eq!(short(0.0123456), 0.01235);
        assert_eq!(short(0.0), 0.0);
        assert_eq!(short(1.0), 1.0);
    }
}
