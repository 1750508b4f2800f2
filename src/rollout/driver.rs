//! The rollout driver: what `sluice serve` does with the rollouts between
//! two configurations. It holds the state machine ([`Rollouts`]), its
//! inputs (the governed rules of the configuration in service), where the
//! records are saved ([`RolloutStore`]) and who judges ([`Role`]); it
//! feeds the machine the counters (this replica's, plus the fleet's in
//! Kubernetes mode), logs and counts its transitions, saves its records,
//! and says what to serve ([`RolloutDriver::served`]) and when to look
//! again ([`RolloutDriver::next_look`]).
//!
//! It is apart from the serve loop so that the loop only wires: the loop
//! owns the table swap and the admin listener, this module owns the
//! rollouts' side of each look. Nothing here knows the admin listener;
//! the loop publishes what [`RolloutDriver::report`] gives.
//!
//! Who judges: standalone, this process (its records go to
//! `--state-dir`). In Kubernetes mode, the Lease leader only: it records
//! every rollout in its policy's `status.rollouts` (the status writer sends
//! them with the rest of the policy's status); the other replicas serve
//! the step recorded there ([`Rollouts::served`]), and a replica that wins
//! the lease continues from it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::fleet::{Fleet, fleet_totals};
use super::{
    BackendKey, MemoryStore, PolicyKey, RolloutInputs, RolloutReport, RolloutStore, Rollouts,
    RuleKey, ServedShares,
};
use crate::metrics::{BackendStatsKey, Metrics, RolloutLabels};
use crate::resources::RolloutPolicy;

/// How often a rollout at a step is looked at for its status counts when
/// nothing else wakes it. Decisions never wait for it: a governed
/// backend's 5xx or slow response wakes the judge at once, and a step's
/// end is a deadline of its own.
pub const ROLLOUT_REFRESH: Duration = Duration::from_secs(1);

/// The least time between two looks woken by responses: a canary failing
/// every request wakes the judge at most this often.
pub const ROLLOUT_EVENT_GAP: Duration = Duration::from_millis(5);

/// Who moves the rollouts along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This process judges the steps (standalone, or the Kubernetes leader).
    Lead,
    /// This process serves the steps another recorded in the policies'
    /// status (a Kubernetes replica that is not the leader).
    Follow,
}

/// The rollouts, their state machine's inputs and where they are saved.
pub struct RolloutDriver {
    role: Role,
    /// Took the lead: continue from the rollouts recorded in the policies'
    /// status as soon as a configuration is in service.
    resume: bool,
    /// The rollouts as recorded at their last transition (or as read from
    /// the policies' status): what Kubernetes mode writes to each policy's
    /// `status.rollouts`, and what a follower shows. Not rebuilt for every
    /// count: status is written when a rollout moves, not per request.
    recorded: Arc<RolloutReport>,
    /// Problems reading recorded rollouts, as last logged.
    unreadable: Vec<String>,
    machine: Rollouts,
    store: Arc<Mutex<Box<dyn RolloutStore>>>,
    inputs: RolloutInputs,
    served: ServedShares,
    /// When the machine next needs the clock (a step's interval ends).
    next: Option<Timestamp>,
    /// Why the state could not be saved (or read), and since when.
    not_saved: Option<(String, Timestamp)>,
    /// Kubernetes mode: the other replicas' counts, judged with ours.
    fleet: Option<Fleet>,
}

impl RolloutDriver {
    /// A driver whose rollouts resume what `store` recorded, leading them
    /// or following the records in the policies' status (`role`). A store
    /// that cannot be read is logged and shown; the rollouts start empty.
    pub async fn open(mut store: Box<dyn RolloutStore>, role: Role) -> RolloutDriver {
        let location = store.location();
        let (store, loaded) = tokio::task::spawn_blocking(move || {
            let loaded = store.load();
            (store, loaded)
        })
        .await
        .unwrap_or_else(|_| {
            (
                Box::new(MemoryStore::default()) as Box<dyn RolloutStore>,
                Err("reading the rollout state panicked".into()),
            )
        });
        let (machine, not_saved) = match loaded {
            Ok(records) => {
                if !records.is_empty() {
                    tracing::info!(rollouts = records.len(), state = %location,
                        "resuming recorded rollouts");
                }
                (Rollouts::restore(records), None)
            }
            Err(error) => {
                let message = format!(
                    "{error}; started without recorded rollouts: rules serve their spec shares until their weights change"
                );
                tracing::error!("rollout state: {message}");
                (Rollouts::new(), Some((message, Timestamp::now())))
            }
        };
        RolloutDriver {
            role,
            resume: false,
            recorded: Arc::default(),
            unreadable: Vec::new(),
            machine,
            store: Arc::new(Mutex::new(store)),
            inputs: RolloutInputs::default(),
            served: ServedShares::default(),
            next: None,
            not_saved,
            fleet: None,
        }
    }

