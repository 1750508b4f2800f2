//! A small fake Kubernetes API server, for tests only.
//!
//! It speaks just enough of the API for `sluice serve --kubernetes`:
//!
//! - list and watch (cluster-wide) of the kinds sluice watches, with a
//!   global `resourceVersion`, replay of the events after the version a
//!   watch asks for, and `410 Gone` (an `ERROR` watch event with code 410,
//!   as the real server sends it) for versions older than the last
//!   [`FakeApiServer::expire_watches`];
//! - `PATCH .../status` with `application/apply-patch+yaml` for
//!   GatewayClasses, Gateways, ListenerSets, HTTPRoutes, BackendTLSPolicies,
//!   RolloutPolicies (`sluice.dev/v1alpha1`) and Ingresses, recorded with the
//!   caller's bearer token so tests can tell replicas apart; the patch's
//!   `status` replaces the object's (no field ownership is tracked); a
//!   `metadata.resourceVersion` in the patch is a precondition, as the real
//!   server has it (409 Conflict when the object's differs); another
//!   writer's write can be slipped in just before the next status patch of
//!   an object ([`FakeApiServer::write_before_next_status_patch`]); the
//!   status patches of a resource can be refused for a while
//!   ([`FakeApiServer::refuse_status`]: 500, as an API server that cannot
//!   reach etcd answers);
//! - CRDs that are not installed ([`FakeApiServer::uninstall`]): every
//!   request for that resource gets the `404 NotFound` Status the real
//!   server sends for a resource it does not serve;
//! - Lease get / create / replace with optimistic concurrency (409),
//!   server-side apply (`PATCH` with `application/apply-patch+yaml`: creates
//!   the Lease or replaces its labels, annotations and spec) and delete;
//!   Lease writes are watch events too, and every write of a Lease is
//!   recorded with the caller's token and the time it arrived
//!   ([`FakeApiServer::lease_writes`]), so tests can bound each replica's
//!   write rate; Lease applies can be refused for a while
//!   ([`FakeApiServer::refuse_lease_applies`]: 500);
//! - label selectors of lists and watches, equality (`key=value`) and
//!   existence (`key`) terms ANDed.
//!
//! It does not validate against CRD schemas, track managed fields, page
//! lists, honour field selectors or set-based label selectors,
//! authenticate, or serve any other verb or kind (those answer 404/405).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast, watch};

/// `(plural, namespace, name)`.
type Key = (String, Option<String>, String);

#[derive(Debug, Clone)]
struct WatchEvent {
    rv: u64,
    plural: String,
    kind: &'static str,
    object: Value,
}

/// One recorded status patch.
#[derive(Debug, Clone)]
pub struct StatusPatch {
    pub plural: String,
    pub namespace: Option<String>,
    pub name: String,
    /// The caller's bearer token (tests give each replica its own).
    pub token: String,
    pub field_manager: String,
    pub force: bool,
    pub body: Value,
    /// Refused with 409: its resourceVersion was not the object's.
    pub conflict: bool,
}

/// One recorded write of a Lease.
#[derive(Debug, Clone)]
pub struct LeaseWrite {
    pub namespace: Option<String>,
    pub name: String,
    /// The caller's bearer token.
    pub token: String,
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    pub at: std::time::Instant,
    /// What the Lease holds after the write (`Null` after a delete).
    pub object: Value,
}

/// A write of another controller, made just before a status patch.
type Interleaved = (Key, Box<dyn FnOnce(&mut Value) + Send>);

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    events: Vec<WatchEvent>,
    /// Watches from a resourceVersion below this get 410 Gone.
    expired_below: u64,
    patches: Vec<StatusPatch>,
    lists: BTreeMap<String, usize>,
    /// Lists of these plurals wait until released.
    held: Vec<String>,
    /// Plurals whose CRD is not installed: 404 for every request.
    uninstalled: Vec<String>,
    /// How many requests got a 404 because their CRD is not installed.
    not_found: BTreeMap<String, usize>,
    /// Made when the next status patch of its object arrives.
    interleaved: Vec<Interleaved>,
    /// Plurals whose status patches get 500 (and are not recorded).
    refused: Vec<String>,
    lease_writes: Vec<LeaseWrite>,
    /// Lease applies get 500 (counted, not recorded as writes).
    refuse_lease_applies: bool,
    refused_lease_applies: usize,
}

