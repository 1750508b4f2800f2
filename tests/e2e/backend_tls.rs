//! TLS to backends through the binary: a BackendTLSPolicy makes the gateway
//! speak TLS to a Service's endpoints, with `validation.hostname` as SNI,
//! the backend's certificate verified against the CA of a ConfigMap, and
//! the Gateway's `spec.tls.backend.clientCertificateRef` presented. A
//! wrong hostname, an untrusted CA or a missing CA ConfigMap fail the
//! request (502), as the spec says connections must fail. With
//! `subjectAltNames` the certificate must carry one of them (a DNS name,
//! or exactly a URI such as a SPIFFE ID) instead of the hostname, which
//! stays the SNI. Retries and
//! mirrors to such a Service go over TLS too: a retried code or a failed
//! handshake is retried on the next endpoint, and a mirror gets the
//! request with the policy's hostname as SNI.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::support::{
    GATEWAY_HEAD, Leaf, Pods, Sluice, TestCa, ca_config_map, gateway, route, static_service,
    static_service_endpoints, tls_secret,
};

/// What the TLS backend saw of one connection.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) sni: Option<String>,
    client_cert: Option<CertificateDer<'static>>,
}

/// One request a TLS backend answered, with the SNI of its connection.
#[derive(Debug, Clone)]
struct SeenRequest {
    sni: Option<String>,
    method: Method,
    path: String,
    body: Bytes,
}

/// A TLS echo backend: answers every request with one status and the body
/// `hello over TLS`, and records the SNI and client certificate of each
/// connection, each request, and the handshakes that failed. Client
/// certificates are asked for (verified against `client_ca`) but not
/// required.
pub(crate) struct TlsBackend {
    pub(crate) addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    requests: Arc<Mutex<Vec<SeenRequest>>>,
    failed_handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsBackend {
    /// A backend answering 200.
    pub(crate) async fn start(server: &Leaf, client_ca: &TestCa) -> TlsBackend {
        TlsBackend::answering(server, client_ca, StatusCode::OK).await
    }

    /// A backend answering `status` to every request.
    async fn answering(server: &Leaf, client_ca: &TestCa, status: StatusCode) -> TlsBackend {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.cert.clone()).expect("client CA");
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
        let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("server chain");
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let (record, record_requests, failed) =
            (seen.clone(), requests.clone(), failed_handshakes.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let record = record.clone();
                let record_requests = record_requests.clone();
                let failed = failed.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    let conn = tls.get_ref().1;
                    let s = Seen {
                        sni: conn.server_name().map(str::to_owned),
                        client_cert: conn
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.clone().into_owned()),
                    };
                    let sni = s.sni.clone();
                    record.lock().expect("lock").push(s);
                    let service = service_fn(move |req: Request<Incoming>| {
                        let record_requests = record_requests.clone();
                        let sni = sni.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            record_requests.lock().expect("lock").push(SeenRequest {
                                sni,
                                method: parts.method,
                                path: parts.uri.to_string(),
                                body,
                            });
                            let mut resp =
                                Response::new(Full::new(Bytes::from_static(b"hello over TLS")));
                            *resp.status_mut() = status;
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsBackend {
            addr,
            seen,
            requests,
            failed_handshakes,
            task,
        }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    fn requests(&self) -> Vec<SeenRequest> {
        self.requests.lock().expect("lock").clone()
    }

    /// The paths of the requests received, in arrival order.
    fn paths(&self) -> Vec<String> {
        self.requests().into_iter().map(|r| r.path).collect()
    }

    fn failed_handshakes(&self) -> usize {
        self.failed_handshakes.load(Ordering::SeqCst)
    }
}

/// Poll `check` until it gives a value, or panic naming `what` after 15 s
/// (backends record what they saw on their own tasks).
async fn poll_until<T>(what: &str, check: impl Fn() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Our GatewayClass and Gateway `default/gw` on `{{PORT}}`, presenting the
/// client certificate of Secret `client` to TLS backends.
fn gateway_with_client_certificate() -> String {
    format!(
        r#"
{GATEWAY_HEAD}  listeners:
  - {{name: http, protocol: HTTP, port: {{{{PORT}}}}}}
  tls:
    backend:
      clientCertificateRef: {{kind: Secret, name: client}}
"#
    )
}

/// BackendTLSPolicy `default/name` on Service `name`: `hostname` as SNI
/// and the certificate verified against ConfigMap `ca_config_map`.
fn backend_tls_policy(name: &str, hostname: &str, ca_config_map: &str) -> String {
    format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  targetRefs: [{{group: '', kind: Service, name: {name}}}]
  validation:
    caCertificateRefs: [{{group: '', kind: ConfigMap, name: {ca_config_map}}}]
    hostname: {hostname}
"#
    )
}

/// Service `name` (port 443 named https) with the backend as its endpoint,
/// a BackendTLSPolicy on it, and a route sending `/name` to it.
fn tls_service(name: &str, backend: SocketAddr, hostname: &str, ca_config_map: &str) -> String {
    tls_service_with(
        name,
        backend,
        &backend_tls_policy(name, hostname, ca_config_map),
    )
}

/// Service `name` with the backend as its endpoint, `policy`, and a route
/// sending `/name` to it.
fn tls_service_with(name: &str, backend: SocketAddr, policy: &str) -> String {
    let mut out = static_service(name, Some("https"), 443, None, backend.port());
    out.push_str(policy);
    out.push_str(&route(
        "default",
        name,
        &format!(
            "  rules:\n  - matches: [{{path: {{type: Exact, value: /{name}}}}}]\n    backendRefs: [{{name: {name}, port: 443}}]\n"
        ),
    ));
    out
}

fn condition<'a>(conditions: &'a serde_json::Value, ty: &str) -> &'a serde_json::Value {
    conditions
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == ty))
        .unwrap_or_else(|| panic!("no {ty} condition in {conditions}"))
}

