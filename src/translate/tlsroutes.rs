//! TLSRoutes, compiled: one rule of weighted backendRefs (HTTPRoute
//! backendRefs without filters, see
//! [`crate::resources::tls_backend_refs_as_http`]), reached by SNI.
//!
//! Per the spec, a backendRef that is invalid or has no endpoints keeps
//! its weight: "Request rejections must respect weight; if an invalid
//! backend is requested to have 80% of requests, then 80% of requests
//! must be rejected instead" (a rejected connection is closed).

use gateway_api::experimental::httproutes::HttpRouteRules;

use super::backends::BackendResolver;
use super::routes::{self, CompiledRoute};
use crate::resources::{TlsRoute, tls_backend_refs_as_http};
use crate::rollout::ServedShares;
use crate::route::RouteKind;

/// Compile the rule of a TLSRoute.
pub(crate) fn compile_route(
    route: &TlsRoute,
    ns: &str,
    name: &str,
    resolver: &BackendResolver<'_>,
    served: &ServedShares,
) -> CompiledRoute {
    let mut unsupported = Vec::new();
    let rules: Vec<HttpRouteRules> = route
        .spec
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| HttpRouteRules {
            name: r.name.clone(),
            backend_refs: Some(
                tls_backend_refs_as_http(&r.backend_refs).unwrap_or_else(|e| {
                    unsupported.push(format!("spec.rules[{i}].backendRefs: cannot be read: {e}"));
                    Vec::new()
                }),
            ),
            ..HttpRouteRules::default()
        })
        .collect();
    let mut out = routes::compile_rules(RouteKind::Tls, &rules, ns, name, resolver, served);
    out.unsupported.extend(unsupported);
    out
}