struct Shared {
    store: Mutex<Store>,
    events: broadcast::Sender<WatchEvent>,
    /// Bumped to end every open watch.
    epoch: watch::Sender<u64>,
    released: Notify,
}

/// A running fake API server.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

const CLUSTER_SCOPED: [&str; 3] = ["gatewayclasses", "namespaces", "ingressclasses"];

/// `apiVersion` and `kind` of the plurals this fake knows.
fn type_of(plural: &str) -> Option<(&'static str, &'static str)> {
    Some(match plural {
        "gatewayclasses" => ("gateway.networking.k8s.io/v1", "GatewayClass"),
        "gateways" => ("gateway.networking.k8s.io/v1", "Gateway"),
        "httproutes" => ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        "grpcroutes" => ("gateway.networking.k8s.io/v1", "GRPCRoute"),
        "tlsroutes" => ("gateway.networking.k8s.io/v1", "TLSRoute"),
        "referencegrants" => ("gateway.networking.k8s.io/v1", "ReferenceGrant"),
        "services" => ("v1", "Service"),
        "namespaces" => ("v1", "Namespace"),
        "secrets" => ("v1", "Secret"),
        "endpointslices" => ("discovery.k8s.io/v1", "EndpointSlice"),
        "configmaps" => ("v1", "ConfigMap"),
        "listenersets" => ("gateway.networking.k8s.io/v1", "ListenerSet"),
        "backendtlspolicies" => ("gateway.networking.k8s.io/v1", "BackendTLSPolicy"),
        "rolloutpolicies" => ("sluice.dev/v1alpha1", "RolloutPolicy"),
        "leases" => ("coordination.k8s.io/v1", "Lease"),
        "ingresses" => ("networking.k8s.io/v1", "Ingress"),
        "ingressclasses" => ("networking.k8s.io/v1", "IngressClass"),
        _ => return None,
    })
}

