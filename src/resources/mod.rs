//! Typed Gateway API and core resources, and loading them from manifests.
//!
//! A [`Snapshot`] is the complete set of objects a source (files or the
//! Kubernetes API) currently holds. Sources build it; `translate` reads it.
//! Every object in a snapshot has a namespace (`default` when the manifest
//! gave none), a `metadata.generation` and a `metadata.creationTimestamp`
//! (see [`Generations`] for how they are filled in when a file omits them).
//!
//! [`parse_manifests`] turns manifest text into [`Object`]s, refusing what
//! the API server's CRD schema would refuse, with errors that name the file,
//! line, object and field.

pub mod crd;
pub mod defaults;
mod duration;
pub mod generations;
pub mod load;
pub mod rollout_policy;
mod routes;
mod validate;

pub use defaults::apply_defaults;
pub use duration::parse_gateway_duration;
pub use generations::Generations;
pub use load::{
    LoadError, LoadedObject, ParsedFile, load_documents, parse_manifests, parse_manifests_with,
    read_documents,
};
pub use rollout_policy::{
    ConsistentKey, OnFailure, Percent, ROLLOUT_POLICY_API_VERSION, RolloutPolicy, RolloutSettings,
    SLUICE_GROUP,
};
pub use routes::{grpc_rule_as_http, tls_backend_refs_as_http};
pub(crate) use validate::filter_type_name;

pub use gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy;
pub use gateway_api::experimental::gatewayclasses::GatewayClass;
pub use gateway_api::experimental::gateways::Gateway;
pub use gateway_api::experimental::grpcroutes::GrpcRoute;
pub use gateway_api::experimental::httproutes::HttpRoute;
pub use gateway_api::experimental::listenersets::ListenerSet;
pub use gateway_api::experimental::referencegrants::ReferenceGrant;
pub use gateway_api::experimental::tlsroutes::TlsRoute;
pub use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
pub use k8s_openapi::api::discovery::v1::EndpointSlice;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Our GatewayClass `controllerName`.
pub const CONTROLLER_NAME: &str = "sluice.dev/gateway-controller";

/// The namespace of objects whose manifest gives none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// Every object the gateway's configuration is made of.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub gateway_classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    /// Shared (`Arc`): with 10,000 routes a reload that changes one file
    /// or one watched object must not copy the others. A source hands the
    /// same allocation again for a route that did not change, so the
    /// snapshot is changed in place and reuse compares by pointer.
    pub http_routes: Vec<Arc<HttpRoute>>,
    /// GRPCRoutes: gRPC services and methods on HTTP/2 listeners.
    pub grpc_routes: Vec<GrpcRoute>,
    /// TLSRoutes: TLS streams chosen by SNI on `TLS` listeners.
    pub tls_routes: Vec<TlsRoute>,
    pub reference_grants: Vec<ReferenceGrant>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Namespaces, for `allowedRoutes.namespaces.selector`. A namespace
    /// without an object here only has the `kubernetes.io/metadata.name`
    /// label Kubernetes gives every namespace.
    pub namespaces: Vec<Namespace>,
    /// Secrets, for listener `tls.certificateRefs` (`kubernetes.io/tls`:
    /// `tls.crt` and `tls.key`).
    pub secrets: Vec<Secret>,
    /// ListenerSets: listeners that attach to a Gateway
    /// (`spec.parentRef`) when its `allowedListeners` admits them.
    pub listener_sets: Vec<ListenerSet>,
    /// BackendTLSPolicies: how the gateway speaks TLS to a Service.
    pub backend_tls_policies: Vec<BackendTlsPolicy>,
    /// ConfigMaps, for CA certificates (`ca.crt`): frontend client
    /// certificate validation and BackendTLSPolicy validation.
    pub config_maps: Vec<ConfigMap>,
    /// RolloutPolicies (`sluice.dev/v1alpha1`): how weight changes of the
    /// HTTPRoutes they target are served.
    pub rollout_policies: Vec<RolloutPolicy>,
    /// `(Kind namespace/name, rule, backendRef)` of the routes' backendRefs whose
    /// weight the manifest omitted before the CRD default made it 1, so that
    /// an omitted weight next to explicit ones is still pointed out. Only
    /// files know it: a cluster's objects arrive defaulted.
    pub omitted_weights: BTreeSet<(String, usize, usize)>,
}

