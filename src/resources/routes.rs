//! GRPCRoute and TLSRoute parts seen as the HTTPRoute parts they repeat.
//!
//! The generated types are one per route kind, but the spec shares their
//! schema: a GRPCRoute rule's `filters` (RequestHeaderModifier,
//! ResponseHeaderModifier, RequestMirror, ExtensionRef), `backendRefs`,
//! `name` and `sessionPersistence` are HTTPRoute's, field for field, and a
//! TLSRoute backendRef is an HTTPRoute backendRef without filters.
//! Converting them lets validation and translate handle those fields once.
//! Only the matches differ (service and method instead of path): they are
//! left out and compiled apart.

use gateway_api::experimental::grpcroutes::GrpcRouteRules;
use gateway_api::experimental::httproutes::{HttpRouteRules, HttpRouteRulesBackendRefs};
use gateway_api::experimental::tlsroutes::TlsRouteRulesBackendRefs;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The same JSON under another generated type.
fn convert<A: Serialize, B: DeserializeOwned>(a: &A) -> Result<B, String> {
    serde_json::to_value(a)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}

/// A GRPCRoute rule as the HTTPRoute rule with the same filters,
/// backendRefs, name and sessionPersistence, and no matches.
pub fn grpc_rule_as_http(rule: &GrpcRouteRules) -> Result<HttpRouteRules, String> {
    let mut value = serde_json::to_value(rule).map_err(|e| e.to_string())?;
    if let Some(map) = value.as_object_mut() {
        map.remove("matches");
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// A TLSRoute rule's backendRefs as HTTPRoute backendRefs (no filters).
pub fn tls_backend_refs_as_http(
    refs: &[TlsRouteRulesBackendRefs],
) -> Result<Vec<HttpRouteRulesBackendRefs>, String> {
    refs.iter().map(convert).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_rule_keeps_everything_but_its_matches() {
        let rule: GrpcRouteRules = serde_json::from_value(serde_json::json!({
            "name": "echo",
            "matches": [{"method": {"service": "a.B", "method": "C"}}],
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x", "value": "1"}]}},
                {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "m", "port": 80}, "percent": 10}},
            ],
            "backendRefs": [{"name": "v1", "port": 8080, "weight": 3, "filters": [
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "y", "value": "2"}]}},
            ]}],
            "sessionPersistence": {"type": "Header", "sessionName": "s"},
        }))
        .expect("a GRPCRoute rule");
        let http = grpc_rule_as_http(&rule).expect("converts");
        assert!(http.matches.is_none());
        assert_eq!(http.name.as_deref(), Some("echo"));
        let filters = http.filters.expect("filters kept");
        assert_eq!(filters.len(), 2);
        assert_eq!(
            filters[1].request_mirror.as_ref().and_then(|m| m.percent),
            Some(10)
        );
        let backends = http.backend_refs.expect("backendRefs kept");
        assert_eq!(
            (backends[0].name.as_str(), backends[0].weight),
            ("v1", Some(3))
        );
        assert_eq!(backends[0].filters.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            http.session_persistence
                .and_then(|s| s.session_name)
                .as_deref(),
            Some("s")
        );
    }

    #[test]
    fn tls_backend_refs_convert() {
        let refs: Vec<TlsRouteRulesBackendRefs> = serde_json::from_value(serde_json::json!([
            {"name": "db", "port": 5432, "weight": 9, "namespace": "data"},
            {"name": "x", "kind": "Bucket", "group": "s.io"},
        ]))
        .expect("backendRefs");
        let http = tls_backend_refs_as_http(&refs).expect("converts");
        assert_eq!(http[0].namespace.as_deref(), Some("data"));
        assert_eq!(http[0].weight, Some(9));
        assert_eq!(http[1].kind.as_deref(), Some("Bucket"));
    }
}
