//! The rollout state machine: one [`Rollout`] per (policy, rule), moved
//! along by [`Rollouts::evaluate`] from the configuration, the backends'
//! outcome counters and the clock, all passed in. No I/O, no clock read:
//! tests drive time.
//!
//! Phases:
//! - `Waiting`: the weights changed; an incoming backend does not resolve
//!   or has no ready endpoint, so `from` is served until it does.
//! - `Progressing`: at a step, serving `from + p * (to - from)`; the step
//!   passes when `interval` elapsed, the incoming backends answered
//!   `minRequests`, and every gate holds. A gate fails the step as soon
//!   as its sequential test is sure at the policy's confidence
//!   ([`super::gates`]), whatever `minRequests` says.
//! - `Paused`: `spec.paused` holds the step (gates still judge), or a gate
//!   failed with `onFailure: Pause` (held until the policy's spec changes).
//! - `Complete`: the spec shares are served (also a rule that never rolled
//!   out: nothing to ramp).
//! - `RolledBack`: a gate failed; `from` is served until the route's
//!   weights change again.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::gates::{GateReport, Judge, StepView, Verdict, judged_requests};
use super::history::{History, Look};
use super::shares::{BackendKey, Weights, share_text};
use crate::metrics::BackendTotals;
use crate::resources::{ConsistentKey, OnFailure, Percent, RolloutSettings};
use crate::route::RouteKind;

/// A RolloutPolicy's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PolicyKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One rule of a route, by kind, namespace, name and index (as translate
/// and metrics name it): an HTTPRoute and a GRPCRoute may share a name, and
/// one's rollout or counters are never the other's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleKey {
    pub kind: RouteKind,
    pub namespace: String,
    pub route: String,
    pub rule: usize,
}

impl fmt::Display for RuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} rule {}",
            self.kind, self.namespace, self.route, self.rule
        )
    }
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Waiting,
    Progressing,
    Paused,
    Complete,
    RolledBack,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "Waiting",
            Phase::Progressing => "Progressing",
            Phase::Paused => "Paused",
            Phase::Complete => "Complete",
            Phase::RolledBack => "RolledBack",
        }
    }
}

/// Whether a backend can take traffic, as translate resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NoReadyEndpoints,
    /// The reference does not resolve (`BackendNotFound`, ...).
    Unresolved {
        reason: String,
    },
}

/// A rule a policy governs, as the configuration currently has it.
#[derive(Debug, Clone)]
pub struct GovernedRule {
    pub policy: PolicyKey,
    pub settings: RolloutSettings,
    /// [`crate::resources::RolloutPolicy::spec_fingerprint`].
    pub fingerprint: u64,
    pub rule: RuleKey,
    /// The rule's `name`, when it has one.
    pub rule_name: Option<String>,
    /// The spec weights, by backend, in backendRef order.
    pub spec: Weights,
    pub readiness: Vec<(BackendKey, Readiness)>,
    /// The weights the table in service serves for this rule, when there
    /// is one (none on a first start): a rule newly governed whose spec
    /// changed in the same reload ramps from these.
    pub previously_served: Option<Weights>,
}

/// Everything the state machine reads of the configuration.
#[derive(Debug, Clone, Default)]
pub struct RolloutInputs {
    pub rules: Vec<GovernedRule>,
}

/// One rollout: what is recorded (and persisted) about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub policy: PolicyKey,
    pub rule: RuleKey,
    pub rule_name: Option<String>,
    pub phase: Phase,
    /// The step reached; `None` before the first step.
    pub step: Option<Percent>,
    pub step_started_at: Option<Timestamp>,
    /// The shares served just before the weights changed.
    pub from: Weights,
    /// The spec shares.
    pub to: Weights,
    /// While paused after a failed gate: the policy spec's fingerprint
    /// then; another spec resumes the rollout.
    pub held_for: Option<u64>,
    pub message: String,
}

impl Rollout {
    /// The weights served now. A pure function of the record, so that a
    /// replica can serve what another recorded: Waiting and RolledBack
    /// serve `from`, a step serves `from + p * (to - from)`, Complete the
    /// spec's `to`. A replica that sees new spec weights before a new
    /// record keeps serving this (the shares served before).
    pub fn served(&self) -> Weights {
        match (self.phase, self.step) {
            (Phase::Complete, _) => self.to.clone(),
            (Phase::Waiting | Phase::RolledBack, _) | (_, None) => self.from.clone(),
            (Phase::Progressing | Phase::Paused, Some(p)) => {
                Weights::interpolate(&self.from, &self.to, p)
            }
        }
    }
}

/// The incoming and the outgoing backends' counters, each side summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sides {
    incoming: BackendTotals,
    outgoing: BackendTotals,
}

/// A rollout with what the running process counts for it.
#[derive(Debug, Clone, Default)]
struct Live {
    rollout: Rollout,
    /// The counters when the step started (or when the process resumed
    /// it).
    step_start: Option<Sides>,
    /// The counters at the last look: the judge takes what happened since.
    last: Option<Sides>,
    /// The step's counts so far.
    step: StepView,
    /// The evidence since the first step (or the resume).
    judge: Judge,
    /// The gates as the last look reported them.
    reports: Vec<GateReport>,
    step_index: Option<usize>,
    /// What the gates judged, look by look (the dashboard's chart).
    history: History,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            policy: PolicyKey {
                namespace: String::new(),
                name: String::new(),
            },
            rule: RuleKey {
                kind: RouteKind::Http,
                namespace: String::new(),
                route: String::new(),
                rule: 0,
            },
            rule_name: None,
            phase: Phase::Complete,
            step: None,
            step_started_at: None,
            from: Weights::new(),
            to: Weights::new(),
            held_for: None,
            message: String::new(),
        }
    }
}

/// A rollout entering a phase (a step passed counts as Progressing).
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub policy: PolicyKey,
    pub rule: RuleKey,
    pub phase: Phase,
    pub message: String,
}

/// What one evaluation decided.
#[derive(Debug, Clone, Default)]
pub struct Evaluation {
    pub served: ServedShares,
    /// A recorded rollout changed, appeared or went: save them.
    pub changed: bool,
    pub transitions: Vec<Transition>,
    /// When the clock next matters (a step's interval ends): evaluate
    /// again then, or sooner on new configuration or a governed backend's
    /// 5xx or slow response. `None`: nothing waits on the clock.
    pub next: Option<Timestamp>,
}

