//! The Kubernetes source: watches on the API server instead of files.
//!
//! One kube-rs watcher per kind ([`WATCHED_KINDS`]) feeds a [`ClusterCache`];
//! whenever the cache changes, a complete [`SourceUpdate`] is handed to the
//! serve loop, the same value the file source produces, so translate and the
//! proxy cannot tell the two modes apart.
//!
//! - Nothing is handed over before every kind has completed its first list.
//! - Bursts are coalesced: an update goes out once no event arrived for
//!   [`SourceOptions::debounce`], and at the latest [`SourceOptions::max_delay`]
//!   after the first change it carries. A change of routes' status alone
//!   (the echo of every status the leader writes, 10,000 after a start with
//!   10,000 routes) waits [`SourceOptions::status_delay`], or goes with the
//!   next change of the configuration: it serves nothing new, and the
//!   serve loop hands it to the status writer without translating it.
//! - A watch that fails is retried with backoff; one that expires (410 Gone)
//!   is relisted by the watcher, and the cache swaps the relist in only when
//!   it is complete: the current table keeps serving meanwhile.
//! - ListenerSet, BackendTLSPolicy, GRPCRoute, TLSRoute and RolloutPolicy
//!   (`sluice.dev`, watched with its status: followers serve the rollouts
//!   the leader recorded there) are optional:
//!   their CRDs may not be installed. A 404 on their list or watch counts as an empty list (logged
//!   once, at info), so such a cluster still becomes ready. The watcher keeps
//!   retrying with its backoff (at most every 30 s), so a CRD installed
//!   later is picked up without a restart. The core kinds stay mandatory: a
//!   cluster without them never becomes ready, and says why in the log.
//! - ConfigMaps (CA certificates) are watched cluster-wide, as Envoy Gateway
//!   does; the cache keeps only their `ca.crt` (see [`cache`]).
//! - The other replicas' rollout counts (Leases) are not configuration:
//!   [`counts`] watches them apart, into the leader's sums.
//! - With `--ingress-class`, Ingresses and IngressClasses are watched too
//!   ([`ingresses::INGRESS_KINDS`], mandatory) and the Ingresses of the
//!   class converted into every snapshot ([`ingresses`]); the conversion
//!   report is logged when it changes, and the Ingresses served are handed
//!   to the status writer (their `status.loadBalancer`).

pub mod cache;
pub mod counts;
pub mod ingresses;

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use cache::{Change, ClusterCache, WATCHED_KINDS, WatchedKind};
pub use ingresses::{INGRESS_KINDS, ServedIngress, ServedIngresses};

use crate::resources::crd::Crds;
use crate::source::SourceUpdate;
use crate::source::files::IngressServing;

/// How updates are paced.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// Quiet time after the last event before an update goes out.
    pub debounce: Duration,
    /// Longest an update waits for a burst to end.
    pub max_delay: Duration,
    /// How long an update that carries only routes' status waits (the
    /// echoes of the status the leader writes: 10,000 of them after a
    /// start with 10,000 routes). Nothing served changes with them; the
    /// status writer needs them before it writes the same route again.
    /// A configuration change sends them at once, with itself.
    pub status_delay: Duration,
    /// CRDs that validate the objects of the kinds they define (`--crds`).
    pub crds: Arc<Crds>,
    /// `--ingress-class`: serve the Ingresses of the class. The watches
    /// must then be those of [`kinds`]`(true)`.
    pub ingresses: Option<IngressServing>,
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            // A watch event is a whole object: the quiet time only gathers
            // the events of one `kubectl apply`, and events that arrive
            // while translate runs are coalesced anyway (the send waits).
            // A flip is served within milliseconds (docs/performance.md).
            debounce: Duration::from_millis(5),
            max_delay: Duration::from_secs(1),
            status_delay: Duration::from_millis(250),
            crds: Arc::default(),
            ingresses: None,
        }
    }
}

/// The events of one watched kind, tagged with its index in the kinds list.
type KindEvents = BoxStream<'static, (usize, Result<Event<DynamicObject>, watcher::Error>)>;

/// The kinds watched: [`WATCHED_KINDS`], and when Ingresses are served,
/// [`INGRESS_KINDS`] after them.
pub fn kinds(ingresses: bool) -> Vec<WatchedKind> {
    let mut kinds = WATCHED_KINDS.to_vec();
    if ingresses {
        kinds.extend(INGRESS_KINDS);
    }
    kinds
}

