//! The watch of the other replicas' rollout counts (Kubernetes mode): the
//! counts Leases every replica publishes (`crate::status::counts`), taken
//! into the [`Fleet`] the leader adds to its own counters.
//!
//! Every replica watches them (a few small objects in one namespace), so
//! that a replica winning the lease has them at once. Only Leases with the
//! counts label are read (the label selector, checked again here); one
//! whose annotation cannot be read is logged once and left out. A deleted
//! Lease changes nothing: what its replica counted stays summed for the
//! step. A failed watch is retried with the watcher's backoff; a relist
//! delivers the same publications again, which add nothing.
//!
//! A replica that died without deleting its Lease leaves it behind; the
//! leader deletes counts Leases not renewed for [`STALE_AFTER`] (a live
//! replica's is only written while its counts change, and is written again
//! when they do).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::rollout::fleet::{Fleet, Publication};
use crate::status::counts::{ANNOTATION, LABEL};

/// The publication a counts Lease carries: `(name, publication)`, or why
/// it cannot be read; `None` for a Lease that is not a counts Lease.
pub fn publication(lease: &Lease) -> Option<Result<(String, Publication), String>> {
    let meta = &lease.metadata;
    meta.labels.as_ref()?.get(LABEL)?;
    let name = meta.name.clone().unwrap_or_default();
    let Some(text) = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) else {
        return Some(Err(format!("Lease {name}: no {ANNOTATION} annotation")));
    };
    Some(
        serde_json::from_str::<Publication>(text)
            .map(|p| (name.clone(), p))
            .map_err(|e| format!("Lease {name}: annotation {ANNOTATION}: {e}")),
    )
}

/// A counts Lease not renewed for this long is a gone replica's.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// The counts Leases of `renewed` (name, last renewal) renewed last before
/// `now - STALE_AFTER`, other than `own`.
pub fn stale(renewed: &BTreeMap<String, Timestamp>, own: &str, now: Timestamp) -> Vec<String> {
    let stale_after = i128::try_from(STALE_AFTER.as_nanos()).unwrap_or(i128::MAX);
    renewed
        .iter()
        .filter(|(name, at)| *name != own && now.as_nanosecond() - at.as_nanosecond() > stale_after)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Watch the counts Leases of `namespace` into `fleet` until `shutdown`;
/// while leading (`leader`), delete the stale ones (not `own`).
pub async fn run(
    client: Client,
    namespace: String,
    own: String,
    fleet: Fleet,
    leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(LABEL);
    let mut events = watcher::watcher(api.clone(), config)
        .default_backoff()
        .boxed();
    // Leases whose counts could not be read, as last logged.
    let mut unreadable = BTreeSet::new();
    // Every counts Lease's last renewal.
    let mut renewed = BTreeMap::new();
    let mut sweep = tokio::time::interval(STALE_AFTER / 4);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Apply(lease) | Event::InitApply(lease))) => {
                    if let (Some(name), Some(at)) = (
                        lease.metadata.name.clone(),
                        lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()),
                    ) {
                        renewed.insert(name, at.0);
                    }
                    match publication(&lease) {
                        Some(Ok((name, publication))) => {
                            unreadable.remove(&name);
                            fleet.absorb(&name, &publication);
                        }
                        Some(Err(problem))
                            if unreadable.insert(lease.metadata.name.clone().unwrap_or_default()) =>
                        {
                            tracing::warn!("rollout counts: {problem}; left out of the sums");
                        }
                        Some(Err(_)) | None => {}
                    }
                }
                Some(Ok(Event::Delete(lease))) => {
                    renewed.remove(lease.metadata.name.as_deref().unwrap_or_default());
                }
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "watch of the rollout counts failed; retrying (the leader judges the counts it has)");
                }
                None => return,
            },
            _ = sweep.tick(), if *leader.borrow() => {
                for name in stale(&renewed, &own, Timestamp::now()) {
                    let params = DeleteParams::default();
                    let delete = api.delete(&name, &params);
                    match tokio::time::timeout(Duration::from_secs(5), delete).await {
                        Ok(Ok(_)) => {
                            tracing::info!(lease = %name, "deleted a gone replica's rollout counts");
                            renewed.remove(&name);
                        }
                        Ok(Err(error)) => tracing::debug!(lease = %name, %error,
                            "cannot delete a gone replica's rollout counts; asked again later"),
                        Err(_) => tracing::debug!(lease = %name,
                            "deleting a gone replica's rollout counts timed out; asked again later"),
                    }
                }
            }
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(labels: serde_json::Value, annotations: serde_json::Value) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "sluice-counts-b", "namespace": "sluice-system",
                         "labels": labels, "annotations": annotations},
        }))
        .expect("a Lease")
    }

    #[test]
    fn the_leases_of_gone_replicas_are_stale() {
        let at = |t: &str| t.parse::<Timestamp>().expect("a time");
        let renewed = BTreeMap::from([
            ("sluice-counts-a".to_string(), at("2026-12-02T09:00:00Z")),
            ("sluice-counts-b".to_string(), at("2026-12-02T09:00:00Z")),
            ("sluice-counts-c".to_string(), at("2026-12-02T10:30:00Z")),
        ]);
        let now = at("2026-12-02T11:00:00Z");
        assert_eq!(stale(&renewed, "sluice-counts-a", now), ["sluice-counts-b"]);
    }

    #[test]
    fn only_counts_leases_are_read_and_a_bad_one_is_named() {
        let leader = lease(json!({}), json!({}));
        assert!(
            publication(&leader).is_none(),
            "the leader lease is not counts"
        );
        let good = lease(
            json!({LABEL: "true"}),
            json!({ANNOTATION: r#"{"incarnation": "1-2", "steps": []}"#}),
        );
        let (name, p) = publication(&good)
            .expect("a counts lease")
            .expect("readable");
        assert_eq!(name, "sluice-counts-b");
        assert_eq!(p.incarnation, "1-2");
        let bad = lease(json!({LABEL: "true"}), json!({ANNOTATION: "{"}));
        let problem = publication(&bad).expect("a counts lease").unwrap_err();
        assert!(
            problem.starts_with("Lease sluice-counts-b: annotation sluice.dev/rollout-counts:"),
            "{problem}"
        );
    }
}
