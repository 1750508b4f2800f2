//! The objects the watches have delivered so far, kind by kind, and the
//! [`Snapshot`] they make.
//!
//! This is the pure half of the Kubernetes source: it is fed the watcher's
//! events (`Init`, `InitApply`, `InitDone`, `Apply`, `Delete`) and never does
//! I/O, so it is tested with synthetic event streams. Two rules keep the
//! proxy safe:
//!
//! - nothing is ready before every kind has completed its first list, so an
//!   empty table after a restart never reaches the proxy;
//! - a relist (after a watch failed or expired with 410 Gone) is collected
//!   aside and replaces the kind's objects only when it is complete, so the
//!   current table keeps serving in between.
//!
//! Each object is converted with the same loader the file source uses
//! ([`parse_manifests`]), so both modes build the same typed objects and
//! refuse the same invalid ones, with errors that name object and field.
//!
//! Optional kinds ([`WatchedKind::optional`]: ListenerSet,
//! BackendTLSPolicy, GRPCRoute, TLSRoute and RolloutPolicy, whose CRDs a
//! cluster may not have installed) that the
//! API server does not know (404) count as listed with no objects
//! ([`ClusterCache::not_installed`]), so a cluster without those CRDs still
//! becomes ready.
//!
//! Secrets and ConfigMaps are watched cluster-wide but only the ones a
//! Gateway, ListenerSet or BackendTLSPolicy references reach the snapshot,
//! and of a ConfigMap only its `ca.crt` is kept (the only key sluice reads),
//! so other applications' ConfigMaps cost a name each, not their data; a
//! change to one nothing references does not make a new snapshot.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;

use std::sync::Arc;

use crate::resources::crd::Crds;
use crate::resources::{DEFAULT_NAMESPACE, Gateway, Object, Snapshot, parse_manifests_with};
use crate::source::files::IngressServing;
use crate::source::{ConfigError, SourceUpdate};

use super::ingresses::{self, ServedIngresses};

/// A kind sluice watches: where it lives in the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedKind {
    pub kind: &'static str,
    /// API group (`""` for the core group).
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// Field selector of the watch, if it only needs some objects.
    pub field_selector: Option<&'static str>,
    /// A kind whose CRD may not be installed: a 404 from the API server
    /// means "no objects of this kind", not "not listed yet".
    pub optional: bool,
}

impl WatchedKind {
    /// `v1` or `gateway.networking.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Every kind the gateway's configuration is made of. Secrets are only the
/// TLS ones; of those, and of ConfigMaps, only the ones a Gateway,
/// ListenerSet or BackendTLSPolicy references reach the snapshot.
pub const WATCHED_KINDS: [WatchedKind; 14] = [
    WatchedKind {
        kind: "GatewayClass",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "gatewayclasses",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "Gateway",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "gateways",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "HTTPRoute",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "httproutes",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "ReferenceGrant",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "referencegrants",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "Service",
        group: "",
        version: "v1",
        plural: "services",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "EndpointSlice",
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "Namespace",
        group: "",
        version: "v1",
        plural: "namespaces",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "Secret",
        group: "",
        version: "v1",
        plural: "secrets",
        field_selector: Some("type=kubernetes.io/tls"),
        optional: false,
    },
    WatchedKind {
        kind: "ConfigMap",
        group: "",
        version: "v1",
        plural: "configmaps",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "ListenerSet",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "listenersets",
        field_selector: None,
        optional: true,
    },
    WatchedKind {
        kind: "BackendTLSPolicy",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "backendtlspolicies",
        field_selector: None,
        optional: true,
    },
    WatchedKind {
        kind: "GRPCRoute",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "grpcroutes",
        field_selector: None,
        optional: true,
    },
    WatchedKind {
        kind: "TLSRoute",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "tlsroutes",
        field_selector: None,
        optional: true,
    },
    // sluice's own kind (deploy/rolloutpolicy-crd.yaml), with its status:
    // the leader records each rollout there, and every replica serves the
    // step recorded.
    WatchedKind {
        kind: "RolloutPolicy",
        group: "sluice.dev",
        version: "v1alpha1",
        plural: "rolloutpolicies",
        field_selector: None,
        optional: true,
    },
];

/// What an API object became after loading: its typed object, or the
/// problems that keep it out of the snapshot.
#[derive(Debug, Clone, PartialEq)]
struct Loaded {
    objects: Vec<Object>,
    errors: Vec<ConfigError>,
    /// An Ingress or IngressClass as the API server sent it: not gateway
    /// configuration itself, converted at each snapshot ([`ingresses`]).
    raw: Option<serde_json::Value>,
}

impl Loaded {
    /// The same route but for its status (see
    /// [`Object::same_route_but_status`]).
    fn same_route_but_status(&self, other: &Loaded) -> bool {
        self.errors == other.errors
            && self.raw.is_none()
            && other.raw.is_none()
            && self.objects.len() == other.objects.len()
            && !self.objects.is_empty()
            && self
                .objects
                .iter()
                .zip(&other.objects)
                .all(|(a, b)| a.same_route_but_status(b))
    }
}

/// What one watch event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing the snapshot holds.
    None,
    /// A route's status (and the resourceVersion writing it made), as
    /// after a status write: nothing served changes, but the status
    /// writer works from the snapshot.
    RouteStatus,
    /// The configuration.
    Configuration,
}

