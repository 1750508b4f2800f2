//! Writing status back to the API server (Kubernetes mode).
//!
//! translate computes every object's status; this module turns that
//! [`StatusReport`] into server-side apply patches of the `/status`
//! subresource under our field manager ([`FIELD_MANAGER`]), and sends only
//! the ones that change something. Only the elected leader writes (see
//! [`lease`]); every replica serves traffic regardless.
//! Every replica but the leader also publishes its own rollout counts
//! ([`counts`]), which the leader judges with its own.
//!
//! What is written:
//! - our GatewayClasses, Gateways, the ListenerSets attached to our Gateways,
//!   HTTPRoutes, GRPCRoutes, TLSRoutes, BackendTLSPolicies and
//!   RolloutPolicies get exactly translate's status,
//!   computed after the proxy swapped in the table (so `Programmed=True`
//!   means served);
//! - Gateways get `status.addresses` from the gateway's own Service when one
//!   is configured ([`gateway_addresses`]);
//! - RolloutPolicies also get `status.rollouts`, the rollouts the leader
//!   runs ([`RolloutReport`], as recorded at their last transition): this
//!   is where a rollout is kept in Kubernetes mode, and what the other
//!   replicas serve. It goes in the same apply as the policy's
//!   `ancestors`: two applies under one field manager would each remove
//!   the fields the other set;
//! - route `status.parents` and BackendTLSPolicy and RolloutPolicy
//!   `status.ancestors` are atomic lists in the CRDs, each entry owned by the controller named in
//!   its `controllerName`, so an apply would replace other controllers'
//!   entries: the patch carries theirs as they are, plus ours; a route or
//!   policy no longer attached to us loses ours only. The patch names the
//!   `resourceVersion` it was computed from, a precondition of the apply:
//!   when another controller wrote in between, the API server refuses ours
//!   (409 Conflict) instead of letting it drop their new entries, and it is
//!   computed again from the object the watch delivers;
//! - the Ingresses served as they are (`serve --ingress-class`) get
//!   `status.loadBalancer.ingress` from their Gateway's `status.addresses`
//!   ([`ingress_plan`]), IP addresses as `ip` and hostnames as `hostname`,
//!   as ingress-nginx wrote it from its Service; the routes converted from
//!   them are not in the API server and get no status written;
//! - a condition whose status did not change keeps its
//!   `lastTransitionTime`, which also makes an unchanged status compare
//!   equal, so nothing is written for it.

pub mod counts;
pub mod lease;

use std::collections::{BTreeSet, HashMap};

use gateway_api::experimental::gateways::GatewayStatusAddresses;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::resources::{
    CONTROLLER_NAME, GATEWAY_GROUP, ROLLOUT_POLICY_API_VERSION, SLUICE_GROUP, Service, Snapshot,
};
use crate::rollout::{PolicyKey, RolloutReport};
use crate::source::kubernetes::ServedIngress;
use crate::translate::{ObjectStatus, StatusReport};

/// Our field manager for server-side apply.
pub const FIELD_MANAGER: &str = CONTROLLER_NAME;

/// One server-side apply of an object's status.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusPatch {
    /// `GatewayClass`, `Gateway`, `ListenerSet`, `HTTPRoute`, `GRPCRoute`,
    /// `TLSRoute`, `BackendTLSPolicy` or `RolloutPolicy`.
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    /// `metadata.resourceVersion` of the object the patch was computed from.
    pub resource_version: Option<String>,
    /// The apply configuration: `{apiVersion, kind, metadata, status}`.
    pub body: Value,
}

impl StatusPatch {
    /// `Kind namespace/name`.
    pub fn id(&self) -> String {
        crate::resources::object_id(self.kind, self.namespace.as_deref(), &self.name)
    }