fn plural_of(kind: &str) -> &'static str {
    match kind {
        "GatewayClass" => "gatewayclasses",
        "Gateway" => "gateways",
        "HTTPRoute" => "httproutes",
        "GRPCRoute" => "grpcroutes",
        "TLSRoute" => "tlsroutes",
        "ReferenceGrant" => "referencegrants",
        "Service" => "services",
        "Namespace" => "namespaces",
        "Secret" => "secrets",
        "EndpointSlice" => "endpointslices",
        "ConfigMap" => "configmaps",
        "ListenerSet" => "listenersets",
        "BackendTLSPolicy" => "backendtlspolicies",
        "RolloutPolicy" => "rolloutpolicies",
        "Ingress" => "ingresses",
        "IngressClass" => "ingressclasses",
        other => panic!("the fake does not serve {other}"),
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed_unsync())
        .expect("a valid response")
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    full(
        StatusCode::from_u16(code).expect("a valid code"),
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": reason, "message": message, "code": code}),
    )
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake API server");
        let addr = listener.local_addr().expect("a local address");
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            events: broadcast::channel(4096).0,
            epoch: watch::channel(0).0,
            released: Notify::new(),
        });
        let s = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(&s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeApiServer { addr, shared }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server that authenticates with `token`.
    pub fn kubeconfig(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: fake, cluster: {{server: '{}'}}}}]\n\
             users: [{{name: {token}, user: {{token: {token}}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: {token}, namespace: sluice-system}}}}]\n\
             current-context: fake\n",
            self.url()
        )
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared
            .store
            .lock()
            .expect("the store lock is not poisoned")
    }

    /// Create or replace an object (like `kubectl apply`): a new
    /// resourceVersion, `generation` 1 on create and +1 when `spec` changes,
    /// `status` kept unless the object gives one.
    pub fn apply(&self, mut object: Value) {
        let kind = object["kind"]
            .as_str()
            .expect("objects have a kind")
            .to_string();
        let plural = plural_of(&kind).to_string();
        let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
        let name = object["metadata"]["name"]
            .as_str()
            .expect("objects have a name")
            .to_string();
        let mut store = self.store();
        store.rv += 1;
        let rv = store.rv;
        let key = (plural.clone(), ns, name);
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        let (event, generation, created, old_status) = match store.objects.get(&key) {
            Some(old) => {
                let changed = old.get("spec") != object.get("spec");
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                (
                    "MODIFIED",
                    generation + i64::from(changed),
                    old["metadata"]["creationTimestamp"].clone(),
                    old.get("status").cloned(),
                )
            }
            None => (
                "ADDED",
                1,
                json!(format!("2024-01-01T00:00:{:02}Z", rv % 60)),
                None,
            ),
        };
        let meta = &mut object["metadata"];
        meta["generation"] = json!(generation);
        meta["creationTimestamp"] = created;
        meta["uid"] = json!(format!("uid-{}", key.2));
        if object.get("status").is_none()
            && let Some(s) = old_status
        {
            object["status"] = s;
        }
        store.objects.insert(key, object.clone());
        self.publish(&mut store, event, &plural, object);
    }

    /// When the next status patch of `kind namespace/name` arrives, first
    /// change the object with `write` (another controller writing between
    /// the patch's read and its write): a new resourceVersion and a
    /// MODIFIED event, then the patch is handled.
    pub fn write_before_next_status_patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        write: impl FnOnce(&mut Value) + Send + 'static,
    ) {
        let key = (
            plural_of(kind).to_string(),
            namespace.map(str::to_string),
            name.to_string(),
        );
        self.store().interleaved.push((key, Box::new(write)));
    }

    /// Delete an object; returns whether it existed.
    pub fn delete(&self, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let plural = plural_of(kind).to_string();
        let mut store = self.store();
        let key = (
            plural.clone(),
            namespace.map(str::to_string),
            name.to_string(),
        );
        let Some(mut object) = store.objects.remove(&key) else {
            return false;
        };
        store.rv += 1;
        object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        self.publish(&mut store, "DELETED", &plural, object);
        true
    }

    fn publish(&self, store: &mut Store, kind: &'static str, plural: &str, object: Value) {
        let event = WatchEvent {
            rv: store.rv,
            plural: plural.to_string(),
            kind,
            object,
        };
        store.events.push(event.clone());
        let _ = self.shared.events.send(event);
    }

    /// The object as the server holds it.
    pub fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = (
            plural_of(kind).to_string(),
            namespace.map(str::to_string),
            name.to_string(),
        );
        self.store().objects.get(&key).cloned()
    }

    /// Make every resourceVersion seen so far too old and end every open
    /// watch: watchers come back, get 410 Gone and must list again.
    pub fn expire_watches(&self) {
        {
            let mut store = self.store();
            store.expired_below = store.rv + 1;
            store.events.clear();
        }
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// Every status patch received so far.
    pub fn patches(&self) -> Vec<StatusPatch> {
        self.store().patches.clone()
    }

    /// How many lists of `plural` were served.
    pub fn lists(&self, plural: &str) -> usize {
        self.store().lists.get(plural).copied().unwrap_or(0)
    }

    /// Lists of `plural` wait until [`FakeApiServer::release_lists`].
    pub fn hold_lists(&self, plural: &str) {
        self.store().held.push(plural.to_string());
    }

    pub fn release_lists(&self) {
        self.store().held.clear();
        self.shared.released.notify_waiters();
    }

    /// The CRD of `plural` is not installed (or is removed): every request
    /// for it gets 404 until [`FakeApiServer::install`].
    pub fn uninstall(&self, plural: &str) {
        self.store().uninstalled.push(plural.to_string());
        // Open watches of the kind end, as they do when a CRD is deleted.
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// The CRD of `plural` is installed (again).
    pub fn install(&self, plural: &str) {
        self.store().uninstalled.retain(|p| p != plural);
    }

    /// Status patches of `plural` get 500 until [`FakeApiServer::accept_status`].
    pub fn refuse_status(&self, plural: &str) {
        self.store().refused.push(plural.to_string());
    }

    pub fn accept_status(&self) {
        self.store().refused.clear();
    }

    /// How many requests for `plural` got 404 because its CRD is not
    /// installed.
    pub fn not_found(&self, plural: &str) -> usize {
        self.store().not_found.get(plural).copied().unwrap_or(0)
    }

    /// Every Lease write that succeeded so far, in order.
    pub fn lease_writes(&self) -> Vec<LeaseWrite> {
        self.store().lease_writes.clone()
    }

    /// Lease applies get 500 until [`FakeApiServer::accept_lease_applies`].
    pub fn refuse_lease_applies(&self) {
        self.store().refuse_lease_applies = true;
    }

    pub fn accept_lease_applies(&self) {
        self.store().refuse_lease_applies = false;
    }

    /// How many Lease applies were refused.
    pub fn refused_lease_applies(&self) -> usize {
        self.store().refused_lease_applies
    }

    /// The Leases of `namespace`.
    pub fn leases(&self, namespace: &str) -> Vec<Value> {
        self.store()
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "leases" && k.1.as_deref() == Some(namespace))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The holder of a Lease.
    pub fn lease_holder(&self, namespace: &str, name: &str) -> Option<String> {
        let key = (
            "leases".to_string(),
            Some(namespace.to_string()),
            name.to_string(),
        );
        self.store()
            .objects
            .get(&key)
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    }
}

/// What a request path names.
struct Target {
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let rest = if let Some(rest) = path.strip_prefix("/api/v1/") {
        rest
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        parts.next()?;
        parts.next()?;
        parts.next()?
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segs) = match segs.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail.to_vec()),
        _ => (None, segs),
    };
    Some(Target {
        plural: segs.first()?.to_string(),
        namespace,
        name: segs.get(1).map(|s| s.to_string()),
        subresource: segs.get(2).map(|s| s.to_string()),
    })
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let Some(target) = parse_path(req.uri().path()) else {
        return status(404, "NotFound", "unknown path");
    };
    let Some((api_version, kind)) = type_of(&target.plural) else {
        return status(404, "NotFound", "unknown resource");
    };
    {
        let mut store = shared.store.lock().expect("store lock");
        if store.uninstalled.contains(&target.plural) {
            *store.not_found.entry(target.plural.clone()).or_default() += 1;
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    }
    let q = query(&req);
    match (
        req.method().clone(),
        &target.name,
        target.subresource.as_deref(),
    ) {
        (Method::GET, None, None)
            if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) =>
        {
            watch_stream(shared, &target, &q)
        }
        (Method::GET, None, None) => list(shared, &target, &q, api_version, kind).await,
        (Method::PATCH, Some(_), Some("status"))
            if matches!(
                target.plural.as_str(),
                "gatewayclasses"
                    | "gateways"
                    | "listenersets"
                    | "httproutes"
                    | "grpcroutes"
                    | "tlsroutes"
                    | "backendtlspolicies"
                    | "rolloutpolicies"
                    | "ingresses"
            ) =>
        {
            patch_status(shared, target, q, req).await
        }
        _ if target.plural == "leases" => lease(shared, target, req).await,
        _ => status(405, "MethodNotAllowed", "not served by the fake"),
    }
}

