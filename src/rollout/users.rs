//! Users, not only requests: with a policy's `consistentBy`, which
//! backends' users are counted for which step, and how a step's users are
//! shown (status, metrics, messages).
//!
//! The counting itself is on the request path ([`crate::metrics::users`]):
//! distinct users per backend and step, the users with a 5xx, and each
//! user's repeated errors, which the error gates do not judge
//! ([`super::gates::Gate::events`]). This module says what to count
//! ([`tracked`], every backend of a rollout at a step, on every replica)
//! and turns a step's counts into the status fields ([`StepUsers`]) and
//! the `sluice_rollout_users*` gauges ([`show`]). See `docs/rollouts.md`,
//! "Users".

use std::collections::BTreeSet;

use super::fleet::step_id;
use super::gates::StepView;
use super::machine::{PolicyKey, Rollout, RolloutInputs, Rollouts, RuleKey};
use super::shares::share_text;
use super::status::RolloutReport;
use crate::metrics::{BackendStatsKey, BackendTotals, Metrics, RolloutLabels, RolloutMetrics};

/// A step's users on each side, as the status shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepUsers {
    /// Distinct users the incoming backends answered in the step, and of
    /// those the users that got at least one 5xx.
    pub canary: u64,
    pub canary_with_errors: u64,
    /// The outgoing backends' over the same time.
    pub stable: u64,
    pub stable_with_errors: u64,
    /// The incoming backends' 5xx that were a user's repeated errors.
    pub canary_repeated_errors: u64,
    /// Some count is an estimate (more users than counted exactly).
    pub estimated: bool,
}

impl StepUsers {
    /// The users of a step, when the policy counts them (`consistentBy`).
    pub fn of(step: &StepView) -> Option<StepUsers> {
        step.keyed.then(|| StepUsers {
            canary: step.canary.users,
            canary_with_errors: step.canary.users_with_errors,
            stable: step.stable.users,
            stable_with_errors: step.stable.users_with_errors,
            canary_repeated_errors: step.canary.repeated_errors,
            estimated: step.canary.users_estimated + step.stable.users_estimated > 0,
        })
    }

    /// The incoming backends' share of the step's users (`9.5%`); `None`
    /// before any user.
    pub fn canary_share(&self) -> Option<String> {
        let total = self.canary + self.stable;
        (total > 0).then(|| share_text(u128::from(self.canary), u128::from(total)))
    }
}

/// `34 errors from 4 users`, `1 error from 1 user`: a side's 5xx and the
/// users they came from.
pub fn errors_from_users(t: &BackendTotals) -> String {
    format!(
        "{} from {}",
        plural(t.errors, "error"),
        plural(t.users_with_errors, "user")
    )
}

fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// What a step's error message adds with `consistentBy`: `; in this step
/// 34 errors from 4 users (of 12; 30 repeated errors not judged)`.
pub fn step_errors_text(step: &StepView) -> String {
    if !step.keyed {
        return String::new();
    }
    let c = &step.canary;
    let mut text = format!(
        "; in this step {} (of {})",
        errors_from_users(c),
        plural(c.users, "user")
    );
    if c.repeated_errors > 0 {
        text.insert_str(text.len() - 1, &format!("; {} not judged", repeated(c)));
    }
    text
}

/// `30 repeated errors`, `1 repeated error`.
fn repeated(t: &BackendTotals) -> String {
    plural(t.repeated_errors, "repeated error")
}

/// What a step's counts say with `consistentBy`: ` from 40 users` after
/// the requests, and the errors' users (`3 errors from 2 users`).
pub fn requests_text(t: &BackendTotals) -> (String, String) {
    (
        format!(" from {}", plural(t.users, "user")),
        errors_from_users(t),
    )
}

/// The backends whose users are counted, each with its step: every
/// backend (incoming and outgoing) of a rollout at a step whose policy
/// sets `consistentBy`. The same on every replica (from the records).
pub fn tracked(records: &[Rollout], inputs: &RolloutInputs) -> Vec<(BackendStatsKey, String)> {
    let keyed = keyed(inputs);
    let mut out = Vec::new();
    for r in records {
        if !keyed.contains(&(&r.policy, &r.rule)) {
            continue;
        }
        let Some(step) = step_id(r) else {
            continue;
        };
        for backend in r.from.union_keys(&r.to) {
            out.push((
                BackendStatsKey {
                    kind: r.rule.kind.metrics_prefix(),
                    namespace: r.rule.namespace.clone(),
                    route: r.rule.route.clone(),
                    rule: r.rule.rule,
                    backend: backend.to_string(),
                },
                step.clone(),
            ));
        }
    }
    out
}

/// Tell the metrics whose users to count now ([`tracked`]); called by the
/// rollout driver after every evaluation (a step that starts counts its
/// users afresh).
pub fn track(metrics: &Metrics, rollouts: &Rollouts, inputs: &RolloutInputs) {
    if keyed(inputs).is_empty() {
        metrics.track_users(&[]);
    } else {
        metrics.track_users(&tracked(&rollouts.records(), inputs));
    }
}

/// The governed rules whose policy sets `consistentBy`.
fn keyed(inputs: &RolloutInputs) -> BTreeSet<(&PolicyKey, &RuleKey)> {
    inputs
        .rules
        .iter()
        .filter(|g| g.settings.consistent_by.is_some())
        .map(|g| (&g.policy, &g.rule))
        .collect()
}