    fn api(&self, client: Client) -> Api<DynamicObject> {
        let plural = match self.kind {
            "GatewayClass" => "gatewayclasses",
            "Gateway" => "gateways",
            "ListenerSet" => "listenersets",
            "BackendTLSPolicy" => "backendtlspolicies",
            "GRPCRoute" => "grpcroutes",
            "TLSRoute" => "tlsroutes",
            "RolloutPolicy" => "rolloutpolicies",
            "Ingress" => "ingresses",
            _ => "httproutes",
        };
        let (group, version) = match self.kind {
            "RolloutPolicy" => (SLUICE_GROUP, "v1alpha1"),
            "Ingress" => (INGRESS_GROUP, "v1"),
            _ => (GATEWAY_GROUP, "v1"),
        };
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version(self.kind),
            kind: self.kind.into(),
            plural: plural.into(),
        };
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        }
    }
}

/// The API group of Ingresses.
const INGRESS_GROUP: &str = "networking.k8s.io";

/// `apiVersion` of a kind sluice writes status to.
fn api_version(kind: &str) -> String {
    match kind {
        "RolloutPolicy" => ROLLOUT_POLICY_API_VERSION.into(),
        "Ingress" => format!("{INGRESS_GROUP}/v1"),
        _ => format!("{GATEWAY_GROUP}/v1"),
    }
}

/// An object of the snapshot by kind, namespace and name: what [`plan`]
/// looks up for every object of the report, and the report's objects by the
/// same key. Built once per plan: looked up by a walk of the lists, as they
/// were, a plan with 10,000 routes compared 10^8 names (seconds on the
/// control plane's thread, after every change).
type ObjectKey<'a> = (&'static str, Option<&'a str>, &'a str);

/// Where each named object of the snapshot is in its kind's list (the
/// first of a name, as a walk would find it).
fn positions(snapshot: &Snapshot) -> crate::FastMap<ObjectKey<'_>, usize> {
    fn add<'a>(
        map: &mut crate::FastMap<ObjectKey<'a>, usize>,
        kind: &'static str,
        metas: impl Iterator<Item = &'a ObjectMeta>,
    ) {
        for (i, meta) in metas.enumerate() {
            if let Some(name) = meta.name.as_deref() {
                map.entry((kind, meta.namespace.as_deref(), name))
                    .or_insert(i);
            }
        }
    }
    let mut map = crate::FastMap::default();
    add(
        &mut map,
        "GatewayClass",
        snapshot.gateway_classes.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "Gateway",
        snapshot.gateways.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "ListenerSet",
        snapshot.listener_sets.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "HTTPRoute",
        snapshot.http_routes.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "GRPCRoute",
        snapshot.grpc_routes.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "TLSRoute",
        snapshot.tls_routes.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "BackendTLSPolicy",
        snapshot.backend_tls_policies.iter().map(|o| &o.metadata),
    );
    add(
        &mut map,
        "RolloutPolicy",
        snapshot.rollout_policies.iter().map(|o| &o.metadata),
    );
    map
}

/// The status the snapshot holds for `object` (of `kind`), and its
/// resourceVersion; `None` when the snapshot has no such object.
fn current(
    snapshot: &Snapshot,
    positions: &crate::FastMap<ObjectKey<'_>, usize>,
    kind: &'static str,
    object: &ObjectStatus,
) -> Option<(Value, Option<String>)> {
    let key = (
        kind,
        object.metadata.namespace.as_deref(),
        object.metadata.name.as_str(),
    );
    let i = *positions.get(&key)?;
    fn found<S: serde::Serialize>(meta: &ObjectMeta, status: &S) -> (Value, Option<String>) {
        (
            serde_json::to_value(status).unwrap_or(Value::Null),
            meta.resource_version.clone(),
        )
    }
    match kind {
        "GatewayClass" => snapshot
            .gateway_classes
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "Gateway" => snapshot
            .gateways
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "ListenerSet" => snapshot
            .listener_sets
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "HTTPRoute" => snapshot
            .http_routes
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "GRPCRoute" => snapshot
            .grpc_routes
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "TLSRoute" => snapshot
            .tls_routes
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "BackendTLSPolicy" => snapshot
            .backend_tls_policies
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        "RolloutPolicy" => snapshot
            .rollout_policies
            .get(i)
            .map(|o| found(&o.metadata, &o.status)),
        _ => None,
    }
}