fn in_scope(target: &Target, key: &Key) -> bool {
    key.0 == target.plural && (target.namespace.is_none() || target.namespace == key.1)
}

/// Whether `object`'s labels satisfy `selector` (`a=b,c`: equality and
/// existence terms, ANDed; empty or absent selects everything).
fn selected(selector: Option<&String>, object: &Value) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels[k.trim_end_matches('=')].as_str() == Some(v),
            None => !labels[term].is_null(),
        })
}

async fn list(
    shared: &Arc<Shared>,
    target: &Target,
    q: &BTreeMap<String, String>,
    api_version: &str,
    kind: &str,
) -> Response<Body> {
    loop {
        let released = shared.released.notified();
        if !shared
            .store
            .lock()
            .expect("store lock")
            .held
            .contains(&target.plural)
        {
            break;
        }
        released.await;
    }
    let mut store = shared.store.lock().expect("store lock");
    *store.lists.entry(target.plural.clone()).or_default() += 1;
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|(k, v)| in_scope(target, k) && selected(q.get("labelSelector"), v))
        .map(|(_, v)| {
            // Like the real server, list items carry no apiVersion/kind.
            let mut v = v.clone();
            if let Value::Object(m) = &mut v {
                m.remove("apiVersion");
                m.remove("kind");
            }
            v
        })
        .collect();
    full(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
    )
}

