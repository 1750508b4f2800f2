//! The gates a rollout's steps are judged by, in one shape: a [`Gate`] is
//! a signal (5xx, or responses slower than `maxLatency`) held to a bound
//! (an absolute rate, or the stable traffic's rate times a tolerance).
//! [`Judge`] keeps one rollout's evidence and says, at any look, whether a
//! gate is breached at the policy's confidence ([`Verdict`]) and what the
//! counts so far could have caught ([`GateReport`]). Adding a gate is a
//! variant here and its tests; the machine, status and the admin views
//! only carry what this module says.
//!
//! The error budget: a rollout within its limits is rolled back with
//! probability at most `1 - confidence` over its whole life, however
//! often it is looked at. Each of the `k` gates gets `(1 - confidence) /
//! k` (Bonferroni); a gate against the stable spends half of its share on
//! the steps that serve both sides and half on the steps that serve no
//! stable traffic (the last step of a full promotion), where it is judged
//! against the stable's rate recorded during the rollout: an upper
//! confidence bound of that rate (a quarter) and an absolute test against
//! `r0` times that bound (a quarter). See `docs/rollouts.md`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::evidence::{
    DETECTABLE, Sequential, absolute, detectable_ratio, lower_bound, odds, power_at, rate_text,
    ratio_text, relative_odds, trials_to_catch, trials_to_catch_surely, upper_bound,
};
use super::machine::duration_text;
use crate::metrics::BackendTotals;
use crate::resources::Percent;

/// What a gate counts as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A 5xx response (including those sluice answers for the backend).
    Errors,
    /// A response slower than this (`maxLatency`).
    SlowerThan(Duration),
}

/// What the canary's event rate is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// At most this share of its responses (`maxErrorRate`; a p99 at most
    /// `maxLatency` is at most 1% slower than it).
    Limit(Percent),
    /// At most `1 + degradation` times the stable's rate over the same
    /// time (`baseline: Stable`, `maxDegradation`), in thousandths of a
    /// percent (25% is 25,000).
    Stable { degradation: u32 },
}

/// One gate: a signal held to a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub signal: Signal,
    pub bound: Bound,
}

/// The policy's confidence: `"99%"` is 99,000 thousandths of a percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confidence(pub Percent);

impl Confidence {
    /// The default: 99%.
    pub const DEFAULT: Confidence = Confidence(Percent::from_thousandths_const(99_000));

    /// The whole rollout's error budget: `1 - confidence`.
    pub fn alpha(self) -> f64 {
        1.0 - f64::from(self.0.thousandths()) / f64::from(Percent::SCALE)
    }
}

impl Default for Confidence {
    fn default() -> Self {
        Confidence::DEFAULT
    }
}

impl Gate {
    /// The gate's events in `t`. For the error gates, with `consistentBy`:
    /// each user's first 5xx in a step; its repeated errors are not judged
    /// (`docs/rollouts.md`, "Users": one user's retry storm is one event).
    pub fn events(&self, t: &BackendTotals) -> u64 {
        match self.signal {
            Signal::Errors => t.errors.saturating_sub(t.repeated_errors),
            Signal::SlowerThan(_) => t.slow,
        }
    }

    /// The trials the gate's events are counted among in `t`: the
    /// requests, less (for the error gates) the repeated errors, which are
    /// neither events nor trials.
    pub fn trials(&self, t: &BackendTotals) -> u64 {
        match self.signal {
            Signal::Errors => judged_requests(t),
            Signal::SlowerThan(_) => t.requests,
        }
    }

    /// The tolerance against the stable, `1 + maxDegradation`.
    fn r0(degradation: u32) -> f64 {
        1.0 + f64::from(degradation) / f64::from(Percent::SCALE)
    }

    fn what(&self) -> String {
        match self.signal {
            Signal::Errors => "5xx".into(),
            Signal::SlowerThan(d) => format!("slower than {}", duration_text(d)),
        }
    }

    /// `5xx <= 1%`, `5xx <= 1.25x stable`, `p99 <= 500ms`.
    pub fn describe(&self) -> String {
        match (self.signal, self.bound) {
            (Signal::Errors, Bound::Limit(p)) => format!("5xx <= {p}"),
            (Signal::SlowerThan(d), Bound::Limit(p)) if p == Percent::from_thousandths(1_000) => {
                format!("p99 <= {}", duration_text(d))
            }
            (Signal::SlowerThan(d), Bound::Limit(p)) => {
                format!("slower than {} <= {p}", duration_text(d))
            }
            (_, Bound::Stable { degradation }) => {
                format!(
                    "{} <= {} stable",
                    self.what(),
                    ratio_text(Gate::r0(degradation))
                )
            }
        }
    }