    /// Judge the whole fleet's counts: this replica's plus what `fleet`
    /// gathers from the others (Kubernetes mode).
    pub fn with_fleet(&mut self, fleet: Fleet) {
        self.fleet = Some(fleet);
    }

    /// The fleet's counts, when this replica judges them with its own.
    pub fn fleet(&self) -> Option<Fleet> {
        self.fleet.clone()
    }

    /// The governed rules of a new configuration; `metrics` is told which
    /// backends they govern (every backend of a governed rule, on every
    /// replica): it counts those backends' slow responses and wakes the
    /// judge on their 5xx and slow responses.
    pub fn set_inputs(&mut self, inputs: RolloutInputs, metrics: &Metrics) {
        self.inputs = inputs;
        let governed: Vec<(BackendStatsKey, Option<Duration>)> = self
            .inputs
            .rules
            .iter()
            .flat_map(|g| {
                let slow = g.settings.slow_after();
                let rule = &g.rule;
                let mut keys: Vec<&BackendKey> = g.spec.keys().collect();
                if let Some(before) = &g.previously_served {
                    keys.extend(before.keys());
                }
                keys.into_iter().map(move |b| (stats_key(rule, b), slow))
            })
            .collect();
        metrics.govern(&governed);
    }

    /// The governed rules in service.
    pub fn inputs(&self) -> &RolloutInputs {
        &self.inputs
    }

    /// Lead the rollouts (`lead`: the lease was won) or follow the records
    /// in the policies' status (lost). Whether the role changed: the caller
    /// then looks again and serves what that gives.
    pub fn set_role(&mut self, lead: bool) -> bool {
        let role = if lead { Role::Lead } else { Role::Follow };
        if self.role == role {
            return false;
        }
        self.role = role;
        // A new leader continues from what the policies' status records,
        // never from what it judged in an earlier term.
        self.resume = lead;
        tracing::info!(
            "{}",
            if lead {
                "leading the rollouts: continuing from the steps recorded in the RolloutPolicies' status"
            } else {
                "following the rollouts: serving the steps the leader records in the RolloutPolicies' status"
            }
        );
        true
    }

    /// Lead the rollouts (judge them) or follow the recorded ones, given
    /// the policies of the configuration in service.
    pub async fn run(&mut self, policies: &[RolloutPolicy], metrics: &Metrics) {
        match self.role {
            Role::Lead => {
                if std::mem::take(&mut self.resume) {
                    self.read_recorded(policies);
                }
                self.evaluate(metrics).await;
            }
            Role::Follow => {
                self.read_recorded(policies);
                self.served = self.machine.served(&self.inputs);
            }
        }
        // consistentBy: count each step's users afresh (every replica).
        super::users::track(metrics, &self.machine, &self.inputs);
    }

    /// What the rules governed by rollouts serve now.
    pub fn served(&self) -> &ServedShares {
        &self.served
    }

    /// The rollouts as recorded at their last transition: what Kubernetes
    /// mode writes to the policies' status. A new `Arc` means a change.
    pub fn recorded(&self) -> &Arc<RolloutReport> {
        &self.recorded
    }

    /// Whether this process judges a rollout at a step now: only then do
    /// deadlines, backend events and the fleet's counts call for a look.
    pub fn judging(&self) -> bool {
        self.role == Role::Lead && self.machine.in_flight()
    }

    /// When to look again while [`judging`](Self::judging): at the
    /// machine's next deadline, and at least every [`ROLLOUT_REFRESH`] for
    /// the counts shown.
    pub fn next_look(&self) -> Option<tokio::time::Instant> {
        self.judging().then(|| {
            let now = tokio::time::Instant::now();
            let refresh = now + ROLLOUT_REFRESH;
            match self.next {
                Some(at) => {
                    let wait = at.duration_since(Timestamp::now());
                    let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
                    refresh.min(now + wait)
                }
                None => refresh,
            }
        })
    }

    /// The rollouts to show on `/status`: the leader's with the counts of
    /// the moment, a follower's as recorded.
    pub fn report(&self) -> RolloutReport {
        match self.role {
            Role::Lead => RolloutReport::new(&self.machine, self.not_saved.clone()),
            Role::Follow => (*self.recorded).clone(),
        }
    }