/// `namespace/name` (or `name` for cluster-scoped kinds).
type Key = String;

#[derive(Debug, Default)]
struct KindCache {
    current: BTreeMap<Key, Loaded>,
    /// A list in progress: replaces `current` when it is complete.
    relisting: Option<BTreeMap<Key, Loaded>>,
    /// The first list completed.
    listed: bool,
    /// The API server last answered 404 for this kind (an optional kind
    /// whose CRD is not installed).
    not_installed: bool,
}

/// The objects of every watched kind.
#[derive(Debug)]
pub struct ClusterCache {
    kinds: Vec<(WatchedKind, KindCache)>,
    /// CRDs that validate the objects of the kinds they define.
    crds: Arc<Crds>,
    /// `serve --ingress-class`: the Ingresses of the class are converted.
    ingresses: Option<IngressServing>,
}

impl Default for ClusterCache {
    fn default() -> Self {
        Self::new(&WATCHED_KINDS)
    }
}

impl ClusterCache {
    pub fn new(kinds: &[WatchedKind]) -> Self {
        ClusterCache {
            kinds: kinds.iter().map(|k| (*k, KindCache::default())).collect(),
            crds: Arc::default(),
            ingresses: None,
        }
    }

    /// Serve the Ingresses of a class through the conversion: the cache
    /// must have been made with the [`INGRESS_KINDS`](ingresses::INGRESS_KINDS)
    /// among its kinds.
    pub fn with_ingresses(mut self, serving: Option<IngressServing>) -> Self {
        self.ingresses = serving;
        self
    }

    /// The kind number `kind` is.
    pub fn kind(&self, kind: usize) -> Option<&WatchedKind> {
        self.kinds.get(kind).map(|(k, _)| k)
    }

    /// Validate the objects of the kinds `crds` defines by their CRD.
    pub fn with_crds(mut self, crds: Arc<Crds>) -> Self {
        self.crds = crds;
        self
    }

    /// Every kind has completed its first list.
    pub fn ready(&self) -> bool {
        self.kinds.iter().all(|(_, c)| c.listed)
    }

    /// Apply one watcher event for kind number `kind` (an index into the
    /// kinds this cache was made with). Returns whether the objects that
    /// make the snapshot changed.
    pub fn apply(&mut self, kind: usize, event: Event<DynamicObject>) -> bool {
        self.apply_event(kind, event) != Change::None
    }