    /// The field of the policy this gate comes from, for messages.
    fn field(&self) -> String {
        match (self.signal, self.bound) {
            (Signal::Errors, Bound::Limit(p)) => format!("maxErrorRate {p}"),
            (Signal::SlowerThan(d), Bound::Limit(p)) => {
                format!("{p} (maxLatency {} is a p99)", duration_text(d))
            }
            (_, Bound::Stable { degradation }) => format!(
                "{} the stable's rate (maxDegradation {})",
                ratio_text(Gate::r0(degradation)),
                degradation_text(degradation)
            ),
        }
    }
}

/// The requests of `t` a step counts towards `minRequests` and the error
/// gates judge: all but a user's repeated errors in a step (none without
/// `consistentBy`).
pub fn judged_requests(t: &BackendTotals) -> u64 {
    t.requests.saturating_sub(t.repeated_errors)
}

/// `25%`, `150%`, `2.5%`: thousandths of a percent, any size.
pub fn degradation_text(thousandths: u32) -> String {
    let (whole, fraction) = (thousandths / 1000, thousandths % 1000);
    if fraction == 0 {
        format!("{whole}%")
    } else {
        let digits = format!("{fraction:03}");
        format!("{whole}.{}%", digits.trim_end_matches('0'))
    }
}

/// `12 of 4,000 (0.3%)`.
fn counts(events: u64, requests: u64) -> String {
    let rate = if requests == 0 {
        "no requests".to_string()
    } else {
        rate_text(events as f64 / requests as f64)
    };
    format!("{events} of {} ({rate})", thousands(requests))
}

fn thousands(n: u64) -> String {
    let text = n.to_string();
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i > 0 && (text.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn confidence_text(c: Confidence) -> String {
    c.0.to_string()
}

/// What a look at the gates decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No gate is breached.
    Holds,
    /// A gate is breached: the message names the evidence.
    Breached(String),
    /// An absolute limit is breached but the stable fails alike (a shared
    /// outage): the canary is not blamed.
    Excused(String),
}

/// One gate as the status shows it: its counts, its evidence and what
/// the current step's counts could have caught.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateReport {
    /// `5xx <= 1%`, `5xx <= 1.25x stable`.
    pub gate: String,
    /// The incoming backends' events and requests the test judged.
    pub canary: String,
    /// The outgoing backends' over the same time.
    pub stable: String,
    /// The test's likelihood ratio; the gate fails when it reaches
    /// `needed`.
    pub evidence: f64,
    pub needed: f64,
    /// What this step's counts would catch: `a 3x 5xx rate (3%) would be
    /// caught at 99%`.
    pub detects: String,
    /// Whether the step's counts could catch a canary at twice the gate's
    /// bound (for a gate against the stable: twice `1 + maxDegradation`).
    #[serde(default)]
    pub powered: bool,
}

/// The counts of a step as the judge sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepView {
    /// The incoming backends' counts in this step.
    pub canary: BackendTotals,
    /// The outgoing backends' counts in this step.
    pub stable: BackendTotals,
    /// Whether this step serves the outgoing backends at all (the last
    /// step of a full promotion does not).
    pub concurrent: bool,
    /// Whether users are counted (the policy sets `consistentBy`): the
    /// messages then say how many users the errors came from.
    pub keyed: bool,
}

/// One rollout's evidence, from its first step (or from when this
/// process resumed it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judge {
    /// Per gate against the stable: the test of the events' split.
    relative: Vec<Sequential>,
    /// The incoming backends' counts since the first step.
    canary: BackendTotals,
    /// The outgoing backends' counts since the first step: what the steps
    /// without stable traffic are judged against.
    stable: BackendTotals,
}

impl Judge {
    /// Add what happened since the last look: `canary` of the incoming
    /// backends, `stable` of the outgoing ones.
    pub fn observe(&mut self, gates: &[Gate], canary: &BackendTotals, stable: &BackendTotals) {
        self.relative.resize(gates.len(), Sequential::default());
        self.canary.merge(canary);
        self.stable.merge(stable);
        for (gate, test) in gates.iter().zip(self.relative.iter_mut()) {
            if let Bound::Stable { degradation } = gate.bound {
                let o = relative_odds(
                    gate.trials(canary) as f64,
                    gate.trials(stable) as f64,
                    Gate::r0(degradation),
                );
                let (c, s) = (gate.events(canary), gate.events(stable));
                test.observe(c as f64, (c + s) as f64, o);
            }
        }
    }