    /// The state machine: what the dashboard charts of each rollout is
    /// its [`Rollouts::histories`] (a follower's judges nothing: none).
    pub fn machine(&self) -> &Rollouts {
        &self.machine
    }

    /// Set the rollout gauges of `metrics` (phase, step, served shares)
    /// and drop those of rollouts no longer known.
    pub fn publish_metrics(&self, metrics: &Metrics) {
        let metrics = metrics.rollouts();
        let mut shown = Vec::new();
        for (rollout, _, _) in self.machine.report() {
            let labels = rollout_labels(&rollout.policy, &rollout.rule);
            let served = rollout.served();
            let total = served.total();
            let shares: Vec<(String, f64)> = served
                .iter()
                .map(|(k, w)| {
                    let share = if total == 0 {
                        0.0
                    } else {
                        w as f64 / total as f64
                    };
                    (k.to_string(), share)
                })
                .collect();
            let step = rollout
                .step
                .map_or(0.0, |p| f64::from(p.thousandths()) / 1000.0);
            metrics.set(&labels, rollout.phase.as_str(), step, &shares);
            shown.push(labels);
        }
        metrics.retain(&shown);
        // consistentBy: the step's users by side, as the status shows them.
        super::users::show(metrics, &self.report());
    }

    /// Take the rollouts recorded in `policies`' status as this process's
    /// (Kubernetes mode).
    fn read_recorded(&mut self, policies: &[RolloutPolicy]) {
        let (records, report, problems) = super::recorded(policies);
        if problems != self.unreadable {
            for problem in &problems {
                tracing::warn!("{problem}; that rule is served as if nothing were recorded");
            }
            self.unreadable = problems;
        }
        self.machine = Rollouts::restore(records);
        if *self.recorded != report {
            self.recorded = Arc::new(report);
        }
    }

    /// Run the rollout state machine; log and count its transitions; save
    /// the records when they changed.
    async fn evaluate(&mut self, metrics: &Metrics) {
        let local =
            |rule: &RuleKey, backend: &BackendKey| metrics.backend_total(&stats_key(rule, backend));
        // Kubernetes mode: plus the other replicas' counts of each step.
        let judged = self.machine.records();
        let evaluation = {
            let totals = fleet_totals(self.fleet.as_ref(), &judged, local);
            self.machine
                .evaluate(&self.inputs, &totals, Timestamp::now())
        };
        for t in &evaluation.transitions {
            tracing::info!(policy = %t.policy, rule = %t.rule, phase = t.phase.as_str(), "rollout: {}", t.message);
            metrics
                .rollouts()
                .transition(&rollout_labels(&t.policy, &t.rule), t.phase.as_str());
        }
        self.served = evaluation.served;
        self.next = evaluation.next;
        if evaluation.changed {
            self.recorded = Arc::new(RolloutReport::new(&self.machine, None));
            self.save().await;
        }
    }

    /// Save the recorded rollouts (off the async workers: the file is
    /// synced). A failure is logged once, shown on `/readyz` and in each
    /// policy's status, and the rollouts go on in memory.
    async fn save(&mut self) {
        let records = self.machine.records();
        let store = self.store.clone();
        let saved = tokio::task::spawn_blocking(move || {
            let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
            store.save(&records).map_err(|e| (e, store.location()))
        })
        .await
        .unwrap_or_else(|e| Err((format!("saving panicked: {e}"), String::new())));
        match saved {
            Ok(()) => {
                if self.not_saved.take().is_some() {
                    tracing::info!("rollout state saved again");
                }
            }
            Err((error, _)) => {
                let message = format!(
                    "{error}; rollouts go on in memory only: after a restart, rules would serve their spec shares at once"
                );
                let known = self.not_saved.as_ref().is_some_and(|(m, _)| *m == message);
                if !known {
                    tracing::error!("rollout state: {message}");
                    self.not_saved = Some((message, Timestamp::now()));
                }
            }
        }
    }
}

/// The metrics' key of one backend of a governed rule.
fn stats_key(rule: &RuleKey, backend: &BackendKey) -> BackendStatsKey {
    BackendStatsKey {
        kind: rule.kind.metrics_prefix(),
        namespace: rule.namespace.clone(),
        route: rule.route.clone(),
        rule: rule.rule,
        backend: backend.to_string(),
    }
}

/// The labels of one rollout's metrics.
fn rollout_labels(policy: &PolicyKey, rule: &RuleKey) -> RolloutLabels {
    RolloutLabels {
        policy: policy.to_string(),
        route: format!(
            "{}{}/{}",
            rule.kind.metrics_prefix(),
            rule.namespace,
            rule.route
        ),
        rule: rule.rule.to_string(),
    }
}
