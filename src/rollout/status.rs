//! A rollout as the policy's status shows it (`status.rollouts[]`), which
//! is also what is persisted: a recorded rollout and the current spec are
//! enough to know what to serve ([`super::Rollout::served`]).
//!
//! `from`, `to` and `served` list each backend by the backendRef's fields
//! (`name`, `namespace`, `port`; `group` and `kind` only when not a core
//! Service) with its exact `weight` (what a resumed rollout computes with)
//! and its `share` in percent (what a person reads: `99.5%`). Backends are
//! named, not indexed: adding or removing a backendRef moves the others.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::gates::GateReport;
use super::machine::{Phase, PolicyKey, Rollout, Rollouts, RuleKey, StepCounts, duration_text};
use super::shares::{BackendShare, Weights};
use crate::resources::{Percent, RolloutPolicy};
use crate::route::RouteKind;

/// One entry of a RolloutPolicy's `status.rollouts`: one governed rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The HTTPRoute (in the policy's namespace: targetRefs are local).
    pub route: String,
    /// The rule's index in the route.
    pub rule: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    pub phase: Phase,
    /// The step reached (`"5%"`); absent before the first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Its index in `spec.steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_index: Option<usize>,
    /// RFC 3339, with sub-second precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<String>,
    /// The shares served just before the weights changed.
    pub from: Vec<BackendShare>,
    /// The spec shares.
    pub to: Vec<BackendShare>,
    /// The shares served now.
    #[serde(default)]
    pub served: Vec<BackendShare>,
    /// The incoming backends' responses counted in this step.
    #[serde(default)]
    pub requests: u64,
    /// Of those, 5xx (including the 500/502/503/504 sluice answers for
    /// them).
    #[serde(default)]
    pub errors: u64,
    /// Of those, slower than `maxLatency` (counted when a latency gate is
    /// set).
    #[serde(default)]
    pub slow: u64,
    /// Their p99 latency in this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99: Option<String>,
    /// The outgoing backends' responses over the same time, and of those
    /// 5xx and slow: what `baseline: Stable` compares with.
    #[serde(default)]
    pub stable_requests: u64,
    #[serde(default)]
    pub stable_errors: u64,
    #[serde(default)]
    pub stable_slow: u64,
    /// With `consistentBy` (docs/rollouts.md, "Users"): the distinct users
    /// (consistent-users keys) the incoming backends answered in this
    /// step, and of those the users that got at least one 5xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_users: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_users_with_errors: Option<u64>,
    /// The outgoing backends' over the same time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_users: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_users_with_errors: Option<u64>,
    /// The incoming backends' share of the step's users (`9.8%`), next to
    /// their share of its requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_users_share: Option<String>,
    /// Of `errors`, those that were a user's repeated errors in the step
    /// (the error gates judge each user's first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated_errors: Option<u64>,
    /// Some user count is an estimate (more than 4096 users on a backend
    /// in the step; 1.6% standard error).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub users_estimated: bool,
    /// Each gate: the counts its test judged (since the first step), its
    /// evidence, and what this step's counts could catch ("a 3x 5xx rate
    /// would be caught at 99%").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<GateReport>,
    pub message: String,
    /// Paused after a failed gate: the fingerprint of the policy's spec
    /// then (another spec resumes the rollout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_for_spec: Option<String>,
}

impl RolloutStatus {
    pub fn new(rollout: &Rollout, step_index: Option<usize>, counts: StepCounts) -> RolloutStatus {
        RolloutStatus {
            route: rollout.rule.route.clone(),
            rule: rollout.rule.rule,
            rule_name: rollout.rule_name.clone(),
            phase: rollout.phase,
            step: rollout.step.map(|p| p.to_string()),
            step_index,
            step_started_at: rollout.step_started_at.map(|t| t.to_string()),
            from: rollout.from.to_shares(),
            to: rollout.to.to_shares(),
            served: rollout.served().to_shares(),
            requests: counts.requests,
            errors: counts.errors,
            slow: counts.slow,
            latency_p99: counts.p99.map(duration_text),
            stable_requests: counts.stable_requests,
            stable_errors: counts.stable_errors,
            stable_slow: counts.stable_slow,
            canary_users: counts.users.map(|u| u.canary),
            canary_users_with_errors: counts.users.map(|u| u.canary_with_errors),
            stable_users: counts.users.map(|u| u.stable),
            stable_users_with_errors: counts.users.map(|u| u.stable_with_errors),
            canary_users_share: counts.users.and_then(|u| u.canary_share()),
            repeated_errors: counts.users.map(|u| u.canary_repeated_errors),
            users_estimated: counts.users.is_some_and(|u| u.estimated),
            evidence: counts.gates,
            message: rollout.message.clone(),
            paused_for_spec: rollout.held_for.map(|f| format!("{f:016x}")),
        }
    }

