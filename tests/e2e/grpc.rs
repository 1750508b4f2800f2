//! GRPCRoute through the binary: gRPC calls over h2c and over HTTPS (ALPN
//! h2) to gRPC echo backends (`sluice::grpc_echo`, echo-basic's service),
//! routed by service, method and headers, split exactly by weight,
//! mirrored, and answered with gRPC statuses when the gateway answers
//! itself; backends reached over TLS with HTTP/2 when a BackendTLSPolicy
//! says so; an HTTPRoute and a GRPCRoute on one hostname.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use sluice::echo::EchoIdentity;
use sluice::grpc_echo::{self, GrpcEchoServer, Reply, code};

use crate::support::{
    GATEWAY_HEAD, Sluice, TestCa, ca_config_map, gateway, route_of_kind, static_service,
    static_service_endpoints, tls_secret,
};

pub(crate) async fn grpc_server(pod: &str) -> GrpcEchoServer {
    GrpcEchoServer::start(EchoIdentity {
        pod: pod.into(),
        namespace: "default".into(),
        service: pod.into(),
    })
    .await
    .expect("gRPC echo backend binds")
}

/// A GRPCRoute `default/name` on `default/gw` with this body under `spec`.
fn grpc_route(name: &str, spec: &str) -> String {
    route_of_kind("GRPCRoute", "default", name, spec)
}

async fn call(sluice: &Sluice, authority: &str, method: &str, md: &[(&str, &str)]) -> Reply {
    let md: Vec<(String, String)> = md
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    grpc_echo::call_h2c(sluice.addr(), authority, method, &md)
        .await
        .expect("the gateway answers the call")
}

pub(crate) fn pod(reply: &Reply) -> String {
    reply
        .response
        .as_ref()
        .map(|r| r.assertions.context.pod.clone())
        .unwrap_or_else(|| format!("no response: code {} {}", reply.code, reply.message))
}