/// The served weights of every governed rule: translate's input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServedShares {
    pub rules: BTreeMap<RuleKey, ServedRule>,
}

/// How one governed rule is served.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedRule {
    pub policy: PolicyKey,
    pub phase: Phase,
    pub step: Option<Percent>,
    /// The served weight of each backend (spec backends missing here get
    /// 0; backends here missing from the spec were removed from it and
    /// are still served).
    pub weights: Weights,
    pub from: Weights,
    pub to: Weights,
    pub consistent_by: Option<ConsistentKey>,
}

/// A step's counts as the status shows them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepCounts {
    /// The incoming backends' responses, 5xx, slow responses and p99 in
    /// this step.
    pub requests: u64,
    pub errors: u64,
    pub slow: u64,
    pub p99: Option<Duration>,
    /// The outgoing backends' over the same time.
    pub stable_requests: u64,
    pub stable_errors: u64,
    pub stable_slow: u64,
    /// Each gate's evidence and what this step's counts could catch.
    pub gates: Vec<GateReport>,
    /// With `consistentBy`: the step's users on each side.
    pub users: Option<super::users::StepUsers>,
}

/// Every rollout the gateway runs.
#[derive(Debug, Clone, Default)]
pub struct Rollouts {
    live: BTreeMap<(PolicyKey, RuleKey), Live>,
}

/// Reads a backend's cumulative outcome counters.
pub type Totals<'a> = &'a dyn Fn(&RuleKey, &BackendKey) -> BackendTotals;

impl Rollouts {
    pub fn new() -> Rollouts {
        Rollouts::default()
    }

    /// Continue from recorded rollouts (a restart): their steps resume,
    /// counting again from now; their intervals run from the recorded
    /// step start.
    pub fn restore(records: impl IntoIterator<Item = Rollout>) -> Rollouts {
        let live = records
            .into_iter()
            .map(|rollout| {
                (
                    (rollout.policy.clone(), rollout.rule.clone()),
                    Live {
                        rollout,
                        ..Live::default()
                    },
                )
            })
            .collect();
        Rollouts { live }
    }

    /// The recorded rollouts, in (policy, rule) order.
    pub fn records(&self) -> Vec<Rollout> {
        self.live.values().map(|l| l.rollout.clone()).collect()
    }

    /// Every rollout with its step index and counts, in (policy, rule)
    /// order.
    pub fn report(&self) -> Vec<(Rollout, Option<usize>, StepCounts)> {
        self.live
            .values()
            .map(|l| {
                let (c, s) = (&l.step.canary, &l.step.stable);
                let counts = StepCounts {
                    requests: c.requests,
                    errors: c.errors,
                    slow: c.slow,
                    p99: c.latency_quantile(0.99),
                    stable_requests: s.requests,
                    stable_errors: s.errors,
                    stable_slow: s.slow,
                    gates: l.reports.clone(),
                    users: super::users::StepUsers::of(&l.step),
                };
                (l.rollout.clone(), l.step_index, counts)
            })
            .collect()
    }

    /// Every rollout with what its gates judged over time, in (policy,
    /// rule) order.
    pub fn histories(&self) -> impl Iterator<Item = (&Rollout, &History)> {
        self.live.values().map(|l| (&l.rollout, &l.history))
    }

    /// Whether a rollout is at a step (its gates and clock need judging).
    pub fn in_flight(&self) -> bool {
        self.live.values().any(|l| {
            matches!(
                l.rollout.phase,
                Phase::Waiting | Phase::Progressing | Phase::Paused
            ) && l.rollout.held_for.is_none()
        })
    }

    /// What the recorded rollouts serve for the governed rules of
    /// `inputs`, without moving anything along: what a replica that
    /// follows another's records serves (Kubernetes mode: the leader's, in
    /// each policy's status).
    ///
    /// Never ahead of the record: a rule whose spec weights changed since
    /// its record serves what the record serves (the shares served before,
    /// [`Rollout::served`]); a rule without a record whose table served
    /// other shares than its spec (the weights changed, or the policy came,
    /// before the leader recorded anything) keeps serving those
    /// (`previously_served`). Otherwise a rule without a record serves its
    /// spec shares (no entry): a first start, or nothing changed.
    pub fn served(&self, inputs: &RolloutInputs) -> ServedShares {
        let rules = inputs
            .rules
            .iter()
            .filter_map(|g| {
                let rule = match self.live.get(&(g.policy.clone(), g.rule.clone())) {
                    Some(live) => served_rule(g, &live.rollout),
                    None => {
                        let before = g.previously_served.as_ref()?;
                        if before.same_shares(&g.spec) {
                            return None;
                        }
                        ServedRule {
                            policy: g.policy.clone(),
                            phase: Phase::Waiting,
                            step: None,
                            weights: before.clone(),
                            from: before.clone(),
                            to: g.spec.clone(),
                            consistent_by: g.settings.consistent_by.clone(),
                        }
                    }
                };
                Some((g.rule.clone(), rule))
            })
            .collect();
        ServedShares { rules }
    }

    /// Move every rollout along: start rollouts for rules whose weights
    /// changed, judge steps, drop rollouts of rules no longer governed.
    pub fn evaluate(
        &mut self,
        inputs: &RolloutInputs,
        totals: Totals<'_>,
        now: Timestamp,
    ) -> Evaluation {
        let mut out = Evaluation::default();
        let mut next = BTreeMap::new();
        for g in &inputs.rules {
            let key = (g.policy.clone(), g.rule.clone());
            let previous = self.live.remove(&key);
            let recorded = previous.as_ref().map(|l| l.rollout.clone());
            let mut live = match previous {
                Some(mut live) if live.rollout.to.same_shares(&g.spec) => {
                    // Same shares (perhaps other weights, or a backend at
                    // weight 0 added): the rollout goes on towards them.
                    live.rollout.to = g.spec.clone();
                    live.rollout.rule_name = g.rule_name.clone();
                    live
                }
                Some(live) => {
                    // A weight change, mid-rollout or not: a new rollout
                    // from what is served now.
                    start(g, live.rollout.served().bounded(), &mut out.transitions)
                }
                None => match &g.previously_served {
                    Some(before) if !before.same_shares(&g.spec) => {
                        start(g, before.bounded(), &mut out.transitions)
                    }
                    // A rule seen for the first time (or newly governed,
                    // unchanged): nothing to ramp from.
                    _ => idle(g),
                },
            };
            advance(&mut live, g, totals, now, &mut out.transitions);
            let look = Look::of(
                &live.rollout,
                live.step_index,
                &live.judge,
                &live.step,
                &g.settings,
                now,
            );
            live.history.record(&look, now);
            out.next = earliest(out.next, deadline(&live, g, now));
            out.changed |= recorded.as_ref() != Some(&live.rollout);
            out.served
                .rules
                .insert(g.rule.clone(), served_rule(g, &live.rollout));
            next.insert(key, live);
        }
        // Rules no longer governed (policy or route gone, target changed,
        // conflict lost): their spec shares apply at once.
        out.changed |= !self.live.is_empty();
        self.live = next;
        out
    }
}

