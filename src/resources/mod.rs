//! Typed Gateway API and core resources, and loading them from manifests.
//!
//! A [`Snapshot`] is the complete set of objects a source (files or the
//! Kubernetes API) currently holds. Sources build it; `translate` reads it.
//! Every object in a snapshot has a namespace (`default` when the manifest
//! gave none), a `metadata.generation` and a `metadata.creationTimestamp`
//! (see the source for how they are filled in when a file omits them).

pub use gateway_api::experimental::gatewayclasses::GatewayClass;
pub use gateway_api::experimental::gateways::Gateway;
pub use gateway_api::experimental::httproutes::HttpRoute;
pub use gateway_api::experimental::referencegrants::ReferenceGrant;
pub use k8s_openapi::api::core::v1::Service;
pub use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Our GatewayClass `controllerName`.
pub const CONTROLLER_NAME: &str = "sluice.dev/gateway-controller";

/// Every object the gateway's configuration is made of.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub gateway_classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub http_routes: Vec<HttpRoute>,
    pub reference_grants: Vec<ReferenceGrant>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
}