    /// [`apply`](Self::apply), telling a change of routes' status alone
    /// apart from one of the configuration.
    pub fn apply_event(&mut self, kind: usize, event: Event<DynamicObject>) -> Change {
        // A Secret or ConfigMap nothing references changes nothing: other
        // applications' ConfigMaps (leader-election records among them) can
        // change every few seconds, and must not cost a translation each.
        let referenced = match (self.kinds.get(kind), &event) {
            (Some((watched, _)), Event::Apply(object) | Event::Delete(object))
                if is_filtered(watched) =>
            {
                let (key, _) = key_of(watched, object);
                Some(self.references().contains(watched.kind, &key))
            }
            _ => None,
        };
        let Some((watched, cache)) = self.kinds.get_mut(kind) else {
            return Change::None;
        };
        let changed = match event {
            Event::Init => {
                cache.relisting = Some(BTreeMap::new());
                false
            }
            Event::InitApply(object) => {
                let (key, loaded) = load(watched, &self.crds, object);
                cache
                    .relisting
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, loaded);
                false
            }
            Event::InitDone => {
                let listed = cache.relisting.take().unwrap_or_default();
                let first = !cache.listed;
                cache.listed = true;
                cache.not_installed = false;
                let changed = listed != cache.current;
                cache.current = listed;
                // The first list always counts: it may be what makes the
                // cache ready, even when it is empty.
                changed || first
            }
            Event::Apply(object) => {
                cache.not_installed = false;
                let (key, loaded) = load(watched, &self.crds, object);
                match cache.current.insert(key, loaded.clone()) {
                    Some(previous) if previous == loaded => false,
                    Some(previous) if loaded.same_route_but_status(&previous) => {
                        return Change::RouteStatus;
                    }
                    _ => true,
                }
            }
            Event::Delete(object) => {
                let (key, _) = key_of(watched, &object);
                cache.current.remove(&key).is_some()
            }
        };
        if changed && referenced != Some(false) {
            Change::Configuration
        } else {
            Change::None
        }
    }

    /// The Secrets and ConfigMaps the current objects reference.
    fn references(&self) -> References {
        let referring = self
            .kinds
            .iter()
            .filter(|(watched, _)| {
                matches!(watched.kind, "Gateway" | "ListenerSet" | "BackendTLSPolicy")
            })
            .flat_map(|(_, cache)| cache.current.values())
            .flat_map(|loaded| &loaded.objects);
        References::of(referring)
    }

    /// The API server answered 404 for kind number `kind`: its CRD is not
    /// installed. For an optional kind that is a complete list with no
    /// objects (the kind is listed, and objects it had are gone); the
    /// watcher keeps retrying with backoff, so a CRD installed later is
    /// listed then. A mandatory kind is left as it is: the gateway does not
    /// become ready without it. Returns whether the snapshot changed.
    pub fn not_installed(&mut self, kind: usize) -> bool {
        let Some((watched, cache)) = self.kinds.get_mut(kind) else {
            return false;
        };
        if !watched.optional {
            return false;
        }
        cache.relisting = None;
        cache.not_installed = true;
        let first = !cache.listed;
        cache.listed = true;
        let had_objects = !cache.current.is_empty();
        cache.current.clear();
        had_objects || first
    }

    /// Whether the API server last answered 404 for kind number `kind`.
    pub fn is_not_installed(&self, kind: usize) -> bool {
        self.kinds.get(kind).is_some_and(|(_, c)| c.not_installed)
    }

    /// The snapshot the objects make, with the problems of the objects that
    /// could not be loaded.
    pub fn update(&self) -> SourceUpdate {
        self.update_with_ingresses().0
    }

    /// [`update`](Self::update), and when Ingresses are served, what
    /// serving them made (the Ingresses served, the report).
    pub fn update_with_ingresses(&self) -> (SourceUpdate, Option<ServedIngresses>) {
        let mut objects = Vec::new();
        let mut errors = Vec::new();
        let mut secrets = Vec::new();
        let mut config_maps = Vec::new();
        let mut ingress_objects = Vec::new();
        let mut ingress_classes = Vec::new();
        for (watched, cache) in &self.kinds {
            for (key, loaded) in &cache.current {
                match watched.kind {
                    "Secret" => secrets.push((key, loaded)),
                    "ConfigMap" => config_maps.push((key, loaded)),
                    "Ingress" | "IngressClass" => {
                        let raws = match watched.kind {
                            "Ingress" => &mut ingress_objects,
                            _ => &mut ingress_classes,
                        };
                        raws.extend(loaded.raw.as_ref());
                        errors.extend(loaded.errors.iter().cloned());
                    }
                    _ => {
                        objects.extend(loaded.objects.iter().cloned());
                        errors.extend(loaded.errors.iter().cloned());
                    }
                }
            }
        }
        // Only the Secrets and ConfigMaps the configuration references: TLS
        // keys and settings of other applications have no business in the
        // gateway's configuration.
        let references = References::of(&objects);
        for (key, loaded) in secrets {
            if references.secrets.contains(key) {
                objects.extend(loaded.objects.iter().cloned());
                errors.extend(loaded.errors.iter().cloned());
            }
        }
        for (key, loaded) in config_maps {
            if references.config_maps.contains(key) {
                objects.extend(loaded.objects.iter().cloned());
                errors.extend(loaded.errors.iter().cloned());
            }
        }
        let served = self.ingresses.as_ref().map(|serving| {
            let services: Vec<_> = objects
                .iter()
                .filter_map(|o| match o {
                    Object::Service(s) => Some(s.clone()),
                    _ => None,
                })
                .collect();
            let (converted, conversion_errors, served) = ingresses::convert(
                serving,
                &ingress_objects,
                &ingress_classes,
                &services,
                &self.crds,
            );
            objects.extend(converted);
            errors.extend(conversion_errors);
            served
        });
        let count = objects.len();
        let update = SourceUpdate {
            snapshot: Snapshot::from_objects(objects),
            errors,
            objects: count,
        };
        (update, served)
    }
}

/// `namespace/name` of the Secrets and ConfigMaps the configuration names.
#[derive(Debug, Default)]
struct References {
    /// Listener `tls.certificateRefs` of Gateways and ListenerSets, and
    /// Gateway `spec.tls.backend.clientCertificateRef`.
    secrets: BTreeSet<Key>,
    /// Gateway `spec.tls.frontend` CA certificates (default and per port)
    /// and BackendTLSPolicy `spec.validation.caCertificateRefs`.
    config_maps: BTreeSet<Key>,
}