#[tokio::test]
async fn backend_tls_policy_verifies_the_backend_and_presents_the_client_certificate() {
    let ca = TestCa::new();
    let other_ca = TestCa::new();
    let backend = TlsBackend::start(&ca.issue(&["abc.example.com"]), &ca).await;
    let client = ca.issue(&["gateway.example.com"]);

    let mut manifests = gateway_with_client_certificate();
    manifests.push_str(&tls_secret("default", "client", &client));
    manifests.push_str(&ca_config_map("ca", &ca));
    manifests.push_str(&ca_config_map("other-ca", &other_ca));
    manifests.push_str(&tls_service("good", backend.addr, "abc.example.com", "ca"));
    manifests.push_str(&tls_service(
        "wrong-name",
        backend.addr,
        "other.example.com",
        "ca",
    ));
    manifests.push_str(&tls_service(
        "untrusted",
        backend.addr,
        "abc.example.com",
        "other-ca",
    ));
    manifests.push_str(&tls_service(
        "no-ca",
        backend.addr,
        "abc.example.com",
        "missing",
    ));
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    let ok = sluice
        .eventually("example.com", "/good", |r| r.status == StatusCode::OK)
        .await;
    assert_eq!(ok.body, Bytes::from_static(b"hello over TLS"));
    let seen = backend.seen();
    let first = seen.first().expect("the backend saw a TLS connection");
    assert_eq!(first.sni.as_deref(), Some("abc.example.com"));
    assert_eq!(
        first.client_cert.as_ref(),
        Some(&client.der),
        "the Gateway's client certificate is presented"
    );

    // Connections that must fail: the certificate is not valid for the
    // hostname, or not issued by the policy's CA, or there is no valid CA.
    let mut conn = sluice.connect().await;
    for path in ["/wrong-name", "/untrusted", "/no-ca"] {
        let r = conn.get("example.com", path).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{path}: {r:?}");
    }
    // Keep-alive: the good backend is still reached after failures.
    assert_eq!(
        conn.get("example.com", "/good").await.status,
        StatusCode::OK
    );

    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let resolved = condition(&gw["status"]["conditions"], "ResolvedRefs");
    assert_eq!(resolved["status"], "True", "{gw}");

    let good = sluice
        .object_status("BackendTLSPolicy", Some("default"), "good")
        .await;
    let ancestor = &good["status"]["ancestors"][0];
    assert_eq!(ancestor["ancestorRef"]["name"], "gw");
    assert_eq!(
        condition(&ancestor["conditions"], "Accepted")["status"],
        "True"
    );

    let no_ca = sluice
        .object_status("BackendTLSPolicy", Some("default"), "no-ca")
        .await;
    let conditions = &no_ca["status"]["ancestors"][0]["conditions"];
    assert_eq!(
        condition(conditions, "Accepted")["reason"],
        "NoValidCACertificate"
    );
    assert_eq!(
        condition(conditions, "ResolvedRefs")["reason"],
        "InvalidCACertificateRef"
    );
}

