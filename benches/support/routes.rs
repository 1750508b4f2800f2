//! Generated configurations for the benchmarks: `n` HTTPRoutes with a mix
//! of the match kinds real tables have, the Gateway they attach to, and the
//! two Services (with EndpointSlices) they split traffic over.
//!
//! Route `i` has hostname `host-{i / 10}.example.com` (ten routes per host,
//! as a cluster with many teams has) unless `one_host` puts them all on
//! `shared.example.com`; its one match is, by `i % 4`: Exact
//! `/r{i}/exact`, PathPrefix `/r{i}`, PathPrefix `/r{i}` with header
//! `x-variant: v{i}`, or RegularExpression `/r{i}/[0-9]+`.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Method};
use sluice::resources::{Snapshot, parse_manifests};

/// Where the generated Gateway listens and where its Services point.
pub struct Layout {
    pub listen: SocketAddr,
    pub stable: SocketAddr,
    pub canary: SocketAddr,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            listen: "127.0.0.1:18080".parse().expect("a literal address"),
            stable: "127.0.0.1:18081".parse().expect("a literal address"),
            canary: "127.0.0.1:18082".parse().expect("a literal address"),
        }
    }
}

pub fn host_of(i: usize, one_host: bool) -> String {
    if one_host {
        "shared.example.com".to_string()
    } else {
        format!("host-{}.example.com", i / 10)
    }
}

/// The Gateway, the two Services and their EndpointSlices.
pub fn infrastructure(layout: &Layout) -> String {
    let mut y = String::new();
    let _ = write!(
        y,
        "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: sluice.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: bench, namespace: default}}
spec:
  gatewayClassName: sluice
  addresses: [{{type: IPAddress, value: \"{ip}\"}}]
  listeners:
  - {{name: http, protocol: HTTP, port: {port}}}
",
        ip = layout.listen.ip(),
        port = layout.listen.port()
    );
    for (name, addr) in [("stable", layout.stable), ("canary", layout.canary)] {
        let _ = write!(
            y,
            "---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
- addresses: [\"{ip}\"]
",
            ip = addr.ip(),
            port = addr.port()
        );
    }
    y
}

/// The route the load is sent to: no hostname, PathPrefix `/`, split
/// `stable_weight` / `canary_weight`.
pub fn hot_route(stable_weight: u32, canary_weight: u32) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: bench, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  rules:
  - backendRefs:
    - {{name: stable, port: 80, weight: {stable_weight}}}
    - {{name: canary, port: 80, weight: {canary_weight}}}
"
    )
}

/// `n` generated HTTPRoutes.
pub fn routes(n: usize, one_host: bool) -> String {
    let mut y = String::with_capacity(n * 400);
    for i in 0..n {
        let matches = match i % 4 {
            0 => format!("[{{path: {{type: Exact, value: /r{i}/exact}}}}]"),
            1 => format!("[{{path: {{type: PathPrefix, value: /r{i}}}}}]"),
            2 => format!(
                "[{{path: {{type: PathPrefix, value: /r{i}}}, headers: [{{name: x-variant, value: v{i}}}]}}]"
            ),
            _ => format!("[{{path: {{type: RegularExpression, value: \"/r{i}/[0-9]+\"}}}}]"),
        };
        let _ = write!(
            y,
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: route-{i}, namespace: default}}
spec:
  parentRefs: [{{name: bench}}]
  hostnames: [{host}]
  rules:
  - matches: {matches}
    backendRefs:
    - {{name: stable, port: 80, weight: 995}}
    - {{name: canary, port: 80, weight: 5}}
",
            host = host_of(i, one_host)
        );
    }
    y
}

/// Parse generated manifests into a snapshot; panics on a generator bug.
pub fn snapshot(text: &str) -> Snapshot {
    let parsed = parse_manifests(text, "generated.yaml");
    assert!(
        parsed.errors.is_empty(),
        "the generator wrote invalid manifests: {:?}",
        parsed.errors.first()
    );
    Snapshot::from_objects(parsed.objects.into_iter().map(|o| o.object))
}

/// A request that route `i` matches (and, for the header route, the header).
pub fn request_for(i: usize, one_host: bool) -> (String, Method, String, HeaderMap) {
    let mut headers = HeaderMap::new();
    let path = match i % 4 {
        0 => format!("/r{i}/exact"),
        1 => format!("/r{i}/items"),
        2 => {
            headers.insert(
                "x-variant",
                HeaderValue::from_str(&format!("v{i}")).expect("ASCII header value"),
            );
            format!("/r{i}/items")
        }
        _ => format!("/r{i}/42"),
    };
    (host_of(i, one_host), Method::GET, path, headers)
}
