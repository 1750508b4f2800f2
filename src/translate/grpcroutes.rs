//! GRPCRoutes, compiled: their rules are HTTPRoute rules for everything
//! but their matches (filters, backendRefs, name, sessionPersistence have
//! HTTPRoute's schema and meaning, see
//! [`crate::resources::grpc_rule_as_http`]), so they go through
//! [`routes::compile_rules`], and their matches become gRPC method and
//! header conditions ([`crate::route::GrpcMethodMatch`]).
//!
//! Per the spec: "If no matches are specified, the implementation MUST
//! match every gRPC request"; a match without `method` matches every
//! service and method; `type` defaults to Exact.

use gateway_api::experimental::grpcroutes::{
    GrpcRoute, GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType,
    GrpcRouteRulesMatchesMethodType,
};
use gateway_api::experimental::httproutes::HttpRouteRules;

use super::backends::BackendResolver;
use super::matches::header_matches;
use super::routes::{self, CompiledRoute};
use crate::resources::grpc_rule_as_http;
use crate::rollout::ServedShares;
use crate::route::{GrpcMethodMatch, PathMatch, RequestMatch, RouteKind, ValueMatch};

/// Compile every rule of a GRPCRoute.
pub(crate) fn compile_route(
    route: &GrpcRoute,
    ns: &str,
    name: &str,
    resolver: &BackendResolver<'_>,
    served: &ServedShares,
) -> CompiledRoute {
    let rules = route.spec.rules.as_deref().unwrap_or_default();
    let mut unsupported = Vec::new();
    let http: Vec<HttpRouteRules> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            grpc_rule_as_http(r).unwrap_or_else(|e| {
                unsupported.push(format!("spec.rules[{i}]: cannot be read: {e}"));
                HttpRouteRules::default()
            })
        })
        .collect();
    let mut out = routes::compile_rules(RouteKind::Grpc, &http, ns, name, resolver, served);
    out.unsupported.extend(unsupported);
    for (i, (rule, compiled)) in rules.iter().zip(&mut out.rules).enumerate() {
        let mut matches = Vec::new();
        for (j, m) in rule.matches.iter().flatten().enumerate() {
            match compile_match(m) {
                Ok(m) => matches.push(m),
                Err(e) => out
                    .unsupported
                    .push(format!("spec.rules[{i}].matches[{j}].{e}")),
            }
        }
        if matches.is_empty() {
            matches.push(match_all());
        }
        compiled.matches = matches;
    }
    out
}

/// A match every gRPC request satisfies.
fn match_all() -> RequestMatch {
    RequestMatch {
        path: PathMatch::Grpc(GrpcMethodMatch::default()),
        ..RequestMatch::default()
    }
}

/// Compile one GRPCRouteMatch. The error names the field (relative to the
/// match) and what is wrong with it.
fn compile_match(m: &GrpcRouteRulesMatches) -> Result<RequestMatch, String> {
    let mut method = GrpcMethodMatch::default();
    if let Some(mm) = &m.method {
        let regex = matches!(
            mm.r#type,
            Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
        );
        let value = |field: &str, v: &Option<String>| -> Result<Option<ValueMatch>, String> {
            match v.as_deref() {
                None | Some("") => Ok(None),
                Some(v) if regex => ValueMatch::regex(v)
                    .map(Some)
                    .map_err(|e| format!("method.{field}: invalid regular expression: {e}")),
                Some(v) => Ok(Some(ValueMatch::Exact(v.to_string()))),
            }
        };
        method.service = value("service", &mm.service)?;
        method.method = value("method", &mm.method)?;
    }
    let headers = header_matches(m.headers.iter().flatten().map(|h| {
        let regex = matches!(
            h.r#type,
            Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
        );
        (h.name.as_str(), h.value.as_str(), regex)
    }))?;
    Ok(RequestMatch {
        path: PathMatch::Grpc(method),
        method: None,
        headers,
        query: Vec::new(),
    })
}