impl References {
    /// `kind` (Secret or ConfigMap) `namespace/name` is referenced.
    fn contains(&self, kind: &str, key: &str) -> bool {
        match kind {
            "Secret" => self.secrets.contains(key),
            "ConfigMap" => self.config_maps.contains(key),
            _ => true,
        }
    }

    fn of<'a>(objects: impl IntoIterator<Item = &'a Object>) -> References {
        let mut refs = References::default();
        for object in objects {
            match object {
                Object::Gateway(g) => refs.gateway(g),
                Object::ListenerSet(set) => {
                    let ns = namespace_of(&set.metadata);
                    for listener in &set.spec.listeners {
                        let certs = listener
                            .tls
                            .as_ref()
                            .and_then(|t| t.certificate_refs.as_ref());
                        for r in certs.into_iter().flatten() {
                            let (group, kind) = (r.group.as_deref(), r.kind.as_deref());
                            refs.secret(ns, group, kind, r.namespace.as_deref(), &r.name);
                        }
                    }
                }
                Object::BackendTlsPolicy(policy) => {
                    let ns = namespace_of(&policy.metadata);
                    let cas = policy.spec.validation.ca_certificate_refs.as_ref();
                    for r in cas.into_iter().flatten() {
                        refs.config_map(ns, Some(&r.group), Some(&r.kind), None, &r.name);
                    }
                }
                _ => {}
            }
        }
        refs
    }

    fn gateway(&mut self, gateway: &Gateway) {
        let ns = namespace_of(&gateway.metadata);
        for listener in &gateway.spec.listeners {
            let certs = listener
                .tls
                .as_ref()
                .and_then(|t| t.certificate_refs.as_ref());
            for r in certs.into_iter().flatten() {
                let (group, kind) = (r.group.as_deref(), r.kind.as_deref());
                self.secret(ns, group, kind, r.namespace.as_deref(), &r.name);
            }
        }
        let Some(tls) = &gateway.spec.tls else {
            return;
        };
        let client = tls
            .backend
            .as_ref()
            .and_then(|b| b.client_certificate_ref.as_ref());
        if let Some(r) = client {
            let (group, kind) = (r.group.as_deref(), r.kind.as_deref());
            self.secret(ns, group, kind, r.namespace.as_deref(), &r.name);
        }
        if let Some(frontend) = &tls.frontend {
            let default = frontend.default.validation.as_ref();
            for r in default.iter().flat_map(|v| &v.ca_certificate_refs) {
                let ns_ref = r.namespace.as_deref();
                self.config_map(ns, Some(&r.group), Some(&r.kind), ns_ref, &r.name);
            }
            let per_port = frontend.per_port.iter().flatten();
            let validations = per_port.filter_map(|p| p.tls.validation.as_ref());
            for r in validations.flat_map(|v| &v.ca_certificate_refs) {
                let ns_ref = r.namespace.as_deref();
                self.config_map(ns, Some(&r.group), Some(&r.kind), ns_ref, &r.name);
            }
        }
    }

    /// A reference to a core Secret (group empty, kind Secret by default).
    fn secret(
        &mut self,
        from_ns: &str,
        group: Option<&str>,
        kind: Option<&str>,
        namespace: Option<&str>,
        name: &str,
    ) {
        if is_core_kind(group, kind, "Secret") {
            let ns = namespace.unwrap_or(from_ns);
            self.secrets.insert(format!("{ns}/{name}"));
        }
    }

    /// A reference to a core ConfigMap.
    fn config_map(
        &mut self,
        from_ns: &str,
        group: Option<&str>,
        kind: Option<&str>,
        namespace: Option<&str>,
        name: &str,
    ) {
        if is_core_kind(group, kind, "ConfigMap") {
            let ns = namespace.unwrap_or(from_ns);
            self.config_maps.insert(format!("{ns}/{name}"));
        }
    }
}

/// Kinds of which only the referenced objects reach the snapshot.
fn is_filtered(watched: &WatchedKind) -> bool {
    matches!(watched.kind, "Secret" | "ConfigMap")
}

/// `group`/`kind` of a reference name core `expected` (`kind` defaults to
/// `expected`, as Secret references do).
fn is_core_kind(group: Option<&str>, kind: Option<&str>, expected: &str) -> bool {
    group.is_none_or(str::is_empty) && kind.is_none_or(|k| k == expected)
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
}

/// The cache key of an API object, and its `Kind namespace/name`.
fn key_of(watched: &WatchedKind, object: &DynamicObject) -> (Key, String) {
    let name = object.metadata.name.as_deref().unwrap_or("");
    match object.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => (
            format!("{ns}/{name}"),
            format!("{} {ns}/{name}", watched.kind),
        ),
        _ => (name.to_string(), format!("{} {name}", watched.kind)),
    }
}

