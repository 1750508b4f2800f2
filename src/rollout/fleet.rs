//! The whole fleet's counts (Kubernetes mode): every replica proxies its
//! own share of a rollout's traffic, and the leader judges the sum.
//!
//! Each replica counts, for every step it serves, its own responses per
//! backend since it began serving that step ([`StepCounter`]), and
//! publishes them ([`Publication`], written by `crate::status::counts` to
//! one Lease per replica). The leader keeps the last publication of each
//! other replica ([`Fleet`], fed by `crate::source::kubernetes::counts`)
//! and adds it to its own live counters behind the machine's
//! [`Totals`](super::machine::Totals) ([`fleet_totals`]), so the state
//! machine reads the fleet's cumulative counters as if one process had
//! proxied everything.
//!
//! What keeps the sum honest:
//! - counts are keyed by replica, its incarnation (a restarted replica
//!   starts a new one, counting from zero), rule, step and backend; a step
//!   is named by its percentage and its recorded `stepStartedAt`, unique
//!   per step of a rollout;
//! - only the counts for the step the leader judges are summed: what a
//!   replica still publishes for the step before (traffic it served
//!   before it saw the new record) never counts in the next one;
//! - the leader adds what each publication adds to the previous one of
//!   the same key, into a per-rule sum that only grows while the step is
//!   judged: a replica that goes away keeps what it counted (its requests
//!   happened) and is never waited for; a relist that delivers the same
//!   publication again adds nothing;
//! - the fields are summed and subtracted by [`BackendTotals::plus`] and
//!   [`BackendTotals::since`], and serialized by its derive: a counter
//!   added to `BackendTotals` is published and summed with no change here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::machine::{Phase, PolicyKey, Rollout, RuleKey, Totals};
use super::shares::BackendKey;
use crate::metrics::BackendTotals;

/// What one replica publishes: its counts for every step it serves.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Publication {
    /// Unique per process: a restarted replica's counts start again from
    /// zero under a new incarnation, never compared with the old ones.
    pub incarnation: String,
    #[serde(default)]
    pub steps: Vec<PublishedStep>,
}

/// One replica's counts for one step of one rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedStep {
    /// `namespace/name` of the RolloutPolicy.
    pub policy: String,
    /// The rule, as [`RuleKey`]'s `Display` names it.
    pub rule: String,
    /// [`step_id`].
    pub step: String,
    /// Responses counted since this replica began serving the step, by
    /// backend (as [`BackendKey`]'s `Display` names it), for every backend
    /// of the rollout (incoming and outgoing).
    pub backends: BTreeMap<String, BackendTotals>,
}

/// A step's identity, the same on every replica: its percentage and its
/// recorded start (`"25%@2026-12-02T11:00:00.123456789Z"`). `None` when
/// the rollout is not at a step being judged (also when held after a
/// failed gate: nothing is judged until the policy changes, which starts
/// the step again under a new start).
pub fn step_id(rollout: &Rollout) -> Option<String> {
    if !matches!(rollout.phase, Phase::Progressing | Phase::Paused) || rollout.held_for.is_some() {
        return None;
    }
    Some(format!("{}@{}", rollout.step?, rollout.step_started_at?))
}

fn rule_id(rule: &RuleKey) -> String {
    rule.to_string()
}

/// A step this replica serves, and its counters when it began serving it.
#[derive(Debug, Clone)]
struct Counted {
    policy: PolicyKey,
    rule: RuleKey,
    step: String,
    backends: Vec<BackendKey>,
    base: Vec<BackendTotals>,
}

/// The publishing side: this replica's own counts per step served.
#[derive(Debug, Clone, Default)]
pub struct StepCounter {
    /// By rule id.
    steps: BTreeMap<String, Counted>,
}

impl StepCounter {
    /// Follow the rollouts this replica serves (as recorded): a step seen
    /// for the first time is counted from now on; rules no longer at a
    /// step are forgotten.
    pub fn follow(&mut self, rollouts: &[Rollout], totals: Totals<'_>) {
        let mut next = BTreeMap::new();
        for rollout in rollouts {
            let Some(step) = step_id(rollout) else {
                continue;
            };
            let id = rule_id(&rollout.rule);
            let counted = match self.steps.remove(&id) {
                Some(c) if c.step == step && c.policy == rollout.policy => c,
                _ => {
                    let backends: Vec<BackendKey> = rollout
                        .from
                        .union_keys(&rollout.to)
                        .into_iter()
                        .cloned()
                        .collect();
                    let base = backends.iter().map(|b| totals(&rollout.rule, b)).collect();
                    Counted {
                        policy: rollout.policy.clone(),
                        rule: rollout.rule.clone(),
                        step,
                        backends,
                        base,
                    }
                }
            };
            next.insert(id, counted);
        }
        self.steps = next;
    }