fn static_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "GatewayClass" => Some("GatewayClass"),
        "Gateway" => Some("Gateway"),
        "ListenerSet" => Some("ListenerSet"),
        "HTTPRoute" => Some("HTTPRoute"),
        "GRPCRoute" => Some("GRPCRoute"),
        "TLSRoute" => Some("TLSRoute"),
        "BackendTLSPolicy" => Some("BackendTLSPolicy"),
        "RolloutPolicy" => Some("RolloutPolicy"),
        _ => None,
    }
}

/// The status list of `kind` whose entries belong to the controller each
/// names (`controllerName`): route `parents`, BackendTLSPolicy and
/// RolloutPolicy `ancestors`.
fn shared_list(kind: &str) -> Option<&'static str> {
    match kind {
        "HTTPRoute" | "GRPCRoute" | "TLSRoute" => Some("parents"),
        "BackendTLSPolicy" | "RolloutPolicy" => Some("ancestors"),
        _ => None,
    }
}

fn is_ours(parent: &Value) -> bool {
    parent.get("controllerName").and_then(Value::as_str) == Some(CONTROLLER_NAME)
}

/// The entries of `current.<list>` other controllers wrote.
fn foreign_entries(current: &Value, list: &str) -> Vec<Value> {
    current
        .get(list)
        .and_then(Value::as_array)
        .map(|ps| ps.iter().filter(|p| !is_ours(p)).cloned().collect())
        .unwrap_or_default()
}

/// Every object of a kind with a [`shared_list`] that `skip` does not
/// leave out: kind, metadata and current status (serialized only for
/// those).
fn with_shared_lists(
    snapshot: &Snapshot,
    skip: impl Fn(&'static str, &ObjectMeta) -> bool,
) -> Vec<(&'static str, &ObjectMeta, Value)> {
    fn status<S: serde::Serialize>(s: &S) -> Value {
        serde_json::to_value(s).unwrap_or(Value::Null)
    }
    let routes = snapshot
        .http_routes
        .iter()
        .filter(|o| !skip("HTTPRoute", &o.metadata))
        .map(|r| ("HTTPRoute", &r.metadata, status(&r.status)));
    let grpc = snapshot
        .grpc_routes
        .iter()
        .filter(|o| !skip("GRPCRoute", &o.metadata))
        .map(|r| ("GRPCRoute", &r.metadata, status(&r.status)));
    let tls = snapshot
        .tls_routes
        .iter()
        .filter(|o| !skip("TLSRoute", &o.metadata))
        .map(|r| ("TLSRoute", &r.metadata, status(&r.status)));
    let policies = snapshot
        .backend_tls_policies
        .iter()
        .filter(|o| !skip("BackendTLSPolicy", &o.metadata))
        .map(|p| ("BackendTLSPolicy", &p.metadata, status(&p.status)));
    let rollout_policies = snapshot
        .rollout_policies
        .iter()
        .filter(|o| !skip("RolloutPolicy", &o.metadata))
        .map(|p| ("RolloutPolicy", &p.metadata, status(&p.status)));
    routes
        .chain(grpc)
        .chain(tls)
        .chain(policies)
        .chain(rollout_policies)
        .collect()
}

/// The patches that bring the cluster's status to what translate computed,
/// leaving out those that would change nothing.
///
/// `addresses` (from [`gateway_addresses`]) become every Gateway's
/// `status.addresses` when given; `rollouts` every RolloutPolicy's
/// `status.rollouts`.
pub fn plan(
    snapshot: &Snapshot,
    report: &StatusReport,
    addresses: Option<&[GatewayStatusAddresses]>,
    rollouts: &RolloutReport,
) -> Vec<StatusPatch> {
    let mut patches = Vec::new();
    let positions = positions(snapshot);
    for object in &report.objects {
        let Some(kind) = static_kind(&object.kind) else {
            continue;
        };
        let Some((current, resource_version)) = current(snapshot, &positions, kind, object) else {
            continue; // deleted since: nothing to write to
        };
        let mut desired = object.status.clone();
        if let (Some(addresses), "Gateway", Value::Object(map)) = (addresses, kind, &mut desired) {
            map.insert("addresses".into(), json!(addresses));
        }
        if kind == "RolloutPolicy"
            && let Some(namespace) = &object.metadata.namespace
        {
            let policy = PolicyKey {
                namespace: namespace.clone(),
                name: object.metadata.name.clone(),
            };
            rollouts.complete(&policy, &mut desired);
        }
        if let Some(list) = shared_list(kind) {
            let ours = desired
                .get(list)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut entries = foreign_entries(&current, list);
            entries.extend(ours);
            desired[list] = Value::Array(entries);
        }
        keep_transition_times(&mut desired, &current);
        if desired == current {
            continue;
        }
        patches.push(patch(kind, object, resource_version, desired));
    }
    // Routes that no longer attach to a Gateway of ours, policies whose
    // Service no Gateway of ours uses any more: withdraw our entries (and
    // only ours) from their lists.
    let reported: std::collections::HashSet<(&str, Option<&str>, &str)> = report
        .objects
        .iter()
        .map(|o| {
            (
                o.kind.as_str(),
                o.metadata.namespace.as_deref(),
                o.metadata.name.as_str(),
            )
        })
        .collect();
    let is_reported = |kind: &'static str, meta: &ObjectMeta| {
        let name = meta.name.as_deref().unwrap_or("");
        reported.contains(&(kind, meta.namespace.as_deref(), name))
    };
    for (kind, meta, current) in with_shared_lists(snapshot, is_reported) {
        let Some(list) = shared_list(kind) else {
            continue;
        };
        let ns = meta.namespace.as_deref();
        let name = meta.name.as_deref().unwrap_or("");
        let has_ours = current
            .get(list)
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(is_ours));
        if !has_ours {
            continue;
        }
        let object = ObjectStatus {
            api_version: api_version(kind),
            kind: kind.into(),
            metadata: crate::translate::StatusMetadata {
                name: name.to_string(),
                namespace: ns.map(str::to_string),
                generation: meta.generation.unwrap_or(0),
            },
            status: Value::Null,
        };
        let desired = json!({ list: foreign_entries(&current, list) });
        patches.push(patch(kind, &object, meta.resource_version.clone(), desired));
    }
    patches
}