/// The earlier of two deadlines.
fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How often a step whose interval is over is looked at again while it
/// waits for `minRequests` (requests that succeed wake nothing).
pub const WAITING_FOR_REQUESTS: Duration = Duration::from_secs(1);

/// When the clock next matters to `live`: its step's interval ends, or,
/// past it and short of `minRequests`, a second from now.
fn deadline(live: &Live, g: &GovernedRule, now: Timestamp) -> Option<Timestamp> {
    let r = &live.rollout;
    if r.phase != Phase::Progressing || r.held_for.is_some() || g.settings.paused {
        return None;
    }
    let start = r.step_started_at?;
    let end = start
        .checked_add(g.settings.interval)
        .unwrap_or(Timestamp::MAX);
    if end > now {
        return Some(end);
    }
    now.checked_add(WAITING_FOR_REQUESTS).ok()
}

/// How `rollout` serves its governed rule.
fn served_rule(g: &GovernedRule, rollout: &Rollout) -> ServedRule {
    ServedRule {
        policy: g.policy.clone(),
        phase: rollout.phase,
        step: rollout.step,
        weights: rollout.served(),
        from: rollout.from.clone(),
        to: rollout.to.clone(),
        consistent_by: g.settings.consistent_by.clone(),
    }
}

/// A rule that serves its spec shares, with no rollout in flight.
fn idle(g: &GovernedRule) -> Live {
    Live {
        rollout: Rollout {
            policy: g.policy.clone(),
            rule: g.rule.clone(),
            rule_name: g.rule_name.clone(),
            phase: Phase::Complete,
            step: None,
            step_started_at: None,
            from: g.spec.clone(),
            to: g.spec.clone(),
            held_for: None,
            message: "serving the spec shares; a change of the route's weights starts a rollout"
                .into(),
        },
        ..Live::default()
    }
}

/// A new rollout from `from` to the rule's spec.
fn start(g: &GovernedRule, from: Weights, transitions: &mut Vec<Transition>) -> Live {
    let to = g.spec.clone();
    let (phase, message) = if from.total() == 0 {
        (
            Phase::Complete,
            "every weight was 0 before the change (the rule answered 500): the spec shares apply at once"
                .to_string(),
        )
    } else if to.total() == 0 {
        (
            Phase::Complete,
            "every weight is 0 now: the rule answers 500 at once, as the spec says".to_string(),
        )
    } else {
        (
            Phase::Waiting,
            format!(
                "the weights changed: rolling out from {} to {}",
                ratio(&from, &to, &from),
                ratio(&from, &to, &to)
            ),
        )
    };
    transitions.push(Transition {
        policy: g.policy.clone(),
        rule: g.rule.clone(),
        phase,
        message: message.clone(),
    });
    Live {
        rollout: Rollout {
            policy: g.policy.clone(),
            rule: g.rule.clone(),
            rule_name: g.rule_name.clone(),
            phase,
            step: None,
            step_started_at: None,
            from,
            to,
            held_for: None,
            message,
        },
        ..Live::default()
    }
}

/// `99.5/0.5 (stable/canary)`: `shares` over the backends of both.
fn ratio(from: &Weights, to: &Weights, shares: &Weights) -> String {
    let keys = to.union_keys(from);
    let names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
    format!("{} ({})", shares.ratio_text(&keys), names.join("/"))
}

fn set_phase(live: &mut Live, phase: Phase, message: String, transitions: &mut Vec<Transition>) {
    let r = &mut live.rollout;
    let entered = r.phase != phase;
    r.phase = phase;
    if r.message != message || entered {
        r.message = message.clone();
    }
    if entered {
        transitions.push(Transition {
            policy: r.policy.clone(),
            rule: r.rule.clone(),
            phase,
            message,
        });
    }
}

fn advance(
    live: &mut Live,
    g: &GovernedRule,
    totals: Totals<'_>,
    now: Timestamp,
    transitions: &mut Vec<Transition>,
) {
    let s = &g.settings;
    live.step_index = live
        .rollout
        .step
        .and_then(|p| s.steps.iter().position(|q| *q == p));
    match live.rollout.phase {
        Phase::Complete | Phase::RolledBack => {}
        Phase::Waiting | Phase::Paused | Phase::Progressing if live.rollout.step.is_none() => {
            before_first_step(live, g, totals, now, transitions)
        }
        Phase::Paused if live.rollout.held_for.is_some() => {
            if live.rollout.held_for != Some(g.fingerprint) {
                // The policy changed after a failed gate: its evidence
                // starts anew, as a new rollout's would.
                live.judge = Judge::default();
                live.last = None;
                let step = live.rollout.step.unwrap_or(Percent::HUNDRED);
                enter_step(
                    live,
                    g,
                    step,
                    totals,
                    now,
                    transitions,
                    "the policy changed: resumed",
                );
            }
        }
        Phase::Waiting | Phase::Paused | Phase::Progressing => {
            at_step(live, g, totals, now, transitions)
        }
    }
}

fn before_first_step(
    live: &mut Live,
    g: &GovernedRule,
    totals: Totals<'_>,
    now: Timestamp,
    transitions: &mut Vec<Transition>,
) {
    let r = &live.rollout;
    let serving = format!(
        "serving {}, the shares from before the change",
        ratio(&r.from, &r.to, &r.from)
    );
    let blocked = Weights::incoming(&r.from, &r.to).into_iter().find_map(|k| {
        let readiness = g
            .readiness
            .iter()
            .find(|(b, _)| b == k)
            .map_or(&Readiness::Ready, |(_, r)| r);
        match readiness {
            Readiness::Ready => None,
            Readiness::NoReadyEndpoints => Some(format!("{k} has no ready endpoint")),
            Readiness::Unresolved { reason } => Some(format!("{k} does not resolve ({reason})")),
        }
    });
    if let Some(why) = blocked {
        let message = format!("waiting before the first step: {why}; {serving}");
        set_phase(live, Phase::Waiting, message, transitions);
    } else if g.settings.paused {
        let message = format!("paused before the first step (spec.paused is true); {serving}");
        set_phase(live, Phase::Paused, message, transitions);
    } else {
        let first = g
            .settings
            .steps
            .first()
            .copied()
            .unwrap_or(Percent::HUNDRED);
        enter_step(live, g, first, totals, now, transitions, "started");
    }
}

