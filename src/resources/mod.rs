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

impl Object {
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
