//! Resolving backendRefs to Services and their ready endpoints.
//!
//! Per the spec, a backendRef that cannot be resolved keeps its share of
//! the traffic and that share gets HTTP 500, with the route's
//! `ResolvedRefs=False` and reason `InvalidKind` (not a Service),
//! `RefNotPermitted` (another namespace without a ReferenceGrant) or
//! `BackendNotFound` (no such Service or port). A Service without ready
//! endpoints resolves (its share gets 503).
//!
//! A backend whose Service a BackendTLSPolicy targets resolves with its TLS
//! settings ([`super::backend_tls`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ServicePort;

use super::backend_tls::BackendTlsIndex;
use super::conditions::Reason;
use super::meta::namespace_of;
use super::references::{Referrer, reference_allowed};
use crate::resources::{EndpointSlice, Service, Snapshot};
use crate::route::{AppProtocol, BackendTarget, BackendTls, EndpointSet, RouteKind};

/// The label EndpointSlices carry to name their Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A backendRef as the spec shapes it (backendRefs and mirror backendRefs
/// share these fields).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackendRefFields<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub port: Option<i32>,
}

impl<'a> BackendRefFields<'a> {
    /// The fields of one of a rule's backendRefs.
    pub fn of(b: &'a gateway_api::experimental::httproutes::HttpRouteRulesBackendRefs) -> Self {
        BackendRefFields {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            name: &b.name,
            namespace: b.namespace.as_deref(),
            port: b.port,
        }
    }
}

/// What a backendRef resolved to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resolution {
    Endpoints {
        addrs: Vec<SocketAddr>,
        protocol: AppProtocol,
        /// Reached over TLS (a BackendTLSPolicy targets the Service).
        tls: Option<TlsSettings>,
    },
    NoReadyEndpoints,
    Unresolved {
        reason: Reason,
        message: String,
    },
}

/// A backendRef (or mirror backendRef) that did not resolve, for the
/// route's `ResolvedRefs=False`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RefFailure {
    pub reason: Reason,
    pub message: String,
}

/// What the route table does with a backend that resolved so: send to its
/// endpoints, or answer 503 (no ready endpoint) or 500 (unresolved).
pub(crate) fn backend_target(resolution: Resolution) -> BackendTarget {
    match resolution {
        Resolution::Endpoints {
            addrs,
            protocol,
            tls,
        } => BackendTarget::Endpoints(EndpointSet::new(addrs, protocol).with_tls(tls.map(|t| t.0))),
        Resolution::NoReadyEndpoints => BackendTarget::NoReadyEndpoints,
        Resolution::Unresolved { reason, .. } => BackendTarget::Unresolved {
            reason: reason.to_string(),
        },
    }
}

/// A backend's TLS settings, compared by their identity key.
#[derive(Debug, Clone)]
pub(crate) struct TlsSettings(pub Arc<BackendTls>);

impl PartialEq for TlsSettings {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

/// Indexes of the snapshot's Services, EndpointSlices and ReferenceGrants.
pub(crate) struct BackendResolver<'a> {
    snapshot: &'a Snapshot,
    services: BTreeMap<(&'a str, &'a str), &'a Service>,
    slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    /// BackendTLSPolicies and Gateway client certificates.
    pub tls: BackendTlsIndex<'a>,
}

impl<'a> BackendResolver<'a> {
    /// Whether the manifest of route `Kind namespace/name` omitted the weight of
    /// its rule `rule`'s backendRef `backend` (see `Snapshot::omitted_weights`).
    pub fn weight_omitted(
        &self,
        route: &dyn std::fmt::Display,
        rule: usize,
        backend: usize,
    ) -> bool {
        // Most configurations give every weight: no key made then.
        !self.snapshot.omitted_weights.is_empty()
            && self
                .snapshot
                .omitted_weights
                .contains(&(route.to_string(), rule, backend))
    }

    pub fn new(snapshot: &'a Snapshot) -> Self {
        let mut services = BTreeMap::new();
        for s in &snapshot.services {
            if let Some(name) = s.metadata.name.as_deref() {
                services.insert((namespace_of(&s.metadata), name), s);
            }
        }
        let mut slices: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
        for es in &snapshot.endpoint_slices {
            let svc = es
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let Some(svc) = svc {
                slices
                    .entry((namespace_of(&es.metadata), svc.as_str()))
                    .or_default()
                    .push(es);
            }
        }
        BackendResolver {
            snapshot,
            services,
            slices,
            tls: BackendTlsIndex::new(snapshot),
        }
    }