impl Snapshot {
    /// Sort objects into a snapshot by kind (their order is kept).
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Snapshot {
        let mut s = Snapshot::default();
        for object in objects {
            match object {
                Object::GatewayClass(o) => s.gateway_classes.push(o),
                Object::Gateway(o) => s.gateways.push(o),
                Object::HttpRoute(o) => s.http_routes.push(o),
                Object::GrpcRoute(o) => s.grpc_routes.push(o),
                Object::TlsRoute(o) => s.tls_routes.push(o),
                Object::ReferenceGrant(o) => s.reference_grants.push(o),
                Object::Service(o) => s.services.push(o),
                Object::EndpointSlice(o) => s.endpoint_slices.push(o),
                Object::Namespace(o) => s.namespaces.push(o),
                Object::Secret(o) => s.secrets.push(o),
                Object::ListenerSet(o) => s.listener_sets.push(o),
                Object::BackendTlsPolicy(o) => s.backend_tls_policies.push(o),
                Object::ConfigMap(o) => s.config_maps.push(o),
                Object::RolloutPolicy(o) => s.rollout_policies.push(o),
            }
        }
        s
    }

    /// Sort loaded objects into a snapshot, keeping what their manifests
    /// omitted before defaults; `assign` fills in generations (see
    /// [`Generations`]) between loading and sorting.
    pub fn from_loaded(
        loaded: impl IntoIterator<Item = LoadedObject>,
        assign: impl FnOnce(&mut Vec<Object>),
    ) -> Snapshot {
        Self::sorted(loaded, |l| l.object, assign)
    }

    /// [`Snapshot::from_loaded`] from borrowed objects (a source's, kept
    /// for the next reload): only the objects are cloned, an HTTPRoute a
    /// reference count.
    pub fn from_loaded_refs<'a>(
        loaded: impl IntoIterator<Item = &'a LoadedObject>,
        assign: impl FnOnce(&mut Vec<Object>),
    ) -> Snapshot {
        Self::sorted(loaded, |l| l.object.clone(), assign)
    }

    /// Whether `other` differs from `self` in what writing a route's status
    /// changes, and in nothing else: some HTTPRoute's, GRPCRoute's or
    /// TLSRoute's `status`, `metadata.resourceVersion` or
    /// `metadata.managedFields`. Equal snapshots are not.
    ///
    /// In Kubernetes mode every status the leader writes comes back as a
    /// watch event; with 10,000 routes that is 10,000 events after a start,
    /// none of which changes what is served. Nothing translate reads differs
    /// between two such snapshots, so the serve loop hands the new one to
    /// the status writer (which needs the new resourceVersions) without
    /// translating it.
    pub fn only_route_status_differs(&self, other: &Snapshot) -> bool {
        // Every field named, so that a new kind is not silently left out.
        let Snapshot {
            gateway_classes,
            gateways,
            http_routes,
            grpc_routes,
            tls_routes,
            reference_grants,
            services,
            endpoint_slices,
            namespaces,
            secrets,
            listener_sets,
            backend_tls_policies,
            config_maps,
            rollout_policies,
            omitted_weights,
        } = self;
        let differs = std::cell::Cell::new(false);
        let same = |a_spec_equal: bool, a: &ObjectMeta, b: &ObjectMeta, status_equal: bool| {
            if !(status_equal && a.resource_version == b.resource_version) {
                differs.set(true);
            }
            a_spec_equal && same_but_version(a, b)
        };
        fn all<T>(a: &[T], b: &[T], same: impl Fn(&T, &T) -> bool) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
        }
        let routes = all(http_routes, &other.http_routes, |a, b| {
            Arc::ptr_eq(a, b)
                || same(
                    a.spec == b.spec,
                    &a.metadata,
                    &b.metadata,
                    a.status == b.status,
                )
        }) && all(grpc_routes, &other.grpc_routes, |a, b| {
            same(
                a.spec == b.spec,
                &a.metadata,
                &b.metadata,
                a.status == b.status,
            )
        }) && all(tls_routes, &other.tls_routes, |a, b| {
            same(
                a.spec == b.spec,
                &a.metadata,
                &b.metadata,
                a.status == b.status,
            )
        });
        routes
            && differs.get()
            && *gateway_classes == other.gateway_classes
            && *gateways == other.gateways
            && *reference_grants == other.reference_grants
            && *services == other.services
            && *endpoint_slices == other.endpoint_slices
            && *namespaces == other.namespaces
            && *secrets == other.secrets
            && *listener_sets == other.listener_sets
            && *backend_tls_policies == other.backend_tls_policies
            && *config_maps == other.config_maps
            && *rollout_policies == other.rollout_policies
            && *omitted_weights == other.omitted_weights
    }

    /// What both forms of `from_loaded` do, `object` taking each one's
    /// object out (moved or cloned).
    fn sorted<L: std::borrow::Borrow<LoadedObject>>(
        loaded: impl IntoIterator<Item = L>,
        object: impl Fn(L) -> Object,
        assign: impl FnOnce(&mut Vec<Object>),
    ) -> Snapshot {
        let mut omitted_weights = BTreeSet::new();
        let loaded = loaded.into_iter();
        // Sized once: growing a list of 10,000 objects copied them over
        // and over at every reload.
        let mut objects = Vec::with_capacity(loaded.size_hint().0);
        for l in loaded {
            note_omitted(l.borrow(), &mut omitted_weights);
            objects.push(object(l));
        }
        assign(&mut objects);
        Snapshot {
            omitted_weights,
            ..Snapshot::from_objects(objects)
        }
    }
}