/// Load an API object with the manifest loader. List items carry no
/// `apiVersion`/`kind`, so the watched kind's are set first.
fn load(watched: &WatchedKind, crds: &Crds, mut object: DynamicObject) -> (Key, Loaded) {
    let (key, id) = key_of(watched, &object);
    object.types = Some(kube::api::TypeMeta {
        api_version: watched.api_version(),
        kind: watched.kind.to_string(),
    });
    // managedFields are noise for the loader and can be large.
    object.metadata.managed_fields = None;
    if ingresses::is_ingress_kind(watched) {
        let (objects, mut errors) = (Vec::new(), Vec::new());
        let raw = match serde_json::to_value(&object) {
            Ok(value) => Some(value),
            Err(error) => {
                errors.push(ConfigError {
                    file: "kubernetes".into(),
                    line: None,
                    object: Some(id),
                    field: None,
                    message: format!("cannot read the object: {error}"),
                });
                None
            }
        };
        let loaded = Loaded {
            objects,
            errors,
            raw,
        };
        return (key, loaded);
    }
    if watched.kind == "ConfigMap" {
        keep_only_ca_certificates(&mut object);
    }
    let loaded = match serde_json::to_string(&object) {
        Ok(json) => {
            let parsed = parse_manifests_with(&json, "kubernetes", crds);
            Loaded {
                objects: parsed.objects.into_iter().map(|o| o.object).collect(),
                errors: parsed
                    .errors
                    .iter()
                    .map(|e| ConfigError {
                        line: None,
                        ..ConfigError::from(e)
                    })
                    .collect(),
                raw: None,
            }
        }
        Err(error) => Loaded {
            objects: Vec::new(),
            errors: vec![ConfigError {
                file: "kubernetes".into(),
                line: None,
                object: Some(id),
                field: None,
                message: format!("cannot read the object: {error}"),
            }],
            raw: None,
        },
    };
    (key, loaded)
}

/// The ConfigMap key sluice reads (CA certificates, PEM).
const CA_KEY: &str = "ca.crt";