    /// The label of a backendRef in summaries and metrics:
    /// `<namespace>/<name>:<port>` for a Service, kind-prefixed otherwise
    /// (the display of its identity, so rollouts find its counters).
    pub fn label(route_ns: &str, r: &BackendRefFields<'_>) -> String {
        super::rollouts::backend_key(route_ns, r).to_string()
    }

    /// Resolve a backendRef of a route of `kind` in `route_ns`. The
    /// protocol to the endpoints is the Service port's `appProtocol` for an
    /// HTTPRoute; a GRPCRoute's backends speak HTTP/2 (gRPC's transport:
    /// "Implementations MAY infer the protocol from the Route type"), and
    /// a port whose `appProtocol` says WebSocket cannot carry it
    /// (`UnsupportedProtocol`).
    pub fn resolve(&self, kind: RouteKind, route_ns: &str, r: &BackendRefFields<'_>) -> Resolution {
        if !is_service(r) {
            let group = r.group.unwrap_or("");
            let kind = r.kind.unwrap_or("Service");
            return Resolution::Unresolved {
                reason: Reason::InvalidKind,
                message: format!(
                    "backendRef {}: kind {kind:?} of group {group:?} is not supported; only core Services are",
                    Self::label(route_ns, r)
                ),
            };
        }
        let ns = r.namespace.unwrap_or(route_ns);
        let from = Referrer {
            kind: kind.as_str(),
            namespace: route_ns,
        };
        if !reference_allowed(self.snapshot, from, "Service", ns, r.name) {
            return Resolution::Unresolved {
                reason: Reason::RefNotPermitted,
                message: format!(
                    "backendRef {}: no ReferenceGrant in namespace {ns} allows {kind}s from namespace {route_ns} to refer to Service {}",
                    Self::label(route_ns, r),
                    r.name
                ),
            };
        }
        let Some(service) = self.services.get(&(ns, r.name)) else {
            return Resolution::Unresolved {
                reason: Reason::BackendNotFound,
                message: format!(
                    "backendRef {}: Service {ns}/{} not found",
                    Self::label(route_ns, r),
                    r.name
                ),
            };
        };
        let Some(port_number) = r.port else {
            return Resolution::Unresolved {
                reason: Reason::BackendNotFound,
                message: format!(
                    "backendRef {}: a port is required for a Service",
                    Self::label(route_ns, r)
                ),
            };
        };
        let ports = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_deref())
            .unwrap_or_default();
        let Some(port) = ports.iter().find(|p| p.port == port_number) else {
            return Resolution::Unresolved {
                reason: Reason::BackendNotFound,
                message: format!(
                    "backendRef {}: Service {ns}/{} has no port {port_number}",
                    Self::label(route_ns, r),
                    r.name
                ),
            };
        };
        let app = port.app_protocol.as_deref();
        let protocol = match kind {
            RouteKind::Grpc if matches!(app, Some("kubernetes.io/ws" | "kubernetes.io/wss")) => {
                return Resolution::Unresolved {
                    reason: Reason::UnsupportedProtocol,
                    message: format!(
                        "backendRef {}: Service port {port_number} has appProtocol {}, which cannot carry gRPC (HTTP/2)",
                        Self::label(route_ns, r),
                        app.unwrap_or_default()
                    ),
                };
            }
            RouteKind::Grpc => AppProtocol::Http2,
            RouteKind::Http | RouteKind::Tls => app_protocol(app),
        };
        let tls = self
            .tls
            .for_backend(ns, r.name, port.name.as_deref())
            .map(TlsSettings);
        let addrs = self.ready_endpoints(ns, r.name, port);
        if addrs.is_empty() {
            Resolution::NoReadyEndpoints
        } else {
            Resolution::Endpoints {
                addrs,
                protocol,
                tls,
            }
        }
    }

    /// Every ready address of the Service's EndpointSlices on the slice
    /// port named like the Service port, sorted and without duplicates.
    fn ready_endpoints(&self, ns: &str, service: &str, port: &ServicePort) -> Vec<SocketAddr> {
        let want = port.name.as_deref().unwrap_or("");
        let mut out = BTreeSet::new();
        for es in self.slices.get(&(ns, service)).into_iter().flatten() {
            if !matches!(es.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let slice_port = es
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == want)
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok());
            let Some(slice_port) = slice_port else {
                continue;
            };
            for ep in &es.endpoints {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if !ready {
                    continue;
                }
                for a in &ep.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        out.insert(SocketAddr::new(ip, slice_port));
                    }
                }
            }
        }
        out.into_iter().collect()
    }
}