fn patch(
    kind: &'static str,
    object: &ObjectStatus,
    resource_version: Option<String>,
    status: Value,
) -> StatusPatch {
    let mut metadata = json!({ "name": object.metadata.name });
    if let Some(ns) = &object.metadata.namespace {
        metadata["namespace"] = json!(ns);
    }
    // Lists other controllers write too: only over the version read.
    if shared_list(kind).is_some()
        && let Some(rv) = &resource_version
    {
        metadata["resourceVersion"] = json!(rv);
    }
    StatusPatch {
        kind,
        namespace: object.metadata.namespace.clone(),
        name: object.metadata.name.clone(),
        resource_version,
        body: json!({
            "apiVersion": api_version(kind),
            "kind": kind,
            "metadata": metadata,
            "status": status,
        }),
    }
}

/// Copy `lastTransitionTime` from `old` into every condition of `new`
/// whose `status` is unchanged: a condition's time is when its status last
/// changed, not when sluice last computed it.
///
/// Lists are matched by identity: conditions by `type`, listeners by
/// `name`, route parents by `parentRef` and policy ancestors by
/// `ancestorRef`, each with `controllerName`.
pub fn keep_transition_times(new: &mut Value, old: &Value) {
    match (new, old) {
        (Value::Object(n), Value::Object(o)) => {
            let is_condition = n.contains_key("lastTransitionTime") && n.contains_key("type");
            if is_condition {
                if n.get("type") == o.get("type")
                    && n.get("status") == o.get("status")
                    && let Some(time) = o.get("lastTransitionTime")
                {
                    n.insert("lastTransitionTime".into(), time.clone());
                }
                return;
            }
            for (key, value) in n.iter_mut() {
                if let Some(old) = o.get(key) {
                    keep_transition_times(value, old);
                }
            }
        }
        (Value::Array(n), Value::Array(o)) => {
            for item in n {
                if let Some(old) = o.iter().find(|old| same_entry(item, old)) {
                    keep_transition_times(item, old);
                }
            }
        }
        _ => {}
    }
}