fn enter_step(
    live: &mut Live,
    g: &GovernedRule,
    step: Percent,
    totals: Totals<'_>,
    now: Timestamp,
    transitions: &mut Vec<Transition>,
    how: &str,
) {
    let s = &g.settings;
    let r = &mut live.rollout;
    r.step = Some(step);
    r.step_started_at = Some(now);
    r.held_for = None;
    live.step_index = s.steps.iter().position(|q| *q == step);
    let current = readings(&r.from, &r.to, &r.rule, totals);
    if let Some(last) = live.last {
        // What happened since the last look belongs to the step before.
        live.judge.observe(
            &s.gates,
            &current.incoming.since(&last.incoming),
            &current.outgoing.since(&last.outgoing),
        );
    }
    live.last = Some(current);
    live.step_start = Some(current);
    live.step = StepView {
        concurrent: concurrent(r),
        keyed: s.consistent_by.is_some(),
        ..StepView::default()
    };
    let of = match live.step_index {
        Some(i) => format!(" ({} of {})", i + 1, s.steps.len()),
        None => String::new(),
    };
    let mut gates = format!(
        "{} and {} request(s) to {}",
        duration_text(s.interval),
        s.min_requests,
        names(&r.from, &r.to)
    );
    for gate in &s.gates {
        gates.push_str(&format!(", {}", gate.describe()));
    }
    if !s.gates.is_empty() {
        gates.push_str(&format!(" (each judged at {} confidence)", s.confidence.0));
    }
    let message = format!(
        "{how}: step {step}{of} serves {}; it passes after {gates}",
        ratio(&r.from, &r.to, &r.served())
    );
    // A new step is a transition even within Progressing.
    r.phase = Phase::Progressing;
    r.message = message.clone();
    transitions.push(Transition {
        policy: r.policy.clone(),
        rule: r.rule.clone(),
        phase: Phase::Progressing,
        message,
    });
}

fn at_step(
    live: &mut Live,
    g: &GovernedRule,
    totals: Totals<'_>,
    now: Timestamp,
    transitions: &mut Vec<Transition>,
) {
    let s = &g.settings;
    let (from, to, rule) = (&live.rollout.from, &live.rollout.to, &live.rollout.rule);
    let current = readings(from, to, rule, totals);
    let last = *live.last.get_or_insert(current);
    let step_start = *live.step_start.get_or_insert(current);
    live.judge.observe(
        &s.gates,
        &current.incoming.since(&last.incoming),
        &current.outgoing.since(&last.outgoing),
    );
    live.last = Some(current);
    live.step = StepView {
        canary: current.incoming.since(&step_start.incoming),
        stable: current.outgoing.since(&step_start.outgoing),
        concurrent: concurrent(&live.rollout),
        keyed: s.consistent_by.is_some(),
    };
    let who = names(from, to);
    let step = live.rollout.step.unwrap_or(Percent::HUNDRED);
    let verdict = live.judge.verdict(&s.gates, s.confidence, &live.step, &who);
    live.reports = live.judge.reports(&s.gates, s.confidence, &live.step);

    if let Verdict::Breached(breach) = &verdict {
        match s.on_failure {
            OnFailure::Rollback => {
                let message = format!("{breach}: rolled back to {}", ratio(from, to, from));
                live.step_start = None;
                set_phase(live, Phase::RolledBack, message, transitions);
            }
            OnFailure::Pause => {
                let message = format!("{breach}: paused at {step} until the policy's spec changes");
                live.rollout.held_for = Some(g.fingerprint);
                set_phase(live, Phase::Paused, message, transitions);
            }
        }
        return;
    }
    if s.paused {
        let message = format!(
            "paused at step {step} (spec.paused is true): serving {}; the gates still judge",
            ratio(from, to, &live.rollout.served())
        );
        set_phase(live, Phase::Paused, message, transitions);
        return;
    }
    let elapsed = live
        .rollout
        .step_started_at
        .map_or(Duration::ZERO, |start| {
            let nanos = now.as_nanosecond() - start.as_nanosecond();
            Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX))
        });
    let counted = live.step.canary;
    if elapsed >= s.interval && judged_requests(&counted) >= s.min_requests {
        let mut passed = counts_text(&counted, live.step.keyed);
        if let Verdict::Excused(why) = &verdict {
            passed.push_str(&format!("; {why}"));
        }
        for report in &live.reports {
            passed.push_str(&format!("; {}: {}", report.gate, report.detects));
        }
        match s.steps.iter().find(|p| **p > step) {
            Some(next) => {
                let how = format!("step {step} passed ({passed})");
                enter_step(live, g, *next, totals, now, transitions, &how);
            }
            None => {
                let message = format!(
                    "complete: the last step ({step}) passed ({passed}); serving the spec shares {}",
                    ratio(from, to, to)
                );
                live.step_start = None;
                set_phase(live, Phase::Complete, message, transitions);
            }
        }
    } else if live.rollout.phase == Phase::Paused {
        // Unpaused: back to the step, its clock and counts kept.
        let message = format!("spec.paused is false again: at step {step}");
        set_phase(live, Phase::Progressing, message, transitions);
    } else if let Verdict::Excused(why) = verdict {
        // Said while it lasts; the step goes on.
        let message = format!("at step {step}: {why}");
        let r = &mut live.rollout;
        if r.message != message {
            r.message = message;
        }
    }
}

/// Whether the rollout serves its outgoing backends now (the last step of
/// a full promotion does not: nothing concurrent to compare with).
fn concurrent(r: &Rollout) -> bool {
    let served = r.served();
    Weights::outgoing(&r.from, &r.to)
        .into_iter()
        .any(|k| served.get(k) > 0)
}

/// Current counters of the backends a rollout judges (incoming) and
/// compares them with (outgoing), each side summed: the counters are
/// cumulative, so the sum of readings is a reading of the sum.
fn readings(from: &Weights, to: &Weights, rule: &RuleKey, totals: Totals<'_>) -> Sides {
    let sum = |keys: Vec<&BackendKey>| keys.into_iter().map(|k| totals(rule, k)).sum();
    Sides {
        incoming: sum(Weights::incoming(from, to)),
        outgoing: sum(Weights::outgoing(from, to)),
    }
}