fn watch_stream(
    shared: &Arc<Shared>,
    target: &Target,
    q: &BTreeMap<String, String>,
) -> Response<Body> {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let line = |v: Value| Bytes::from(format!("{v}\n"));
    {
        let store = shared.store.lock().expect("store lock");
        if from < store.expired_below {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {from}")}});
            let _ = tx.send(line(gone));
        } else {
            let mut live = shared.events.subscribe();
            let mut epoch = shared.epoch.subscribe();
            let started = *epoch.borrow_and_update();
            let selector = q.get("labelSelector").cloned();
            let namespace = target.namespace.clone();
            let wanted = move |e: &WatchEvent| {
                selected(selector.as_ref(), &e.object)
                    && (namespace.is_none()
                        || e.object["metadata"]["namespace"].as_str() == namespace.as_deref())
            };
            for e in store
                .events
                .iter()
                .filter(|e| e.rv > from && e.plural == target.plural && wanted(e))
            {
                let _ = tx.send(line(json!({"type": e.kind, "object": e.object})));
            }
            let plural = target.plural.clone();
            let last = store.rv;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        event = live.recv() => match event {
                            // Events after an expiry belong to the next watch.
                            _ if *epoch.borrow() != started => return,
                            Ok(e) if e.rv > last && e.plural == plural && wanted(&e) => {
                                if tx.send(line(json!({"type": e.kind, "object": e.object}))).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        },
                        _ = epoch.changed() => return,
                        _ = tx.closed() => return,
                    }
                }
            });
        }
    }
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(BodyExt::boxed_unsync(StreamBody::new(frames.boxed())))
        .expect("a valid response")
}

async fn read_json(req: Request<Incoming>) -> Option<Value> {
    let bytes = req.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&bytes).ok()
}