/// The weights `l`'s manifest omitted, as [`Snapshot::omitted_weights`]
/// keeps them.
fn note_omitted(l: &LoadedObject, into: &mut BTreeSet<(String, usize, usize)>) {
    if !l.omitted_weights.is_empty() {
        let route = l.object.id();
        into.extend(
            l.omitted_weights
                .iter()
                .map(|&(i, j)| (route.clone(), i, j)),
        );
    }
}

/// One object of a kind sluice reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    GatewayClass(GatewayClass),
    Gateway(Gateway),
    /// Shared, as in [`Snapshot::http_routes`]: cloning an object of this
    /// kind is a reference count.
    HttpRoute(Arc<HttpRoute>),
    GrpcRoute(GrpcRoute),
    TlsRoute(TlsRoute),
    ReferenceGrant(ReferenceGrant),
    Service(Service),
    EndpointSlice(EndpointSlice),
    Namespace(Namespace),
    Secret(Secret),
    ListenerSet(ListenerSet),
    BackendTlsPolicy(BackendTlsPolicy),
    ConfigMap(ConfigMap),
    RolloutPolicy(RolloutPolicy),
}

/// `a` and `b` are equal but for `resourceVersion` and `managedFields`,
/// which every write to the object (its status's too) changes.
fn same_but_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    let ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields: _,
        name,
        namespace,
        owner_references,
        resource_version: _,
        self_link,
        uid,
    } = a;
    *annotations == b.annotations
        && *creation_timestamp == b.creation_timestamp
        && *deletion_grace_period_seconds == b.deletion_grace_period_seconds
        && *deletion_timestamp == b.deletion_timestamp
        && *finalizers == b.finalizers
        && *generate_name == b.generate_name
        && *generation == b.generation
        && *labels == b.labels
        && *name == b.name
        && *namespace == b.namespace
        && *owner_references == b.owner_references
        && *self_link == b.self_link
        && *uid == b.uid
}

impl Object {
    /// Whether `self` and `other` are the same route (HTTPRoute, GRPCRoute
    /// or TLSRoute) but for what writing its status changes: `status`,
    /// `metadata.resourceVersion`, `metadata.managedFields`. Any other
    /// kind is not.
    pub fn same_route_but_status(&self, other: &Object) -> bool {
        match (self, other) {
            (Object::HttpRoute(a), Object::HttpRoute(b)) => {
                a.spec == b.spec && same_but_version(&a.metadata, &b.metadata)
            }
            (Object::GrpcRoute(a), Object::GrpcRoute(b)) => {
                a.spec == b.spec && same_but_version(&a.metadata, &b.metadata)
            }
            (Object::TlsRoute(a), Object::TlsRoute(b)) => {
                a.spec == b.spec && same_but_version(&a.metadata, &b.metadata)
            }
            _ => false,
        }
    }

