//! Entry points of the fuzz targets (`fuzz/`), kept in the library so that
//! the seed corpora also run as ordinary tests (`tests/fuzz_corpus.rs`)
//! without the fuzzer. Each one must never panic, whatever the input.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use k8s_openapi::jiff::Timestamp;

use crate::resources::{Generations, Object, Snapshot, parse_manifests};
use crate::route::{Lookup, RouteTable, normalize_host};
use crate::translate::{TranslateOptions, translate_at};

const BIND: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Requests every table built from fuzzed manifests must answer without
/// panicking.
const PROBES: [(&str, &str, &str); 4] = [
    ("GET", "example.com", "/"),
    ("POST", "a.b.example.com:8080", "/api/v1/x?y=1"),
    ("GET", "", ""),
    ("DELETE", "*.example.com", "/%ff/../x"),
];

fn snapshot_from(text: &str) -> Snapshot {
    let parsed = parse_manifests(text, "fuzz.yaml");
    let mut objects: Vec<Object> = parsed.objects.into_iter().map(|o| o.object).collect();
    Generations::new().assign(&mut objects, Timestamp::UNIX_EPOCH);
    Snapshot::from_objects(objects)
}

/// Arbitrary bytes as a manifest file: load, validate, translate, then
/// serve a few requests from the table and serialize the status. Checks
/// that translate never produces a table the proxy cannot serve.
pub fn manifests_then_translate(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let snapshot = snapshot_from(text);
    let options = TranslateOptions { default_bind: BIND };
    let translation = translate_at(&snapshot, &options, Timestamp::UNIX_EPOCH);
    serde_json::to_string(&translation.status).expect("a status report always serializes");
    let binds: Vec<SocketAddr> = translation.table.binds().collect();
    for bind in binds {
        for (method, host, path) in PROBES {
            let method = Method::from_bytes(method.as_bytes()).expect("probe methods are valid");
            serve_lookup(
                &translation.table,
                bind,
                &method,
                host,
                path,
                &HeaderMap::new(),
            );
        }
    }
}

/// Look a request up and choose its backend and endpoint, as the proxy does.
fn serve_lookup(
    table: &RouteTable,
    bind: SocketAddr,
    method: &Method,
    host: &str,
    target: &str,
    headers: &HeaderMap,
) {
    let host = normalize_host(host);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if let Lookup::Matched(m) = table.lookup(bind, &host, method, path, query, headers)
        && let crate::route::BackendChoice::Backend(b) = m.rule.backends.choose(headers)
        && let crate::route::BackendTarget::Endpoints(set) = &b.target
    {
        let _ = set.pick();
    }
}

/// A table with every kind of match and hostname, built once.
fn fixed_table() -> &'static (RouteTable, SocketAddr) {
    static TABLE: OnceLock<(RouteTable, SocketAddr)> = OnceLock::new();
    TABLE.get_or_init(|| {
        let snapshot = snapshot_from(MATCHING_MANIFESTS);
        let options = TranslateOptions { default_bind: BIND };
        let t = translate_at(&snapshot, &options, Timestamp::UNIX_EPOCH);
        let bind = t
            .table
            .binds()
            .next()
            .expect("the fixed manifests bind one socket");
        (t.table, bind)
    })
}

/// Arbitrary bytes as a request against a fixed table: the first line is
/// the method, the second the Host, the third the path and query, the rest
/// `name: value` headers.
pub fn match_request(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let method = lines.next().unwrap_or_default();
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let host = lines.next().unwrap_or_default();
    let target = lines.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':')
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            )
        {
            headers.append(name, value);
        }
    }
    let (table, bind) = fixed_table();
    serve_lookup(table, *bind, &method, host, target, &headers);
}

const MATCHING_MANIFESTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: any, protocol: HTTP, port: 8080}
  - {name: wild, protocol: HTTP, port: 8080, hostname: "*.example.com"}
---
apiVersion: v1
kind: Service
metadata: {name: app}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: app-1, labels: {kubernetes.io/service-name: app}}
addressType: IPv4
ports: [{port: 9}]
endpoints: [{addresses: ["127.0.0.1", "127.0.0.2"]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mixed}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["foo.example.com", "*.a.example.com", "plain.org"]
  rules:
  - matches:
    - path: {type: Exact, value: /exact}
    - path: {type: PathPrefix, value: /api/v1}
      method: POST
    - path: {type: RegularExpression, value: "/re/[a-z]+/[0-9]{1,4}"}
      headers: [{type: RegularExpression, name: x-version, value: "v[0-9]+(-beta)?"}]
    - headers: [{name: x-canary, value: always}]
      queryParams: [{name: debug, value: "1"}, {type: RegularExpression, name: v, value: ".*"}]
    backendRefs: [{name: app, port: 80, weight: 995}, {name: missing, port: 80, weight: 5}]
  - backendRefs: [{name: app, port: 80}]
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_table_routes_a_plain_request() {
        let (table, bind) = fixed_table();
        let found = table.lookup(
            *bind,
            "foo.example.com",
            &Method::GET,
            "/exact",
            None,
            &HeaderMap::new(),
        );
        assert!(
            matches!(found, Lookup::Matched(m) if m.rule.id.route == "mixed" && m.rule.id.index == 0)
        );
    }
}