    /// The incoming and outgoing backends' counts since the first step.
    pub fn totals(&self) -> (BackendTotals, BackendTotals) {
        (self.canary, self.stable)
    }

    /// Judge every gate now. `who` names the incoming backends.
    pub fn verdict(
        &self,
        gates: &[Gate],
        confidence: Confidence,
        step: &StepView,
        who: &str,
    ) -> Verdict {
        let mut excused = None;
        for (i, gate) in gates.iter().enumerate() {
            match self.judge(i, gate, gates, confidence, step, who) {
                Verdict::Holds => {}
                Verdict::Breached(m) => return Verdict::Breached(m),
                Verdict::Excused(m) => excused = excused.or(Some(m)),
            }
        }
        excused.map_or(Verdict::Holds, Verdict::Excused)
    }

    fn alpha(gates: &[Gate], confidence: Confidence) -> f64 {
        confidence.alpha() / gates.len().max(1) as f64
    }

    fn judge(
        &self,
        i: usize,
        gate: &Gate,
        gates: &[Gate],
        confidence: Confidence,
        step: &StepView,
        who: &str,
    ) -> Verdict {
        let alpha = Judge::alpha(gates, confidence);
        let conf = confidence_text(confidence);
        let (c_events, c_requests) = (gate.events(&self.canary), gate.trials(&self.canary));
        let (s_events, s_requests) = (gate.events(&self.stable), gate.trials(&self.stable));
        // With consistentBy, an error gate says the users the errors came
        // from.
        let users = match gate.signal {
            Signal::Errors => super::users::step_errors_text(step),
            Signal::SlowerThan(_) => String::new(),
        };
        match gate.bound {
            Bound::Limit(limit) => {
                let p = f64::from(limit.thousandths()) / f64::from(Percent::SCALE);
                if !absolute(c_events, c_requests, p).rejects(alpha) {
                    return Verdict::Holds;
                }
                let stable = counts(s_events, s_requests);
                let canary = format!("{who} {} {}", gate.what(), counts(c_events, c_requests));
                // Judged against the stable too: a limit the stable breaks
                // alike is a shared outage, not the canary's doing. Alike
                // by the stable's measured rate: its lower confidence
                // bound instead would blame the canary for the stable's
                // first, still uncertain minutes of an outage (1.44% of
                // healthy rollouts in a 3% shared outage rolled back in
                // the simulator, against 0.13%), at the price of a few
                // unlucky stable errors at low traffic excusing a far
                // worse canary (docs/rollouts.md, "A shared outage").
                let tolerance = gates.iter().find_map(|g| match g.bound {
                    Bound::Stable { degradation } if g.signal == gate.signal => {
                        Some(Gate::r0(degradation))
                    }
                    _ => None,
                });
                if let Some(r0) = tolerance
                    && s_requests > 0
                    && s_events as f64 / s_requests as f64 * r0 >= p
                {
                    return Verdict::Excused(format!(
                        "{canary} is above {} at {conf} confidence, but the stable fails too ({stable} over the same time): not the canary's doing",
                        gate.field()
                    ));
                }
                Verdict::Breached(format!(
                    "{canary} is above {} at {conf} confidence (its rate is above {} at that confidence){users}; the stable: {stable} over the same time",
                    gate.field(),
                    rate_text(lower_bound(c_events, c_requests, alpha))
                ))
            }
            Bound::Stable { degradation } => {
                let r0 = Gate::r0(degradation);
                let canary = format!("{who} {} {}", gate.what(), counts(c_events, c_requests));
                let stable = counts(s_events, s_requests);
                if step.concurrent {
                    let test = self.relative.get(i).copied().unwrap_or_default();
                    if !test.rejects(alpha / 2.0) {
                        return Verdict::Holds;
                    }
                    return Verdict::Breached(format!(
                        "{canary} against the stable's {stable} over the same time: worse than {} at {conf} confidence (evidence {:.0} against {:.0} needed){users}",
                        gate.field(),
                        test.evidence(),
                        2.0 / alpha
                    ));
                }
                // No stable traffic in this step: against the stable's
                // rate recorded during the rollout.
                let bound = upper_bound(s_events, s_requests, alpha / 4.0);
                let limit = r0 * bound;
                if limit >= 1.0 {
                    return Verdict::Holds;
                }
                let (x, n) = (gate.events(&step.canary), gate.trials(&step.canary));
                if !absolute(x, n, limit).rejects(alpha / 4.0) {
                    return Verdict::Holds;
                }
                Verdict::Breached(format!(
                    "{who} {} {} in this step, with no stable traffic left to compare with, is above {} times the stable's rate recorded during the rollout ({stable}, at most {} at {conf} confidence): worse than {} at {conf} confidence{users}",
                    gate.what(),
                    counts(x, n),
                    ratio_text(r0),
                    rate_text(bound),
                    gate.field()
                ))
            }
        }
    }