    /// The Kubernetes `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::GatewayClass(_) => "GatewayClass",
            Object::Gateway(_) => "Gateway",
            Object::HttpRoute(_) => "HTTPRoute",
            Object::GrpcRoute(_) => "GRPCRoute",
            Object::TlsRoute(_) => "TLSRoute",
            Object::ReferenceGrant(_) => "ReferenceGrant",
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Namespace(_) => "Namespace",
            Object::Secret(_) => "Secret",
            Object::ListenerSet(_) => "ListenerSet",
            Object::BackendTlsPolicy(_) => "BackendTLSPolicy",
            Object::ConfigMap(_) => "ConfigMap",
            Object::RolloutPolicy(_) => "RolloutPolicy",
        }
    }

    /// Cluster-scoped kinds have no namespace.
    pub fn is_namespaced(&self) -> bool {
        is_namespaced_kind(self.kind())
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::GatewayClass(o) => &o.metadata,
            Object::Gateway(o) => &o.metadata,
            Object::HttpRoute(o) => &o.metadata,
            Object::GrpcRoute(o) => &o.metadata,
            Object::TlsRoute(o) => &o.metadata,
            Object::ReferenceGrant(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ListenerSet(o) => &o.metadata,
            Object::BackendTlsPolicy(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::RolloutPolicy(o) => &o.metadata,
        }
    }

    /// The metadata to change. A shared HTTPRoute is copied first (clone
    /// on write): change only what differs.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::GatewayClass(o) => &mut o.metadata,
            Object::Gateway(o) => &mut o.metadata,
            Object::HttpRoute(o) => &mut Arc::make_mut(o).metadata,
            Object::GrpcRoute(o) => &mut o.metadata,
            Object::TlsRoute(o) => &mut o.metadata,
            Object::ReferenceGrant(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::EndpointSlice(o) => &mut o.metadata,
            Object::Namespace(o) => &mut o.metadata,
            Object::Secret(o) => &mut o.metadata,
            Object::ListenerSet(o) => &mut o.metadata,
            Object::BackendTlsPolicy(o) => &mut o.metadata,
            Object::ConfigMap(o) => &mut o.metadata,
            Object::RolloutPolicy(o) => &mut o.metadata,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or("")
    }

    /// The namespace (`None` for cluster-scoped kinds).
    pub fn namespace(&self) -> Option<&str> {
        if self.is_namespaced() {
            Some(
                self.metadata()
                    .namespace
                    .as_deref()
                    .unwrap_or(DEFAULT_NAMESPACE),
            )
        } else {
            None
        }
    }

    /// `HTTPRoute default/checkout`, `GatewayClass sluice`.
    pub fn id(&self) -> String {
        object_id(self.kind(), self.namespace(), self.name())
    }

    /// What counts as the object's `spec` for generation counting, as
    /// JSON bytes: the `spec`, or for an EndpointSlice (which has none) its
    /// endpoints, ports and address type, for a Secret its type and data,
    /// for a ConfigMap its data. Two objects have the same spec when these
    /// bytes are equal (serialization of these types is deterministic:
    /// their maps are ordered). Bytes rather than a `serde_json::Value`:
    /// generations compare every object at every reload, and a tree of
    /// values per object was a sixth of a 10,000-route flip.
    pub fn spec_json(&self) -> Vec<u8> {
        let v = match self {
            Object::GatewayClass(o) => serde_json::to_vec(&o.spec),
            Object::Gateway(o) => serde_json::to_vec(&o.spec),
            Object::HttpRoute(o) => serde_json::to_vec(&o.spec),
            Object::GrpcRoute(o) => serde_json::to_vec(&o.spec),
            Object::TlsRoute(o) => serde_json::to_vec(&o.spec),
            Object::ReferenceGrant(o) => serde_json::to_vec(&o.spec),
            Object::Service(o) => serde_json::to_vec(&o.spec),
            Object::Namespace(o) => serde_json::to_vec(&o.spec),
            Object::EndpointSlice(o) => {
                serde_json::to_vec(&(&o.address_type, &o.endpoints, &o.ports))
            }
            Object::Secret(o) => serde_json::to_vec(&(&o.type_, &o.data, &o.string_data)),
            Object::ListenerSet(o) => serde_json::to_vec(&o.spec),
            Object::BackendTlsPolicy(o) => serde_json::to_vec(&o.spec),
            Object::ConfigMap(o) => serde_json::to_vec(&(&o.data, &o.binary_data)),
            Object::RolloutPolicy(o) => serde_json::to_vec(&o.spec),
        };
        // Serializing these plain data types cannot fail (no maps with
        // non-string keys); an empty spec only makes generations coarser.
        v.unwrap_or_default()
    }
}

