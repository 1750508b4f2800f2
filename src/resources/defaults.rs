//! The Gateway API CRDs' `default:` values (and our RolloutPolicy CRD's),
//! applied on load as the API server applies them before any controller
//! sees an object.
//!
//! A cluster stores `parentRefs: [{name: gw}]` as `{group:
//! gateway.networking.k8s.io, kind: Gateway, name: gw}`; so does sluice, in
//! both modes (the Kubernetes source loads through the same function, where
//! the API server has already defaulted and this changes nothing). `/status`,
//! `check`, `explain` and the route table then see what a cluster would
//! store, and a status compared by value (as the upstream conformance suite
//! compares parentRefs) matches.
//!
//! The API server's rule, followed here: a default fills a field that is
//! absent from an object that is present (and a defaulted object is itself
//! defaulted inside). Hand-written against the typed structs; the test
//! `every_crd_default_is_applied` walks the upstream CRD schemas and fails
//! when one of their defaults is missing here.

use gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicyStatusAncestorsAncestorRef;
use gateway_api::experimental::gatewayclasses::GatewayClassStatus;
use gateway_api::experimental::gateways::{
    GatewayAllowedListenersNamespaces, GatewayAllowedListenersNamespacesFrom,
    GatewayListenersAllowedRoutes, GatewayListenersAllowedRoutesNamespaces,
    GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersTlsMode, GatewayStatus,
    GatewayTlsFrontendDefaultValidationMode, GatewayTlsFrontendPerPortTlsValidationMode,
};
use gateway_api::experimental::grpcroutes::{
    GrpcRouteRulesMatchesHeadersType, GrpcRouteRulesMatchesMethodType,
    GrpcRouteRulesSessionPersistenceCookieConfigLifetimeType, GrpcRouteRulesSessionPersistenceType,
};
use gateway_api::experimental::httproutes::{
    HttpRouteRules, HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType,
    HttpRouteRulesMatchesPath, HttpRouteRulesMatchesPathType, HttpRouteRulesMatchesQueryParamsType,
    HttpRouteRulesSessionPersistenceCookieConfigLifetimeType, HttpRouteRulesSessionPersistenceType,
};
use gateway_api::experimental::listenersets::{
    ListenerSetListenersAllowedRoutes, ListenerSetListenersAllowedRoutesNamespaces,
    ListenerSetListenersAllowedRoutesNamespacesFrom, ListenerSetListenersTlsMode,
    ListenerSetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::{
    BackendTlsPolicy, GATEWAY_GROUP, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet,
    Object, OnFailure, RolloutPolicy, TlsRoute,
};

/// Apply every CRD default to a Gateway API object; other kinds are left
/// as they are.
pub fn apply_defaults(object: &mut Object) {
    match object {
        Object::GatewayClass(o) => gateway_class(o),
        Object::Gateway(o) => gateway(o),
        Object::HttpRoute(o) => http_route(std::sync::Arc::make_mut(o)),
        Object::ListenerSet(o) => listener_set(o),
        Object::BackendTlsPolicy(o) => backend_tls_policy(o),
        Object::GrpcRoute(o) => grpc_route(o),
        Object::TlsRoute(o) => tls_route(o),
        Object::RolloutPolicy(o) => rollout_policy(o),
        Object::ReferenceGrant(_)
        | Object::Service(_)
        | Object::EndpointSlice(_)
        | Object::Namespace(_)
        | Object::Secret(_)
        | Object::ConfigMap(_) => {}
    }
}

fn or(field: &mut Option<String>, value: &str) {
    if field.is_none() {
        *field = Some(value.to_string());
    }
}

fn or_with<T>(field: &mut Option<T>, value: impl FnOnce() -> T) -> &mut T {
    field.get_or_insert_with(value)
}

/// The condition a Gateway API status starts with until a controller
/// writes one (`status` defaults of GatewayClass, Gateway, ListenerSet).
fn pending(type_: &str) -> Condition {
    Condition {
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        message: "Waiting for controller".into(),
        observed_generation: None,
        reason: "Pending".into(),
        status: "Unknown".into(),
        type_: type_.into(),
    }
}

/// The defaults of a listener, of a Gateway or of a ListenerSet (generated
/// types with the same fields): `allowedRoutes` (namespaces from Same,
/// kinds of the Gateway API group), TLS mode Terminate, certificateRefs to
/// core Secrets.
macro_rules! listener_defaults {
    ($listener:expr, $routes:ident, $namespaces:ident, $same:expr, $terminate:expr) => {{
        let listener = $listener;
        let routes = or_with(&mut listener.allowed_routes, || $routes {
            kinds: None,
            namespaces: None,
        });
        for kind in routes.kinds.iter_mut().flatten() {
            or(&mut kind.group, GATEWAY_GROUP);
        }
        let namespaces = or_with(&mut routes.namespaces, $namespaces::default);
        or_with(&mut namespaces.from, || $same);
        if let Some(tls) = &mut listener.tls {
            or_with(&mut tls.mode, || $terminate);
            for r in tls.certificate_refs.iter_mut().flatten() {
                or(&mut r.group, "");
                or(&mut r.kind, "Secret");
            }
        }
    }};
}

fn gateway_class(o: &mut GatewayClass) {
    let status = or_with(&mut o.status, GatewayClassStatus::default);
    or_with(&mut status.conditions, || vec![pending("Accepted")]);
}

fn gateway(o: &mut Gateway) {
    let spec = &mut o.spec;
    for address in spec.addresses.iter_mut().flatten() {
        or(&mut address.r#type, "IPAddress");
    }
    if let Some(allowed) = &mut spec.allowed_listeners {
        let namespaces = or_with(&mut allowed.namespaces, || {
            GatewayAllowedListenersNamespaces::default()
        });
        or_with(&mut namespaces.from, || {
            GatewayAllowedListenersNamespacesFrom::None
        });
    }
    for listener in &mut spec.listeners {
        listener_defaults!(
            listener,
            GatewayListenersAllowedRoutes,
            GatewayListenersAllowedRoutesNamespaces,
            GatewayListenersAllowedRoutesNamespacesFrom::Same,
            GatewayListenersTlsMode::Terminate
        );
    }
    if let Some(tls) = &mut spec.tls {
        if let Some(r) = tls
            .backend
            .as_mut()
            .and_then(|b| b.client_certificate_ref.as_mut())
        {
            or(&mut r.group, "");
            or(&mut r.kind, "Secret");
        }
        if let Some(frontend) = &mut tls.frontend {
            if let Some(v) = &mut frontend.default.validation {
                or_with(&mut v.mode, || {
                    GatewayTlsFrontendDefaultValidationMode::AllowValidOnly
                });
            }
            for port in frontend.per_port.iter_mut().flatten() {
                if let Some(v) = &mut port.tls.validation {
                    or_with(&mut v.mode, || {
                        GatewayTlsFrontendPerPortTlsValidationMode::AllowValidOnly
                    });
                }
            }
        }
    }

    let status = or_with(&mut o.status, GatewayStatus::default);
    or_with(&mut status.conditions, || {
        vec![pending("Accepted"), pending("Programmed")]
    });
    for address in status.addresses.iter_mut().flatten() {
        or(&mut address.r#type, "IPAddress");
    }
    for listener in status.listeners.iter_mut().flatten() {
        for kind in listener.supported_kinds.iter_mut().flatten() {
            or(&mut kind.group, GATEWAY_GROUP);
        }
    }
}

fn listener_set(o: &mut ListenerSet) {
    let spec = &mut o.spec;
    or(&mut spec.parent_ref.group, GATEWAY_GROUP);
    or(&mut spec.parent_ref.kind, "Gateway");
    for listener in &mut spec.listeners {
        listener_defaults!(
            listener,
            ListenerSetListenersAllowedRoutes,
            ListenerSetListenersAllowedRoutesNamespaces,
            ListenerSetListenersAllowedRoutesNamespacesFrom::Same,
            ListenerSetListenersTlsMode::Terminate
        );
    }
    let status = or_with(&mut o.status, ListenerSetStatus::default);
    or_with(&mut status.conditions, || {
        vec![pending("Accepted"), pending("Programmed")]
    });
    for listener in status.listeners.iter_mut().flatten() {
        for kind in listener.supported_kinds.iter_mut().flatten() {
            or(&mut kind.group, GATEWAY_GROUP);
        }
    }
}

/// A RequestMirror filter's defaults (HTTPRoute's and GRPCRoute's filter
/// types, rule- or backendRef-level).
macro_rules! mirror_defaults {
    ($filter:expr) => {{
        if let Some(mirror) = &mut $filter.request_mirror {
            or(&mut mirror.backend_ref.group, "");
            or(&mut mirror.backend_ref.kind, "Service");
            if let Some(fraction) = &mut mirror.fraction {
                or_with(&mut fraction.denominator, || 100);
            }
        }
    }};
}

/// The defaults of an HTTPRoute filter, rule-level or backendRef-level (two
/// generated types with the same fields).
macro_rules! filter_defaults {
    ($filter:expr) => {{
        let filter = $filter;
        if let Some(cors) = &mut filter.cors {
            or_with(&mut cors.max_age, || 5);
        }
        if let Some(auth) = &mut filter.external_auth {
            or(&mut auth.backend_ref.group, "");
            or(&mut auth.backend_ref.kind, "Service");
        }
        mirror_defaults!(filter);
        if let Some(redirect) = &mut filter.request_redirect {
            or_with(&mut redirect.status_code, || 302);
        }
    }};
}

/// A route's parentRefs, in its spec and in its status, point at a
/// Gateway unless they say otherwise (HTTPRoute, GRPCRoute, TLSRoute).
macro_rules! parent_ref_defaults {
    ($route:expr) => {{
        let route = $route;
        for r in route.spec.parent_refs.iter_mut().flatten() {
            or(&mut r.group, GATEWAY_GROUP);
            or(&mut r.kind, "Gateway");
        }
        for parent in route.status.iter_mut().flat_map(|s| s.parents.iter_mut()) {
            or(&mut parent.parent_ref.group, GATEWAY_GROUP);
            or(&mut parent.parent_ref.kind, "Gateway");
        }
    }};
}

/// A route backendRef's defaults: a core Service, weight 1, and its
/// filters' defaults (`$filter` names the filter macro; none for TLSRoute).
macro_rules! backend_ref_defaults {
    ($backend:expr $(, $filter:ident)?) => {{
        let backend = $backend;
        or(&mut backend.group, "");
        or(&mut backend.kind, "Service");
        or_with(&mut backend.weight, || 1);
        $(
            for f in backend.filters.iter_mut().flatten() {
                $filter!(f);
            }
        )?
    }};
}

/// A rule's sessionPersistence: a session cookie unless it says otherwise
/// (HTTPRoute and GRPCRoute, generated types with the same fields).
macro_rules! session_persistence_defaults {
    ($rule:expr, $type:ident, $lifetime:ident) => {{
        if let Some(sp) = &mut $rule.session_persistence {
            or_with(&mut sp.r#type, || $type::Cookie);
            if let Some(cookie) = &mut sp.cookie_config {
                or_with(&mut cookie.lifetime_type, || $lifetime::Session);
            }
        }
    }};
}

/// `matches: [{path: {type: PathPrefix, value: /}}]`, the default of a
/// rule's `matches` (and of `spec.rules`' one rule).
fn match_everything() -> Vec<HttpRouteRulesMatches> {
    vec![HttpRouteRulesMatches {
        path: Some(HttpRouteRulesMatchesPath {
            r#type: Some(HttpRouteRulesMatchesPathType::PathPrefix),
            value: Some("/".into()),
        }),
        ..HttpRouteRulesMatches::default()
    }]
}

fn http_route(o: &mut HttpRoute) {
    parent_ref_defaults!(&mut *o);
    let rules = or_with(&mut o.spec.rules, || {
        vec![HttpRouteRules {
            matches: Some(match_everything()),
            ..HttpRouteRules::default()
        }]
    });
    for rule in rules {
        for m in or_with(&mut rule.matches, match_everything) {
            let path = or_with(&mut m.path, HttpRouteRulesMatchesPath::default);
            or_with(&mut path.r#type, || {
                HttpRouteRulesMatchesPathType::PathPrefix
            });
            or(&mut path.value, "/");
            for h in m.headers.iter_mut().flatten() {
                or_with(&mut h.r#type, || HttpRouteRulesMatchesHeadersType::Exact);
            }
            for q in m.query_params.iter_mut().flatten() {
                or_with(&mut q.r#type, || {
                    HttpRouteRulesMatchesQueryParamsType::Exact
                });
            }
        }
        for f in rule.filters.iter_mut().flatten() {
            filter_defaults!(f);
        }
        for b in rule.backend_refs.iter_mut().flatten() {
            backend_ref_defaults!(b, filter_defaults);
        }
        session_persistence_defaults!(
            rule,
            HttpRouteRulesSessionPersistenceType,
            HttpRouteRulesSessionPersistenceCookieConfigLifetimeType
        );
    }
}

fn grpc_route(o: &mut GrpcRoute) {
    parent_ref_defaults!(&mut *o);
    for rule in o.spec.rules.iter_mut().flatten() {
        for m in rule.matches.iter_mut().flatten() {
            for h in m.headers.iter_mut().flatten() {
                or_with(&mut h.r#type, || GrpcRouteRulesMatchesHeadersType::Exact);
            }
            if let Some(method) = &mut m.method {
                or_with(&mut method.r#type, || {
                    GrpcRouteRulesMatchesMethodType::Exact
                });
            }
        }
        for f in rule.filters.iter_mut().flatten() {
            mirror_defaults!(f);
        }
        for b in rule.backend_refs.iter_mut().flatten() {
            backend_ref_defaults!(b, mirror_defaults);
        }
        session_persistence_defaults!(
            rule,
            GrpcRouteRulesSessionPersistenceType,
            GrpcRouteRulesSessionPersistenceCookieConfigLifetimeType
        );
    }
}

fn tls_route(o: &mut TlsRoute) {
    parent_ref_defaults!(&mut *o);
    for rule in &mut o.spec.rules {
        for b in &mut rule.backend_refs {
            backend_ref_defaults!(b);
        }
    }
}

/// Our RolloutPolicy's defaults (`deploy/rolloutpolicy-crd.yaml`): a
/// failed gate rolls back, and a policy is not paused.
fn rollout_policy(o: &mut RolloutPolicy) {
    or_with(&mut o.spec.on_failure, || OnFailure::Rollback);
    or_with(&mut o.spec.paused, || false);
}

fn backend_tls_policy(o: &mut BackendTlsPolicy) {
    for ancestor in o.status.iter_mut().flat_map(|s| s.ancestors.iter_mut()) {
        let r: &mut BackendTlsPolicyStatusAncestorsAncestorRef = &mut ancestor.ancestor_ref;
        or(&mut r.group, GATEWAY_GROUP);
        or(&mut r.kind, "Gateway");
    }
}

#[cfg(test)]
mod tests;