    /// Every gate's counts, evidence and power at this step's counts.
    pub fn reports(
        &self,
        gates: &[Gate],
        confidence: Confidence,
        step: &StepView,
    ) -> Vec<GateReport> {
        let alpha = Judge::alpha(gates, confidence);
        let conf = confidence_text(confidence);
        gates
            .iter()
            .enumerate()
            .map(|(i, gate)| {
                let canary = counts(gate.events(&self.canary), gate.trials(&self.canary));
                let stable = counts(gate.events(&self.stable), gate.trials(&self.stable));
                let (evidence, needed, detects, powered) = match gate.bound {
                    Bound::Limit(limit) => {
                        let p = f64::from(limit.thousandths()) / f64::from(Percent::SCALE);
                        let test =
                            absolute(gate.events(&self.canary), gate.trials(&self.canary), p);
                        let n = gate.trials(&step.canary);
                        let r = detectable_ratio(n as f64, odds(p), alpha);
                        let detects = match r {
                            Some(r) => format!(
                                "at this step's {} requests, a {} {} rate ({}) would be caught at {conf}",
                                thousands(n),
                                ratio_text(r),
                                gate.what(),
                                rate_text((r * p).min(1.0))
                            ),
                            None => format!(
                                "at this step's {} requests, not even a canary failing everything would be caught yet",
                                thousands(n)
                            ),
                        };
                        (test.evidence(), 1.0 / alpha, detects, r.is_some_and(|r| r <= 2.0))
                    }
                    Bound::Stable { degradation } => {
                        let r0 = Gate::r0(degradation);
                        let test = self.relative.get(i).copied().unwrap_or_default();
                        let r = if step.concurrent {
                            relative_power(gate, step, r0, alpha / 2.0)
                        } else {
                            let bound = upper_bound(
                                gate.events(&self.stable),
                                gate.trials(&self.stable),
                                alpha / 4.0,
                            );
                            let limit = r0 * bound;
                            (limit < 1.0)
                                .then(|| {
                                    detectable_ratio(
                                        gate.trials(&step.canary) as f64,
                                        odds(limit),
                                        alpha / 4.0,
                                    )
                                    .map(|x| x * r0 * bound
                                        / (gate.events(&self.stable).max(1) as f64
                                            / gate.trials(&self.stable).max(1) as f64))
                                })
                                .flatten()
                        };
                        let detects = match r {
                            Some(r) => format!(
                                "at this step's counts, a canary at {} the stable's {} rate would be caught at {conf}{}",
                                ratio_text(r),
                                gate.what(),
                                if r > 2.0 * r0 {
                                    format!(
                                        "; too little traffic to catch a regression near {}",
                                        gate.field()
                                    )
                                } else {
                                    String::new()
                                }
                            ),
                            None => format!(
                                "at this step's counts, no regression against the stable's {} rate would be caught yet{}",
                                gate.what(),
                                if step.concurrent {
                                    ""
                                } else {
                                    " (no stable traffic left to compare with, and too little recorded)"
                                }
                            ),
                        };
                        (test.evidence(), 2.0 / alpha, detects, r.is_some_and(|r| r <= 2.0 * r0))
                    }
                };
                GateReport {
                    gate: gate.describe(),
                    canary,
                    stable,
                    evidence,
                    needed,
                    detects,
                    powered,
                }
            })
            .collect()
    }
}

/// The regressions [`plan`] says each gate catches: multiples of its
/// bound.
const PLANNED: [f64; 3] = [2.0, 4.0, 10.0];