fn is_service(r: &BackendRefFields<'_>) -> bool {
    r.group.unwrap_or("").is_empty() && r.kind.unwrap_or("Service") == "Service"
}

fn app_protocol(p: Option<&str>) -> AppProtocol {
    match p {
        Some("kubernetes.io/h2c") => AppProtocol::H2c,
        Some("kubernetes.io/ws") => AppProtocol::WebSocket,
        _ => AppProtocol::Http1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::testing::snapshot;

    const SVC: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  ports:
  - {name: http, port: 80, appProtocol: kubernetes.io/h2c}
  - {name: admin, port: 9000}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: admin, port: 9001}]
endpoints:
- addresses: [10.0.0.2]
- addresses: [10.0.0.1]
  conditions: {ready: true}
- addresses: [10.0.0.3]
  conditions: {ready: false}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-2
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ['::1']
";

    fn r<'a>(name: &'a str, namespace: Option<&'a str>, port: i32) -> BackendRefFields<'a> {
        BackendRefFields {
            group: None,
            kind: None,
            name,
            namespace,
            port: Some(port),
        }
    }

    #[test]
    fn ready_endpoints_on_the_named_slice_port() {
        let s = snapshot(SVC);
        let res = BackendResolver::new(&s);
        let got = res.resolve(RouteKind::Http, "shop", &r("web", None, 80));
        let want: Vec<SocketAddr> = ["10.0.0.1:8080", "10.0.0.2:8080", "[::1]:8080"]
            .iter()
            .map(|a| a.parse().expect("valid"))
            .collect();
        assert_eq!(
            got,
            Resolution::Endpoints {
                addrs: want,
                protocol: AppProtocol::H2c,
                tls: None,
            }
        );
        let admin = res.resolve(RouteKind::Http, "shop", &r("web", None, 9000));
        assert!(
            matches!(&admin, Resolution::Endpoints { addrs, protocol: AppProtocol::Http1, .. } if addrs.len() == 2),
            "{admin:?}"
        );
    }

    #[test]
    fn unresolved_reasons() {
        let s = snapshot(SVC);
        let res = BackendResolver::new(&s);
        let reason = |x: Resolution| match x {
            Resolution::Unresolved { reason, .. } => reason,
            other => panic!("resolved: {other:?}"),
        };
        assert_eq!(
            reason(res.resolve(RouteKind::Http, "shop", &r("nope", None, 80))),
            Reason::BackendNotFound
        );
        assert_eq!(
            reason(res.resolve(RouteKind::Http, "shop", &r("web", None, 81))),
            Reason::BackendNotFound
        );
        assert_eq!(
            reason(res.resolve(RouteKind::Http, "default", &r("web", Some("shop"), 80))),
            Reason::RefNotPermitted
        );
        let mut other = r("bucket", None, 80);
        other.group = Some("storage.example.com");
        other.kind = Some("Bucket");
        assert_eq!(
            reason(res.resolve(RouteKind::Http, "shop", &other)),
            Reason::InvalidKind
        );
    }

    #[test]
    fn reference_grant_by_name_or_for_all() {
        let grant = |to: &str| {
            format!(
                "{SVC}---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n\
                 metadata: {{name: g, namespace: shop}}\nspec:\n  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}}]\n  to: [{to}]\n"
            )
        };
        for (to, ok) in [
            ("{group: '', kind: Service}", true),
            ("{group: '', kind: Service, name: web}", true),
            ("{group: '', kind: Service, name: other}", false),
            ("{group: '', kind: Secret}", false),
        ] {
            let s = snapshot(&grant(to));
            let got = BackendResolver::new(&s).resolve(
                RouteKind::Http,
                "default",
                &r("web", Some("shop"), 80),
            );
            assert_eq!(
                matches!(got, Resolution::Endpoints { .. }),
                ok,
                "{to}: {got:?}"
            );
        }
    }

    #[test]
    fn no_ready_endpoints() {
        let s = snapshot(
            "apiVersion: v1\nkind: Service\nmetadata: {name: empty}\nspec: {ports: [{port: 80}]}\n",
        );
        assert_eq!(
            BackendResolver::new(&s).resolve(RouteKind::Http, "default", &r("empty", None, 80)),
            Resolution::NoReadyEndpoints
        );
    }
}
