//! Publishing this replica's rollout counts (Kubernetes mode), so that the
//! leader judges the whole fleet's traffic, not its own ~1/N of it.
//!
//! Each replica writes one `coordination.k8s.io/v1` Lease in the leader
//! lease's namespace, `sluice-counts-<identity>` (label [`LABEL`]): its
//! counts per step served ([`Publication`], JSON in the [`ANNOTATION`]
//! annotation), `spec.holderIdentity` the replica and `spec.renewTime`
//! when the counts were taken. One server-side apply under
//! [`FIELD_MANAGER`] creates or updates it. Why a Lease: it is the API's
//! object for small, frequently renewed per-holder records (kubelets
//! renew one per node every 10 s), its writes trigger no other controller
//! and no watch of the gateway's configuration, and RBAC grants it in one
//! namespace (`deploy/rbac.yaml`). See `docs/rollouts.md`.
//!
//! The rate is bounded: at most one write per [`interval`] (default
//! [`DEFAULT_INTERVAL`]; [`INTERVAL_ENV`] sets another, for tests), and
//! only while a rollout this replica serves is at a step, the counts
//! changed since the last write, and the replica is not the leader (the
//! leader reads its own counters live). A write that fails is logged and
//! retried at the next interval with the counts of then; serving never
//! waits for it. On shutdown the replica deletes its Lease (best effort:
//! a Lease left behind holds counts of steps that are over, never summed
//! into another step).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::metrics::{BackendStatsKey, BackendTotals, Metrics};
use crate::rollout::fleet::{Publication, StepCounter};
use crate::rollout::{BackendKey, Rollout, RolloutReport, RuleKey};

/// Label of every counts Lease (what the leader's watch selects).
pub const LABEL: &str = "sluice.dev/rollout-counts";
/// Annotation holding the counts ([`Publication`] as JSON).
pub const ANNOTATION: &str = "sluice.dev/rollout-counts";
/// Field manager of the counts writes.
pub const FIELD_MANAGER: &str = "sluice.dev/rollout-counts";
/// How often a replica publishes its counts while a rollout is at a step.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Environment variable setting another interval (a Gateway API duration:
/// `500ms`, `5s`); not a flag: tests need it, operators should not.
pub const INTERVAL_ENV: &str = "SLUICE_ROLLOUT_COUNTS_INTERVAL";

/// The publishing interval: [`INTERVAL_ENV`] when set and valid (at least
/// 100 ms), else [`DEFAULT_INTERVAL`].
pub fn interval() -> Duration {
    let Ok(text) = std::env::var(INTERVAL_ENV) else {
        return DEFAULT_INTERVAL;
    };
    match crate::resources::parse_gateway_duration(&text) {
        Ok(d) if d >= Duration::from_millis(100) => d,
        Ok(_) => {
            tracing::warn!("{INTERVAL_ENV}={text:?} is below 100ms; publishing every 5s");
            DEFAULT_INTERVAL
        }
        Err(error) => {
            tracing::warn!("{INTERVAL_ENV}: {error}; publishing every 5s");
            DEFAULT_INTERVAL
        }
    }
}

/// Where and as whom this replica publishes.
#[derive(Debug, Clone)]
pub struct CountsConfig {
    pub namespace: String,
    /// The Lease's name ([`lease_name`]).
    pub name: String,
    /// The replica (the leader lease's identity).
    pub identity: String,
    /// This process ([`incarnation`]).
    pub incarnation: String,
    pub interval: Duration,
}

impl CountsConfig {
    pub fn new(namespace: &str, identity: &str) -> CountsConfig {
        CountsConfig {
            namespace: namespace.to_string(),
            name: lease_name(identity),
            identity: identity.to_string(),
            incarnation: incarnation(),
            interval: interval(),
        }
    }
}

/// `sluice-counts-<identity>`, made a valid object name (lowercase
/// alphanumerics, `-` and `.`, at most 253 characters, alphanumeric at
/// both ends).
pub fn lease_name(identity: &str) -> String {
    let cleaned: String = identity
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("sluice-counts-{cleaned}");
    name.truncate(253);
    let end = name
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .len();
    name.truncate(end);
    name
}

/// Unique per process: the process id and the time it started counting.
pub fn incarnation() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Timestamp::now().as_nanosecond()
    )
}

/// The Lease that carries `publication`, as a server-side apply body.
pub fn lease_body(config: &CountsConfig, publication: &Publication, now: Timestamp) -> Value {
    let duration = i64::try_from(config.interval.as_secs().max(1) * 3).unwrap_or(i64::MAX);
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": config.name,
            "namespace": config.namespace,
            "labels": {LABEL: "true", "app.kubernetes.io/name": "sluice"},
            "annotations": {
                ANNOTATION: serde_json::to_string(publication).unwrap_or_default(),
            },
        },
        "spec": {
            "holderIdentity": config.identity,
            "renewTime": serde_json::to_value(MicroTime(now)).unwrap_or(Value::Null),
            "leaseDurationSeconds": duration,
        },
    })
}