/// BackendTLSPolicy `default/name` on Service `name` with SNI
/// `abc.example.com` and `subjectAltNames` (YAML flow items).
fn san_service(name: &str, backend: SocketAddr, subject_alt_names: &str) -> String {
    let mut policy = backend_tls_policy(name, "abc.example.com", "ca");
    policy.push_str(&format!("    subjectAltNames: [{subject_alt_names}]\n"));
    tls_service_with(name, backend, &policy)
}

#[tokio::test]
async fn subject_alt_names_are_verified_instead_of_the_hostname() {
    // The backend's certificate names a DNS name and a SPIFFE ID, not the
    // policies' hostname (which stays the SNI).
    let ca = TestCa::new();
    let other_ca = TestCa::new();
    let names = ["backend.internal", "spiffe://example.com/ns/default/sa/web"];
    let backend = TlsBackend::start(&ca.issue(&names), &ca).await;
    let impostor = TlsBackend::start(&other_ca.issue(&names), &ca).await;

    let mut manifests = gateway();
    manifests.push_str(&ca_config_map("ca", &ca));
    for (name, backend, sans) in [
        (
            "uri",
            &backend,
            "{type: URI, uri: 'spiffe://example.com/ns/default/sa/web'}",
        ),
        (
            "dns",
            &backend,
            "{type: Hostname, hostname: backend.internal}",
        ),
        (
            "one-of-two",
            &backend,
            "{type: URI, uri: 'spiffe://example.com/ns/other/sa/web'}, {type: Hostname, hostname: backend.internal}",
        ),
        (
            "wrong-uri",
            &backend,
            "{type: URI, uri: 'spiffe://example.com/ns/other/sa/web'}",
        ),
        // A URI SAN is a whole URI: a prefix does not match.
        (
            "uri-prefix",
            &backend,
            "{type: URI, uri: 'spiffe://example.com/ns/default'}",
        ),
        (
            "wrong-dns",
            &backend,
            "{type: Hostname, hostname: abc.example.com}",
        ),
        // The name matches, the chain does not: not trusted.
        (
            "untrusted",
            &impostor,
            "{type: URI, uri: 'spiffe://example.com/ns/default/sa/web'}",
        ),
    ] {
        manifests.push_str(&san_service(name, backend.addr, sans));
    }
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    sluice
        .eventually("example.com", "/uri", |r| r.status == StatusCode::OK)
        .await;
    let mut conn = sluice.connect().await;
    for (path, want) in [
        ("/uri", StatusCode::OK),
        ("/dns", StatusCode::OK),
        ("/one-of-two", StatusCode::OK),
        ("/wrong-uri", StatusCode::BAD_GATEWAY),
        ("/uri-prefix", StatusCode::BAD_GATEWAY),
        ("/wrong-dns", StatusCode::BAD_GATEWAY),
        ("/untrusted", StatusCode::BAD_GATEWAY),
    ] {
        let r = conn.get("example.com", path).await;
        assert_eq!(r.status, want, "{path}: {r:?}");
    }
    // The SNI is still the policy's hostname.
    let seen = backend.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|s| s.sni.as_deref() == Some("abc.example.com")),
        "{seen:?}"
    );
    assert!(impostor.failed_handshakes() > 0);
    for name in ["uri", "wrong-uri"] {
        let policy = sluice
            .object_status("BackendTLSPolicy", Some("default"), name)
            .await;
        let conditions = &policy["status"]["ancestors"][0]["conditions"];
        assert_eq!(
            condition(conditions, "Accepted")["status"],
            "True",
            "{policy}"
        );
    }
}

#[tokio::test]
async fn an_invalid_client_certificate_ref_is_reported_on_the_gateway() {
    let manifests = gateway_with_client_certificate()
        + "\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: client, namespace: default}\ntype: Opaque\ndata: {}\n";
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let conditions = &gw["status"]["conditions"];
    let resolved = condition(conditions, "ResolvedRefs");
    assert_eq!(resolved["status"], "False", "{gw}");
    assert_eq!(resolved["reason"], "InvalidClientCertificateRef");
    assert_eq!(condition(conditions, "Accepted")["status"], "True");
}