    /// The recorded rollout of `policy` this entry describes.
    pub fn rollout(&self, policy: &PolicyKey) -> Result<Rollout, String> {
        let what = || {
            format!(
                "rollout of {policy} for HTTPRoute {} rule {}",
                self.route, self.rule
            )
        };
        let step = self
            .step
            .as_deref()
            .map(Percent::parse)
            .transpose()
            .map_err(|e| format!("{}: step: {e}", what()))?;
        let step_started_at = self
            .step_started_at
            .as_deref()
            .map(str::parse::<Timestamp>)
            .transpose()
            .map_err(|e| format!("{}: stepStartedAt: {e}", what()))?;
        let held_for = self
            .paused_for_spec
            .as_deref()
            .map(|f| u64::from_str_radix(f, 16))
            .transpose()
            .map_err(|e| format!("{}: pausedForSpec: {e}", what()))?;
        Ok(Rollout {
            policy: policy.clone(),
            // A RolloutPolicy's targetRefs are HTTPRoutes.
            rule: RuleKey {
                kind: RouteKind::Http,
                namespace: policy.namespace.clone(),
                route: self.route.clone(),
                rule: self.rule,
            },
            rule_name: self.rule_name.clone(),
            phase: self.phase,
            step,
            step_started_at,
            from: Weights::from_shares(&self.from),
            to: Weights::from_shares(&self.to),
            held_for,
            message: self.message.clone(),
        })
    }
}

/// Every rollout's status by policy, and whether the state is saved: what
/// the serve loop publishes next to translate's status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutReport {
    pub policies: BTreeMap<PolicyKey, Vec<RolloutStatus>>,
    /// Why the rollout state could not be saved, and since when.
    pub not_saved: Option<(String, Timestamp)>,
}

impl RolloutReport {
    pub fn new(rollouts: &Rollouts, not_saved: Option<(String, Timestamp)>) -> RolloutReport {
        let mut policies: BTreeMap<PolicyKey, Vec<RolloutStatus>> = BTreeMap::new();
        for (rollout, index, counts) in rollouts.report() {
            policies
                .entry(rollout.policy.clone())
                .or_default()
                .push(RolloutStatus::new(&rollout, index, counts));
        }
        RolloutReport {
            policies,
            not_saved,
        }
    }

    /// Complete a RolloutPolicy's status (translate's `ancestors`) with its
    /// `rollouts` and, when the state cannot be saved, a `StateSaved=False`
    /// condition on every ancestor.
    pub fn complete(&self, policy: &PolicyKey, status: &mut Value) {
        let Value::Object(map) = status else {
            return;
        };
        let rollouts = self.policies.get(policy).cloned().unwrap_or_default();
        map.insert(
            "rollouts".into(),
            serde_json::to_value(rollouts).unwrap_or(Value::Array(Vec::new())),
        );
        let Some((message, since)) = &self.not_saved else {
            return;
        };
        let Some(Value::Array(ancestors)) = map.get_mut("ancestors") else {
            return;
        };
        for ancestor in ancestors {
            let Some(Value::Array(conditions)) = ancestor.get_mut("conditions") else {
                continue;
            };
            let generation = conditions
                .iter()
                .find_map(|c| c.get("observedGeneration").cloned())
                .unwrap_or(Value::Null);
            conditions.retain(|c| c["type"] != "StateSaved");
            conditions.push(json!({
                "type": "StateSaved",
                "status": "False",
                "reason": "StateNotWritable",
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": since.to_string(),
            }));
        }
    }
}

