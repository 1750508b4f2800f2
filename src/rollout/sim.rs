//! One rollout of one rule, stable to canary, driven by the caller's
//! counts and clock: the real [`Rollouts`] state machine behind a small
//! interface, for simulations (`benches/rollout_sim.rs`, the table in
//! `docs/rollouts.md`) that want the machine's decisions on synthetic
//! traffic without a route table, metrics or a serve loop.
//!
//! Nothing here decides anything: every [`Promotion::look`] is one
//! [`Rollouts::evaluate`] of a governed rule that served 100% to `stable`
//! and whose weights were changed to 100% to `canary`, read with the
//! totals given. The serve loop's cadence (a look on every governed
//! 5xx, at the machine's deadlines and every second) is the caller's to
//! reproduce.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::machine::{
    GovernedRule, Phase, PolicyKey, RolloutInputs, Rollouts, RuleKey, ServedRule,
};
use super::shares::{BackendKey, Weights};
use crate::metrics::BackendTotals;
use crate::resources::RolloutSettings;
use crate::route::RouteKind;

/// A full promotion of one rule from `sim/stable:80` to `sim/canary:80`.
#[derive(Debug, Clone)]
pub struct Promotion {
    rollouts: Rollouts,
    inputs: RolloutInputs,
    stable: BackendKey,
    canary: BackendKey,
    start: Timestamp,
}

/// What the machine decided at a look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Look {
    pub phase: Phase,
    /// The step reached (its index in the settings' `steps`); `None`
    /// before the first step.
    pub step: Option<usize>,
    /// The canary's share of the rule's requests from now on, 0 to 1.
    pub canary_share: f64,
    /// When the machine next needs a look (a step's interval ends, or a
    /// second after the interval while short of `minRequests`), as time
    /// since the start; `None` when nothing waits on the clock.
    pub next: Option<Duration>,
}

impl Promotion {
    /// Start the rollout at time 0: the rule served 100% to the stable
    /// until now, and its weights say 100% to the canary. Returns the
    /// first look (at the first step, unless the settings say `paused`).
    pub fn start(settings: RolloutSettings) -> (Promotion, Look) {
        let stable = BackendKey::service("sim", "stable", Some(80));
        let canary = BackendKey::service("sim", "canary", Some(80));
        let weights = |s: u64, c: u64| {
            let mut w = Weights::new();
            w.add(stable.clone(), s);
            w.add(canary.clone(), c);
            w
        };
        let rule = GovernedRule {
            policy: PolicyKey {
                namespace: "sim".into(),
                name: "policy".into(),
            },
            settings,
            fingerprint: 1,
            rule: RuleKey {
                kind: RouteKind::Http,
                namespace: "sim".into(),
                route: "route".into(),
                rule: 0,
            },
            rule_name: None,
            spec: weights(0, 1),
            readiness: Vec::new(),
            previously_served: Some(weights(1, 0)),
        };
        let mut promotion = Promotion {
            rollouts: Rollouts::new(),
            inputs: RolloutInputs { rules: vec![rule] },
            stable,
            canary,
            start: Timestamp::UNIX_EPOCH,
        };
        let zero = BackendTotals::default();
        let first = promotion.look(Duration::ZERO, &zero, &zero);
        (promotion, first)
    }