/// Service `pair` (port 443 named https) with the two backends as its
/// endpoints, both reached over TLS as BackendTLSPolicy `pair` says (SNI
/// `abc.example.com`, CA of ConfigMap `ca`), and routes to it: `/retry`
/// with `retry`, `/no-retry` without.
fn tls_pair(first: &TlsBackend, second: &TlsBackend, retry: &str, ca: &TestCa) -> String {
    let mut out = gateway();
    out.push_str(&ca_config_map("ca", ca));
    out.push_str(&static_service_endpoints(
        "pair",
        Some("https"),
        443,
        None,
        &[first.addr.port(), second.addr.port()],
    ));
    out.push_str(&backend_tls_policy("pair", "abc.example.com", "ca"));
    out.push_str(&route(
        "default",
        "pair",
        &format!(
            r#"  rules:
  - matches: [{{path: {{type: PathPrefix, value: /retry}}}}]
    retry: {retry}
    backendRefs: [{{name: pair, port: 443}}]
  - matches: [{{path: {{type: PathPrefix, value: /no-retry}}}}]
    backendRefs: [{{name: pair, port: 443}}]"#
        ),
    ));
    out
}

/// How many of `n` requests to `/no-retry/{i}` got `status`: without a
/// retry, endpoints taken round robin meet the failing one every other
/// request.
async fn count_without_retry(sluice: &Sluice, n: usize, status: StatusCode) -> usize {
    let mut conn = sluice.connect().await;
    let mut count = 0;
    for i in 0..n {
        let r = conn.get("example.com", &format!("/no-retry/{i}")).await;
        if r.status == status {
            count += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_code_is_retried_on_the_next_tls_endpoint() {
    let ca = TestCa::new();
    let failing = TlsBackend::answering(
        &ca.issue(&["abc.example.com"]),
        &ca,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let healthy = TlsBackend::start(&ca.issue(&["abc.example.com"]), &ca).await;
    let manifests = tls_pair(
        &failing,
        &healthy,
        "{codes: [503], attempts: 2, backoff: 1ms}",
        &ca,
    );
    // Outlier ejection off: it would take the failing endpoint out of
    // the rotation after its fifth failure (tests/e2e/outliers.rs).
    let sluice = Sluice::start_with(
        &[("all.yaml", manifests)],
        &["--outlier-consecutive-failures", "0"],
    )
    .await;

    let mut conn = sluice.connect().await;
    let paths: Vec<String> = (0..10).map(|i| format!("/retry/{i}")).collect();
    for path in &paths {
        let r = conn.get("example.com", path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {r:?}");
        assert_eq!(r.body, Bytes::from_static(b"hello over TLS"));
    }
    // Every request reached the healthy endpoint once, over TLS; those that
    // met the failing endpoint first were retried there.
    assert_eq!(healthy.paths(), paths);
    let failed_first = failing.paths();
    assert!(
        !failed_first.is_empty(),
        "round robin sends some first tries to the failing endpoint"
    );
    assert!(failed_first.iter().all(|p| paths.contains(p)));
    for r in healthy.requests().iter().chain(&failing.requests()) {
        assert_eq!(r.sni.as_deref(), Some("abc.example.com"), "{r:?}");
    }

    assert_eq!(
        count_without_retry(&sluice, 10, StatusCode::SERVICE_UNAVAILABLE).await,
        5,
        "without retry every other request gets the failing endpoint's 503"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tls_handshake_is_retried_on_the_next_endpoint() {
    let ca = TestCa::new();
    let other_ca = TestCa::named("a CA the policy does not trust");
    let untrusted = TlsBackend::start(&other_ca.issue(&["abc.example.com"]), &ca).await;
    let healthy = TlsBackend::start(&ca.issue(&["abc.example.com"]), &ca).await;
    // No codes: only connection failures (the handshake included) retry.
    let manifests = tls_pair(&untrusted, &healthy, "{attempts: 1, backoff: 1ms}", &ca);
    // Outlier ejection off: it would take the failing endpoint out of
    // the rotation after its fifth failure (tests/e2e/outliers.rs).
    let sluice = Sluice::start_with(
        &[("all.yaml", manifests)],
        &["--outlier-consecutive-failures", "0"],
    )
    .await;

    let mut conn = sluice.connect().await;
    let paths: Vec<String> = (0..10).map(|i| format!("/retry/{i}")).collect();
    for path in &paths {
        let r = conn.get("example.com", path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {r:?}");
    }
    assert_eq!(healthy.paths(), paths);
    assert!(
        untrusted.requests().is_empty(),
        "no request over a refused handshake"
    );
    poll_until("the untrusted endpoint sees a failed handshake", || {
        (untrusted.failed_handshakes() > 0).then_some(())
    })
    .await;

    assert_eq!(
        count_without_retry(&sluice, 10, StatusCode::BAD_GATEWAY).await,
        5,
        "without retry every other request meets the untrusted endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_to_a_tls_backend_gets_the_request_over_tls() {
    let ca = TestCa::new();
    let primary = Pods::start("default", "primary", 1).await;
    let mirror = TlsBackend::start(&ca.issue(&["mirror.example.com"]), &ca).await;
    let mut manifests = gateway();
    manifests.push_str(&primary.manifests());
    manifests.push_str(&ca_config_map("ca", &ca));
    manifests.push_str(&static_service(
        "mirror",
        Some("https"),
        443,
        None,
        mirror.addr.port(),
    ));
    manifests.push_str(&backend_tls_policy("mirror", "mirror.example.com", "ca"));
    manifests.push_str(&route(
        "default",
        "mirrored",
        r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /mirrored}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: mirror, port: 443}}
    backendRefs: [{name: primary, port: 8080}]"#,
    ));
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    let mut conn = sluice.connect().await;
    let r = conn.get("example.com", "/mirrored/get").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.pod(), "primary-0", "the client gets the primary's answer");
    let post = Request::post("/mirrored/post")
        .header("host", "example.com")
        .body(Full::new(Bytes::from_static(b"payload to mirror")))
        .expect("request");
    let r = conn.send(post).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.pod, "primary-0");
    assert_eq!(echo.body_bytes, 17, "the primary reads the whole body");

    let mut seen = poll_until("the mirror receives both requests", || {
        let seen = mirror.requests();
        (seen.len() == 2).then_some(seen)
    })
    .await;
    seen.sort_by(|a, b| a.path.cmp(&b.path));
    let summary: Vec<_> = seen
        .iter()
        .map(|r| {
            (
                r.sni.as_deref(),
                r.method.as_str(),
                r.path.as_str(),
                &r.body[..],
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (Some("mirror.example.com"), "GET", "/mirrored/get", &b""[..]),
            (
                Some("mirror.example.com"),
                "POST",
                "/mirrored/post",
                &b"payload to mirror"[..]
            ),
        ]
    );
    assert_eq!(primary.requests(), 2);
    // The gateway counts a mirror once it has read the mirror's answer.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = sluice.metrics().await;
        if metrics.contains("sluice_mirror_requests_total 2\n") {
            assert!(
                metrics.contains("sluice_mirror_failures_total 0\n"),
                "{metrics}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "mirrors never counted: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn tls_connections_to_a_backend_are_kept_alive_and_reused() {
    let ca = TestCa::new();
    let backend = TlsBackend::start(&ca.issue(&["abc.example.com"]), &ca).await;
    let mut manifests = gateway();
    manifests.push_str(&ca_config_map("ca", &ca));
    manifests.push_str(&tls_service("good", backend.addr, "abc.example.com", "ca"));
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    sluice
        .eventually("example.com", "/good", |r| r.status == StatusCode::OK)
        .await;
    let mut conn = sluice.connect().await;
    let r = conn.get("example.com", "/good").await;
    assert_eq!(r.status, StatusCode::OK);
    // Each worker thread pools its own backend connections: the client
    // connection above may be served by another worker than the first
    // request's, with a handshake of its own. From here on it has one.
    let handshakes = backend.seen().len();
    assert!(handshakes >= 1, "{:?}", backend.seen());
    for i in 0..10 {
        let r = conn.get("example.com", "/good").await;
        assert_eq!(r.status, StatusCode::OK, "request {i}");
        assert_eq!(r.body, Bytes::from_static(b"hello over TLS"));
    }
    // No handshake for the next ten requests: the pooled TLS connection
    // carried each of them (sluice's own HTTP/1.1 client and pool).
    assert_eq!(backend.seen().len(), handshakes, "{:?}", backend.seen());
    assert_eq!(backend.requests().len(), 12);
}