fn same_entry(a: &Value, b: &Value) -> bool {
    let field = |v: &Value, k: &str| v.get(k).cloned();
    for key in ["parentRef", "ancestorRef"] {
        if a.get(key).is_some() {
            return field(a, key) == field(b, key)
                && field(a, "controllerName") == field(b, "controllerName");
        }
    }
    for key in ["type", "name"] {
        if a.get(key).is_some() {
            return field(a, key) == field(b, key);
        }
    }
    false
}

/// The addresses of the gateway's own Service: its LoadBalancer ingress
/// (IPs and hostnames), else its ClusterIP. `None` when the Service is not
/// in the snapshot or has no address yet.
pub fn gateway_addresses(
    snapshot: &Snapshot,
    namespace: &str,
    name: &str,
) -> Option<Vec<GatewayStatusAddresses>> {
    let service: &Service = snapshot.services.iter().find(|s| {
        s.metadata.name.as_deref() == Some(name)
            && s.metadata.namespace.as_deref() == Some(namespace)
    })?;
    let address = |ty: &str, value: &str| GatewayStatusAddresses {
        r#type: Some(ty.to_string()),
        value: value.to_string(),
    };
    let mut addresses = Vec::new();
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for i in ingress.into_iter().flatten() {
        if let Some(ip) = i.ip.as_deref().filter(|ip| !ip.is_empty()) {
            addresses.push(address("IPAddress", ip));
        } else if let Some(host) = i.hostname.as_deref().filter(|h| !h.is_empty()) {
            addresses.push(address("Hostname", host));
        }
    }
    if addresses.is_empty() {
        let cluster_ip = service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .filter(|ip| !ip.is_empty() && *ip != "None");
        addresses.extend(cluster_ip.map(|ip| address("IPAddress", ip)));
    }
    (!addresses.is_empty()).then_some(addresses)
}

/// The addresses a Gateway of the snapshot holds in `status.addresses`.
pub fn gateway_status_addresses(
    snapshot: &Snapshot,
    namespace: &str,
    name: &str,
) -> Option<Vec<GatewayStatusAddresses>> {
    let gateway = snapshot.gateways.iter().find(|g| {
        g.metadata.name.as_deref() == Some(name)
            && g.metadata.namespace.as_deref() == Some(namespace)
    })?;
    let addresses = gateway.status.as_ref()?.addresses.clone()?;
    (!addresses.is_empty()).then_some(addresses)
}

/// The `status.loadBalancer` patches of the served Ingresses: each gets
/// `addresses` (its Gateway's) as `ingress` entries, an `IPAddress` (or
/// untyped) address as `ip`, a `Hostname` as `hostname`; other address
/// types have no place there. Ingresses that already hold exactly that get
/// none. No addresses (the Gateway has none yet): nothing is written, and
/// what the Ingresses hold stays.
pub fn ingress_plan(
    ingresses: &[ServedIngress],
    addresses: &[GatewayStatusAddresses],
) -> Vec<StatusPatch> {
    let entries: Vec<Value> = addresses
        .iter()
        .filter_map(|a| match a.r#type.as_deref() {
            None | Some("IPAddress") => Some(json!({"ip": a.value})),
            Some("Hostname") => Some(json!({"hostname": a.value})),
            Some(_) => None,
        })
        .collect();
    if entries.is_empty() {
        return Vec::new();
    }
    let desired = json!({"ingress": entries});
    ingresses
        .iter()
        .filter(|i| i.load_balancer != desired)
        .map(|i| StatusPatch {
            kind: "Ingress",
            namespace: Some(i.namespace.clone()),
            name: i.name.clone(),
            // Not a precondition (the body does not carry it): the field
            // is ours alone. It makes the write memo forget a patch once
            // the Ingress changed, so a status overwritten since is
            // written again.
            resource_version: i.resource_version.clone(),
            body: json!({
                "apiVersion": api_version("Ingress"),
                "kind": "Ingress",
                "metadata": {"name": i.name, "namespace": i.namespace},
                "status": {"loadBalancer": desired},
            }),
        })
        .collect()
}