/// What each gate catches and after how much traffic, on expected counts
/// and before any traffic is seen (`sluice check`): for an absolute
/// limit, the canary's requests a 2x, 4x and 10x rate (and one failing
/// everything) need; against the stable, at each step that serves both
/// sides, the 5xx (or slow responses) of both sides together, whatever
/// the stable's rate. One line per gate.
pub fn plan(
    gates: &[Gate],
    confidence: Confidence,
    steps: &[Percent],
    min_requests: u64,
) -> Vec<String> {
    let alpha = Judge::alpha(gates, confidence);
    // On expected counts (about half of such canaries are caught by
    // then), and the traffic that catches 99 in 100 of them.
    let after = |theta: f64, null: f64, alpha: f64| match trials_to_catch(theta, null, alpha) {
        Some(n) => {
            let sure = match trials_to_catch_surely(theta, null, alpha, SURE) {
                Some(m) if m > n => format!(" (99 in 100 by {})", thousands(m)),
                Some(_) => String::new(),
                None => " (99 in 100 never within ten million)".into(),
            };
            format!("after about {}{sure}", thousands(n))
        }
        None => "never within a billion".into(),
    };
    gates
        .iter()
        .map(|gate| match gate.bound {
            Bound::Limit(limit) => {
                let p = f64::from(limit.thousandths()) / f64::from(Percent::SCALE);
                let mut parts: Vec<String> = PLANNED
                    .iter()
                    .filter(|r| *r * p < 1.0)
                    .map(|r| {
                        format!(
                            "{} ({}) {}",
                            ratio_text(*r),
                            rate_text(r * p),
                            after(r * p, odds(p), alpha)
                        )
                    })
                    .collect();
                if let Some(first) = parts.first_mut() {
                    *first = format!("a canary at {first}");
                }
                format!(
                    "{}, in the canary's requests: {}; one failing everything {}{}",
                    gate.describe(),
                    parts.join(", "),
                    after(1.0, odds(p), alpha),
                    step_power(p, alpha, min_requests)
                )
            }
            Bound::Stable { degradation } => {
                let r0 = Gate::r0(degradation);
                let both: Vec<String> = steps
                    .iter()
                    .filter(|s| **s < Percent::HUNDRED)
                    .map(|step| {
                        let s = f64::from(step.thousandths()) / f64::from(Percent::SCALE);
                        let null = r0 * s / (1.0 - s);
                        let parts: Vec<String> = PLANNED
                            .iter()
                            .filter(|r| **r > r0)
                            .map(|r| {
                                let theta = r * s / (r * s + 1.0 - s);
                                format!(
                                    "{} {}",
                                    ratio_text(*r),
                                    after(theta, null, alpha / 2.0)
                                )
                            })
                            .collect();
                        format!("at step {step}, a canary at {}", parts.join(", "))
                    })
                    .collect();
                format!(
                    "{}, in the {} of both sides together: {}; the last step, against the stable's rate recorded during the rollout",
                    gate.describe(),
                    gate.what(),
                    both.join("; ")
                )
            }
        })
        .collect()
}

/// The share of such canaries a plan's "99 in 100" figure catches.
const SURE: f64 = 0.99;

/// What a step of `min_requests` canary requests alone catches against
/// an absolute limit `p`: each planned regression's chance, and, when the
/// largest is not caught 99 times in 100, the `minRequests` that would
/// (a step promotes once its interval has passed and it has that many).
fn step_power(p: f64, alpha: f64, min_requests: u64) -> String {
    if min_requests == 0 {
        return "; minRequests is not set: a step's interval alone decides how much it sees".into();
    }
    let planned: Vec<f64> = PLANNED.into_iter().filter(|r| r * p < 1.0).collect();
    let chances: Vec<String> = planned
        .iter()
        .map(|r| {
            let chance = power_at(min_requests, r * p, odds(p), alpha);
            format!("{} {}", ratio_text(*r), chance_text(chance))
        })
        .collect();
    let mut text = format!(
        "; a step of minRequests {} alone catches {}",
        thousands(min_requests),
        chances.join(", ")
    );
    if let Some(largest) = planned.last()
        && power_at(min_requests, largest * p, odds(p), alpha) < SURE
        && let Some(n) = trials_to_catch_surely(largest * p, odds(p), alpha, SURE)
    {
        text.push_str(&format!(
            " (minRequests {} would catch {} 99 times in 100 within one step)",
            thousands(n),
            ratio_text(*largest)
        ));
    }
    text
}

/// A probability as a share for plans: `99.9%`, `62%`, `less than 1%`.
fn chance_text(p: f64) -> String {
    if p >= 0.999 {
        "more than 99.9% of the time".into()
    } else if p < 0.01 {
        "less than 1% of the time".into()
    } else if p >= 0.99 {
        format!("{:.1}% of the time", (p * 1000.0).floor() / 10.0)
    } else {
        format!("{:.0}% of the time", (p * 100.0).floor())
    }
}

