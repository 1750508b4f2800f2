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

use std::collections::{BTreeMap, BTreeSet};

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;

use crate::resources::{DEFAULT_NAMESPACE, Gateway, Object, Snapshot, parse_manifests};
use crate::source::{ConfigError, SourceUpdate};

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
/// TLS ones; of those, only the ones a listener references reach the
/// snapshot.
pub const WATCHED_KINDS: [WatchedKind; 8] = [
    WatchedKind {
        kind: "GatewayClass",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "gatewayclasses",
        field_selector: None,
    },
    WatchedKind {
        kind: "Gateway",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "gateways",
        field_selector: None,
    },
    WatchedKind {
        kind: "HTTPRoute",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "httproutes",
        field_selector: None,
    },
    WatchedKind {
        kind: "ReferenceGrant",
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "referencegrants",
        field_selector: None,
    },
    WatchedKind {
        kind: "Service",
        group: "",
        version: "v1",
        plural: "services",
        field_selector: None,
    },
    WatchedKind {
        kind: "EndpointSlice",
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        field_selector: None,
    },
    WatchedKind {
        kind: "Namespace",
        group: "",
        version: "v1",
        plural: "namespaces",
        field_selector: None,
    },
    WatchedKind {
        kind: "Secret",
        group: "",
        version: "v1",
        plural: "secrets",
        field_selector: Some("type=kubernetes.io/tls"),
    },
];

/// What an API object became after loading: its typed object, or the
/// problems that keep it out of the snapshot.
#[derive(Debug, Clone, PartialEq)]
struct Loaded {
    objects: Vec<Object>,
    errors: Vec<ConfigError>,
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
}

/// The objects of every watched kind.
#[derive(Debug)]
pub struct ClusterCache {
    kinds: Vec<(WatchedKind, KindCache)>,
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
        }
    }

    /// Every kind has completed its first list.
    pub fn ready(&self) -> bool {
        self.kinds.iter().all(|(_, c)| c.listed)
    }

    /// Apply one watcher event for kind number `kind` (an index into the
    /// kinds this cache was made with). Returns whether the objects that
    /// make the snapshot changed.
    pub fn apply(&mut self, kind: usize, event: Event<DynamicObject>) -> bool {
        let Some((watched, cache)) = self.kinds.get_mut(kind) else {
            return false;
        };
        match event {
            Event::Init => {
                cache.relisting = Some(BTreeMap::new());
                false
            }
            Event::InitApply(object) => {
                let (key, loaded) = load(watched, object);
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
                let changed = listed != cache.current;
                cache.current = listed;
                // The first list always counts: it may be what makes the
                // cache ready, even when it is empty.
                changed || first
            }
            Event::Apply(object) => {
                let (key, loaded) = load(watched, object);
                cache.current.insert(key, loaded.clone()) != Some(loaded)
            }
            Event::Delete(object) => {
                let (key, _) = key_of(watched, &object);
                cache.current.remove(&key).is_some()
            }
        }
    }

    /// The snapshot the objects make, with the problems of the objects that
    /// could not be loaded.
    pub fn update(&self) -> SourceUpdate {
        let mut objects = Vec::new();
        let mut errors = Vec::new();
        let mut secrets = Vec::new();
        for (watched, cache) in &self.kinds {
            for (key, loaded) in &cache.current {
                if watched.kind == "Secret" {
                    secrets.push((key, loaded));
                    continue;
                }
                objects.extend(loaded.objects.iter().cloned());
                errors.extend(loaded.errors.iter().cloned());
            }
        }
        // Only the Secrets a listener references: TLS keys of other
        // applications have no business in the gateway's configuration.
        let referenced = referenced_secrets(objects.iter().filter_map(|o| match o {
            Object::Gateway(g) => Some(g),
            _ => None,
        }));
        for (key, loaded) in secrets {
            if referenced.contains(key) {
                objects.extend(loaded.objects.iter().cloned());
                errors.extend(loaded.errors.iter().cloned());
            }
        }
        let count = objects.len();
        SourceUpdate {
            snapshot: Snapshot::from_objects(objects),
            errors,
            objects: count,
        }
    }
}

/// `namespace/name` of every Secret a Gateway listener names in
/// `tls.certificateRefs` (core group, kind Secret).
fn referenced_secrets<'a>(gateways: impl Iterator<Item = &'a Gateway>) -> BTreeSet<Key> {
    let mut keys = BTreeSet::new();
    for gateway in gateways {
        let ns = gateway
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(DEFAULT_NAMESPACE);
        for listener in &gateway.spec.listeners {
            let refs = listener
                .tls
                .as_ref()
                .and_then(|t| t.certificate_refs.as_ref());
            for r in refs.into_iter().flatten() {
                let core = r.group.as_deref().is_none_or(str::is_empty);
                let secret = r.kind.as_deref().is_none_or(|k| k == "Secret");
                if core && secret {
                    let ref_ns = r.namespace.as_deref().unwrap_or(ns);
                    keys.insert(format!("{ref_ns}/{}", r.name));
                }
            }
        }
    }
    keys
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
fn load(watched: &WatchedKind, mut object: DynamicObject) -> (Key, Loaded) {
    let (key, id) = key_of(watched, &object);
    object.types = Some(kube::api::TypeMeta {
        api_version: watched.api_version(),
        kind: watched.kind.to_string(),
    });
    // managedFields are noise for the loader and can be large.
    object.metadata.managed_fields = None;
    let loaded = match serde_json::to_string(&object) {
        Ok(json) => {
            let parsed = parse_manifests(&json, "kubernetes");
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
        },
    };
    (key, loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn only_secrets_a_listener_references_reach_the_snapshot() {
        let mut cache = ClusterCache::default();
        list_all_empty(&mut cache);
        let gateway = object(json!({
            "metadata": {"name": "gw", "namespace": "edge"},
            "spec": {"gatewayClassName": "sluice", "listeners": [{
                "name": "https", "protocol": "HTTPS", "port": 443,
                "tls": {"certificateRefs": [{"name": "cert"}, {"name": "other", "namespace": "certs"}]},
            }]},
        }));
        cache.apply(kind_index("Gateway"), Event::Apply(gateway));
        let gateways: Vec<Gateway> = cache.update().snapshot.gateways;
        let keys = referenced_secrets(gateways.iter());
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            ["certs/other", "edge/cert"]
        );
        for (ns, name) in [("edge", "cert"), ("edge", "unrelated"), ("certs", "other")] {
            let secret = object(json!({
                "metadata": {"name": name, "namespace": ns},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
            }));
            cache.apply(kind_index("Secret"), Event::Apply(secret));
        }
        let secrets: Vec<String> = cache
            .update()
            .snapshot
            .secrets
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(secrets, ["certs/other", "edge/cert"]);
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