/// The recorded rollouts of a report (what this replica serves).
fn records(report: &RolloutReport) -> Vec<Rollout> {
    report
        .policies
        .iter()
        .flat_map(|(policy, entries)| entries.iter().filter_map(|e| e.rollout(policy).ok()))
        .collect()
}

/// This process's counters of `backend` in `rule`.
fn local(metrics: &Metrics, rule: &RuleKey, backend: &BackendKey) -> BackendTotals {
    metrics.backend_total(&BackendStatsKey {
        kind: rule.kind.metrics_prefix(),
        namespace: rule.namespace.clone(),
        route: rule.route.clone(),
        rule: rule.rule,
        backend: backend.to_string(),
    })
}

/// Publish this replica's counts until `shutdown`: follow the rollouts it
/// serves (`rollouts`, read out of each value of `served` by `read`) and,
/// while one is at a step and this replica does not lead, write its counts
/// at most once per interval.
pub async fn run<S, F>(
    client: Client,
    config: CountsConfig,
    metrics: Arc<Metrics>,
    mut served: watch::Receiver<S>,
    read: F,
    leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: Send + Sync + 'static,
    F: Fn(&S) -> Option<Arc<RolloutReport>>,
{
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let totals = |rule: &RuleKey, backend: &BackendKey| local(&metrics, rule, backend);
    let mut counter = StepCounter::default();
    let mut ticks = tokio::time::interval(config.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut written: Option<Publication> = None;
    let mut ever_written = false;
    let mut failing = false;
    tracing::info!(lease = %config.name, namespace = %config.namespace,
        interval = ?config.interval, "publishing this replica's rollout counts while a rollout is at a step");
    loop {
        tokio::select! {
            changed = served.changed() => {
                if changed.is_err() {
                    return;
                }
                let report = read(&served.borrow_and_update());
                if let Some(report) = report {
                    counter.follow(&records(&report), &totals);
                }
            }
            _ = ticks.tick() => {
                if *leader.borrow() || !counter.in_flight() {
                    continue;
                }
                let publication = counter.publication(&config.incarnation, &totals);
                if written.as_ref() == Some(&publication) {
                    continue;
                }
                let body = lease_body(&config, &publication, Timestamp::now());
                let params = PatchParams::apply(FIELD_MANAGER).force();
                let patch = Patch::Apply(&body);
                let write = api.patch(&config.name, &params, &patch);
                match tokio::time::timeout(config.interval, write).await {
                    Ok(Ok(_)) => {
                        written = Some(publication);
                        ever_written = true;
                        if std::mem::take(&mut failing) {
                            tracing::info!(lease = %config.name, "rollout counts published again");
                        }
                    }
                    Ok(Err(error)) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(lease = %config.name, %error,
                                "cannot publish this replica's rollout counts; retrying every interval (serving goes on)");
                        }
                    }
                    Err(_) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(lease = %config.name,
                                "publishing this replica's rollout counts timed out; retrying every interval (serving goes on)");
                        }
                    }
                }
            }
            _ = crate::shutdown::stopped(&mut shutdown) => {
                if ever_written {
                    let params = DeleteParams::default();
                    let delete = api.delete(&config.name, &params);
                    match tokio::time::timeout(Duration::from_secs(1), delete).await {
                        Ok(Ok(_)) => tracing::debug!(lease = %config.name, "rollout counts withdrawn"),
                        Ok(Err(error)) => tracing::debug!(%error, "cannot delete the rollout counts lease"),
                        Err(_) => tracing::debug!("deleting the rollout counts lease timed out"),
                    }
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_object_names() {
        assert_eq!(
            lease_name("sluice-7d9f-abc-1"),
            "sluice-counts-sluice-7d9f-abc-1"
        );
        assert_eq!(lease_name("Host_Name-42"), "sluice-counts-host-name-42");
        assert_eq!(lease_name("pod-"), "sluice-counts-pod");
        let long = lease_name(&"a".repeat(400));
        assert_eq!(long.len(), 253);
    }

    #[test]
    fn the_lease_carries_the_counts_and_the_label_the_leader_selects() {
        let config = CountsConfig {
            namespace: "sluice-system".into(),
            name: lease_name("pod-b"),
            identity: "pod-b".into(),
            incarnation: "1-2".into(),
            interval: Duration::from_secs(5),
        };
        let publication = Publication {
            incarnation: "1-2".into(),
            steps: Vec::new(),
        };
        let now: Timestamp = "2026-12-02T11:00:00.5Z".parse().expect("a time");
        let body = lease_body(&config, &publication, now);
        assert_eq!(body["metadata"]["name"], "sluice-counts-pod-b");
        assert_eq!(body["metadata"]["labels"][LABEL], "true");
        let text = body["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .expect("the counts as a string");
        assert_eq!(
            serde_json::from_str::<Publication>(text).expect("parses"),
            publication
        );
        assert_eq!(body["spec"]["holderIdentity"], "pod-b");
        assert_eq!(body["spec"]["renewTime"], "2026-12-02T11:00:00.500000Z");
        assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
    }
}