/// Set the `sluice_rollout_users` and `sluice_rollout_users_with_errors`
/// gauges of every rollout in `report` that counts users, by side
/// (`canary`: incoming backends, `stable`: outgoing), and remove those of
/// the others.
pub fn show(metrics: &RolloutMetrics, report: &RolloutReport) {
    let mut shown = Vec::new();
    for (policy, entries) in &report.policies {
        for e in entries {
            let (Some(canary), Some(stable)) = (e.canary_users, e.stable_users) else {
                continue;
            };
            let labels = RolloutLabels {
                policy: policy.to_string(),
                // A policy's targets are HTTPRoutes of its namespace.
                route: format!("{}/{}", policy.namespace, e.route),
                rule: e.rule.to_string(),
            };
            metrics.set_users(
                &labels,
                [
                    ("canary", canary, e.canary_users_with_errors.unwrap_or(0)),
                    ("stable", stable, e.stable_users_with_errors.unwrap_or(0)),
                ],
            );
            shown.push(labels);
        }
    }
    metrics.retain_users(&shown);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Percent;
    use crate::rollout::machine::{GovernedRule, Phase};
    use crate::rollout::shares::{BackendKey, Weights};
    use crate::route::RouteKind;

    fn totals(errors: u64, users: u64, with_errors: u64, repeated: u64) -> BackendTotals {
        BackendTotals {
            requests: 100,
            errors,
            users,
            users_with_errors: with_errors,
            repeated_errors: repeated,
            ..BackendTotals::default()
        }
    }

    #[test]
    fn messages_say_how_many_users_the_errors_came_from() {
        assert_eq!(
            errors_from_users(&totals(34, 12, 4, 30)),
            "34 errors from 4 users"
        );
        assert_eq!(
            errors_from_users(&totals(1, 1, 1, 0)),
            "1 error from 1 user"
        );
        let step = StepView {
            canary: totals(34, 12, 4, 30),
            keyed: true,
            ..StepView::default()
        };
        assert_eq!(
            step_errors_text(&step),
            "; in this step 34 errors from 4 users (of 12 users; 30 repeated errors not judged)"
        );
        let few = StepView {
            canary: totals(2, 5, 2, 0),
            keyed: true,
            ..StepView::default()
        };
        assert_eq!(
            step_errors_text(&few),
            "; in this step 2 errors from 2 users (of 5 users)"
        );
        assert_eq!(step_errors_text(&StepView::default()), "");
    }

    #[test]
    fn a_steps_users_and_their_share() {
        let step = StepView {
            canary: totals(3, 10, 2, 1),
            stable: BackendTotals {
                users: 90,
                users_estimated: 1,
                ..BackendTotals::default()
            },
            keyed: true,
            ..StepView::default()
        };
        let u = StepUsers::of(&step).expect("keyed");
        assert_eq!(
            (u.canary, u.canary_with_errors, u.stable, u.estimated),
            (10, 2, 90, true)
        );
        assert_eq!(u.canary_share().as_deref(), Some("10%"));
        assert_eq!(StepUsers::default().canary_share(), None);
        assert_eq!(
            StepUsers::of(&StepView {
                keyed: false,
                ..step
            }),
            None
        );
    }

    #[test]
    fn users_are_tracked_for_keyed_rollouts_at_a_step_only() {
        let key = |n: &str| BackendKey::service("shop", n, Some(80));
        let mut from = Weights::new();
        from.add(key("stable"), 1);
        let mut to = Weights::new();
        to.add(key("canary"), 1);
        let rule = RuleKey {
            kind: RouteKind::Http,
            namespace: "shop".into(),
            route: "r".into(),
            rule: 0,
        };
        let policy = PolicyKey {
            namespace: "shop".into(),
            name: "p".into(),
        };
        let at_step = Rollout {
            policy: policy.clone(),
            rule: rule.clone(),
            phase: Phase::Progressing,
            step: Percent::parse("5%").ok(),
            step_started_at: "2026-12-02T11:00:00Z".parse().ok(),
            from: from.clone(),
            to: to.clone(),
            ..Rollout::default()
        };
        let mut settings = crate::resources::RolloutSettings {
            steps: vec![Percent::HUNDRED],
            interval: std::time::Duration::from_secs(60),
            min_requests: 0,
            gates: Vec::new(),
            confidence: crate::rollout::Confidence::DEFAULT,
            on_failure: crate::resources::OnFailure::Rollback,
            paused: false,
            consistent_by: None,
        };
        let inputs = |settings: &crate::resources::RolloutSettings| RolloutInputs {
            rules: vec![GovernedRule {
                policy: policy.clone(),
                settings: settings.clone(),
                fingerprint: 0,
                rule: rule.clone(),
                rule_name: None,
                spec: to.clone(),
                readiness: Vec::new(),
                previously_served: None,
            }],
        };
        assert!(tracked(std::slice::from_ref(&at_step), &inputs(&settings)).is_empty());
        settings.consistent_by = Some(crate::resources::ConsistentKey::Header(
            http::HeaderName::from_static("x-user"),
        ));
        let t = tracked(std::slice::from_ref(&at_step), &inputs(&settings));
        let names: Vec<(&str, &str)> = t
            .iter()
            .map(|(k, s)| (k.backend.as_str(), s.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("shop/stable:80", "5%@2026-12-02T11:00:00Z"),
                ("shop/canary:80", "5%@2026-12-02T11:00:00Z")
            ]
        );
        let rolled_back = Rollout {
            phase: Phase::RolledBack,
            ..at_step
        };
        assert!(tracked(&[rolled_back], &inputs(&settings)).is_empty());
    }
}