/// `212 requests, 5xx 0%, p99 9ms`; with users counted (`keyed`), `212
/// requests from 40 users, 5xx 1.4% (3 errors from 2 users), p99 9ms`.
fn counts_text(c: &BackendTotals, keyed: bool) -> String {
    let (users, errors) = if keyed {
        let (users, errors) = super::users::requests_text(c);
        (users, format!(" ({errors})"))
    } else {
        (String::new(), String::new())
    };
    let mut text = format!(
        "{} requests{users}, 5xx {}{errors}",
        c.requests,
        share_text(u128::from(c.errors), u128::from(c.requests))
    );
    if let Some(p99) = c.latency_quantile(0.99) {
        text.push_str(&format!(", p99 {}", duration_text(p99)));
    }
    text
}

/// The incoming backends' names: `canary`, `v2, v3`.
fn names(from: &Weights, to: &Weights) -> String {
    let incoming: Vec<&str> = Weights::incoming(from, to)
        .into_iter()
        .map(|k| k.name.as_str())
        .collect();
    if incoming.is_empty() {
        "the incoming backends".into()
    } else {
        incoming.join(", ")
    }
}

/// `300ms`, `5m`, `1m30s`, `2.5s`: short, for messages.
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}µs", d.as_micros());
    }
    if !ms.is_multiple_of(1000) || ms < 1000 {
        if ms >= 1000 {
            let fraction = format!("{:03}", ms % 1000);
            return format!("{}.{}s", ms / 1000, fraction.trim_end_matches('0'));
        }
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::metrics::LATENCY_BOUNDS_MICROS;

    fn key(name: &str) -> BackendKey {
        BackendKey::service("shop", name, Some(80))
    }

    fn weights(pairs: &[(&str, u64)]) -> Weights {
        let mut w = Weights::new();
        for (name, weight) in pairs {
            w.add(key(name), *weight);
        }
        w
    }

    fn settings() -> RolloutSettings {
        RolloutSettings {
            steps: ["0.5%", "5%", "25%", "100%"]
                .iter()
                .map(|s| Percent::parse(s).expect("step"))
                .collect(),
            interval: Duration::from_secs(60),
            min_requests: 10,
            gates: vec![
                crate::rollout::Gate {
                    signal: crate::rollout::Signal::Errors,
                    bound: crate::rollout::Bound::Limit(Percent::from_thousandths(1_000)),
                },
                crate::rollout::Gate {
                    signal: crate::rollout::Signal::SlowerThan(Duration::from_millis(500)),
                    bound: crate::rollout::Bound::Limit(Percent::from_thousandths(1_000)),
                },
            ],
            confidence: crate::rollout::Confidence::DEFAULT,
            on_failure: OnFailure::Rollback,
            paused: false,
            consistent_by: None,
        }
    }

    /// One rule of route shop/r governed by policy shop/p, with the test's
    /// clock and counters.
    struct Rig {
        rollouts: Rollouts,
        rule: GovernedRule,
        now: Timestamp,
        /// Cumulative (requests, 5xx, latency bucket) per backend name.
        counters: RefCell<BTreeMap<String, BackendTotals>>,
    }

    impl Rig {
        fn new(spec: &[(&str, u64)]) -> Rig {
            Rig {
                rollouts: Rollouts::new(),
                rule: GovernedRule {
                    policy: PolicyKey {
                        namespace: "shop".into(),
                        name: "p".into(),
                    },
                    settings: settings(),
                    fingerprint: 1,
                    rule: RuleKey {
                        kind: RouteKind::Http,
                        namespace: "shop".into(),
                        route: "r".into(),
                        rule: 0,
                    },
                    rule_name: None,
                    spec: weights(spec),
                    readiness: Vec::new(),
                    previously_served: None,
                },
                now: "2024-05-01T10:00:00Z".parse().expect("time"),
                counters: RefCell::new(BTreeMap::new()),
            }
        }

        fn eval(&mut self) -> Evaluation {
            let counters = self.counters.borrow().clone();
            let totals = move |_: &RuleKey, k: &BackendKey| {
                counters.get(&k.name).copied().unwrap_or_default()
            };
            let inputs = RolloutInputs {
                rules: vec![self.rule.clone()],
            };
            self.rollouts.evaluate(&inputs, &totals, self.now)
        }

        fn later(&mut self, secs: i64) -> Evaluation {
            self.now += k8s_openapi::jiff::SignedDuration::from_secs(secs);
            self.eval()
        }

        /// `n` responses of `backend`, `errors` of them 5xx, each taking
        /// `latency`.
        fn traffic(&self, backend: &str, n: u64, errors: u64, latency: Duration) {
            let mut c = self.counters.borrow_mut();
            let t = c.entry(backend.into()).or_default();
            t.requests += n;
            t.errors += errors;
            let micros = latency.as_micros() as u64;
            t.latency[LATENCY_BOUNDS_MICROS.partition_point(|b| *b < micros)] += n;
            // The metrics count a governed backend's responses slower than
            // maxLatency (500ms here).
            if latency > Duration::from_millis(500) {
                t.slow += n;
            }
        }

        fn ok(&self, backend: &str, n: u64) {
            self.traffic(backend, n, 0, Duration::from_millis(3));
        }

        fn rollout(&self) -> Rollout {
            self.rollouts.records().pop().expect("one rollout")
        }

        fn served(&self) -> (u64, u64) {
            let w = self.rollout().served();
            (w.get(&key("stable")), w.get(&key("canary")))
        }

        fn change(&mut self, spec: &[(&str, u64)]) -> Evaluation {
            self.rule.spec = weights(spec);
            self.eval()
        }

        /// Serve 1000/0, then change the weights to 0/1000.
        fn promote(&mut self) -> Evaluation {
            self.eval();
            self.change(&[("stable", 0), ("canary", 1000)])
        }

        /// A rig promoting 1000/0 to 0/1000 with the default settings.
        fn promoting() -> Rig {
            let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
            rig.promote();
            rig
        }
    }

    fn phase_and_step(r: &Rollout) -> (Phase, Option<String>) {
        (r.phase, r.step.map(|p| p.to_string()))
    }

    #[test]
    fn a_rule_seen_first_serves_its_spec_and_records_nothing_to_ramp() {
        let mut rig = Rig::new(&[("stable", 0), ("canary", 1000)]);
        let e = rig.eval();
        assert!(e.changed, "a new record is saved");
        assert_eq!(rig.rollout().phase, Phase::Complete);
        assert_eq!(rig.served(), (0, 1000));
        assert_eq!(
            e.served.rules[&rig.rule.rule].weights,
            weights(&[("stable", 0), ("canary", 1000)])
        );
        assert!(!rig.eval().changed, "nothing changed since");
        assert!(!rig.rollouts.in_flight());
    }

    #[test]
    fn the_ladder_is_served_step_by_step_and_completes() {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        let e = rig.promote();
        assert!(e.changed);
        let phases: Vec<Phase> = e.transitions.iter().map(|t| t.phase).collect();
        assert_eq!(phases, [Phase::Waiting, Phase::Progressing]);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("0.5%".into()))
        );
        assert_eq!(rig.served(), (199, 1));
        for (stable, canary) in [(19, 1), (3, 1), (0, 1)] {
            rig.ok("canary", 10);
            let e = rig.later(60);
            assert!(e.changed);
            assert_eq!(rig.served(), (stable, canary));
        }
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("100%".into()))
        );
        rig.ok("canary", 10);
        rig.later(60);
        let r = rig.rollout();
        assert_eq!(r.phase, Phase::Complete);
        assert_eq!(rig.served(), (0, 1000), "the spec shares");
        assert!(
            r.message
                .starts_with("complete: the last step (100%) passed"),
            "{}",
            r.message
        );
        assert!(!rig.rollouts.in_flight());
    }

    #[test]
    fn a_step_needs_both_its_interval_and_its_requests() {
        let mut rig = Rig::promoting();
        rig.ok("canary", 10);
        rig.ok("stable", 5000);
        rig.later(59);
        assert_eq!(
            rig.rollout().step,
            Percent::parse("0.5%").ok(),
            "interval not over"
        );
        let mut rig = Rig::promoting();
        rig.ok("canary", 9);
        rig.ok("stable", 100_000);
        rig.later(3600);
        assert_eq!(
            rig.rollout().step,
            Percent::parse("0.5%").ok(),
            "9 of 10 requests: the stable backend's do not count"
        );
        rig.ok("canary", 1);
        rig.later(1);
        assert_eq!(rig.rollout().step, Percent::parse("5%").ok());
    }

    #[test]
    fn an_unready_incoming_backend_makes_the_rollout_wait() {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        rig.eval();
        rig.rule.readiness = vec![(
            key("canary"),
            Readiness::Unresolved {
                reason: "BackendNotFound".into(),
            },
        )];
        rig.change(&[("stable", 995), ("canary", 5)]);
        let r = rig.rollout();
        assert_eq!(r.phase, Phase::Waiting);
        assert_eq!(rig.served(), (1, 0), "from is served (1000/0, reduced)");
        assert!(
            r.message
                .contains("shop/canary:80 does not resolve (BackendNotFound)"),
            "{}",
            r.message
        );
        rig.rule.readiness = vec![(key("canary"), Readiness::NoReadyEndpoints)];
        rig.later(600);
        assert!(rig.rollout().message.contains("has no ready endpoint"));
        rig.rule.readiness.clear();
        rig.later(1);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("0.5%".into()))
        );
        // After the first step, readiness is the gates' business.
        rig.rule.readiness = vec![(key("canary"), Readiness::NoReadyEndpoints)];
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::Progressing);
    }

    #[test]
    fn a_breached_gate_rolls_back_at_once_and_stays_until_the_weights_change() {
        let mut rig = Rig::promoting();
        rig.ok("canary", 10);
        rig.later(60);
        // 5% step: 12 of 40 fail, the stable 1 of 760. Breached long
        // before the interval is over.
        rig.traffic("canary", 40, 12, Duration::from_millis(3));
        rig.traffic("stable", 760, 1, Duration::from_millis(3));
        let e = rig.later(1);
        let r = rig.rollout();
        assert_eq!(r.phase, Phase::RolledBack);
        assert!(
            r.message.starts_with(
                "canary 5xx 12 of 50 (24%) is above maxErrorRate 1% at 99% confidence (its rate is above "
            ),
            "{}",
            r.message
        );
        assert!(
            r.message.ends_with(
                "; the stable: 1 of 760 (0.13%) over the same time: rolled back to 100/0 (stable/canary)"
            ),
            "{}",
            r.message
        );
        assert_eq!(
            e.transitions.last().map(|t| t.phase),
            Some(Phase::RolledBack)
        );
        assert_eq!(rig.served(), (1, 0));
        rig.ok("canary", 1000);
        rig.later(3600);
        assert_eq!(
            rig.rollout().phase,
            Phase::RolledBack,
            "no step after a rollback"
        );
        assert!(!rig.rollouts.in_flight());
        // The weights change again: a new rollout from what is served.
        rig.change(&[("stable", 500), ("canary", 500)]);
        let r = rig.rollout();
        assert_eq!(
            phase_and_step(&r),
            (Phase::Progressing, Some("0.5%".into()))
        );
        assert_eq!(r.from, weights(&[("stable", 1)]));
    }

    #[test]
    fn min_requests_never_holds_back_a_rollback() {
        // minRequests is 10: a canary failing its first 3 is rolled back
        // after them; one error alone proves nothing.
        let mut rig = Rig::promoting();
        rig.traffic("canary", 1, 1, Duration::from_millis(3));
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::Progressing);
        rig.traffic("canary", 2, 2, Duration::from_millis(3));
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::RolledBack);
    }

    #[test]
    fn a_healthy_canary_near_its_limit_is_not_rolled_back_by_looking_often() {
        // 0.9% errors against 1%, looked at after every 10 responses.
        let mut rig = Rig::promoting();
        for i in 0..2_000u64 {
            rig.traffic(
                "canary",
                10,
                u64::from(i % 11 == 0),
                Duration::from_millis(3),
            );
            rig.traffic(
                "stable",
                190,
                u64::from(i % 2 == 0),
                Duration::from_millis(3),
            );
            rig.eval();
        }
        assert_ne!(
            rig.rollout().phase,
            Phase::RolledBack,
            "{}",
            rig.rollout().message
        );
    }

    #[test]
    fn the_next_deadline_is_the_end_of_the_step() {
        let mut rig = Rig::promoting();
        let e = rig.later(10);
        let started = rig.rollout().step_started_at.expect("at a step");
        assert_eq!(e.next, started.checked_add(Duration::from_secs(60)).ok());
        // Past the interval, short of minRequests: a second from now.
        let e = rig.later(60);
        assert_eq!(e.next, rig.now.checked_add(Duration::from_secs(1)).ok());
    }

    #[test]
    fn a_slow_canary_fails_the_latency_gate() {
        let mut rig = Rig::promoting();
        // Two slow responses in 100 prove nothing about a p99 ...
        rig.traffic("canary", 98, 0, Duration::from_millis(3));
        rig.traffic("canary", 2, 0, Duration::from_secs(2));
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::Progressing);
        // ... ten more in the next 20 do.
        rig.traffic("canary", 10, 0, Duration::from_millis(3));
        rig.traffic("canary", 10, 0, Duration::from_secs(2));
        rig.later(1);
        let r = rig.rollout();
        assert_eq!(r.phase, Phase::RolledBack);
        assert!(
            r.message.starts_with(
                "canary slower than 500ms 12 of 120 (10%) is above 1% (maxLatency 500ms is a p99) at 99% confidence"
            ),
            "{}",
            r.message
        );
    }

    #[test]
    fn pause_on_failure_holds_the_step_until_the_policy_changes() {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        rig.rule.settings.on_failure = OnFailure::Pause;
        rig.promote();
        rig.ok("canary", 10);
        rig.later(60);
        rig.traffic("canary", 10, 10, Duration::from_millis(3));
        rig.later(1);
        let r = rig.rollout();
        assert_eq!(phase_and_step(&r), (Phase::Paused, Some("5%".into())));
        assert!(
            r.message
                .ends_with("paused at 5% until the policy's spec changes"),
            "{}",
            r.message
        );
        assert_eq!(rig.served(), (19, 1), "the step is held");
        rig.ok("canary", 1000);
        rig.later(3600);
        assert_eq!(
            rig.rollout().phase,
            Phase::Paused,
            "good traffic does not resume it"
        );
        rig.rule.fingerprint = 2;
        rig.later(1);
        let r = rig.rollout();
        assert_eq!(phase_and_step(&r), (Phase::Progressing, Some("5%".into())));
        assert!(
            r.message.starts_with("the policy changed: resumed"),
            "{}",
            r.message
        );
        rig.ok("canary", 10);
        rig.later(60);
        assert_eq!(rig.rollout().step, Percent::parse("25%").ok());
    }

    #[test]
    fn paused_holds_the_step_but_still_rolls_back() {
        let mut rig = Rig::promoting();
        rig.rule.settings.paused = true;
        rig.ok("canary", 100);
        rig.later(3600);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Paused, Some("0.5%".into()))
        );
        assert!(rig.rollouts.in_flight(), "gates still judge");
        // Unpaused after the interval with the requests counted: passes.
        rig.rule.settings.paused = false;
        rig.later(1);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("5%".into()))
        );
        rig.rule.settings.paused = true;
        rig.traffic("canary", 10, 10, Duration::from_millis(3));
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::RolledBack);
    }

    #[test]
    fn paused_at_the_last_step_does_not_complete() {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        rig.rule.settings.steps = vec![Percent::HUNDRED];
        rig.promote();
        rig.rule.settings.paused = true;
        rig.ok("canary", 100);
        rig.later(3600);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Paused, Some("100%".into()))
        );
        assert_eq!(rig.served(), (0, 1));
        rig.rule.settings.paused = false;
        rig.later(1);
        assert_eq!(rig.rollout().phase, Phase::Complete);
    }

    #[test]
    fn paused_before_the_first_step_serves_from() {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        rig.rule.settings.paused = true;
        rig.promote();
        assert_eq!(phase_and_step(&rig.rollout()), (Phase::Paused, None));
        assert_eq!(rig.served(), (1, 0));
        rig.rule.settings.paused = false;
        rig.later(1);
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("0.5%".into()))
        );
    }

    #[test]
    fn a_weight_change_mid_rollout_starts_from_the_served_shares() {
        let mut rig = Rig::promoting();
        rig.ok("canary", 10);
        rig.later(60);
        assert_eq!(rig.served(), (19, 1));
        rig.change(&[("stable", 1), ("canary", 1)]);
        let r = rig.rollout();
        assert_eq!(r.from, weights(&[("stable", 19), ("canary", 1)]));
        assert_eq!(
            phase_and_step(&r),
            (Phase::Progressing, Some("0.5%".into()))
        );
        // 95% -> 50% at 0.5%: 94.775% stable.
        assert_eq!(r.served().share_text(&key("stable")), "94.775%");
        // Same shares with other weights: the rollout goes on.
        rig.change(&[("stable", 7), ("canary", 7)]);
        assert_eq!(
            rig.rollout().from,
            weights(&[("stable", 19), ("canary", 1)])
        );
    }

    #[test]
    fn a_newly_governed_rule_ramps_from_what_was_served() {
        let mut rig = Rig::new(&[("stable", 0), ("canary", 1)]);
        rig.rule.previously_served = Some(weights(&[("stable", 1), ("canary", 0)]));
        rig.eval();
        assert_eq!(
            phase_and_step(&rig.rollout()),
            (Phase::Progressing, Some("0.5%".into()))
        );
        // Unchanged spec: a policy created with nothing in flight changes
        // nothing.
        let mut rig = Rig::new(&[("stable", 1), ("canary", 0)]);
        rig.rule.previously_served = Some(weights(&[("stable", 5), ("canary", 0)]));
        rig.eval();
        assert_eq!(rig.rollout().phase, Phase::Complete);
    }

    #[test]
    fn a_rule_no_longer_governed_is_dropped() {
        let mut rig = Rig::promoting();
        let e = rig.rollouts.evaluate(
            &RolloutInputs::default(),
            &|_, _| BackendTotals::default(),
            rig.now,
        );
        assert!(e.changed);
        assert!(e.served.rules.is_empty());
        assert!(rig.rollouts.records().is_empty());
    }

    #[test]
    fn all_zero_weights_on_either_side_apply_at_once() {
        let mut rig = Rig::new(&[("stable", 0), ("canary", 0)]);
        rig.eval();
        rig.change(&[("stable", 0), ("canary", 1)]);
        assert_eq!(rig.rollout().phase, Phase::Complete);
        assert_eq!(rig.served(), (0, 1));
        rig.change(&[("stable", 0), ("canary", 0)]);
        assert_eq!(rig.rollout().phase, Phase::Complete);
        assert_eq!(rig.served(), (0, 0));
    }

    #[test]
    fn a_restored_rollout_resumes_its_step_and_counts_again() {
        let mut rig = Rig::promoting();
        rig.ok("canary", 10);
        rig.later(60);
        let recorded = rig.rollouts.records();
        // A new process: counters from 0, the clock moved on.
        let mut resumed = Rig::new(&[("stable", 0), ("canary", 1000)]);
        resumed.rollouts = Rollouts::restore(recorded.clone());
        resumed.now = rig.now;
        let e = resumed.later(30);
        assert!(!e.changed, "nothing new to record");
        assert_eq!(resumed.served(), (19, 1), "the recorded step, not the spec");
        resumed.ok("canary", 9);
        resumed.later(31);
        assert_eq!(
            resumed.rollout().step,
            Percent::parse("5%").ok(),
            "counts start again"
        );
        resumed.ok("canary", 1);
        resumed.later(1);
        assert_eq!(
            resumed.rollout().step,
            Percent::parse("25%").ok(),
            "the interval ran from the recorded start"
        );
    }

    #[test]
    fn a_follower_serves_the_recorded_step_even_past_a_new_spec() {
        let mut rig = Rig::promoting();
        rig.ok("canary", 10);
        rig.later(60);
        let follower = Rollouts::restore(rig.rollouts.records());
        // The leader has not recorded a rollout for the new weights yet:
        // the follower keeps serving the recorded step.
        rig.rule.spec = weights(&[("stable", 1), ("canary", 1)]);
        let inputs = RolloutInputs {
            rules: vec![rig.rule.clone()],
        };
        let served = follower.served(&inputs);
        let w = &served.rules[&rig.rule.rule].weights;
        assert_eq!((w.get(&key("stable")), w.get(&key("canary"))), (19, 1));
        assert!(
            Rollouts::new().served(&inputs).rules.is_empty(),
            "no record and no table before (a first start): the spec"
        );
    }

    #[test]
    fn a_follower_without_a_record_keeps_what_its_table_served() {
        let mut rule = Rig::new(&[("stable", 0), ("canary", 1000)]).rule;
        rule.previously_served = Some(weights(&[("stable", 1000), ("canary", 0)]));
        let inputs = RolloutInputs {
            rules: vec![rule.clone()],
        };
        let served = Rollouts::new().served(&inputs);
        let r = &served.rules[&rule.rule];
        assert_eq!(
            (r.weights.get(&key("stable")), r.weights.get(&key("canary"))),
            (1000, 0),
            "the weights changed before the leader recorded a rollout"
        );
        assert_eq!(r.phase, Phase::Waiting);
        // Nothing changed: the spec, no entry.
        rule.previously_served = Some(weights(&[("stable", 0), ("canary", 1)]));
        let inputs = RolloutInputs { rules: vec![rule] };
        assert!(Rollouts::new().served(&inputs).rules.is_empty());
    }

    /// A rig promoting with `consistentBy` set.
    fn keyed_rig() -> Rig {
        let mut rig = Rig::new(&[("stable", 1000), ("canary", 0)]);
        rig.rule.settings.consistent_by = Some(ConsistentKey::Header(
            http::HeaderName::from_static("x-user"),
        ));
        rig.promote();
        rig
    }

    /// Add keyed traffic to `backend`: `requests` of `users` new users,
    /// `errors` 5xx of which `repeated` were a user's repeated errors,
    /// from `failing` users.
    fn keyed_traffic(
        rig: &Rig,
        backend: &str,
        (requests, errors, repeated): (u64, u64, u64),
        (users, failing): (u64, u64),
    ) {
        rig.traffic(backend, requests, errors, Duration::from_millis(3));
        let mut c = rig.counters.borrow_mut();
        let t = c.entry(backend.into()).or_default();
        t.repeated_errors += repeated;
        t.users += users;
        t.users_with_errors += failing;
    }

    #[test]
    fn with_consistent_users_a_users_retries_neither_fill_a_step_nor_fail_it() {
        let mut rig = keyed_rig();
        assert_eq!(phase_and_step(&rig.rollout()).1.as_deref(), Some("0.5%"));
        keyed_traffic(&rig, "stable", (2_000, 0, 0), (300, 0));
        // One user fails and retries 50 times.
        keyed_traffic(&rig, "canary", (51, 51, 50), (1, 1));
        rig.later(120);
        let r = rig.rollout();
        assert_eq!(
            phase_and_step(&r),
            (Phase::Progressing, Some("0.5%".into())),
            "one user's storm neither fails the step nor fills minRequests (10): {}",
            r.message
        );
        let (_, _, counts) = rig.rollouts.report().pop().expect("one");
        let users = counts.users.expect("users counted");
        assert_eq!(
            (users.canary, users.canary_with_errors, users.stable),
            (1, 1, 300)
        );
        assert_eq!(users.canary_repeated_errors, 50);
        // Ten other users answered well: the step passes, and says whose.
        keyed_traffic(&rig, "canary", (10, 0, 0), (10, 0));
        rig.later(1);
        let r = rig.rollout();
        assert_eq!(phase_and_step(&r).1.as_deref(), Some("5%"), "{}", r.message);
        assert!(
            r.message.starts_with(
                "step 0.5% passed (61 requests from 11 users, 5xx 83.607% (51 errors from 1 user)"
            ),
            "{}",
            r.message
        );
        // At 5%, users fail: a few of them roll it back.
        let mut failing = 0;
        while rig.rollout().phase != Phase::RolledBack && failing < 10 {
            failing += 1;
            keyed_traffic(&rig, "canary", (1, 1, 0), (1, 1));
            keyed_traffic(&rig, "stable", (19, 0, 0), (19, 0));
            rig.later(1);
        }
        let r = rig.rollout();
        assert_eq!(r.phase, Phase::RolledBack, "{}", r.message);
        assert!(failing <= 3, "{failing} users failing: {}", r.message);
        assert!(
            r.message.contains(&format!(
                "in this step {failing} errors from {failing} users (of {failing} users)"
            )),
            "{}",
            r.message
        );
    }

    #[test]
    fn durations_print_short() {
        for (d, text) in [
            (Duration::from_millis(300), "300ms"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_millis(2500), "2.5s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_micros(250), "250µs"),
        ] {
            assert_eq!(duration_text(d), text);
        }
    }
}