/// How many status patches [`StatusWriter::send`] has in flight at once.
pub const WRITES_IN_FLIGHT: usize = 8;

/// Sends status patches, remembering what it sent so that a patch is not
/// repeated before the watch has delivered the object it produced.
pub struct StatusWriter {
    client: Client,
    /// `Kind ns/name` -> (resourceVersion the patch was computed from, body).
    sent: HashMap<String, (Option<String>, Value)>,
    /// `Kind ns/name` of objects served but not in the API server (the
    /// routes converted from Ingresses): no status is written for them.
    not_in_cluster: BTreeSet<String>,
}

/// What one [`StatusWriter::sync`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncOutcome {
    pub written: usize,
    pub failed: usize,
    /// Refused because the object changed since it was read (409): written
    /// again from the object the watch delivers.
    pub conflicts: usize,
}

impl StatusWriter {
    pub fn new(client: Client) -> Self {
        StatusWriter {
            client,
            sent: HashMap::new(),
            not_in_cluster: BTreeSet::new(),
        }
    }

    /// The objects (`Kind ns/name`) served that are not in the API server,
    /// whose status is not written.
    pub fn set_not_in_cluster(&mut self, ids: impl IntoIterator<Item = String>) {
        self.not_in_cluster = ids.into_iter().collect();
    }

    /// Forget what was sent (when leadership is gained again, the cluster
    /// may have changed under another leader).
    pub fn forget(&mut self) {
        self.sent.clear();
    }

    /// Apply every patch of [`plan`] not already sent. Failures are logged
    /// and counted; the caller retries later.
    pub async fn sync(
        &mut self,
        snapshot: &Snapshot,
        report: &StatusReport,
        addresses: Option<&[GatewayStatusAddresses]>,
        rollouts: &RolloutReport,
    ) -> SyncOutcome {
        self.send_planned(plan(snapshot, report, addresses, rollouts))
            .await
    }

    /// Apply every patch of a [`plan`] computed elsewhere (off the async
    /// workers) not already sent, as [`sync`](Self::sync) does.
    pub async fn send_planned(&mut self, planned: Vec<StatusPatch>) -> SyncOutcome {
        let patches = planned
            .into_iter()
            .filter(|p| !self.not_in_cluster.contains(&p.id()))
            .collect();
        self.send(patches).await
    }

    /// Apply every patch not already sent (as [`sync`](Self::sync) does
    /// with [`plan`]'s, e.g. [`ingress_plan`]'s).
    ///
    /// Up to [`WRITES_IN_FLIGHT`] patches are in flight at once: each is
    /// an API server round trip, and after a start with 10,000 routes
    /// every route's status is written.
    pub async fn send(&mut self, patches: Vec<StatusPatch>) -> SyncOutcome {
        use futures_util::stream::{self, StreamExt};
        let mut outcome = SyncOutcome::default();
        let due: Vec<StatusPatch> = patches
            .into_iter()
            .filter(|patch| {
                self.sent.get(&patch.id()).is_none_or(|(version, body)| {
                    *version != patch.resource_version || *body != patch.body
                })
            })
            .collect();
        let this = &*self;
        let results: Vec<(StatusPatch, Result<(), kube::Error>)> = stream::iter(due)
            .map(|patch| async move {
                let result = this.apply(&patch).await;
                (patch, result)
            })
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        for (patch, result) in results {
            let id = patch.id();
            match result {
                Ok(()) => {
                    tracing::debug!(object = %id, "status written");
                    outcome.written += 1;
                    self.sent.insert(id, (patch.resource_version, patch.body));
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    tracing::debug!(object = %id, "object deleted before its status was written");
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::info!(object = %id, "status changed by another writer since it was read; computed again from the new version");
                    outcome.conflicts += 1;
                }
                Err(error) => {
                    tracing::warn!(object = %id, %error, "cannot write status");
                    outcome.failed += 1;
                }
            }
        }
        outcome
    }

    /// One server-side apply of `patch` to its object's `/status`.
    pub async fn apply(&self, patch: &StatusPatch) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        patch
            .api(self.client.clone())
            .patch_status(&patch.name, &params, &Patch::Apply(&patch.body))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests;