/// Drop every key of a ConfigMap's `data` and `binaryData` but `ca.crt`:
/// ConfigMaps are watched cluster-wide and most belong to other
/// applications, so the cache keeps only what sluice could use.
fn keep_only_ca_certificates(object: &mut DynamicObject) {
    for field in ["data", "binaryData"] {
        if let Some(serde_json::Value::Object(map)) = object.data.get_mut(field) {
            map.retain(|key, _| key == CA_KEY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn kind_index(kind: &str) -> usize {
        WATCHED_KINDS
            .iter()
            .position(|k| k.kind == kind)
            .expect("a watched kind")
    }

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).expect("a valid DynamicObject")
    }

    fn service(name: &str, port: i32) -> DynamicObject {
        object(json!({
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
            "spec": {"ports": [{"port": port}]},
        }))
    }

    /// Complete the first list of every kind with no objects.
    fn list_all_empty(cache: &mut ClusterCache) {
        for i in 0..WATCHED_KINDS.len() {
            cache.apply(i, Event::Init);
            cache.apply(i, Event::InitDone);
        }
    }

    fn service_names(cache: &ClusterCache) -> Vec<String> {
        cache
            .update()
            .snapshot
            .services
            .iter()
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn not_ready_until_every_kind_has_listed() {
        let mut cache = ClusterCache::default();
        let svc = kind_index("Service");
        cache.apply(svc, Event::Init);
        cache.apply(svc, Event::InitApply(service("web", 80)));
        assert!(cache.apply(svc, Event::InitDone));
        assert!(!cache.ready(), "other kinds have not listed yet");
        for i in 0..WATCHED_KINDS.len() {
            if i != svc {
                assert!(!cache.ready());
                cache.apply(i, Event::Init);
                assert!(cache.apply(i, Event::InitDone), "a first list counts");
            }
        }
        assert!(cache.ready());
        assert_eq!(service_names(&cache), ["web"]);
    }

    #[test]
    fn apply_and_delete_change_the_snapshot() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let svc = kind_index("Service");
        assert!(cache.apply(svc, Event::Apply(service("web", 80))));
        assert!(
            !cache.apply(svc, Event::Apply(service("web", 80))),
            "the same object again changes nothing"
        );
        assert!(cache.apply(svc, Event::Apply(service("web", 81))));
        assert_eq!(
            cache.update().snapshot.services[0]
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map(|p| p[0].port),
            Some(81)
        );
        assert!(cache.apply(svc, Event::Delete(service("web", 81))));
        assert!(!cache.apply(svc, Event::Delete(service("web", 81))));
        assert!(service_names(&cache).is_empty());
    }

    #[test]
    fn a_relist_keeps_the_current_objects_until_it_is_complete() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let svc = kind_index("Service");
        cache.apply(svc, Event::Apply(service("old", 80)));
        cache.apply(svc, Event::Apply(service("kept", 80)));

        // The watch expired (410 Gone): the watcher lists again.
        assert!(!cache.apply(svc, Event::Init));
        assert!(!cache.apply(svc, Event::InitApply(service("kept", 80))));
        assert!(!cache.apply(svc, Event::InitApply(service("new", 80))));
        assert_eq!(
            service_names(&cache),
            ["kept", "old"],
            "mid-relist the last complete list serves"
        );
        assert!(cache.apply(svc, Event::InitDone));
        assert_eq!(service_names(&cache), ["kept", "new"]);

        // A relist that finds what is already there changes nothing.
        cache.apply(svc, Event::Init);
        cache.apply(svc, Event::InitApply(service("kept", 80)));
        cache.apply(svc, Event::InitApply(service("new", 80)));
        assert!(!cache.apply(svc, Event::InitDone));
    }

    #[test]
    fn a_route_status_write_is_told_apart_from_a_configuration_change() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let route = |weight: u32, version: &str, status: serde_json::Value| {
            let mut route = json!({
                "metadata": {"name": "web", "namespace": "shop", "resourceVersion": version},
                "spec": {"parentRefs": [{"name": "gw"}],
                         "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": weight}]}]},
            });
            if !status.is_null() {
                route["status"] = status;
            }
            object(route)
        };
        let ours = json!({"parents": [{"parentRef": {"name": "gw"},
            "controllerName": "sluice.dev/gateway-controller", "conditions": []}]});
        let kind = kind_index("HTTPRoute");
        let apply = |cache: &mut ClusterCache, o| cache.apply_event(kind, Event::Apply(o));
        assert_eq!(
            apply(&mut cache, route(1, "1", serde_json::Value::Null)),
            Change::Configuration,
            "a new route"
        );
        assert_eq!(
            apply(&mut cache, route(1, "1", serde_json::Value::Null)),
            Change::None
        );
        assert_eq!(
            apply(&mut cache, route(1, "2", ours.clone())),
            Change::RouteStatus,
            "our status written"
        );
        assert_eq!(
            cache.update().snapshot.http_routes[0]
                .metadata
                .resource_version
                .as_deref(),
            Some("2"),
            "the snapshot has the version the write made"
        );
        assert_eq!(
            apply(&mut cache, route(2, "3", ours)),
            Change::Configuration,
            "the spec changed"
        );
        // A Service is not a route: any change of it is configuration.
        let svc = kind_index("Service");
        cache.apply(svc, Event::Apply(service("web", 80)));
        let mut written = service("web", 80);
        written.metadata.resource_version = Some("9".into());
        assert_eq!(
            cache.apply_event(svc, Event::Apply(written)),
            Change::Configuration
        );
    }

    #[test]
    fn invalid_objects_are_reported_by_object_and_field() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let route = object(json!({
            "metadata": {"name": "bad", "namespace": "shop"},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": 2000000}]}]},
        }));
        cache.apply(kind_index("HTTPRoute"), Event::Apply(route));
        let update = cache.update();
        assert!(update.snapshot.http_routes.is_empty());
        assert_eq!(update.errors.len(), 1, "{:?}", update.errors);
        let error = &update.errors[0];
        assert_eq!(error.object.as_deref(), Some("HTTPRoute shop/bad"));
        assert_eq!(
            error.field.as_deref(),
            Some("spec.rules[0].backendRefs[0].weight")
        );
    }

    #[test]
    fn with_crds_objects_are_validated_by_them() {
        let crd: serde_json::Value = crate::yaml::from_str(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
             metadata: {name: httproutes.gateway.networking.k8s.io}\n\
             spec:\n  group: gateway.networking.k8s.io\n  names: {kind: HTTPRoute, plural: httproutes}\n  \
             scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    \
             schema:\n      openAPIV3Schema:\n        type: object\n        \
             x-kubernetes-preserve-unknown-fields: true\n        \
             x-kubernetes-validations: [{rule: \"self.metadata.name != 'forbidden'\", message: not this name}]\n",
        )
        .expect("test CRD");
        let mut crds = Crds::new();
        crds.add(&crd, "test").expect("a usable CRD");
        let mut cache = ClusterCache::default().with_crds(Arc::new(crds));
        list_all_empty(&mut cache);
        for name in ["forbidden", "fine"] {
            let route = object(json!({
                "metadata": {"name": name, "namespace": "shop"},
                "spec": {"parentRefs": [{"name": "gw"}]},
            }));
            cache.apply(kind_index("HTTPRoute"), Event::Apply(route));
        }
        let update = cache.update();
        assert_eq!(update.snapshot.http_routes.len(), 1, "{:?}", update.errors);
        assert_eq!(update.errors.len(), 1, "{:?}", update.errors);
        assert_eq!(
            update.errors[0].object.as_deref(),
            Some("HTTPRoute shop/forbidden")
        );
        assert_eq!(
            update.errors[0].message,
            "Invalid value: \"object\": not this name"
        );
    }

    fn keys<'a>(metas: impl Iterator<Item = &'a ObjectMeta>) -> Vec<String> {
        metas
            .map(|m| {
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or(""),
                    m.name.as_deref().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn only_secrets_gateways_and_listener_sets_reference_reach_the_snapshot() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let gateway = object(json!({
            "metadata": {"name": "gw", "namespace": "edge"},
            "spec": {"gatewayClassName": "sluice", "listeners": [{
                "name": "https", "protocol": "HTTPS", "port": 443,
                "tls": {"certificateRefs": [{"name": "cert"}, {"name": "other", "namespace": "certs"}]},
            }],
            "tls": {"backend": {"clientCertificateRef": {"name": "client"}}}},
        }));
        cache.apply(kind_index("Gateway"), Event::Apply(gateway));
        let set = object(json!({
            "metadata": {"name": "extra", "namespace": "team"},
            "spec": {"parentRef": {"name": "gw", "namespace": "edge"}, "listeners": [{
                "name": "https", "protocol": "HTTPS", "port": 8443,
                "tls": {"certificateRefs": [{"name": "team-cert"},
                                            {"name": "not-a-secret", "kind": "ConfigMap", "group": ""}]},
            }]},
        }));
        cache.apply(kind_index("ListenerSet"), Event::Apply(set));
        let secrets = [
            ("edge", "cert"),
            ("edge", "unrelated"),
            ("certs", "other"),
            ("edge", "client"),
            ("team", "team-cert"),
            ("team", "not-a-secret"),
        ];
        for (ns, name) in secrets {
            let secret = object(json!({
                "metadata": {"name": name, "namespace": ns},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
            }));
            cache.apply(kind_index("Secret"), Event::Apply(secret));
        }
        let update = cache.update();
        assert!(update.errors.is_empty(), "{:?}", update.errors);
        assert_eq!(update.snapshot.listener_sets.len(), 1);
        assert_eq!(
            keys(update.snapshot.secrets.iter().map(|s| &s.metadata)),
            ["certs/other", "edge/cert", "edge/client", "team/team-cert"]
        );
    }

    #[test]
    fn config_maps_are_kept_only_when_referenced_and_only_with_their_ca() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let gateway = object(json!({
            "metadata": {"name": "gw", "namespace": "edge"},
            "spec": {"gatewayClassName": "sluice", "listeners": [{
                "name": "https", "protocol": "HTTPS", "port": 443,
                "tls": {"certificateRefs": [{"name": "cert"}]},
            }],
            "tls": {"frontend": {
                "default": {"validation": {"caCertificateRefs": [
                    {"group": "", "kind": "ConfigMap", "name": "clients"}]}},
                "perPort": [{"port": 443, "tls": {"validation": {"caCertificateRefs": [
                    {"group": "", "kind": "ConfigMap", "name": "partners", "namespace": "cas"}]}}}],
            }}},
        }));
        cache.apply(kind_index("Gateway"), Event::Apply(gateway));
        let policy = object(json!({
            "metadata": {"name": "tls", "namespace": "shop"},
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "api"}],
                     "validation": {"hostname": "api.shop",
                                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "api-ca"}]}},
        }));
        cache.apply(kind_index("BackendTLSPolicy"), Event::Apply(policy));
        for (ns, name) in [
            ("edge", "clients"),
            ("cas", "partners"),
            ("shop", "api-ca"),
            ("shop", "app-settings"),
            ("edge", "partners"),
        ] {
            let config_map = object(json!({
                "metadata": {"name": name, "namespace": ns},
                "data": {"ca.crt": "PEM", "settings.json": "x".repeat(10_000)},
                "binaryData": {"blob": "AAAA", "ca.crt": "UEVN"},
            }));
            cache.apply(kind_index("ConfigMap"), Event::Apply(config_map));
        }
        let update = cache.update();
        assert!(update.errors.is_empty(), "{:?}", update.errors);
        assert_eq!(update.snapshot.backend_tls_policies.len(), 1);
        let config_maps = &update.snapshot.config_maps;
        assert_eq!(
            keys(config_maps.iter().map(|c| &c.metadata)),
            ["cas/partners", "edge/clients", "shop/api-ca"]
        );
        for c in config_maps {
            let data: Vec<&String> = c.data.iter().flat_map(|d| d.keys()).collect();
            let binary: Vec<&String> = c.binary_data.iter().flat_map(|d| d.keys()).collect();
            assert_eq!(data, ["ca.crt"], "other keys are dropped");
            assert_eq!(binary, ["ca.crt"], "other keys are dropped");
        }
    }

    #[test]
    fn a_change_to_a_config_map_or_secret_nothing_references_changes_nothing() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let config_map = |name: &str, value: &str| {
            object(json!({
                "metadata": {"name": name, "namespace": "shop"},
                "data": {"ca.crt": value},
            }))
        };
        let cms = kind_index("ConfigMap");
        assert!(!cache.apply(cms, Event::Apply(config_map("leader", "1"))));
        assert!(!cache.apply(cms, Event::Apply(config_map("leader", "2"))));
        assert!(!cache.apply(cms, Event::Apply(config_map("api-ca", "PEM"))));
        let secret = object(json!({
            "metadata": {"name": "other-app", "namespace": "shop"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
        }));
        assert!(!cache.apply(kind_index("Secret"), Event::Apply(secret)));

        // A policy starts referencing api-ca: the policy is the change.
        let policy = object(json!({
            "metadata": {"name": "tls", "namespace": "shop"},
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "api"}],
                     "validation": {"hostname": "api.shop",
                                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "api-ca"}]}},
        }));
        assert!(cache.apply(kind_index("BackendTLSPolicy"), Event::Apply(policy)));
        assert_eq!(cache.update().snapshot.config_maps.len(), 1);
        assert!(cache.apply(cms, Event::Apply(config_map("api-ca", "NEW PEM"))));
        assert!(!cache.apply(cms, Event::Apply(config_map("leader", "3"))));
        assert!(cache.apply(cms, Event::Delete(config_map("api-ca", "NEW PEM"))));
        assert!(!cache.apply(cms, Event::Delete(config_map("leader", "3"))));
        assert!(cache.update().snapshot.config_maps.is_empty());
    }

    #[test]
    fn an_optional_kind_that_is_not_installed_lists_empty() {
        let mut cache = ClusterCache::default();
        let sets = kind_index("ListenerSet");
        let policies = kind_index("BackendTLSPolicy");
        for i in 0..WATCHED_KINDS.len() {
            if i != sets && i != policies {
                cache.apply(i, Event::Init);
                cache.apply(i, Event::InitDone);
            }
        }
        assert!(!cache.ready());
        assert!(cache.not_installed(sets), "a first (empty) list counts");
        assert!(!cache.ready());
        assert!(cache.not_installed(policies));
        assert!(
            cache.ready(),
            "missing optional CRDs do not block readiness"
        );
        assert!(cache.is_not_installed(sets));
        assert!(!cache.not_installed(sets), "another 404 changes nothing");

        // The CRD is installed later: the watcher's retry lists it.
        let set = object(json!({
            "metadata": {"name": "extra", "namespace": "web"},
            "spec": {"parentRef": {"name": "gw"}, "listeners": [
                {"name": "http", "protocol": "HTTP", "port": 8080}]},
        }));
        cache.apply(sets, Event::Init);
        cache.apply(sets, Event::InitApply(set));
        assert!(cache.apply(sets, Event::InitDone));
        assert!(!cache.is_not_installed(sets));
        assert_eq!(cache.update().snapshot.listener_sets.len(), 1);

        // ...and removed again: its objects are gone with it.
        assert!(cache.not_installed(sets));
        assert!(cache.update().snapshot.listener_sets.is_empty());
    }

    #[test]
    fn a_mandatory_kind_that_is_not_installed_keeps_the_cache_unready() {
        let mut cache = ClusterCache::default();
        let gateways = kind_index("Gateway");
        for i in 0..WATCHED_KINDS.len() {
            if i != gateways {
                cache.apply(i, Event::Init);
                cache.apply(i, Event::InitDone);
            }
        }
        assert!(!cache.not_installed(gateways));
        assert!(!cache.is_not_installed(gateways));
        assert!(!cache.ready());
    }

    #[test]
    fn only_listener_sets_backend_tls_policies_grpc_and_tls_routes_and_rollout_policies_are_optional()
     {
        let optional: Vec<&str> = WATCHED_KINDS
            .iter()
            .filter(|k| k.optional)
            .map(|k| k.kind)
            .collect();
        assert_eq!(
            optional,
            [
                "ListenerSet",
                "BackendTLSPolicy",
                "GRPCRoute",
                "TLSRoute",
                "RolloutPolicy"
            ]
        );
    }

    #[test]
    fn list_items_without_kind_load_as_the_watched_kind() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let class = object(json!({
            "metadata": {"name": "sluice", "generation": 3},
            "spec": {"controllerName": "sluice.dev/gateway-controller"},
        }));
        cache.apply(kind_index("GatewayClass"), Event::Apply(class));
        let update = cache.update();
        assert!(update.errors.is_empty(), "{:?}", update.errors);
        assert_eq!(update.snapshot.gateway_classes.len(), 1);
        assert_eq!(
            update.snapshot.gateway_classes[0].metadata.generation,
            Some(3),
            "generations come from the API server"
        );
    }
}