/// Call until `check` holds (a reload reaching the gateway), or panic.
async fn eventually(
    sluice: &Sluice,
    authority: &str,
    method: &str,
    check: impl Fn(&Reply) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reply = call(sluice, authority, method, &[]).await;
        if check(&reply) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never held; last reply {reply:?}; log:\n{}",
            sluice.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn calls_are_routed_by_service_method_and_headers_and_split_exactly() {
    let (v1, v2, v3) = (
        grpc_server("echo-v1").await,
        grpc_server("echo-v2").await,
        grpc_server("echo-v3").await,
    );
    let spec = r#"  hostnames: [grpc.example.com]
  rules:
  - matches: [{method: {service: gateway_api_conformance.echo_basic.grpcecho.GrpcEcho, method: Echo}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-rule, value: echo}]}
    backendRefs: [{name: echo-v1, port: 8080}]
  - matches: [{method: {service: gateway_api_conformance.echo_basic.grpcecho.GrpcEcho, method: EchoTwo}}]
    backendRefs:
    - {name: echo-v1, port: 8080, weight: 7}
    - {name: echo-v2, port: 8080, weight: 3}
  - matches:
    - method: {type: RegularExpression, service: '.*\.GrpcEcho', method: 'Echo.*'}
      headers: [{name: version, value: three}]
    backendRefs: [{name: echo-v3, port: 8080}]
"#;
    let manifests = format!(
        "{}{}{}{}{}",
        gateway(),
        static_service(
            "echo-v1",
            None,
            8080,
            Some("kubernetes.io/h2c"),
            v1.local_addr().port()
        ),
        // No appProtocol: a GRPCRoute's backends speak HTTP/2 anyway.
        static_service("echo-v2", None, 8080, None, v2.local_addr().port()),
        static_service("echo-v3", None, 8080, None, v3.local_addr().port()),
        grpc_route("echo", spec)
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    let echo = call(&sluice, "grpc.example.com", "Echo", &[("version", "one")]).await;
    assert_eq!(echo.code, code::OK, "{echo:?}");
    let a = &echo.response.as_ref().expect("a response").assertions;
    assert_eq!(a.context.pod, "echo-v1");
    assert_eq!(
        a.fully_qualified_method,
        "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo"
    );
    assert_eq!(a.authority, "grpc.example.com");
    assert_eq!(a.header("version"), ["one"], "metadata reaches the backend");
    assert_eq!(a.header("x-rule"), ["echo"], "the rule's header filter");
    assert_eq!(
        a.header("te"),
        ["trailers"],
        "TE: trailers is kept for gRPC"
    );

    // 100 calls of EchoTwo split 7:3 exactly.
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..100 {
        let reply = call(&sluice, "grpc.example.com", "EchoTwo", &[]).await;
        *tally.entry(pod(&reply)).or_default() += 1;
    }
    assert_eq!(
        tally,
        BTreeMap::from([("echo-v1".into(), 70), ("echo-v2".into(), 30)])
    );

    // The regular expressions and the header: EchoThree with version
    // three reaches echo-v3, which does not implement it.
    let three = call(
        &sluice,
        "grpc.example.com",
        "EchoThree",
        &[("version", "three")],
    )
    .await;
    assert_eq!(three.code, code::UNIMPLEMENTED, "{three:?}");
    assert_eq!(v3.calls(), 1, "the backend answered UNIMPLEMENTED itself");
    // Without the header no rule matches: the gateway answers
    // UNIMPLEMENTED itself (Trailers-Only, HTTP 200).
    let unrouted = call(&sluice, "grpc.example.com", "EchoThree", &[]).await;
    assert_eq!(unrouted.code, code::UNIMPLEMENTED, "{unrouted:?}");
    assert_eq!(unrouted.http_status, 200);
    assert_eq!(v3.calls(), 1);
    // Another hostname: no route either.
    let other = call(&sluice, "other.example.com", "Echo", &[]).await;
    assert_eq!(other.code, code::UNIMPLEMENTED, "{other:?}");
}

#[tokio::test]
async fn shares_the_gateway_cannot_serve_get_unavailable() {
    let up = grpc_server("up").await;
    let spec = r#"  rules:
  - matches: [{method: {method: Echo}}]
    backendRefs:
    - {name: up, port: 8080}
    - {name: missing, port: 8080}
  - matches: [{method: {method: EchoTwo}}]
    backendRefs: [{name: empty, port: 8080}]
"#;
    let empty = "
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec: {ports: [{port: 8080}]}
";
    let manifests = format!(
        "{}{}{empty}{}",
        gateway(),
        static_service("up", None, 8080, None, up.local_addr().port()),
        grpc_route("errors", spec)
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    // The missing backend keeps its half of the calls, each UNAVAILABLE.
    let mut codes: BTreeMap<u32, usize> = BTreeMap::new();
    for _ in 0..20 {
        let reply = call(&sluice, "x", "Echo", &[]).await;
        if reply.code != code::OK {
            assert_eq!(reply.http_status, 200, "Trailers-Only: {reply:?}");
        }
        *codes.entry(reply.code).or_default() += 1;
    }
    assert_eq!(
        codes,
        BTreeMap::from([(code::OK, 10), (code::UNAVAILABLE, 10)])
    );
    let no_endpoints = call(&sluice, "x", "EchoTwo", &[]).await;
    assert_eq!(no_endpoints.code, code::UNAVAILABLE, "{no_endpoints:?}");
    // Metrics count the HTTP status each answer stands for.
    let metrics = sluice.metrics().await;
    for line in [
        r#"route="GRPCRoute default/errors",rule="0",backend="default/missing:8080",backend_namespace="default",backend_name="missing",backend_port="8080",code="500"} 10"#,
        r#"route="GRPCRoute default/errors",rule="1",backend="default/empty:8080",backend_namespace="default",backend_name="empty",backend_port="8080",code="503"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    // The route says why.
    let status = sluice
        .object_status("GRPCRoute", Some("default"), "errors")
        .await;
    let resolved = status["status"]["parents"][0]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "ResolvedRefs")
        .cloned()
        .expect("ResolvedRefs");
    assert_eq!(
        (resolved["status"].as_str(), resolved["reason"].as_str()),
        (Some("False"), Some("BackendNotFound"))
    );
}

#[tokio::test]
async fn calls_are_mirrored() {
    let (main, copy) = (grpc_server("main").await, grpc_server("copy").await);
    let spec = r#"  rules:
  - filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: copy, port: 8080}}
    backendRefs: [{name: main, port: 8080}]
"#;
    let manifests = format!(
        "{}{}{}{}",
        gateway(),
        static_service("main", None, 8080, None, main.local_addr().port()),
        static_service("copy", None, 8080, None, copy.local_addr().port()),
        grpc_route("mirrored", spec)
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    for _ in 0..5 {
        let reply = call(&sluice, "x", "Echo", &[]).await;
        assert_eq!(pod(&reply), "main");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while copy.calls() < 5 {
        assert!(
            Instant::now() < deadline,
            "the mirror got {} calls",
            copy.calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(main.calls(), 5);
}

#[tokio::test]
async fn calls_over_https_reach_tls_backends_with_http2() {
    let ca = TestCa::new();
    let gateway_cert = ca.issue(&["grpc.example.com"]);
    let backend_cert = ca.issue(&["backend.internal"]);
    let backend = GrpcEchoServer::start_tls(
        EchoIdentity {
            pod: "secure".into(),
            namespace: "default".into(),
            service: "secure".into(),
        },
        backend_cert.server_config(),
    )
    .await
    .expect("TLS gRPC backend");
    let manifests = format!(
        r#"{GATEWAY_HEAD}  listeners:
  - name: https
    protocol: HTTPS
    port: {{{{PORT}}}}
    hostname: grpc.example.com
    tls: {{certificateRefs: [{{name: gw-cert}}]}}
{}{}{}
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: secure, namespace: default}}
spec:
  targetRefs: [{{group: "", kind: Service, name: secure}}]
  validation:
    hostname: backend.internal
    caCertificateRefs: [{{group: "", kind: ConfigMap, name: backend-ca}}]
{}"#,
        tls_secret("default", "gw-cert", &gateway_cert),
        ca_config_map("backend-ca", &ca),
        static_service_endpoints("secure", None, 8443, None, &[backend.local_addr().port()]),
        grpc_route(
            "secure",
            "  rules: [{backendRefs: [{name: secure, port: 8443}]}]"
        )
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    let connector = ca.connector(&[b"h2"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let reply = loop {
        let tcp = tokio::net::TcpStream::connect(sluice.addr())
            .await
            .expect("connect");
        let name = ServerName::try_from("grpc.example.com").expect("a name");
        let tls = connector.connect(name, tcp).await.expect("TLS handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let reply = grpc_echo::call(tls, "grpc.example.com", "Echo", &[])
            .await
            .expect("an answer");
        if reply.code == code::OK || Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reply.code, code::OK, "{reply:?}; log:\n{}", sluice.log());
    let a = reply.response.expect("a response").assertions;
    assert_eq!(a.context.pod, "secure");
    let tls = a.tls.expect("the backend saw TLS");
    assert_eq!(
        tls.server_name, "backend.internal",
        "the policy's hostname as SNI"
    );
    assert_eq!(tls.negotiated_protocol, "h2", "HTTP/2 negotiated with ALPN");
}

#[tokio::test]
async fn an_httproute_and_a_grpcroute_on_one_hostname_keep_the_older() {
    let grpc = grpc_server("grpc").await;
    let pods = crate::support::Pods::start("default", "web", 1).await;
    let manifests = format!(
        r#"{}{}{}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: rpc, namespace: default, creationTimestamp: '2024-01-01T00:00:00Z'}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [api.example.com]
  rules: [{{backendRefs: [{{name: grpc, port: 8080}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web, namespace: default, creationTimestamp: '2024-06-01T00:00:00Z'}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: ['*.example.com']
  rules: [{{backendRefs: [{{name: web, port: 8080}}]}}]
"#,
        gateway(),
        static_service("grpc", None, 8080, None, grpc.local_addr().port()),
        pods.manifests(),
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    eventually(&sluice, "api.example.com", "Echo", |r| r.code == code::OK).await;
    let web = sluice
        .object_status("HTTPRoute", Some("default"), "web")
        .await;
    let accepted = &web["status"]["parents"][0]["conditions"][0];
    assert_eq!(accepted["type"], "Accepted");
    assert_eq!(accepted["status"], "False");
    assert_eq!(accepted["reason"], "HostnameConflict");
    // The HTTPRoute serves nothing, not even hostnames the GRPCRoute does
    // not hold: it is not attached to the listener at all.
    let mut conn = sluice.connect().await;
    assert_eq!(conn.get("www.example.com", "/").await.status, 404);
    assert_eq!(pods.requests(), 0);
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 1);
}