/// The smallest ratio to the stable's rate that the relative test would
/// catch at `alpha` on this step's expected counts (the stable's rate
/// taken as observed, at least one event).
fn relative_power(gate: &Gate, step: &StepView, r0: f64, alpha: f64) -> Option<f64> {
    let (nc, ns) = (
        gate.trials(&step.canary) as f64,
        gate.trials(&step.stable) as f64,
    );
    if nc <= 0.0 || ns <= 0.0 {
        return None;
    }
    let rate = gate.events(&step.stable).max(1) as f64 / ns;
    let o = relative_odds(nc, ns, r0);
    DETECTABLE.into_iter().filter(|r| *r > r0).find(|r| {
        let hits = (nc * r * rate).min(nc);
        let trials = hits + ns * rate;
        let mut s = Sequential::default();
        s.observe(hits, trials, o);
        s.rejects(alpha)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(requests: u64, errors: u64) -> BackendTotals {
        BackendTotals {
            requests,
            errors,
            ..BackendTotals::default()
        }
    }

    fn limit(p: &str) -> Gate {
        Gate {
            signal: Signal::Errors,
            bound: Bound::Limit(Percent::parse(p).expect("percent")),
        }
    }

    const STABLE: Gate = Gate {
        signal: Signal::Errors,
        bound: Bound::Stable {
            degradation: 25_000,
        },
    };

    fn concurrent(canary: BackendTotals, stable: BackendTotals) -> StepView {
        StepView {
            canary,
            stable,
            concurrent: true,
            keyed: false,
        }
    }

    #[test]
    fn a_canary_failing_everything_breaches_after_a_few_errors_naming_the_evidence() {
        let gates = [limit("1%")];
        let mut j = Judge::default();
        let mut served = 0;
        let verdict = loop {
            served += 1;
            j.observe(&gates, &totals(1, 1), &totals(199, 1));
            let (c, s) = j.totals();
            let v = j.verdict(&gates, Confidence::DEFAULT, &concurrent(c, s), "canary");
            if v != Verdict::Holds || served > 20 {
                break v;
            }
        };
        assert!(served <= 3, "{served}");
        let Verdict::Breached(m) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(
            m.starts_with(&format!(
                "canary 5xx {served} of {served} (100%) is above maxErrorRate 1% at 99% confidence"
            )),
            "{m}"
        );
        assert!(
            m.contains(&format!("the stable: {served} of {} (0.5%)", 199 * served)),
            "{m}"
        );
    }

    #[test]
    fn a_shared_outage_does_not_blame_the_canary() {
        let gates = [limit("1%"), STABLE];
        let mut j = Judge::default();
        for _ in 0..100 {
            j.observe(&gates, &totals(50, 2), &totals(950, 29));
        }
        let (c, s) = j.totals();
        let v = j.verdict(&gates, Confidence::DEFAULT, &concurrent(c, s), "canary");
        let Verdict::Excused(m) = v else {
            panic!("{v:?}")
        };
        assert!(
            m.contains("but the stable fails too (2900 of 95,000 (3.05%)"),
            "{m}"
        );
    }

    #[test]
    fn a_worse_canary_breaches_the_relative_gate_with_both_sides_counts() {
        let gates = [STABLE];
        let mut j = Judge::default();
        let mut verdict = Verdict::Holds;
        for _ in 0..200 {
            // 5% step, stable 0.5%, canary at 10x: 5% errors.
            j.observe(&gates, &totals(50, 2), &totals(950, 5));
            let (c, s) = j.totals();
            verdict = j.verdict(&gates, Confidence::DEFAULT, &concurrent(c, s), "canary");
            if verdict != Verdict::Holds {
                break;
            }
        }
        let Verdict::Breached(m) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(m.contains("against the stable's"), "{m}");
        assert!(
            m.contains("worse than 1.25x the stable's rate (maxDegradation 25%) at 99% confidence"),
            "{m}"
        );
    }

    #[test]
    fn the_last_step_is_judged_against_the_recorded_stable_rate() {
        let gates = [STABLE];
        let mut j = Judge::default();
        // Earlier steps: both sides at 0.5%.
        j.observe(&gates, &totals(10_000, 50), &totals(90_000, 450));
        let healthy = StepView {
            canary: totals(20_000, 100),
            ..StepView::default()
        };
        assert_eq!(
            j.verdict(&gates, Confidence::DEFAULT, &healthy, "canary"),
            Verdict::Holds
        );
        let worse = StepView {
            canary: totals(20_000, 400),
            ..StepView::default()
        };
        let v = j.verdict(&gates, Confidence::DEFAULT, &worse, "canary");
        assert!(
            matches!(&v, Verdict::Breached(m) if m.contains("no stable traffic left")),
            "{v:?}"
        );
    }

    #[test]
    fn the_plan_says_what_each_gate_catches_and_after_how_much() {
        let steps = [
            Percent::from_thousandths(10_000),
            Percent::from_thousandths(50_000),
            Percent::HUNDRED,
        ];
        let lines = plan(&[limit("1%"), STABLE], Confidence::DEFAULT, &steps, 100);
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with(
                "5xx <= 1%, in the canary's requests: a canary at 2x (2%) after about "
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("5xx <= 1.25x stable, in the 5xx of both sides together: at step 10%, a canary at 2x after about "),
            "{}",
            lines[1]
        );
        assert!(
            lines[1].contains("; at step 50%, a canary at 2x after about "),
            "{}",
            lines[1]
        );
        assert!(!lines[1].contains("at step 100%"), "{}", lines[1]);
        // Beside the expected counts, the traffic that catches 99 in 100,
        // and what a step of minRequests alone catches.
        assert!(lines[0].contains(" (99 in 100 by "), "{}", lines[0]);
        assert!(
            lines[0].contains("; a step of minRequests 100 alone catches 2x "),
            "{}",
            lines[0]
        );
        let unset = plan(&[limit("1%")], Confidence::DEFAULT, &steps, 0);
        assert!(unset[0].contains("minRequests is not set"), "{}", unset[0]);
        // The plan agrees with the test it plans for: at the expected
        // counts of the trials it names, the absolute gate rejects, and
        // one fewer does not.
        let alpha = Judge::alpha(&[limit("1%"), STABLE], Confidence::DEFAULT);
        let n = trials_to_catch(0.02, odds(0.01), alpha).unwrap();
        assert!(absolute_at(0.02, n, 0.01).rejects(alpha));
        assert!(!absolute_at(0.02, n - 1, 0.01).rejects(alpha));
        // Bigger regressions need less traffic; failing everything, a
        // handful of requests.
        let needed = |r: f64| trials_to_catch(r * 0.01, odds(0.01), alpha).unwrap();
        assert!(needed(10.0) < needed(4.0) && needed(4.0) < needed(2.0));
        let everything = trials_to_catch(1.0, odds(0.01), alpha).unwrap();
        assert!(everything <= 5, "{everything}");
        // The minRequests the plan suggests for 10x is one that catches
        // it 99 times in 100, and the policy's 100 is not.
        let suggested = lines[0]
            .split("(minRequests ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .map(|n| n.replace(',', "").parse::<u64>().unwrap())
            .unwrap_or_else(|| panic!("a suggested minRequests: {}", lines[0]));
        assert!(power_at(suggested, 0.1, odds(0.01), alpha) >= SURE);
        assert!(power_at(100, 0.1, odds(0.01), alpha) < SURE);
    }

    fn absolute_at(theta: f64, n: u64, limit: f64) -> Sequential {
        let mut s = Sequential::default();
        s.observe(theta * n as f64, n as f64, odds(limit));
        s
    }

    #[test]
    fn reports_say_what_the_step_could_catch() {
        let gates = [limit("1%"), STABLE];
        let mut j = Judge::default();
        j.observe(&gates, &totals(1_000, 5), &totals(19_000, 95));
        let step = concurrent(totals(1_000, 5), totals(19_000, 95));
        let reports = j.reports(&gates, Confidence::DEFAULT, &step);
        assert_eq!(reports[0].gate, "5xx <= 1%");
        assert!(
            reports[0].detects.contains("would be caught at 99%"),
            "{:?}",
            reports[0]
        );
        assert_eq!(reports[1].gate, "5xx <= 1.25x stable");
        assert!(
            reports[1].detects.contains("too little traffic"),
            "{:?}",
            reports[1]
        );
        assert!(!reports[1].powered);
        let few = j.reports(
            &gates,
            Confidence::DEFAULT,
            &concurrent(totals(1, 0), totals(19, 0)),
        );
        assert!(
            few[0]
                .detects
                .contains("not even a canary failing everything"),
            "{:?}",
            few[0]
        );
    }

    /// `requests` of keyed users in one look: `errors` 5xx, `repeated` of
    /// them a user's repeated errors, from `users` new users of whom
    /// `failing` got a first 5xx.
    fn keyed(requests: u64, errors: u64, repeated: u64, users: u64, failing: u64) -> BackendTotals {
        BackendTotals {
            requests,
            errors,
            repeated_errors: repeated,
            users,
            users_with_errors: failing,
            ..BackendTotals::default()
        }
    }

    fn keyed_view(canary: BackendTotals, stable: BackendTotals) -> StepView {
        StepView {
            canary,
            stable,
            concurrent: true,
            keyed: true,
        }
    }

    #[test]
    fn one_users_retry_storm_is_one_error_and_many_users_failing_roll_back() {
        for gates in [vec![limit("1%")], vec![STABLE], vec![limit("1%"), STABLE]] {
            let mut j = Judge::default();
            let mut step = BackendTotals::default();
            // A 5% step: 19 stable requests for each canary one.
            let beside = keyed(19, 0, 0, 19, 0);
            let mut stable = BackendTotals::default();
            // One user's request fails, and it retries 500 times: one
            // first error, 500 repeated ones.
            for look in 0..=500u64 {
                let t = if look == 0 {
                    keyed(1, 1, 0, 1, 1)
                } else {
                    keyed(1, 1, 1, 0, 0)
                };
                j.observe(&gates, &t, &beside);
                step.merge(&t);
                stable.merge(&beside);
                let v = j.verdict(
                    &gates,
                    Confidence::DEFAULT,
                    &keyed_view(step, stable),
                    "canary",
                );
                assert_eq!(v, Verdict::Holds, "{gates:?} after {look} retries");
            }
            // Other users' requests fail too: a few of them roll it back.
            let mut failing = 1;
            let verdict = loop {
                failing += 1;
                let t = keyed(1, 1, 0, 1, 1);
                j.observe(&gates, &t, &beside);
                step.merge(&t);
                stable.merge(&beside);
                let v = j.verdict(
                    &gates,
                    Confidence::DEFAULT,
                    &keyed_view(step, stable),
                    "canary",
                );
                if v != Verdict::Holds || failing > 10 {
                    break v;
                }
            };
            assert!(failing <= 4, "{gates:?}: {failing} users failing");
            let Verdict::Breached(m) = verdict else {
                panic!("{verdict:?}")
            };
            assert!(
                m.contains(&format!(
                    "in this step {} errors from {failing} users (of {failing} users; 500 repeated errors not judged)",
                    500 + failing
                )),
                "{m}"
            );
        }
    }

    #[test]
    fn without_users_every_error_counts_as_before() {
        // The same storm from requests without a key (or without
        // consistentBy): 500 errors, rolled back at once.
        let gates = [limit("1%")];
        let mut j = Judge::default();
        j.observe(&gates, &totals(3, 3), &totals(2_000, 0));
        let (c, s) = j.totals();
        let v = j.verdict(&gates, Confidence::DEFAULT, &concurrent(c, s), "canary");
        assert!(matches!(v, Verdict::Breached(_)), "{v:?}");
    }

    /// A deterministic stream of uniforms in [0, 1).
    struct Lcg(u64);

    impl Lcg {
        fn unit(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn a_healthy_canary_whose_users_retry_their_errors_is_rarely_failed() {
        // Every request of a user without an error in the step fails with
        // probability 0.5% (half the 1% limit); a user that got one
        // retries 20 times, and every retry fails (the failure is the
        // user's, not the canary's). Requests taken as independent, this
        // is a 10% error rate and fails almost every run; judged on each
        // user's first error, at most 1% of the runs may fail, however
        // often they are looked at.
        let gates = [limit("1%")];
        let mut rng = Lcg(7);
        let runs = 100;
        let (mut failed, mut failed_as_requests) = (0, 0);
        for _ in 0..runs {
            let mut j = Judge::default();
            let mut naive = Judge::default();
            let mut step = BackendTotals::default();
            let mut naive_failed = false;
            for _user in 0..1_000 {
                let mut t = keyed(0, 0, 0, 1, 0);
                for _ in 0..5 {
                    t.requests += 1;
                    if rng.unit() < 0.005 {
                        t.errors += 21;
                        t.requests += 20;
                        t.repeated_errors += 20;
                        t.users_with_errors = 1;
                        break;
                    }
                }
                j.observe(&gates, &t, &BackendTotals::default());
                naive.observe(
                    &gates,
                    &totals(t.requests, t.errors),
                    &BackendTotals::default(),
                );
                step.merge(&t);
                let v = j.verdict(
                    &gates,
                    Confidence::DEFAULT,
                    &keyed_view(step, BackendTotals::default()),
                    "canary",
                );
                let (c, s) = naive.totals();
                naive_failed |= matches!(
                    naive.verdict(&gates, Confidence::DEFAULT, &concurrent(c, s), "canary"),
                    Verdict::Breached(_)
                );
                if matches!(v, Verdict::Breached(_)) {
                    failed += 1;
                    break;
                }
            }
            failed_as_requests += u32::from(naive_failed);
        }
        assert!(failed <= 2, "{failed} of {runs} healthy runs failed");
        assert!(
            failed_as_requests >= runs * 9 / 10,
            "counted as requests, the storms fail the gate: {failed_as_requests} of {runs}"
        );
    }
}