/// The rollouts recorded in the policies' `status.rollouts` (Kubernetes
/// mode: written by the leader): as records (what a replica serves, and a
/// new leader continues from) and as the status shows them. Entries that
/// cannot be read are left out and named in the third value.
pub fn recorded(policies: &[RolloutPolicy]) -> (Vec<Rollout>, RolloutReport, Vec<String>) {
    let mut records = Vec::new();
    let mut report = RolloutReport::default();
    let mut problems = Vec::new();
    for policy in policies {
        let key = PolicyKey {
            namespace: policy
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| crate::resources::DEFAULT_NAMESPACE.into()),
            name: policy.metadata.name.clone().unwrap_or_default(),
        };
        let entries = policy
            .status
            .as_ref()
            .and_then(|s| s.get("rollouts"))
            .and_then(Value::as_array);
        for (i, entry) in entries.into_iter().flatten().enumerate() {
            let read = serde_json::from_value::<RolloutStatus>(entry.clone())
                .map_err(|e| e.to_string())
                .and_then(|status| Ok((status.rollout(&key)?, status)));
            match read {
                Ok((rollout, status)) => {
                    records.push(rollout);
                    report.policies.entry(key.clone()).or_default().push(status);
                }
                Err(e) => problems.push(format!(
                    "RolloutPolicy {key} status.rollouts[{i}] cannot be read: {e}"
                )),
            }
        }
    }
    (records, report, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::BackendKey;

    fn rollout() -> Rollout {
        let key = |n: &str| BackendKey::service("shop", n, Some(80));
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
            rule: RuleKey {
                kind: RouteKind::Http,
                namespace: "shop".into(),
                route: "r".into(),
                rule: 1,
            },
            rule_name: Some("main".into()),
            phase: Phase::Paused,
            step: Percent::parse("5%").ok(),
            step_started_at: "2024-05-01T10:00:00.25Z".parse().ok(),
            from,
            to,
            held_for: Some(0xabc),
            message: "m".into(),
        }
    }

    #[test]
    fn a_status_entry_round_trips_to_the_same_rollout() {
        let r = rollout();
        let status = RolloutStatus::new(
            &r,
            Some(1),
            StepCounts {
                requests: 240,
                errors: 18,
                p99: Some(std::time::Duration::from_millis(12)),
                stable_requests: 4_560,
                stable_errors: 20,
                ..StepCounts::default()
            },
        );
        let json = serde_json::to_value(&status).expect("serializes");
        assert_eq!(json["phase"], "Paused");
        assert_eq!(json["step"], "5%");
        assert_eq!(json["stepIndex"], 1);
        assert_eq!(json["stepStartedAt"], "2024-05-01T10:00:00.25Z");
        assert_eq!(json["served"][0]["share"], "95%");
        assert_eq!(json["served"][1]["share"], "5%");
        assert_eq!(json["latencyP99"], "12ms");
        assert_eq!(json["stableRequests"], 4_560);
        assert_eq!(json["stableErrors"], 20);
        let back: RolloutStatus = serde_json::from_value(json).expect("parses");
        assert_eq!(back.rollout(&r.policy), Ok(r));
    }

    #[test]
    fn the_recorded_rollouts_are_read_from_the_policies_status() {
        let r = rollout();
        let entry = RolloutStatus::new(&r, Some(1), StepCounts::default());
        let policy: RolloutPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io",
                "kind": "HTTPRoute", "name": "r"}], "steps": ["100%"], "interval": "1s"},
            "status": {"ancestors": [], "rollouts": [entry, {"route": "r", "rule": 0,
                "phase": "Sideways", "from": [], "to": [], "message": ""}]},
        }))
        .expect("a policy");
        let (records, report, problems) = recorded(&[policy]);
        assert_eq!(records, std::slice::from_ref(&r));
        assert_eq!(report.policies[&r.policy][0].step.as_deref(), Some("5%"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("RolloutPolicy shop/p status.rollouts[1]"),
            "{problems:?}"
        );
    }

    #[test]
    fn the_report_completes_a_policy_status() {
        let rollouts = Rollouts::restore([rollout()]);
        let since: Timestamp = "2024-05-01T10:00:00Z".parse().expect("time");
        let report = RolloutReport::new(&rollouts, Some(("cannot write".into(), since)));
        let mut status = json!({"ancestors": [{"ancestorRef": {"name": "gw"}, "conditions": [
            {"type": "Accepted", "status": "True", "observedGeneration": 3}]}]});
        report.complete(&rollout().policy, &mut status);
        assert_eq!(status["rollouts"][0]["route"], "r");
        let saved = &status["ancestors"][0]["conditions"][1];
        assert_eq!(saved["type"], "StateSaved");
        assert_eq!(saved["status"], "False");
        assert_eq!(saved["observedGeneration"], 3);
        // A policy without rollouts gets an empty list.
        let mut other = json!({"ancestors": []});
        report.complete(
            &PolicyKey {
                namespace: "x".into(),
                name: "y".into(),
            },
            &mut other,
        );
        assert_eq!(other["rollouts"], json!([]));
    }
}