/// Whether objects of this kind live in a namespace.
pub fn is_namespaced_kind(kind: &str) -> bool {
    !matches!(kind, "GatewayClass" | "Namespace")
}

/// The display id of an object: `Kind namespace/name` or `Kind name`.
pub fn object_id(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_sorts_objects_by_kind() {
        let parsed = parse_manifests(
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
             metadata: {name: c}\nspec: {controllerName: x/y}\n",
            "f.yaml",
        );
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let s = Snapshot::from_objects(parsed.objects.into_iter().map(|o| o.object));
        assert_eq!(s.services.len(), 1);
        assert_eq!(s.namespaces.len(), 1);
        assert_eq!(s.gateway_classes.len(), 1);
    }

    fn snapshot(yaml: &str) -> Snapshot {
        let parsed = parse_manifests(yaml, "f.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        Snapshot::from_objects(parsed.objects.into_iter().map(|o| o.object))
    }

    const ROUTES: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n\
        spec: {ports: [{port: 80}]}\n---\n\
        apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
        metadata: {name: r, resourceVersion: '1'}\n\
        spec: {rules: [{backendRefs: [{name: a, port: 80}]}]}\n---\n\
        apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\n\
        metadata: {name: g, resourceVersion: '1'}\n\
        spec: {rules: [{backendRefs: [{name: a, port: 80}]}]}\n";

    #[test]
    fn only_a_route_status_change_is_told_apart() {
        let before = snapshot(ROUTES);
        // Equal snapshots are not a status change (the route shared or not).
        assert!(!before.only_route_status_differs(&before.clone()));
        assert!(!before.only_route_status_differs(&snapshot(ROUTES)));

        let parents = "status: {parents: [{parentRef: {name: gw}, controllerName: x/y, \
            conditions: [{type: Accepted, status: 'True', reason: Accepted, message: '', \
            lastTransitionTime: '2024-01-01T00:00:00Z'}]}]}\n";
        // What writing the HTTPRoute's status does: status and resourceVersion.
        let written = ROUTES.replacen("resourceVersion: '1'", "resourceVersion: '2'", 1);
        let written = written.replacen(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute",
            &format!("{parents}---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute"),
            1,
        );
        let after = snapshot(&written);
        assert!(after.http_routes[0].status.is_some(), "{written}");
        assert!(before.only_route_status_differs(&after));
        // The GRPCRoute's: a later resourceVersion alone is a write too.
        let grpc = ROUTES.replace(
            "name: g, resourceVersion: '1'",
            "name: g, resourceVersion: '7'",
        );
        assert!(before.only_route_status_differs(&snapshot(&grpc)));

        // Anything else that changed as well is served: it is translated.
        for (what, yaml) in [
            (
                "the route's spec",
                written.replace("port: 80}]}]}\nstatus", "port: 80, weight: 3}]}]}\nstatus"),
            ),
            (
                "the route's labels",
                written.replace(
                    "name: r, resourceVersion: '2'",
                    "name: r, resourceVersion: '2', labels: {a: b}",
                ),
            ),
            (
                "a Service",
                written.replace("spec: {ports: [{port: 80}]}", "spec: {ports: [{port: 81}]}"),
            ),
            (
                "a route added",
                format!(
                    "{written}---\napiVersion: gateway.networking.k8s.io/v1\n\
                kind: HTTPRoute\nmetadata: {{name: s}}\nspec: {{}}\n"
                ),
            ),
        ] {
            let other = snapshot(&yaml);
            assert!(!before.only_route_status_differs(&other), "{what}:\n{yaml}");
        }
    }

    #[test]
    fn ids_name_kind_namespace_and_name() {
        assert_eq!(
            object_id("HTTPRoute", Some("default"), "checkout"),
            "HTTPRoute default/checkout"
        );
        assert_eq!(
            object_id("GatewayClass", None, "sluice"),
            "GatewayClass sluice"
        );
    }
}