    /// Whether a rollout this replica serves is at a step.
    pub fn in_flight(&self) -> bool {
        !self.steps.is_empty()
    }

    /// The counts to publish now.
    pub fn publication(&self, incarnation: &str, totals: Totals<'_>) -> Publication {
        Publication {
            incarnation: incarnation.to_string(),
            steps: self
                .steps
                .iter()
                .map(|(id, c)| PublishedStep {
                    policy: c.policy.to_string(),
                    rule: id.clone(),
                    step: c.step.clone(),
                    backends: c
                        .backends
                        .iter()
                        .zip(&c.base)
                        .map(|(b, base)| (b.to_string(), totals(&c.rule, b).since(base)))
                        .collect(),
                })
                .collect(),
        }
    }
}

/// `(replica, incarnation, rule, step, backend)`.
type SeenKey = (String, String, String, String, String);

/// The leader's side: the other replicas' counts for the steps it judges.
#[derive(Debug, Default)]
pub struct FleetCounts {
    /// This replica's own publication (its counts are read live instead).
    own: String,
    /// The step judged, by rule id.
    judged: BTreeMap<String, String>,
    /// The last value published under each key of a judged step.
    seen: BTreeMap<SeenKey, BackendTotals>,
    /// What the other replicas counted for the judged steps, by (rule id,
    /// backend): only grows while the rule's step is judged.
    sums: BTreeMap<(String, String), BackendTotals>,
}

impl FleetCounts {
    /// Counts of the replica publishing as `own` are never summed.
    pub fn new(own: &str) -> FleetCounts {
        FleetCounts {
            own: own.to_string(),
            ..FleetCounts::default()
        }
    }

    /// The steps the leader judges now (its rollouts' records): counts of
    /// other steps are not summed from now on, and a rule whose step
    /// changed starts again from zero. Call before each evaluation; the
    /// machine takes a step's baseline when it enters it, so a sum that
    /// starts again at the next call is never subtracted from.
    pub fn judge(&mut self, rollouts: &[Rollout]) {
        let judged: BTreeMap<String, String> = rollouts
            .iter()
            .filter_map(|r| Some((rule_id(&r.rule), step_id(r)?)))
            .collect();
        self.seen
            .retain(|(_, _, rule, step, _), _| judged.get(rule) == Some(step));
        let unchanged = |rule: &String, old: &BTreeMap<String, String>| {
            old.get(rule).is_some() && old.get(rule) == judged.get(rule)
        };
        let old = std::mem::take(&mut self.judged);
        self.sums.retain(|(rule, _), _| unchanged(rule, &old));
        self.judged = judged;
    }

    /// Take in a replica's publication (`replica`: the name it publishes
    /// under). What it adds to its previous publication for a judged step
    /// goes into the sum; its counts for any other step are ignored.
    /// Returns whether a sum grew.
    pub fn absorb(&mut self, replica: &str, publication: &Publication) -> bool {
        if replica == self.own {
            return false;
        }
        let mut grew = false;
        // A new incarnation: the old one's counts stay summed, never
        // compared with the new one's.
        self.seen.retain(|(r, incarnation, ..), _| {
            r != replica || *incarnation == publication.incarnation
        });
        for step in &publication.steps {
            if self.judged.get(&step.rule) != Some(&step.step) {
                continue;
            }
            for (backend, value) in &step.backends {
                let key = (
                    replica.to_string(),
                    publication.incarnation.clone(),
                    step.rule.clone(),
                    step.step.clone(),
                    backend.clone(),
                );
                let before = self.seen.get(&key).copied().unwrap_or_default();
                let added = value.since(&before);
                grew |= added != BackendTotals::default();
                let sum = self
                    .sums
                    .entry((step.rule.clone(), backend.clone()))
                    .or_default();
                *sum = sum.plus(&added);
                self.seen.insert(key, *value);
            }
        }
        grew
    }