/// Watch every kind in [`WATCHED_KINDS`] cluster-wide.
pub fn watch_all(client: &Client) -> Vec<KindEvents> {
    watch_kinds(client, &WATCHED_KINDS)
}

/// Watch each of `kinds` cluster-wide, tagged with its index in `kinds`.
pub fn watch_kinds(client: &Client, kinds: &[WatchedKind]) -> Vec<KindEvents> {
    kinds
        .iter()
        .copied()
        .enumerate()
        .map(|(i, kind)| {
            let resource = ApiResource {
                group: kind.group.to_string(),
                version: kind.version.to_string(),
                api_version: kind.api_version(),
                kind: kind.kind.to_string(),
                plural: kind.plural.to_string(),
            };
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let mut config = watcher::Config::default();
            if let Some(fields) = kind.field_selector {
                config = config.fields(fields);
            }
            watcher::watcher(api, config)
                .default_backoff()
                .map(move |event| (i, event))
                .boxed()
        })
        .collect()
}

/// Run the source until `shutdown` turns true or `updates` is closed:
/// apply the watchers' events to a cache and send each complete snapshot.
///
/// `watches[i]` must carry the events of `kinds(options.ingresses.is_some())[i]`
/// (tests pass synthetic streams here). Sending waits for the serve loop to
/// take the previous update; events that arrive meanwhile are coalesced
/// into the next. When Ingresses are served, `served` gets the Ingresses
/// of each snapshot (for their status).
pub async fn run(
    watches: Vec<KindEvents>,
    options: SourceOptions,
    updates: mpsc::Sender<SourceUpdate>,
    served: Option<watch::Sender<Arc<ServedIngresses>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut cache = ClusterCache::new(&kinds(options.ingresses.is_some()))
        .with_crds(Arc::clone(&options.crds))
        .with_ingresses(options.ingresses.clone());
    // The last conversion report logged: logged again only when it changes.
    let mut logged_report: Option<Vec<String>> = None;
    let mut events = stream::select_all(watches);
    // (first unsent change, last change, whether one is of the configuration)
    let mut pending: Option<(Instant, Instant, bool)> = None;
    loop {
        let deadline = pending.map(|(first, last, configuration)| {
            if configuration {
                (last + options.debounce).min(first + options.max_delay)
            } else {
                first + options.status_delay.min(options.max_delay)
            }
        });
        tokio::select! {
            event = events.next() => match event {
                Some((kind, event)) => {
                    let change = apply(&mut cache, kind, event);
                    if change != Change::None {
                        let now = Instant::now();
                        let configuration = change == Change::Configuration;
                        pending = Some(match pending {
                            Some((first, _, before)) => (first, now, before || configuration),
                            None => (now, now, configuration),
                        });
                    }
                }
                None => {
                    tracing::warn!("every watch ended; configuration is no longer updated");
                    return;
                }
            },
            _ = sleep_until(deadline), if deadline.is_some() => {
                pending = None;
                if !cache.ready() {
                    // The last first list to complete is itself a change.
                    continue;
                }
                let (update, ingresses) = cache.update_with_ingresses();
                if let Some(ingresses) = &ingresses
                    && logged_report.as_ref() != Some(&ingresses.report)
                {
                    log_report(ingresses);
                    logged_report = Some(ingresses.report.clone());
                }
                tracing::debug!(objects = update.objects, "cluster configuration changed");
                tokio::select! {
                    sent = updates.send(update) => if sent.is_err() { return },
                    _ = crate::shutdown::stopped(&mut shutdown) => return,
                }
                // The Ingresses' status follows the configuration that
                // serves them, handed over just now.
                if let (Some(ingresses), Some(served)) = (ingresses, &served) {
                    served.send_if_modified(|current| {
                        let changed = **current != ingresses;
                        if changed {
                            *current = Arc::new(ingresses);
                        }
                        changed
                    });
                }
            }
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
    }
}

/// Log the conversion report of the served Ingresses, a line per
/// annotation per object, as `sluice convert ingress-nginx` prints it.
fn log_report(ingresses: &ServedIngresses) {
    tracing::info!(
        ingresses = ingresses.ingresses.len(),
        routes = ingresses.converted.len(),
        "Ingresses converted"
    );
    for (line, inexact) in ingresses.report.iter().zip(&ingresses.inexact) {
        if *inexact {
            tracing::warn!("ingress-nginx conversion: {line}");
        } else {
            tracing::info!("ingress-nginx conversion: {line}");
        }
    }
}

/// Apply one watcher event or error of kind number `kind` to the cache, and
/// log what deserves it. Returns what the snapshot's change was.
fn apply(
    cache: &mut ClusterCache,
    kind: usize,
    event: Result<Event<DynamicObject>, watcher::Error>,
) -> Change {
    let watched = cache.kind(kind).copied();
    let watched = watched.as_ref();
    let name = watched.map_or("?", |k| k.kind);
    let was_missing = cache.is_not_installed(kind);
    match event {
        Ok(event) => {
            let changed = cache.apply_event(kind, event);
            if was_missing && !cache.is_not_installed(kind) {
                tracing::info!(kind = name, "CRD installed: the kind is watched now");
            }
            changed
        }
        Err(error) if watched.is_some_and(|k| k.optional) && is_not_found(&error) => {
            if !was_missing {
                let api = watched.map_or(String::new(), |k| format!("{}.{}", k.plural, k.group));
                tracing::info!(kind = name, %api,
                    "CRD not installed (404): no objects of this kind; asked again with the watch backoff");
            }
            if cache.not_installed(kind) {
                Change::Configuration
            } else {
                Change::None
            }
        }
        Err(error) => {
            tracing::warn!(kind = name, %error,
                "watch failed; retrying (the current configuration keeps serving)");
            Change::None
        }
    }
}

/// The API server does not serve the watched resource (404 on its list or
/// watch): its CRD is not installed.
fn is_not_found(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(name: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"port": 80}]},
        }))
        .expect("a valid DynamicObject")
    }

    type Feed = mpsc::UnboundedSender<Result<Event<DynamicObject>, watcher::Error>>;

    /// One channel per watched kind, as the streams `run` reads.
    fn feeds() -> (Vec<Feed>, Vec<KindEvents>) {
        feeds_for(&WATCHED_KINDS)
    }

    /// One channel per kind of `kinds`.
    fn feeds_for(kinds: &[WatchedKind]) -> (Vec<Feed>, Vec<KindEvents>) {
        kinds
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let (tx, rx) = mpsc::unbounded_channel();
                let events =
                    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                        .map(move |e| (i, e))
                        .boxed();
                (tx, events)
            })
            .unzip()
    }

    fn service_index() -> usize {
        WATCHED_KINDS
            .iter()
            .position(|k| k.kind == "Service")
            .expect("Service is watched")
    }

    fn names(update: &SourceUpdate) -> Vec<String> {
        update
            .snapshot
            .services
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect()
    }

    async fn next(rx: &mut mpsc::Receiver<SourceUpdate>) -> SourceUpdate {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an update within the deadline")
            .expect("the source is running")
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_sent_before_every_list_completed_then_bursts_coalesce() {
        let (feeds, watches) = feeds();
        let (tx, mut rx) = mpsc::channel(1);
        let (_stop, stop_rx) = watch::channel(false);
        let options = SourceOptions {
            debounce: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
            ..SourceOptions::default()
        };
        let task = tokio::spawn(run(watches, options, tx, None, stop_rx));
        let svc = service_index();

        for (i, feed) in feeds.iter().enumerate() {
            feed.send(Ok(Event::Init)).expect("source running");
            if i == svc {
                feed.send(Ok(Event::InitApply(service("a"))))
                    .expect("source running");
            }
            if i + 1 < feeds.len() {
                feed.send(Ok(Event::InitDone)).expect("source running");
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err(), "one kind has not listed yet");

        feeds[feeds.len() - 1]
            .send(Ok(Event::InitDone))
            .expect("source running");
        assert_eq!(names(&next(&mut rx).await), ["a"]);

        // A burst of changes arrives as one update with the final state.
        for name in ["b", "c", "d"] {
            feeds[svc]
                .send(Ok(Event::Apply(service(name))))
                .expect("source running");
        }
        feeds[svc]
            .send(Ok(Event::Delete(service("a"))))
            .expect("source running");
        assert_eq!(names(&next(&mut rx).await), ["b", "c", "d"]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err(), "the burst made exactly one update");

        // A failed watch is logged; a relist then swaps in atomically.
        feeds[svc]
            .send(Err(watcher::Error::NoResourceVersion))
            .expect("source running");
        feeds[svc].send(Ok(Event::Init)).expect("source running");
        feeds[svc]
            .send(Ok(Event::InitApply(service("e"))))
            .expect("source running");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err(), "an incomplete relist sends nothing");
        feeds[svc]
            .send(Ok(Event::InitDone))
            .expect("source running");
        assert_eq!(names(&next(&mut rx).await), ["e"]);

        drop(feeds);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stops when every watch ended")
            .expect("the source task does not panic");
    }

    fn route(version: &str, status: bool) -> DynamicObject {
        let mut route = json!({
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": version},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"backendRefs": [{"name": "a", "port": 80}]}]},
        });
        if status {
            route["status"] = json!({"parents": [{"parentRef": {"name": "gw"},
                "controllerName": "sluice.dev/gateway-controller", "conditions": []}]});
        }
        serde_json::from_value(route).expect("a valid DynamicObject")
    }

    fn route_version(update: &SourceUpdate) -> Option<String> {
        update
            .snapshot
            .http_routes
            .first()?
            .metadata
            .resource_version
            .clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_status_write_waits_for_the_status_delay_or_goes_with_a_change() {
        let (feeds, watches) = feeds();
        let (tx, mut rx) = mpsc::channel(1);
        let (_stop, stop_rx) = watch::channel(false);
        let options = SourceOptions {
            debounce: Duration::from_millis(50),
            max_delay: Duration::from_secs(60),
            status_delay: Duration::from_secs(2),
            ..SourceOptions::default()
        };
        let task = tokio::spawn(run(watches, options, tx, None, stop_rx));
        let (svc, routes) = (
            service_index(),
            WATCHED_KINDS
                .iter()
                .position(|k| k.kind == "HTTPRoute")
                .expect("HTTPRoute is watched"),
        );
        for (i, feed) in feeds.iter().enumerate() {
            feed.send(Ok(Event::Init)).expect("source running");
            if i == routes {
                feed.send(Ok(Event::InitApply(route("1", false))))
                    .expect("source running");
            }
            feed.send(Ok(Event::InitDone)).expect("source running");
        }
        assert_eq!(route_version(&next(&mut rx).await).as_deref(), Some("1"));

        // The echo of a status write alone: sent after the status delay.
        feeds[routes]
            .send(Ok(Event::Apply(route("2", true))))
            .expect("source running");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(rx.try_recv().is_err(), "a status echo waits");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let update = rx.try_recv().expect("sent after the status delay");
        assert_eq!(route_version(&update).as_deref(), Some("2"));

        // Another echo, then a change of the configuration: both go at
        // once, after the debounce.
        feeds[routes]
            .send(Ok(Event::Apply(route("3", true))))
            .expect("source running");
        tokio::time::sleep(Duration::from_millis(100)).await;
        feeds[svc]
            .send(Ok(Event::Apply(service("b"))))
            .expect("source running");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let update = rx.try_recv().expect("sent with the configuration change");
        assert_eq!(route_version(&update).as_deref(), Some("3"));
        assert_eq!(names(&update), ["b"]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err(), "nothing left to send");

        drop(feeds);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stops when every watch ended")
            .expect("the source task does not panic");
    }

    fn api_error(code: u16) -> watcher::Error {
        let status = kube::core::Status::failure(
            "the server could not find the requested resource",
            "NotFound",
        )
        .with_code(code)
        .boxed();
        watcher::Error::InitialListFailed(kube::Error::Api(status))
    }

    #[tokio::test(start_paused = true)]
    async fn missing_optional_crds_list_as_empty_and_missing_core_kinds_do_not() {
        let (feeds, watches) = feeds();
        let (tx, mut rx) = mpsc::channel(1);
        let (_stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(watches, SourceOptions::default(), tx, None, stop_rx));
        let svc = service_index();
        let gateways = WATCHED_KINDS
            .iter()
            .position(|k| k.kind == "Gateway")
            .expect("Gateway is watched");

        for (i, feed) in feeds.iter().enumerate() {
            if WATCHED_KINDS[i].optional {
                // Forbidden is not "not installed": the kind is still unlisted.
                feed.send(Err(api_error(403))).expect("source running");
            } else if i == gateways {
                feed.send(Err(api_error(404))).expect("source running");
            } else {
                feed.send(Ok(Event::Init)).expect("source running");
                if i == svc {
                    feed.send(Ok(Event::InitApply(service("a"))))
                        .expect("source running");
                }
                feed.send(Ok(Event::InitDone)).expect("source running");
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            rx.try_recv().is_err(),
            "Gateways and the optional kinds are not listed"
        );

        for (i, feed) in feeds.iter().enumerate() {
            if WATCHED_KINDS[i].optional {
                feed.send(Err(api_error(404))).expect("source running");
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            rx.try_recv().is_err(),
            "a core kind's 404 is not an empty list"
        );

        feeds[gateways]
            .send(Ok(Event::Init))
            .expect("source running");
        feeds[gateways]
            .send(Ok(Event::InitDone))
            .expect("source running");
        let update = next(&mut rx).await;
        assert_eq!(names(&update), ["a"]);
        assert!(update.snapshot.listener_sets.is_empty());

        drop(feeds);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stops when every watch ended")
            .expect("the source task does not panic");
    }

    #[tokio::test(start_paused = true)]
    async fn ingresses_of_the_class_reach_the_snapshot_and_the_status_writer() {
        let kinds = kinds(true);
        let (feeds, watches) = feeds_for(&kinds);
        let (tx, mut rx) = mpsc::channel(1);
        let (served_tx, mut served) = watch::channel(Arc::default());
        let (_stop, stop_rx) = watch::channel(false);
        let options = SourceOptions {
            ingresses: Some(IngressServing {
                class: "nginx".into(),
                gateway: ("default".into(), "gw".into()),
            }),
            ..SourceOptions::default()
        };
        let task = tokio::spawn(run(watches, options, tx, Some(served_tx), stop_rx));
        let ingress = |class: &str, host: &str| -> DynamicObject {
            serde_json::from_value(json!({
                "metadata": {"name": format!("web-{class}"), "namespace": "shop",
                             "resourceVersion": "3"},
                "spec": {"ingressClassName": class, "rules": [{"host": host, "http": {"paths": [
                    {"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]},
            }))
            .expect("a valid DynamicObject")
        };
        let ingresses = kinds
            .iter()
            .position(|k| k.kind == "Ingress")
            .expect("Ingresses are watched");
        for (i, feed) in feeds.iter().enumerate() {
            feed.send(Ok(Event::Init)).expect("source running");
            if i == ingresses {
                for object in [
                    ingress("nginx", "a.example"),
                    ingress("traefik", "b.example"),
                ] {
                    feed.send(Ok(Event::InitApply(object)))
                        .expect("source running");
                }
            }
            feed.send(Ok(Event::InitDone)).expect("source running");
        }
        let update = next(&mut rx).await;
        assert!(update.errors.is_empty(), "{:?}", update.errors);
        let routes: Vec<_> = update
            .snapshot
            .http_routes
            .iter()
            .map(|r| (r.metadata.name.clone(), r.spec.hostnames.clone()))
            .collect();
        assert_eq!(
            routes,
            [(Some("web-nginx".into()), Some(vec!["a.example".into()]))]
        );
        served.changed().await.expect("the source is running");
        let current = served.borrow_and_update().clone();
        let names: Vec<&str> = current.ingresses.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["web-nginx"]);
        assert_eq!(current.converted, ["HTTPRoute shop/web-nginx"]);

        drop(feeds);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stops when every watch ended")
            .expect("the source task does not panic");
    }

    #[test]
    fn not_found_is_recognised_on_list_and_watch() {
        assert!(is_not_found(&api_error(404)));
        assert!(!is_not_found(&api_error(403)));
        assert!(!is_not_found(&api_error(500)));
        let status = kube::core::Status::failure("gone", "NotFound")
            .with_code(404)
            .boxed();
        assert!(is_not_found(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status)
        )));
        assert!(!is_not_found(&watcher::Error::NoResourceVersion));
    }
}