async fn patch_status(
    shared: &Arc<Shared>,
    target: Target,
    q: BTreeMap<String, String>,
    req: Request<Incoming>,
) -> Response<Body> {
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if content_type != "application/apply-patch+yaml" {
        return status(
            415,
            "UnsupportedMediaType",
            "only server-side apply is served",
        );
    }
    let Some(field_manager) = q.get("fieldManager").cloned() else {
        return status(422, "Invalid", "fieldManager is required for apply patch");
    };
    let token = bearer(&req);
    let Some(body) = read_json(req).await else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let name = target.name.clone().unwrap_or_default();
    let namespace = if CLUSTER_SCOPED.contains(&target.plural.as_str()) {
        None
    } else {
        target.namespace.clone()
    };
    let key = (target.plural.clone(), namespace.clone(), name.clone());
    let mut store = shared.store.lock().expect("store lock");
    if store.refused.contains(&target.plural) {
        return status(500, "InternalError", "the status write is refused (test)");
    }
    if let Some(i) = store.interleaved.iter().position(|(k, _)| *k == key)
        && let Some(mut object) = store.objects.get(&key).cloned()
    {
        let (_, write) = store.interleaved.remove(i);
        write(&mut object);
        store.rv += 1;
        object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        store.objects.insert(key.clone(), object.clone());
        let event = WatchEvent {
            rv: store.rv,
            plural: target.plural.clone(),
            kind: "MODIFIED",
            object,
        };
        store.events.push(event.clone());
        let _ = shared.events.send(event);
    }
    let current = store.objects.get(&key).cloned();
    let precondition = body["metadata"]["resourceVersion"].as_str();
    let conflict = current.as_ref().is_some_and(|o| {
        precondition.is_some_and(|rv| o["metadata"]["resourceVersion"].as_str() != Some(rv))
    });
    store.patches.push(StatusPatch {
        plural: target.plural.clone(),
        namespace,
        name,
        token,
        field_manager,
        force: q.get("force").map(String::as_str) == Some("true"),
        body: body.clone(),
        conflict,
    });
    let Some(mut object) = current else {
        return status(404, "NotFound", "no such object");
    };
    if conflict {
        return status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    store.rv += 1;
    object["metadata"]["resourceVersion"] = json!(store.rv.to_string());
    object["status"] = body["status"].clone();
    store.objects.insert(key, object.clone());
    let event = WatchEvent {
        rv: store.rv,
        plural: target.plural.clone(),
        kind: "MODIFIED",
        object: object.clone(),
    };
    store.events.push(event.clone());
    let _ = shared.events.send(event);
    full(StatusCode::OK, &object)
}

fn bearer(req: &Request<Incoming>) -> String {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string()
}

async fn lease(shared: &Arc<Shared>, target: Target, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let token = bearer(&req);
    let apply = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        == Some("application/apply-patch+yaml");
    let body = if method == Method::GET || method == Method::DELETE {
        None
    } else {
        read_json(req).await
    };
    let mut store = shared.store.lock().expect("store lock");
    let name = match (&target.name, &body) {
        (Some(n), _) => n.clone(),
        (None, Some(b)) => b["metadata"]["name"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    };
    let key = ("leases".to_string(), target.namespace.clone(), name);
    let (code, event, object) = match (method.clone(), body) {
        (Method::GET, _) => {
            return match store.objects.get(&key) {
                Some(l) => full(StatusCode::OK, l),
                None => status(404, "NotFound", "lease not found"),
            };
        }
        (Method::POST, Some(l)) => {
            if store.objects.contains_key(&key) {
                return status(409, "AlreadyExists", "lease exists");
            }
            (StatusCode::CREATED, "ADDED", l)
        }
        (Method::PUT, Some(l)) => {
            let Some(current) = store.objects.get(&key) else {
                return status(404, "NotFound", "lease not found");
            };
            if current["metadata"]["resourceVersion"] != l["metadata"]["resourceVersion"] {
                return status(409, "Conflict", "the lease was modified");
            }
            (StatusCode::OK, "MODIFIED", l)
        }
        (Method::PATCH, Some(_)) if apply && store.refuse_lease_applies => {
            store.refused_lease_applies += 1;
            return status(500, "InternalError", "the lease write is refused (test)");
        }
        (Method::PATCH, Some(patch)) if apply => {
            // Server-side apply of a whole Lease by one manager: the
            // applied labels, annotations and spec replace the object's.
            let (code, event, mut l) = match store.objects.get(&key) {
                Some(current) => (StatusCode::OK, "MODIFIED", current.clone()),
                None => (
                    StatusCode::CREATED,
                    "ADDED",
                    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": key.2, "namespace": key.1}}),
                ),
            };
            for field in ["labels", "annotations"] {
                if let Some(v) = patch["metadata"].get(field) {
                    l["metadata"][field] = v.clone();
                }
            }
            l["spec"] = patch["spec"].clone();
            (code, event, l)
        }
        (Method::DELETE, _) => {
            let Some(l) = store.objects.remove(&key) else {
                return status(404, "NotFound", "lease not found");
            };
            (StatusCode::OK, "DELETED", l)
        }
        _ => return status(405, "MethodNotAllowed", "not served by the fake"),
    };
    let mut l = object;
    store.rv += 1;
    l["metadata"]["resourceVersion"] = json!(store.rv.to_string());
    if event != "DELETED" {
        store.objects.insert(key.clone(), l.clone());
    }
    store.lease_writes.push(LeaseWrite {
        namespace: key.1.clone(),
        name: key.2.clone(),
        token,
        method: method.to_string(),
        at: std::time::Instant::now(),
        object: if event == "DELETED" {
            Value::Null
        } else {
            l.clone()
        },
    });
    let event = WatchEvent {
        rv: store.rv,
        plural: "leases".into(),
        kind: event,
        object: l.clone(),
    };
    store.events.push(event.clone());
    let _ = shared.events.send(event);
    full(code, &l)
}