    /// What the other replicas counted for `backend` of `rule` in the step
    /// judged (cumulative while the step is judged).
    pub fn remote(&self, rule: &RuleKey, backend: &BackendKey) -> BackendTotals {
        self.sums
            .get(&(rule_id(rule), backend.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// How many replicas (incarnations) other than this one published
    /// counts for the step of `rule` judged now.
    pub fn contributors(&self, rule: &RuleKey) -> usize {
        let rule = rule_id(rule);
        let mut replicas: Vec<(&String, &String)> = self
            .seen
            .keys()
            .filter(|(_, _, r, _, _)| *r == rule)
            .map(|(replica, incarnation, ..)| (replica, incarnation))
            .collect();
        replicas.dedup();
        replicas.len()
    }
}

/// The leader's view of the fleet's counts, shared between the watch of
/// the counts objects and the rollout driver, which [`Fleet::counted`]
/// wakes when a sum grew (so that a step is judged on new counts at once,
/// not at its next deadline).
#[derive(Debug, Clone, Default)]
pub struct Fleet(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    counts: Mutex<FleetCounts>,
    counted: Notify,
}

impl Fleet {
    pub fn new(own: &str) -> Fleet {
        Fleet(Arc::new(Shared {
            counts: Mutex::new(FleetCounts::new(own)),
            counted: Notify::new(),
        }))
    }

    /// Run `f` on the counts (a poisoned lock is taken over: the counts are
    /// plain numbers, never left half-updated by a panic that matters).
    pub fn with<T>(&self, f: impl FnOnce(&mut FleetCounts) -> T) -> T {
        f(&mut self.0.counts.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// [`FleetCounts::absorb`], waking [`Fleet::counted`] when a sum grew.
    pub fn absorb(&self, replica: &str, publication: &Publication) {
        if self.with(|f| f.absorb(replica, publication)) {
            self.0.counted.notify_one();
        }
    }

    /// Returns once a sum grew since the last return (at most one wake
    /// pending: many publications between two looks are one wake).
    pub async fn counted(&self) {
        self.0.counted.notified().await;
    }
}

/// The totals the leader judges: `local` (this process's live counters)
/// plus, with a `fleet`, every other replica's counts for the steps of
/// `judged` (the rollouts as they are before this evaluation). Without a
/// fleet (standalone), `local` alone.
pub fn fleet_totals<'a>(
    fleet: Option<&'a Fleet>,
    judged: &[Rollout],
    local: impl Fn(&RuleKey, &BackendKey) -> BackendTotals + 'a,
) -> impl Fn(&RuleKey, &BackendKey) -> BackendTotals + 'a {
    if let Some(fleet) = fleet {
        fleet.with(|f| f.judge(judged));
    }
    move |rule, backend| {
        let own = local(rule, backend);
        match fleet {
            Some(fleet) => own.plus(&fleet.with(|f| f.remote(rule, backend))),
            None => own,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Percent;
    use crate::rollout::Weights;
    use crate::route::RouteKind;
    use std::cell::RefCell;

    fn key(name: &str) -> BackendKey {
        BackendKey::service("shop", name, Some(80))
    }

    fn rule() -> RuleKey {
        RuleKey {
            kind: RouteKind::Http,
            namespace: "shop".into(),
            route: "checkout".into(),
            rule: 0,
        }
    }

    fn at(step: &str, started: &str) -> Rollout {
        let mut from = Weights::new();
        from.add(key("stable"), 1000);
        from.add(key("canary"), 0);
        let mut to = Weights::new();
        to.add(key("stable"), 0);
        to.add(key("canary"), 1000);
        Rollout {
            policy: PolicyKey {
                namespace: "shop".into(),
                name: "p".into(),
            },
            rule: rule(),
            rule_name: None,
            phase: Phase::Progressing,
            step: Some(Percent::parse(step).expect("a step")),
            step_started_at: Some(started.parse().expect("a time")),
            from,
            to,
            held_for: None,
            message: String::new(),
        }
    }

    fn totals(requests: u64, errors: u64) -> BackendTotals {
        BackendTotals {
            requests,
            errors,
            ..BackendTotals::default()
        }
    }

    /// One replica's counters, moved by the test.
    #[derive(Default)]
    struct Counters(RefCell<BTreeMap<String, BackendTotals>>);

    impl Counters {
        fn add(&self, backend: &str, requests: u64, errors: u64) {
            let mut all = self.0.borrow_mut();
            let t = all.entry(backend.to_string()).or_default();
            *t = t.plus(&totals(requests, errors));
        }
        fn read(&self, _: &RuleKey, b: &BackendKey) -> BackendTotals {
            self.0.borrow().get(&b.name).copied().unwrap_or_default()
        }
    }

    const T1: &str = "2026-12-02T11:00:00.25Z";
    const T2: &str = "2026-12-02T11:05:00.5Z";

    #[test]
    fn a_replica_publishes_its_counts_since_it_began_serving_the_step() {
        let counters = Counters::default();
        counters.add("canary", 7, 1);
        let mut counter = StepCounter::default();
        counter.follow(&[], &|r, b| counters.read(r, b));
        assert!(
            !counter.in_flight(),
            "nothing at a step: nothing to publish"
        );

        counter.follow(&[at("25%", T1)], &|r, b| counters.read(r, b));
        assert!(counter.in_flight());
        counters.add("canary", 10, 4);
        counters.add("stable", 30, 0);
        // The same record again (another reload) keeps counting.
        counter.follow(&[at("25%", T1)], &|r, b| counters.read(r, b));
        let p = counter.publication("pod-b-1", &|r, b| counters.read(r, b));
        assert_eq!(p.incarnation, "pod-b-1");
        assert_eq!(p.steps.len(), 1);
        let step = &p.steps[0];
        assert_eq!(step.policy, "shop/p");
        assert_eq!(step.rule, "HTTPRoute shop/checkout rule 0");
        assert_eq!(step.step, format!("25%@{T1}"));
        assert_eq!(step.backends["shop/canary:80"], totals(10, 4));
        assert_eq!(step.backends["shop/stable:80"], totals(30, 0));

        // The next step counts from when it is seen.
        counter.follow(&[at("50%", T2)], &|r, b| counters.read(r, b));
        counters.add("canary", 2, 0);
        let p = counter.publication("pod-b-1", &|r, b| counters.read(r, b));
        assert_eq!(p.steps[0].step, format!("50%@{T2}"));
        assert_eq!(p.steps[0].backends["shop/canary:80"], totals(2, 0));

        // Held after a failed gate (onFailure: Pause): nothing judged,
        // nothing published.
        let mut held = at("50%", T2);
        held.phase = Phase::Paused;
        held.held_for = Some(7);
        counter.follow(&[held], &|r, b| counters.read(r, b));
        assert!(!counter.in_flight());
        let mut paused = at("50%", T2);
        paused.phase = Phase::Paused;
        counter.follow(&[paused], &|r, b| counters.read(r, b));
        assert!(counter.in_flight(), "spec.paused: the gates still judge");

        // Rolled back: not at a step any more.
        let mut back = at("50%", T2);
        back.phase = Phase::RolledBack;
        counter.follow(&[back], &|r, b| counters.read(r, b));
        assert!(!counter.in_flight());
    }

    fn published(incarnation: &str, step: &str, canary: (u64, u64)) -> Publication {
        Publication {
            incarnation: incarnation.into(),
            steps: vec![PublishedStep {
                policy: "shop/p".into(),
                rule: rule_id(&rule()),
                step: step.into(),
                backends: BTreeMap::from([("shop/canary:80".into(), totals(canary.0, canary.1))]),
            }],
        }
    }

    fn canary(fleet: &FleetCounts) -> BackendTotals {
        fleet.remote(&rule(), &key("canary"))
    }

    #[test]
    fn the_leader_sums_the_other_replicas_counts_for_the_step_it_judges() {
        let mut fleet = FleetCounts::new("pod-a");
        let s1 = format!("25%@{T1}");
        fleet.judge(&[at("25%", T1)]);
        fleet.absorb("pod-b", &published("b1", &s1, (10, 2)));
        fleet.absorb("pod-c", &published("c1", &s1, (5, 0)));
        // Its own publication is not summed (its counters are read live).
        fleet.absorb("pod-a", &published("a1", &s1, (100, 100)));
        assert_eq!(canary(&fleet), totals(15, 2));
        assert_eq!(fleet.contributors(&rule()), 2);

        // A publication adds what it adds to the previous one; the same
        // one again (a relist) adds nothing.
        assert!(fleet.absorb("pod-b", &published("b1", &s1, (12, 3))));
        assert!(!fleet.absorb("pod-b", &published("b1", &s1, (12, 3))));
        assert_eq!(canary(&fleet), totals(17, 3));

        // pod-c goes away: what it counted stays, nothing is waited for.
        fleet.judge(&[at("25%", T1)]);
        fleet.absorb("pod-b", &published("b1", &s1, (20, 3)));
        assert_eq!(canary(&fleet), totals(25, 3));

        // pod-b restarts: its new incarnation counts from zero, added to
        // what the old one counted (never subtracted from it).
        fleet.absorb("pod-b", &published("b2", &s1, (4, 4)));
        assert_eq!(canary(&fleet), totals(29, 7));
        fleet.absorb("pod-b", &published("b2", &s1, (6, 4)));
        assert_eq!(canary(&fleet), totals(31, 7));
    }

    #[test]
    fn counts_of_another_step_are_never_summed() {
        let mut fleet = FleetCounts::new("pod-a");
        let (s1, s2) = (format!("25%@{T1}"), format!("50%@{T2}"));
        // Not judged yet (or another rollout's step): ignored.
        fleet.absorb("pod-b", &published("b1", &s2, (9, 9)));
        assert_eq!(canary(&fleet), totals(0, 0));

        fleet.judge(&[at("25%", T1)]);
        fleet.absorb("pod-b", &published("b1", &s1, (10, 1)));
        assert_eq!(canary(&fleet), totals(10, 1));

        // The leader moved to 50%: pod-b, still on 25% until the record
        // reaches it, publishes more of 25%: not counted in 50%.
        fleet.judge(&[at("50%", T2)]);
        assert_eq!(canary(&fleet), totals(0, 0), "the new step starts at zero");
        fleet.absorb("pod-b", &published("b1", &s1, (30, 20)));
        assert_eq!(canary(&fleet), totals(0, 0));
        fleet.absorb("pod-b", &published("b1", &s2, (3, 0)));
        assert_eq!(canary(&fleet), totals(3, 0));

        // The same percentage entered again later (a new rollout) is
        // another step.
        let again = format!("50%@{T1}");
        fleet.absorb("pod-b", &published("b1", &again, (50, 50)));
        assert_eq!(canary(&fleet), totals(3, 0));

        // Not at a step any more: nothing summed.
        fleet.judge(&[]);
        assert_eq!(canary(&fleet), totals(0, 0));
    }

    #[test]
    fn a_new_leader_counts_the_others_whole_step() {
        // Publications that arrived while this replica followed (judged
        // nothing) are not remembered...
        let mut fleet = FleetCounts::new("pod-a");
        let s1 = format!("25%@{T1}");
        fleet.judge(&[]);
        fleet.absorb("pod-b", &published("b1", &s1, (40, 4)));
        assert_eq!(canary(&fleet), totals(0, 0));
        // ...so once it leads, the next one counts the step in full.
        fleet.judge(&[at("25%", T1)]);
        assert_eq!(canary(&fleet), totals(0, 0), "nothing before the baseline");
        fleet.absorb("pod-b", &published("b1", &s1, (42, 4)));
        assert_eq!(canary(&fleet), totals(42, 4));
    }

    #[test]
    fn fleet_totals_add_the_other_replicas_to_the_local_counters() {
        let fleet = Fleet::new("pod-a");
        let local = |_: &RuleKey, b: &BackendKey| {
            if b.name == "canary" {
                totals(1, 1)
            } else {
                totals(0, 0)
            }
        };
        let judged = [at("25%", T1)];
        {
            let read = fleet_totals(Some(&fleet), &judged, local);
            assert_eq!(read(&rule(), &key("canary")), totals(1, 1));
        }
        fleet.absorb("pod-b", &published("b1", &format!("25%@{T1}"), (10, 2)));
        let read = fleet_totals(Some(&fleet), &judged, local);
        assert_eq!(read(&rule(), &key("canary")), totals(11, 3));
        assert_eq!(read(&rule(), &key("stable")), totals(0, 0));
        let alone = fleet_totals(None, &judged, local);
        assert_eq!(alone(&rule(), &key("canary")), totals(1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_is_woken_when_a_sum_grows() {
        let fleet = Fleet::new("pod-a");
        let s1 = format!("25%@{T1}");
        let wait = std::time::Duration::from_secs(60);
        fleet.with(|f| f.judge(&[at("25%", T1)]));
        fleet.absorb("pod-b", &published("b1", &s1, (1, 1)));
        fleet.absorb("pod-b", &published("b1", &s1, (2, 1)));
        tokio::time::timeout(wait, fleet.counted())
            .await
            .expect("woken once");
        // Two publications were one wake; one that adds nothing (a
        // relist, another step) is none.
        fleet.absorb("pod-b", &published("b1", &s1, (2, 1)));
        fleet.absorb("pod-b", &published("b1", &format!("50%@{T2}"), (9, 9)));
        assert!(tokio::time::timeout(wait, fleet.counted()).await.is_err());
    }

    #[test]
    fn a_publication_round_trips_and_unknown_counters_read_as_zero() {
        let p = published("b1", "25%@x", (3, 1));
        let text = serde_json::to_string(&p).expect("serializes");
        assert_eq!(
            serde_json::from_str::<Publication>(&text).expect("parses"),
            p
        );
        // A replica of another version: missing fields are zero, unknown
        // ones ignored.
        let other: Publication = serde_json::from_str(
            r#"{"incarnation": "x", "steps": [{"policy": "shop/p", "rule": "r", "step": "s",
                "backends": {"b": {"requests": 4, "slowest": 9}}}]}"#,
        )
        .expect("parses");
        assert_eq!(other.steps[0].backends["b"], totals(4, 0));
    }
}
