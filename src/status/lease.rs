//! Leader election on a coordination.k8s.io Lease.
//!
//! Every replica serves traffic from its own watches; the lease only decides
//! which one writes status. The algorithm is client-go's: the holder renews
//! `spec.renewTime` every third of the lease duration; another replica takes
//! the lease over once it has seen the same record unchanged for a whole
//! lease duration (measured on its own clock, so clock skew between nodes
//! does not matter); writes are optimistic (`resourceVersion`), so two
//! candidates never both win. A holder that fails to renew stops writing at
//! once, before anyone else can take over. On shutdown the holder releases
//! the lease so that the next one takes over without waiting.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

/// Which lease, who we are, and how long a lease lasts.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (the pod name).
    pub identity: String,
    pub duration: Duration,
}

/// The parts of a lease record whose change proves its holder alive.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: Option<i32>,
}

/// One replica's candidacy.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The last record seen, and when it was first seen.
    observed: Option<(Record, Instant)>,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Acquire, renew or observe the lease once. Returns whether this
    /// replica holds it now.
    pub async fn round(&mut self) -> bool {
        let now = Instant::now();
        let lease = match self.api.get_opt(&self.config.name).await {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, lease = %self.config.name, "cannot read the leader lease");
                return false;
            }
        };
        let Some(mut lease) = lease else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.held_spec(0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    tracing::info!(identity = %self.config.identity, "acquired the leader lease (created)");
                    true
                }
                Err(error) => {
                    tracing::debug!(%error, "lost the race to create the leader lease");
                    false
                }
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions,
        };
        if self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| *seen != record)
        {
            self.observed = Some((record.clone(), now));
        }
        let ours = record.holder.as_deref() == Some(self.config.identity.as_str());
        let lease_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.duration, Duration::from_secs);
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, since)| now.duration_since(*since) >= lease_duration);
        let transitions = spec.lease_transitions.unwrap_or(0);
        let new_spec = if ours {
            LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::now())),
                lease_duration_seconds: Some(self.duration_seconds()),
                ..spec
            }
        } else if record.holder.is_none() || expired {
            self.held_spec(transitions.saturating_add(1))
        } else {
            return false;
        };
        lease.spec = Some(new_spec);
        // `replace` carries the resourceVersion read: a concurrent write by
        // another candidate makes this one fail with 409 Conflict.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !ours {
                    tracing::info!(
                        identity = %self.config.identity,
                        previous = ?record.holder,
                        "acquired the leader lease"
                    );
                }
                true
            }
            Err(error) => {
                tracing::debug!(%error, "cannot write the leader lease");
                false
            }
        }
    }

    fn held_spec(&self, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Give the lease up if we hold it (best effort, on shutdown).
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!("released the leader lease"),
            Err(error) => tracing::debug!(%error, "cannot release the leader lease"),
        }
    }
}

/// Run the candidacy until `shutdown`: publish whether we lead on `leader`,
/// renewing every third of the lease duration; release the lease at the end.
pub async fn run(
    mut elector: LeaderElector,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = (elector.config.duration / 3).max(Duration::from_millis(100));
    loop {
        // A round that hangs counts as a failed renewal: stop writing before
        // another replica may take over.
        let leading = tokio::time::timeout(period, elector.round())
            .await
            .unwrap_or(false);
        leader.send_if_modified(|l| std::mem::replace(l, leading) != leading);
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = crate::shutdown::stopped(&mut shutdown) => {
                let was_leading = *leader.borrow();
                leader.send_replace(false);
                if was_leading {
                    elector.release().await;
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request, Response};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use serde_json::{Value, json};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn elector(identity: &str) -> (LeaderElector, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let config = LeaseConfig {
            namespace: "sluice-system".into(),
            name: "sluice".into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
        };
        (
            LeaderElector::new(Client::new(service, "default"), config),
            handle,
        )
    }

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/sluice-system/leases";

    async fn expect(
        handle: &mut Handle,
        method: Method,
        path: &str,
        code: u16,
        reply: Value,
    ) -> Value {
        let (request, respond) = handle.next_request().await.expect("a request");
        assert_eq!(request.method(), method);
        assert_eq!(request.uri().path(), path);
        let bytes = request
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        respond.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                .expect("a response"),
        );
        body
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "not found"})
    }

    fn lease(holder: &str, rv: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "sluice", "namespace": "sluice-system", "resourceVersion": rv},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                        "renewTime": "2024-01-01T00:00:00.000000Z", "leaseTransitions": 0}})
    }

    #[tokio::test]
    async fn a_missing_lease_is_created_and_held() {
        let (mut elector, mut handle) = elector("pod-a");
        let server = tokio::spawn(async move {
            expect(
                &mut handle,
                Method::GET,
                &format!("{PATH}/sluice"),
                404,
                not_found(),
            )
            .await;
            let created = expect(&mut handle, Method::POST, PATH, 201, lease("pod-a", "1")).await;
            assert_eq!(created["spec"]["holderIdentity"], "pod-a");
            assert_eq!(created["spec"]["leaseDurationSeconds"], 15);
            // Renewal keeps the resourceVersion read (optimistic write).
            expect(
                &mut handle,
                Method::GET,
                &format!("{PATH}/sluice"),
                200,
                lease("pod-a", "1"),
            )
            .await;
            let renewed = expect(
                &mut handle,
                Method::PUT,
                &format!("{PATH}/sluice"),
                200,
                lease("pod-a", "2"),
            )
            .await;
            assert_eq!(renewed["metadata"]["resourceVersion"], "1");
            assert_ne!(renewed["spec"]["renewTime"], "2024-01-01T00:00:00.000000Z");
        });
        assert!(elector.round().await);
        assert!(elector.round().await);
        server.await.expect("the mock does not panic");
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_lease_of_another_replica_is_left_alone_until_it_expires() {
        let (mut elector, mut handle) = elector("pod-b");
        let server = tokio::spawn(async move {
            // Seen for the first time: not ours, not expired, no write.
            expect(
                &mut handle,
                Method::GET,
                &format!("{PATH}/sluice"),
                200,
                lease("pod-a", "7"),
            )
            .await;
            // Unchanged for a whole lease duration: taken over.
            expect(
                &mut handle,
                Method::GET,
                &format!("{PATH}/sluice"),
                200,
                lease("pod-a", "7"),
            )
            .await;
            let taken = expect(
                &mut handle,
                Method::PUT,
                &format!("{PATH}/sluice"),
                200,
                lease("pod-b", "8"),
            )
            .await;
            assert_eq!(taken["spec"]["holderIdentity"], "pod-b");
            assert_eq!(taken["spec"]["leaseTransitions"], 1);
            assert_eq!(taken["metadata"]["resourceVersion"], "7");
        });
        assert!(!elector.round().await);
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(elector.round().await);
        server.await.expect("the mock does not panic");
    }

    #[tokio::test]
    async fn losing_the_write_race_is_not_leading() {
        let (mut elector, mut handle) = elector("pod-b");
        let server = tokio::spawn(async move {
            let mut released = lease("", "3");
            released["spec"]["holderIdentity"] = Value::Null;
            expect(
                &mut handle,
                Method::GET,
                &format!("{PATH}/sluice"),
                200,
                released,
            )
            .await;
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": "Conflict", "code": 409, "message": "modified"});
            expect(
                &mut handle,
                Method::PUT,
                &format!("{PATH}/sluice"),
                409,
                conflict,
            )
            .await;
        });
        assert!(!elector.round().await);
        server.await.expect("the mock does not panic");
    }
}