    /// Evaluate the machine `at` this long after the start, with the
    /// backends' cumulative totals since the start.
    pub fn look(&mut self, at: Duration, canary: &BackendTotals, stable: &BackendTotals) -> Look {
        let now = self.start.checked_add(at).unwrap_or(Timestamp::MAX);
        let (canary_key, c, s) = (&self.canary, *canary, *stable);
        let totals = move |_: &RuleKey, k: &BackendKey| if k == canary_key { c } else { s };
        let evaluation = self.rollouts.evaluate(&self.inputs, &totals, now);
        let rule = &self.inputs.rules[0];
        let served = evaluation.served.rules.get(&rule.rule);
        let next = evaluation.next.map(|t| {
            let nanos = t.as_nanosecond() - self.start.as_nanosecond();
            Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX))
        });
        match served {
            Some(served) => Look {
                phase: served.phase,
                step: served
                    .step
                    .and_then(|p| rule.settings.steps.iter().position(|q| *q == p)),
                canary_share: self.share(served),
                next,
            },
            // Every governed rule is served; kept total for the type.
            None => Look {
                phase: Phase::Complete,
                step: None,
                canary_share: 1.0,
                next,
            },
        }
    }

    /// The rollout's status message (what the last look said).
    pub fn message(&self) -> String {
        self.rollouts
            .records()
            .pop()
            .map(|r| r.message)
            .unwrap_or_default()
    }

    fn share(&self, served: &ServedRule) -> f64 {
        let total = served.weights.total();
        if total == 0 {
            return 0.0;
        }
        served.weights.get(&self.canary) as f64 / total as f64
    }

    /// The stable backend's identity (`sim/stable:80`).
    pub fn stable(&self) -> &BackendKey {
        &self.stable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{OnFailure, Percent};
    use crate::rollout::{Bound, Confidence, Gate, Signal};

    fn settings() -> RolloutSettings {
        RolloutSettings {
            steps: ["5%", "50%", "100%"]
                .iter()
                .map(|s| Percent::parse(s).expect("step"))
                .collect(),
            interval: Duration::from_secs(60),
            min_requests: 100,
            gates: vec![Gate {
                signal: Signal::Errors,
                bound: Bound::Limit(Percent::from_thousandths(1_000)),
            }],
            confidence: Confidence::DEFAULT,
            on_failure: OnFailure::Rollback,
            paused: false,
            consistent_by: None,
        }
    }

    fn totals(requests: u64, errors: u64) -> BackendTotals {
        BackendTotals {
            requests,
            errors,
            ..BackendTotals::default()
        }
    }

    #[test]
    fn the_first_look_is_at_the_first_step_until_its_interval_ends() {
        let (p, first) = Promotion::start(settings());
        assert_eq!(first.phase, Phase::Progressing);
        assert_eq!(first.step, Some(0));
        assert!((first.canary_share - 0.05).abs() < 1e-12, "{first:?}");
        assert_eq!(first.next, Some(Duration::from_secs(60)));
        assert_eq!(p.stable().name, "stable");
    }

    #[test]
    fn steps_pass_on_interval_and_requests_and_the_promotion_completes() {
        let (mut p, _) = Promotion::start(settings());
        let l = p.look(Duration::from_secs(60), &totals(99, 0), &totals(1_900, 9));
        assert_eq!(l.step, Some(0), "99 of the 100 requests: {l:?}");
        assert_eq!(l.next, Some(Duration::from_secs(61)));
        let l = p.look(Duration::from_secs(61), &totals(100, 0), &totals(1_900, 9));
        assert_eq!(l.step, Some(1));
        assert!((l.canary_share - 0.5).abs() < 1e-12);
        let l = p.look(
            Duration::from_secs(121),
            &totals(400, 1),
            &totals(2_200, 10),
        );
        assert_eq!((l.step, l.canary_share), (Some(2), 1.0));
        let l = p.look(
            Duration::from_secs(181),
            &totals(700, 2),
            &totals(2_200, 10),
        );
        assert_eq!(l.phase, Phase::Complete);
        assert_eq!(l.next, None);
    }

    #[test]
    fn a_canary_failing_everything_is_rolled_back_before_min_requests() {
        let (mut p, _) = Promotion::start(settings());
        let l = p.look(Duration::from_millis(300), &totals(3, 3), &totals(57, 0));
        assert_eq!(l.phase, Phase::RolledBack);
        assert_eq!(l.canary_share, 0.0);
        assert!(p.message().contains("rolled back"), "{}", p.message());
    }
}
